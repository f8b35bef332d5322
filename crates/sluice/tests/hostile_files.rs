//! Files a root-run sluice reads and writes, tried as a local user with bad intent would: captures
//! go only under `[capture] dir`, in folders sluice makes 0700, in files made 0600 through no
//! symbolic link; key and certificate files must be regular and small (a FIFO does not hang the
//! control plane, `/dev/zero` does not eat memory); `sluice replay` refuses a damaged or partial
//! capture and bad arguments with an error and a non-zero exit, never a hang or a panic.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use mysql_async::prelude::*;
use sluice::capture::files;
use sluice::capture::record;

fn scratch(name: &str) -> PathBuf {
    let d = sluice_testkit::mariadb::work_root().join(format!("hostile-{name}-{}-{}", std::process::id(), sluice_testkit::unique_id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
}

fn start(s: &SluiceProc, body: serde_json::Value) -> (u16, serde_json::Value) {
    let (code, text) = admin_post_json(s, "/capture/start", &body);
    (code, serde_json::from_str(&text).unwrap_or(serde_json::json!({ "text": text })))
}

fn mkfifo(p: &Path) {
    let ok = Command::new("mkfifo").arg(p).status().unwrap().success();
    assert!(ok, "mkfifo {}", p.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captures_go_only_under_their_root_private_and_through_no_link() {
    let db = shared_db();
    let s = start_sluice(&[db], &[]);
    // A path, a parent, a hidden or an absolute name: refused (absolute paths are off by default).
    for bad in ["../escape", "a/b", ".hidden", "", "/tmp/anywhere"] {
        let (code, body) = start(&s, serde_json::json!({ "name": bad }));
        assert_eq!(code, 400, "{bad:?}: {body}");
    }
    let (code, body) = start(&s, serde_json::json!({ "name": "first" }));
    assert_eq!(code, 201, "{body}");
    let mut c = app(&s).await;
    c.query_drop("SELECT 'recorded'").await.unwrap();
    c.disconnect().await.unwrap();
    let (code, done) = admin_post_json(&s, "/capture/stop", &serde_json::json!({}));
    assert_eq!(code, 200, "{done}");
    let root = s.dir.join("captures");
    assert_eq!((mode(&root), mode(&root.join("first"))), (0o700, 0o700), "made private");
    let names: Vec<PathBuf> = std::fs::read_dir(root.join("first")).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(names.iter().any(|p| p.extension().is_some_and(|x| x == "cap")), "{names:?}");
    for p in &names {
        assert_eq!(mode(p), 0o600, "{}", p.display());
    }
    // A folder that exists (a local user made it, and planted a link in it) is never used.
    std::fs::create_dir(root.join("planted")).unwrap();
    let victim = scratch("victim").join("precious");
    std::fs::write(&victim, "keep").unwrap();
    std::os::unix::fs::symlink(&victim, root.join("planted/meta.json.tmp")).unwrap();
    let (code, body) = start(&s, serde_json::json!({ "name": "planted" }));
    assert_eq!(code, 409, "{body}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    // A root others may write in, or that a symbolic link leads to, is refused.
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (code, body) = start(&s, serde_json::json!({ "name": "open-root" }));
    assert_eq!(code, 409, "{body}");
    assert!(body.to_string().contains("others may write"), "{body}");
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::rename(&root, s.dir.join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(s.dir.join("elsewhere"), &root).unwrap();
    let (code, body) = start(&s, serde_json::json!({ "name": "through-a-link" }));
    assert_eq!(code, 409, "{body}");
    assert!(body.to_string().contains("symbolic link"), "{body}");
    assert!(!s.dir.join("elsewhere/through-a-link").exists());
}

#[test]
fn absolute_capture_paths_only_where_the_configuration_allows_them() {
    let outside = scratch("absolute");
    let s = TestConfig::new().backend(&shared_db().addr()).table("capture", "allow_absolute_paths = true\n").start();
    let (code, body) = start(&s, serde_json::json!({ "name": outside.join("cap").display().to_string() }));
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["dir"], outside.join("cap").display().to_string());
    admin_post_json(&s, "/capture/stop", &serde_json::json!({}));
    assert_eq!(mode(&outside.join("cap")), 0o700);
    assert_eq!(mode(&outside.join("cap/meta.json")), 0o600);
    // Its last folder is still made by sluice: an existing one is refused.
    let (code, body) = start(&s, serde_json::json!({ "name": outside.join("cap").display().to_string() }));
    assert_eq!(code, 409, "{body}");
}

/// A key file must be a regular file of bounded size: a FIFO used to hang the control plane
/// (the capture's start held its lock while it waited for a writer), `/dev/zero` to eat memory.
#[test]
fn a_key_file_that_is_a_fifo_or_a_device_is_refused_at_once() {
    let s = start_sluice(&[shared_db()], &[]);
    let fifo = scratch("key").join("key.fifo");
    mkfifo(&fifo);
    for key in [fifo.display().to_string(), "/dev/zero".into()] {
        let (code, body) = start(&s, serde_json::json!({ "name": format!("k{}", sluice_testkit::unique_id()), "key_file": key }));
        assert_eq!(code, 409, "{body}");
        assert!(body.to_string().contains("not a regular file"), "{body}");
        let (code, _) = admin_get(&s, "/health", None);
        assert_eq!(code, 200);
        assert_eq!(json(&admin_get(&s, "/capture", None).1)["state"], "idle");
    }
}

/// A short capture made through sluice, for the replay cases below: its folder.
fn a_capture() -> (&'static SluiceProc, PathBuf) {
    static CAPTURE: std::sync::OnceLock<(SluiceProc, PathBuf)> = std::sync::OnceLock::new();
    let (s, dir) = CAPTURE.get_or_init(|| {
        let s = start_sluice(&[shared_db()], &[]);
        let (code, body) = start(&s, serde_json::json!({ "name": "whole" }));
        assert_eq!(code, 201, "{body}");
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let mut c = app(&s).await;
            for i in 0..20 {
                c.query_drop(format!("SELECT {i}")).await.unwrap();
            }
            c.disconnect().await.unwrap();
        });
        let (code, body) = admin_post_json(&s, "/capture/stop", &serde_json::json!({}));
        assert_eq!(code, 200, "{body}");
        let dir = PathBuf::from(json(&body)["dir"].as_str().unwrap());
        (s, dir)
    });
    (s, dir.clone())
}

/// A copy of the capture to damage.
fn copy_of(dir: &Path) -> PathBuf {
    let to = scratch("copy");
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
    to
}

fn replay(dir: &Path, extra: &[&str]) -> (i32, String) {
    let mut cmd = Command::new(bin());
    cmd.args(["replay", "--input"]).arg(dir).args(["--target", &shared_db().addr(), "--user", "app", "--password", "apppw"]).args(extra);
    let out = cmd.output().unwrap();
    (out.status.code().unwrap_or(-1), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn cap_files(dir: &Path) -> Vec<PathBuf> {
    files::list(dir).unwrap()
}

#[test]
fn replay_refuses_damaged_or_partial_captures_and_bad_arguments() {
    let (_s, whole) = a_capture();
    let (code, text) = replay(&whole, &[]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains(" 0 different"), "{text}");

    // A byte flipped in a chunk: its checksum says so.
    let d = copy_of(&whole);
    let f = &cap_files(&d)[0];
    let mut bytes = std::fs::read(f).unwrap();
    let at = bytes.len() - 12;
    bytes[at] ^= 0x40;
    std::fs::write(f, &bytes).unwrap();
    let (code, text) = replay(&d, &[]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("checksum"), "{text}");

    // A listed file missing, or empty; a file the capture does not list.
    let d = copy_of(&whole);
    std::fs::remove_file(&cap_files(&d)[0]).unwrap();
    let (code, text) = replay(&d, &[]);
    assert_eq!((code, text.contains("missing")), (2, true), "{text}");
    let d = copy_of(&whole);
    std::fs::write(&cap_files(&d)[0], b"").unwrap();
    let (code, text) = replay(&d, &[]);
    assert_eq!(code, 2, "{text}");
    let d = copy_of(&whole);
    std::fs::copy(&cap_files(&d)[0], d.join("w99-00000.cap")).unwrap();
    let (code, text) = replay(&d, &[]);
    assert_eq!((code, text.contains("not listed")), (2, true), "{text}");

    // A FIFO named like a capture file: refused, not waited on.
    let d = copy_of(&whole);
    mkfifo(&d.join("w98-00000.cap"));
    let (code, text) = replay(&d, &[]);
    assert_eq!((code, text.contains("not a regular file")), (2, true), "{text}");

    // A capture that never ended.
    let d = copy_of(&whole);
    let mut meta = json(&std::fs::read_to_string(d.join("meta.json")).unwrap());
    meta["state"] = "running".into();
    meta["ended_at_ms"] = serde_json::Value::Null;
    std::fs::write(d.join("meta.json"), meta.to_string()).unwrap();
    let (code, text) = replay(&d, &[]);
    assert_eq!((code, text.contains("not whole")), (2, true), "{text}");

    // Speeds no clock can keep.
    for speed in ["1e-300", "0", "-1", "NaN", "inf", "1e9"] {
        let (code, text) = replay(&whole, &[&format!("--speed={speed}")]);
        assert_eq!(code, 2, "--speed {speed}: {text}");
        assert!(text.contains("--speed"), "{text}");
    }
}

/// Records whose times lie far past the capture's end (a damaged varint: a command at 2^62 µs,
/// a session at u64::MAX), written with valid checksums: refused, where they used to hang the
/// replay.
#[test]
fn replay_refuses_times_past_the_capture_s_end() {
    let (_s, whole) = a_capture();
    for at in [1u64 << 62, u64::MAX] {
        let d = copy_of(&whole);
        let extra = d.join("w97-00000.cap");
        let dir = sluice::sys::Dir::open(&d, false).unwrap();
        let mut out = files::Out::create(&dir, "w97-00000.cap".into()).unwrap();
        let mut records = Vec::new();
        record::put_begin(&mut records, 999, at, &record::Begin { user: "app".into(), ..Default::default() });
        record::put_exchange(&mut records, 999, at, 1, 0, 9, b"\x03SELECT 1", &record::Summary::default());
        out.chunk(&records, None).unwrap();
        out.finish().unwrap();
        let mut meta = json(&std::fs::read_to_string(d.join("meta.json")).unwrap());
        meta["files"].as_array_mut().unwrap().push("w97-00000.cap".into());
        std::fs::write(d.join("meta.json"), meta.to_string()).unwrap();
        assert!(extra.exists());
        let (code, text) = replay(&d, &[]);
        assert_eq!((code, text.contains("past the capture's end")), (2, true), "{text}");
    }
}
