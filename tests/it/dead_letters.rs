//! The dead-letter stream against a real daemon: an entry whose take-in fails every time ends there after
//! `ingress.max_deliveries` deliveries without holding the replica, and dead-letter copies are bounded (any
//! number of fields, any size) with the original size and a `truncated` flag, each beside a `failed` result.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use batchd_core::{JobId, ResultStatus};
use batchd_tests::{World, bge_m3_job};
use redis::AsyncCommands;

const WAIT: Duration = Duration::from_secs(60);

/// Waits until the dead-letter stream holds an entry copied from `source_id`; returns its fields.
async fn wait_for_dead_letter(world: &World, source_id: &str) -> HashMap<String, Vec<u8>> {
    let started = Instant::now();
    loop {
        let entries: Vec<(String, HashMap<String, Vec<u8>>)> = redis::cmd("XRANGE")
            .arg(world.keys.dead())
            .arg("-")
            .arg("+")
            .query_async(&mut world.conn.clone())
            .await
            .expect("xrange");
        if let Some((_, fields)) = entries
            .into_iter()
            .find(|(_, fields)| fields.get("source_id").map(Vec::as_slice) == Some(source_id.as_bytes()))
        {
            return fields;
        }
        assert!(started.elapsed() < WAIT, "no dead-letter entry for {source_id} after {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn text(fields: &HashMap<String, Vec<u8>>, name: &str) -> String {
    String::from_utf8_lossy(fields.get(name).unwrap_or_else(|| panic!("no field {name}"))).into_owned()
}

/// Waits until nothing is pending in the ingress consumer group and the submit stream is empty.
async fn wait_for_empty_ingress(world: &World) {
    let started = Instant::now();
    loop {
        let length: usize = world.conn.clone().xlen(world.keys.submit()).await.expect("xlen");
        if world.ingress_pending().await == 0 && length == 0 {
            return;
        }
        assert!(started.elapsed() < WAIT, "ingress still holds {length} entries after {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_entry_whose_take_in_fails_every_time_is_dead_lettered_after_max_deliveries() {
    let mut world = World::new().await;
    world.settings.ingress.max_deliveries = 2;
    world.settings.ingress.reclaim_idle_secs = 1;
    world.settings.ingress.reclaim_interval_secs = 1;
    // A key of the wrong type where the job's ledger goes: accepting the job fails every time, before it writes.
    let poisoned = world.keys.job(&JobId::parse("poison").expect("job id"));
    let _: () = world.conn.clone().set(&poisoned, "not a ledger").await.expect("redis");

    world.enqueue(&bge_m3_job("before", 1)).await;
    let poison_job = bge_m3_job("poison", 1).to_string();
    let poison_entry = world.enqueue_raw(&[("job", poison_job.clone())]).await;
    world.enqueue(&bge_m3_job("after", 1)).await;
    let daemon = world.daemon();

    // The good entries around it complete at once; the poison one keeps failing meanwhile.
    assert_eq!(world.wait_for_result("before", WAIT).await.status, ResultStatus::Completed);
    assert_eq!(world.wait_for_result("after", WAIT).await.status, ResultStatus::Completed);

    let dead = wait_for_dead_letter(&world, &poison_entry).await;
    assert_eq!(text(&dead, "error"), "too many delivery attempts");
    assert_eq!(text(&dead, "deliveries"), "3", "delivered max_deliveries times, dead-lettered at the next one");
    assert_eq!(text(&dead, "field:job"), poison_job, "the entry is copied as it was");
    assert_eq!(text(&dead, "truncated"), "0");
    assert_eq!(text(&dead, "original_fields"), "1");
    assert_eq!(text(&dead, "original_bytes"), (3 + poison_job.len()).to_string());

    // Its default job id, the entry id, gets a failed result; the job's own id was never read.
    let result = world.wait_for_result(&poison_entry, WAIT).await;
    assert_eq!(result.status, ResultStatus::Failed);
    let error = result.error.expect("error");
    assert_eq!(error.code, "invalid_entry");
    assert!(
        error.message.starts_with("too many delivery attempts: the entry was delivered 3 times"),
        "{}",
        error.message
    );
    assert_eq!(world.ledger(&poison_entry).await["state"], "failed");

    wait_for_empty_ingress(&world).await;
    let untouched: String = world.conn.clone().get(&poisoned).await.expect("redis");
    assert_eq!(untouched, "not a ledger", "the failing take-in wrote nothing");
    assert_eq!(world.results().await.len(), 3);
    assert!(daemon.is_running());
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn dead_letter_copies_are_bounded_and_flagged_for_any_number_of_fields_and_any_size() {
    let world = World::new().await;
    let daemon = world.daemon();
    // 5,000 fields and no `job` field: this used to make reject.lua fail after it had published the result.
    let many: Vec<(String, String)> = (0..5_000).map(|i| (format!("f{i}"), "v".to_owned())).collect();
    let many_refs: Vec<(&str, String)> = many.iter().map(|(name, value)| (name.as_str(), value.clone())).collect();
    let many_entry = world.enqueue_raw(&many_refs).await;
    // One field of 1 MB that is not a job.
    let big_value = "x".repeat(1_000_000);
    let big_entry = world.enqueue_raw(&[("job", big_value.clone())]).await;
    world.enqueue(&bge_m3_job("good", 1)).await;

    for entry in [&many_entry, &big_entry] {
        let result = world.wait_for_result(entry, WAIT).await;
        assert_eq!(result.status, ResultStatus::Failed);
        assert_eq!(result.error.expect("error").code, "invalid_entry");
    }
    assert_eq!(world.wait_for_result("good", WAIT).await.status, ResultStatus::Completed);

    let dead = wait_for_dead_letter(&world, &many_entry).await;
    assert_eq!(text(&dead, "truncated"), "1");
    assert_eq!(text(&dead, "original_fields"), "5000");
    let original_bytes: usize = many.iter().map(|(name, value)| name.len() + value.len()).sum();
    assert_eq!(text(&dead, "original_bytes"), original_bytes.to_string());
    let copied = dead.keys().filter(|name| name.starts_with("field:")).count();
    assert_eq!(copied, batchd_queue::store::DEAD_MAX_FIELDS);
    assert_eq!(text(&dead, "field:f0"), "v");
    assert!(text(&dead, "error").starts_with("entry has no `job` field"));

    let dead = wait_for_dead_letter(&world, &big_entry).await;
    assert_eq!(text(&dead, "truncated"), "1");
    assert_eq!(text(&dead, "original_fields"), "1");
    assert_eq!(text(&dead, "original_bytes"), (3 + big_value.len()).to_string());
    let kept = text(&dead, "field:job");
    assert_eq!(kept.len(), world.settings.retention.dead_entry_bytes - "job".len(), "cut to the byte budget");
    assert!(big_value.starts_with(&kept));

    wait_for_empty_ingress(&world).await;
    let dead_len: usize = world.conn.clone().xlen(world.keys.dead()).await.expect("redis");
    assert_eq!(dead_len, 2);
    assert!(daemon.is_running());
    daemon.stop().await.expect("clean stop");
}
