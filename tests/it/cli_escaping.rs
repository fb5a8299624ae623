//! The real `batchd` binary never prints a producer's control characters raw: `dead list|show`, `tail` and `status`
//! show ESC sequences, CR, backspace, NUL and bidi overrides escaped (`\x1b`, `\u{202e}`), and their `--json`
//! output stays valid JSON that parses back to the stored text.

use std::collections::HashMap;
use std::time::Duration;

use batchd_core::ledger::field;
use batchd_core::result::code;
use batchd_core::{JobError, JobId, ResultEntry, ResultStatus};
use batchd_tests::World;
use redis::AsyncCommands;
use serde_json::Value;

use crate::cli_ops::{batchd, run, text};

const WAIT: Duration = Duration::from_secs(30);

/// Clears the screen, sets the window title, returns to the line start, erases, and reverses what follows.
const HOSTILE: &str = "\u{1b}[2J\u{1b}]0;pwned\u{7}\r\u{8}\0\u{202e}txt.exe\u{2066}";

/// The bytes of every character a terminal would act on (C0, DEL, C1 and the bidi controls), UTF-8 encoded.
fn raw_controls(output: &str) -> Vec<char> {
    output
        .chars()
        .filter(|c| *c != '\n')
        .filter(|c| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'))
        .collect()
}

/// `batchd <args>`: exit code and stdout; stderr must be free of raw control characters too.
async fn cli(world: &World, args: &[&str]) -> (i32, String) {
    let mut command = batchd(world);
    command.args(args);
    let output = run(command).await;
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(raw_controls(&stderr).is_empty(), "raw control characters on stderr of {args:?}: {stderr:?}");
    assert!(raw_controls(&stdout).is_empty(), "raw control characters on stdout of {args:?}: {stdout:?}");
    (output.status.code().unwrap_or(-1), stdout)
}

#[tokio::test]
async fn cli_shows_control_characters_from_producers_escaped_in_dead_tail_and_status() {
    let world = World::new().await;
    let escaped = r"\x1b[2J\x1b]0;pwned\x07\r\x08\0\u{202e}txt.exe\u{2066}";

    // A producer's entry without a `job` field: the daemon copies it to the dead-letter stream as it is.
    let daemon = world.daemon();
    let hostile_entry = world.enqueue_raw(&[(&format!("x{HOSTILE}"), format!("v{HOSTILE}"))]).await;
    world.wait_for_results(1, WAIT).await;
    daemon.stop().await.expect("clean stop");
    let dead: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg(world.keys.dead())
        .arg("-")
        .arg("+")
        .query_async(&mut world.conn.clone())
        .await
        .expect("xrange");
    let (dead_id, _) = dead.iter().find(|(_, fields)| fields["source_id"] == hostile_entry).expect("dead-lettered");

    let (code, stdout) = cli(&world, &["dead", "show", dead_id]).await;
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains(&format!("  field x{escaped} (")), "{stdout}");
    assert!(stdout.contains(&format!("    v{escaped}\n")), "{stdout}");
    let (code, stdout) = cli(&world, &["dead", "show", dead_id, "--json"]).await;
    assert_eq!(code, 0, "{stdout}");
    let shown: Value = serde_json::from_str(&stdout).expect("dead show --json is JSON");
    assert_eq!(shown["fields"][format!("x{HOSTILE}")], format!("v{HOSTILE}"), "the same text once parsed");
    let (code, stdout) = cli(&world, &["dead", "list"]).await;
    assert_eq!(code, 0, "{stdout}");

    // A result entry and a ledger with a producer's text in them, written as the daemon writes them.
    let mut conn = world.conn.clone();
    let error = JobError::new(code::API_ERROR, format!("m{HOSTILE}"));
    let metadata = serde_json::json!({"note": HOSTILE}).to_string();
    let entry = ResultEntry {
        job_id: "esc-1".to_owned(),
        status: ResultStatus::Failed,
        model: "@cf/baai/bge-m3".to_owned(),
        result: None,
        error: Some(error.clone()),
        metadata: Some(serde_json::value::RawValue::from_string(metadata).expect("raw JSON")),
        request_ids: Vec::new(),
        accepted_at: 1_763_769_600_000,
        finished_at: 1_763_769_605_250,
        items_total: 1,
        items_failed: 1,
    };
    let _: String = conn.xadd(world.keys.results(), "*", &entry.to_fields()).await.expect("xadd result");
    // The first entry is the daemon's `failed` result for the hostile entry, the second the one written here.
    let (code, stdout) = cli(&world, &["tail", "--from-start", "--count", "2", "--timeout", "20"]).await;
    assert_eq!(code, 0, "{stdout}");
    assert!(
        stdout.contains(&format!("  esc-1  failed  1 items, 1 failed  @cf/baai/bge-m3  api_error: m{escaped}")),
        "{stdout}"
    );
    let (code, stdout) = cli(&world, &["tail", "--from-start", "--count", "2", "--timeout", "20", "--json"]).await;
    assert_eq!(code, 0, "{stdout}");
    let entries: Vec<Value> =
        stdout.lines().map(|line| serde_json::from_str(line).expect("tail --json is JSON")).collect();
    assert_eq!(entries.len(), 2, "{stdout}");
    let entry = &entries[1];
    assert_eq!(entry["job_id"], "esc-1");
    assert_eq!(entry["error"]["message"], format!("m{HOSTILE}"));
    assert_eq!(entry["metadata"]["note"], HOSTILE);

    let job = JobId::parse("esc-1").expect("job id");
    let ledger = [
        (field::STATE.to_owned(), "failed".to_owned()),
        (field::MODEL.to_owned(), "@cf/baai/bge-m3".to_owned()),
        (field::N_CHUNKS.to_owned(), "1".to_owned()),
        (field::chunk(0, field::CHUNK_STATE), "failed".to_owned()),
        (field::chunk(0, field::CHUNK_REQUEST_ID), "r-1".to_owned()),
        (field::chunk(0, field::CHUNK_REMOTE_STATUS), format!("s{HOSTILE}")),
        (field::chunk(0, field::CHUNK_LAST_ERROR), format!("l{HOSTILE}")),
        (field::ERROR.to_owned(), error.to_json()),
    ];
    let _: () = conn.hset_multiple(world.keys.job(&job), &ledger).await.expect("hset ledger");
    let (code, stdout) = cli(&world, &["status", "esc-1"]).await;
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains(&format!("remote last seen s{escaped}  polls")), "{stdout}");
    assert!(stdout.contains(&format!("last error l{escaped}\n")), "{stdout}");
    let (code, stdout) = cli(&world, &["status", "esc-1", "--json"]).await;
    assert_eq!(code, 0, "{stdout}");
    let ledger: Value = serde_json::from_str(&stdout).expect("status --json is JSON");
    assert_eq!(ledger[field::chunk(0, field::CHUNK_REMOTE_STATUS)], format!("s{HOSTILE}"));
    assert_eq!(ledger["error"]["message"], format!("m{HOSTILE}"));
}
