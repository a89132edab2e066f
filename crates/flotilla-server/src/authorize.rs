//! What an I/O server lets a connection do: pure checks of one decoded request against the
//! peer's credential and the capability it carries, kept apart from the socket code.
//!
//! A client credential reaches data only through `IoRequest::With`: the capability's tag,
//! holder and expiry are checked with the cluster's capability key (no round trip to the
//! metadata service), then whether it covers the request (file, subfile, rights). A server
//! credential (the cluster's own services) is trusted bare.

use flotilla_auth::{CapabilityError, CapabilityKey, Peer, Role};
use flotilla_proto::capability::{changes_data, needs, request_name};
use flotilla_proto::{ErrorCode, IoRequest, WireError};

/// Who is on the other end of a connection, as far as data access goes.
pub(crate) struct Principal {
    pub name: String,
    pub role: Role,
    pub read_only: bool,
}

impl From<&Peer> for Principal {
    fn from(peer: &Peer) -> Self {
        Principal { name: peer.name.clone(), role: peer.role, read_only: peer.limits.read_only }
    }
}

/// The request to execute, unwrapped from its capability, or the refusal to send back.
pub(crate) fn authorize(
    request: IoRequest,
    principal: &Principal,
    key: &CapabilityKey,
    now_unix_ms: u64,
) -> Result<IoRequest, WireError> {
    if is_forward(&request) && principal.role != Role::Server {
        let message = format!(
            "a chain forward is accepted only from a server credential; {:?} is a client credential",
            principal.name
        );
        return Err(WireError::new(ErrorCode::PermissionDenied, message));
    }
    let request = match request {
        IoRequest::With { capability, request } => {
            if matches!(*request, IoRequest::With { .. }) {
                return Err(WireError::new(ErrorCode::BadRequest, "a capability envelope may not be nested"));
            }
            key.check(&capability, &principal.name, now_unix_ms).map_err(capability_error)?;
            if let Some(refusal) = capability.refusal(&request) {
                return Err(WireError::new(ErrorCode::PermissionDenied, refusal));
            }
            *request
        }
        IoRequest::Hello { .. } | IoRequest::Job { .. } | IoRequest::Stats | IoRequest::HsmStatus => {
            return Ok(request)
        }
        bare if principal.role == Role::Server => return Ok(bare),
        bare => return Err(needs_capability(&bare, principal)),
    };
    if principal.read_only && changes_data(&request) {
        let message = format!("credential {:?} is read-only; this request changes data", principal.name);
        return Err(WireError::new(ErrorCode::PermissionDenied, message));
    }
    Ok(request)
}

/// A replication forward, bare or wrapped (servers only send it bare).
fn is_forward(request: &IoRequest) -> bool {
    match request {
        IoRequest::Forward { .. } => true,
        IoRequest::With { request, .. } => matches!(**request, IoRequest::Forward { .. }),
        _ => false,
    }
}

fn needs_capability(request: &IoRequest, principal: &Principal) -> WireError {
    let what = match needs(request) {
        Some((file, _, _)) => format!("{} on file {file}", request_name(request)),
        None => request_name(request).to_string(),
    };
    let message = format!(
        "{what} needs a capability from the metadata service; client credential {:?} sent none",
        principal.name
    );
    WireError::new(ErrorCode::PermissionDenied, message)
}

fn capability_error(error: CapabilityError) -> WireError {
    let code = match error {
        CapabilityError::Expired { .. } => ErrorCode::CapabilityExpired,
        _ => ErrorCode::PermissionDenied,
    };
    WireError::new(code, error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_auth::Grant;
    use flotilla_proto::{ForkRef, Rights};
    use flotilla_request::Shape;
    use flotilla_types::{FileId, SubfileIndex, TargetId};

    fn client(read_only: bool) -> Principal {
        Principal { name: "alice".into(), role: Role::Client, read_only }
    }

    fn write(file: u64) -> IoRequest {
        let fork =
            ForkRef { target: TargetId(1), file: FileId(file), subfile: SubfileIndex(0), fork: "d".into() };
        IoRequest::Write { fork, shape: Shape::contiguous(0, 4) }
    }

    fn with(key: &CapabilityKey, rights: Rights, request: IoRequest) -> IoRequest {
        let grant = Grant { file: FileId(3), subfiles: 1, rights, holder: "alice".into(), lifetime_ms: 100 };
        IoRequest::With { capability: key.issue(&grant, 1000).unwrap(), request: Box::new(request) }
    }

    #[test]
    fn any_credential_may_name_its_job_and_ask_for_stats() {
        let key = CapabilityKey::new(&[1; 32]);
        for request in [IoRequest::Job { id: "4242".into() }, IoRequest::Stats] {
            assert_eq!(authorize(request.clone(), &client(true), &key, 1050), Ok(request));
        }
    }

    #[test]
    fn a_client_needs_a_covering_live_capability() {
        let key = CapabilityKey::new(&[1; 32]);
        let code = |r: Result<IoRequest, WireError>| r.map(|_| ()).map_err(|e| e.code);
        assert_eq!(code(authorize(write(3), &client(false), &key, 1050)), Err(ErrorCode::PermissionDenied));
        assert_eq!(code(authorize(with(&key, Rights::WRITE, write(3)), &client(false), &key, 1050)), Ok(()));
        assert_eq!(
            code(authorize(with(&key, Rights::WRITE, write(3)), &client(false), &key, 1100)),
            Err(ErrorCode::CapabilityExpired)
        );
        assert_eq!(
            code(authorize(with(&key, Rights::WRITE, write(4)), &client(false), &key, 1050)),
            Err(ErrorCode::PermissionDenied),
            "a capability for file 3 does not reach file 4"
        );
        assert_eq!(
            code(authorize(with(&key, Rights::READ, write(3)), &client(false), &key, 1050)),
            Err(ErrorCode::PermissionDenied)
        );
        assert_eq!(
            code(authorize(with(&key, Rights::WRITE, write(3)), &client(true), &key, 1050)),
            Err(ErrorCode::PermissionDenied),
            "a read-only credential writes nothing, whatever it carries"
        );
        let other_key = CapabilityKey::new(&[2; 32]);
        assert_eq!(
            code(authorize(with(&other_key, Rights::WRITE, write(3)), &client(false), &key, 1050)),
            Err(ErrorCode::PermissionDenied)
        );
        let nested = with(&key, Rights::WRITE, with(&key, Rights::WRITE, write(3)));
        assert_eq!(code(authorize(nested, &client(false), &key, 1050)), Err(ErrorCode::BadRequest));
    }

    #[test]
    fn only_a_server_credential_forwards() {
        let key = CapabilityKey::new(&[1; 32]);
        let fork =
            ForkRef { target: TargetId(1), file: FileId(3), subfile: SubfileIndex(0), fork: "d".into() };
        let entry = flotilla_proto::ForwardEntry::Sync { fork };
        let forward = IoRequest::Forward {
            forward: flotilla_proto::ChainForward { chain: 0, version: 1, position: 1, entry },
        };
        let server = Principal { name: "io-0".into(), role: Role::Server, read_only: false };
        assert!(authorize(forward.clone(), &server, &key, 0).is_ok());
        let refused = authorize(forward.clone(), &client(false), &key, 1050).unwrap_err();
        assert_eq!(refused.code, ErrorCode::PermissionDenied);
        assert!(refused.message.contains("only from a server credential"), "{}", refused.message);
        let wrapped = with(&key, Rights(15), forward);
        assert_eq!(
            authorize(wrapped, &client(false), &key, 1050).unwrap_err().code,
            ErrorCode::PermissionDenied
        );
    }

    #[test]
    fn a_chained_request_is_checked_like_the_request_it_carries() {
        let key = CapabilityKey::new(&[1; 32]);
        let chained = |request| IoRequest::Chained { chain: 0, version: 1, request: Box::new(request) };
        let code = |r: Result<IoRequest, WireError>| r.map(|_| ()).map_err(|e| e.code);
        let unwrapped = authorize(with(&key, Rights::WRITE, chained(write(3))), &client(false), &key, 1050);
        assert_eq!(unwrapped, Ok(chained(write(3))), "the envelope goes, the chain stays");
        assert_eq!(
            code(authorize(with(&key, Rights::READ, chained(write(3))), &client(false), &key, 1050)),
            Err(ErrorCode::PermissionDenied),
            "a chained write needs the write right"
        );
        assert_eq!(
            code(authorize(with(&key, Rights::WRITE, chained(write(4))), &client(false), &key, 1050)),
            Err(ErrorCode::PermissionDenied),
            "the capability must cover the file the chained request names"
        );
        assert_eq!(
            code(authorize(with(&key, Rights::WRITE, chained(write(3))), &client(true), &key, 1050)),
            Err(ErrorCode::PermissionDenied),
            "a read-only credential changes nothing through a chain"
        );
        assert_eq!(
            code(authorize(
                with(&key, Rights::WRITE, chained(chained(write(3)))),
                &client(false),
                &key,
                1050
            )),
            Err(ErrorCode::PermissionDenied),
            "chains do not nest"
        );
        assert_eq!(
            code(authorize(chained(write(3)), &client(false), &key, 1050)),
            Err(ErrorCode::PermissionDenied)
        );
    }

    #[test]
    fn a_server_credential_is_trusted_bare() {
        let key = CapabilityKey::new(&[1; 32]);
        let server = Principal { name: "io-0".into(), role: Role::Server, read_only: false };
        assert!(authorize(write(3), &server, &key, 0).is_ok());
    }
}
