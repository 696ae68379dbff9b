//! Throwaway TLS certificates for `stoker bench transport --tls` and the TLS tests: a fresh CA
//! and a server certificate it signs, written as PEM files. Never for production use: the CA's
//! key is discarded, and the names are whatever the caller asks for.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

use super::{Error, Result};

/// The PEM files [`write_test_certificates`] wrote.
#[derive(Debug, Clone)]
pub struct TestCertificates {
    /// The CA's certificate (what clients trust with `--tls-ca`).
    pub ca: PathBuf,
    /// The server certificate, signed by the CA (`--tls-cert`).
    pub cert: PathBuf,
    /// The server certificate's private key (`--tls-key`).
    pub key: PathBuf,
}

fn failed(error: rcgen::Error) -> Error {
    Error::Failed(format!("cannot generate a test certificate: {error}"))
}

/// Writes a new CA and a server certificate for `names` (DNS names or IP addresses) signed by
/// it into `dir`, as `ca.pem`, `server.pem` and `server.key`.
pub fn write_test_certificates(dir: &Path, names: &[&str]) -> Result<TestCertificates> {
    let ca_key = KeyPair::generate().map_err(failed)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // A name of its own: two test CAs must not look like one CA to a verifier.
    let name = format!(
        "stoker test CA {:016x}",
        stoker_rpc::transport::random_u64()
    );
    ca_params.distinguished_name.push(DnType::CommonName, name);
    let ca = ca_params.self_signed(&ca_key).map_err(failed)?;
    let issuer = Issuer::new(ca_params, &ca_key);
    let server_key = KeyPair::generate().map_err(failed)?;
    let names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
    let mut server_params = CertificateParams::new(names).map_err(failed)?;
    server_params
        .distinguished_name
        .push(DnType::CommonName, "stoker test daemon");
    let server = server_params
        .signed_by(&server_key, &issuer)
        .map_err(failed)?;
    let written = TestCertificates {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
    };
    std::fs::write(&written.ca, ca.pem())?;
    std::fs::write(&written.cert, server.pem())?;
    std::fs::write(&written.key, server_key.serialize_pem())?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoker_rpc::security::{ClientSecurity, ServerSecurity};

    #[test]
    fn the_files_load_as_server_and_client_settings() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let pki =
            write_test_certificates(dir.path(), &["localhost", "127.0.0.1"]).expect("certificates");
        let server = ServerSecurity::new(Vec::new(), Some((&pki.cert, &pki.key)))
            .expect("the server takes them");
        assert!(server.serves_tls());
        let client = ClientSecurity::new(None, Some(&pki.ca), None).expect("the client takes it");
        assert!(client.uses_tls());
    }
}
