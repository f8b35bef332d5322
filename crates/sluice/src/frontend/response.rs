//! The relay of a response: the backend's answer to one command followed header by header by
//! the response tracker and written to the client straight from the read buffer, a LOCAL
//! INFILE upload relayed the other way.

use bytes::{Buf, BytesMut};
use sluice_proto::consts::err as code;
use sluice_proto::packet::{HEADER, RequestWalker};
use sluice_proto::response::{ResponseTracker, State};

use super::client::ClientConn;
use crate::ctx::Ctx;
use crate::error::{Error, Result, Retry, Side};
use crate::net::{BUF_SIZE, LARGE_BUF_SIZE, PacketConn};
use crate::session::StateSink;
use crate::session::deadline::Watch;

/// Follows the backend's response to one command (the tracker started for it) and writes it to
/// the client as it arrives (None: a replayed statement's, read for the sink alone).
/// `replayable`: a connection lost before any of the answer was seen is said so
/// ([`Retry::Unanswered`]), and the client is told nothing yet.
pub(super) async fn relay_response(
    tracker: &mut ResponseTracker,
    backend: &mut PacketConn,
    mut client: Option<&mut ClientConn>,
    sink: &mut StateSink<'_>,
    ctx: &Ctx,
    mut watch: Watch<'_>,
    replayable: bool,
) -> Result<()> {
    // Whether a read filled the buffer: the response is large, read the rest in large pieces.
    let mut large = false;
    loop {
        let scan = tracker.scan(&backend.rbuf, sink).map_err(|e| Error::malformed(Side::Backend, e))?;
        if let Some(id) = sink.patch_stmt_id.take() {
            // The PREPARE_OK just parsed starts the buffer: give the client its own id.
            backend.rbuf[HEADER + 1..HEADER + 5].copy_from_slice(&id.to_le_bytes());
        }
        if scan.consumed > 0 {
            if let Some(c) = sink.capture.as_mut() {
                c.extend_from_slice(&backend.rbuf[..scan.consumed]);
            }
            if let Some(client) = client.as_mut() {
                // (What the socket takes at once goes without a future: the common case.)
                let bytes = &backend.rbuf[..scan.consumed];
                let writing = |e| Error::io(Side::Client, "writing response", e);
                if let Some(sent) = client.write_now(bytes).map_err(writing)? {
                    client.write_rest(bytes, sent).await.map_err(writing)?;
                }
                ctx.metrics.relay.bytes_to_clients(scan.consumed);
            }
            backend.rbuf.advance(scan.consumed);
        }
        match scan.state {
            State::Done => {
                if !backend.rbuf.is_empty() {
                    return Err(Error::backend("backend sent more than one response"));
                }
                if large {
                    // The next large response starts its reads with the whole buffer again.
                    let _ = backend.rbuf.try_reclaim(LARGE_BUF_SIZE);
                }
                return Ok(());
            }
            // The caller acts at this point of the response (`ResponseTracker::hold_at`), then
            // relays the rest.
            State::Held => return Ok(()),
            // The rare paths are boxed: their futures stay out of every session's task.
            State::LocalInfile => {
                let Some(client) = client.as_mut() else { return Err(Error::backend("a replayed statement asked for a local file")) };
                Box::pin(relay_infile(backend, client, ctx)).await?;
                tracker.after_infile();
            }
            State::Rewrite { len } => {
                // (An answer rewritten on its way is not kept whole.)
                sink.capture = None;
                Box::pin(write_rewritten(tracker, backend, client.as_deref_mut(), len)).await?;
            }
            State::Pending => {
                make_room(&mut backend.rbuf, large);
                let room = backend.rbuf.capacity() - backend.rbuf.len();
                let e = match watch.read(&mut backend.stream, &mut backend.rbuf).await {
                    Ok(0) => Err(Error::backend("the backend closed the connection in the middle of a response")),
                    Ok(n) => {
                        large |= n == room;
                        continue;
                    }
                    Err(e) => Ok(e),
                };
                let unanswered = replayable && !tracker.begun();
                return Err(Box::pin(read_failed(e, tracker, client, unanswered)).await);
            }
        }
    }
}

/// Sends the client the OK of `len` bytes that starts the buffer as the tracker rewrites it
/// (`State::Rewrite`), and skips it.
async fn write_rewritten(tracker: &ResponseTracker, backend: &mut PacketConn, client: Option<&mut ClientConn>, len: usize) -> Result<()> {
    let packet = &backend.rbuf[..len];
    let plain = tracker.rewrite_ok(&packet[HEADER..]);
    let payload = plain.as_deref().unwrap_or(&packet[HEADER..]);
    if let Some(client) = client {
        client.write_packet(payload, packet[3]).await.map_err(|e| Error::io(Side::Client, "writing response", e))?;
    }
    backend.rbuf.advance(len);
    Ok(())
}

/// Room in the read buffer for the backend's next bytes. A large response's every read has room
/// for a large piece, as a forwarder's does (the buffer's start reclaimed, not a new one, once
/// it was grown); a common one's, a quarter of the common size at least.
#[inline]
fn make_room(rbuf: &mut BytesMut, large: bool) {
    let (want, low) = if large { (LARGE_BUF_SIZE, LARGE_BUF_SIZE) } else { (BUF_SIZE, BUF_SIZE / 4) };
    if rbuf.capacity() - rbuf.len() < low {
        rbuf.reserve(want);
    }
}

/// The backend could not be read (`Err`: it closed the connection; `Ok`: the read's error).
/// A loss before anything was `answered` is said so ([`Retry::Unanswered`], the client told
/// nothing yet); otherwise the client gets an error it can show, when the response can still
/// end cleanly. (A response timeout is no loss: the statement may still run.)
async fn read_failed(
    e: std::result::Result<std::io::Error, Error>,
    tracker: &ResponseTracker,
    client: Option<&mut ClientConn>,
    unanswered: bool,
) -> Error {
    let (e, lost) = match e {
        Err(closed) => (closed, true),
        Ok(e) => {
            let lost = e.kind() != std::io::ErrorKind::TimedOut;
            (Error::io(Side::Backend, "reading response", e), lost)
        }
    };
    if unanswered && lost {
        return Error { retry: Retry::Unanswered, ..e };
    }
    if let Some(client) = client.filter(|_| tracker.at_packet_boundary()) {
        let mut p = Vec::new();
        sluice_proto::basic::err_payload(&mut p, code::SERVER_LOST, b"HY000", &format!("sluice: {}", e.message));
        let _ = client.write_packet(&p, tracker.last_seq.wrapping_add(1)).await;
    }
    e
}

/// LOCAL INFILE: the client's file arrives as packets ending with an empty one.
async fn relay_infile(backend: &mut PacketConn, client: &mut ClientConn, ctx: &Ctx) -> Result<()> {
    let mut walk = RequestWalker::until_empty();
    loop {
        let n = walk.scan(&client.rbuf);
        if n > 0 {
            backend
                .stream
                .write_within(ctx.config().proxy.response_timeout, &client.rbuf[..n])
                .await
                .map_err(|e| Error::io(Side::Backend, "forwarding file", e))?;
            ctx.metrics.relay.bytes_from_clients(n);
            client.rbuf.advance(n);
        }
        if walk.done {
            return Ok(());
        }
        match client.fill_rest().await {
            Ok(0) => {
                return Err(Error::client("client closed the connection during LOAD DATA LOCAL"));
            }
            Ok(_) => {}
            Err(e) => return Err(Error::client_read("reading file data", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A common response reads into what is left of the buffer until little is; a large one
    /// gets a large piece of room at every read, from the start of the buffer it grew (no new
    /// one), the unread bytes of a split packet moved there.
    #[test]
    fn a_large_response_reads_in_large_pieces_from_one_buffer() {
        let mut rbuf = BytesMut::with_capacity(BUF_SIZE);
        rbuf.resize(BUF_SIZE / 2, 0);
        rbuf.advance(BUF_SIZE / 2);
        make_room(&mut rbuf, false);
        assert_eq!(rbuf.capacity(), BUF_SIZE / 2);

        make_room(&mut rbuf, true);
        assert!(rbuf.capacity() >= LARGE_BUF_SIZE);
        let grown = rbuf.capacity();
        // A read left a quarter of it, and all but a split packet's first 3 bytes were relayed.
        rbuf.resize(grown - grown / 4, 7);
        rbuf.advance(grown - grown / 4 - 3);
        let at = rbuf.as_ptr();
        make_room(&mut rbuf, true);
        assert_eq!(&rbuf[..], &[7, 7, 7][..]);
        // (All of the allocation: the room before where the buffer was advanced to at first.)
        assert!(rbuf.capacity() >= grown && rbuf.as_ptr() < at);
    }
}
