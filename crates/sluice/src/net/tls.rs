//! TLS for client connections: the certificate sluice presents, from files or generated (a
//! self-signed certificate made in memory at start and replaced before it expires), and the
//! server configuration the login reads once per connection.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwapOption;
use parking_lot::Mutex;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::config::{self, load_certs, load_key};

/// The server-side TLS configuration for a certificate chain and its key (TLS 1.2 and 1.3).
fn server_config(certs: Vec<CertificateDer<'static>>, key: PrivateKeyDer<'static>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rustls)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(TlsError::CertificateKey)?;
    Ok(Arc::new(config))
}

/// Why sluice cannot present a certificate to clients.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A configured certificate or key file cannot be used (the configuration's fault).
    #[error(transparent)]
    Files(#[from] config::PemError),
    /// The certificate and key do not go together, or are not usable for TLS.
    #[error("TLS certificate/key: {0}")]
    CertificateKey(rustls::Error),
    #[error("TLS: {0}")]
    Rustls(rustls::Error),
    /// Generating a certificate failed (sluice's own fault).
    #[error("generating a self-signed certificate: {0}")]
    Generate(String),
}

/// How long a generated certificate is valid, and how long before its end a new one takes its
/// place.
#[derive(Debug, Clone, Copy)]
pub struct Lifetime {
    pub validity: Duration,
    pub renew_before: Duration,
}

const DAY: u64 = 24 * 3600;

/// Generated certificates: valid for a year, replaced when 30 days are left (a client whose
/// clock is ahead by less than that still accepts the dates).
pub const SELF_SIGNED: Lifetime = Lifetime { validity: Duration::from_secs(365 * DAY), renew_before: Duration::from_secs(30 * DAY) };

/// Generated certificates start this long before they are made (clients whose clock is behind).
const BACKDATE: Duration = Duration::from_secs(300);

/// The subject (common name) of generated certificates.
const SELF_SIGNED_NAME: &str = "sluice self-signed certificate";

/// A certificate sluice can present, and what the log says of it.
struct Certificate {
    config: Arc<rustls::ServerConfig>,
    /// SHA-256 of the leaf certificate (DER), as hex pairs separated by colons.
    fingerprint: String,
    /// End of validity, when known (generated certificates).
    not_after: Option<SystemTime>,
}

/// Where the certificate comes from.
enum Source {
    Off,
    Files(Mutex<Files>),
    SelfSigned(Lifetime),
}

/// Certificate files, and when they were last modified as sluice read them.
struct Files {
    cert: PathBuf,
    key: PathBuf,
    stamp: [Option<SystemTime>; 2],
}

impl Files {
    fn at(f: &config::TlsConfig) -> Files {
        let (cert, key) = (f.cert.get_ref().clone(), f.key.get_ref().clone());
        let stamp = [modified(&cert), modified(&key)];
        Files { cert, key, stamp }
    }
}

fn modified(p: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Reads a certificate chain and its key.
fn from_files(f: &config::TlsConfig) -> Result<Certificate, TlsError> {
    let (certs, key) = (load_certs(f.cert.get_ref())?, load_key(f.key.get_ref())?);
    let fingerprint = fingerprint(&certs[0]);
    Ok(Certificate { config: server_config(certs, key)?, fingerprint, not_after: None })
}

/// TLS for client connections: the server configuration in use (swapped whole when a generated
/// certificate is renewed; a login loads it once) and what renewing it needs.
pub struct ClientTls {
    current: ArcSwapOption<rustls::ServerConfig>,
    source: Source,
    /// The certificate in use (the control thread's renewal task alone changes it).
    in_use: Mutex<(String, Option<SystemTime>)>,
}

impl ClientTls {
    /// As configured; a generated certificate is made at `now` with the [`SELF_SIGNED`] lifetime.
    pub fn from_config(c: &config::ClientTls, now: SystemTime) -> Result<ClientTls, TlsError> {
        match c {
            config::ClientTls::Off => Ok(ClientTls::with(Source::Off, None)),
            config::ClientTls::Files(f) => {
                let files = Files::at(f);
                Ok(ClientTls::with(Source::Files(Mutex::new(files)), Some(from_files(f)?)))
            }
            config::ClientTls::SelfSigned => ClientTls::self_signed(SELF_SIGNED, now),
        }
    }

    /// A generated certificate with the given lifetime, made at `now`.
    pub fn self_signed(lifetime: Lifetime, now: SystemTime) -> Result<ClientTls, TlsError> {
        let cert = generate(now, lifetime.validity)?;
        Ok(ClientTls::with(Source::SelfSigned(lifetime), Some(cert)))
    }

    fn with(source: Source, cert: Option<Certificate>) -> ClientTls {
        let (config, in_use) = match cert {
            Some(c) => (Some(c.config), (c.fingerprint, c.not_after)),
            None => (None, (String::new(), None)),
        };
        ClientTls { current: ArcSwapOption::new(config), source, in_use: Mutex::new(in_use) }
    }

    /// The configuration for a new client connection; None when TLS is off.
    pub fn server_config(&self) -> Option<Arc<rustls::ServerConfig>> {
        self.current.load_full()
    }

    /// Replaces a generated certificate that is due at `now` (its end is `renew_before` away or
    /// less) with a new one. Returns whether it did; certificates from files stay.
    pub fn renew_if_due(&self, now: SystemTime) -> Result<bool, TlsError> {
        let Source::SelfSigned(lifetime) = self.source else { return Ok(false) };
        let mut in_use = self.in_use.lock();
        if in_use.1.is_some_and(|end| now + lifetime.renew_before < end) {
            return Ok(false);
        }
        let cert = generate(now, lifetime.validity)?;
        self.current.store(Some(cert.config));
        *in_use = (cert.fingerprint, cert.not_after);
        Ok(true)
    }

    /// Reads the certificate files of `c` (the configuration in force) again, when sluice
    /// presents certificates from files: new handshakes get them, those made keep theirs.
    /// Whether the certificate changed. Err: they cannot be used (the old ones stay).
    pub fn reload_files(&self, c: &config::ClientTls) -> Result<bool, TlsError> {
        let (Source::Files(files), config::ClientTls::Files(f)) = (&self.source, c) else { return Ok(false) };
        let mut files = files.lock();
        // (The stamp first: files that change while being read are read again; files that
        // cannot be used are not tried again until they change.)
        *files = Files::at(f);
        let cert = from_files(f)?;
        let mut in_use = self.in_use.lock();
        let changed = in_use.0 != cert.fingerprint;
        self.current.store(Some(cert.config));
        *in_use = (cert.fingerprint, None);
        Ok(changed)
    }

    /// SHA-256 of the certificate in use (empty when TLS is off).
    pub fn fingerprint(&self) -> String {
        self.in_use.lock().0.clone()
    }

    /// Whether the certificate files in use were modified since sluice read them.
    pub fn files_changed(&self) -> bool {
        let Source::Files(files) = &self.source else { return false };
        let f = files.lock();
        [modified(&f.cert), modified(&f.key)] != f.stamp
    }

    /// How often to look for a due renewal (None: nothing to renew).
    pub fn check_interval(&self) -> Option<Duration> {
        match self.source {
            Source::SelfSigned(l) => Some((l.renew_before / 4).clamp(Duration::from_secs(1), Duration::from_secs(3600))),
            _ => None,
        }
    }

    /// Says in the log which certificate client connections get (never the key).
    pub fn log_in_use(&self, what: &str) {
        let (fingerprint, not_after) = self.in_use.lock().clone();
        match &self.source {
            Source::Off => tracing::info!("client TLS is off (tls = \"off\"): clients that ask for TLS are refused"),
            Source::Files(f) => {
                let p = f.lock().cert.clone();
                tracing::info!(certificate = %p.display(), sha256 = %fingerprint, "client TLS: {what} certificate from a file")
            }
            Source::SelfSigned(_) => {
                let until = not_after.map(rfc3339).unwrap_or_default();
                tracing::info!(
                    sha256 = %fingerprint,
                    not_after = %until,
                    "client TLS: {what} self-signed certificate generated in memory (configure [tls] cert and key to use your own)"
                )
            }
        }
    }
}

/// Keeps a generated certificate renewed (a task on the control thread): looks now and then
/// whether it is due, and swaps in a new one.
pub async fn keep_renewed(tls: &ClientTls) {
    let Some(every) = tls.check_interval() else { return };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match tls.renew_if_due(SystemTime::now()) {
            Ok(true) => tls.log_in_use("renewed the"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "cannot renew the self-signed client TLS certificate; trying again later"),
        }
    }
}

/// Watches the certificate files in use (a task on the control thread): when they change on
/// disk, new handshakes get the new certificate. Files that cannot be used are logged, and the
/// certificate in use stays.
pub async fn watch_files(tls: &ClientTls, config: &config::Live) {
    if !matches!(tls.source, Source::Files(_)) {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !tls.files_changed() {
            continue;
        }
        match tls.reload_files(&config.load().tls) {
            Ok(_) => tls.log_in_use("files changed: now using the"),
            Err(e) => {
                tracing::warn!(error = %e, "the client TLS certificate files changed but cannot be used; keeping the certificate in use")
            }
        }
    }
}

/// A certificate sluice presents without being configured with one: see [`self_signed_der`].
fn generate(now: SystemTime, validity: Duration) -> Result<Certificate, TlsError> {
    let (der, key, not_after) = self_signed_der(now, validity)?;
    let fingerprint = fingerprint(&der);
    Ok(Certificate { config: server_config(vec![der], key)?, fingerprint, not_after: Some(not_after) })
}

/// A self-signed certificate for "localhost" (clients cannot verify it: no CA vouches for it),
/// valid from a little before `now` for `validity`, with a new ECDSA P-256 key. Returns the
/// certificate, its key and the end of its validity.
fn self_signed_der(now: SystemTime, validity: Duration) -> Result<(CertificateDer<'static>, PrivateKeyDer<'static>, SystemTime), TlsError> {
    let fail = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let key = rcgen::KeyPair::generate().map_err(fail)?;
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).map_err(fail)?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::CommonName, SELF_SIGNED_NAME);
    let end = unix_secs(now + validity);
    let date = |unix| datetime(unix).map_err(|e| TlsError::Generate(format!("certificate date: {e}")));
    params.not_before = date(unix_secs(now.checked_sub(BACKDATE).unwrap_or(now)))?;
    params.not_after = date(end)?;
    let cert = params.self_signed(&key).map_err(fail)?;
    let not_after = SystemTime::UNIX_EPOCH + Duration::from_secs(end.max(0) as u64);
    Ok((cert.der().clone(), PrivateKeyDer::Pkcs8(key.serialize_der().into()), not_after))
}

fn unix_secs(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

fn datetime(unix: i64) -> Result<time::OffsetDateTime, time::error::ComponentRange> {
    time::OffsetDateTime::from_unix_timestamp(unix)
}

fn rfc3339(t: SystemTime) -> String {
    match datetime(unix_secs(t)) {
        Ok(d) => format!("{}-{:02}-{:02}T{:02}:{:02}:{:02}Z", d.year(), d.month() as u8, d.day(), d.hour(), d.minute(), d.second()),
        Err(_) => String::new(),
    }
}

fn fingerprint(cert: &CertificateDer<'_>) -> String {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, cert.as_ref());
    d.as_ref().iter().map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(":")
}

/// Accepts any certificate: backends without `tls_ca` ("auto", or `tls_skip_verify = true`).
#[derive(Debug)]
pub struct NoVerify;

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
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        rustls::crypto::aws_lc_rs::default_provider().signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// X.509 UTCTime (YYMMDDHHMMSSZ) of `t`, as certificates before 2050 carry it.
    fn utc_time(t: SystemTime) -> Vec<u8> {
        let d = datetime(unix_secs(t)).unwrap();
        let s = format!("{:02}{:02}{:02}{:02}{:02}{:02}Z", d.year() % 100, d.month() as u8, d.day(), d.hour(), d.minute(), d.second());
        s.into_bytes()
    }

    #[test]
    fn a_generated_certificate_carries_the_validity_asked_for() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let (der, _, end) = self_signed_der(now, Duration::from_secs(3600)).unwrap();
        assert_eq!(end, now + Duration::from_secs(3600));
        let holds = |t| der.as_ref().windows(13).any(|w| w == &utc_time(t)[..]);
        assert!(holds(now - BACKDATE), "not before: 5 minutes before it was made");
        assert!(holds(end), "not after: the end of its validity");
        assert!(der.as_ref().windows(SELF_SIGNED_NAME.len()).any(|w| w == SELF_SIGNED_NAME.as_bytes()));
    }

    #[test]
    fn a_generated_certificate_is_renewed_only_when_its_end_is_near() {
        let lifetime = Lifetime { validity: Duration::from_secs(100), renew_before: Duration::from_secs(12) };
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let tls = ClientTls::self_signed(lifetime, t0).unwrap();
        assert_eq!(tls.check_interval(), Some(Duration::from_secs(3)));
        let first = tls.server_config().unwrap();
        assert_eq!(tls.in_use.lock().1, Some(t0 + Duration::from_secs(100)));
        // 13 s left: not due; the same configuration stays.
        assert!(!tls.renew_if_due(t0 + Duration::from_secs(87)).unwrap());
        assert!(Arc::ptr_eq(&first, &tls.server_config().unwrap()));
        // 12 s left: due; a new certificate, valid for the whole lifetime from then.
        let fingerprint = tls.in_use.lock().0.clone();
        let t1 = t0 + Duration::from_secs(88);
        assert!(tls.renew_if_due(t1).unwrap());
        let second = tls.server_config().unwrap();
        assert!(!Arc::ptr_eq(&first, &second));
        assert_ne!(tls.in_use.lock().0, fingerprint, "a new certificate (and key)");
        assert_eq!(tls.in_use.lock().1, Some(t1 + Duration::from_secs(100)));
        assert!(!tls.renew_if_due(t1 + Duration::from_secs(87)).unwrap());
        assert!(Arc::ptr_eq(&second, &tls.server_config().unwrap()));
        assert!(tls.renew_if_due(t1 + Duration::from_secs(95)).unwrap());
    }

    #[test]
    fn certificates_from_files_and_no_tls_are_never_renewed() {
        let off = ClientTls::from_config(&config::ClientTls::Off, SystemTime::now()).unwrap();
        assert!(off.server_config().is_none());
        assert_eq!(off.check_interval(), None);
        assert!(!off.renew_if_due(SystemTime::now() + Duration::from_secs(1000 * DAY)).unwrap());
    }
}
