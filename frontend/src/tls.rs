//! The client port's connections: plain TCP, or TLS as etcd serves it (`--cert-file`,
//! `--key-file`, `--trusted-ca-file`, `--client-cert-auth`), and the tenant a TLS connection
//! belongs to (docs/design/tenants.md, T3), decided once per connection:
//!
//! 1. the server name the client dialled, `<tenant>.<--tenant-domain>`;
//! 2. else its client certificate, when it is valid for exactly one served tenant's name
//!    `<tenant>.<--tenant-domain>` (a DNS name in the certificate's subject alternative names);
//! 3. else none: requests are resolved by their header or go to the default tenant
//!    (`Tenants::resolve`).
//!
//! With `--client-cert-auth` a connection that names a tenant by its server name must present a
//! certificate for that name, so one tenant's certificate never opens another's keyspace. A
//! wildcard client certificate names no tenant. The connection's tenant reaches the services as
//! the [`CONNECTION_TENANT`] metadata entry, set by [`ConnectionLayer`] from the connection
//! alone: a copy sent by a client is removed first.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::Connected;

/// Metadata entry naming the tenant of the connection a request came on (set by
/// [`ConnectionLayer`] only).
pub const CONNECTION_TENANT: &str = "x-strata-connection-tenant";
/// Metadata entry saying why the connection a request came on may not be served (set by
/// [`ConnectionLayer`] only).
pub const CONNECTION_REFUSED: &str = "x-strata-connection-refused";
/// Metadata entry naming the user of the connection's client certificate (its common name,
/// with `--client-cert-auth`; set by [`ConnectionLayer`] only).
pub const CONNECTION_USER: &str = "x-strata-connection-user";
/// How long a client may take over its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A name no tenant has: a client certificate valid for it is a wildcard.
const WILDCARD_PROBE: &str = "wildcard-probe--not-a-tenant";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{0} holds no certificate")]
    NoCertificate(PathBuf),
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("--trusted-ca-file: {0}")]
    ClientVerifier(#[from] rustls::server::VerifierBuilderError),
}

/// What the client port needs to serve TLS.
pub struct TlsSetup {
    acceptor: TlsAcceptor,
    /// `--tenant-domain`, without a leading dot.
    tenant_domain: Option<String>,
    /// Whether client certificates are verified (`--trusted-ca-file`).
    verifies_clients: bool,
    /// `--client-cert-auth`.
    client_cert_auth: bool,
    /// Most connections a tenant may hold open (`--tenant-max-connections`).
    max_connections: Option<usize>,
    /// Connections open, by the tenant their handshake named.
    open: std::sync::Mutex<std::collections::HashMap<String, usize>>,
}

impl TlsSetup {
    /// The server's certificate chain and key, the CA client certificates are verified against
    /// (if any) and whether every client must present one.
    pub fn load(
        cert_file: &Path,
        key_file: &Path,
        trusted_ca_file: Option<&Path>,
        client_cert_auth: bool,
        tenant_domain: Option<&str>,
    ) -> Result<Self, TlsError> {
        let certs = certificates(cert_file)?;
        let key = PrivateKeyDer::from_pem_file(key_file).map_err(|source| TlsError::Read {
            path: key_file.into(),
            source,
        })?;
        let builder = rustls::ServerConfig::builder();
        let builder = match trusted_ca_file {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in certificates(ca)? {
                    roots.add(c)?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots));
                let verifier = if client_cert_auth {
                    verifier.build()?
                } else {
                    verifier.allow_unauthenticated().build()?
                };
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(certs, key)?;
        // gRPC needs h2; etcd's JSON gateway and `/health` also come over HTTP/1.1.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            tenant_domain: tenant_domain.map(|d| d.trim_start_matches('.').to_string()),
            verifies_clients: trusted_ca_file.is_some(),
            client_cert_auth,
            max_connections: None,
            open: Default::default(),
        })
    }

    /// At most `max` open connections per tenant (those whose handshake names their tenant).
    pub fn with_max_connections(mut self, max: Option<usize>) -> Self {
        self.max_connections = max;
        self
    }

    /// A place for one more connection of `tenant`, held until the slot is dropped; `Err(max)`
    /// when the tenant has its quota open already. `own`: the tenant's quota from the
    /// catalogue, which replaces `--tenant-max-connections`.
    fn take_slot(
        self: &Arc<Self>,
        tenant: &str,
        own: Option<usize>,
    ) -> Result<Option<TenantSlot>, usize> {
        let Some(max) = own.or(self.max_connections) else {
            return Ok(None);
        };
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(tenant.to_string()).or_insert(0);
        if *n >= max {
            return Err(max);
        }
        *n += 1;
        Ok(Some(TenantSlot {
            tls: self.clone(),
            tenant: tenant.to_string(),
        }))
    }

    /// What a finished handshake says: the tenant it names, given the tenants served, and the
    /// user its client certificate names (etcd's `--client-cert-auth`: the common name).
    fn connection(
        &self,
        server_name: Option<&str>,
        cert: Option<&CertificateDer<'_>>,
        served: &[String],
    ) -> Connection {
        let user = cert
            .filter(|_| self.client_cert_auth)
            .and_then(|c| common_name(c.as_ref()));
        Connection {
            user,
            ..self.tenant_of(server_name, cert, served)
        }
    }

    /// The tenant a handshake names (see the module's doc).
    fn tenant_of(
        &self,
        server_name: Option<&str>,
        cert: Option<&CertificateDer<'_>>,
        served: &[String],
    ) -> Connection {
        let Some(domain) = &self.tenant_domain else {
            return Connection::default();
        };
        let cert = cert
            .filter(|_| self.verifies_clients)
            .and_then(|c| webpki::EndEntityCert::try_from(c).ok());
        let valid_for = |tenant: &str| {
            cert.as_ref().is_some_and(|c| {
                let name = format!("{tenant}.{domain}");
                ServerName::try_from(name.as_str())
                    .is_ok_and(|n| c.verify_is_valid_for_subject_name(&n).is_ok())
            })
        };
        let named = server_name.and_then(|n| {
            n.strip_suffix(domain.as_str())
                .and_then(|t| t.strip_suffix('.'))
                .filter(|t| !t.is_empty() && !t.contains('.'))
        });
        let wildcard = valid_for(WILDCARD_PROBE);
        if let Some(t) = named {
            if self.client_cert_auth && (wildcard || !valid_for(t)) {
                return Connection {
                    refused: Some(format!(
                        "the client certificate is not one of tenant {t}'s (it must name {t}.{domain})"
                    )),
                    ..Connection::default()
                };
            }
            return Connection {
                tenant: Some(t.to_string()),
                ..Connection::default()
            };
        }
        if wildcard {
            return Connection::default();
        }
        let mut matching = served.iter().filter(|t| valid_for(t));
        match (matching.next(), matching.next()) {
            (Some(t), None) => Connection {
                tenant: Some(t.clone()),
                ..Connection::default()
            },
            _ => Connection::default(),
        }
    }
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|source| TlsError::Read {
            path: path.into(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.into()));
    }
    Ok(certs)
}

/// What the handshake said about a connection's tenant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Connection {
    /// The tenant its server name or client certificate names.
    pub tenant: Option<String>,
    /// Why its requests are refused (a certificate that is not the named tenant's).
    pub refused: Option<String>,
    /// The user its client certificate names (with `--client-cert-auth`).
    pub user: Option<String>,
}

/// The common name of a DER certificate's subject (the first, as etcd takes
/// `Subject.CommonName`), if it has one that is text. The certificate was verified against the
/// trusted CA before this reads it; still, every length is checked.
fn common_name(der: &[u8]) -> Option<String> {
    // Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL, serial,
    // signature, issuer, validity, subject, ... }, ... }
    let (_, cert, _) = tlv(der)?;
    let (_, mut tbs, _) = tlv(cert)?;
    let mut fields = Vec::with_capacity(6);
    while fields.len() < 6 && !tbs.is_empty() {
        let (tag, value, rest) = tlv(tbs)?;
        fields.push((tag, value));
        tbs = rest;
    }
    let explicit_version = fields.first()?.0 == 0xa0;
    let (tag, mut subject) = *fields.get(if explicit_version { 5 } else { 4 })?;
    if tag != 0x30 {
        return None;
    }
    // Name ::= SEQUENCE OF RelativeDistinguishedName (SET OF AttributeTypeAndValue).
    const COMMON_NAME: [u8; 3] = [0x55, 0x04, 0x03];
    while !subject.is_empty() {
        let (_, mut set, rest) = tlv(subject)?;
        subject = rest;
        while !set.is_empty() {
            let (_, attribute, rest) = tlv(set)?;
            set = rest;
            let (oid_tag, oid, value) = tlv(attribute)?;
            if oid_tag == 0x06 && oid == COMMON_NAME {
                let (string_tag, text, _) = tlv(value)?;
                // UTF8String, PrintableString, IA5String; TeletexString read as Latin-1.
                return match string_tag {
                    0x0c | 0x13 | 0x16 => std::str::from_utf8(text).ok().map(str::to_string),
                    0x14 => Some(text.iter().map(|&b| char::from(b)).collect()),
                    _ => None,
                };
            }
        }
    }
    None
}

/// One DER element at the start of `input`: its tag, its contents and what follows it.
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > std::mem::size_of::<usize>() || rest.len() < n {
            return None;
        }
        let (bytes, rest) = rest.split_at(n);
        let len = bytes.iter().fold(0usize, |l, &b| (l << 8) | usize::from(b));
        (len, rest)
    };
    (rest.len() >= len).then(|| {
        let (value, rest) = rest.split_at(len);
        (tag, value, rest)
    })
}

/// One of a tenant's open connections, counted until it is dropped with its connection.
struct TenantSlot {
    tls: Arc<TlsSetup>,
    tenant: String,
}

impl Drop for TenantSlot {
    fn drop(&mut self) {
        let mut open = self.tls.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.tenant);
            }
        }
    }
}

/// What a connection says about every request on it, as metadata entries made once when it
/// is accepted (so a request costs reference counts, not allocations).
#[derive(Clone, Default)]
pub struct ConnectionEntries(Arc<[(&'static str, http::HeaderValue)]>);

impl From<&Connection> for ConnectionEntries {
    fn from(c: &Connection) -> Self {
        let entries: Vec<_> = [
            (CONNECTION_TENANT, &c.tenant),
            (CONNECTION_REFUSED, &c.refused),
            (CONNECTION_USER, &c.user),
        ]
        .into_iter()
        .filter_map(|(name, value)| {
            // UTF-8 passes (a common name may be any text); a value that is no header value (a
            // control character in a common name) is left out: no user then, as without it.
            let v = http::HeaderValue::from_bytes(value.as_deref()?.as_bytes()).ok()?;
            Some((name, v))
        })
        .collect();
        Self(entries.into())
    }
}

/// A connection of the client port, as the gRPC server sees it.
pub struct ClientStream {
    io: Io,
    entries: ConnectionEntries,
    /// Its place in its tenant's connection quota, if it counts.
    _slot: Option<TenantSlot>,
}

enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Connected for ClientStream {
    type ConnectInfo = ConnectionEntries;

    fn connect_info(&self) -> ConnectionEntries {
        self.entries.clone()
    }
}

impl AsyncRead for ClientStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// What the client port asks of the tenants served as it accepts a connection (the catalogue
/// adds and changes them while the frontend runs).
pub trait Directory: Send + Sync {
    /// The names of the tenants served: a client certificate names one of them.
    fn names(&self) -> Vec<String>;

    /// The most connections tenant `name` may hold open here, if its catalogue record gives
    /// it a quota (else `--tenant-max-connections` counts).
    fn max_connections(&self, _name: &str) -> Option<usize> {
        None
    }
}

/// A fixed list of names and no quotas of their own (the admin port, tests).
impl Directory for Vec<String> {
    fn names(&self) -> Vec<String> {
        self.clone()
    }
}

/// The client port's connections: accepted, with `TCP_NODELAY` (every answer would otherwise
/// wait for Nagle's timer), and with `tls` each handshake run in its own task, so a slow client
/// holds up no other. Ends when the receiving side is dropped.
pub fn incoming(
    listener: TcpListener,
    tls: Option<Arc<TlsSetup>>,
    served: Arc<dyn Directory>,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<ClientStream>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = tx.closed() => return,
            };
            let tcp = match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // EMFILE and friends: say so and go on, as a server must.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let Some(tls) = tls.clone() else {
                let plain = ClientStream {
                    io: Io::Plain(tcp),
                    entries: ConnectionEntries::default(),
                    _slot: None,
                };
                if tx.send(Ok(plain)).await.is_err() {
                    return;
                }
                continue;
            };
            let tx = tx.clone();
            let served = served.clone();
            tokio::spawn(async move {
                let peer = tcp.peer_addr().ok();
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.acceptor.accept(tcp)).await {
                    Ok(Ok(mut s)) => {
                        let (_, session) = s.get_ref();
                        let connection = tls.connection(
                            session.server_name(),
                            session.peer_certificates().and_then(<[_]>::first),
                            &served.names(),
                        );
                        let slot = match connection
                            .tenant
                            .as_deref()
                            .map(|t| tls.take_slot(t, served.max_connections(t)))
                        {
                            None => None,
                            Some(Ok(slot)) => slot,
                            Some(Err(max)) => {
                                let tenant = connection.tenant.unwrap_or_default();
                                tracing::info!(?peer, %tenant, max, "connection refused: the tenant's connection quota is open");
                                metrics::counter!("strata_frontend_connections_refused_total", "tenant" => tenant)
                                    .increment(1);
                                // close_notify, then the socket closes.
                                let _ = tokio::io::AsyncWriteExt::shutdown(&mut s).await;
                                return;
                            }
                        };
                        let stream = ClientStream {
                            io: Io::Tls(Box::new(s)),
                            entries: ConnectionEntries::from(&connection),
                            _slot: slot,
                        };
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(?peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(?peer, "TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Sets [`CONNECTION_TENANT`], [`CONNECTION_REFUSED`] and [`CONNECTION_USER`] on every request
/// from its connection's [`ConnectionEntries`], after removing whatever the client sent under
/// those names.
#[derive(Clone, Copy, Default)]
pub struct ConnectionLayer;

impl<S> tower_layer::Layer<S> for ConnectionLayer {
    type Service = ConnectionService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ConnectionService { inner }
    }
}

#[derive(Clone)]
pub struct ConnectionService<S> {
    inner: S,
}

impl<S, B> tower_service::Service<http::Request<B>> for ConnectionService<S>
where
    S: tower_service::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let headers = req.headers_mut();
        for name in [CONNECTION_TENANT, CONNECTION_REFUSED, CONNECTION_USER] {
            headers.remove(name);
        }
        if let Some(ConnectionEntries(entries)) = req.extensions().get().cloned() {
            let headers = req.headers_mut();
            for (name, value) in entries.iter() {
                headers.insert(*name, value.clone());
            }
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_tests::certs::Ca;

    const DOMAIN: &str = "tenants.test";

    /// A setup whose server certificate covers every tenant's name, trusting `ca`.
    fn setup(ca: &Ca, dir: &Path, client_cert_auth: bool) -> TlsSetup {
        let (cert, key) = ca
            .server(&["*.tenants.test", "localhost", "127.0.0.1"])
            .write(dir, "server");
        let trusted = ca.write(dir);
        TlsSetup::load(&cert, &key, Some(&trusted), client_cert_auth, Some(DOMAIN)).unwrap()
    }

    fn served() -> Vec<String> {
        ["default", "a", "b"].map(String::from).to_vec()
    }

    fn tenant(t: &str) -> Connection {
        Connection {
            tenant: Some(t.into()),
            ..Connection::default()
        }
    }

    /// A tenant's own quota (the catalogue's) replaces `--tenant-max-connections`, for that
    /// tenant only; a closed connection frees its place.
    #[test]
    fn a_tenants_own_connection_quota_replaces_the_flag() {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let unlimited = Arc::new(setup(&Ca::new(), dir.path(), false));
        assert!(
            unlimited.take_slot("a", None).unwrap().is_none(),
            "not counted"
        );
        let one = unlimited.take_slot("a", Some(1)).unwrap().expect("counted");
        assert_eq!(unlimited.take_slot("a", Some(1)).err(), Some(1));
        assert!(unlimited.take_slot("b", Some(1)).unwrap().is_some());
        drop(one);
        assert!(unlimited.take_slot("a", Some(1)).unwrap().is_some());

        let flagged = Arc::new(setup(&Ca::new(), dir.path(), false).with_max_connections(Some(1)));
        let _a = flagged.take_slot("a", None).unwrap().expect("counted");
        assert_eq!(flagged.take_slot("a", None).err(), Some(1), "the flag");
        let _more = flagged
            .take_slot("a", Some(3))
            .unwrap()
            .expect("its own quota");
        let _again = flagged
            .take_slot("a", Some(3))
            .unwrap()
            .expect("its own quota");
        assert_eq!(flagged.take_slot("a", Some(3)).err(), Some(3));
    }

    #[test]
    fn the_server_name_then_the_client_certificate_names_the_tenant() {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new();
        let of_a = CertificateDer::from(ca.client("app", &["a.tenants.test"]).der);
        let of_b = CertificateDer::from(ca.client("app", &["b.tenants.test"]).der);
        let wildcard = CertificateDer::from(ca.client("app", &["*.tenants.test"]).der);
        let plain = CertificateDer::from(ca.client("root", &["client.example"]).der);
        let s = setup(&ca, dir.path(), false);
        let served = served();
        let c =
            |sni: Option<&str>, cert: Option<&CertificateDer<'_>>| s.connection(sni, cert, &served);
        // The server name decides.
        assert_eq!(c(Some("a.tenants.test"), None), tenant("a"));
        assert_eq!(c(Some("a.tenants.test"), Some(&plain)), tenant("a"));
        // Else a certificate valid for one tenant's name.
        assert_eq!(c(Some("localhost"), Some(&of_b)), tenant("b"));
        assert_eq!(c(None, Some(&of_a)), tenant("a"));
        // Else nothing: the header or the default tenant decide.
        assert_eq!(c(Some("localhost"), Some(&plain)), Connection::default());
        assert_eq!(
            c(None, Some(&wildcard)),
            Connection::default(),
            "a wildcard names no tenant"
        );
        assert_eq!(c(Some("x.a.tenants.test"), None), Connection::default());
        assert_eq!(c(Some("tenants.test"), None), Connection::default());
        assert_eq!(c(Some("atenants.test"), None), Connection::default());

        // With --client-cert-auth the certificate must be the named tenant's.
        let strict = setup(&ca, dir.path(), true);
        let c = |sni: Option<&str>, cert: Option<&CertificateDer<'_>>| {
            strict.tenant_of(sni, cert, &served)
        };
        assert_eq!(c(Some("a.tenants.test"), Some(&of_a)), tenant("a"));
        for cert in [&of_b, &wildcard, &plain] {
            let refused = c(Some("a.tenants.test"), Some(cert));
            assert_eq!(refused.tenant, None);
            assert_eq!(
                refused.refused.as_deref(),
                Some(
                    "the client certificate is not one of tenant a's (it must name a.tenants.test)"
                )
            );
        }
        assert_eq!(c(Some("localhost"), Some(&of_b)), tenant("b"));
    }

    #[test]
    fn a_connections_entries_are_made_once_and_keep_utf8_names() {
        let entries = ConnectionEntries::from(&Connection {
            tenant: Some("a".into()),
            refused: None,
            user: Some("système".into()),
        });
        let got: Vec<(&str, &[u8])> = entries.0.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
        assert_eq!(
            got,
            [
                (CONNECTION_TENANT, b"a".as_slice()),
                (CONNECTION_USER, "système".as_bytes())
            ]
        );
        // A name no header can carry names nobody.
        let entries = ConnectionEntries::from(&Connection {
            user: Some("a\nb".into()),
            ..Connection::default()
        });
        assert!(entries.0.is_empty());
    }

    #[test]
    fn without_a_tenant_domain_no_connection_names_a_tenant() {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new();
        let (cert, key) = ca.server(&["localhost"]).write(dir.path(), "server");
        let trusted = ca.write(dir.path());
        let s = TlsSetup::load(&cert, &key, Some(&trusted), false, None).unwrap();
        let of_a = CertificateDer::from(ca.client("app", &["a.tenants.test"]).der);
        assert_eq!(
            s.connection(Some("a.tenants.test"), Some(&of_a), &served()),
            Connection::default()
        );
    }

    #[test]
    fn unreadable_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = TlsSetup::load(&missing, &missing, None, false, None)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("missing.pem"), "{err}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let err = TlsSetup::load(&empty, &empty, None, false, None)
            .err()
            .unwrap();
        assert!(matches!(err, TlsError::NoCertificate(_)), "{err}");
    }
}

#[cfg(test)]
mod common_name_tests {
    use super::*;
    use strata_tests::certs::Ca;

    #[test]
    fn the_subjects_common_name_is_read() {
        let ca = Ca::new();
        for user in ["root", "alice", "système", "a b"] {
            let der = ca.client(user, &["x.example"]).der;
            assert_eq!(common_name(&der).as_deref(), Some(user));
        }
        // The CA's own certificate: its issuer comes before its subject, with the same name.
        let der = CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).unwrap();
        assert_eq!(common_name(&der).as_deref(), Some("strata test CA"));
    }

    #[test]
    fn malformed_input_reads_as_no_name() {
        let der = Ca::new().client("root", &["x.example"]).der;
        for cut in [0, 1, 2, 10, der.len() / 2, der.len() - 1] {
            // Truncated anywhere: no panic, no name.
            assert_eq!(common_name(&der[..cut]), None, "cut at {cut}");
        }
        assert_eq!(common_name(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(common_name(&[0x30, 0x89, 1, 2, 3, 4, 5, 6, 7, 8, 9]), None);
    }
}
