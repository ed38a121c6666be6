//! Open connections closed when a revocation list loaded after their handshake revokes the
//! certificate their peer presented.
//!
//! rustls checks a revocation list at the handshake only, so a certificate revoked later keeps
//! every connection it already holds: for a leaked tenant certificate (the frontend's client
//! port) or a journal peer's taken with its host (internal TLS), that can be days. Each open
//! connection that presented a certificate is registered here ([`OpenConnections::track`]) with
//! the chain it presented; when its owner loads new files it asks the new verifier about every
//! open one ([`OpenConnections::close_revoked`]) and closes those found revoked: their
//! [`Revocable`] stream fails its next read and write, and the task waiting to read is woken,
//! so the connection ends at once and its peer must handshake again (and is refused).
//!
//! Only a verdict of revoked closes a connection: a certificate that has expired since, or
//! whose CA a rotation no longer trusts, keeps its connection (as etcd does) until it closes;
//! a rotation then never cuts off everyone at once.
//!
//! Shared by the frontend's client and admin ports and by internal TLS in both roles (the
//! journal node checking the clients that dialled it, every dialler the nodes it reached).

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

use crate::log_store::lock;

/// The certificate chain an open connection's peer presented, and how to tell it is closed.
pub struct Peer {
    cert: CertificateDer<'static>,
    intermediates: Vec<CertificateDer<'static>>,
    /// The name a dialled server was checked for; `None` for a client's certificate.
    server_name: Option<ServerName<'static>>,
    revocation: Arc<Revocation>,
}

impl Peer {
    /// A client's chain, as a server saw it (its certificate first); `None` if it presented
    /// none.
    pub fn client(chain: &[CertificateDer<'_>]) -> Option<Peer> {
        Self::new(chain, None)
    }

    /// A server's chain, as the dialler that checked it for `name` saw it.
    pub fn server(chain: &[CertificateDer<'_>], name: ServerName<'static>) -> Option<Peer> {
        Self::new(chain, Some(name))
    }

    fn new(chain: &[CertificateDer<'_>], server_name: Option<ServerName<'static>>) -> Option<Peer> {
        let (cert, intermediates) = chain.split_first()?;
        Some(Peer {
            cert: cert.clone().into_owned(),
            intermediates: intermediates
                .iter()
                .map(|c| c.clone().into_owned())
                .collect(),
            server_name,
            revocation: Arc::default(),
        })
    }

    /// Whether the verifiers (of its role: `clients` for a client's certificate, `servers`
    /// for a server's) find its certificate revoked. A role without a verifier revokes nothing.
    pub fn revoked_by(
        &self,
        clients: Option<&dyn ClientCertVerifier>,
        servers: Option<&dyn ServerCertVerifier>,
    ) -> bool {
        let now = UnixTime::now();
        let verdict = match &self.server_name {
            None => clients.map(|v| {
                v.verify_client_cert(&self.cert, &self.intermediates, now)
                    .map(drop)
            }),
            Some(name) => servers.map(|v| {
                v.verify_server_cert(&self.cert, &self.intermediates, name, &[], now)
                    .map(drop)
            }),
        };
        matches!(
            verdict,
            Some(Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Revoked
            )))
        )
    }
}

/// Set once a connection's certificate is revoked; wakes the connection's task (a served
/// connection always waits to read), so that it sees it.
#[derive(Default)]
struct Revocation {
    revoked: AtomicBool,
    waker: AtomicWaker,
}

impl Revocation {
    fn close(&self) {
        self.revoked.store(true, Ordering::Release);
        self.waker.wake();
    }

    fn closed(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }
}

/// The open connections that presented a certificate, by a number of their own.
#[derive(Default)]
pub struct OpenConnections {
    open: Mutex<HashMap<u64, Peer>>,
    next: AtomicU64,
}

impl OpenConnections {
    /// Watches the connection of `peer` until the answer is dropped. Registered first, then
    /// `revoked_since` is asked about it: whether files loaded after its handshake, which the
    /// reload that loaded them may have checked before this registration, revoke it (then it
    /// is closed at once). A reload after the registration checks it itself.
    pub fn track(
        self: &Arc<Self>,
        peer: Peer,
        revoked_since: impl FnOnce(&Peer) -> bool,
    ) -> Tracked {
        let revocation = Arc::clone(&peer.revocation);
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut open = lock(&self.open);
        if revoked_since(open.entry(id).or_insert(peer)) {
            revocation.close();
        }
        drop(open);
        Tracked {
            open: Arc::clone(self),
            id,
            revocation,
        }
    }

    /// Closes the open connections `revoked` finds revoked; answers how many it closed.
    pub fn close_revoked(&self, revoked: impl Fn(&Peer) -> bool) -> usize {
        let open = lock(&self.open);
        let mut closed = 0;
        for peer in open.values() {
            if !peer.revocation.closed() && revoked(peer) {
                peer.revocation.close();
                closed += 1;
            }
        }
        closed
    }

    /// How many connections are watched.
    pub fn len(&self) -> usize {
        lock(&self.open).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A connection's place among the watched ones, given up with the connection.
pub struct Tracked {
    open: Arc<OpenConnections>,
    id: u64,
    revocation: Arc<Revocation>,
}

impl Tracked {
    /// Whether its certificate was found revoked (then the connection reads and writes no
    /// more).
    pub fn closed(&self) -> bool {
        self.revocation.closed()
    }

    /// The error the connection's reads and writes meet once it is closed; until then the
    /// task polling is woken when it is.
    pub fn poll_revoked(&self, cx: &mut Context<'_>) -> Option<io::Error> {
        self.revocation.waker.register(cx.waker());
        self.closed().then(revoked_error)
    }
}

fn revoked_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "the peer's certificate was revoked",
    )
}

impl Drop for Tracked {
    fn drop(&mut self) {
        lock(&self.open.open).remove(&self.id);
    }
}

/// A stream that fails every read and write once its peer's certificate is revoked. Without
/// a [`Tracked`] (no certificate presented) it is the stream itself.
pub struct Revocable<S> {
    inner: S,
    tracked: Option<Tracked>,
}

impl<S> Revocable<S> {
    pub fn new(inner: S, tracked: Option<Tracked>) -> Self {
        Revocable { inner, tracked }
    }

    /// A read's check: the error once closed; until then the reading task (a served
    /// connection always has one waiting) is woken when it is.
    fn revoked(&self, cx: &mut Context<'_>) -> Option<io::Error> {
        self.tracked.as_ref()?.poll_revoked(cx)
    }

    /// A write's check: the error once closed (the reading task is the one woken).
    fn revoked_for_write(&self) -> Option<io::Error> {
        self.tracked
            .as_ref()
            .filter(|t| t.closed())
            .map(|_| revoked_error())
    }
}

impl<S: Connected> Connected for Revocable<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Revocable<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(e) = self.revoked(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Revocable<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.revoked_for_write() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.revoked_for_write() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
