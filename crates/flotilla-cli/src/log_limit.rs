//! Holds back repeats of openraft's warnings and errors about one peer.
//!
//! While a peer of the metadata group is down, openraft logs an error for every heartbeat
//! and every replication attempt to it ("RPCError", "error replication to target=N", vote
//! timeouts), ten lines a second per peer. [`RepeatLimit`] lets the first line of each kind
//! about each peer through, then at most one per [`REPEAT_INTERVAL`]; a kind that stopped
//! for longer than that shows again at once, so a peer going down again is seen. Only
//! events of openraft at warn or error are limited; nothing else is touched.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// One line of a kind about one peer per this long.
pub const REPEAT_INTERVAL: Duration = Duration::from_secs(10);
/// Kinds remembered; past it the memory is cleared (at worst a few more lines).
const KINDS_REMEMBERED_MAX: usize = 1024;

/// A kind of line: where it is logged, its message, and the peer it names (if any).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Kind {
    pub callsite: String,
    pub message: String,
    pub peer: Option<u64>,
}

/// The rule, without the tracing plumbing.
pub struct RepeatLimit {
    interval: Duration,
    last_shown: Mutex<HashMap<Kind, Instant>>,
}

impl RepeatLimit {
    pub fn new(interval: Duration) -> RepeatLimit {
        RepeatLimit { interval, last_shown: Mutex::new(HashMap::new()) }
    }

    /// Whether a line of `kind` seen at `now` is shown.
    pub fn allow(&self, kind: Kind, now: Instant) -> bool {
        let mut last_shown = self.last_shown.lock();
        if let Some(at) = last_shown.get(&kind) {
            if now.saturating_duration_since(*at) < self.interval {
                return false;
            }
        }
        if last_shown.len() >= KINDS_REMEMBERED_MAX {
            last_shown.clear();
        }
        last_shown.insert(kind, now);
        true
    }
}

/// The peer a line names: its `target` field, else the first "target=N", "node N" or
/// "->N" (openraft's "AppendEntries 1->2") in its text.
fn peer_in(text: &str) -> Option<u64> {
    ["target=", "node ", "->"].into_iter().find_map(|marker| {
        text.match_indices(marker).find_map(|(at, _)| {
            let digits: String = text[at + marker.len()..].chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
    })
}

/// Collects an event's message and the text of its other fields.
#[derive(Default)]
struct Fields {
    message: String,
    target: Option<u64>,
    rest: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => {
                let _ = write!(self.message, "{value:?}");
            }
            name => {
                let mut text = String::new();
                let _ = write!(text, "{value:?}");
                if name == "target" {
                    self.target = text.trim().parse().ok();
                }
                self.rest.push_str(&text);
                self.rest.push(' ');
            }
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "target" {
            self.target = Some(value);
        } else {
            self.record_debug(field, &value);
        }
    }
}

/// The layer: drops held-back repeats for every other layer.
pub struct RepeatLayer {
    limit: RepeatLimit,
}

impl RepeatLayer {
    pub fn new() -> RepeatLayer {
        RepeatLayer { limit: RepeatLimit::new(REPEAT_INTERVAL) }
    }
}

impl Default for RepeatLayer {
    fn default() -> Self {
        RepeatLayer::new()
    }
}

impl<S: Subscriber> Layer<S> for RepeatLayer {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        let metadata = event.metadata();
        if *metadata.level() > Level::WARN || !metadata.target().starts_with("openraft") {
            return true;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        let peer = fields.target.or_else(|| peer_in(&fields.message)).or_else(|| peer_in(&fields.rest));
        let callsite =
            format!("{}:{}", metadata.file().unwrap_or(metadata.target()), metadata.line().unwrap_or(0));
        self.limit.allow(Kind { callsite, message: fields.message, peer }, Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(message: &str, peer: Option<u64>) -> Kind {
        Kind { callsite: "replication/mod.rs:284".into(), message: message.into(), peer }
    }

    #[test]
    fn the_first_line_shows_repeats_wait_the_interval_and_peers_count_apart() {
        let limit = RepeatLimit::new(Duration::from_secs(10));
        let start = Instant::now();
        assert!(limit.allow(kind("RPCError", Some(2)), start), "the first occurrence is never hidden");
        for tick in 1..100u64 {
            let at = start + Duration::from_millis(tick * 50);
            assert!(!limit.allow(kind("RPCError", Some(2)), at), "repeat at {tick}");
        }
        assert!(limit.allow(kind("RPCError", Some(3)), start), "another peer is its own kind");
        assert!(limit.allow(kind("timeout", Some(2)), start), "another message is its own kind");
        assert!(limit.allow(kind("RPCError", Some(2)), start + Duration::from_secs(10)));
        assert!(!limit.allow(kind("RPCError", Some(2)), start + Duration::from_secs(11)));
    }

    #[test]
    fn the_peer_is_read_from_the_text() {
        assert_eq!(peer_in("error replication to target=3"), Some(3));
        assert_eq!(peer_in("Unreachable node 12 at 127.0.0.1:7771 is unreachable: refused"), Some(12));
        assert_eq!(peer_in("timeout after 100ms when AppendEntries 1->3"), Some(3));
        assert_eq!(peer_in("nothing here"), None);
        assert_eq!(peer_in("node x"), None);
        assert_eq!(peer_in("Unreachable node: node 2 at a:1 is unreachable"), Some(2));
    }
}
