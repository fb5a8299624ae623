//! The happy path: jobs in, one result out per job, responses in request order.

use std::time::Duration;

use batchd_core::ResultStatus;
use batchd_emulator::{EmulatorConfig, Fault};
use batchd_tests::{World, bge_m3_job, wait_until};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

fn indices(entry: &batchd_core::ResultEntry) -> Vec<usize> {
    entry.result.as_ref().expect("result").responses.iter().map(|r| r.index).collect()
}

#[tokio::test]
async fn bge_m3_text_generation_and_embeddings_come_back_in_request_order() {
    let world = World::new().await;
    let daemon = world.daemon();

    world.enqueue(&bge_m3_job("inv-42", 5)).await;
    world
        .enqueue(&json!({
            "id": "gen-1",
            "model": "@cf/meta/llama-3.3-70b-instruct-fp8-fast",
            "requests": [
                {"prompt": "Tell me a joke about Redis", "max_tokens": 50, "external_reference": "j0"},
                {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 20},
                {"prompt": "Write a haiku", "external_reference": "j2"},
                {"prompt": "Explain batching", "temperature": 0.2},
            ],
            "metadata": {"tenant": "acme", "trace": [1, 2]},
        }))
        .await;
    world
        .enqueue(&json!({
            "id": "emb-1",
            "model": "@cf/baai/bge-small-en-v1.5",
            "requests": [{"text": "one"}, {"text": ["two", "three"]}, {"text": "four"}],
        }))
        .await;

    let bge = world.wait_for_result("inv-42", WAIT).await;
    assert_eq!(bge.status, ResultStatus::Completed);
    assert_eq!(bge.model, "@cf/baai/bge-m3");
    assert_eq!(indices(&bge), [0, 1, 2, 3, 4]);
    assert_eq!((bge.items_total, bge.items_failed), (5, 0));
    assert_eq!(bge.request_ids.len(), 1);
    let output = bge.result.as_ref().expect("result");
    for (i, response) in output.responses.iter().enumerate() {
        assert!(response.success);
        assert_eq!(response.external_reference.as_ref().expect("reference").get(), format!("\"q{i}\""));
        let scores: serde_json::Value = serde_json::from_str(response.result.as_ref().expect("item").get()).unwrap();
        assert_eq!(scores["response"].as_array().expect("scores").len(), 2, "one score per context");
    }

    let generation = world.wait_for_result("gen-1", WAIT).await;
    assert_eq!(generation.status, ResultStatus::Completed);
    assert_eq!(indices(&generation), [0, 1, 2, 3]);
    assert_eq!(generation.metadata.as_ref().expect("metadata").get(), r#"{"tenant":"acme","trace":[1,2]}"#);
    let output = generation.result.as_ref().expect("result");
    assert!(output.usage["total_tokens"].as_u64().expect("usage") > 0);
    let first: serde_json::Value = serde_json::from_str(output.responses[0].result.as_ref().unwrap().get()).unwrap();
    assert!(first["response"].as_str().expect("text").contains("Tell me a joke"), "{first}");
    assert!(output.responses[1].external_reference.is_none());

    let embeddings = world.wait_for_result("emb-1", WAIT).await;
    assert_eq!(indices(&embeddings), [0, 1, 2]);
    let second: serde_json::Value =
        serde_json::from_str(embeddings.result.as_ref().unwrap().responses[1].result.as_ref().unwrap().get()).unwrap();
    assert_eq!(second["shape"], json!([2, 384]));

    // Each job was submitted once, and the ledgers are closed with the request ids recorded.
    assert_eq!(world.emulator.submits().len(), 3);
    let ledger = world.ledger("inv-42").await;
    assert_eq!(ledger["state"], "completed");
    assert_eq!(ledger["c0:request_id"], bge.request_ids[0]);
    assert!(!ledger.contains_key("job"), "the job body is dropped once the result is published");
    assert_eq!(world.scheduled().await, 0);
    assert_eq!(world.ingress_pending().await, 0);
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_job_without_an_id_is_known_by_its_entry_id() {
    let world = World::new().await;
    let daemon = world.daemon();
    let entry_id = world
        .enqueue(&json!({"model": "@cf/meta/m2m100-1.2b", "requests": [
            {"text": "hello", "source_lang": "en", "target_lang": "es"}
        ]}))
        .await;
    let result = world.wait_for_result(&entry_id, WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed);
    let item: serde_json::Value =
        serde_json::from_str(result.result.unwrap().responses[0].result.as_ref().unwrap().get()).unwrap();
    assert!(item["translated_text"].as_str().unwrap().contains("hello"));
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn per_item_failures_are_kept_and_counted_and_the_job_completes() {
    let world = World::new().await;
    world.emulator.inject(Fault::fail_items([1, 3]));
    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("partial", 5)).await;
    let result = world.wait_for_result("partial", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed);
    assert_eq!((result.items_total, result.items_failed), (5, 2));
    let output = result.result.unwrap();
    let successes: Vec<bool> = output.responses.iter().map(|r| r.success).collect();
    assert_eq!(successes, [true, false, true, false, true]);
    assert!(output.responses[1].result.is_none());
    let error: serde_json::Value = serde_json::from_str(output.responses[1].error.as_ref().unwrap().get()).unwrap();
    assert_eq!(error["code"], 5001);
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn the_documented_completion_shape_and_missing_items_are_normalised() {
    // The live shape (`results[]` by `index`) is the emulator's default, which every other test reads; this one
    // reads the docs' `responses[]` by `id`.
    let world = World::new().await;
    world.emulator.inject(Fault::documented_shape());
    world.emulator.inject(Fault::drop_items([2]));
    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("shape", 4)).await;
    let result = world.wait_for_result("shape", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed);
    assert_eq!(indices(&result), [0, 1, 2, 3]);
    assert_eq!(result.items_failed, 1, "the dropped item is reported as failed, not lost");
    assert!(!result.result.unwrap().responses[2].success);
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn the_same_job_id_twice_is_one_remote_batch_and_one_result() {
    let world =
        World::with_emulator(EmulatorConfig { queued_for: Duration::from_millis(300), ..EmulatorConfig::default() })
            .await;
    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("twice", 2)).await;
    world.enqueue(&bge_m3_job("twice", 2)).await;
    world.wait_for_result("twice", WAIT).await;
    // A third copy after the job finished is still the same job. Taking a copy in as a duplicate counts it in
    // the ledger in the same step that acknowledges it, and does nothing else: once the count shows the third copy
    // and no work is left, a second submit or result could no longer come.
    world.enqueue(&bge_m3_job("twice", 2)).await;
    wait_until("the third copy to be counted as a duplicate", WAIT, async || {
        world.ledger("twice").await.get("duplicates").map(String::as_str) == Some("2")
    })
    .await;
    world.wait_until_settled(WAIT).await;

    assert_eq!(world.emulator.submits().len(), 1, "one remote submit");
    let results = world.results().await;
    assert_eq!(results.iter().filter(|r| r["job_id"] == "twice").count(), 1, "one result");
    assert_eq!(world.ingress_pending().await, 0, "every copy was acknowledged");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn reply_to_routes_the_result_to_the_producers_own_stream() {
    let world = World::new().await;
    let daemon = world.daemon();
    let stream = format!("{}:billing", world.keys.results());
    let mut job = bge_m3_job("routed", 1);
    job["reply_to"] = json!(stream);
    world.enqueue(&job).await;
    let started = std::time::Instant::now();
    loop {
        let entries = world.stream(&stream).await;
        if let Some(entry) = entries.first() {
            assert_eq!(entry["job_id"], "routed");
            assert_eq!(entry["status"], "completed");
            break;
        }
        assert!(started.elapsed() < WAIT, "no result in {stream}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(world.results().await.is_empty(), "nothing in the default stream");
    daemon.stop().await.unwrap();
}
