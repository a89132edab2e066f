//! Byte-range tokens on the client side (GPFS §2): a client may cache bytes of a file only
//! while it holds a read token on them, and change them in its cache (write-behind) only
//! while it holds a write token. [`TokenCache`] keeps the tokens this client holds, asks
//! the metadata service for missing ones, and answers revocations, which a background
//! thread collects by polling (`TokenWait`).
//!
//! An operation takes a [`TokenUse`] on the bytes it touches for its whole length; a
//! revocation waits for the uses on its file to end, stops new ones, lets the
//! [`TokenHolder`] write back and drop what the token covered, gives the bytes back
//! (`TokenRelease`) and only then lets new uses in — so no write is ever split by a
//! revocation (writes are atomic with respect to other clients' token holders), and no
//! grant can slip between the local drop and the service's.
//!
//! A grant's reply and a revocation travel on different requests and may arrive in either
//! order, so a revocation is answered only when no `TokenAcquire` of the file is in flight
//! (each is bounded by the service's wait) and new ones wait for it: every grant made
//! before the release is applied here, and the release and the local drop cover the same
//! tokens on both sides. (Revocations also carry the sequence number of the holder's last
//! grant on the file, which the client logs when it never saw that grant.)

use crate::error::{unexpected, ClientError};
use crate::transport::{MetaLine, WeakMetaLine};
use flotilla_proto::{MetaReply, MetaRequest, TokenGrant, TokenMode, TokenRevoke};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// An inclusive byte range.
pub type ByteRange = (u64, u64);

/// Every byte of a file.
pub const WHOLE_FILE: ByteRange = (0, u64::MAX);

/// What a client caching under tokens does when it must give bytes back.
pub trait TokenHolder: Send + Sync {
    /// Before the tokens on `range` of file `id` go (or become read tokens, `to:
    /// Some(Read)`): write back the changes cached there and make the size they gave the
    /// file known to the metadata service; with `to: None` also drop the cached bytes.
    /// Errors are the holder's to report to its callers (the bytes are given back anyway).
    fn give_back(&self, id: u64, range: ByteRange, to: Option<TokenMode>);

    /// Whether something outside the holder's control (the kernel's page cache of a mount)
    /// may hold bytes of file `id` that reads fill without waiting for tokens: then a
    /// revocation lets such reads through meanwhile (`TokenCache::cover_or_pass`) and calls
    /// [`TokenHolder::invalidate`] until a whole pass saw none of them.
    fn caches_outside(&self, _id: u64) -> bool {
        false
    }

    /// Drops what is cached outside for `range` of file `id`; may wait for reads in flight.
    fn invalidate(&self, _id: u64, _range: ByteRange) {}
}

/// Bounds of the token cache.
#[derive(Clone, Copy, Debug)]
pub struct TokenSettings {
    /// How long one `TokenAcquire` and one poll may wait in the service.
    pub wait_ms: u64,
    /// How long an operation may wait for a token in all before it fails (a holder that
    /// never gives its token back).
    pub acquire_timeout_ms: u64,
}

impl Default for TokenSettings {
    fn default() -> Self {
        TokenSettings { wait_ms: 1000, acquire_timeout_ms: 60_000 }
    }
}

/// A token held: (mode, start, end), the bytes inclusive.
type Token = (TokenMode, u64, u64);

#[derive(Default)]
struct FileTokens {
    /// Tokens held, never overlapping.
    held: Vec<Token>,
    /// The highest grant sequence number applied.
    applied_seq: u64,
    /// `TokenAcquire` requests in flight.
    acquiring: usize,
    /// Operations using the tokens now.
    users: usize,
    /// A revocation or release is in progress: new uses wait.
    revoking: bool,
    /// Revocations waiting for the acquires in flight to end: new uses and acquires wait
    /// too (an acquire started after every one that ended would starve the revocation,
    /// and two clients asking for each other's tokens would wait out their timeouts).
    revocations_waiting: usize,
    /// The outside cache is being invalidated: reads that must not wait (`cover_or_pass`)
    /// pass without a token meanwhile (the invalidation may be waiting for their pages).
    invalidating: bool,
    /// Reads that passed so far.
    passed: u64,
    /// Reads waiting for a revocation to end, with the bytes whose pages they hold locked
    /// (an invalidation leaves those alone: they hold nothing yet).
    waiting_reads: Vec<(u64, ByteRange)>,
}

impl FileTokens {
    /// Whether new uses and acquires wait: a revocation runs or waits to run.
    fn blocked(&self) -> bool {
        self.revoking || self.revocations_waiting > 0
    }

    /// Whether nothing refers to this entry any more (it may be forgotten).
    fn unused(&self) -> bool {
        self.held.is_empty()
            && self.users == 0
            && self.acquiring == 0
            && self.waiting_reads.is_empty()
            && !self.blocked()
    }

    fn covers(&self, mode: TokenMode, (start, end): ByteRange) -> bool {
        let mut next = start;
        let mut pieces: Vec<_> = self.held.iter().filter(|(m, _, e)| *m >= mode && *e >= start).collect();
        pieces.sort_unstable_by_key(|(_, s, _)| *s);
        for (_, piece_start, piece_end) in pieces {
            if *piece_start > next {
                return false;
            }
            if *piece_end >= end {
                return true;
            }
            next = piece_end + 1;
        }
        false
    }

    /// Applies a grant: the granted range now has the granted mode, except that a read
    /// grant leaves write tokens already held as they are.
    fn apply(&mut self, grant: &TokenGrant) {
        let range = (grant.start, grant.end);
        let (mut next, inside) = self.cut(range);
        // Inside the range: the grant's mode, or write where a read grant met a write token.
        let mut writes: Vec<ByteRange> = match grant.mode {
            TokenMode::Write => Vec::new(),
            TokenMode::Read => {
                inside.iter().filter(|(m, _, _)| *m == TokenMode::Write).map(|(_, s, e)| (*s, *e)).collect()
            }
        };
        writes.sort_unstable();
        let mut from = Some(range.0);
        for (start, end) in writes {
            if let Some(f) = from.filter(|f| *f < start) {
                next.push((TokenMode::Read, f, start - 1));
            }
            next.push((TokenMode::Write, start, end));
            from = end.checked_add(1).filter(|n| *n <= range.1);
        }
        if let Some(f) = from {
            next.push((grant.mode, f, range.1));
        }
        self.held = next;
        self.applied_seq = self.applied_seq.max(grant.seq);
    }

    /// Takes the read registered as `waiting` (if any) off the waiting reads.
    fn stop_waiting(&mut self, waiting: &mut Option<u64>) {
        if let Some(wait) = waiting.take() {
            self.waiting_reads.retain(|(w, _)| *w != wait);
        }
    }

    /// Gives back `range` (all of it, or keeping read tokens with `to: Some(Read)`).
    fn release(&mut self, range: ByteRange, to: Option<TokenMode>) {
        let (mut next, inside) = self.cut(range);
        if to == Some(TokenMode::Read) {
            next.extend(inside.into_iter().map(|(_, start, end)| (TokenMode::Read, start, end)));
        }
        self.held = next;
    }

    /// The tokens held with `range` cut out of them, and the parts cut out.
    fn cut(&self, range: ByteRange) -> (Vec<Token>, Vec<Token>) {
        let (mut outside, mut inside) = (Vec::with_capacity(self.held.len() + 2), Vec::new());
        for &(mode, start, end) in &self.held {
            if end < range.0 || start > range.1 {
                outside.push((mode, start, end));
                continue;
            }
            if start < range.0 {
                outside.push((mode, start, range.0 - 1));
            }
            if end > range.1 {
                outside.push((mode, range.1 + 1, end));
            }
            inside.push((mode, start.max(range.0), end.min(range.1)));
        }
        (outside, inside)
    }
}

struct Shared {
    files: HashMap<u64, FileTokens>,
    /// Counts tokens given back; a poll that says "lost" while one was given back is not
    /// believed (the service may have seen the last token go before the poll).
    given_back: u64,
    /// Numbers the reads waiting for revocations.
    next_wait: u64,
    /// Whether the poll thread runs.
    polling: bool,
}

struct Inner {
    /// Weak: a library client's cache is kept by the client itself.
    line: WeakMetaLine,
    holder: Weak<dyn TokenHolder>,
    shared: parking_lot::Mutex<Shared>,
    changed: parking_lot::Condvar,
    settings: TokenSettings,
    stop: AtomicBool,
}

/// The tokens this client holds, shared by every thread of the process.
#[derive(Clone)]
pub struct TokenCache {
    inner: Arc<Inner>,
}

/// An operation's use of tokens on one file: revocations of the file wait until it ends.
pub struct TokenUse {
    inner: Arc<Inner>,
    id: u64,
    /// Whether the token had to be asked for (another client may have changed the bytes or
    /// the size since this client last held it).
    pub fresh: bool,
}

impl Drop for TokenUse {
    fn drop(&mut self) {
        let mut shared = self.inner.shared.lock();
        if let Some(file) = shared.files.get_mut(&self.id) {
            file.users -= 1;
        }
        drop(shared);
        self.inner.changed.notify_all();
    }
}

impl TokenCache {
    /// A token cache asking the metadata service over `line` (`Client::token_cache` and
    /// `TokenCache::new` make one for a client); `holder` writes back and drops cached bytes
    /// on demand. The cache does not keep the client: it works while the caller keeps it.
    pub(crate) fn over(
        line: WeakMetaLine,
        holder: Weak<dyn TokenHolder>,
        settings: TokenSettings,
    ) -> TokenCache {
        let shared = Shared { files: HashMap::new(), given_back: 0, next_wait: 0, polling: false };
        let inner = Inner {
            line,
            holder,
            shared: parking_lot::Mutex::new(shared),
            changed: parking_lot::Condvar::new(),
            settings,
            stop: AtomicBool::new(false),
        };
        TokenCache { inner: Arc::new(inner) }
    }

    /// Stops the poll thread (at unmount); tokens still held go with the session.
    pub fn stop(&self) {
        self.inner.stop.store(true, Ordering::SeqCst);
    }

    /// Waits until this client holds `mode` (or better) on `range` of file `id`, asking the
    /// service when it does not, and returns a use that keeps revocations out until dropped.
    pub fn cover(&self, id: u64, mode: TokenMode, range: ByteRange) -> Result<TokenUse, ClientError> {
        let used = self.cover_with(id, mode, range, None)?;
        Ok(used.expect("a use: only reads that may pass go without one"))
    }

    /// `cover` without waiting: a use when this client holds `mode` on `range` of file `id`
    /// and no revocation of the file is under way, else `None` (ask with `cover`).
    pub fn try_cover(&self, id: u64, mode: TokenMode, range: ByteRange) -> Option<TokenUse> {
        let mut shared = self.inner.shared.lock();
        let file = shared.files.get_mut(&id).filter(|file| !file.blocked() && file.covers(mode, range))?;
        file.users += 1;
        Some(TokenUse { inner: self.inner.clone(), id, fresh: false })
    }

    /// `cover` of a read token for a read the kernel holds the pages of `pages` locked for
    /// (a mount's page-cache read), which an invalidation of the page cache would wait for.
    /// During a revocation of the file such a read waits, its pages set aside from the
    /// invalidations, except while an invalidation runs: then it passes at once without a
    /// token (`Ok(None)`) and reads what is on the servers — which nobody else may change
    /// before the bytes are given back — and the revocation invalidates again, until one
    /// whole invalidation saw no read pass.
    pub fn cover_or_pass(
        &self,
        id: u64,
        range: ByteRange,
        pages: ByteRange,
    ) -> Result<Option<TokenUse>, ClientError> {
        self.cover_with(id, TokenMode::Read, range, Some(pages))
    }

    fn cover_with(
        &self,
        id: u64,
        mode: TokenMode,
        range: ByteRange,
        pages: Option<ByteRange>,
    ) -> Result<Option<TokenUse>, ClientError> {
        assert!(range.0 <= range.1, "an empty token range");
        let deadline = Instant::now() + Duration::from_millis(self.inner.settings.acquire_timeout_ms);
        let mut fresh = false;
        let mut waiting: Option<u64> = None;
        let mut shared = self.inner.shared.lock();
        loop {
            let next_wait = shared.next_wait;
            let file = shared.files.entry(id).or_default();
            if !file.blocked() {
                file.stop_waiting(&mut waiting);
            }
            if !file.blocked() && file.covers(mode, range) {
                file.users += 1;
                return Ok(Some(TokenUse { inner: self.inner.clone(), id, fresh }));
            }
            if let (Some(pages), true) = (pages, file.blocked()) {
                if file.invalidating {
                    file.passed += 1;
                    file.stop_waiting(&mut waiting);
                    return Ok(None);
                }
                if waiting.is_none() {
                    file.waiting_reads.push((next_wait, pages));
                    waiting = Some(next_wait);
                    shared.next_wait += 1;
                }
            }
            let file = shared.files.entry(id).or_default();
            if Instant::now() >= deadline {
                file.stop_waiting(&mut waiting);
                return Err(ClientError::Token(format!(
                    "no {mode:?} token on bytes {}..={} of file {id:016x} within {} ms",
                    range.0, range.1, self.inner.settings.acquire_timeout_ms
                )));
            }
            if file.blocked() {
                self.inner.changed.wait_until(&mut shared, deadline);
                continue;
            }
            if !shared.polling {
                shared.polling = true;
                self.start_polling();
            }
            shared.files.entry(id).or_default().acquiring += 1;
            drop(shared);
            fresh = true;
            let granted = self.acquire(id, mode, range);
            shared = self.inner.shared.lock();
            // The grant is applied in the same critical section that ends the acquire: a
            // revocation waits for both (see `Inner::give_back`).
            let file = shared.files.entry(id).or_default();
            file.acquiring -= 1;
            if let Ok(Some(grant)) = &granted {
                file.apply(grant);
            }
            self.inner.changed.notify_all();
            if let Err(error) = granted {
                file.stop_waiting(&mut waiting);
                return Err(error);
            }
        }
    }

    /// One `TokenAcquire`: `Some(grant)`, or `None` when a holder is still in the way.
    fn acquire(
        &self,
        id: u64,
        mode: TokenMode,
        required: ByteRange,
    ) -> Result<Option<TokenGrant>, ClientError> {
        let line = self.inner.line()?;
        let session = line.session();
        let desired = WHOLE_FILE;
        let wait_ms = self.inner.settings.wait_ms;
        let request = MetaRequest::TokenAcquire { session, id, mode, required, desired, wait_ms };
        match line.call(request)? {
            MetaReply::TokenGranted(grant) => Ok(Some(grant)),
            MetaReply::TokenBusy { holder } => {
                tracing::debug!(file = id, holder, "token still held elsewhere; asking again");
                Ok(None)
            }
            other => Err(unexpected("acquire a token", &other)),
        }
    }

    /// Gives back every token on file `id` (its last close here: the holder has written
    /// back and published already).
    pub fn release_file(&self, id: u64) -> Result<(), ClientError> {
        let mut shared = self.inner.shared.lock();
        let Some(file) = shared.files.get_mut(&id) else { return Ok(()) };
        if file.unused() {
            shared.files.remove(&id);
            return Ok(());
        }
        drop(shared);
        self.inner.give_back(id, WHOLE_FILE, None, 0, false)
    }

    fn start_polling(&self) {
        let inner = Arc::downgrade(&self.inner);
        let spawned = std::thread::Builder::new().name("flotilla-tokens".into()).spawn(move || poll(inner));
        if let Err(error) = spawned {
            tracing::error!(%error, "cannot start the token poll thread; revocations will time out");
        }
    }
}

impl Inner {
    /// The line to the metadata service, unless the client is gone.
    fn line(&self) -> Result<MetaLine, ClientError> {
        self.line.upgrade().ok_or(ClientError::Abandoned)
    }

    /// Answers a revocation (or a release, or a loss): waits for the grants it follows
    /// and for the uses of the file to end, lets the holder write back, gives the bytes
    /// back to the service (unless they were lost) and only then lets new uses in.
    fn give_back(
        &self,
        id: u64,
        range: ByteRange,
        to: Option<TokenMode>,
        seq: u64,
        lost: bool,
    ) -> Result<(), ClientError> {
        let mut shared = self.shared.lock();
        let mut registered = false;
        loop {
            let file = shared.files.entry(id).or_default();
            // Every acquire of the file ended (each is bounded by the service's wait): every
            // grant the service made before this revocation is applied, and none made after
            // it can be lost by the release below covering it on one side only.
            if !file.revoking && file.acquiring == 0 {
                file.revocations_waiting -= usize::from(registered);
                file.revoking = true;
                if file.applied_seq < seq {
                    tracing::debug!(
                        file = id,
                        seq,
                        applied = file.applied_seq,
                        "revocation of a grant never applied"
                    );
                }
                break;
            }
            if !registered {
                file.revocations_waiting += 1;
                registered = true;
            }
            self.changed.wait(&mut shared);
        }
        while shared.files.get(&id).is_some_and(|f| f.users > 0) {
            self.changed.wait(&mut shared);
        }
        drop(shared);
        if let Some(holder) = self.holder.upgrade() {
            holder.give_back(id, range, to);
            if to.is_none() && holder.caches_outside(id) {
                self.invalidate_until_quiet(holder.as_ref(), id, range);
            }
        }
        let released = match lost {
            true => Ok(()),
            false => self.release(id, range, to),
        };
        let mut shared = self.shared.lock();
        shared.given_back += 1;
        if let Some(file) = shared.files.get_mut(&id) {
            file.release(range, to);
            file.revoking = false;
            if file.unused() {
                shared.files.remove(&id);
            }
        }
        drop(shared);
        self.changed.notify_all();
        released
    }

    /// Invalidates the holder's outside cache of `range` until one whole invalidation saw
    /// no read pass (a read that passed may have filled it with bytes about to be given
    /// back). The pages of reads waiting meanwhile are left out: they hold nothing yet, and
    /// the invalidation would wait for them while they wait for it.
    fn invalidate_until_quiet(&self, holder: &dyn TokenHolder, id: u64, range: ByteRange) {
        loop {
            let (passed, holes) = {
                let mut shared = self.shared.lock();
                let Some(file) = shared.files.get_mut(&id) else { return };
                file.invalidating = true;
                let holes: Vec<ByteRange> = file.waiting_reads.iter().map(|(_, pages)| *pages).collect();
                (file.passed, holes)
            };
            for piece in subtract(range, holes) {
                holder.invalidate(id, piece);
            }
            let mut shared = self.shared.lock();
            let Some(file) = shared.files.get_mut(&id) else { return };
            file.invalidating = false;
            if file.passed == passed {
                return;
            }
        }
    }

    fn release(&self, id: u64, range: ByteRange, to: Option<TokenMode>) -> Result<(), ClientError> {
        let line = self.line()?;
        let session = line.session();
        match line.call(MetaRequest::TokenRelease { session, id, range, to })? {
            MetaReply::Done => Ok(()),
            other => Err(unexpected("release a token", &other)),
        }
    }

    /// Whether this client holds tokens, and how many it gave back so far.
    fn holding(&self) -> (bool, u64) {
        let shared = self.shared.lock();
        (shared.files.values().any(|file| !file.held.is_empty()), shared.given_back)
    }

    /// Every token is gone (the service restarted or the session's lease ran out). After a
    /// restart (the metadata connection was replaced lately) that is ordinary recovery and
    /// logged as such; otherwise the lease ran out while connected, which is worth a warning.
    fn lose_all(&self, after_restart: bool) {
        let ids: Vec<u64> = self.shared.lock().files.keys().copied().collect();
        if after_restart {
            tracing::info!(
                files = ids.len(),
                "the metadata service restarted without this client's tokens; dropping them"
            );
        } else {
            tracing::warn!(
                files = ids.len(),
                "the metadata service holds none of this client's tokens (lease expired?); dropping them"
            );
        }
        for id in ids {
            let _ = self.give_back(id, WHOLE_FILE, None, 0, true);
        }
    }
}

/// How long after the metadata connection was replaced a loss of every token is taken as the
/// service's restart (its `token_recovery_ms` and a client's re-acquiring fit well within).
const LOSS_AFTER_RECONNECT: Duration = Duration::from_secs(30);

/// The poll thread: collects revocations and answers them, until the cache is dropped or
/// stopped.
fn poll(inner: Weak<Inner>) {
    loop {
        let Some(inner) = inner.upgrade() else { return };
        let Some(line) = inner.line.upgrade().filter(|_| !inner.stop.load(Ordering::SeqCst)) else {
            return;
        };
        let session = line.session();
        let (holding, given_back) = inner.holding();
        let request = MetaRequest::TokenWait { session, holding, wait_ms: inner.settings.wait_ms };
        let polled = line.call(request);
        let after_restart = line.reconnected_within(LOSS_AFTER_RECONNECT);
        // Kept only for the poll: its last user may drop it while revocations are answered.
        drop(line);
        match polled {
            Ok(MetaReply::TokenEvents { revokes, lost }) => {
                if lost && inner.holding().1 == given_back {
                    inner.lose_all(after_restart);
                }
                answer(&inner, revokes);
            }
            Ok(other) => {
                tracing::warn!(reply = ?other, "unexpected reply to a token poll");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(error) => {
                tracing::debug!(%error, "token poll failed; polling again");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// `range` without the `holes` (inclusive ranges), in order.
fn subtract(range: ByteRange, mut holes: Vec<ByteRange>) -> Vec<ByteRange> {
    holes.sort_unstable();
    let mut pieces = Vec::new();
    let mut from = Some(range.0);
    for (start, end) in holes {
        let Some(next) = from else { break };
        if end < next || start > range.1 {
            continue;
        }
        if start > next {
            pieces.push((next, start - 1));
        }
        from = end.checked_add(1).filter(|after| *after <= range.1);
    }
    if let Some(next) = from {
        pieces.push((next, range.1));
    }
    pieces
}

fn answer(inner: &Inner, revokes: Vec<TokenRevoke>) {
    for revoke in revokes {
        let range = (revoke.start, revoke.end);
        if let Err(error) = inner.give_back(revoke.id, range, revoke.to, revoke.seq, false) {
            tracing::warn!(%error, file = revoke.id, "giving a token back failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TokenMode::{Read, Write};

    fn grant(mode: TokenMode, start: u64, end: u64, seq: u64) -> TokenGrant {
        TokenGrant { mode, start, end, seq }
    }

    proptest::proptest! {
        /// Grants and releases agree with a byte-by-byte model: a write grant makes its
        /// bytes write, a read grant makes its bytes read where they were not write, a
        /// release drops its bytes or makes them read; `covers` answers from the model.
        #[test]
        fn tokens_follow_a_byte_model(ops in proptest::collection::vec((0u8..4, 0u64..48, 0u64..16), 1..60)) {
            let mut file = FileTokens::default();
            let mut model: [Option<TokenMode>; 64] = [None; 64];
            for (seq, (op, start, length)) in ops.into_iter().enumerate() {
                let range = (start, start + length);
                let bytes = start as usize..=(start + length) as usize;
                match op {
                    0 => {
                        file.apply(&grant(Write, range.0, range.1, seq as u64));
                        model[bytes].iter_mut().for_each(|b| *b = Some(Write));
                    }
                    1 => {
                        file.apply(&grant(Read, range.0, range.1, seq as u64));
                        model[bytes].iter_mut().for_each(|b| *b = Some(b.unwrap_or(Read)));
                    }
                    2 => {
                        file.release(range, None);
                        model[bytes].iter_mut().for_each(|b| *b = None);
                    }
                    _ => {
                        file.release(range, Some(Read));
                        model[bytes].iter_mut().for_each(|b| *b = b.map(|_| Read));
                    }
                }
                let mut pieces = file.held.clone();
                pieces.sort_unstable_by_key(|(_, s, _)| *s);
                for pair in pieces.windows(2) {
                    proptest::prop_assert!(pair[0].2 < pair[1].1, "held tokens overlap: {:?}", pieces);
                }
                for byte in 0..64u64 {
                    let want = model[byte as usize];
                    proptest::prop_assert_eq!(file.covers(Read, (byte, byte)), want.is_some());
                    proptest::prop_assert_eq!(file.covers(Write, (byte, byte)), want == Some(Write));
                }
            }
        }
    }

    #[test]
    fn holes_are_cut_out_of_a_range() {
        assert_eq!(subtract((0, 99), vec![]), vec![(0, 99)]);
        assert_eq!(subtract((0, 99), vec![(10, 19), (50, 59)]), vec![(0, 9), (20, 49), (60, 99)]);
        assert_eq!(subtract((10, 99), vec![(0, 14), (90, 200)]), vec![(15, 89)]);
        assert_eq!(subtract((0, u64::MAX), vec![(0, u64::MAX)]), vec![]);
        assert_eq!(subtract((0, u64::MAX), vec![(4096, 8191)]), vec![(0, 4095), (8192, u64::MAX)]);
    }

    #[test]
    fn grants_cover_and_releases_uncover() {
        let mut file = FileTokens::default();
        assert!(!file.covers(Read, (0, 0)));
        file.apply(&grant(Write, 100, 199, 1));
        file.apply(&grant(Read, 0, 999, 2));
        assert!(file.covers(Read, (0, 999)));
        assert!(file.covers(Write, (100, 199)) && !file.covers(Write, (100, 200)));
        assert_eq!(file.applied_seq, 2);
        file.release((150, 160), Some(Read));
        assert!(file.covers(Read, (0, 999)) && !file.covers(Write, (140, 155)));
        assert!(file.covers(Write, (161, 199)));
        file.release((500, u64::MAX), None);
        assert!(file.covers(Read, (0, 499)) && !file.covers(Read, (499, 500)));
        file.apply(&grant(Write, 0, u64::MAX, 3));
        assert!(file.covers(Write, WHOLE_FILE));
        file.release(WHOLE_FILE, None);
        assert!(file.held.is_empty());
    }
}
