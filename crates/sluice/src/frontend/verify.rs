//! Users mode, client side: checking a client's reply for a configured user, with the auth
//! switch to mysql_native_password, and caching_sha2_password's fast path and full
//! authentication (clear password over TLS or a Unix socket, or RSA-encrypted otherwise).
//! Used at login and for COM_CHANGE_USER.

use std::future::Future;
use std::io;

use sluice_proto::auth;
use sluice_proto::handshake::write_auth_switch;

use crate::auth::{Check, RsaKey, User, Users};
use crate::backend::conn::Answer;
use crate::error::{Error, Side};

/// Packet I/O with the client during an authentication exchange.
pub(super) trait AuthIo {
    fn send(&mut self, payload: &[u8], seq: u8) -> impl Future<Output = io::Result<()>>;
    fn recv(&mut self) -> impl Future<Output = io::Result<(u8, Vec<u8>)>>;
    /// Whether a clear password may cross this connection (TLS or a Unix socket).
    fn secure(&self) -> bool;
}

/// The client answers a backend's authentication requests through sluice (passthrough login,
/// COM_CHANGE_USER): each of the backend's packets goes to the client, each reply back.
pub(super) struct Relay<'c, C: AuthIo> {
    pub client: &'c mut C,
    /// The sequence id of the next packet on the client's side.
    pub seq: u8,
    /// The client lacks CLIENT_SESSION_TRACK: the OK is rewritten without it (the value: the
    /// backend is MariaDB).
    pub strip_track: Option<bool>,
}

impl<C: AuthIo> Answer for Relay<'_, C> {
    async fn seen(&mut self, p: &mut Vec<u8>) -> crate::error::Result<()> {
        if let (Some(0), Some(mariadb)) = (p.first(), self.strip_track)
            && let Some(stripped) = sluice_proto::basic::strip_session_track(p, mariadb)
        {
            *p = stripped;
        }
        self.client.send(p, self.seq).await.map_err(|e| Error::io(Side::Client, "login", e))?;
        self.seq = self.seq.wrapping_add(1);
        Ok(())
    }

    async fn answer(&mut self, _request: &[u8]) -> crate::error::Result<Vec<u8>> {
        let (_, reply) = self.client.recv().await.map_err(|e| Error::io(Side::Client, "login", e))?;
        self.seq = self.seq.wrapping_add(1);
        Ok(reply)
    }
}

/// The outcome of a client's authentication.
pub(super) enum Verdict {
    Accepted(std::sync::Arc<User>),
    Denied { used_password: bool },
}

/// Checks the reply a client computed with `plugin` over `scramble` for user `name`, asking for
/// more (a switch, full authentication) as needed. `seq` is the sequence id of the next packet
/// sluice sends; the returned one is the id for the final OK or ERR.
#[allow(clippy::too_many_arguments)] // the login's inputs, each used once
pub(super) async fn verify<C: AuthIo>(
    io: &mut C,
    mut seq: u8,
    users: &Users,
    rsa: Option<&RsaKey>,
    name: &str,
    plugin: &[u8],
    reply: &[u8],
    scramble: &[u8],
) -> io::Result<(Verdict, u8)> {
    let Some(user) = users.get(name) else {
        crate::auth::phantom_check(scramble, reply);
        return Ok((Verdict::Denied { used_password: !reply.is_empty() }, seq));
    };
    let denied = |reply: &[u8]| Verdict::Denied { used_password: !reply.is_empty() };
    match user.check(plugin, scramble, reply) {
        Check::Ok => {
            if plugin == auth::CACHING_SHA2 {
                // Fast authentication succeeded; the OK follows.
                io.send(&[0x01, 0x03], seq).await?;
                seq = seq.wrapping_add(1);
            }
            Ok((Verdict::Accepted(user), seq))
        }
        Check::Denied => Ok((denied(reply), seq)),
        Check::SwitchToNative => {
            let mut p = Vec::new();
            write_auth_switch(&mut p, auth::NATIVE, scramble);
            io.send(&p, seq).await?;
            let (s, r) = io.recv().await?;
            let ok = matches!(user.check(auth::NATIVE, scramble, &r), Check::Ok);
            Ok((if ok { Verdict::Accepted(user) } else { denied(&r) }, s.wrapping_add(1)))
        }
        Check::FullAuth => {
            io.send(&[0x01, 0x04], seq).await?;
            let (mut s, mut r) = io.recv().await?;
            if !io.secure() {
                let Some(rsa) = rsa else { return Ok((denied(&r), s.wrapping_add(1))) };
                if r.as_slice() == [0x02] {
                    let mut p = vec![0x01];
                    p.extend_from_slice(&rsa.pem);
                    io.send(&p, s.wrapping_add(1)).await?;
                    (s, r) = io.recv().await?;
                }
                r = match rsa.decrypt(&r) {
                    Some(x) => auth::xor_with_scramble(&x, scramble),
                    None => return Ok((denied(&r), s.wrapping_add(1))),
                };
            }
            let password = r.strip_suffix(&[0]).unwrap_or(&r);
            let ok = user.check_clear(password);
            Ok((if ok { Verdict::Accepted(user) } else { denied(&r) }, s.wrapping_add(1)))
        }
    }
}
