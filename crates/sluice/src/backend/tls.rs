//! TLS from sluice to a backend.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::config::{Address, BackendConfig};

#[derive(Clone)]
pub struct BackendTls {
    pub config: Arc<rustls::ClientConfig>,
    pub server_name: ServerName<'static>,
}

impl BackendTls {
    pub fn new(c: &BackendConfig, address: &Address) -> Result<BackendTls, String> {
        let builder = rustls::ClientConfig::builder();
        let config = if c.tls_skip_verify {
            builder.dangerous().with_custom_certificate_verifier(Arc::new(NoVerify)).with_no_client_auth()
        } else {
            let ca = c.tls_ca.as_ref().ok_or("backends.tls needs tls_ca (or tls_skip_verify = true)")?;
            let mut roots = rustls::RootCertStore::empty();
            for cert in crate::tls::load_certs(ca)? {
                roots.add(cert).map_err(|e| format!("{}: {e}", ca.display()))?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        };
        let host = match address {
            Address::Tcp(a) => a.ip().to_string(),
            Address::Unix(_) => "localhost".to_string(),
        };
        let server_name = ServerName::try_from(host).map_err(|e| e.to_string())?;
        Ok(BackendTls { config: Arc::new(config), server_name })
    }
}

/// Accepts any certificate: only for `tls_skip_verify = true`.
#[derive(Debug)]
struct NoVerify;

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(&self, _: &[u8], _: &CertificateDer<'_>, _: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(&self, _: &[u8], _: &CertificateDer<'_>, _: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        rustls::crypto::aws_lc_rs::default_provider().signature_verification_algorithms.supported_schemes()
    }
}
