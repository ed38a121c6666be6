//! `Coalesced`: a client-connection stream wrapper that tells HTTP/2 it has no vectored writes,
//! so small answers of many streams share one `write` instead of one `writev` (or two) each.
//!
//! Why: h2's frame writer keeps a DATA payload larger than 256 bytes as a separate buffer
//! ("chained") when the transport has vectored I/O, and must flush before it can queue the next
//! frame; a typical etcd answer (a key and a value of a few hundred bytes) then costs one
//! syscall for its headers and data and another for its trailers and the next answer. Without
//! vectored I/O h2 copies payloads up to 1 KiB into its write buffer, so every answer that is
//! ready when the connection task runs leaves in one `write`. On loopback a write is the most
//! expensive thing a read does (the kernel runs the receiver's TCP path in the sender's call).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// Wraps an accepted stream; reads and writes pass through, only `is_write_vectored` differs.
pub struct Coalesced<S>(pub S);

impl<S: AsyncRead + Unpin> AsyncRead for Coalesced<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Coalesced<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        false
    }
}

impl<S: Connected> Connected for Coalesced<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.0.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_pass_through_both_ways_and_writes_are_not_vectored() {
        let (a, b) = tokio::io::duplex(1024);
        let mut a = Coalesced(a);
        let mut b = Coalesced(b);
        assert!(!a.is_write_vectored());
        a.write_all(b"ping").await.unwrap();
        b.write_all(b"pong").await.unwrap();
        b.flush().await.unwrap();
        let mut got = [0u8; 4];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        a.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"pong");
    }
}
