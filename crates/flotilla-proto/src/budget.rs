//! Memory budgets and progress rules for what a receiver holds on behalf of a peer.
//!
//! A service's memory for frames and replies is one budget in KiB units ([`FrameBudget`]).
//! A frame's share of it ([`Reservation`]) grows only as the frame's bytes arrive, so a peer
//! that claims a large frame and stops holds what it sent, not what it claimed. A frame that
//! has waited `overdraft_wait` for more of the budget may take the budget's one overdraft
//! lane: it then grows outside the budget (by at most one budget) until its reservation is
//! dropped. Growing frames can therefore never wait on each other for ever (each holds part
//! of the budget and waits for the rest), and memory stays within two budgets.
//!
//! A [`ProgressRule`] says how slowly a peer may send a frame or take a reply: at least
//! `bytes_min` bytes (or the rest) in every `interval`, else the connection ends and what it
//! held is released.

use crate::frame_error::FrameError;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::AsyncWrite;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Default of `overdraft_wait`: how long a growing frame waits for the budget before it may
/// take the overdraft lane.
pub const OVERDRAFT_WAIT_DEFAULT: Duration = Duration::from_millis(200);

/// A memory budget in KiB units shared by every connection of a service, and optionally
/// a pool the payloads of large unencrypted frames are read into (`buffers.rs`: reused
/// memory instead of a fresh mapping per frame; the buffer goes back when the frame's last
/// `Bytes` drops).
#[derive(Clone, Debug)]
pub struct FrameBudget {
    pub kib: Arc<Semaphore>,
    pub kib_max: u32,
    pub pool: Option<Arc<crate::buffers::BufferPool>>,
    /// The overdraft lane: one token.
    pub overdraft: Arc<Semaphore>,
    /// How long a frame waits for the budget before it may take the overdraft lane.
    pub overdraft_wait: Duration,
}

impl FrameBudget {
    /// A budget of `bytes_max` bytes (at least 1 KiB), without a pool.
    pub fn new(bytes_max: u64) -> FrameBudget {
        let kib_max = u32::try_from((bytes_max / 1024).max(1)).unwrap_or(u32::MAX >> 4);
        FrameBudget::over(Arc::new(Semaphore::new(kib_max as usize)), kib_max)
    }

    /// A budget over an existing semaphore of `kib_max` KiB units, without a pool.
    pub fn over(kib: Arc<Semaphore>, kib_max: u32) -> FrameBudget {
        FrameBudget {
            kib,
            kib_max,
            pool: None,
            overdraft: Arc::new(Semaphore::new(1)),
            overdraft_wait: OVERDRAFT_WAIT_DEFAULT,
        }
    }

    /// KiB units `bytes` hold (at least one, at most the whole budget).
    pub fn units(&self, bytes: u64) -> u32 {
        u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX).min(self.kib_max)
    }

    /// Waits for `units` of the budget.
    pub async fn take(&self, units: u32) -> Result<OwnedSemaphorePermit, FrameError> {
        self.kib.clone().acquire_many_owned(units).await.map_err(|_| FrameError::BudgetClosed)
    }

    /// A reservation of nothing yet.
    pub fn empty(&self) -> Result<Reservation, FrameError> {
        let permit = self.kib.clone().try_acquire_many_owned(0).map_err(|_| FrameError::BudgetClosed)?;
        Ok(Reservation { permit, overdraft_units: 0, token: None, held: Vec::new() })
    }

    /// Grows `held` to `units` (at most the whole budget): from the budget, or, after
    /// `overdraft_wait`, from the overdraft lane once it is free. Returns how long it waited.
    pub async fn grow(&self, held: &mut Reservation, units: u32) -> Result<Duration, FrameError> {
        let extra = units.min(self.kib_max).saturating_sub(held.units());
        if extra == 0 {
            return Ok(Duration::ZERO);
        }
        if held.token.is_some() {
            held.overdraft_units += extra;
            return Ok(Duration::ZERO);
        }
        if let Ok(more) = self.kib.clone().try_acquire_many_owned(extra) {
            held.permit.merge(more);
            return Ok(Duration::ZERO);
        }
        let started = Instant::now();
        let closed = |_| FrameError::BudgetClosed;
        let first =
            tokio::time::timeout(self.overdraft_wait, self.kib.clone().acquire_many_owned(extra)).await;
        if let Ok(more) = first {
            held.permit.merge(more.map_err(closed)?);
            return Ok(started.elapsed());
        }
        tokio::select! {
            more = self.kib.clone().acquire_many_owned(extra) => held.permit.merge(more.map_err(closed)?),
            token = self.overdraft.clone().acquire_owned() => {
                held.token = Some(token.map_err(closed)?);
                held.overdraft_units += extra;
            }
        }
        Ok(started.elapsed())
    }
}

/// A frame's or request's share of a [`FrameBudget`], given back when dropped; with the
/// overdraft lane's token if it took it, and whatever else the request holds until its
/// reply is written ([`Reservation::hold`]).
#[derive(Debug)]
pub struct Reservation {
    permit: OwnedSemaphorePermit,
    overdraft_units: u32,
    token: Option<OwnedSemaphorePermit>,
    held: Vec<OwnedSemaphorePermit>,
}

impl Reservation {
    /// KiB units held, from the budget and the overdraft lane.
    pub fn units(&self) -> u32 {
        self.permit.num_permits() as u32 + self.overdraft_units
    }

    /// [`Reservation::units`] as a count.
    pub fn num_permits(&self) -> usize {
        self.units() as usize
    }

    /// Whether this reservation grew in the overdraft lane.
    pub fn overdrawn(&self) -> bool {
        self.token.is_some()
    }

    /// Adds more of the same budget.
    pub fn merge(&mut self, more: OwnedSemaphorePermit) {
        self.permit.merge(more);
    }

    /// Keeps another permit (of any semaphore) until this reservation is dropped.
    pub fn hold(&mut self, permit: OwnedSemaphorePermit) {
        self.held.push(permit);
    }
}

/// How slowly a peer may send a frame or take a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgressRule {
    /// The window: `progress_interval_ms`.
    pub interval: Duration,
    /// Bytes that must move in each window (or the rest, if fewer): `progress_bytes_min`.
    pub bytes_min: u64,
}

impl Default for ProgressRule {
    fn default() -> Self {
        ProgressRule { interval: Duration::from_millis(500), bytes_min: 64 << 10 }
    }
}

/// The current window of a [`ProgressRule`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Window {
    rule: ProgressRule,
    end: Instant,
    bytes: u64,
}

impl Window {
    pub(crate) fn start(rule: ProgressRule) -> Window {
        Window { rule, end: Instant::now() + rule.interval, bytes: 0 }
    }

    /// Counts `bytes` that moved; a window that reached its minimum starts the next.
    pub(crate) fn record(&mut self, bytes: u64) {
        self.bytes += bytes;
        if self.bytes >= self.rule.bytes_min {
            *self = Window::start(self.rule);
        }
    }

    pub(crate) fn rule(&self) -> ProgressRule {
        self.rule
    }

    pub(crate) fn end(&self) -> Instant {
        self.end
    }

    pub(crate) fn stalled(&self) -> FrameError {
        FrameError::Stalled { ms: self.rule.interval.as_millis() as u64, bytes_min: self.rule.bytes_min }
    }
}

/// Runs `work` (writing through a [`Counted`] writer that adds to `moved`) while it moves at
/// least `rule.bytes_min` bytes in every `rule.interval`; a slower one is abandoned with
/// [`FrameError::Stalled`].
pub async fn with_progress<F: Future>(
    rule: ProgressRule,
    moved: &AtomicU64,
    work: F,
) -> Result<F::Output, FrameError> {
    let mut work = std::pin::pin!(work);
    let mut window = Window::start(rule);
    let mut seen = moved.load(Ordering::Relaxed);
    loop {
        match tokio::time::timeout_at(window.end(), &mut work).await {
            Ok(output) => return Ok(output),
            Err(_) => {
                let now = moved.load(Ordering::Relaxed);
                if now.saturating_sub(seen) < rule.bytes_min {
                    return Err(window.stalled());
                }
                seen = now;
                window = Window::start(rule);
            }
        }
    }
}

/// A writer that counts the bytes it hands on, for [`with_progress`].
#[derive(Debug)]
pub struct Counted<W> {
    inner: W,
    moved: Arc<AtomicU64>,
}

impl<W> Counted<W> {
    pub fn new(inner: W) -> Counted<W> {
        Counted { inner, moved: Arc::new(AtomicU64::new(0)) }
    }

    /// Bytes handed on so far.
    pub fn moved(&self) -> Arc<AtomicU64> {
        self.moved.clone()
    }

    pub fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Counted<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(written)) = &polled {
            self.moved.fetch_add(*written as u64, Ordering::Relaxed);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(written)) = &polled {
            self.moved.fetch_add(*written as u64, Ordering::Relaxed);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn growing_frames_that_wait_on_each_other_are_freed_by_the_overdraft_lane() {
        let budget = FrameBudget::new(1 << 20);
        let (mut first, mut second) = (budget.empty().unwrap(), budget.empty().unwrap());
        budget.grow(&mut first, 600).await.unwrap();
        budget.grow(&mut second, 424).await.unwrap();
        assert_eq!(budget.kib.available_permits(), 0);
        // Each wants the whole budget: without the lane they would wait for ever.
        let waited = budget.grow(&mut first, 1024).await.unwrap();
        assert!(waited >= OVERDRAFT_WAIT_DEFAULT, "took the lane after {waited:?}");
        assert!(first.overdrawn() && first.units() == 1024, "{first:?}");
        // The lane is taken: the second waits until the first is dropped.
        let grown = tokio::time::timeout(Duration::from_secs(5), budget.grow(&mut second, 1024)).await;
        assert!(grown.is_err(), "two frames in the overdraft lane at once");
        drop(first);
        budget.grow(&mut second, 1024).await.unwrap();
        assert_eq!(second.units(), 1024);
        assert!(!second.overdrawn(), "the budget freed first");
    }

    #[tokio::test(start_paused = true)]
    async fn a_writer_that_stops_moving_bytes_is_abandoned() {
        let rule = ProgressRule { interval: Duration::from_millis(100), bytes_min: 10 };
        let moved = AtomicU64::new(0);
        let slow = async {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                moved.fetch_add(8, Ordering::Relaxed);
            }
        };
        assert!(with_progress(rule, &moved, slow).await.is_ok(), "16 bytes per window is enough");
        let stopped = std::future::pending::<()>();
        let outcome = with_progress(rule, &moved, stopped).await;
        assert!(matches!(outcome, Err(FrameError::Stalled { ms: 100, bytes_min: 10 })), "{outcome:?}");
    }
}
