//! Namespaces that share one provider account (DESIGN decision 23, STYLE rule 30): two tenants run the same job
//! id against one emulator account; the second tenant's create meets a fault whose outcome it cannot know, so it
//! looks the batch up before creating again. It must never adopt the first tenant's batch, and each tenant gets
//! only its own answers. Real daemons in-process, real Redis, the emulator's OpenAI and Anthropic APIs over HTTP.

use std::time::Duration;

use batchd::settings::Settings;
use batchd_core::{Keys, ResultEntry, ResultStatus, ledger::field};
use batchd_emulator::{AnthropicCallKind, AnthropicCalls, AnthropicFault, OpenAiCallKind, OpenAiFault};
use batchd_tests::{Daemon, World, wait_until, with_anthropic, with_openai};
use redis::AsyncCommands;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// The second tenant: the world's Redis and emulator account, another namespace.
struct Tenant {
    /// Its daemon's settings.
    settings: Settings,
    /// Its keys.
    keys: Keys,
}

impl Tenant {
    fn beside(world: &World, settings: &Settings) -> Self {
        let mut settings = settings.clone();
        settings.redis.namespace = format!("{}-b", world.settings.redis.namespace);
        let keys = settings.keys();
        Self { settings, keys }
    }

    async fn enqueue(&self, world: &World, job: &Value) {
        let mut conn = world.conn.clone();
        let _: String = conn.xadd(self.keys.submit(), "*", &[("job", job.to_string())]).await.expect("xadd");
    }

    async fn wait_for_result(&self, world: &World, job_id: &str) -> ResultEntry {
        let mut found = None;
        wait_until("the second tenant's result", WAIT, async || {
            let entries = world.stream(&self.keys.results()).await;
            let mine: Vec<_> = entries.into_iter().filter(|fields| fields["job_id"] == job_id).collect();
            assert!(mine.len() <= 1, "{job_id} has {} results", mine.len());
            found = mine.into_iter().next();
            found.is_some()
        })
        .await;
        ResultEntry::from_fields(&found.expect("result")).expect("well-formed result")
    }

    async fn ledger_field(&self, world: &World, job_id: &str, name: &str) -> Option<String> {
        let id = batchd_core::JobId::parse(job_id).expect("job id");
        world.conn.clone().hget(self.keys.job(&id), name).await.expect("hget")
    }
}

/// The text of each response of an OpenAI chat result.
fn openai_texts(entry: &ResultEntry) -> Vec<String> {
    responses(entry, |message| message["choices"][0]["message"]["content"].as_str().map(str::to_owned))
}

/// The text of each response of an Anthropic result.
fn anthropic_texts(entry: &ResultEntry) -> Vec<String> {
    responses(entry, |message| message["content"][0]["text"].as_str().map(str::to_owned))
}

fn responses(entry: &ResultEntry, text: impl Fn(&Value) -> Option<String>) -> Vec<String> {
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    let output = entry.result.as_ref().expect("result");
    output
        .responses
        .iter()
        .map(|response| {
            let message: Value =
                serde_json::from_str(response.result.as_ref().expect("a successful item").get()).expect("json");
            text(&message).expect("text")
        })
        .collect()
}

/// Each text answers its own tenant's question and none answers the other's.
fn assert_own(texts: &[String], own: &str, other: &str) {
    assert!(!texts.is_empty());
    for text in texts {
        assert!(text.contains(own) && !text.contains(other), "{text:?} is not an answer to tenant {own}'s question");
    }
}

#[tokio::test]
async fn openai_a_second_namespace_never_adopts_the_first_ones_batch_of_the_same_job_id() {
    let world = World::new().await;
    let mut settings = world.settings.clone();
    with_openai(&mut settings, &world.emulator);
    let openai = world.emulator.openai();
    let chat = |text: &str| json!({"messages": [{"role": "user", "content": text}], "max_tokens": 5});

    // Tenant A runs `inv-42`; its batch stays in the account's list, tagged with the job id and chunk 0.
    let daemon_a = Daemon::start(settings.clone(), &world.emulator);
    world.enqueue(&json!({"id": "inv-42", "model": "openai/gpt-4o-mini", "requests": [chat("tenant-A secret")]})).await;
    let a = world.wait_for_result("inv-42", WAIT).await;
    assert_own(&openai_texts(&a), "tenant-A", "tenant-B");
    daemon_a.stop().await.expect("stop");

    // Tenant B's `inv-42`: its first create is answered by a 500 (nothing was created, but B cannot know that).
    openai.inject(OpenAiFault::status(500).on(OpenAiCallKind::CreateBatch));
    let tenant_b = Tenant::beside(&world, &settings);
    let daemon_b = Daemon::start(tenant_b.settings.clone(), &world.emulator);
    let job_b = json!({"id": "inv-42", "model": "openai/gpt-4o-mini", "requests": [chat("tenant-B question")]});
    tenant_b.enqueue(&world, &job_b).await;
    let b = tenant_b.wait_for_result(&world, "inv-42").await;
    assert_own(&openai_texts(&b), "tenant-B", "tenant-A");
    assert!(!openai.calls_of(OpenAiCallKind::ListBatches).is_empty(), "B looked its batch up before creating");
    assert_eq!(openai.batch_count(), 2, "B created its own batch rather than adopting A's");
    assert_ne!(a.request_ids, b.request_ids);
    daemon_b.stop().await.expect("stop");
}

#[tokio::test]
async fn anthropic_a_second_namespace_waits_for_a_running_lookalike_and_never_adopts_it() {
    let world = World::new().await;
    let mut settings = world.settings.clone();
    with_anthropic(&mut settings, &world.emulator);
    // Tenant A keeps its ended batches (so they stay in the account's list).
    settings.anthropic.delete_batches = false;
    let anthropic = world.emulator.anthropic();
    // Batches run until the test ends them.
    anthropic.set_timing(Duration::from_secs(600), Duration::from_millis(10));
    let item = |text: &str| json!({"max_tokens": 32, "messages": [{"role": "user", "content": text}]});
    let job = |who: &str| {
        json!({"id": "inv-42", "model": "anthropic/claude-sonnet-4-5",
               "requests": [item(&format!("tenant-{who} first")), item(&format!("tenant-{who} second"))]})
    };

    // Tenant A's `inv-42` is created and runs.
    let daemon_a = Daemon::start(settings.clone(), &world.emulator);
    world.enqueue(&job("A")).await;
    wait_until("A's batch exists", WAIT, async || anthropic.batch_count() == 1).await;
    let batch_a = anthropic.batch_ids()[0].clone();

    // Tenant B's `inv-42`, of the same size, meets a reset on its create: it cannot know that nothing was created.
    anthropic.inject(AnthropicFault::reset().on(AnthropicCalls::Create));
    let tenant_b = Tenant::beside(&world, &settings);
    let daemon_b = Daemon::start(tenant_b.settings.clone(), &world.emulator);
    tenant_b.enqueue(&world, &job("B")).await;
    // A's running batch could be B's (same size, created in the window), but its custom ids cannot be read yet:
    // B looks again and again, creating nothing, adopting nothing, counting one possible duplicate only.
    wait_until("B looked three times", WAIT, async || anthropic.calls_of(AnthropicCallKind::List).len() >= 3).await;
    assert_eq!(anthropic.calls_of(AnthropicCallKind::Create).len(), 2, "A's create and B's reset one, no other");
    assert_eq!(anthropic.batch_count(), 1);
    let counted = tenant_b.ledger_field(&world, "inv-42", field::POSSIBLE_DUPLICATE_SUBMITS).await;
    assert_eq!(counted.as_deref(), Some("1"), "a look that waits is not another possible duplicate");
    let request_id = tenant_b.ledger_field(&world, "inv-42", &field::chunk(0, field::CHUNK_REQUEST_ID)).await;
    assert_eq!(request_id.unwrap_or_default(), "", "B recorded no batch while it could not check one");

    // A's batch ends: A gets its answers, B reads A's custom ids (another nonce) and creates its own batch.
    assert!(anthropic.finish_items(&batch_a, 2));
    let a = world.wait_for_result("inv-42", WAIT).await;
    assert_own(&anthropic_texts(&a), "tenant-A", "tenant-B");
    wait_until("B created its own batch", WAIT, async || anthropic.batch_count() == 2).await;
    let batch_b = anthropic.batch_ids().into_iter().find(|id| *id != batch_a).expect("B's batch");
    assert!(anthropic.finish_items(&batch_b, 2));
    let b = tenant_b.wait_for_result(&world, "inv-42").await;
    assert_own(&anthropic_texts(&b), "tenant-B", "tenant-A");
    assert_eq!(b.request_ids, [batch_b]);
    daemon_a.stop().await.expect("stop");
    daemon_b.stop().await.expect("stop");
}

#[tokio::test]
async fn anthropic_a_second_namespace_never_adopts_the_first_ones_ended_batch_of_the_same_job_id() {
    let world = World::new().await;
    let mut settings = world.settings.clone();
    with_anthropic(&mut settings, &world.emulator);
    settings.anthropic.delete_batches = false;
    let anthropic = world.emulator.anthropic();
    let item = |text: &str| json!({"max_tokens": 32, "messages": [{"role": "user", "content": text}]});
    let job = |who: &str| json!({"id": "inv-42", "model": "anthropic/claude-sonnet-4-5", "requests": [item(&format!("tenant-{who} only"))]});

    let daemon_a = Daemon::start(settings.clone(), &world.emulator);
    world.enqueue(&job("A")).await;
    let a = world.wait_for_result("inv-42", WAIT).await;
    assert_own(&anthropic_texts(&a), "tenant-A", "tenant-B");
    daemon_a.stop().await.expect("stop");

    // B's create is reset: A's ended batch of the same size is in the look's window, and is read and refused.
    anthropic.inject(AnthropicFault::reset().on(AnthropicCalls::Create));
    let tenant_b = Tenant::beside(&world, &settings);
    let daemon_b = Daemon::start(tenant_b.settings.clone(), &world.emulator);
    tenant_b.enqueue(&world, &job("B")).await;
    let b = tenant_b.wait_for_result(&world, "inv-42").await;
    assert_own(&anthropic_texts(&b), "tenant-B", "tenant-A");
    assert!(!anthropic.calls_of(AnthropicCallKind::List).is_empty(), "B looked before creating again");
    assert_eq!(anthropic.batch_count(), 2, "B created its own batch");
    daemon_b.stop().await.expect("stop");
}
