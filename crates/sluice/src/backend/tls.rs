//! TLS from sluice to a backend: when to use it ("auto", "on", "off") and how (verified
//! against `tls_ca` when one is configured).

use std::sync::Arc;

use rustls::pki_types::ServerName;
use sluice_proto::consts::cap;
use sluice_proto::handshake::Greeting;

use crate::config::{Address, BackendConfig, BackendTls as Mode};
use crate::error::{Error, Result};

pub struct BackendTls {
    pub mode: Mode,
    /// The client side of the TLS handshake (None when the mode is "off").
    connector: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
}

impl BackendTls {
    pub fn new(c: &BackendConfig, mode: Mode, address: &Address) -> std::result::Result<BackendTls, super::SetupError> {
        use super::SetupError;
        if mode == Mode::Off {
            return Ok(BackendTls { mode, connector: None });
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(SetupError::Tls)?;
        let config = match &c.tls_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in crate::config::load_certs(ca.get_ref())? {
                    roots.add(cert).map_err(|e| SetupError::Ca { path: ca.get_ref().clone(), source: e })?;
                }
                builder.with_root_certificates(roots).with_no_client_auth()
            }
            // "on" needs an explicit tls_skip_verify here (the configuration is checked for it);
            // "auto" encrypts opportunistically: backends mostly have self-signed certificates.
            None if mode == Mode::On && !c.tls_skip_verify => {
                return Err(crate::config::InvalidValue("backends.tls = \"on\" needs tls_ca (or tls_skip_verify = true)".into()).into());
            }
            None => builder.dangerous().with_custom_certificate_verifier(Arc::new(crate::net::tls::NoVerify)).with_no_client_auth(),
        };
        let host = match address {
            Address::Tcp(a) => a.ip().to_string(),
            Address::Unix(_) => "localhost".to_string(),
        };
        let server_name = ServerName::try_from(host).map_err(|e| crate::config::InvalidValue(e.to_string()))?;
        Ok(BackendTls { mode, connector: Some((Arc::new(config), server_name)) })
    }

    /// Whether a session wants TLS to this backend, given whether its client's connection to
    /// sluice is TLS. Pooled connections are kept apart by it, so that a TLS client does not
    /// take a connection made for a plain one, nor the reverse.
    pub fn wanted(&self, client_tls: bool) -> bool {
        match self.mode {
            Mode::On => true,
            Mode::Off => false,
            Mode::Auto => client_tls,
        }
    }

    /// Whether a new connection whose greeting is `g` switches to TLS. With "on", a backend
    /// that does not offer TLS cannot be used (a retry-safe error: nothing was sent yet).
    pub fn decide(&self, client_tls: bool, g: &Greeting) -> Result<bool> {
        let offered = g.capabilities & cap::SSL != 0;
        if self.mode == Mode::On && !offered {
            return Err(Error::connect("TLS to this backend is \"on\" but it does not offer TLS"));
        }
        Ok(offered && self.wanted(client_tls))
    }

    pub(super) fn connector(&self) -> Option<&(Arc<rustls::ClientConfig>, ServerName<'static>)> {
        self.connector.as_ref()
    }
}
