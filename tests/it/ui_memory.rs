//! The dashboard's memory is bounded in bytes whatever results it is asked to show (issue 38): a real `batchd ui`
//! process on a real Redis, results published by the daemon's own publish step (`Store::publish`, which records
//! each entry's size in its ledger). A 76 MB result is shown as its size and the `batchd tail` command that prints
//! it, and never read; a ledger from before sizes were recorded renders without reading its entry; six results just
//! under the dashboard's 8 MiB cap are paged through, more than its 32 MiB cache holds; job pages and the
//! failed-jobs walk are asked for many at once. Through all of it the process's peak RSS (`VmHWM`) stays at or under
//! 128 MiB: the shipped UI pod's limit is 256 Mi, and the security review measured 326 MB for one view of a 76 MB
//! result before.
//!
//! It runs in nextest's `process-heavy` group (.config/nextest.toml): it moves about 130 MB through Redis, and a
//! second heavy process beside it would slow both.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use batchd_core::ledger::field;
use batchd_core::{ItemResponse, JobId, JobOutput, JobState, ResultEntry, ResultStatus};
use batchd_queue::{Store, StoreSettings};
use batchd_tests::{World, free_port, workspace_binary};
use serde_json::value::RawValue;
use serde_json::{Value, json};

const MIB: usize = 1024 * 1024;

/// The bound on the dashboard's peak RSS.
const PEAK_LIMIT: usize = 128 * MIB;

/// The dashboard reads a result entry of at most this many bytes (`ui::data::RESULT_SHOWN_BYTES`).
const SHOWN_LIMIT: usize = 8 * MIB;

/// Patient: a debug build, a machine shared with other builds.
const WAIT: Duration = Duration::from_secs(60);

/// A `batchd ui` process, read-only, on a free port; killed when dropped. Its stderr goes to a file, shown when a
/// check fails.
struct UiProcess {
    /// Its address.
    base: String,
    /// The process.
    child: Child,
    /// Where its stderr goes.
    log: PathBuf,
}

impl UiProcess {
    /// Starts `batchd ui` on the world's Redis and namespace and waits until it says Redis answers (`/readyz`).
    async fn start(world: &World) -> Self {
        let port = free_port();
        let log = std::env::temp_dir().join(format!("batchd-ui-memory-{}.log", uuid::Uuid::new_v4().simple()));
        let child = std::process::Command::new(workspace_binary("batchd").expect("batchd binary"))
            .env_clear()
            .envs(world.batchd_env())
            .args(["ui", "--listen", &format!("127.0.0.1:{port}"), "--refresh-secs", "0"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start batchd ui");
        let ui = Self { base: format!("http://127.0.0.1:{port}"), child, log };
        let started = Instant::now();
        while ui.get("/readyz").await.map(|(status, _)| status) != Some(200) {
            assert!(started.elapsed() < WAIT, "batchd ui not ready within {WAIT:?}: {}", ui.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        ui
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET path`: its status and body; `None` when nothing answered.
    async fn get(&self, path: &str) -> Option<(u16, String)> {
        let client = reqwest::Client::builder().no_proxy().timeout(WAIT).build().expect("HTTP client");
        let response = client.get(format!("{}{path}", self.base)).send().await.ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().await.ok()?))
    }

    /// `GET path`, which must answer 200: its body.
    async fn page(&self, path: &str) -> String {
        match self.get(path).await {
            Some((200, body)) => body,
            other => panic!("GET {path}: {other:?}\n{}", self.log()),
        }
    }

    /// `GET path` as JSON, which must answer 200.
    async fn json(&self, path: &str) -> Value {
        serde_json::from_str(&self.page(path).await).unwrap_or_else(|e| panic!("GET {path}: not JSON: {e}"))
    }

    /// A size field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in bytes.
    fn status_bytes(&self, name: &str) -> usize {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("read /proc status");
        let line = status.lines().find(|line| line.starts_with(&format!("{name}:"))).expect("field in status");
        let kib: usize = line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("a size in kB");
        kib * 1024
    }
}

impl Drop for UiProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A store on the world's Redis and namespace: the daemon's own publish step.
fn store(world: &World) -> Store {
    let client = redis::Client::open(world.redis.url()).expect("url");
    let conn = batchd_queue::connect(client, Duration::from_secs(30)).expect("connect");
    Store::new(conn, world.keys.clone(), StoreSettings::default())
}

/// Publishes a completed one-chunk job `id` with `n` responses of `response_bytes` bytes of output each, the way
/// the daemon does (a running ledger, then `Store::publish`). Returns its result entry's id.
async fn publish(world: &World, store: &Store, id: &str, n: usize, response_bytes: usize) -> String {
    let mut conn = world.conn.clone();
    let ledger = world.keys.job(&JobId::parse(id).expect("job id"));
    let _: () = redis::cmd("HSET")
        .arg(&ledger)
        .arg(&[
            (field::STATE, "running".to_owned()),
            (field::MODEL, "@cf/meta/llama-3.1-8b-instruct".to_owned()),
            (field::N_CHUNKS, "1".to_owned()),
            (field::N_ITEMS, n.to_string()),
            (field::ACCEPTED_AT, "1763769600000".to_owned()),
            (field::REPLY_TO, world.keys.results()),
            (field::chunk(0, field::CHUNK_STATE).as_str(), "done".to_owned()),
            (field::chunk(0, field::CHUNK_ITEMS).as_str(), format!("0:{n}")),
        ])
        .query_async(&mut conn)
        .await
        .expect("HSET ledger");
    let text = "x".repeat(response_bytes);
    let responses = (0..n)
        .map(|index| ItemResponse {
            index,
            success: true,
            result: Some(RawValue::from_string(json!({"response": text}).to_string()).expect("raw JSON")),
            error: None,
            external_reference: None,
            resent: false,
        })
        .collect();
    let entry = ResultEntry {
        job_id: id.to_owned(),
        status: ResultStatus::Completed,
        model: "@cf/meta/llama-3.1-8b-instruct".to_owned(),
        result: Some(JobOutput { responses, usage: json!({"prompt_tokens": n}), failed_batches: Vec::new() }),
        error: None,
        metadata: None,
        request_ids: vec!["r-1".to_owned()],
        accepted_at: 1_763_769_600_000,
        finished_at: 1_763_769_605_250,
        items_total: n,
        items_failed: 0,
    };
    let job_id = JobId::parse(id).expect("job id");
    let published = store
        .publish(&job_id, entry, JobState::Completed, &world.keys.results(), 1_763_769_605_250)
        .await
        .expect("publish");
    assert!(published, "{id} published once");
    redis::cmd("HGET").arg(&ledger).arg(field::RESULT_ENTRY).query_async(&mut conn).await.expect("result_entry")
}

/// The bytes of result entry `entry_id`'s field names and values, as Redis holds them.
async fn entry_bytes(world: &World, entry_id: &str) -> u64 {
    let entries: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg(world.keys.results())
        .arg(entry_id)
        .arg(entry_id)
        .query_async(&mut world.conn.clone())
        .await
        .expect("XRANGE");
    let (_, fields) = entries.into_iter().next().expect("the entry");
    fields.iter().map(|(name, value)| (name.len() + value.len()) as u64).sum()
}

/// A ledger field of job `id`.
async fn ledger_field(world: &World, id: &str, name: &str) -> Option<String> {
    let ledger = world.keys.job(&JobId::parse(id).expect("job id"));
    redis::cmd("HGET").arg(ledger).arg(name).query_async(&mut world.conn.clone()).await.expect("HGET")
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / MIB as f64
}

#[tokio::test]
async fn a_76_mb_result_is_shown_by_its_size_and_the_dashboards_peak_rss_stays_under_128_mib() {
    let world = World::new().await;
    let store = store(&world);
    let ns = world.keys.namespace().to_owned();

    // The 76 MB result: 19,000 responses of 4,000 bytes of output.
    let big_entry = publish(&world, &store, "big", 19_000, 4_000).await;
    let big_bytes = entry_bytes(&world, &big_entry).await;
    assert!(big_bytes >= 76_000_000, "the big result is {big_bytes} bytes");
    let recorded = ledger_field(&world, "big", field::RESULT_BYTES).await;
    assert_eq!(recorded, Some(big_bytes.to_string()), "the publish records the entry's size in the ledger");
    // A ledger from before sizes were recorded, pointing at the same entry.
    let mut conn = world.conn.clone();
    let old = world.keys.job(&JobId::parse("old").expect("job id"));
    let _: () = redis::cmd("HSET")
        .arg(&old)
        .arg(&[
            (field::STATE, "completed"),
            (field::N_CHUNKS, "0"),
            (field::REPLY_TO, world.keys.results().as_str()),
            (field::RESULT_ENTRY, big_entry.as_str()),
        ])
        .query_async(&mut conn)
        .await
        .expect("HSET old ledger");
    // Six results just under the cap (about 8 MiB less 100 KB each): 48 MiB to page through, more than the cache's
    // 32 MiB.
    let near_n = 1_950;
    for i in 0..6 {
        let entry = publish(&world, &store, &format!("near-{i}"), near_n, 4_200).await;
        let bytes = entry_bytes(&world, &entry).await as usize;
        assert!(bytes <= SHOWN_LIMIT && bytes > SHOWN_LIMIT - 200_000, "near-{i} is {bytes} bytes");
    }
    // Failed jobs for the failed-jobs walk.
    for i in 0..200 {
        let ledger = world.keys.job(&JobId::parse(&format!("failed-{i}")).expect("job id"));
        let _: () = redis::cmd("HSET")
            .arg(&ledger)
            .arg(&[
                (field::STATE, "failed"),
                (field::MODEL, "@cf/meta/llama-3.1-8b-instruct"),
                (field::FINISHED_AT, "1763769605250"),
                (field::ERROR, r#"{"code":"api_error","message":"refused"}"#),
            ])
            .query_async(&mut conn)
            .await
            .expect("HSET failed ledger");
    }

    let ui = UiProcess::start(&world).await;
    let idle_rss = ui.status_bytes("VmRSS");

    // The 76 MB result: its size and the command that prints it, in the page and its JSON twin.
    let tail =
        format!("batchd --namespace {ns} tail --stream '{}' --from {big_entry} --count 1 --json", world.keys.results());
    let html = ui.page("/jobs/big").await;
    let size = format!("{:.1} MiB ({} bytes)", big_bytes as f64 / MIB as f64, grouped(big_bytes));
    assert!(html.contains(&size), "the page gives the size, {size}: {html}");
    assert!(html.contains(&html_escaped(&tail)), "the page names `batchd tail` for it: {html}");
    let twin = ui.json("/api/jobs/big?page=3").await;
    assert_eq!(twin["result"]["not_read"], true, "{}", twin["result"]);
    assert_eq!(twin["result"]["bytes"], big_bytes);
    assert_eq!(twin["result"]["read_with"], tail.as_str());
    assert_eq!(twin["result"]["entry_id"], big_entry.as_str());
    assert_eq!(twin["responses_page"]["total"], 0);
    assert_eq!(twin["job"][field::RESULT_BYTES], big_bytes, "status --json's number");
    // Many at once: each waits its turn, none reads the entry.
    let answers = futures::future::join_all((0..16).map(|i| {
        let path = if i % 2 == 0 { "/jobs/big".to_owned() } else { format!("/api/jobs/big?page={i}") };
        let ui = &ui;
        async move { (ui.get(&path).await.map(|(status, _)| status), path) }
    }))
    .await;
    for (status, path) in answers {
        assert_eq!(status, Some(200), "GET {path}");
    }

    // A ledger without the size renders, saying so, and reads nothing.
    let twin = ui.json("/api/jobs/old").await;
    assert_eq!(twin["result"]["not_read"], true);
    assert!(twin["result"]["bytes"].is_null());
    assert!(ui.page("/jobs/old").await.contains("not recorded"));

    // The results under the cap are read and paged (page 2 holds responses 50-99), each more than once, three jobs
    // and the failed-jobs walk at a time.
    for round in 0..2 {
        for first in [0, 3] {
            let pages = futures::future::join_all((first..first + 3).map(|i| {
                let ui = &ui;
                async move { (i, ui.json(&format!("/api/jobs/near-{i}?page=1")).await) }
            }));
            let walks = futures::future::join_all((0..3).map(|_| ui.json("/api/failed")));
            let (pages, walks) = tokio::join!(pages, walks);
            for (i, twin) in pages {
                let responses = twin["result"]["result"]["responses"].as_array().expect("responses");
                assert_eq!(responses.len(), 50, "near-{i}, round {round}");
                assert_eq!(responses[0]["index"], 50, "near-{i}");
                assert_eq!(twin["responses_page"]["total"], near_n, "near-{i}");
                assert_eq!(twin["result"]["status"], "completed");
            }
            for walk in walks {
                assert_eq!(walk["total"], 200, "{walk}");
            }
        }
    }

    let peak_rss = ui.status_bytes("VmHWM");
    let kept_rss = ui.status_bytes("VmRSS");
    let figures = format!(
        "idle RSS {:.1} MiB, peak RSS {:.1} MiB, RSS after {:.1} MiB (76 MB result: {big_bytes} bytes; six of {:.1} MiB \
         read)",
        mib(idle_rss),
        mib(peak_rss),
        mib(kept_rss),
        mib(SHOWN_LIMIT)
    );
    eprintln!("batchd ui: {figures}");
    assert!(peak_rss <= PEAK_LIMIT, "the dashboard's peak RSS is over 128 MiB: {figures}");
}

/// `n` with a comma between each three digits, as the page writes a size.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// `text` as maud escapes it in a page.
fn html_escaped(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}
