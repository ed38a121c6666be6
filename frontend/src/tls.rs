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
//!
//! Certificates are rotated without a restart: [`watch`] reads the files again every
//! `--tls-reload-interval` and new handshakes use what they hold from then on (etcd reads them
//! at each handshake). Connections already open keep the certificate they were made with. Files
//! that do not load (a key that is not the certificate's, half of a rotation written) are
//! refused, said in the log and in `strata_frontend_tls_reload_failing`, and the last good
//! ones go on serving.
//!
//! Client certificates are checked against a certificate revocation list when one is given
//! (`--client-crl-file`, as etcd's), reloaded with the rest: a revoked certificate opens no
//! new connection, and the connections it holds open are closed when the list that revokes it
//! is loaded (etcd leaves those open; a managed service revoking a leaked tenant certificate
//! must not wait for the client to reconnect).

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName};
use rustls::server::danger::ClientCertVerifier;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::Connected;

use journal::tls::revocable::{OpenConnections, Peer, Revocable, Tracked};
use journal::tls::{TbsField, crl_issuer, not_after, signed_by, tbs_field, tlv};

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
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{0} holds no certificate")]
    NoCertificate(PathBuf),
    #[error("{0} holds no certificate revocation list")]
    NoCrl(PathBuf),
    /// A list naming a trusted CA as its issuer that the CA did not sign: another CA of the
    /// same name (another environment's, or one regenerated). Taken, it would refuse every
    /// client certificate of that CA.
    #[error(
        "{0} names a trusted CA as its issuer but is not signed by it: not a revocation list of the --trusted-ca-file's CA"
    )]
    CrlNotOfCa(PathBuf),
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("--trusted-ca-file: {0}")]
    ClientVerifier(#[from] rustls::server::VerifierBuilderError),
}

/// What the client port needs to serve TLS.
pub struct TlsSetup {
    /// Made from the files as last loaded; each handshake takes the current one.
    serving: std::sync::RwLock<Serving>,
    /// The open connections that presented a certificate: closed when a revocation list that
    /// revokes their certificate is loaded.
    certified: Arc<OpenConnections>,
    files: Files,
    /// What the files held when last read, and why they were refused if they were.
    last: std::sync::Mutex<LastRead>,
    /// The port's name in metrics and logs (`client`, `admin`).
    port: &'static str,
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
        Self::load_with_crl(
            cert_file,
            key_file,
            trusted_ca_file,
            None,
            client_cert_auth,
            tenant_domain,
        )
    }

    /// `load`, with client certificates also checked against the revocation list in
    /// `crl_file` (PEM; needs `trusted_ca_file`).
    pub fn load_with_crl(
        cert_file: &Path,
        key_file: &Path,
        trusted_ca_file: Option<&Path>,
        crl_file: Option<&Path>,
        client_cert_auth: bool,
        tenant_domain: Option<&str>,
    ) -> Result<Self, TlsError> {
        let files = Files {
            cert: cert_file.into(),
            key: key_file.into(),
            ca: trusted_ca_file.map(Into::into),
            crl: crl_file
                .filter(|_| trusted_ca_file.is_some())
                .map(Into::into),
            client_cert_auth,
        };
        let contents = files.read()?;
        let loaded = files.config(&contents)?;
        Ok(Self {
            serving: std::sync::RwLock::new(Serving::from(loaded.clone())),
            certified: Arc::default(),
            files,
            last: std::sync::Mutex::new(LastRead {
                contents,
                refused: None,
                expires: loaded.expires,
            }),
            port: "client",
            tenant_domain: tenant_domain.map(|d| d.trim_start_matches('.').to_string()),
            verifies_clients: trusted_ca_file.is_some(),
            client_cert_auth,
            max_connections: None,
            open: Default::default(),
        })
    }

    /// Names the port in metrics and logs (`client` unless said).
    pub fn for_port(mut self, port: &'static str) -> Self {
        self.port = port;
        self
    }

    /// The acceptor and client verifier of the files as last loaded.
    fn serving(&self) -> Serving {
        self.serving
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The earliest expiry (Unix seconds) of the certificate chain served, if it could be read.
    pub fn expires(&self) -> Option<i64> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).expires
    }

    /// Reads the files again and, if they changed and load, serves them to new handshakes.
    /// Contents refused once are not tried again until they change.
    pub fn reload(&self) -> Reload {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let loaded = match self.files.read() {
            Ok(contents) if contents == last.contents => {
                return match &last.refused {
                    None => Reload::Unchanged,
                    Some(error) => Reload::Refused {
                        error: error.clone(),
                        new: false,
                    },
                };
            }
            Ok(contents) => {
                let loaded = self.files.config(&contents);
                last.contents = contents;
                loaded
            }
            Err(e) => {
                // Read again in full once readable, whatever it then holds.
                last.contents = Vec::new();
                Err(e)
            }
        };
        match loaded {
            Ok(loaded) => {
                *self.serving.write().unwrap_or_else(|e| e.into_inner()) =
                    Serving::from(loaded.clone());
                last.refused = None;
                last.expires = loaded.expires;
                drop(last);
                let closed = loaded
                    .verifier
                    .map_or(0, |v| self.close_revoked(v.as_ref()));
                Reload::Loaded { closed }
            }
            Err(e) => {
                let error = e.to_string();
                let new = last.refused.as_ref() != Some(&error);
                last.refused = Some(error.clone());
                Reload::Refused { error, new }
            }
        }
    }

    /// Watches an open connection that presented `chain` to `verified_by` (the verifier of
    /// its handshake), to close it if a revocation list loaded later revokes its certificate.
    /// Registered first, then checked again only if another list was loaded since its
    /// handshake: a reload after the registration checks it itself. None when client
    /// certificates are not checked.
    fn track(
        &self,
        chain: &[CertificateDer<'_>],
        verified_by: Option<&Arc<dyn ClientCertVerifier>>,
    ) -> Option<Tracked> {
        let peer = Peer::client(chain)?;
        let verified_by = verified_by?;
        Some(self.certified.track(peer, |peer| {
            self.serving().verifier.is_some_and(|now| {
                !Arc::ptr_eq(&now, verified_by) && peer.revoked_by(Some(now.as_ref()), None)
            })
        }))
    }

    /// Closes the open connections whose certificate `verifier` finds revoked; answers how
    /// many.
    fn close_revoked(&self, verifier: &dyn ClientCertVerifier) -> usize {
        let closed = self
            .certified
            .close_revoked(|peer| peer.revoked_by(Some(verifier), None));
        if closed > 0 {
            tracing::warn!(
                port = self.port,
                closed,
                "connections closed: their client certificates were revoked"
            );
            metrics::counter!("strata_frontend_connections_revoked_total", "port" => self.port)
                .increment(closed as u64);
        }
        closed
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

/// What [`TlsSetup::reload`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// The files hold what is served.
    Unchanged,
    /// They changed, and new handshakes use them; `closed` open connections were closed, their
    /// certificates revoked.
    Loaded { closed: usize },
    /// They do not load; the last good ones go on serving. `new`: not said before.
    Refused { error: String, new: bool },
}

/// The files a port's TLS is made of, and how.
struct Files {
    cert: PathBuf,
    key: PathBuf,
    ca: Option<PathBuf>,
    /// Revoked client certificates (only with `ca`).
    crl: Option<PathBuf>,
    client_cert_auth: bool,
}

/// What a port's files held when last read.
struct LastRead {
    /// Certificate, key, CA and revocation list files, as read (empty after a failed read).
    contents: Vec<Vec<u8>>,
    /// Why they were refused, if they were.
    refused: Option<String>,
    /// The earliest expiry in the chain served (Unix seconds).
    expires: Option<i64>,
}

/// A server configuration made from a port's files.
#[derive(Clone)]
struct Loaded {
    config: Arc<rustls::ServerConfig>,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    expires: Option<i64>,
}

/// What new handshakes are served with.
#[derive(Clone)]
struct Serving {
    acceptor: TlsAcceptor,
    /// What checks client certificates (None: none are asked for).
    verifier: Option<Arc<dyn ClientCertVerifier>>,
}

impl From<Loaded> for Serving {
    fn from(l: Loaded) -> Self {
        Serving {
            acceptor: TlsAcceptor::from(l.config),
            verifier: l.verifier,
        }
    }
}

impl Files {
    fn read(&self) -> Result<Vec<Vec<u8>>, TlsError> {
        std::iter::once(&self.cert)
            .chain(std::iter::once(&self.key))
            .chain(self.ca.as_ref())
            .chain(self.crl.as_ref())
            .map(|path| {
                std::fs::read(path).map_err(|source| TlsError::Io {
                    path: path.clone(),
                    source,
                })
            })
            .collect()
    }

    /// The server configuration `contents` (as [`Files::read`] answers them) make.
    fn config(&self, contents: &[Vec<u8>]) -> Result<Loaded, TlsError> {
        let certs = certificates(&self.cert, &contents[0])?;
        let key = PrivateKeyDer::from_pem_slice(&contents[1]).map_err(|source| TlsError::Read {
            path: self.key.clone(),
            source,
        })?;
        let expires = certs.iter().filter_map(|c| not_after(c)).min();
        let builder = rustls::ServerConfig::builder();
        let (builder, verifier) = match (&self.ca, contents.get(2)) {
            (Some(ca), Some(pem)) => {
                let mut roots = rustls::RootCertStore::empty();
                let cas = certificates(ca, pem)?;
                for c in &cas {
                    roots.add(c.clone())?;
                }
                let mut verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots));
                if let (Some(path), Some(pem)) = (&self.crl, contents.get(3)) {
                    let crls: Vec<CertificateRevocationListDer<'static>> =
                        pem_all(path, pem, TlsError::NoCrl)?;
                    lists_of_the_cas(path, &cas, &crls)?;
                    // The client's own certificate: its CA is trusted, not revoked here.
                    verifier = verifier.with_crls(crls).only_check_end_entity_revocation();
                }
                let verifier = if self.client_cert_auth {
                    verifier.build()?
                } else {
                    verifier.allow_unauthenticated().build()?
                };
                (
                    builder.with_client_cert_verifier(verifier.clone()),
                    Some(verifier),
                )
            }
            _ => (builder.with_no_client_auth(), None),
        };
        // Refuses a key that is not the certificate's.
        let mut config = builder.with_single_cert(certs, key)?;
        // gRPC needs h2; etcd's JSON gateway and `/health` also come over HTTP/1.1.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Loaded {
            config: Arc::new(config),
            verifier,
            expires,
        })
    }
}

/// Refuses a revocation list that names one of the trusted CAs as its issuer without being
/// signed by it. A client certificate is checked against its own CA's list and refused when
/// there is none, so such a list (another CA of the same name) would refuse every client of
/// that CA once loaded; it is refused like a file that does not parse instead. A list whose
/// issuer is none of the trusted CAs may be an intermediate CA's, which only clients present:
/// it is taken, with a warning, since the clients of a CA without a list are refused.
fn lists_of_the_cas(
    path: &Path,
    cas: &[CertificateDer<'_>],
    crls: &[CertificateRevocationListDer<'_>],
) -> Result<(), TlsError> {
    for crl in crls {
        // One that does not parse is the verifier's to refuse.
        let Some(issuer) = crl_issuer(crl) else {
            continue;
        };
        let named: Vec<&CertificateDer<'_>> = cas
            .iter()
            .filter(|ca| tbs_field(ca, TbsField::Subject).map(|(_, s)| s) == Some(issuer))
            .collect();
        if named.is_empty() {
            tracing::warn!(
                path = %path.display(),
                "a revocation list's issuer is none of the trusted CAs (an intermediate CA's?): clients of a CA without a list in the file are refused"
            );
        } else if !named.iter().any(|ca| signed_by(crl, ca)) {
            return Err(TlsError::CrlNotOfCa(path.to_path_buf()));
        }
    }
    Ok(())
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    pem_all(path, pem, TlsError::NoCertificate)
}

/// Every PEM item of type `T` in `pem` (read from `path`); `none` is the error if there is
/// none.
fn pem_all<T: PemObject>(
    path: &Path,
    pem: &[u8],
    none: fn(PathBuf) -> TlsError,
) -> Result<Vec<T>, TlsError> {
    journal::tls::pem_items(
        path,
        pem,
        |path, source| TlsError::Read { path, source },
        none,
    )
}

/// Reads `tls`'s files again every `every` (never if zero) and reports what it found in the
/// log and in metrics; ends once `tls` is dropped.
pub fn watch(tls: &Arc<TlsSetup>, every: Duration) {
    let port = tls.port;
    let expiry = metrics::gauge!("strata_frontend_tls_certificate_expiration_timestamp_seconds", "port" => port);
    let failing = metrics::gauge!("strata_frontend_tls_reload_failing", "port" => port);
    failing.set(0.0);
    if let Some(at) = tls.expires() {
        expiry.set(at as f64);
    }
    journal::tls::reread_every(
        tls,
        every,
        |tls| (tls.reload(), tls.expires()),
        move |(outcome, expires)| match outcome {
            Reload::Unchanged => {}
            Reload::Loaded { closed } => {
                tracing::info!(port, expires, closed, "TLS certificate files reloaded");
                metrics::counter!("strata_frontend_tls_reloads_total", "port" => port, "result" => "loaded").increment(1);
                if let Some(at) = expires {
                    expiry.set(at as f64);
                }
                failing.set(0.0);
            }
            Reload::Refused { error, new } => {
                if new {
                    tracing::warn!(port, %error, "TLS certificate files not reloaded: the last good ones go on serving");
                    metrics::counter!("strata_frontend_tls_reloads_total", "port" => port, "result" => "refused").increment(1);
                }
                failing.set(1.0);
            }
        },
    );
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
    let (tag, mut subject) = tbs_field(der, TbsField::Subject)?;
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

/// A connection of the client port, as the gRPC server sees it: closed once a revocation list
/// loaded later revokes its client certificate.
pub type ClientStream = Revocable<Accepted>;

/// An accepted connection and what its handshake decided.
pub struct Accepted {
    io: Io,
    entries: ConnectionEntries,
    /// Its place in its tenant's connection quota, if it counts.
    _slot: Option<TenantSlot>,
}

enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Connected for Accepted {
    type ConnectInfo = ConnectionEntries;

    fn connect_info(&self) -> ConnectionEntries {
        self.entries.clone()
    }
}

impl AsyncRead for Accepted {
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

impl AsyncWrite for Accepted {
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
                let plain = Revocable::new(
                    Accepted {
                        io: Io::Plain(tcp),
                        entries: ConnectionEntries::default(),
                        _slot: None,
                    },
                    None,
                );
                if tx.send(Ok(plain)).await.is_err() {
                    return;
                }
                continue;
            };
            let tx = tx.clone();
            let served = served.clone();
            tokio::spawn(async move {
                let peer = tcp.peer_addr().ok();
                let serving = tls.serving();
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, serving.acceptor.accept(tcp)).await {
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
                        let tracked = s
                            .get_ref()
                            .1
                            .peer_certificates()
                            .and_then(|chain| tls.track(chain, serving.verifier.as_ref()));
                        let stream = Revocable::new(
                            Accepted {
                                io: Io::Tls(Box::new(s)),
                                entries: ConnectionEntries::from(&connection),
                                _slot: slot,
                            },
                            tracked,
                        );
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

    /// The end-entity certificate a client trusting `ca` is served by `tls`, or why the
    /// handshake failed.
    async fn served_certificate(tls: &TlsSetup, ca: &Ca) -> Result<Vec<u8>, String> {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let acceptor = tls.serving().acceptor;
        let server = tokio::spawn(async move { acceptor.accept(server).await.map(drop) });
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).unwrap())
            .unwrap();
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connected = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost").unwrap(), client)
            .await;
        let _ = server.await;
        let stream = connected.map_err(|e| e.to_string())?;
        Ok(stream.get_ref().1.peer_certificates().unwrap()[0].to_vec())
    }

    /// Rotated files serve new handshakes once reloaded; files that do not load are refused
    /// (said once per change) and the last good ones go on serving.
    #[tokio::test]
    async fn rotated_files_are_served_and_broken_ones_refused() {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new();
        let first = ca.server(&["localhost"]);
        let (cert, key) = first.write(dir.path(), "server");
        let trusted = ca.write(dir.path());
        let tls = TlsSetup::load(&cert, &key, Some(&trusted), false, None).unwrap();
        assert_eq!(served_certificate(&tls, &ca).await, Ok(first.der.clone()));
        assert_eq!(tls.reload(), Reload::Unchanged);

        let second = ca.server(&["localhost"]);
        second.write(dir.path(), "server");
        assert_eq!(
            served_certificate(&tls, &ca).await,
            Ok(first.der.clone()),
            "not before a reload"
        );
        assert_eq!(tls.reload(), Reload::Loaded { closed: 0 });
        assert_eq!(served_certificate(&tls, &ca).await, Ok(second.der.clone()));

        // Half a rotation: a new certificate, the old key.
        let third = ca.server(&["localhost"]);
        std::fs::write(&cert, &third.cert_pem).unwrap();
        let Reload::Refused { error, new: true } = tls.reload() else {
            panic!("a key that is not the certificate's is refused");
        };
        assert!(error.contains("TLS configuration"), "{error}");
        assert_eq!(
            tls.reload(),
            Reload::Refused { error, new: false },
            "said once"
        );
        assert_eq!(served_certificate(&tls, &ca).await, Ok(second.der.clone()));
        std::fs::remove_file(&key).unwrap();
        let Reload::Refused { error, new: true } = tls.reload() else {
            panic!("a missing key is refused");
        };
        assert!(error.contains("server.key"), "{error}");
        assert_eq!(
            tls.reload(),
            Reload::Refused { error, new: false },
            "still missing"
        );
        // The same mismatched key back: read and judged again.
        std::fs::write(&key, &second.key_pem).unwrap();
        let Reload::Refused { error, new: true } = tls.reload() else {
            panic!("still a key that is not the certificate's");
        };
        assert!(error.contains("TLS configuration"), "{error}");
        std::fs::write(&key, &third.key_pem).unwrap();
        assert_eq!(tls.reload(), Reload::Loaded { closed: 0 });
        assert_eq!(served_certificate(&tls, &ca).await, Ok(third.der.clone()));

        // A new CA: clients of the old one are refused from then on.
        let next = Ca::new();
        let fourth = next.server_until(&["localhost"], (2031, 5, 17));
        fourth.write(dir.path(), "server");
        next.write(dir.path());
        assert_eq!(tls.reload(), Reload::Loaded { closed: 0 });
        assert_eq!(
            served_certificate(&tls, &next).await,
            Ok(fourth.der.clone())
        );
        assert!(served_certificate(&tls, &ca).await.is_err());
        assert_eq!(tls.expires(), Some(1_936_742_400), "2031-05-17T00:00:00Z");
    }

    /// Whether `tls` accepts a handshake from a client trusting `ca` and presenting `client`'s
    /// certificate; the server's error if not.
    async fn handshake(
        tls: &TlsSetup,
        ca: &Ca,
        client: &strata_tests::certs::Issued,
    ) -> Result<(), String> {
        let (c, s) = tokio::io::duplex(64 * 1024);
        let acceptor = tls.serving().acceptor;
        let server = tokio::spawn(async move { acceptor.accept(s).await.map(drop) });
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).unwrap())
            .unwrap();
        let chain = vec![CertificateDer::from(client.der.clone())];
        let key = PrivateKeyDer::from_pem_slice(client.key_pem.as_bytes()).unwrap();
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .unwrap();
        let connected = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost").unwrap(), c)
            .await;
        let accepted = server.await.unwrap().map_err(|e| e.to_string());
        drop(connected);
        accepted
    }

    /// `--client-crl-file`: a revoked certificate opens no connection; a list loaded later
    /// closes the open connections of the certificates it revokes, and only those; a list that
    /// does not load leaves the last good one in force.
    #[tokio::test]
    async fn revoked_client_certificates_are_refused_and_their_connections_closed() {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new();
        let (cert, key) = ca.server(&["localhost"]).write(dir.path(), "server");
        let trusted = ca.write(dir.path());
        let (alice, bob) = (ca.client("alice", &[]), ca.client("bob", &[]));
        let crl = dir.path().join("crl.pem");
        std::fs::write(&crl, ca.crl(&[])).unwrap();
        let tls = Arc::new(
            TlsSetup::load_with_crl(&cert, &key, Some(&trusted), Some(&crl), true, None).unwrap(),
        );
        assert_eq!(handshake(&tls, &ca, &alice).await, Ok(()));
        assert_eq!(handshake(&tls, &ca, &bob).await, Ok(()));
        let of = |i: &strata_tests::certs::Issued| [CertificateDer::from(i.der.clone())];
        // The verifier their handshakes used.
        let before = tls.serving().verifier;
        let (open_alice, open_bob) = (
            tls.track(&of(&alice), before.as_ref()).expect("tracked"),
            tls.track(&of(&bob), before.as_ref()).expect("tracked"),
        );

        std::fs::write(&crl, ca.crl(&[&alice])).unwrap();
        assert_eq!(tls.reload(), Reload::Loaded { closed: 1 });
        assert!(open_alice.closed(), "alice's connection closed");
        assert!(!open_bob.closed(), "bob's is not");
        let refused = handshake(&tls, &ca, &alice).await.unwrap_err();
        assert!(refused.contains("Revoked"), "{refused}");
        assert_eq!(handshake(&tls, &ca, &bob).await, Ok(()));
        // A handshake made before the list loaded, its connection registered after: closed as
        // it is registered; bob's, registered then too, is not.
        assert!(tls.track(&of(&alice), before.as_ref()).unwrap().closed());
        assert!(!tls.track(&of(&bob), before.as_ref()).unwrap().closed());
        assert!(
            tls.track(&of(&bob), None).is_none(),
            "no verifier, nothing to watch"
        );
        drop(open_alice);
        assert_eq!(tls.certified.len(), 1, "only bob's is watched");

        std::fs::write(&crl, "not a list").unwrap();
        assert!(matches!(tls.reload(), Reload::Refused { new: true, .. }));
        assert!(
            handshake(&tls, &ca, &alice).await.is_err(),
            "the last good list"
        );
        // Another CA of the same name (every test CA's): its list would refuse every client.
        std::fs::write(&crl, Ca::new().crl(&[])).unwrap();
        let Reload::Refused { error, new: true } = tls.reload() else {
            panic!("another CA's list of the same name is loaded");
        };
        assert!(error.contains("is not signed by it"), "{error}");
        assert_eq!(
            handshake(&tls, &ca, &bob).await,
            Ok(()),
            "the last good list"
        );
        let refused = TlsSetup::load_with_crl(&cert, &key, Some(&trusted), Some(&crl), true, None);
        assert!(
            matches!(&refused, Err(TlsError::CrlNotOfCa(p)) if *p == crl),
            "{:?}",
            refused.err()
        );
        drop(open_bob);
    }

    #[test]
    fn a_certificates_expiry_is_read_in_both_time_forms() {
        let ca = Ca::new();
        // Before 2050 UTCTime, from 2050 GeneralizedTime (RFC 5280).
        for (date, unix) in [
            ((2031, 5, 17), 1_936_742_400),
            ((2051, 1, 2), 2_556_230_400),
            ((1999, 12, 31), 946_598_400),
        ] {
            let der = ca.server_until(&["localhost"], date).der;
            assert_eq!(not_after(&der), Some(unix), "{date:?}");
        }
        let der = ca.server(&["localhost"]).der;
        for cut in [0, 1, 10, der.len() / 3] {
            assert_eq!(not_after(&der[..cut]), None, "cut at {cut}");
        }
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
