//! Messages between the nodes of the metadata group (issue 33), on the group's own listener.
//!
//! The body names the message; the Raft RPC itself travels in the frame's data section,
//! postcard-encoded by `flotilla-metagroup` (`RaftRpc` in a request, `RaftRpcReply` in a
//! reply), so this crate does not depend on the Raft library. Both are bounded by the
//! receiver's `frame_bytes_max` like any frame.

use crate::wire_error::WireError;
use serde::{Deserialize, Serialize};

/// A request from one group node to another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GroupRequest {
    /// A Raft RPC (append, vote or snapshot chunk) from node `from` to node `target`; the
    /// data section holds it. A node refuses one addressed to another node id.
    Raft { from: u64, target: u64 },
}

/// The answer to a [`GroupRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GroupReply {
    /// The Raft RPC's reply is in the data section (the remote node's Raft error included).
    Raft,
    /// The request was not handled: a bad frame (`Protocol`, the connection then closes), a
    /// body or RPC that does not decode (`BadRequest`), the wrong node (`InvalidArgument`).
    Error(WireError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode_body, encode_body, ErrorCode};

    #[test]
    fn group_messages_round_trip_and_keep_their_wire_form() {
        let request = GroupRequest::Raft { from: 1, target: 300 };
        let body = encode_body(&request).unwrap();
        assert_eq!(body, [0, 1, 0xac, 0x02], "variant 0, varint from, varint target");
        assert_eq!(decode_body::<GroupRequest>(&body, "group request").unwrap(), request);
        let reply = GroupReply::Error(WireError::new(ErrorCode::Protocol, "bad"));
        let body = encode_body(&reply).unwrap();
        assert_eq!(body[..2], [1, 11], "variant 1, code Protocol (11)");
        assert_eq!(decode_body::<GroupReply>(&body, "group reply").unwrap(), reply);
        assert_eq!(encode_body(&GroupReply::Raft).unwrap(), [0]);
    }

    #[test]
    fn malformed_group_bodies_are_errors_not_panics() {
        for body in [&[][..], &[0], &[0, 0xff], &[7, 1, 2], &[1, 99, 0]] {
            assert!(decode_body::<GroupRequest>(body, "group request").is_err(), "{body:?} decoded");
            let _ = decode_body::<GroupReply>(body, "group reply");
        }
        let error = decode_body::<GroupRequest>(&[9], "group request").unwrap_err();
        assert!(error.to_string().contains("group request"), "{error}");
    }
}
