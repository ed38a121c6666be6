//! TLS between Strata's own processes: journal nodes with each other, and frontends, compactors
//! and `strata` admin commands with journal nodes.
//!
//! Mutual TLS, with a CA of its own: a journal node accepts a connection only from a peer whose
//! certificate chains to the internal CA, and every dialler checks that the node it reached
//! holds a certificate of that CA for the name it dialled. Each process presents one
//! certificate in both roles (a journal node is a server to its clients and a client of its
//! peers). Whoever holds such a certificate may append to, read and trim every shard: the
//! internal CA must be one no tenant's client certificate chains to.
//!
//! The files are read again every `--internal-tls-reload-interval` and compared by content (a
//! Kubernetes secret is swapped through a symlink): new connections use the new files, open
//! ones keep what they were made with; files that do not load are refused and the last good
//! ones go on serving.
//!
//! A revocation list (`--internal-crl-file`, etcd's `--peer-crl-file`) is read with them: a
//! certificate it revokes opens no new connection in either role (a frontend's certificate
//! taken with its host is cut off without a new CA), and the connections it holds open, as a
//! client or as a server, are closed as the list is loaded ([`revocable`]). A list that is not
//! the internal CA's (which would refuse every certificate of the deployment) is refused like a
//! file that does not parse (`crl_of_the_ca`).
//!
//! Also owns the small DER reading (a certificate's subject, expiry and public key; a
//! revocation list's issuer; whether a certificate or list is signed by a given certificate's
//! key) and the revocation of open connections ([`revocable`]) the frontend's client port
//! shares.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName};
use rustls::server::danger::ClientCertVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::log_store::lock;

pub mod revocable;

use revocable::{OpenConnections, Peer, Revocable};

/// How long a peer may take over its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the files are read again by default.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("cannot read {path}: {source}")]
    Pem {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{0} holds no certificate")]
    NoCertificate(PathBuf),
    #[error("{0} holds no certificate revocation list")]
    NoCrl(PathBuf),
    /// A list that would refuse every certificate of the internal CA, this process's own
    /// included: signed by another CA (with the same name or another), so no certificate has
    /// a list of its own CA to be checked against.
    #[error("{path} is not a revocation list of the internal CA ({why})")]
    CrlNotOfCa { path: PathBuf, why: String },
    #[error("internal TLS: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("internal TLS CA or revocation list: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// The files internal TLS is made of (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The internal CA: every peer's certificate must chain to it.
    pub ca: PathBuf,
    /// This process's certificate chain, presented to peers in both roles.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// Certificate revocation lists of the internal CA, if any: a revoked peer's handshake is
    /// refused, as a client's and as a server's.
    pub crl: Option<PathBuf>,
}

/// The flags every process that serves or dials the journal takes. All three files, or none
/// (plaintext).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// Internal TLS: the CA (PEM) every journal node's, frontend's, compactor's and admin
    /// command's certificate chains to; connections to and between journal nodes are then
    /// mutual TLS. Use a CA no tenant's client certificate chains to. Needs
    /// --internal-cert-file and --internal-key-file.
    #[arg(
        long,
        env = "STRATA_INTERNAL_TRUSTED_CA_FILE",
        requires_all = ["internal_cert_file", "internal_key_file"]
    )]
    pub internal_trusted_ca_file: Option<PathBuf>,
    /// Internal TLS: this process's certificate chain (PEM), presented both as a server's (a
    /// journal node's, for the names it is dialled at) and as a client's.
    #[arg(
        long,
        env = "STRATA_INTERNAL_CERT_FILE",
        requires = "internal_trusted_ca_file"
    )]
    pub internal_cert_file: Option<PathBuf>,
    /// Internal TLS: the key of --internal-cert-file (PEM).
    #[arg(
        long,
        env = "STRATA_INTERNAL_KEY_FILE",
        requires = "internal_trusted_ca_file"
    )]
    pub internal_key_file: Option<PathBuf>,
    /// Internal TLS: certificate revocation lists (PEM) of the internal CA; a certificate they
    /// revoke (a frontend's, a node's) opens no new connection. Read again with the others.
    #[arg(
        long,
        env = "STRATA_INTERNAL_CRL_FILE",
        requires = "internal_trusted_ca_file"
    )]
    pub internal_crl_file: Option<PathBuf>,
    /// How often the internal TLS files are read again (a rotated certificate is used by new
    /// connections without a restart; 0s: never).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub internal_tls_reload_interval: Duration,
}

impl TlsArgs {
    /// The files named, if internal TLS is on.
    pub fn files(&self) -> Option<TlsFiles> {
        Some(TlsFiles {
            ca: self.internal_trusted_ca_file.clone()?,
            cert: self.internal_cert_file.clone()?,
            key: self.internal_key_file.clone()?,
            crl: self.internal_crl_file.clone(),
        })
    }

    /// Loads the files (None: internal TLS is off).
    pub fn load(&self) -> Result<Option<Arc<InternalTls>>, TlsError> {
        load_if(self.files())
    }

    /// Loads the files and reads them again every `--internal-tls-reload-interval` (inside a
    /// Tokio runtime, with the process's metrics recorder installed).
    pub fn start(&self) -> Result<Option<Arc<InternalTls>>, TlsError> {
        let tls = self.load()?;
        if let Some(tls) = &tls {
            watch(tls, self.internal_tls_reload_interval);
        }
        Ok(tls)
    }
}

/// Loads `files`, if internal TLS is on (None: plaintext).
pub fn load_if(files: Option<TlsFiles>) -> Result<Option<Arc<InternalTls>>, TlsError> {
    files
        .map(|f| InternalTls::load(f).map(Arc::new))
        .transpose()
}

/// What became of a reading of the files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// They hold what is in use.
    Unchanged,
    /// They changed, and new connections use them; `closed` open connections were closed
    /// because they revoke their peer's certificate.
    Loaded { closed: usize },
    /// They do not load; the last good ones stay in use. `new`: not said before.
    Refused { error: String, new: bool },
}

/// Internal TLS as last loaded, for both sides of a connection.
pub struct InternalTls {
    files: TlsFiles,
    current: RwLock<Configs>,
    last: Mutex<LastRead>,
    /// Connections open in either role, closed when a revocation list that revokes their
    /// peer's certificate is loaded.
    open: Arc<OpenConnections>,
}

impl std::fmt::Debug for InternalTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InternalTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

#[derive(Clone)]
struct Configs {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
    /// The verifiers both configurations hold: of the clients that dial this process, of the
    /// nodes it dials.
    clients: Arc<dyn ClientCertVerifier>,
    servers: Arc<dyn ServerCertVerifier>,
    /// Counts the loads: a connection made with an older one is checked against this one's
    /// lists as it is registered.
    generation: u64,
    /// The earliest expiry in this process's chain (Unix seconds).
    expires: Option<i64>,
}

impl Configs {
    /// Whether these files' revocation lists revoke `peer`'s certificate.
    fn revoke(&self, peer: &Peer) -> bool {
        peer.revoked_by(Some(self.clients.as_ref()), Some(self.servers.as_ref()))
    }
}

struct LastRead {
    contents: Vec<Vec<u8>>,
    refused: Option<String>,
}

impl InternalTls {
    /// Loads the files; fails if they do not make a working configuration (a key that is not
    /// the certificate's, a CA file with no certificate).
    pub fn load(files: TlsFiles) -> Result<Self, TlsError> {
        let contents = read(&files)?;
        let configs = configs(&files, &contents)?;
        Ok(InternalTls {
            files,
            current: RwLock::new(configs),
            last: Mutex::new(LastRead {
                contents,
                refused: None,
            }),
            open: Arc::default(),
        })
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// Reads the files again and, if they changed and load, uses them for new connections.
    pub fn reload(&self) -> Reload {
        let mut last = lock(&self.last);
        let loaded = read(&self.files).and_then(|contents| {
            if contents == last.contents {
                return Ok(None);
            }
            configs(&self.files, &contents).map(|c| Some((contents, c)))
        });
        match loaded {
            Ok(None) if last.refused.is_none() => Reload::Unchanged,
            Ok(None) => Reload::Refused {
                error: last.refused.clone().unwrap_or_default(),
                new: false,
            },
            Ok(Some((contents, mut configs))) => {
                {
                    let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
                    configs.generation = current.generation + 1;
                    *current = configs.clone();
                }
                last.contents = contents;
                last.refused = None;
                drop(last);
                let closed = self.open.close_revoked(|peer| configs.revoke(peer));
                Reload::Loaded { closed }
            }
            Err(e) => {
                let error = e.to_string();
                let new = last.refused.as_deref() != Some(error.as_str());
                last.refused = Some(error.clone());
                // Read again next time, even if the files go back to what is in use.
                last.contents.clear();
                Reload::Refused { error, new }
            }
        }
    }

    fn configs(&self) -> Configs {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// When the certificate in use stops being valid (Unix seconds).
    pub fn expires(&self) -> Option<i64> {
        self.configs().expires
    }

    /// The server side of a new connection.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.configs().acceptor
    }

    /// Watches a connection made with the files of load `generation` whose peer presented
    /// `peer`: closed when a list loaded later revokes it (at once if one already has).
    fn track(&self, peer: Option<Peer>, generation: u64) -> Option<revocable::Tracked> {
        Some(self.open.track(peer?, |peer| {
            let now = self.configs();
            now.generation != generation && now.revoke(peer)
        }))
    }

    /// How many open connections are watched for revocation.
    pub fn watched(&self) -> usize {
        self.open.len()
    }

    /// The client side of a new connection.
    pub fn connector(&self) -> TlsConnector {
        self.configs().connector
    }

    /// A channel to `endpoint` (`http://host:port`; the scheme is not read) whose connections
    /// are made over TLS with the files in use when each is made, checking that the node holds
    /// a certificate for `host`. Connects lazily, as `Endpoint::connect_lazy`.
    pub fn channel(self: &Arc<Self>, endpoint: &Endpoint) -> Channel {
        endpoint.connect_with_connector_lazy(Connector {
            tls: Arc::clone(self),
        })
    }

    /// Accepted connections on `listener`, each handshake run in a task of its own (a slow or
    /// hostile peer holds up no other); connections whose handshake fails are closed and
    /// logged. Ends when the receiving side is dropped.
    pub fn incoming(
        self: &Arc<Self>,
        listener: TcpListener,
    ) -> tokio_stream::wrappers::ReceiverStream<
        io::Result<Revocable<tokio_rustls::server::TlsStream<TcpStream>>>,
    > {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let tls = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    () = tx.closed() => return,
                };
                let (tcp, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let configs = tls.configs();
                let tx = tx.clone();
                let tls = Arc::clone(&tls);
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, configs.acceptor.accept(tcp))
                        .await
                    {
                        Ok(Ok(s)) => {
                            let peer = s.get_ref().1.peer_certificates().and_then(Peer::client);
                            let tracked = tls.track(peer, configs.generation);
                            let _ = tx.send(Ok(Revocable::new(s, tracked))).await;
                        }
                        Ok(Err(e)) => {
                            tracing::warn!(%peer, error = %e, "internal TLS handshake refused");
                            metrics::counter!("strata_internal_tls_handshakes_refused_total")
                                .increment(1);
                        }
                        Err(_) => tracing::debug!(%peer, "internal TLS handshake timed out"),
                    }
                });
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }
}

/// Dials a node and makes the TLS handshake; what a TLS [`Channel`] reconnects with.
#[derive(Clone)]
struct Connector {
    tls: Arc<InternalTls>,
}

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Revocable<tokio_rustls::client::TlsStream<TcpStream>>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = Arc::clone(&self.tls);
        let configs = tls.configs();
        Box::pin(async move {
            let invalid =
                |why: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{uri}: {why}"));
            let host = uri.host().ok_or_else(|| invalid("no host"))?;
            // An IPv6 literal comes bracketed.
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri.port_u16().ok_or_else(|| invalid("no port"))?;
            let name =
                ServerName::try_from(host.clone()).map_err(|_| invalid("not a server name"))?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let stream = configs.connector.connect(name.clone(), tcp).await?;
            let peer = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| Peer::server(chain, name));
            let tracked = tls.track(peer, configs.generation);
            Ok(TokioIo::new(Revocable::new(stream, tracked)))
        })
    }
}

/// Reads `tls`'s files again every `every` (never if zero) and reports what it found in the
/// log and in metrics; ends once `tls` is dropped.
pub fn watch(tls: &Arc<InternalTls>, every: Duration) {
    let expiry = metrics::gauge!("strata_internal_tls_certificate_expiration_timestamp_seconds");
    let failing = metrics::gauge!("strata_internal_tls_reload_failing");
    failing.set(0.0);
    if let Some(at) = tls.expires() {
        expiry.set(at as f64);
    }
    reread_every(
        tls,
        every,
        |tls| (tls.reload(), tls.expires()),
        move |(outcome, expires)| match outcome {
            Reload::Unchanged => {}
            Reload::Loaded { closed } => {
                tracing::info!(expires, "internal TLS files reloaded");
                metrics::counter!("strata_internal_tls_reloads_total", "result" => "loaded")
                    .increment(1);
                if closed > 0 {
                    tracing::warn!(
                        closed,
                        "internal connections closed: their peers' certificates were revoked"
                    );
                    metrics::counter!("strata_internal_tls_connections_revoked_total")
                        .increment(closed as u64);
                }
                if let Some(at) = expires {
                    expiry.set(at as f64);
                }
                failing.set(0.0);
            }
            Reload::Refused { error, new } => {
                if new {
                    tracing::warn!(%error, "internal TLS files not reloaded: the last good ones stay in use");
                    metrics::counter!("strata_internal_tls_reloads_total", "result" => "refused")
                        .increment(1);
                }
                failing.set(1.0);
            }
        },
    );
}

/// Every `every` (never if zero), runs `read` on `target` off the runtime's threads (it reads
/// files, which may block on a slow volume) and hands what it answers to `report`; ends once
/// `target` is dropped. What both the client port's TLS and internal TLS reload with.
pub fn reread_every<T, R>(
    target: &Arc<T>,
    every: Duration,
    read: impl Fn(&T) -> R + Send + Sync + 'static,
    mut report: impl FnMut(R) + Send + 'static,
) where
    T: Send + Sync + 'static,
    R: Send + 'static,
{
    if every.is_zero() {
        return;
    }
    let target = Arc::downgrade(target);
    let read = Arc::new(read);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(target) = target.upgrade() else {
                return;
            };
            let read = Arc::clone(&read);
            let Ok(found) = tokio::task::spawn_blocking(move || read(&target)).await else {
                return;
            };
            report(found);
        }
    });
}

/// CA, certificate, key and revocation lists (if named), as read.
fn read(files: &TlsFiles) -> Result<Vec<Vec<u8>>, TlsError> {
    [&files.ca, &files.cert, &files.key]
        .into_iter()
        .chain(files.crl.as_ref())
        .map(|path| {
            std::fs::read(path).map_err(|source| TlsError::Io {
                path: path.clone(),
                source,
            })
        })
        .collect()
}

/// Both sides' configurations, from `contents` as [`read`] answers them.
fn configs(files: &TlsFiles, contents: &[Vec<u8>]) -> Result<Configs, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certificates(&files.ca, &contents[0])? {
        roots.add(c)?;
    }
    let roots = Arc::new(roots);
    let chain = certificates(&files.cert, &contents[1])?;
    let key = PrivateKeyDer::from_pem_slice(&contents[2]).map_err(|source| TlsError::Pem {
        path: files.key.clone(),
        source,
    })?;
    let expires = chain.iter().filter_map(|c| not_after(c)).min();
    let crls: Vec<CertificateRevocationListDer<'static>> = match (&files.crl, contents.get(3)) {
        (Some(path), Some(pem)) => pem_all(path, pem, TlsError::NoCrl)?,
        _ => Vec::new(),
    };
    // Only the peer's own certificate is looked up in the lists (the CA's is not: the lists
    // are the CA's own).
    let clients = rustls::server::WebPkiClientVerifier::builder(Arc::clone(&roots))
        .with_crls(crls.clone())
        .only_check_end_entity_revocation()
        .build()?;
    if let (Some(path), false, Some(own)) = (&files.crl, crls.is_empty(), chain.first()) {
        crl_of_the_ca(&clients, own, &chain[1..], path)?;
    }
    // Refuses a key that is not the certificate's.
    let mut server = rustls::ServerConfig::builder()
        .with_client_cert_verifier(Arc::clone(&clients))
        .with_single_cert(chain.clone(), key.clone_key())?;
    server.alpn_protocols = vec![b"h2".to_vec()];
    let servers = rustls::client::WebPkiServerVerifier::builder(roots)
        .with_crls(crls)
        .only_check_end_entity_revocation()
        .build()?;
    let mut client = rustls::ClientConfig::builder()
        .with_webpki_verifier(Arc::clone(&servers))
        .with_client_auth_cert(chain, key)?;
    client.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Configs {
        acceptor: TlsAcceptor::from(Arc::new(server)),
        connector: TlsConnector::from(Arc::new(client)),
        clients,
        servers,
        generation: 0,
        expires,
    })
}

/// Refuses revocation lists that are not the internal CA's, by checking this process's own
/// certificate with them as a peer would: a certificate is checked against its own CA's list
/// and refused when it has none, so a list from another CA (a staging CA's, a CA regenerated
/// with the same name) would refuse every new connection of the deployment once loaded. Such a
/// list is refused like a file that does not parse: at start the process says why, at a reload
/// the last good files go on. Any other outcome (this certificate revoked or expired, or not
/// of the CA) is not the list's to judge and is left to the peers.
fn crl_of_the_ca(
    clients: &Arc<dyn ClientCertVerifier>,
    own: &CertificateDer<'static>,
    intermediates: &[CertificateDer<'static>],
    path: &Path,
) -> Result<(), TlsError> {
    use rustls::{CertificateError, Error};
    match clients.verify_client_cert(own, intermediates, rustls::pki_types::UnixTime::now()) {
        Err(e @ Error::InvalidCertificate(CertificateError::UnknownRevocationStatus))
        | Err(e @ Error::InvalidCertRevocationList(_)) => Err(TlsError::CrlNotOfCa {
            path: path.to_path_buf(),
            why: e.to_string(),
        }),
        _ => Ok(()),
    }
}

/// The name the compactor's internal certificate is valid for (a DNS subject alternative
/// name): with internal TLS the journal's `Trim` answers only it and the journal nodes.
pub const COMPACTOR_NAME: &str = "strata-compactor";

/// Whether the DER certificate `der` is valid for `host` (a DNS name or an IP address), as a
/// server's certificate for that name would be checked: the test for a journal node's
/// certificate (the Raft and admin services answer only certificates valid for a member's
/// host).
pub fn valid_for(der: &CertificateDer<'_>, host: &str) -> bool {
    let Ok(cert) = webpki::EndEntityCert::try_from(der) else {
        return false;
    };
    let Ok(name) = ServerName::try_from(host) else {
        return false;
    };
    cert.verify_is_valid_for_subject_name(&name).is_ok()
}

/// The host of a node's address (`host:port`, `http://host:port`, `[::1]:port`).
pub fn host_of(addr: &str) -> &str {
    let addr = addr.split_once("://").map_or(addr, |(_, a)| a);
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Every certificate in `pem` (read from `path`); an error if there is none.
pub fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    pem_all(path, pem, TlsError::NoCertificate)
}

/// Every PEM item of type `T` in `pem` (read from `path`); `none` is the error if there is
/// none.
fn pem_all<T: PemObject>(
    path: &Path,
    pem: &[u8],
    none: fn(PathBuf) -> TlsError,
) -> Result<Vec<T>, TlsError> {
    pem_items(
        path,
        pem,
        |path, source| TlsError::Pem { path, source },
        none,
    )
}

/// Every PEM item of type `T` in `pem` (read from `path`), with the caller's errors: `bad` for
/// PEM that does not parse, `none` if there is no item (shared with the frontend's client
/// port, whose errors are its own).
pub fn pem_items<T: PemObject, E>(
    path: &Path,
    pem: &[u8],
    bad: fn(PathBuf, rustls::pki_types::pem::Error) -> E,
    none: fn(PathBuf) -> E,
) -> Result<Vec<T>, E> {
    let items = T::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| bad(path.into(), source))?;
    if items.is_empty() {
        return Err(none(path.into()));
    }
    Ok(items)
}

/// The fields of a certificate's `tbsCertificate` that are read here, by their place after the
/// optional version.
#[derive(Clone, Copy)]
pub enum TbsField {
    Validity = 3,
    Subject = 4,
    PublicKey = 5,
}

/// A field of a DER certificate's `tbsCertificate`: its tag and contents.
pub fn tbs_field(der: &[u8], field: TbsField) -> Option<(u8, &[u8])> {
    // Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL, serial,
    // signature, issuer, validity, subject, ... }, ... }
    let (_, cert, _) = tlv(der)?;
    let (_, mut tbs, _) = tlv(cert)?;
    let mut fields = Vec::with_capacity(7);
    while fields.len() < 7 && !tbs.is_empty() {
        let (tag, value, rest) = tlv(tbs)?;
        fields.push((tag, value));
        tbs = rest;
    }
    let explicit_version = fields.first()?.0 == 0xa0;
    fields
        .get(field as usize + usize::from(explicit_version))
        .copied()
}

/// The issuer of a DER revocation list: the contents of its `Name`, comparable with a
/// certificate's subject ([`TbsField::Subject`]).
pub fn crl_issuer(der: &[u8]) -> Option<&[u8]> {
    // CertificateList ::= SEQUENCE { tbsCertList SEQUENCE { version INTEGER OPTIONAL,
    // signature AlgorithmIdentifier, issuer Name, ... }, ... }
    let (_, list, _) = tlv(der)?;
    let (_, mut tbs, _) = tlv(list)?;
    let (tag, _, rest) = tlv(tbs)?;
    if tag == 0x02 {
        tbs = rest;
    }
    let (_, _, rest) = tlv(tbs)?;
    let (tag, issuer, _) = tlv(rest)?;
    (tag == 0x30).then_some(issuer)
}

/// Whether the DER certificate or revocation list `signed` carries a valid signature of the
/// key of the DER certificate `issuer` (by an algorithm of the process's crypto provider).
pub fn signed_by(signed: &[u8], issuer: &[u8]) -> bool {
    let Some((message, algorithm, signature)) = signed_parts(signed) else {
        return false;
    };
    let Some((key_algorithm, key)) = public_key(issuer) else {
        return false;
    };
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
    provider
        .signature_verification_algorithms
        .all
        .iter()
        .any(|a| {
            a.signature_alg_id().as_ref() == algorithm
                && a.public_key_alg_id().as_ref() == key_algorithm
                && a.verify_signature(key, message, signature).is_ok()
        })
}

/// A signed DER object's parts (X.509's `SEQUENCE { tbs, signatureAlgorithm, signature }`):
/// the signed bytes (`tbs` whole), the algorithm identifier's contents and the signature.
fn signed_parts(der: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let (_, body, _) = tlv(der)?;
    let (_, _, after_tbs) = tlv(body)?;
    let tbs = &body[..body.len() - after_tbs.len()];
    let (tag, algorithm, rest) = tlv(after_tbs)?;
    let (bits, signature, _) = tlv(rest)?;
    let (&unused, signature) = signature.split_first()?;
    (tag == 0x30 && bits == 0x03 && unused == 0).then_some((tbs, algorithm, signature))
}

/// A DER certificate's public key: its algorithm identifier's contents and the key's bits.
fn public_key(der: &[u8]) -> Option<(&[u8], &[u8])> {
    // SubjectPublicKeyInfo ::= SEQUENCE { algorithm AlgorithmIdentifier, subjectPublicKey
    // BIT STRING }
    let (tag, spki) = tbs_field(der, TbsField::PublicKey)?;
    let (alg_tag, algorithm, rest) = tlv(spki)?;
    let (bits, key, _) = tlv(rest)?;
    let (&unused, key) = key.split_first()?;
    (tag == 0x30 && alg_tag == 0x30 && bits == 0x03 && unused == 0).then_some((algorithm, key))
}

/// When a DER certificate stops being valid (its `notAfter`), in Unix seconds.
pub fn not_after(der: &[u8]) -> Option<i64> {
    // Validity ::= SEQUENCE { notBefore Time, notAfter Time }
    let (tag, validity) = tbs_field(der, TbsField::Validity)?;
    if tag != 0x30 {
        return None;
    }
    let (_, _, rest) = tlv(validity)?;
    let (tag, time, _) = tlv(rest)?;
    let text = std::str::from_utf8(time).ok()?;
    // UTCTime YYMMDDHHMMSSZ (years 1950-2049, RFC 5280) or GeneralizedTime YYYYMMDDHHMMSSZ.
    let (year, rest) = match tag {
        0x17 => {
            let yy: u32 = text.get(..2)?.parse().ok()?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, text.get(2..)?)
        }
        0x18 => (text.get(..4)?.parse().ok()?, text.get(4..)?),
        _ => return None,
    };
    if rest.len() != 11 || !rest.ends_with('Z') || !rest[..10].bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let p = |i: usize| &rest[i..i + 2];
    let rfc3339 = format!("{year:04}-{}-{}T{}:{}:{}Z", p(0), p(2), p(4), p(6), p(8));
    let at = humantime::parse_rfc3339(&rfc3339).ok()?;
    i64::try_from(at.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs()).ok()
}

/// One DER element at the start of `input`: its tag, its contents and what follows it.
pub fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use strata_tests::certs::{Ca, Issued};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Writes `ca` and a loopback certificate of it as `<name>-ca.pem`, `<name>.pem` and
    /// `<name>.key` in `dir`.
    fn write(ca: &Ca, dir: &Path, name: &str) -> TlsFiles {
        let [ca, cert, key] = ca.write_with(&ca.peer(&["127.0.0.1"]), dir, name);
        TlsFiles {
            ca,
            cert,
            key,
            crl: None,
        }
    }

    /// Copies `from`'s contents over `to`'s files (a rotation).
    fn copy(from: &TlsFiles, to: &TlsFiles) {
        for (f, t) in [
            (&from.ca, &to.ca),
            (&from.cert, &to.cert),
            (&from.key, &to.key),
        ] {
            std::fs::copy(f, t).unwrap();
        }
    }

    /// One handshake of `client` with `server` over loopback, and a byte echoed: whether it
    /// went through.
    async fn handshake(server: &InternalTls, client: &InternalTls) -> bool {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = server.acceptor();
        let served = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut s = acceptor.accept(tcp).await.ok()?;
            let mut b = [0u8; 1];
            s.read_exact(&mut b).await.ok()?;
            s.write_all(&b).await.ok()?;
            s.flush().await.ok()
        });
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let echoed = async {
            let mut s = client.connector().connect(name, tcp).await.ok()?;
            s.write_all(b"x").await.ok()?;
            s.flush().await.ok()?;
            let mut b = [0u8; 1];
            s.read_exact(&mut b).await.ok()?;
            (b == *b"x").then_some(())
        }
        .await;
        let served = served.await.unwrap();
        echoed.is_some() && served.is_some()
    }

    #[tokio::test]
    async fn peers_of_one_ca_connect_and_others_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new();
        let a = InternalTls::load(write(&ca, dir.path(), "a")).unwrap();
        let b = InternalTls::load(write(&ca, dir.path(), "b")).unwrap();
        let stranger = InternalTls::load(write(&Ca::new(), dir.path(), "s")).unwrap();
        assert!(handshake(&a, &b).await);
        assert!(handshake(&b, &a).await);
        assert!(
            !handshake(&a, &stranger).await,
            "a stranger's client is served"
        );
        assert!(
            !handshake(&stranger, &a).await,
            "a stranger is trusted as a server"
        );
        assert!(a.expires().is_some_and(|at| at > 1_700_000_000));
    }

    #[tokio::test]
    async fn a_rotation_is_used_by_new_connections_and_half_of_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let old = Ca::new();
        let new = Ca::new();
        let server_files = write(&old, dir.path(), "server");
        let server = InternalTls::load(server_files.clone()).unwrap();
        let client = InternalTls::load(write(&new, dir.path(), "client")).unwrap();
        assert_eq!(server.reload(), Reload::Unchanged);
        assert!(!handshake(&server, &client).await);

        // Half a rotation: the new CA with the old certificate and key. The server's own
        // chain does not matter to rustls here, but a key that is not the certificate's does.
        std::fs::copy(&write(&new, dir.path(), "next").key, &server_files.key).unwrap();
        let Reload::Refused { error, new: true } = server.reload() else {
            panic!("a key that is not the certificate's is loaded");
        };
        assert!(error.contains("key"), "{error}");
        assert!(
            matches!(server.reload(), Reload::Refused { new: false, .. }),
            "the same refusal is reported as new twice"
        );
        assert!(
            !handshake(&server, &client).await,
            "half a rotation is served"
        );

        // The rotation completes: new connections are made with the new files.
        copy(&write(&new, dir.path(), "next"), &server_files);
        assert_eq!(server.reload(), Reload::Loaded { closed: 0 });
        assert!(handshake(&server, &client).await);
        assert_eq!(server.reload(), Reload::Unchanged);
    }

    /// `ca`'s certificate `issued` written as `name` in `dir`, with the revocation lists
    /// `crl`, loaded.
    fn load_with(
        ca: &Ca,
        issued: &Issued,
        dir: &Path,
        name: &str,
        crl: Option<&Path>,
    ) -> InternalTls {
        let [ca, cert, key] = ca.write_with(issued, dir, name);
        let crl = crl.map(Path::to_path_buf);
        InternalTls::load(TlsFiles { ca, cert, key, crl }).unwrap()
    }

    /// A list's issuer reads as its CA's subject, and its signature verifies with that CA's key
    /// only: not with another CA's of the same name, nor once a byte of it changed.
    #[test]
    fn a_lists_issuer_and_signature_are_read() {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let der = |pem: &str| {
            CertificateRevocationListDer::from_pem_slice(pem.as_bytes())
                .unwrap()
                .to_vec()
        };
        let cert = |pem: &str| {
            CertificateDer::from_pem_slice(pem.as_bytes())
                .unwrap()
                .to_vec()
        };
        let (ca, same_name, other_name) = (Ca::new(), Ca::new(), Ca::named("another CA"));
        let list = der(&ca.crl(&[&ca.peer(&["127.0.0.1"])]));
        let ca_der = cert(&ca.cert_pem);
        let subject = |c: &[u8]| tbs_field(c, TbsField::Subject).unwrap().1.to_vec();
        assert_eq!(crl_issuer(&list).unwrap(), subject(&ca_der));
        assert_eq!(
            crl_issuer(&list).unwrap(),
            subject(&cert(&same_name.cert_pem))
        );
        assert_ne!(
            crl_issuer(&list).unwrap(),
            subject(&cert(&other_name.cert_pem))
        );
        assert!(signed_by(&list, &ca_der));
        assert!(!signed_by(&list, &cert(&same_name.cert_pem)));
        assert!(!signed_by(&list, &cert(&other_name.cert_pem)));
        let mut changed = list.clone();
        let at = changed.len() / 2;
        changed[at] ^= 1;
        assert!(!signed_by(&changed, &ca_der));
        // A certificate is a signed object too.
        let peer = cert(&ca.peer(&["127.0.0.1"]).cert_pem);
        assert!(signed_by(&peer, &ca_der) && !signed_by(&peer, &cert(&same_name.cert_pem)));
        assert_eq!(crl_issuer(b"not DER"), None);
        assert!(!signed_by(b"not DER", &ca_der));
    }

    /// A list of another CA would refuse every certificate of the deployment once loaded
    /// (each is checked against its own CA's list, and has none): refused at start, and at a
    /// reload the last good list goes on, whether the other CA has another name or only
    /// another key. A list of the CA that revokes this process's own certificate is the CA's.
    #[tokio::test]
    async fn a_revocation_list_of_another_ca_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new();
        let (node, frontend) = (ca.peer(&["127.0.0.1"]), ca.peer(&["127.0.0.1"]));
        let [ca_file, cert, key] = ca.write_with(&node, dir.path(), "node");
        let crl = dir.path().join("crl.pem");
        let files = TlsFiles {
            ca: ca_file,
            cert,
            key,
            crl: Some(crl.clone()),
        };
        let same_name = Ca::new();
        let other_name = Ca::named("another CA");
        for other in [&same_name, &other_name] {
            std::fs::write(&crl, other.crl(&[])).unwrap();
            let refused = InternalTls::load(files.clone()).err();
            assert!(
                matches!(&refused, Some(TlsError::CrlNotOfCa { path, .. }) if *path == crl),
                "{refused:?}"
            );
        }
        std::fs::write(&crl, ca.crl(&[&node])).unwrap();
        InternalTls::load(files.clone()).expect("the CA's list revoking this process's own");

        std::fs::write(&crl, ca.crl(&[])).unwrap();
        let server = InternalTls::load(files).unwrap();
        let client = load_with(&ca, &frontend, dir.path(), "frontend", None);
        assert!(handshake(&server, &client).await);
        std::fs::write(&crl, same_name.crl(&[])).unwrap();
        let Reload::Refused { error, new: true } = server.reload() else {
            panic!("another CA's list is loaded");
        };
        assert!(
            error.contains("not a revocation list of the internal CA"),
            "{error}"
        );
        assert!(
            handshake(&server, &client).await,
            "the last good list goes on serving"
        );
    }

    #[tokio::test]
    async fn a_revoked_certificate_opens_no_connection_in_either_role() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new();
        let crl = dir.path().join("crl.pem");
        std::fs::write(&crl, ca.crl(&[])).unwrap();
        let (node, frontend) = (ca.peer(&["127.0.0.1"]), ca.peer(&["127.0.0.1"]));
        let server = load_with(&ca, &node, dir.path(), "node", Some(&crl));
        let client = load_with(&ca, &frontend, dir.path(), "frontend", None);
        assert!(handshake(&server, &client).await, "an empty list revokes");

        // The frontend's certificate revoked: the node refuses it once it reads the list.
        std::fs::write(&crl, ca.crl(&[&frontend])).unwrap();
        assert_eq!(server.reload(), Reload::Loaded { closed: 0 });
        assert!(
            !handshake(&server, &client).await,
            "a revoked client is served"
        );
        // A list that does not load is refused; the last good one stays in force.
        std::fs::write(&crl, "not a list").unwrap();
        assert!(matches!(server.reload(), Reload::Refused { new: true, .. }));
        assert!(!handshake(&server, &client).await);
        // A list revoking the node instead: the frontend is served again, but a dialler
        // reading that list does not trust the node as a server.
        std::fs::write(&crl, ca.crl(&[&node])).unwrap();
        assert_eq!(server.reload(), Reload::Loaded { closed: 0 });
        assert!(
            handshake(&server, &client).await,
            "the frontend is refused once no list revokes it"
        );
        let dialler = load_with(&ca, &frontend, dir.path(), "dialler", Some(&crl));
        assert!(
            !handshake(&server, &dialler).await,
            "a revoked node is trusted as a server"
        );
        // A file holding no list at all.
        std::fs::write(&crl, "").unwrap();
        let empty = TlsFiles {
            crl: Some(crl.clone()),
            ..server.files().clone()
        };
        assert!(matches!(InternalTls::load(empty), Err(TlsError::NoCrl(p)) if p == crl));
    }

    /// Reads one byte echoed back after writing one: whether the connection still works.
    async fn echoes<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(s: &mut S) -> bool {
        let mut b = [0u8; 1];
        s.write_all(b"x").await.is_ok()
            && s.flush().await.is_ok()
            && tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut b))
                .await
                .is_ok_and(|r| r.is_ok())
    }

    /// Echoes every byte of every connection `incoming` yields, until each closes.
    fn echo_server<S>(
        mut incoming: impl tokio_stream::Stream<Item = io::Result<S>> + Unpin + Send + 'static,
    ) where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        tokio::spawn(async move {
            while let Some(Ok(mut s)) = tokio_stream::StreamExt::next(&mut incoming).await {
                tokio::spawn(async move {
                    let mut b = [0u8; 1];
                    while s.read_exact(&mut b).await.is_ok() {
                        if s.write_all(&b).await.is_err() || s.flush().await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
    }

    /// `--internal-crl-file` loaded while connections are open: a journal node closes the
    /// connections of the clients it revokes (and only those), a dialler its connections to a
    /// node it revokes; a connection whose handshake came before the list but which is
    /// registered after it is closed as it is registered.
    #[tokio::test]
    async fn a_list_loaded_later_closes_the_open_connections_it_revokes() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new();
        let crl = dir.path().join("crl.pem");
        std::fs::write(&crl, ca.crl(&[])).unwrap();
        let (node, frontend, compactor) = (
            ca.peer(&["127.0.0.1"]),
            ca.peer(&["127.0.0.1"]),
            ca.peer(&["127.0.0.1"]),
        );
        let server = Arc::new(load_with(&ca, &node, dir.path(), "node", Some(&crl)));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        echo_server(server.incoming(listener));
        // Two clients dial the node through the connector channels use.
        let dial = |tls: InternalTls| {
            let mut connector = Connector { tls: Arc::new(tls) };
            let uri: Uri = format!("http://{addr}").parse().unwrap();
            async move {
                let io = tower_service::Service::call(&mut connector, uri)
                    .await
                    .unwrap();
                (connector.tls, io.into_inner())
            }
        };
        let (_, mut from_frontend) =
            dial(load_with(&ca, &frontend, dir.path(), "frontend", None)).await;
        let (dialler, mut from_compactor) = dial(load_with(
            &ca,
            &compactor,
            dir.path(),
            "compactor",
            Some(&crl),
        ))
        .await;
        assert!(echoes(&mut from_frontend).await && echoes(&mut from_compactor).await);
        assert_eq!(server.watched(), 2, "the node watches both clients");
        assert_eq!(dialler.watched(), 1, "the compactor watches the node");

        // The node loads a list revoking the frontend: that connection is closed, the
        // compactor's goes on.
        std::fs::write(&crl, ca.crl(&[&frontend])).unwrap();
        assert_eq!(server.reload(), Reload::Loaded { closed: 1 });
        assert!(
            !echoes(&mut from_frontend).await,
            "a revoked client is still served"
        );
        assert!(echoes(&mut from_compactor).await);
        // The dialler loads the same list: it revokes nobody the dialler reached.
        assert_eq!(dialler.reload(), Reload::Loaded { closed: 0 });
        assert!(echoes(&mut from_compactor).await);

        // A list revoking the node: the dialler closes its connection to it.
        std::fs::write(&crl, ca.crl(&[&node])).unwrap();
        assert_eq!(dialler.reload(), Reload::Loaded { closed: 1 });
        let mut b = [0u8; 1];
        let e = from_compactor.read_exact(&mut b).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted, "{e}");
        drop((from_frontend, from_compactor));
        for _ in 0..100 {
            if server.watched() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            server.watched(),
            0,
            "closed connections are no longer watched"
        );
        assert_eq!(dialler.watched(), 0);

        // A handshake made with the files of load 0, registered after the node loaded a list
        // revoking its peer: closed as it is registered. One made with the current files is
        // left to the next reload.
        let chain = [CertificateDer::from(node.der.clone())];
        let late = dialler.track(
            Peer::server(&chain, ServerName::try_from("127.0.0.1").unwrap()),
            0,
        );
        assert!(late.is_some_and(|t| t.closed()));
        let current = dialler.configs().generation;
        assert!(current > 0);
        let now = dialler.track(
            Peer::server(&chain, ServerName::try_from("127.0.0.1").unwrap()),
            current,
        );
        assert!(now.is_some_and(|t| !t.closed()));
        assert!(
            dialler.track(None, 0).is_none(),
            "no certificate, nothing to watch"
        );
    }

    #[test]
    fn load_fails_on_files_that_cannot_work() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new();
        let good = write(&ca, dir.path(), "good");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let no_ca = TlsFiles {
            ca: empty.clone(),
            ..good.clone()
        };
        assert!(matches!(
            InternalTls::load(no_ca),
            Err(TlsError::NoCertificate(p)) if p == empty
        ));
        let missing = TlsFiles {
            key: dir.path().join("missing.key"),
            ..good.clone()
        };
        assert!(matches!(
            InternalTls::load(missing),
            Err(TlsError::Io { .. })
        ));
        let other_key = TlsFiles {
            key: write(&ca, dir.path(), "other").key,
            ..good
        };
        assert!(InternalTls::load(other_key).is_err());
    }
}
