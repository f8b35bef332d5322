//! The capture's writer thread: compresses the workers' full buffers into chunks of their
//! files, takes the buffers that filled slowly once a second, rotates files, writes `meta.json`
//! when the capture starts and when it ends, and ends the capture (stopped, its duration over,
//! or the disk failing).
//!
//! `meta.json` is not rewritten while the capture runs (its counts are in `GET /capture`):
//! replacing it every second made MariaDB and sysbench on the same disk use more CPU per query
//! (in two rounds at 20 threads of the capture suite, the QPS loss was 2.1–2.2% with it and
//! 0.1–0.5% without; docs/PERFORMANCE.md).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::files::{self, Out};
use super::{Chunk, Inner, Options, Status};
use crate::sys::Dir;

pub(super) struct Writer {
    opts: Options,
    dir: Dir,
    key: Option<files::Key>,
    status: Status,
    generation: u64,
    inner: Arc<Inner>,
    /// Each worker's file being written, and how many it began.
    outs: Vec<(Option<Out>, u32)>,
}

impl Writer {
    pub(super) fn new(
        opts: Options,
        dir: Dir,
        key: Option<files::Key>,
        status: Status,
        generation: u64,
        inner: Arc<Inner>,
    ) -> Result<Writer, super::CaptureError> {
        files::write_meta(&dir, &status)
            .map_err(|source| super::CaptureError::Io { what: format!("writing {}/meta.json", dir.path().display()), source })?;
        *inner.status.lock() = status.clone();
        let outs = (0..inner.shards.len()).map(|_| (None, 0)).collect();
        Ok(Writer { opts, dir, key, status, generation, inner, outs })
    }

    pub(super) fn run(mut self, rx: Receiver<Chunk>) -> Status {
        lower_priority();
        let started = Instant::now();
        // The duration counts from the gate's opening (a consistent start's), else from now.
        let mut deadline = None;
        let mut flushed = Instant::now();
        while self.status.error.is_none() && !self.inner.stop.load(Ordering::Relaxed) && deadline.is_none_or(|d| Instant::now() < d) {
            if self.inner.generation.load(Ordering::Relaxed) & super::GATE != 0 {
                if started.elapsed() >= 2 * self.opts.gate_timeout.unwrap_or(super::GATE_TIMEOUT) {
                    tracing::warn!("capture gate held too long: opening it");
                    let _ = self.inner.open();
                }
            } else if deadline.is_none() {
                deadline = self.opts.duration.map(|d| Instant::now() + d).or(Some(Instant::now() + Duration::from_secs(u32::MAX.into())));
            }
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(c) => {
                    self.write(c.worker, &c.bytes);
                    self.inner.recycle(c.worker, self.generation, c.bytes);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if flushed.elapsed() >= Duration::from_secs(1) {
                self.take_slow_buffers(&rx);
                self.publish(false);
                flushed = Instant::now();
            }
        }
        self.finish(rx)
    }

    /// Writes the buffers that are not full yet, so that a quiet capture reaches the disk too.
    /// A worker's buffer is taken under its lock after the chunks it queued before: its
    /// records stay in order.
    fn take_slow_buffers(&mut self, rx: &Receiver<Chunk>) {
        for w in 0..self.inner.shards.len() {
            let (queued, bytes) = {
                let mut s = self.inner.shards[w].lock();
                if s.generation != self.generation || s.buf.is_empty() {
                    continue;
                }
                let queued: Vec<Chunk> = rx.try_iter().collect();
                self.inner.records_total.inc_by(std::mem::take(&mut s.records));
                let fresh = s.fresh();
                (queued, std::mem::replace(&mut s.buf, fresh))
            };
            for c in queued {
                self.write(c.worker, &c.bytes);
                self.inner.recycle(c.worker, self.generation, c.bytes);
            }
            self.write(w, &bytes);
            self.inner.recycle(w, self.generation, bytes);
        }
    }

    /// Appends a chunk to `worker`'s file, beginning a new file past the rotation size.
    fn write(&mut self, worker: usize, records: &[u8]) {
        if records.is_empty() || self.status.error.is_some() {
            return;
        }
        if let Some(d) = self.opts.writer_delay {
            std::thread::sleep(d);
        }
        let rotate = self.opts.rotate_mib.saturating_mul(1 << 20);
        let dir = &self.dir;
        let (out, begun) = &mut self.outs[worker];
        let res = (|| -> std::io::Result<u64> {
            if out.as_ref().is_some_and(|o| o.size >= rotate)
                && let Some(full) = out.take()
            {
                full.finish()?;
            }
            if out.is_none() {
                let name = files::file_name(worker, *begun);
                *begun += 1;
                self.status.files.push(name.clone());
                *out = Some(Out::create(dir, name)?);
            }
            out.as_mut().expect("made above").chunk(records, self.key.as_ref())
        })();
        match res {
            Ok(n) => self.status.bytes_written += n,
            Err(e) => {
                tracing::error!(dir = %dir.path().display(), error = %e, "capture stopped: writing its files failed");
                self.status.error = Some(format!("writing the capture files: {e}"));
            }
        }
    }

    /// The status with the counts of now, for `GET /capture`, and `meta.json` when `to_file`.
    /// The file first: once `GET /capture` says a capture is done, its `meta.json` says so too.
    fn publish(&mut self, to_file: bool) {
        self.inner.counts().show(&mut self.status);
        let s = &self.status;
        if to_file && let Err(e) = files::write_meta(&self.dir, s) {
            tracing::warn!(error = %e, "writing the capture's meta.json");
        }
        *self.inner.status.lock() = s.clone();
    }

    /// Ends the capture: no session writes any more, every buffer and queued chunk reaches
    /// its file (queued ones first: they are older), files are synced, `meta.json` is final.
    fn finish(mut self, rx: Receiver<Chunk>) -> Status {
        for word in [self.generation, self.generation | super::GATE] {
            let _ = self.inner.generation.compare_exchange(word, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
        // Sessions held at a gate that never opened go on, unrecorded.
        self.inner.gate.notify_waiters();
        let mut last = Vec::new();
        for (w, s) in self.inner.shards.iter().enumerate() {
            let mut s = s.lock();
            if s.generation == self.generation {
                s.generation = 0;
                s.tx = None;
                self.inner.records_total.inc_by(std::mem::take(&mut s.records));
                last.push((w, std::mem::take(&mut s.buf)));
            }
        }
        for c in rx.try_iter().collect::<Vec<_>>() {
            self.write(c.worker, &c.bytes);
        }
        for (w, bytes) in last {
            self.write(w, &bytes);
        }
        for (out, _) in &mut self.outs {
            if let Some(o) = out.take()
                && let Err(e) = o.finish()
            {
                self.status.error.get_or_insert(format!("closing a capture file: {e}"));
            }
        }
        self.status.ended_at_ms = Some(super::unix_ms());
        let told = *self.inner.stopped_by.lock();
        let by = if self.status.error.is_some() { "error" } else { told.unwrap_or("duration") };
        self.status.ended_by = Some(by.into());
        self.status.state = if self.status.error.is_some() { "failed" } else { "done" }.into();
        self.publish(true);
        tracing::info!(records = self.status.records, dropped = self.status.dropped_records, "capture ended");
        self.status
    }
}

/// Makes the calling thread a batch thread (`SCHED_BATCH`): when it wakes it does not preempt
/// whatever runs on its core (the relay, the database), it waits for its turn; and its turn is
/// a fair share, so on a machine saturated by the load it records it still keeps up (it needs
/// well under 1% of a core at 30,000 commands a second). If it did not, its queue would fill and
/// records would be dropped and counted, never the relay slowed.
fn lower_priority() {
    if let Err(e) = crate::sys::process::make_thread_batch() {
        tracing::debug!(error = %e, "making the capture writer a batch thread");
    }
}
