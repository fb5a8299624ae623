//! The storage layer on its own, against a real Redis: how `Store::accept` records a job's items (copied inside
//! Redis from the ingress entry, or sent along when the entry is gone) and that scripts survive a Redis that
//! forgot them.

use std::time::Duration;

use batchd_core::keys::CONSUMER_GROUP;
use batchd_core::{Job, JobLimits};
use batchd_queue::{Accepted, Intake, Store};
use redis::AsyncCommands;
use serde_json::value::RawValue;

use batchd_tests::World;

fn store(world: &World) -> Store {
    Store::new(
        batchd_queue::connect(redis::Client::open(world.redis.url()).expect("client"), Duration::from_secs(5))
            .expect("connect"),
        world.keys.clone(),
        world.settings.store_settings(),
    )
}

/// A job written by hand, with the spacing, escapes and non-ASCII text a producer may send.
const JOB: &str = "{ \"id\": \"hand-written\", \"model\": \"@cf/baai/bge-m3\",\n  \"requests\": [\n    \
                   {\"query\": \"caf\\u00e9\", \"contexts\": [{\"text\": \"a \\\"quoted\\\" word\"}]} ,\n    \
                   {\"query\": \"naïve\",\"contexts\":[{\"text\":\"b\"}]},{\"query\":\"c\",\"contexts\":[{\"text\":\"c\"}]}\n  ]\n}";

/// Puts `JOB` in the submit stream and reads it through the consumer group, as the daemon's ingress does.
async fn entry(world: &World) -> (String, Job) {
    let mut conn = world.conn.clone();
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(world.keys.submit())
        .arg(CONSUMER_GROUP)
        .arg("$")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .expect("redis");
    let entry_id: String = conn.xadd(world.keys.submit(), "*", &[("job", JOB)]).await.expect("xadd");
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(CONSUMER_GROUP)
        .arg("test")
        .arg("STREAMS")
        .arg(world.keys.submit())
        .arg(">")
        .query_async(&mut conn)
        .await
        .expect("redis");
    let fields = vec![("job".to_owned(), JOB.as_bytes().to_vec())];
    let job = Job::decode(&fields, &entry_id, &JobLimits::default(), &world.keys).expect("decode");
    (entry_id, job)
}

fn intake<'a>(entry_id: &'a str, plan: &'a batchd_queue::store::ChunkPlan) -> Intake<'a> {
    Intake {
        entry_id,
        plan,
        now: 1_000,
        deadline_at: 100_000,
        first_due: 61_000,
        retry_failed_items: false,
        submit_first: true,
        references: &[],
        pack: None,
    }
}

fn stored_items(ledger: &std::collections::HashMap<String, String>, chunk: u32) -> Vec<String> {
    let text = &ledger[&format!("c{chunk}:requests")];
    let items: Vec<Box<RawValue>> = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    items.iter().map(|item| item.get().to_owned()).collect()
}

#[tokio::test]
async fn accept_copies_each_chunks_items_from_the_entry_byte_for_byte() {
    let world = World::new().await;
    let store = store(&world);
    let (entry_id, job) = entry(&world).await;
    let plan = vec![(0, 2), (2, 1)];
    assert_eq!(store.accept(&job, &intake(&entry_id, &plan)).await.unwrap(), Accepted::New);

    let ledger = world.ledger("hand-written").await;
    let sent: Vec<String> = job.requests.iter().map(|item| item.get().to_owned()).collect();
    assert_eq!(stored_items(&ledger, 0), sent[..2]);
    assert_eq!(stored_items(&ledger, 1), sent[2..]);
    // Copied from the entry inside Redis: the producer's own separators between the items are still there.
    assert!(ledger["c0:requests"].contains("} ,\n    {"), "{}", ledger["c0:requests"]);
    assert_eq!(ledger["c0:items"], "0:2");
    assert_eq!(ledger["c1:items"], "2:1");
    // The first chunk is the caller's to post now; the second waits on the schedule.
    assert_eq!((ledger["c0:state"].as_str(), ledger["c0:attempts"].as_str()), ("submitting", "1"));
    assert_eq!((ledger["c1:state"].as_str(), ledger["c1:attempts"].as_str()), ("pending", "0"));
    let schedule: Vec<(String, u64)> =
        world.conn.clone().zrange_withscores(world.keys.schedule(), 0, -1).await.unwrap();
    assert_eq!(schedule, [("hand-written#1".to_owned(), 1_000), ("hand-written#0".to_owned(), 61_000)]);
    assert_eq!(world.ingress_pending().await, 0, "the entry is acknowledged");
    let left: usize = world.conn.clone().xlen(world.keys.submit()).await.unwrap();
    assert_eq!(left, 0, "and deleted");

    // A second accept of the same job is a duplicate and changes nothing.
    let again = store.accept(&job, &intake(&entry_id, &plan)).await.unwrap();
    assert_eq!(again, Accepted::Duplicate { state: "accepted".to_owned() });
    assert_eq!(stored_items(&world.ledger("hand-written").await, 0), sent[..2]);
}

#[tokio::test]
async fn accept_sends_the_items_along_when_the_entry_is_gone() {
    let world = World::new().await;
    let store = store(&world);
    let (entry_id, job) = entry(&world).await;
    // Someone deleted the entry between the read and the accept (XDEL by hand, a MAXLEN trim).
    let _: usize = world.conn.clone().xdel(world.keys.submit(), &[&entry_id]).await.unwrap();
    let plan = vec![(0, 3)];
    assert_eq!(store.accept(&job, &intake(&entry_id, &plan)).await.unwrap(), Accepted::New);

    let ledger = world.ledger("hand-written").await;
    let sent: Vec<String> = job.requests.iter().map(|item| item.get().to_owned()).collect();
    assert_eq!(stored_items(&ledger, 0), sent, "the job is not lost");
    assert_eq!(ledger["c0:requests"], format!("[{}]", sent.join(",")), "sent along by the daemon");
    assert_eq!(world.ingress_pending().await, 0);
}

#[tokio::test]
async fn a_redis_that_forgot_the_scripts_gets_them_again() {
    let world = World::new().await;
    let store = store(&world);
    let (entry_id, job) = entry(&world).await;
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut world.conn.clone()).await.unwrap();
    let plan = vec![(0, 3)];
    assert_eq!(store.accept(&job, &intake(&entry_id, &plan)).await.unwrap(), Accepted::New);
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut world.conn.clone()).await.unwrap();
    let claimed = store.claim_due(1_000_000, 10).await.unwrap();
    let members: Vec<String> = claimed.claims.iter().map(|claim| claim.chunk.to_string()).collect();
    assert_eq!(members, ["hand-written#0"]);
    assert_eq!(claimed.claims[0].token, 2, "the take-in's claim was the first");
}
