//! `log.format = "journald"`: a real daemon process writes journald's native protocol, each event with the
//! priority of its level (so `journalctl -p warning` filters) and its fields as journal fields.
//!
//! The test plays journald: it binds `/run/systemd/journal/socket` (free on a machine without systemd, as CI's is)
//! and reads the datagrams.

use std::collections::HashMap;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
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

#[tokio::test]
async fn journald_lines_carry_their_priority_and_fields() {
    let path = Path::new(batchd::logging::JOURNALD_SOCKET);
    assert!(
        !path.exists(),
        "{} exists: this test plays journald and needs the path free (run it where systemd's journal is not running)",
        path.display()
    );
    std::fs::create_dir_all(path.parent().expect("parent")).expect("create /run/systemd/journal");
    let journal = UnixDatagram::bind(path).expect("bind the journald socket");
    journal.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
    struct Unbind<'a>(&'a Path);
    impl Drop for Unbind<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0);
        }
    }
    let _unbind = Unbind(path);

    let world = World::new().await;
    let mut daemon = Command::new(binary("batchd").expect("batchd binary"))
        .arg("run")
        .env_clear()
        .envs(world.batchd_env())
        .env("CLOUDFLARE_API_TOKEN", world.emulator.token())
        .env("BATCHD__LOG__FORMAT", "journald")
        .env("BATCHD__ADMIN__LISTEN", "")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start batchd");
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
