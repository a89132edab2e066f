//! Which server credential owns each target: the value of the `target_owners` table,
//! format version 1 (see `FORMAT.md`).
//!
//! A target is bound to the server credential that first reported it, durably, so that
//! after a metadata restart another server credential still may not claim it.

use crate::codec::{Reader, Writer};
use crate::error::NamespaceError;
use crate::namespace::Namespace;
use flotilla_types::TargetId;
use redb::ReadableTable;

/// Format version of owner records written by this build.
pub(crate) const OWNER_FORMAT_VERSION: u8 = 1;
/// Longest credential name kept as a target's owner.
pub const OWNER_NAME_BYTES_MAX: usize = 255;
/// Most targets bound in one call.
pub const TARGETS_BOUND_PER_CALL_MAX: usize = 65_536;

fn encode_owner(name: &str) -> Vec<u8> {
    assert!(!name.is_empty() && name.len() <= OWNER_NAME_BYTES_MAX, "owner name length");
    let mut writer = Writer::new(OWNER_FORMAT_VERSION);
    writer.u16(name.len() as u16);
    writer.raw(name.as_bytes());
    writer.finish()
}

fn decode_owner(record: &[u8]) -> Result<String, NamespaceError> {
    let mut reader = Reader::open("target owner", record, OWNER_FORMAT_VERSION)?;
    let length = usize::from(reader.u16()?);
    if length == 0 || length > OWNER_NAME_BYTES_MAX {
        return Err(reader.error(format!("has a {length}-byte owner name")));
    }
    let name = std::str::from_utf8(reader.take(length)?)
        .map_err(|_| reader.error("has an owner name that is not UTF-8".into()))?
        .to_string();
    reader.finish()?;
    Ok(name)
}

fn check_owner_name(name: &str) -> Result<(), NamespaceError> {
    if name.is_empty() || name.len() > OWNER_NAME_BYTES_MAX {
        return Err(NamespaceError::invalid(format!(
            "owner credential name of {} bytes, must be 1..={OWNER_NAME_BYTES_MAX}",
            name.len()
        )));
    }
    Ok(())
}

impl Namespace {
    /// Binds every target in `targets` that has no owner yet to `credential`, in one
    /// durable transaction. Refuses (binding nothing) when one of them is bound to another
    /// credential.
    pub fn bind_targets(&self, credential: &str, targets: &[TargetId]) -> Result<(), NamespaceError> {
        check_owner_name(credential)?;
        if targets.len() > TARGETS_BOUND_PER_CALL_MAX {
            return Err(NamespaceError::invalid(format!(
                "{} targets bound in one call, over {TARGETS_BOUND_PER_CALL_MAX}",
                targets.len()
            )));
        }
        let record = encode_owner(credential);
        self.write(|tables| {
            for target in targets {
                let owner = match tables.owners.get(target.0)? {
                    Some(guard) => Some(decode_owner(guard.value())?),
                    None => None,
                };
                match owner {
                    Some(owner) if owner != credential => {
                        return Err(NamespaceError::NotPermitted {
                            what: format!(
                                "target {target} is bound to server credential {owner:?}, not {credential:?}"
                            ),
                        })
                    }
                    Some(_) => {}
                    None => {
                        tables.owners.insert(target.0, record.as_slice())?;
                    }
                }
            }
            Ok(())
        })
    }

    /// Every bound target and its owner credential, in target id order.
    pub fn target_owners(&self) -> Result<Vec<(TargetId, String)>, NamespaceError> {
        self.write(|tables| {
            let mut out = Vec::new();
            for item in tables.owners.iter()? {
                let (key, value) = item?;
                out.push((TargetId(key.value()), decode_owner(value.value())?));
            }
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_record_round_trips_with_documented_bytes() {
        let bytes = encode_owner("srv-a");
        assert_eq!(bytes[0], 1);
        assert_eq!(&bytes[1..3], &5u16.to_le_bytes());
        assert_eq!(&bytes[3..8], b"srv-a");
        assert_eq!(bytes.len(), 3 + 5 + 4);
        assert_eq!(decode_owner(&bytes).unwrap(), "srv-a");
        let mut altered = bytes.clone();
        altered[4] ^= 1;
        assert!(matches!(decode_owner(&altered), Err(NamespaceError::Corrupt { .. })));
    }

    #[test]
    fn a_bound_target_refuses_another_credential_and_keeps_its_owner() {
        let ns = Namespace::open_in_memory().unwrap();
        ns.bind_targets("a", &[TargetId(1), TargetId(2)]).unwrap();
        ns.bind_targets("a", &[TargetId(2)]).unwrap();
        let refused = ns.bind_targets("b", &[TargetId(3), TargetId(2)]).unwrap_err();
        assert!(refused.to_string().contains("bound to server credential \"a\""), "{refused}");
        ns.bind_targets("b", &[TargetId(3)]).unwrap();
        let owners = ns.target_owners().unwrap();
        assert_eq!(
            owners,
            vec![(TargetId(1), "a".into()), (TargetId(2), "a".into()), (TargetId(3), "b".into())]
        );
        assert!(ns.bind_targets("", &[TargetId(4)]).is_err());
    }
}
