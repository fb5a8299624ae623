//! `log.format = "journald"`: a real daemon process writes journald's native protocol, each event with the
//! priority of its level (so `journalctl -p warning` filters) and its fields as journal fields.
//!
//! The test plays journald on a private socket, never the machine's: `tracing-journald` sends to the fixed path
//! `/run/systemd/journal/socket`, so the daemon runs in a mount namespace of its own (`unshare --user --mount`)
//! whose `/run` is an empty tmpfs with the test's directory mounted at `/run/systemd/journal`. The machine's journal
//! (if one runs) neither receives the test's lines nor loses its socket, and the test runs where one does.

use std::collections::HashMap;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use batchd_tests::{World, binary};

/// The fields of one journald datagram: `KEY=value` lines, or `KEY\n<u64 le length><value>\n` for values with
/// newlines.
fn parse(datagram: &[u8]) -> HashMap<String, String> {
    let mut fields = HashMap::new();
    let mut rest = datagram;
    while !rest.is_empty() {
        let line_end = rest.iter().position(|b| *b == b'\n').unwrap_or(rest.len());
        let line = &rest[..line_end];
        if let Some(eq) = line.iter().position(|b| *b == b'=') {
            fields.insert(
                String::from_utf8_lossy(&line[..eq]).into_owned(),
                String::from_utf8_lossy(&line[eq + 1..]).into_owned(),
            );
            rest = rest.get(line_end + 1..).unwrap_or_default();
        } else {
            let key = String::from_utf8_lossy(line).into_owned();
            let body = &rest[line_end + 1..];
            let len = u64::from_le_bytes(body[..8].try_into().expect("length")) as usize;
            fields.insert(key, String::from_utf8_lossy(&body[8..8 + len]).into_owned());
            rest = body.get(8 + len + 1..).unwrap_or_default();
        }
    }
    fields
}

/// Run by `sh -c` inside the daemon's own user and mount namespaces, with the test's socket directory and the
/// daemon's command line as arguments: `/run` becomes an empty tmpfs (only in that namespace), the directory is
/// mounted at `/run/systemd/journal`, and the daemon replaces the shell.
const PRIVATE_JOURNAL: &str = r#"mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/journal && mount --bind "$0" /run/systemd/journal && exec "$@""#;

#[tokio::test]
async fn journald_lines_carry_their_priority_and_fields() {
    let dir = std::env::temp_dir().join(format!("batchd-it-journal-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("create the journal directory");
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _remove = Remove(dir.clone());
    // The daemon sends to this path as it sees it inside its namespace.
    let socket_name = Path::new(batchd::logging::JOURNALD_SOCKET).file_name().expect("socket file name");
    let journal = UnixDatagram::bind(dir.join(socket_name)).expect("bind the private journald socket");
    journal.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");

    let world = World::new().await;
    let mut daemon = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "--", "sh", "-c", PRIVATE_JOURNAL])
        .arg(&dir)
        .arg(binary("batchd").expect("batchd binary"))
        .arg("run")
        .env_clear()
        .envs(world.batchd_env())
        .env("CLOUDFLARE_API_TOKEN", world.emulator.token())
        .env("BATCHD__LOG__FORMAT", "journald")
        .env("BATCHD__ADMIN__LISTEN", "")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start batchd under unshare (util-linux)");
    // A job with a bad model: rejected with a warning that names it.
    world.enqueue(&serde_json::json!({"id": "journald-bad", "model": "no-such/..", "requests": [{"text": "x"}]})).await;

    let mut seen: Vec<HashMap<String, String>> = Vec::new();
    let started = Instant::now();
    let mut buffer = vec![0u8; 64 * 1024];
    let wanted = |seen: &[HashMap<String, String>]| {
        let running = seen.iter().any(|f| f.get("MESSAGE").is_some_and(|m| m == "batchd running"));
        let rejected = seen.iter().any(|f| f.get("JOB_ID").is_some_and(|id| id == "journald-bad"));
        running && rejected
    };
    while !wanted(&seen) {
        if let Ok(Some(status)) = daemon.try_wait() {
            let mut stderr = String::new();
            let _ = std::io::Read::read_to_string(&mut daemon.stderr.take().expect("stderr"), &mut stderr);
            panic!("batchd (under unshare: user namespaces must be allowed) exited with {status}: {stderr}");
        }
        assert!(started.elapsed() < Duration::from_secs(30), "journald got: {seen:?}");
        if let Ok(n) = journal.recv(&mut buffer) {
            seen.push(parse(&buffer[..n]));
        }
    }
    daemon.kill().ok();
    daemon.wait().ok();

    let running = seen.iter().find(|f| f.get("MESSAGE").is_some_and(|m| m == "batchd running")).expect("info");
    assert_eq!(running.get("PRIORITY").map(String::as_str), Some("5"), "info is notice (5): {running:?}");
    assert_eq!(running.get("SYSLOG_IDENTIFIER").map(String::as_str), Some("batchd"));
    let rejected = seen.iter().find(|f| f.get("JOB_ID").is_some_and(|id| id == "journald-bad")).expect("warn");
    assert_eq!(rejected.get("PRIORITY").map(String::as_str), Some("4"), "warn is warning (4): {rejected:?}");
    assert!(rejected.contains_key("ERROR"), "the event's fields are journal fields: {rejected:?}");
}
