//! Replies planned, not discovered (issue 39): Workers AI answers a finished batch's poll with every response
//! inline, and batchd reads at most `cloudflare.max_reply_bytes` of it. Batches of embeddings, a job's own and
//! packs of many jobs alike, are planned under the vectors whose reply fits, so no batch runs (and is billed) only
//! to have its results refused as too large to read. The daemon in-process, real Redis, the emulator over HTTP
//! (bge-m3: 1,024 dimensions).

use std::time::Duration;

use batchd_core::{ResultEntry, ResultStatus};
use batchd_emulator::CallKind;
use batchd_tests::World;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);

/// A reply limit of 1 MiB: 42 vectors of bge-m3 as batchd bounds them (24,832 bytes each at most).
const MAX_REPLY_BYTES: usize = 1024 * 1024;

async fn world(packing: bool) -> World {
    let mut world = World::new().await;
    world.settings.packing.enabled = packing;
    world.settings.cloudflare.max_reply_bytes = MAX_REPLY_BYTES;
    world
}

/// Remote batches the emulator was sent, with their items.
fn submitted_items(world: &World) -> Vec<usize> {
    world.emulator.calls().iter().filter(|call| call.kind == CallKind::Submit).filter_map(|call| call.n_items).collect()
}

/// The vectors of one response (`{"shape":[n,dim],"data":[[..]]}`).
fn vectors(entry: &ResultEntry, index: usize) -> usize {
    let response = &entry.result.as_ref().expect("a result").responses[index];
    assert!(response.success, "{}: item {index}: {:?}", entry.job_id, response.error);
    let body: Value = serde_json::from_str(response.result.as_ref().expect("a body").get()).expect("json");
    body["data"].as_array().expect("vectors").len()
}

/// 200 one-text jobs queued at once would make one pack of 200 vectors (about 2.5 MB of reply): they are packed
/// 42 at most to a batch, and every job gets its vector.
#[tokio::test]
async fn packs_of_embeddings_hold_no_more_vectors_than_a_reply_can_carry() {
    let world = world(true).await;
    let mut pipe = redis::pipe();
    for index in 0..200 {
        let job = json!({"id": format!("embed-{index}"), "model": "@cf/baai/bge-m3", "requests": [{"text": format!("t{index}")}]});
        pipe.xadd(world.keys.submit(), "*", &[("job", job.to_string())]).ignore();
    }
    let _: () = pipe.query_async(&mut world.conn.clone()).await.expect("enqueue");
    let daemon = world.daemon();
    for index in 0..200 {
        let entry = world.wait_for_result(&format!("embed-{index}"), WAIT).await;
        assert_eq!(entry.status, ResultStatus::Completed, "embed-{index}: {:?}", entry.error);
        assert_eq!(vectors(&entry, 0), 1);
    }
    let batches = submitted_items(&world);
    assert!(batches.iter().all(|items| *items <= 42), "a batch over 42 vectors: {batches:?}");
    assert!(batches.len() >= 5 && batches.len() < 200, "still packed: {batches:?}");
    daemon.stop().await.expect("stop");
}

/// A job of its own is planned the same way, counting each item's texts: 30 items of 5 texts (150 vectors) go
/// in batches of at most 8 items (40 vectors), and the answers come back in order.
#[tokio::test]
async fn a_job_of_embeddings_is_split_by_the_vectors_its_reply_can_carry() {
    let world = world(false).await;
    let requests: Vec<Value> =
        (0..30).map(|item| json!({"text": (0..5).map(|text| format!("{item}.{text}")).collect::<Vec<_>>()})).collect();
    let daemon = world.daemon();
    world.enqueue(&json!({"id": "texts", "model": "@cf/baai/bge-m3", "requests": requests})).await;
    let entry = world.wait_for_result("texts", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    assert_eq!((entry.items_total, entry.items_failed), (30, 0));
    for index in 0..30 {
        assert_eq!(vectors(&entry, index), 5, "item {index}");
    }
    let batches = submitted_items(&world);
    assert!(batches.iter().all(|items| *items <= 8), "a batch over 40 vectors: {batches:?}");
    assert_eq!(batches.iter().sum::<usize>(), 30);
    daemon.stop().await.expect("stop");
}

/// OpenAI's 50,000 embedding inputs per batch bound packs too: 60 one-request jobs of 1,000 inputs each (60,000
/// in all) would make one pack the API fails at validation (`too_many_tasks`, every member failed); they go in two
/// packs, each under the limit, and every job gets its 1,000 vectors.
#[tokio::test]
async fn openai_embedding_packs_stay_under_50000_inputs() {
    let mut world = World::new().await;
    batchd_tests::with_openai(&mut world.settings, &world.emulator);
    world.settings.packing.enabled = true;
    let mut pipe = redis::pipe();
    for index in 0..60 {
        let input: Vec<String> = (0..1000).map(|text| format!("{index}.{text}")).collect();
        let job = json!({"id": format!("inputs-{index}"), "model": "openai/text-embedding-3-small",
            "endpoint": "/v1/embeddings", "requests": [{"input": input}]});
        pipe.xadd(world.keys.submit(), "*", &[("job", job.to_string())]).ignore();
    }
    let _: () = pipe.query_async(&mut world.conn.clone()).await.expect("enqueue");
    let daemon = world.daemon();
    let mut batches = std::collections::HashSet::new();
    for index in 0..60 {
        let entry = world.wait_for_result(&format!("inputs-{index}"), WAIT).await;
        assert_eq!(entry.status, ResultStatus::Completed, "inputs-{index}: {:?}", entry.error);
        let response = &entry.result.as_ref().expect("a result").responses[0];
        assert!(response.success, "inputs-{index}: {:?}", response.error);
        let body: Value = serde_json::from_str(response.result.as_ref().expect("a body").get()).expect("json");
        assert_eq!(body["data"].as_array().expect("vectors").len(), 1000, "inputs-{index}");
        batches.insert(entry.request_ids[0].clone());
    }
    assert_eq!(batches.len(), 2, "two packs of at most 50 jobs: {batches:?}");
    daemon.stop().await.expect("stop");
}
