//! The benchmark's gRPC connections: `--conns` HTTP/2 connections spread round-robin over the
//! endpoints, clients spread round-robin over the connections, and the per-request metadata
//! (tenant header, deadline) every workload attaches.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::watch_client::WatchClient;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::BenchError;

/// How long to wait for one connection to be established.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response a benchmark client decodes (tonic's default is 4 MiB; a wide range or a
/// large watch batch may exceed it).
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;
/// Most connections a run may open.
pub const MAX_CONNS: usize = 10_000;
/// Metadata header naming the tenant where the operator allows it (DESIGN, tenant resolution).
pub const TENANT_HEADER: &str = "x-strata-tenant";

/// `127.0.0.1:2379` -> `http://127.0.0.1:2379` (`https://` when the run uses TLS); URLs with
/// a scheme are kept.
pub fn endpoint_url_for(endpoint: &str, tls: bool) -> String {
    if endpoint.contains("://") {
        endpoint.to_string()
    } else if tls {
        format!("https://{endpoint}")
    } else {
        format!("http://{endpoint}")
    }
}

/// TLS for the run's connections (`--cacert`, `--cert`, `--key`, as etcdctl's): the same CA
/// and client certificate for the raw HTTP/2 connections and for tonic's.
#[derive(Clone)]
pub struct ClientTls {
    pub rustls: Arc<rustls::ClientConfig>,
    pub tonic: ClientTlsConfig,
}

impl ClientTls {
    /// Trusts the CA certificates in `cacert`; presents `cert` (with `key`) if given.
    pub fn from_files(
        cacert: &Path,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Self, BenchError> {
        let bad = |p: &Path, e: &dyn std::fmt::Display| {
            BenchError::InvalidArgs(format!("{}: {e}", p.display()))
        };
        let read = |p: &Path| std::fs::read(p).map_err(|e| bad(p, &e));
        let ca = read(cacert)?;
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(&ca) {
            let c = c.map_err(|e| bad(cacert, &e))?;
            roots.add(c).map_err(|e| bad(cacert, &e))?;
        }
        if roots.is_empty() {
            return Err(bad(cacert, &"no CA certificate"));
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        let mut tonic = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca));
        let mut config = match (cert, key) {
            (Some(cert), Some(key)) => {
                let (cert_pem, key_pem) = (read(cert)?, read(key)?);
                let chain = CertificateDer::pem_slice_iter(&cert_pem)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| bad(cert, &e))?;
                let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| bad(key, &e))?;
                tonic = tonic.identity(Identity::from_pem(&cert_pem, &key_pem));
                builder
                    .with_client_auth_cert(chain, private)
                    .map_err(|e| bad(cert, &e))?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => {
                return Err(BenchError::InvalidArgs(
                    "--cert and --key go together".into(),
                ));
            }
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Self {
            rustls: Arc::new(config),
            tonic,
        })
    }
}

/// Refuses an empty endpoint list and a connection count outside `1..=MAX_CONNS` (both pools).
pub fn check_pool_args(endpoints: &[String], conns: usize) -> Result<(), BenchError> {
    if endpoints.is_empty() {
        return Err(BenchError::InvalidArgs("--endpoints is empty".into()));
    }
    if conns == 0 || conns > MAX_CONNS {
        return Err(BenchError::InvalidArgs(format!(
            "--conns must be in 1..={MAX_CONNS}"
        )));
    }
    Ok(())
}

/// The index in `--endpoints` that client number `client` talks to, with `conns` connections
/// over `endpoints` endpoints (client `i` uses connection `i % conns`, connection `j` endpoint
/// `j % endpoints`).
pub fn endpoint_index(client: usize, conns: usize, endpoints: usize) -> usize {
    (client % conns.max(1)) % endpoints.max(1)
}

/// The connections of one run.
#[derive(Clone)]
pub struct Pool {
    channels: Vec<Channel>,
    /// How many endpoints the connections go to (connection `i` to endpoint `i % endpoints`).
    endpoints: usize,
    /// Metadata every request carries: the tenant header, an auth token (`--user`).
    headers: Vec<(&'static str, MetadataValue<tonic::metadata::Ascii>)>,
    request_timeout: Duration,
}

impl Pool {
    /// Opens `conns` connections, connection `i` to `endpoints[i % endpoints.len()]`, over
    /// TLS with `tls`.
    pub async fn connect(
        endpoints: &[String],
        conns: usize,
        headers: &[(&'static str, String)],
        request_timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<Self, BenchError> {
        check_pool_args(endpoints, conns)?;
        let headers = headers
            .iter()
            .map(|(name, value)| {
                let v = value.parse().map_err(|_| {
                    BenchError::InvalidArgs(format!("{name} {value:?} is not ASCII"))
                })?;
                Ok((*name, v))
            })
            .collect::<Result<Vec<_>, BenchError>>()?;
        let mut channels = Vec::with_capacity(conns);
        for i in 0..conns {
            let url = endpoint_url_for(&endpoints[i % endpoints.len()], tls.is_some());
            let mut endpoint = Endpoint::from_shared(url.clone())
                .map_err(|e| BenchError::InvalidArgs(format!("endpoint {url}: {e}")))?
                .tcp_nodelay(true)
                .initial_connection_window_size(api::HTTP2_CONNECTION_WINDOW)
                .connect_timeout(CONNECT_TIMEOUT);
            if let Some(tls) = tls {
                endpoint = endpoint.tls_config(tls.tonic.clone()).map_err(|source| {
                    BenchError::Connect {
                        url: url.clone(),
                        source,
                    }
                })?;
            }
            let channel = endpoint
                .connect()
                .await
                .map_err(|source| BenchError::Connect { url, source })?;
            channels.push(channel);
        }
        Ok(Self {
            channels,
            endpoints: endpoints.len(),
            headers,
            request_timeout,
        })
    }

    pub fn conns(&self) -> usize {
        self.channels.len()
    }

    /// How many endpoints the connections go to.
    pub fn endpoints(&self) -> usize {
        self.endpoints
    }

    /// The index (in `--endpoints`) of the endpoint client number `client` talks to.
    pub fn endpoint_of(&self, client: usize) -> usize {
        endpoint_index(client, self.channels.len(), self.endpoints)
    }

    fn channel(&self, client: usize) -> Channel {
        self.channels[client % self.channels.len()].clone()
    }

    /// A KV client for client number `client` (its connection is `client % conns`).
    pub fn kv(&self, client: usize) -> KvClient<Channel> {
        KvClient::new(self.channel(client)).max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    /// An Auth client on connection `client % conns`.
    pub fn auth(&self, client: usize) -> api::etcdserverpb::auth_client::AuthClient<Channel> {
        api::etcdserverpb::auth_client::AuthClient::new(self.channel(client))
    }

    /// A Watch client on connection `client % conns`.
    pub fn watch(&self, client: usize) -> WatchClient<Channel> {
        WatchClient::new(self.channel(client)).max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    /// A unary request with the run's deadline and headers.
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut req = self.stream_request(message);
        req.set_timeout(self.request_timeout);
        req
    }

    /// A streaming request (no deadline) with the run's headers.
    pub fn stream_request<T>(&self, message: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(message);
        for (name, value) in &self.headers {
            req.metadata_mut().insert(*name, value.clone());
        }
        req
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            endpoint_url_for("127.0.0.1:2379", false),
            "http://127.0.0.1:2379"
        );
        assert_eq!(endpoint_url_for("http://a:1", false), "http://a:1");
        assert_eq!(endpoint_url_for("https://a:1", false), "https://a:1");
        assert_eq!(endpoint_url_for("a:1", true), "https://a:1");
        assert_eq!(endpoint_url_for("http://a:1", true), "http://a:1");
    }

    #[test]
    fn a_client_talks_to_its_connection_s_endpoint() {
        // 4 connections over 2 endpoints: connections 0 and 2 go to the first, 1 and 3 to the
        // second; client 5 uses connection 1.
        let got: Vec<usize> = (0..8).map(|c| endpoint_index(c, 4, 2)).collect();
        assert_eq!(got, [0, 1, 0, 1, 0, 1, 0, 1]);
        // 4 connections over 3 endpoints: connection 3 wraps to the first endpoint.
        let got: Vec<usize> = (0..4).map(|c| endpoint_index(c, 4, 3)).collect();
        assert_eq!(got, [0, 1, 2, 0]);
        assert_eq!(endpoint_index(7, 1, 3), 0);
    }

    #[tokio::test]
    async fn bad_arguments_are_refused_before_connecting() {
        let t = Duration::from_secs(1);
        assert!(matches!(
            Pool::connect(&[], 1, &[], t, None).await,
            Err(BenchError::InvalidArgs(_))
        ));
        let eps = vec!["127.0.0.1:1".to_string()];
        assert!(matches!(
            Pool::connect(&eps, 0, &[], t, None).await,
            Err(BenchError::InvalidArgs(_))
        ));
        assert!(matches!(
            Pool::connect(&eps, 1, &[(TENANT_HEADER, "bad\nname".into())], t, None).await,
            Err(BenchError::InvalidArgs(_))
        ));
    }
}
