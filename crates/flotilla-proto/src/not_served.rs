//! The answer of a metadata group node that handles no request (issue 33): it is not the
//! leader, or it cannot reach a majority. The caller tries another node (the client's
//! `transport/leader.rs` chooses which).

use serde::{Deserialize, Deserializer, Serialize};

/// Longest leader address a [`NotServed::NotLeader`] reply may carry; a longer one does not
/// decode (the reply is then a bad reply, and the caller moves on as from any broken node).
pub const LEADER_ADDRESS_BYTES_MAX: usize = 255;

/// Why a node of the metadata group did not handle a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NotServed {
    /// This node is not the leader and did nothing with the request (it proposed nothing).
    /// `leader`: the metadata address of the node it believes leads, `None` while it knows
    /// of none (an election is under way).
    NotLeader {
        #[serde(deserialize_with = "leader_address")]
        leader: Option<String>,
    },
    /// This node cannot reach a majority of the group: it acknowledged nothing. A change it
    /// had proposed before losing the majority may still take effect under the next leader,
    /// so the outcome is unknown, as after a broken connection.
    NoQuorum,
}

impl std::fmt::Display for NotServed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotServed::NotLeader { leader: Some(leader) } => {
                write!(f, "not the leader (the leader is {leader})")
            }
            NotServed::NotLeader { leader: None } => write!(f, "not the leader (no leader known)"),
            NotServed::NoQuorum => {
                write!(f, "cut off from a majority of the metadata group: acknowledges nothing")
            }
        }
    }
}

/// Decodes a leader address of at most [`LEADER_ADDRESS_BYTES_MAX`] bytes.
fn leader_address<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    let leader = Option::<String>::deserialize(deserializer)?;
    match leader {
        Some(address) if address.len() > LEADER_ADDRESS_BYTES_MAX => Err(serde::de::Error::custom(format!(
            "leader address of {} bytes, over {LEADER_ADDRESS_BYTES_MAX}",
            address.len()
        ))),
        leader => Ok(leader),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode_body, encode_body, MetaReply};

    #[test]
    fn not_served_replies_keep_their_wire_form() {
        let reply = MetaReply::NotServed(NotServed::NotLeader { leader: Some("b:7".into()) });
        let body = encode_body(&reply).unwrap();
        assert_eq!(body, [19, 0, 1, 3, b'b', b':', b'7'], "variant 19, NotLeader, Some, length, bytes");
        assert_eq!(decode_body::<MetaReply>(&body, "reply").unwrap(), reply);
        let unknown = MetaReply::NotServed(NotServed::NotLeader { leader: None });
        assert_eq!(encode_body(&unknown).unwrap(), [19, 0, 0]);
        assert_eq!(encode_body(&MetaReply::NotServed(NotServed::NoQuorum)).unwrap(), [19, 1]);
    }

    #[test]
    fn a_leader_address_over_the_bound_or_malformed_does_not_decode() {
        let at_bound =
            MetaReply::NotServed(NotServed::NotLeader { leader: Some("a".repeat(LEADER_ADDRESS_BYTES_MAX)) });
        let body = encode_body(&at_bound).unwrap();
        assert_eq!(decode_body::<MetaReply>(&body, "reply").unwrap(), at_bound);
        let over = MetaReply::NotServed(NotServed::NotLeader {
            leader: Some("a".repeat(LEADER_ADDRESS_BYTES_MAX + 1)),
        });
        assert!(decode_body::<MetaReply>(&encode_body(&over).unwrap(), "reply").is_err());
        for body in [&[19][..], &[19, 2], &[19, 0], &[19, 0, 1, 9, b'a'], &[19, 0, 1, 1, 0xff]] {
            assert!(decode_body::<MetaReply>(body, "reply").is_err(), "{body:?} decoded");
        }
    }
}
