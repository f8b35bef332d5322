//! TLS from sluice to a backend.

use std::sync::Arc;

use rustls::pki_types::ServerName;

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
            builder.dangerous().with_custom_certificate_verifier(Arc::new(crate::tls::NoVerify)).with_no_client_auth()
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
