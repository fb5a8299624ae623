//! Submit, poll through queued and running to done, and the shape of completions per model family.

use std::time::{Duration, Instant};

use batchd_emulator::{EmulatorConfig, Fault};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{FOREVER, LLAMA, finish_and_poll, poll, post, post_raw, start, start_paused, submit};

fn prompts(n: usize) -> Value {
    (0..n)
        .map(|i| json!({ "prompt": format!("prompt number {i}"), "external_reference": format!("ref-{i}") }))
        .collect()
}

#[tokio::test]
async fn submit_reply_matches_the_documented_envelope() {
    let emulator = start_paused().await;
    let reply = post(&emulator, LLAMA, &json!({ "requests": prompts(2) })).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body["success"], true);
    assert_eq!(reply.body["errors"], json!([]));
    assert_eq!(reply.body["messages"], json!([]));
    assert_eq!(reply.body["result"]["status"], "queued");
    assert_eq!(reply.body["result"]["model"], LLAMA);
    let request_id = reply.body["result"]["request_id"].as_str().expect("request id");
    assert!(uuid::Uuid::parse_str(request_id).is_ok(), "{request_id}");
    assert_eq!(emulator.batch_count(), 1);
}

#[tokio::test]
async fn poll_goes_queued_running_done_on_the_emulator_clock() {
    let emulator = start_paused().await;
    let request_id = submit(&emulator, LLAMA, prompts(5)).await;

    let reply = poll(&emulator, LLAMA, &request_id).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body["result"], json!({ "status": "queued", "request_id": request_id }));

    emulator.set_timing(Duration::ZERO, FOREVER);
    let reply = poll(&emulator, LLAMA, &request_id).await;
    assert_eq!(reply.body["result"]["status"], "running");

    let reply = finish_and_poll(&emulator, LLAMA, &request_id).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body["success"], true);
    let responses = reply.body["result"]["results"].as_array().expect("results");
    let ids: Vec<u64> = responses.iter().map(|r| r["index"].as_u64().expect("id")).collect();
    assert_eq!(ids.len(), 5);
    assert!(!ids.is_sorted(), "responses must come back shuffled: {ids:?}");
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(sorted, vec![0, 1, 2, 3, 4]);
    for response in responses {
        let id = response["index"].as_u64().expect("id");
        assert_eq!(response["success"], true);
        assert_eq!(response["external_reference"], format!("ref-{id}"));
        assert_eq!(response["result"]["response"], format!("echo: prompt number {id}"));
    }
    let usage = &reply.body["result"]["usage"];
    assert_eq!(usage["prompt_tokens"], 15);
    assert_eq!(usage["completion_tokens"], 20);
    assert_eq!(usage["total_tokens"], 35);

    // Done stays done, with the same body.
    let again = poll(&emulator, LLAMA, &request_id).await;
    assert_eq!(again.body, reply.body);
}

#[tokio::test]
async fn batches_finish_in_real_time() {
    let phase = Duration::from_millis(300);
    let config = EmulatorConfig { queued_for: phase, running_for: phase, ..EmulatorConfig::default() };
    let emulator = start(config).await;
    let started = Instant::now();
    let request_id = submit(&emulator, LLAMA, prompts(3)).await;
    // (status, when its reply was back): a reply back less than `phase` after `started` was handled less than
    // `phase` after the submit, however loaded the machine, so it must say `queued`.
    let mut seen: Vec<(String, Duration)> = Vec::new();
    loop {
        let reply = poll(&emulator, LLAMA, &request_id).await;
        let status = reply.body["result"]["status"].as_str().unwrap_or("done").to_owned();
        if seen.last().map(|(last, _)| last) != Some(&status) {
            seen.push((status.clone(), started.elapsed()));
        }
        if status == "done" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never finished: {seen:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(started.elapsed() >= 2 * phase, "done only after both phases: {seen:?}");
    let order = ["queued", "running", "done"];
    let ranks: Vec<usize> =
        seen.iter().map(|(status, _)| order.iter().position(|o| o == status).expect("a known status")).collect();
    assert!(ranks.windows(2).all(|pair| pair[0] < pair[1]), "statuses in order: {seen:?}");
    let (first, first_back) = &seen[0];
    if *first_back < phase {
        assert_eq!(first, "queued", "{seen:?}");
    }
}

#[tokio::test]
async fn poll_without_queue_request_and_unencoded_model_work() {
    let emulator = start_paused().await;
    let request_id = submit(&emulator, "@cf/baai/bge-m3", json!([{ "text": "a" }])).await;
    let url = format!("{}/accounts/{}/ai/run/@cf/baai/bge-m3", emulator.base_url(), emulator.account_id());
    let reply = post_raw(&url, emulator.token(), json!({ "request_id": request_id }).to_string()).await.expect("reply");
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body["result"]["status"], "queued");
}

#[tokio::test]
async fn submit_status_can_be_202() {
    let emulator = start(EmulatorConfig { submit_status: 202, ..EmulatorConfig::default() }).await;
    let reply = post(&emulator, LLAMA, &json!({ "requests": prompts(1) })).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED);
    assert_eq!(reply.body["result"]["status"], "queued");
}

#[tokio::test]
async fn batches_complete_in_the_live_shape_and_the_documented_one_is_a_fault() {
    let emulator = start_paused().await;
    emulator.inject(Fault::documented_shape());
    let first = submit(&emulator, LLAMA, prompts(4)).await;
    let second = submit(&emulator, LLAMA, prompts(4)).await;
    let reply = finish_and_poll(&emulator, LLAMA, &first).await;
    let responses = reply.body["result"]["responses"].as_array().expect("responses");
    assert!(reply.body["result"].get("results").is_none());
    let ids: Vec<u64> = responses.iter().map(|r| r["id"].as_u64().expect("id")).collect();
    assert_eq!(ids.len(), 4);
    assert!(responses.iter().all(|r| r.get("index").is_none() && r["success"] == true));
    // The fault applied to one batch only: the next one has the default, live shape.
    let reply = poll(&emulator, LLAMA, &second).await;
    let results = reply.body["result"]["results"].as_array().expect("results");
    assert!(reply.body["result"].get("responses").is_none());
    let indices: Vec<u64> = results.iter().map(|r| r["index"].as_u64().expect("index")).collect();
    assert_eq!(indices.len(), 4);
    assert!(!indices.is_sorted());
    assert!(results.iter().all(|r| r.get("id").is_none() && r["success"] == true));
    assert_eq!(reply.body["result"]["usage"]["prompt_tokens"], 12);
}

#[tokio::test]
async fn the_documented_shape_option_applies_to_every_batch() {
    let emulator = start(EmulatorConfig {
        documented_shape: true,
        queued_for: Duration::ZERO,
        running_for: Duration::ZERO,
        ..EmulatorConfig::default()
    })
    .await;
    for _ in 0..2 {
        let id = submit(&emulator, LLAMA, prompts(2)).await;
        let reply = poll(&emulator, LLAMA, &id).await;
        assert_eq!(reply.body["result"]["responses"].as_array().expect("responses").len(), 2, "{}", reply.body);
        assert!(reply.body["result"].get("results").is_none());
    }
}

#[tokio::test]
async fn each_family_gets_its_own_output() {
    let emulator = start_paused().await;
    let small =
        submit(&emulator, "@cf/baai/bge-small-en-v1.5", json!([{ "text": ["a b", "c"] }, { "text": "d" }])).await;
    let m3 = submit(
        &emulator,
        "@cf/baai/bge-m3",
        json!([{ "query": "q", "contexts": [{ "text": "x" }, { "text": "y" }, { "text": "z" }], "external_reference": "m" }]),
    )
    .await;
    let m2m = submit(
        &emulator,
        "@cf/meta/m2m100-1.2b",
        json!([{ "text": "hello", "source_lang": "en", "target_lang": "fr" }]),
    )
    .await;
    let oss = submit(
        &emulator,
        "@cf/openai/gpt-oss-20b",
        json!([{ "input": [{ "role": "user", "content": "hi" }] }, { "messages": [{ "role": "user", "content": "hi" }] }]),
    )
    .await;

    let by_id = |reply: &crate::Reply, id: u64| -> Value {
        reply.body["result"]["results"]
            .as_array()
            .expect("results")
            .iter()
            .find(|r| r["index"] == id)
            .cloned()
            .expect("item present")
    };

    let reply = finish_and_poll(&emulator, "@cf/baai/bge-small-en-v1.5", &small).await;
    let first = by_id(&reply, 0);
    assert_eq!(first["result"]["shape"], json!([2, 384]));
    assert_eq!(first["result"]["data"][1].as_array().expect("vector").len(), 384);
    assert_eq!(by_id(&reply, 1)["result"]["shape"], json!([1, 384]));

    let reply = poll(&emulator, "@cf/baai/bge-m3", &m3).await;
    let item = by_id(&reply, 0);
    assert_eq!(item["external_reference"], "m");
    let scores = item["result"]["response"].as_array().expect("scores");
    assert_eq!(scores.len(), 3);
    assert!(scores.windows(2).all(|w| w[0]["score"].as_f64() >= w[1]["score"].as_f64()));

    let reply = poll(&emulator, "@cf/meta/m2m100-1.2b", &m2m).await;
    assert_eq!(by_id(&reply, 0)["result"], json!({ "translated_text": "[fr] hello" }));

    let reply = poll(&emulator, "@cf/openai/gpt-oss-20b", &oss).await;
    assert_eq!(by_id(&reply, 0)["result"]["response"], "echo: hi");
    let refused = by_id(&reply, 1);
    assert_eq!(refused["success"], false);
    assert_eq!(refused["error"]["code"], 5004);
    assert!(refused.get("result").is_none());
}

#[tokio::test]
async fn same_input_gives_same_output_across_batches() {
    let emulator = start_paused().await;
    let items = json!([{ "text": "stable" }]);
    let first = submit(&emulator, "@cf/baai/bge-base-en-v1.5", items.clone()).await;
    let second = submit(&emulator, "@cf/baai/bge-base-en-v1.5", items).await;
    let a = finish_and_poll(&emulator, "@cf/baai/bge-base-en-v1.5", &first).await;
    let b = poll(&emulator, "@cf/baai/bge-base-en-v1.5", &second).await;
    assert_eq!(a.body["result"]["results"][0]["result"], b.body["result"]["results"][0]["result"]);
}

#[tokio::test]
async fn extra_models_are_routed() {
    let config = EmulatorConfig {
        extra_models: vec![("@cf/test/tiny".to_owned(), batchd_emulator::Family::Embeddings { dim: 3 })],
        queued_for: FOREVER,
        ..EmulatorConfig::default()
    };
    let emulator = start(config).await;
    let request_id = submit(&emulator, "@cf/test/tiny", json!([{ "text": "x" }])).await;
    let reply = finish_and_poll(&emulator, "@cf/test/tiny", &request_id).await;
    assert_eq!(reply.body["result"]["results"][0]["result"]["shape"], json!([1, 3]));
}

#[tokio::test]
async fn extra_models_override_default_ones() {
    // Small vectors keep polls of very large embedding batches cheap.
    let config = EmulatorConfig {
        extra_models: vec![("@cf/baai/bge-small-en-v1.5".to_owned(), batchd_emulator::Family::Embeddings { dim: 4 })],
        queued_for: FOREVER,
        ..EmulatorConfig::default()
    };
    let emulator = start(config).await;
    let model = "@cf/baai/bge-small-en-v1.5";
    let request_id = submit(&emulator, model, json!([{ "text": ["x", "y"] }])).await;
    let reply = finish_and_poll(&emulator, model, &request_id).await;
    let result = &reply.body["result"]["results"][0]["result"];
    assert_eq!(result["shape"], json!([2, 4]));
    assert_eq!(result["data"][1].as_array().map(Vec::len), Some(4));
}
