//! `strata dev --tls` and `strata dev cert`: the local deployment's own certificate authority,
//! so that etcdctl (which cannot set the `x-strata-tenant` header) reaches any tenant of the
//! catalogue the way a managed cluster's clients do: over TLS, with a client certificate whose
//! DNS name is `<tenant>.tenants.localhost` (docs/design/tenants.md, T3).
//!
//! The CA's key and the server's certificate are made on the first `--tls` start and kept in
//! `<data-dir>/tls/`, so certificates issued once stay valid across restarts. This is a
//! laptop's CA: its key sits unencrypted next to the data, readable by its owner only.
//!
//! A second CA, in `<data-dir>/tls/internal/`, signs the one certificate the journal nodes,
//! the frontend and the compactor present to each other (internal TLS, `--internal-*`): no
//! client certificate `strata dev cert` issues reaches the journal.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Sub-directory of the data directory holding the CA, the server's certificate and the
/// client certificates `strata dev cert` issues.
pub const TLS_DIR: &str = "tls";
/// `--tenant-domain` of a dev frontend: a client certificate for `team-a.tenants.localhost`
/// names tenant `team-a`.
pub const TENANT_DOMAIN: &str = "tenants.localhost";
const CA_CERT: &str = "ca.pem";
const CA_KEY: &str = "ca.key";
/// `<stem>.pem` and `<stem>.key`: a server's certificate, a client's.
const SERVER_STEM: &str = "server";
const CLIENT_STEM: &str = "client";
const COMPACTOR_STEM: &str = "compactor";
/// The CA's subject: a certificate it signs names this issuer.
const CA_COMMON_NAME: &str = "strata dev CA";
/// Sub-directory of [`TLS_DIR`] holding the internal CA and its certificate.
const INTERNAL_DIR: &str = "internal";
const INTERNAL_CA_COMMON_NAME: &str = "strata dev internal CA";
/// The names the dev frontend answers to.
const SERVER_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The files a TLS dev frontend is started with.
pub struct ServerFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The deployment's CA and the frontend's certificate, made if missing.
pub fn ensure(data_dir: &Path) -> anyhow::Result<ServerFiles> {
    let mut names: Vec<String> = SERVER_NAMES.iter().map(|n| n.to_string()).collect();
    names.push(format!("*.{TENANT_DOMAIN}"));
    ensure_in(
        &data_dir.join(TLS_DIR),
        CA_COMMON_NAME,
        names,
        SERVER_STEM,
        "strata dev frontend",
        vec![ExtendedKeyUsagePurpose::ServerAuth],
    )
}

/// The internal CA and the journal nodes' certificate (presented as a server's and as a
/// client's to their peers), made if missing.
pub fn ensure_internal(data_dir: &Path) -> anyhow::Result<ServerFiles> {
    ensure_in(
        &data_dir.join(TLS_DIR).join(INTERNAL_DIR),
        INTERNAL_CA_COMMON_NAME,
        SERVER_NAMES.iter().map(|n| n.to_string()).collect(),
        SERVER_STEM,
        "strata dev journal",
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    )
}

/// The internal CA and the certificate the frontend dials the journal with, made if missing:
/// valid for no host, so the journal answers it neither its Raft and admin services nor Trim.
pub fn ensure_internal_client(data_dir: &Path) -> anyhow::Result<ServerFiles> {
    ensure_in(
        &data_dir.join(TLS_DIR).join(INTERNAL_DIR),
        INTERNAL_CA_COMMON_NAME,
        Vec::new(),
        CLIENT_STEM,
        "strata dev journal client",
        vec![ExtendedKeyUsagePurpose::ClientAuth],
    )
}

/// The internal CA and the compactor's certificate, made if missing: valid for the name
/// `strata-compactor` (so the journal answers it `Trim`) and for no host (so not its Raft and
/// admin services).
pub fn ensure_internal_compactor(data_dir: &Path) -> anyhow::Result<ServerFiles> {
    ensure_in(
        &data_dir.join(TLS_DIR).join(INTERNAL_DIR),
        INTERNAL_CA_COMMON_NAME,
        vec![journal::tls::COMPACTOR_NAME.to_string()],
        COMPACTOR_STEM,
        "strata dev compactor",
        vec![ExtendedKeyUsagePurpose::ClientAuth],
    )
}

/// A CA named `ca_name` in `dir` and a certificate of it for `names` in `<stem>.pem` and
/// `<stem>.key`, made if missing.
fn ensure_in(
    dir: &Path,
    ca_name: &str,
    names: Vec<String>,
    stem: &str,
    common_name: &str,
    usages: Vec<ExtendedKeyUsagePurpose>,
) -> anyhow::Result<ServerFiles> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let files = ServerFiles {
        ca: dir.join(CA_CERT),
        cert: dir.join(format!("{stem}.pem")),
        key: dir.join(format!("{stem}.key")),
    };
    if !dir.join(CA_KEY).exists() {
        let key = KeyPair::generate().context("generate the CA's key")?;
        let cert = ca_params(ca_name)
            .self_signed(&key)
            .context("self-sign the CA")?;
        write_private(&dir.join(CA_KEY), &key.serialize_pem())?;
        write_public(&files.ca, &cert.pem())?;
        // A new CA: the old certificates (if any) are not signed by it.
        for old in [SERVER_STEM, CLIENT_STEM, COMPACTOR_STEM] {
            let _ = std::fs::remove_file(dir.join(format!("{old}.pem")));
        }
    }
    if !files.cert.exists() {
        let (cert, key) = issue(dir, ca_name, names, common_name, usages)?;
        write_private(&files.key, &key)?;
        write_public(&files.cert, &cert)?;
    }
    Ok(files)
}

/// Flags of `strata dev cert`.
#[derive(clap::Args, Debug)]
pub struct CertArgs {
    /// The tenant the certificate names (its DNS name is `<tenant>.tenants.localhost`).
    tenant: String,
    /// The data directory of the `strata dev --tls` deployment whose CA signs it.
    #[arg(long, default_value = ".strata-dev")]
    data_dir: PathBuf,
    /// Where to write `<tenant>.pem` and `<tenant>.key` (default: the deployment's `tls/`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The certificate's common name: etcd's user of a certificate, when the frontend runs
    /// with `--client-cert-auth`.
    #[arg(long, default_value = "strata-dev-client")]
    common_name: String,
}

/// `strata dev cert`: a client certificate for one tenant, signed by the deployment's CA.
pub fn cert(args: CertArgs) -> anyhow::Result<()> {
    if !api::tenant::valid_name(&args.tenant) {
        bail!(
            "{:?} is not a tenant name (a DNS label: lower-case letters, digits and '-')",
            args.tenant
        );
    }
    // The deployment's CAs (and their certificates), made now if `strata dev --tls` has not
    // run in this data directory yet: it finds and uses them when it does.
    ensure(&args.data_dir)?;
    ensure_internal(&args.data_dir)?;
    ensure_internal_client(&args.data_dir)?;
    ensure_internal_compactor(&args.data_dir)?;
    let dir = args.data_dir.join(TLS_DIR);
    let out = args.out.unwrap_or_else(|| dir.clone());
    std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
    let (cert, key) = issue(
        &dir,
        CA_COMMON_NAME,
        vec![format!("{}.{TENANT_DOMAIN}", args.tenant)],
        &args.common_name,
        vec![ExtendedKeyUsagePurpose::ClientAuth],
    )?;
    let (cert_file, key_file) = (
        out.join(format!("{}.pem", args.tenant)),
        out.join(format!("{}.key", args.tenant)),
    );
    write_private(&key_file, &key)?;
    write_public(&cert_file, &cert)?;
    println!("{}", cert_file.display());
    println!("{}", key_file.display());
    eprintln!(
        "etcdctl --endpoints=https://127.0.0.1:2379 --cacert={} --cert={} --key={} get '' --prefix   # tenant {}",
        dir.join(CA_CERT).display(),
        cert_file.display(),
        key_file.display(),
        args.tenant
    );
    Ok(())
}

/// The CA's parameters: the same at every call, so that the CA made once signs again from its
/// key alone (its certificate is not parsed back).
fn ca_params(ca_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.distinguished_name.push(DnType::CommonName, ca_name);
    params
}

/// A certificate for `names` signed by the CA named `ca_name` in `dir`: (certificate PEM, key
/// PEM).
fn issue(
    dir: &Path,
    ca_name: &str,
    names: Vec<String>,
    common_name: &str,
    usages: Vec<ExtendedKeyUsagePurpose>,
) -> anyhow::Result<(String, String)> {
    let ca_key_file = dir.join(CA_KEY);
    let ca_key = std::fs::read_to_string(&ca_key_file)
        .with_context(|| format!("read {}", ca_key_file.display()))?;
    let ca_key =
        KeyPair::from_pem(&ca_key).with_context(|| format!("parse {}", ca_key_file.display()))?;
    let issuer = Issuer::new(ca_params(ca_name), ca_key);
    let key = KeyPair::generate().context("generate a key")?;
    let mut params = CertificateParams::new(names).context("certificate names")?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.extended_key_usages = usages;
    let cert = params
        .signed_by(&key, &issuer)
        .context("sign the certificate")?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Writes a key, readable by its owner only.
fn write_private(path: &Path, pem: &str) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    f.write_all(pem.as_bytes())?;
    f.sync_all()?;
    Ok(())
}

fn write_public(path: &Path, pem: &str) -> anyhow::Result<()> {
    std::fs::write(path, pem).with_context(|| format!("write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn der(path: &Path) -> rustls::pki_types::CertificateDer<'static> {
        use rustls::pki_types::pem::PemObject;
        let pem = std::fs::read(path).unwrap();
        rustls::pki_types::CertificateDer::from_pem_slice(&pem).unwrap()
    }

    /// `strata dev cert team-a` for the deployment in `data`: the directory it wrote to.
    fn issue_team_a(data: &Path) -> PathBuf {
        let out = data.join("issued");
        cert(CertArgs {
            tenant: "team-a".into(),
            data_dir: data.to_path_buf(),
            out: Some(out.clone()),
            common_name: "app".into(),
        })
        .unwrap();
        out
    }

    /// The CA made at the first start signs later certificates from its key alone: a client
    /// certificate issued afterwards verifies against the kept `ca.pem`, and names its tenant
    /// under the dev domain; a second `ensure` keeps everything.
    #[test]
    fn certificates_issued_later_chain_to_the_kept_ca() {
        use rustls::client::danger::ServerCertVerifier;
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let data = tempfile::tempdir().unwrap();
        let first = ensure(data.path()).unwrap();
        let ca_pem = std::fs::read(&first.ca).unwrap();
        let server_pem = std::fs::read(&first.cert).unwrap();
        let again = ensure(data.path()).unwrap();
        assert_eq!(std::fs::read(&again.ca).unwrap(), ca_pem, "the CA is kept");
        assert_eq!(std::fs::read(&again.cert).unwrap(), server_pem);

        let out = issue_team_a(data.path());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der(&first.ca)).unwrap();
        let verifier =
            rustls::server::WebPkiClientVerifier::builder(std::sync::Arc::new(roots.clone()))
                .build()
                .unwrap();
        let client = der(&out.join("team-a.pem"));
        verifier
            .verify_client_cert(&client, &[], rustls::pki_types::UnixTime::now())
            .expect("the client certificate chains to the kept CA");
        let server = rustls::client::WebPkiServerVerifier::builder(std::sync::Arc::new(roots))
            .build()
            .unwrap();
        for name in ["localhost", "127.0.0.1", "team-a.tenants.localhost"] {
            server
                .verify_server_cert(
                    &der(&first.cert),
                    &[],
                    &rustls::pki_types::ServerName::try_from(name).unwrap(),
                    &[],
                    rustls::pki_types::UnixTime::now(),
                )
                .unwrap_or_else(|e| panic!("the server certificate is not valid for {name}: {e}"));
        }
        let key_mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(out.join("team-a.key"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(key_mode & 0o077, 0, "a key readable by others");

        let bad = cert(CertArgs {
            tenant: "Not_A_Label".into(),
            data_dir: data.path().to_path_buf(),
            out: None,
            common_name: "app".into(),
        });
        assert!(bad.is_err());
        // A data directory with no CA yet: the CA and the server certificate are made then,
        // and `strata dev --tls` on that directory uses them (`ensure` keeps what exists).
        let elsewhere = data.path().join("elsewhere");
        cert(CertArgs {
            tenant: "team-a".into(),
            data_dir: elsewhere.clone(),
            out: None,
            common_name: "app".into(),
        })
        .unwrap();
        let made = std::fs::read(elsewhere.join(TLS_DIR).join(CA_CERT)).unwrap();
        let files = ensure(&elsewhere).unwrap();
        assert_eq!(std::fs::read(&files.ca).unwrap(), made, "the CA is kept");
        assert!(files.cert.exists() && files.key.exists());
    }

    /// The internal CA is another CA: its certificate serves and dials as 127.0.0.1, is kept
    /// across starts, and a tenant's certificate does not chain to it.
    #[test]
    fn the_internal_certificate_is_of_a_ca_no_tenant_certificate_chains_to() {
        use rustls::client::danger::ServerCertVerifier;
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let data = tempfile::tempdir().unwrap();
        let internal = ensure_internal(data.path()).unwrap();
        let again = ensure_internal(data.path()).unwrap();
        assert_eq!(
            std::fs::read(&again.cert).unwrap(),
            std::fs::read(&internal.cert).unwrap(),
            "the internal certificate is kept"
        );
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der(&internal.ca)).unwrap();
        let roots = std::sync::Arc::new(roots);
        let clients = rustls::server::WebPkiClientVerifier::builder(roots.clone())
            .build()
            .unwrap();
        clients
            .verify_client_cert(
                &der(&internal.cert),
                &[],
                rustls::pki_types::UnixTime::now(),
            )
            .expect("the internal certificate dials");
        rustls::client::WebPkiServerVerifier::builder(roots)
            .build()
            .unwrap()
            .verify_server_cert(
                &der(&internal.cert),
                &[],
                &rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap(),
                &[],
                rustls::pki_types::UnixTime::now(),
            )
            .expect("the internal certificate serves 127.0.0.1");
        // The frontend's and the compactor's: a client of the same CA, valid for no host, so
        // the journal answers them its Raft and admin services to neither.
        let client = ensure_internal_client(data.path()).unwrap();
        assert_eq!(client.ca, internal.ca);
        clients
            .verify_client_cert(&der(&client.cert), &[], rustls::pki_types::UnixTime::now())
            .expect("the internal client certificate dials");
        assert!(journal::tls::valid_for(&der(&internal.cert), "127.0.0.1"));
        assert!(!journal::tls::valid_for(&der(&client.cert), "127.0.0.1"));
        assert!(!journal::tls::valid_for(&der(&client.cert), "localhost"));
        assert!(!journal::tls::valid_for(
            &der(&client.cert),
            journal::tls::COMPACTOR_NAME
        ));
        // The compactor's: the same CA, valid for strata-compactor (the journal's Trim
        // answers it) and for no journal host.
        let compactor = ensure_internal_compactor(data.path()).unwrap();
        assert_eq!(compactor.ca, internal.ca);
        clients
            .verify_client_cert(
                &der(&compactor.cert),
                &[],
                rustls::pki_types::UnixTime::now(),
            )
            .expect("the compactor's certificate dials");
        assert!(journal::tls::valid_for(
            &der(&compactor.cert),
            journal::tls::COMPACTOR_NAME
        ));
        assert!(!journal::tls::valid_for(&der(&compactor.cert), "127.0.0.1"));
        let out = issue_team_a(data.path());
        assert!(
            clients
                .verify_client_cert(
                    &der(&out.join("team-a.pem")),
                    &[],
                    rustls::pki_types::UnixTime::now()
                )
                .is_err(),
            "a tenant's certificate chains to the internal CA"
        );
    }
}
