//! Handles of non-blocking calls.

use crate::error::ClientError;
use tokio::sync::oneshot;

/// A call in flight. `test` says whether it finished without waiting; `wait` blocks until
/// it does and returns its result. Dropping a handle does not cancel the call.
pub struct Handle<T> {
    receiver: Option<oneshot::Receiver<Result<T, ClientError>>>,
    outcome: Option<Result<T, ClientError>>,
}

impl<T> Handle<T> {
    pub(crate) fn new(receiver: oneshot::Receiver<Result<T, ClientError>>) -> Handle<T> {
        Handle { receiver: Some(receiver), outcome: None }
    }

    /// Whether the call has finished (successfully or not).
    pub fn test(&mut self) -> bool {
        if self.outcome.is_some() {
            return true;
        }
        let Some(receiver) = self.receiver.as_mut() else { return true };
        match receiver.try_recv() {
            Ok(outcome) => self.finish(outcome),
            Err(oneshot::error::TryRecvError::Empty) => false,
            Err(oneshot::error::TryRecvError::Closed) => self.finish(Err(ClientError::Abandoned)),
        }
    }

    /// Blocks until the call finishes and returns its result. Must not be called from
    /// inside an async runtime.
    pub fn wait(mut self) -> Result<T, ClientError> {
        if let Some(outcome) = self.outcome.take() {
            return outcome;
        }
        match self.receiver.take() {
            Some(receiver) => receiver.blocking_recv().unwrap_or(Err(ClientError::Abandoned)),
            None => Err(ClientError::Abandoned),
        }
    }

    /// Waits asynchronously (for callers that live in an async runtime).
    pub async fn wait_async(mut self) -> Result<T, ClientError> {
        if let Some(outcome) = self.outcome.take() {
            return outcome;
        }
        match self.receiver.take() {
            Some(receiver) => receiver.await.unwrap_or(Err(ClientError::Abandoned)),
            None => Err(ClientError::Abandoned),
        }
    }

    fn finish(&mut self, outcome: Result<T, ClientError>) -> bool {
        self.receiver = None;
        self.outcome = Some(outcome);
        true
    }
}
