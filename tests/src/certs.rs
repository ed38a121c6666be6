//! Test certificates: a CA made for one test, and server and client certificates it signs, as
//! PEM files an etcd client and `strata frontend` read (`--cacert`, `--cert-file`, ...).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, RevocationReason,
    RevokedCertParams, SerialNumber,
};

/// A certificate and its key.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
    /// Its serial number (what a revocation list names).
    pub serial: u64,
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
    /// A CA named "strata test CA", as every test's is: two of them differ only by their keys.
    pub fn new() -> Self {
        Self::named("strata test CA")
    }

    /// A CA with the common name `name`.
    pub fn named(name: &str) -> Self {
        let key = KeyPair::generate().expect("a CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
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

    /// Writes `issued` as `<name>.pem` and `<name>.key` and this CA as `<name>-ca.pem` into
    /// `dir`: the CA, certificate and key files internal TLS loads, in that order.
    pub fn write_with(&self, issued: &Issued, dir: &Path, name: &str) -> [PathBuf; 3] {
        let (cert, key) = issued.write(dir, name);
        let ca = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&ca, &self.cert_pem).expect("write the CA");
        [ca, cert, key]
    }

    /// A server certificate for `names` (DNS names, wildcards or IP addresses).
    pub fn server(&self, names: &[&str]) -> Issued {
        self.issue(
            names,
            "strata test server",
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A certificate revocation list of this CA that revokes `revoked` (PEM, as etcd's
    /// `--client-crl-file` reads it).
    pub fn crl(&self, revoked: &[&Issued]) -> String {
        let params = CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2020, 1, 1),
            next_update: rcgen::date_time_ymd(2099, 1, 1),
            crl_number: SerialNumber::from(rand::random::<u64>() >> 1),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|i| RevokedCertParams {
                    serial_number: SerialNumber::from(i.serial),
                    revocation_time: rcgen::date_time_ymd(2020, 1, 1),
                    reason_code: Some(RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        params
            .signed_by(&self.issuer)
            .expect("a signed revocation list")
            .pem()
            .expect("PEM")
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

    /// A certificate for Strata's own processes (`--internal-cert-file`): presented as a
    /// server's to those that dial it at `names` and as a client's to those it dials.
    pub fn peer(&self, names: &[&str]) -> Issued {
        self.issue_with(
            names,
            "strata internal",
            ExtendedKeyUsagePurpose::ServerAuth,
            |p| {
                p.extended_key_usages = vec![
                    ExtendedKeyUsagePurpose::ServerAuth,
                    ExtendedKeyUsagePurpose::ClientAuth,
                ]
            },
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
        // Positive and never zero, as DER integers of serial numbers must be.
        let serial = (rand::random::<u64>() >> 1) | 1;
        params.serial_number = Some(SerialNumber::from(serial));
        adjust(&mut params);
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("a signed certificate");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
            serial,
        }
    }
}
