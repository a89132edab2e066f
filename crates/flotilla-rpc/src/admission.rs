//! Admission of connections that have not authenticated yet, kept apart from those that
//! have: a per-address token bucket bounds how fast one address may start handshakes, and
//! the handshakes in progress form a small pool of their own. When the pool is full, a
//! newcomer from an address with fewer handshakes in progress evicts the oldest handshake of
//! the address with the most, so a flood from a few addresses cannot keep another address
//! out; an address already holding as many as the busiest is refused instead.
//!
//! Pure logic (no sockets, the clock passed in); `accept_loop_limited` drives it.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Bounds on connections still in their handshake.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HandshakeLimits {
    /// Handshakes in progress at once (`handshakes_max`).
    pub handshakes_max: usize,
    /// Handshakes one address may start per second, on average
    /// (`handshakes_per_peer_per_second_max`).
    pub per_peer_per_second: u32,
    /// ... and at once, after a quiet spell (`handshake_burst_per_peer_max`).
    pub burst_per_peer: u32,
}

impl Default for HandshakeLimits {
    fn default() -> Self {
        HandshakeLimits { handshakes_max: 256, per_peer_per_second: 1000, burst_per_peer: 2000 }
    }
}

/// What became of a new connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission<T> {
    /// Start its handshake, under this id.
    Start { id: u64, evicted: Option<T> },
    /// Close it: its address is over its rate.
    OverRate,
    /// Close it: the pool is full and its address holds as many handshakes as any.
    PoolFull,
}

/// Addresses whose buckets are remembered; past this, full buckets are forgotten.
const BUCKETS_KEPT_MAX: usize = 16 << 10;

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The handshake pool and the per-address buckets; `T` is what ends a handshake early (a
/// task's abort handle).
#[derive(Debug)]
pub struct HandshakeGate<T> {
    limits: HandshakeLimits,
    pending: HashMap<IpAddr, VecDeque<(u64, Option<T>)>>,
    count: usize,
    buckets: HashMap<IpAddr, Bucket>,
    next_id: u64,
}

impl<T> HandshakeGate<T> {
    pub fn new(limits: HandshakeLimits) -> HandshakeGate<T> {
        HandshakeGate { limits, pending: HashMap::new(), count: 0, buckets: HashMap::new(), next_id: 1 }
    }

    /// Handshakes in progress.
    pub fn pending(&self) -> usize {
        self.count
    }

    /// Decides about a new connection from `ip` at `now`.
    pub fn admit(&mut self, ip: IpAddr, now: Instant) -> Admission<T> {
        if !self.take_token(ip, now) {
            return Admission::OverRate;
        }
        let mut evicted = None;
        if self.count >= self.limits.handshakes_max.max(1) {
            match self.evict_for(ip) {
                Some(victim) => evicted = Some(victim),
                None => return Admission::PoolFull,
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        self.pending.entry(ip).or_default().push_back((id, None));
        self.count += 1;
        Admission::Start { id, evicted: evicted.flatten() }
    }

    /// Attaches what ends handshake `id` early (if it is still in progress).
    pub fn attach(&mut self, ip: IpAddr, id: u64, handle: T) {
        if let Some(entry) = self.pending.get_mut(&ip).and_then(|q| q.iter_mut().find(|(i, _)| *i == id)) {
            entry.1 = Some(handle);
        }
    }

    /// Handshake `id` from `ip` ended (done, failed, timed out or evicted).
    pub fn finished(&mut self, ip: IpAddr, id: u64) {
        let Some(queue) = self.pending.get_mut(&ip) else { return };
        let before = queue.len();
        queue.retain(|(i, _)| *i != id);
        self.count -= before - queue.len();
        if queue.is_empty() {
            self.pending.remove(&ip);
        }
    }

    /// Removes the oldest handshake of the busiest address, if it has more than `ip` would
    /// have with one more; its handle (if attached) comes back to be ended.
    fn evict_for(&mut self, ip: IpAddr) -> Option<Option<T>> {
        let own = self.pending.get(&ip).map_or(0, VecDeque::len);
        let (busiest, count) = self.pending.iter().map(|(a, q)| (*a, q.len())).max_by_key(|(_, n)| *n)?;
        if count <= own + 1 {
            return None;
        }
        let queue = self.pending.get_mut(&busiest)?;
        let (_, handle) = queue.pop_front()?;
        self.count -= 1;
        Some(handle)
    }

    fn take_token(&mut self, ip: IpAddr, now: Instant) -> bool {
        let (rate, burst) =
            (f64::from(self.limits.per_peer_per_second), f64::from(self.limits.burst_per_peer.max(1)));
        if self.buckets.len() >= BUCKETS_KEPT_MAX && !self.buckets.contains_key(&ip) {
            self.forget_full_buckets(now);
        }
        let bucket = self.buckets.entry(ip).or_insert(Bucket { tokens: burst, at: now });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(burst);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return false;
        }
        bucket.tokens -= 1.0;
        true
    }

    fn forget_full_buckets(&mut self, now: Instant) {
        let (rate, burst) =
            (f64::from(self.limits.per_peer_per_second), f64::from(self.limits.burst_per_peer.max(1)));
        let refill = Duration::from_secs_f64(if rate > 0.0 { burst / rate } else { 3600.0 });
        self.buckets.retain(|_, b| now.saturating_duration_since(b.at) < refill);
        if self.buckets.len() >= BUCKETS_KEPT_MAX {
            self.buckets.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    fn started<T: std::fmt::Debug>(admission: Admission<T>) -> (u64, Option<T>) {
        match admission {
            Admission::Start { id, evicted } => (id, evicted),
            other => panic!("expected a start, got {other:?}"),
        }
    }

    #[test]
    fn an_address_over_its_rate_is_refused_until_its_bucket_refills() {
        let limits = HandshakeLimits { handshakes_max: 100, per_peer_per_second: 10, burst_per_peer: 3 };
        let mut gate = HandshakeGate::<()>::new(limits);
        let now = Instant::now();
        for _ in 0..3 {
            started(gate.admit(ip(2), now));
        }
        assert_eq!(gate.admit(ip(2), now), Admission::OverRate);
        // Another address has its own bucket.
        started(gate.admit(ip(1), now));
        // A tenth of a second later, one more token.
        started(gate.admit(ip(2), now + Duration::from_millis(100)));
        assert_eq!(gate.admit(ip(2), now + Duration::from_millis(100)), Admission::OverRate);
    }

    #[test]
    fn a_full_pool_makes_room_for_a_quieter_address_by_evicting_the_busiest() {
        let limits = HandshakeLimits { handshakes_max: 4, per_peer_per_second: 1000, burst_per_peer: 1000 };
        let mut gate = HandshakeGate::new(limits);
        let now = Instant::now();
        let flood: Vec<u64> = (0..4).map(|_| started(gate.admit(ip(2), now)).0).collect();
        for (n, id) in flood.iter().enumerate() {
            gate.attach(ip(2), *id, format!("flood-{n}"));
        }
        // The flooding address itself cannot push its own out.
        assert_eq!(gate.admit(ip(2), now), Admission::PoolFull);
        // A newcomer evicts the flood's oldest handshake.
        let (honest, evicted) = started(gate.admit(ip(1), now));
        assert_eq!(evicted.as_deref(), Some("flood-0"));
        assert_eq!(gate.pending(), 4);
        // Finishing (or timing out) frees its place; an evicted one finishing changes nothing.
        gate.finished(ip(2), flood[0]);
        assert_eq!(gate.pending(), 4);
        gate.finished(ip(1), honest);
        assert_eq!(gate.pending(), 3);
    }

    #[test]
    fn two_addresses_holding_one_each_do_not_evict_each_other() {
        let limits = HandshakeLimits { handshakes_max: 2, per_peer_per_second: 1000, burst_per_peer: 1000 };
        let mut gate = HandshakeGate::<()>::new(limits);
        let now = Instant::now();
        started(gate.admit(ip(1), now));
        started(gate.admit(ip(2), now));
        assert_eq!(gate.admit(ip(3), now), Admission::PoolFull);
    }
}
