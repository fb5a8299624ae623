//! Reply variants a client must handle: undocumented pending statuses, empty pending lists, odd JSON types,
//! strict whole-submit schema checks (5006) and models that refuse queuing (8007).

use std::time::Duration;

use batchd_emulator::{CallKind, EmulatorConfig, Fault, RateLimit};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    FOREVER, LLAMA,
    control::{control_get, control_post},
    finish_and_poll, poll, post, post_raw, start, start_paused, submit,
};

const BGE_M3: &str = "@cf/baai/bge-m3";

fn prompts(n: usize) -> Value {
    (0..n).map(|i| json!({ "prompt": format!("p{i}"), "external_reference": format!("r{i}") })).collect()
}

/// An item that does not fit the text-generation schema.
fn unfit() -> Value {
    json!({ "max_tokens": 5 })
}

/// The success envelope the emulator answers by default around `result`.
fn documented(result: Value) -> Value {
    json!({ "result": result, "success": true, "errors": [], "messages": [] })
}

fn error_envelope(code: i64, message: &str) -> Value {
    json!({ "result": null, "success": false, "errors": [{ "code": code, "message": message }], "messages": [] })
}

#[tokio::test]
async fn pending_status_replaces_queued_and_running_for_the_next_batches_only() {
    let emulator = start_paused().await;
    let (status, pending) =
        control_post(&emulator, "faults", json!({ "kind": "pending_status", "status": "processing", "times": 2 }))
            .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(pending, json!([{ "kind": "pending_status", "status": "processing", "calls": "any", "times": 2 }]));
    let first = submit(&emulator, LLAMA, prompts(2)).await;
    let second = submit(&emulator, LLAMA, prompts(2)).await;
    let clean = submit(&emulator, LLAMA, prompts(2)).await;
    assert!(emulator.pending_faults().is_empty());

    for request_id in [&first, &second] {
        let reply = poll(&emulator, LLAMA, request_id).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, documented(json!({ "status": "processing", "request_id": request_id })));
    }
    assert_eq!(poll(&emulator, LLAMA, &clean).await.body["result"]["status"], "queued");
    emulator.set_timing(Duration::ZERO, FOREVER);
    assert_eq!(poll(&emulator, LLAMA, &first).await.body["result"]["status"], "processing");
    assert_eq!(poll(&emulator, LLAMA, &clean).await.body["result"]["status"], "running");

    let reply = finish_and_poll(&emulator, LLAMA, &first).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body["success"], true);
    assert_eq!(reply.body["result"]["results"].as_array().map(Vec::len), Some(2));
    assert!(reply.body["result"].get("status").is_none());

    let faults: Vec<Option<String>> = emulator.submits().into_iter().map(|call| call.fault).collect();
    assert_eq!(faults, vec![Some("pending_status".to_owned()), Some("pending_status".to_owned()), None]);
}

#[tokio::test]
async fn empty_pending_list_adds_responses_to_pending_polls_of_the_next_batch() {
    let emulator = start_paused().await;
    let (status, _) = control_post(&emulator, "faults", json!({ "kind": "empty_pending_list" })).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(emulator.pending_faults(), vec![Fault::empty_pending_list()]);
    let faulted = submit(&emulator, LLAMA, prompts(3)).await;
    let clean = submit(&emulator, LLAMA, prompts(3)).await;

    let reply = poll(&emulator, LLAMA, &faulted).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, documented(json!({ "status": "queued", "request_id": faulted, "responses": [] })));
    emulator.set_timing(Duration::ZERO, FOREVER);
    let reply = poll(&emulator, LLAMA, &faulted).await;
    assert_eq!(reply.body, documented(json!({ "status": "running", "request_id": faulted, "responses": [] })));
    let reply = poll(&emulator, LLAMA, &clean).await;
    assert_eq!(reply.body, documented(json!({ "status": "running", "request_id": clean })));

    let reply = finish_and_poll(&emulator, LLAMA, &faulted).await;
    assert_eq!(reply.body["success"], true);
    let responses = reply.body["result"]["results"].as_array().expect("results");
    assert_eq!(responses.len(), 3);
    assert!(responses.iter().all(|response| response["success"] == true));
    assert!(reply.body["result"].get("status").is_none());
    assert_eq!(emulator.submits()[0].fault.as_deref(), Some("empty_pending_list"));
    assert_eq!(emulator.submits()[1].fault, None);
}

#[tokio::test]
async fn odd_types_change_the_json_types_of_the_next_batch_only() {
    let emulator = start_paused().await;
    emulator.inject(Fault::odd_types());
    let requests = json!([
        { "prompt": "hi", "external_reference": "r0" },
        { "max_tokens": 5, "external_reference": "r1" },
        { "prompt": "two words", "external_reference": "r2" }
    ]);

    let reply = post(&emulator, LLAMA, &json!({ "requests": requests })).await;
    assert_eq!(reply.status, StatusCode::OK);
    let request_id = reply.body["result"]["request_id"].as_str().expect("request id").to_owned();
    assert_eq!(
        reply.body,
        json!({
            "result": { "status": "queued", "request_id": request_id, "model": LLAMA },
            "success": "true",
            "errors": [],
            "messages": []
        })
    );
    let clean = submit(&emulator, LLAMA, requests.clone()).await;

    let reply = poll(&emulator, LLAMA, &request_id).await;
    assert_eq!(
        reply.body,
        json!({ "result": { "status": "queued", "request_id": request_id }, "success": 1, "errors": [], "messages": [] })
    );
    assert!(reply.body["success"].is_u64());
    assert_eq!(poll(&emulator, LLAMA, &clean).await.body["success"], true);

    let reply = finish_and_poll(&emulator, LLAMA, &request_id).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body["success"], "true");
    let responses = reply.body["result"]["results"].as_array().expect("results");
    let mut ids: Vec<&str> = responses.iter().map(|r| r["index"].as_str().expect("index is a string")).collect();
    ids.sort();
    assert_eq!(ids, vec!["0", "1", "2"]);
    let by_id = |id: &str| responses.iter().find(|r| r["index"] == id).expect("present");
    assert_eq!(
        *by_id("0"),
        json!({ "index": "0", "result": "{\"response\":\"echo: hi\"}", "success": "true", "external_reference": "r0" })
    );
    let parsed: Value = serde_json::from_str(by_id("2")["result"].as_str().expect("result is text")).expect("json");
    assert_eq!(parsed, json!({ "response": "echo: two words" }));
    let bad = by_id("1");
    assert_eq!(bad["success"], "false");
    assert_eq!(bad["error"]["code"], 5004);
    assert!(bad["error"]["message"].is_string());
    assert!(bad.get("result").is_none());
    assert_eq!(reply.body["result"]["usage"], json!({ "prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8 }));

    // The next batch answers the documented types.
    let reply = poll(&emulator, LLAMA, &clean).await;
    assert_eq!(reply.body["success"], true);
    let responses = reply.body["result"]["results"].as_array().expect("results");
    assert!(responses.iter().all(|r| r["index"].is_u64() && r["success"].is_boolean()));
    let good = responses.iter().find(|r| r["index"] == 0).expect("item 0");
    assert_eq!(good["result"], json!({ "response": "echo: hi" }));
    assert_eq!(reply.body["result"]["usage"], json!({ "prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8 }));

    let faults: Vec<Option<String>> = emulator.submits().into_iter().map(|call| call.fault).collect();
    assert_eq!(faults, vec![Some("odd_types".to_owned()), None]);
}

#[tokio::test]
async fn strict_items_refuse_a_submit_naming_its_first_unfit_item_and_create_no_batch() {
    let emulator = start(EmulatorConfig { queued_for: FOREVER, strict_items: true, ..EmulatorConfig::default() }).await;
    emulator.inject(Fault::fail_items([0]));
    let good = |i: usize| json!({ "prompt": format!("p{i}"), "external_reference": format!("r{i}") });
    let refusal = |index: usize| {
        error_envelope(
            5006,
            &format!(
                "AiError: Bad input: Error: oneOf at '/requests/{index}' not met, 0 matches: expected prompt or messages"
            ),
        )
    };

    let whole = json!([good(0), good(1), unfit(), good(3), unfit()]);
    let reply = post(&emulator, LLAMA, &json!({ "requests": whole })).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.body, refusal(2));
    assert_eq!(emulator.batch_count(), 0);
    assert_eq!(emulator.pending_faults(), vec![Fault::fail_items([0])], "a refused submit uses no batch fault");
    let call = emulator.calls().pop().expect("a call");
    assert_eq!(call.kind, CallKind::Rejected);
    assert_eq!((call.http_status, call.error_code, call.n_items), (400, Some(5006), Some(5)));
    assert_eq!(call.request_id, None);

    // The same batch without its unfit items is accepted.
    submit(&emulator, LLAMA, json!([good(0), good(1), good(3)])).await;
    assert_eq!(emulator.batch_count(), 1);

    // Every submit is checked: bisecting isolates each unfit item, and every fit half goes through.
    submit(&emulator, LLAMA, json!([good(0), good(1)])).await;
    let reply = post(&emulator, LLAMA, &json!({ "requests": [good(3), unfit()] })).await;
    assert_eq!(reply.body, refusal(1));
    let reply = post(&emulator, LLAMA, &json!({ "requests": [unfit()] })).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.body, refusal(0));
    submit(&emulator, LLAMA, json!([good(3)])).await;
    assert_eq!(emulator.batch_count(), 3);

    // Off at runtime: the unfit item fails alone again; back on over HTTP.
    emulator.set_strict_items(false);
    let request_id = submit(&emulator, LLAMA, json!([good(0), unfit()])).await;
    let reply = finish_and_poll(&emulator, LLAMA, &request_id).await;
    let bad = reply.body["result"]["results"].as_array().expect("results").iter().find(|r| r["index"] == 1).cloned();
    assert_eq!(bad.expect("item 1")["error"]["code"], 5004);
    let (status, view) = control_post(&emulator, "config", json!({ "strict_items": true })).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(view["strict_items"], true);
    let reply = post(&emulator, LLAMA, &json!({ "requests": [good(0), unfit()] })).await;
    assert_eq!(reply.body, refusal(1));
    assert_eq!(emulator.batch_count(), 4);
}

#[tokio::test]
async fn unbatchable_models_refuse_queued_submits_with_8007_and_create_no_batch() {
    let emulator = start(EmulatorConfig {
        queued_for: FOREVER,
        rate_limit: Some(RateLimit::per_minute(1)),
        ..EmulatorConfig::default()
    })
    .await;
    let before = submit(&emulator, BGE_M3, json!([{ "text": "a" }])).await;
    emulator.reset();

    let (status, view) = control_post(&emulator, "config", json!({ "unbatchable_models": [BGE_M3] })).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(view["unbatchable_models"], json!([BGE_M3]));
    for _ in 0..2 {
        let reply = post(&emulator, BGE_M3, &json!({ "requests": [{ "text": "a" }] })).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST);
        assert_eq!(reply.body, error_envelope(8007, "@cf/baai/bge-m3 does not support request queuing"));
    }
    assert_eq!(emulator.batch_count(), 1);
    assert_eq!(control_get(&emulator, "batches").await.as_array().map(Vec::len), Some(1));
    let call = emulator.calls().pop().expect("a call");
    assert_eq!(call.kind, CallKind::Rejected);
    assert_eq!((call.http_status, call.error_code, call.request_id), (400, Some(8007), None));

    // Polls are unaffected.
    let reply = poll(&emulator, BGE_M3, &before).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body["result"]["status"], "queued");

    // An unknown model is still 5007, even when listed.
    emulator.set_unbatchable_models(["@cf/nobody/nothing", BGE_M3]);
    let reply = post(&emulator, "@cf/nobody/nothing", &json!({ "requests": [{ "prompt": "x" }] })).await;
    assert_eq!(reply.error_code(), 5007);
    assert_eq!(control_get(&emulator, "config").await["unbatchable_models"], json!(["@cf/nobody/nothing", BGE_M3]));

    // Cleared, the model takes batches again; the refusals came before the rate limit, so the window of one
    // call per minute is still free.
    emulator.set_unbatchable_models(Vec::<String>::new());
    submit(&emulator, BGE_M3, json!([{ "text": "a" }])).await;
    assert_eq!(emulator.batch_count(), 2);
    assert_eq!(emulator.rate_limited_count(), 0);

    // A submit without `?queueRequest=true` is not a queued one: it gets the synchronous-run 5004.
    emulator.reset();
    emulator.set_unbatchable_models([BGE_M3]);
    let url = format!("{}/accounts/{}/ai/run/{BGE_M3}", emulator.base_url(), emulator.account_id());
    let reply =
        post_raw(&url, emulator.token(), json!({ "requests": [{ "text": "a" }] }).to_string()).await.expect("reply");
    assert_eq!(reply.error_code(), 5004);
}
