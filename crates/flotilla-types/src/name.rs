//! Validation of path components, paths and fork names.

/// Longest name of one path component or fork, as on Linux.
pub const NAME_BYTES_MAX: usize = 255;
/// Longest path, as on Linux.
pub const PATH_BYTES_MAX: usize = 4096;

/// What was wrong with a path or a name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    #[error("path {path:?} is not absolute (must start with '/')")]
    NotAbsolute { path: String },
    #[error("path {path:?} has an empty component")]
    EmptyComponent { path: String },
    #[error("path {path:?} has a '.' or '..' component, which is not allowed")]
    DotComponent { path: String },
    #[error("name {name:?} is {length} bytes, longer than the limit of {NAME_BYTES_MAX}")]
    TooLong { name: String, length: usize },
    #[error("path is {length} bytes, longer than the limit of {PATH_BYTES_MAX}")]
    PathTooLong { length: usize },
    #[error("name {name:?} contains a NUL byte or a '/'")]
    BadCharacter { name: String },
    #[error("name is empty")]
    Empty,
}

/// Checks one component of a path (no '/', no NUL, not '.', '..' or empty).
pub fn check_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > NAME_BYTES_MAX {
        return Err(NameError::TooLong { name: name.chars().take(32).collect(), length: name.len() });
    }
    if name.contains('\0') || name.contains('/') {
        return Err(NameError::BadCharacter { name: name.to_string() });
    }
    if name == "." || name == ".." {
        return Err(NameError::DotComponent { path: name.to_string() });
    }
    Ok(())
}

/// Checks a fork name; the same rules as a path component.
pub fn check_fork_name(name: &str) -> Result<(), NameError> {
    check_name(name)
}

/// Splits an absolute path into checked components. `/` gives no components; a single
/// trailing slash is allowed (`/a/b/`), any other empty component is refused.
pub fn split_path(path: &str) -> Result<Vec<&str>, NameError> {
    if path.len() > PATH_BYTES_MAX {
        return Err(NameError::PathTooLong { length: path.len() });
    }
    let rest = path.strip_prefix('/').ok_or_else(|| NameError::NotAbsolute { path: path.to_string() })?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Ok(Vec::new());
    }
    let mut parts = Vec::new();
    for part in rest.split('/') {
        match check_name(part) {
            Ok(()) => parts.push(part),
            Err(NameError::Empty) => return Err(NameError::EmptyComponent { path: path.to_string() }),
            Err(NameError::DotComponent { .. }) => {
                return Err(NameError::DotComponent { path: path.to_string() })
            }
            Err(other) => return Err(other),
        }
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_good_paths() {
        assert_eq!(split_path("/").unwrap(), Vec::<&str>::new());
        assert_eq!(split_path("/a/b").unwrap(), vec!["a", "b"]);
        assert_eq!(split_path("/a/b/").unwrap(), vec!["a", "b"]);
    }

    #[test]
    fn refuses_bad_paths() {
        assert!(matches!(split_path("a/b"), Err(NameError::NotAbsolute { .. })));
        assert!(matches!(split_path("/a//b"), Err(NameError::EmptyComponent { .. })));
        assert!(matches!(split_path("/a/../b"), Err(NameError::DotComponent { .. })));
        assert!(matches!(split_path("/a/./b"), Err(NameError::DotComponent { .. })));
        let long = format!("/{}", "x".repeat(256));
        assert!(matches!(split_path(&long), Err(NameError::TooLong { .. })));
    }
}
