//! Test certificates: a CA made for one test, and server and client certificates it signs, as
//! PEM files an etcd client and `strata frontend` read (`--cacert`, `--cert-file`, ...).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};

/// A certificate and its key.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
}

impl Issued {
    /// Writes `<name>.pem` and `<name>.key` into `dir`; answers their paths.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{name}.pem"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, &self.cert_pem).expect("write a certificate");
        std::fs::write(&key, &self.key_pem).expect("write a key");
        (cert, key)
    }
}

/// A certificate authority for one test.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pub cert_pem: String,
}

impl Default for Ca {
    fn default() -> Self {
        Self::new()
    }
}

impl Ca {
    pub fn new() -> Self {
        let key = KeyPair::generate().expect("a CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "strata test CA");
        let cert = params.self_signed(&key).expect("a self-signed CA");
        Self {
            issuer: Issuer::new(params, key),
            cert_pem: cert.pem(),
        }
    }

    /// Writes the CA's certificate as `ca.pem` into `dir`.
    pub fn write(&self, dir: &Path) -> PathBuf {
        let path = dir.join("ca.pem");
        std::fs::write(&path, &self.cert_pem).expect("write the CA");
        path
    }

    /// A server certificate for `names` (DNS names, wildcards or IP addresses).
    pub fn server(&self, names: &[&str]) -> Issued {
        self.issue(
            names,
            "strata test server",
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A server certificate for `names` that expires at the start of `year`-`month`-`day`
    /// (UTC).
    pub fn server_until(&self, names: &[&str], (year, month, day): (i32, u8, u8)) -> Issued {
        self.issue_with(
            names,
            "strata test server",
            ExtendedKeyUsagePurpose::ServerAuth,
            |p| p.not_after = rcgen::date_time_ymd(year, month, day),
        )
    }

    /// A client certificate with common name `user` (etcd's user of a certificate) and `names`
    /// as DNS subject alternative names.
    pub fn client(&self, user: &str, names: &[&str]) -> Issued {
        self.issue(names, user, ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(&self, names: &[&str], common_name: &str, usage: ExtendedKeyUsagePurpose) -> Issued {
        self.issue_with(names, common_name, usage, |_| {})
    }

    fn issue_with(
        &self,
        names: &[&str],
        common_name: &str,
        usage: ExtendedKeyUsagePurpose,
        adjust: impl FnOnce(&mut CertificateParams),
    ) -> Issued {
        let key = KeyPair::generate().expect("a key");
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("certificate parameters");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![usage];
        adjust(&mut params);
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("a signed certificate");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }
}
