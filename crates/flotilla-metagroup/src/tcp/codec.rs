//! Raft RPCs in group frames and back, without sockets.
//!
//! A request frame's body is `GroupRequest::Raft { from, target }` and its data section
//! `[RPC_DATA_V2 u8][group id u64 LE][postcard-encoded RaftRpc]` (the sender's group id, 0 if
//! it has none yet; see [`crate::identity`]); a data section without the version byte is the
//! first format, the RPC alone (a node of an older version), read as group id 0; a reply frame's body is `GroupReply::Raft` with the
//! postcard-encoded [`RaftRpcReply`] as data, or `GroupReply::Error`. Invariants: nothing is
//! sent that the peer's `frame_bytes_max` (the same setting on every node) would refuse; an
//! append too large for one frame comes back as a hint to split it; decoding never panics
//! and reads only the frame's bytes.

use flotilla_proto::{
    decode_body, encode_body, ErrorCode, GroupReply, GroupRequest, WireError, HEADER_BYTES,
};

use crate::network::{RaftRpc, RaftRpcReply};
use crate::types::NodeId;

/// Bytes of a frame besides the RPC: header and body (a body is at most 21 bytes).
pub const FRAME_OVERHEAD_BYTES: usize = HEADER_BYTES + 64;

/// First byte of a request's data section in the second format (with the group id). A
/// postcard `RaftRpc` starts with its variant (0, 1 or 2), never with this byte.
pub const RPC_DATA_V2: u8 = 0xF2;
/// Bytes before the RPC in a second-format data section.
pub const RPC_DATA_HEADER_BYTES: usize = 1 + 8;

/// Why an RPC could not be put into a frame or taken out of one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    #[error("cannot encode {what}: {message}")]
    Encode { what: &'static str, message: String },
    /// The encoded RPC is over `frame_bytes_max`; for an append of several entries,
    /// `entries_hint` is how many would fit.
    #[error("{what} of {bytes} bytes is over frame_bytes_max ({frame_bytes_max})")]
    TooLarge { what: &'static str, bytes: usize, frame_bytes_max: u32, entries_hint: Option<u64> },
    /// The peer refused the request, or its reply did not decode.
    #[error("{0}")]
    Refused(WireError),
}

/// The body and data of the request frame carrying `rpc` from `from` (of group `group`) to
/// `target`.
pub fn encode_request(
    from: NodeId,
    target: NodeId,
    group: u64,
    rpc: &RaftRpc,
    frame_bytes_max: u32,
) -> Result<(Vec<u8>, Vec<u8>), CodecError> {
    let body = encode_body(&GroupRequest::Raft { from, target })
        .map_err(|e| CodecError::Encode { what: "group request", message: e.to_string() })?;
    let mut data = Vec::with_capacity(256);
    data.push(RPC_DATA_V2);
    data.extend_from_slice(&group.to_le_bytes());
    let data = postcard::to_extend(rpc, data)
        .map_err(|e| CodecError::Encode { what: "Raft RPC", message: e.to_string() })?;
    check_fits(rpc, data.len(), frame_bytes_max)?;
    Ok((body, data))
}

/// Refuses an RPC whose frame would be over `frame_bytes_max`, with a split hint for appends.
fn check_fits(rpc: &RaftRpc, bytes: usize, frame_bytes_max: u32) -> Result<(), CodecError> {
    let room = (frame_bytes_max as usize).saturating_sub(FRAME_OVERHEAD_BYTES);
    if bytes <= room {
        return Ok(());
    }
    let entries_hint = match rpc {
        RaftRpc::Append(append) if append.entries.len() > 1 => {
            let entries = append.entries.len() as u64;
            // Entries in proportion to the room, at least one, always fewer than now.
            let fitting = (entries as u128 * room as u128 / bytes as u128) as u64;
            Some(fitting.clamp(1, entries - 1))
        }
        _ => None,
    };
    Err(CodecError::TooLarge { what: rpc_name(rpc), bytes, frame_bytes_max, entries_hint })
}

fn rpc_name(rpc: &RaftRpc) -> &'static str {
    match rpc {
        RaftRpc::Append(_) => "append",
        RaftRpc::Vote(_) => "vote",
        RaftRpc::Snapshot(_) => "snapshot chunk",
    }
}

/// A request as it arrived: who sent it, its group id (0: none), and the RPC.
#[derive(Debug)]
pub struct Request {
    pub from: NodeId,
    pub group: u64,
    pub rpc: RaftRpc,
}

/// The sender, group id and RPC of a request frame that reached node `node`; an error is the
/// `GroupReply::Error` to answer with (the connection stays open).
pub fn decode_request(node: NodeId, body: &[u8], data: &[u8]) -> Result<Request, WireError> {
    let bad = |e: String| WireError::new(ErrorCode::BadRequest, e);
    let request = decode_body::<GroupRequest>(body, "group request").map_err(|e| bad(e.to_string()))?;
    let GroupRequest::Raft { from, target } = request;
    if target != node {
        let message = format!(
            "Raft RPC from node {from} for node {target} reached node {node} (check the peer addresses)"
        );
        return Err(WireError::new(ErrorCode::InvalidArgument, message));
    }
    let (group, rpc_bytes) = match data.first() {
        Some(&RPC_DATA_V2) => {
            let Some(id) = data.get(1..RPC_DATA_HEADER_BYTES) else {
                return Err(bad(format!(
                    "a Raft RPC from node {from} of {} bytes is too short for its group id",
                    data.len()
                )));
            };
            let mut le = [0u8; 8];
            le.copy_from_slice(id);
            (u64::from_le_bytes(le), &data[RPC_DATA_HEADER_BYTES..])
        }
        _ => (0, data),
    };
    let rpc = postcard::from_bytes::<RaftRpc>(rpc_bytes).map_err(|e| {
        bad(format!("cannot decode the Raft RPC from node {from} ({} bytes): {e}", data.len()))
    })?;
    Ok(Request { from, group, rpc })
}

/// The body and data of the reply frame carrying `reply`.
pub fn encode_reply(reply: &RaftRpcReply) -> Result<(Vec<u8>, Vec<u8>), CodecError> {
    let data = postcard::to_stdvec(reply)
        .map_err(|e| CodecError::Encode { what: "Raft RPC reply", message: e.to_string() })?;
    let body = encode_body(&GroupReply::Raft)
        .map_err(|e| CodecError::Encode { what: "group reply", message: e.to_string() })?;
    Ok((body, data))
}

/// The body of an error reply.
pub fn encode_error(error: &WireError) -> Vec<u8> {
    // An enum of a code and a string always encodes; an empty body would decode as an error.
    encode_body(&GroupReply::Error(error.clone())).unwrap_or_default()
}

/// The Raft reply in a reply frame, or the peer's refusal.
pub fn decode_reply(body: &[u8], data: &[u8]) -> Result<RaftRpcReply, CodecError> {
    let undecodable = |message: String| CodecError::Refused(WireError::new(ErrorCode::Protocol, message));
    match decode_body::<GroupReply>(body, "group reply").map_err(|e| undecodable(e.to_string()))? {
        GroupReply::Raft => postcard::from_bytes::<RaftRpcReply>(data).map_err(|e| {
            undecodable(format!("cannot decode the Raft RPC reply ({} bytes): {e}", data.len()))
        }),
        GroupReply::Error(error) => Err(CodecError::Refused(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Batch, Change, TypeConfig};
    use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest};
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Vote};

    fn append(entries: usize, body_bytes: usize) -> RaftRpc {
        let leader = CommittedLeaderId::new(3, 1);
        let change =
            Change { session_id: 1, sequence: 1, acknowledged_through: 0, body: vec![7; body_bytes] };
        let entries = (1..=entries as u64)
            .map(|index| Entry::<TypeConfig> {
                log_id: LogId::new(leader, index),
                payload: EntryPayload::Normal(Batch::new(5, vec![change.clone()])),
            })
            .collect();
        RaftRpc::Append(AppendEntriesRequest {
            vote: Vote::new_committed(3, 1),
            prev_log_id: None,
            entries,
            leader_commit: None,
        })
    }

    #[test]
    fn a_request_round_trips_and_names_its_nodes() {
        let (body, data) = encode_request(1, 2, 0x77, &append(3, 10), 1 << 20).unwrap();
        let Request { from, group, rpc } = decode_request(2, &body, &data).unwrap();
        assert_eq!((from, group), (1, 0x77));
        match rpc {
            RaftRpc::Append(a) => assert_eq!(a.entries.len(), 3),
            other => panic!("{other:?}"),
        }
        let vote = RaftRpc::Vote(VoteRequest::new(Vote::new(4, 1), None));
        let (body, data) = encode_request(1, 3, 0x77, &vote, 1 << 20).unwrap();
        assert!(matches!(
            decode_request(3, &body, &data),
            Ok(Request { from: 1, rpc: RaftRpc::Vote(_), .. })
        ));
    }

    #[test]
    fn a_request_in_the_first_format_reads_as_no_group() {
        let vote = RaftRpc::Vote(VoteRequest::new(Vote::new(4, 1), None));
        let (body, _) = encode_request(1, 3, 0x77, &vote, 1 << 20).unwrap();
        let data = postcard::to_stdvec(&vote).unwrap();
        let request = decode_request(3, &body, &data).unwrap();
        assert_eq!((request.from, request.group), (1, 0));
        assert!(matches!(request.rpc, RaftRpc::Vote(_)));
        // A second-format section cut inside its group id is refused by name.
        let error = decode_request(3, &body, &[RPC_DATA_V2, 1, 2]).unwrap_err();
        assert!(error.message.contains("too short for its group id"), "{error}");
    }

    #[test]
    fn a_request_for_another_node_is_refused_by_name() {
        let (body, data) = encode_request(1, 2, 9, &append(1, 1), 1 << 20).unwrap();
        let error = decode_request(3, &body, &data).unwrap_err();
        assert_eq!(error.code, ErrorCode::InvalidArgument);
        assert!(error.message.contains("for node 2 reached node 3"), "{error}");
    }

    #[test]
    fn an_append_over_the_frame_limit_gets_a_smaller_entries_hint() {
        let rpc = append(100, 1000);
        let error = encode_request(1, 2, 9, &rpc, 20_000).unwrap_err();
        match error {
            CodecError::TooLarge { entries_hint: Some(hint), bytes, .. } => {
                assert!((1..100).contains(&hint), "hint {hint}");
                assert!(bytes > 100_000);
                // The hinted number of entries fits.
                let (body, data) = encode_request(1, 2, 9, &append(hint as usize, 1000), 20_000).unwrap();
                assert!(HEADER_BYTES + body.len() + data.len() <= 20_000);
            }
            other => panic!("{other:?}"),
        }
        // One entry that does not fit cannot be split.
        let error = encode_request(1, 2, 9, &append(1, 30_000), 20_000).unwrap_err();
        assert!(matches!(error, CodecError::TooLarge { entries_hint: None, .. }), "{error:?}");
        assert!(error.to_string().contains("frame_bytes_max"), "{error}");
    }

    #[test]
    fn bad_bytes_are_typed_errors_never_panics() {
        let (body, data) = encode_request(1, 2, 9, &append(2, 50), 1 << 20).unwrap();
        // Every truncation of the RPC and a few corruptions decode to BadRequest or a value.
        for cut in 0..data.len() {
            if let Err(error) = decode_request(2, &body, &data[..cut]) {
                assert_eq!(error.code, ErrorCode::BadRequest, "{error}");
            }
        }
        for at in 0..data.len() {
            let mut bad = data.clone();
            bad[at] = 0xff;
            let _ = decode_request(2, &body, &bad);
        }
        let error = decode_request(2, &[5, 1], &data).unwrap_err();
        assert!(error.message.contains("group request"), "{error}");
        let error = decode_reply(&[0], &[0xff, 0xff]).unwrap_err();
        assert!(matches!(error, CodecError::Refused(WireError { code: ErrorCode::Protocol, .. })), "{error}");
    }

    #[test]
    fn replies_and_refusals_round_trip() {
        let response = AppendEntriesResponse::<NodeId>::Success;
        let (body, data) = encode_reply(&RaftRpcReply::Append(Ok(response))).unwrap();
        assert!(matches!(
            decode_reply(&body, &data),
            Ok(RaftRpcReply::Append(Ok(AppendEntriesResponse::Success)))
        ));
        let fatal = openraft::error::RaftError::Fatal(openraft::error::Fatal::Stopped);
        let (body, data) = encode_reply(&RaftRpcReply::Vote(Err(fatal))).unwrap();
        assert!(matches!(decode_reply(&body, &data), Ok(RaftRpcReply::Vote(Err(_)))));
        let refusal = WireError::new(ErrorCode::BadRequest, "no");
        let error = decode_reply(&encode_error(&refusal), &[]).unwrap_err();
        assert_eq!(error, CodecError::Refused(refusal));
    }
}
