//! The snapshot data openraft moves: an in-memory buffer that refuses to grow past
//! `snapshot_bytes_max` while chunks stream in, so a follower never holds more than the bound.

use std::io::{Cursor, SeekFrom};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

/// A bounded, seekable snapshot buffer.
#[derive(Debug, Default)]
pub struct SnapshotBuffer {
    cursor: Cursor<Vec<u8>>,
    bytes_max: usize,
}

impl SnapshotBuffer {
    /// An empty buffer for at most `bytes_max` bytes.
    pub fn new(bytes_max: usize) -> Self {
        SnapshotBuffer { cursor: Cursor::new(Vec::new()), bytes_max }
    }

    /// A buffer holding `bytes` (already bounded by whoever built them).
    pub fn from_bytes(bytes: Vec<u8>, bytes_max: usize) -> Self {
        SnapshotBuffer { cursor: Cursor::new(bytes), bytes_max }
    }

    /// The bytes written.
    pub fn into_bytes(self) -> Vec<u8> {
        self.cursor.into_inner()
    }
}

impl AsyncRead for SnapshotBuffer {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.cursor).poll_read(cx, buf)
    }
}

impl AsyncWrite for SnapshotBuffer {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let end = self.cursor.position() as usize + buf.len();
        if end > self.bytes_max {
            let message =
                format!("snapshot would reach {end} bytes, over snapshot_bytes_max {}", self.bytes_max);
            return Poll::Ready(Err(std::io::Error::other(message)));
        }
        Pin::new(&mut self.cursor).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.cursor).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.cursor).poll_shutdown(cx)
    }
}

impl AsyncSeek for SnapshotBuffer {
    fn start_seek(mut self: Pin<&mut Self>, position: SeekFrom) -> std::io::Result<()> {
        Pin::new(&mut self.cursor).start_seek(position)
    }

    fn poll_complete(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<u64>> {
        Pin::new(&mut self.cursor).poll_complete(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncSeekExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_chunk_past_the_bound_is_refused() {
        let mut buffer = SnapshotBuffer::new(10);
        buffer.write_all(b"12345678").await.unwrap();
        assert!(buffer.write_all(b"abc").await.is_err());
        // A chunk resent at an earlier offset (openraft seeks) still fits.
        buffer.seek(SeekFrom::Start(4)).await.unwrap();
        buffer.write_all(b"abcdef").await.unwrap();
        assert_eq!(buffer.into_bytes(), b"1234abcdef");
    }
}
