//! A sluice process under test: started from the built binary, ready once it has printed its
//! bound addresses, killed when dropped. Its log is kept in a file for failure messages.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, PoisonError, mpsc};
use std::time::Duration;

pub struct SluiceProc {
    child: Option<Child>,
    /// Address of the first MySQL listener.
    pub listen: String,
    /// Address of the admin API, when enabled.
    pub admin: Option<String>,
    pub log: PathBuf,
    /// Its working folder, its own (where captures go unless configured elsewhere).
    pub dir: PathBuf,
    /// Lines written to the log so far, told to whoever waits for one.
    lines: Arc<(Mutex<u64>, Condvar)>,
}

fn field(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!("{key}=\""))? + key.len() + 2;
    let end = line[start..].find('"')? + start;
    Some(line[start..end].to_string())
}

impl SluiceProc {
    /// Starts `bin` with `args` and waits for its ready line (listeners bound, workers up).
    pub fn start(bin: &Path, args: &[String]) -> SluiceProc {
        let id = crate::unique_id();
        let log = crate::mariadb::work_root().join(format!("sluice-{}-{id}.log", std::process::id()));
        let dir = crate::mariadb::work_root().join(format!("sluice-{}-{id}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("sluice's working folder");
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .current_dir(&dir)
            .env("RUST_LOG", std::env::var("SLUICE_TEST_LOG").unwrap_or_else(|_| "info".into()))
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = crate::mariadb::spawn(cmd).expect("spawn sluice");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        let log_path = log.clone();
        let lines = Arc::new((Mutex::new(0u64), Condvar::new()));
        let written = lines.clone();
        std::thread::spawn(move || {
            use std::io::Write;
            let mut f = std::fs::File::create(&log_path).expect("log file");
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = writeln!(f, "{line}");
                *written.0.lock().unwrap_or_else(PoisonError::into_inner) += 1;
                written.1.notify_all();
                if !sent && line.contains("sluice ready") {
                    let _ = tx.send((field(&line, "listeners"), field(&line, "admin")));
                    sent = true;
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok((Some(listeners), admin)) => SluiceProc {
                child: Some(child),
                listen: listeners.split(',').next().unwrap_or_default().to_string(),
                admin: admin.filter(|a| !a.is_empty() && a != "none"),
                log,
                dir,
                lines,
            },
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                std::thread::sleep(Duration::from_millis(100));
                panic!("sluice did not become ready; log:\n{}", std::fs::read_to_string(&log).unwrap_or_default());
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    pub fn port(&self) -> u16 {
        self.listen.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(0)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the log shows `text`, waiting up to ten seconds for it: the log reaches its file
    /// through a thread of the test's, so a line written just now may not be there yet (each
    /// line it writes wakes this wait).
    pub fn log_shows(&self, text: &str) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let (count, written) = &*self.lines;
        let mut seen = count.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if self.log_text().contains(text) {
                return true;
            }
            let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) else { return false };
            let now = *seen;
            seen = written.wait_timeout_while(seen, left, |n| *n == now).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// Sends a signal by name (e.g. "TERM") to the process.
    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill").arg(format!("-{sig}")).arg(self.pid().to_string()).status();
    }

    /// Waits for the process to exit, up to `timeout`; returns its exit code if it exited.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                self.child = None;
                return Some(st.code().unwrap_or(-1));
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for SluiceProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
