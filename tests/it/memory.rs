//! The memory limit is a formula of one setting, and the setting is what holds it: a real daemon process stays
//! under idle + `workers.inflight_bytes` + a stated slack while four times its budget of jobs arrives at once
//! (docs/operations.md, "Memory and threads"; a daemon that ignores the budget goes over), and an entry over
//! `jobs.max_entry_bytes` costs about twice its size, once. The daemon runs as its own process so that its peak RSS (`VmHWM`) is its alone.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use batchd_core::ResultEntry;
use batchd_emulator::{DurationRange, EmulatorConfig};
use batchd_tests::World;
use redis::AsyncCommands;

/// Patient: a debug daemon moves about 200 MB here (and reads a 90 MB entry in several passes in hostile.rs).
const WAIT: Duration = Duration::from_secs(300);

const MIB: usize = 1024 * 1024;

/// `batchd run` as its own process (so that its `/proc/<pid>/status` sizes are its alone), killed when dropped; its
/// stderr goes to a file, shown if it dies. The hostile-entry tests use it too.
pub(crate) struct DaemonProcess {
    /// The process.
    child: Child,
    /// Where its stderr goes.
    log: PathBuf,
}

impl DaemonProcess {
    /// Starts `batchd run` on the world's Redis, namespace and emulator, with `extra` settings on top.
    pub(crate) fn start(world: &World, extra: &[(&str, String)]) -> Self {
        let log = std::env::temp_dir().join(format!("batchd-it-daemon-{}.log", uuid::Uuid::new_v4().simple()));
        let child = world
            .batchd()
            .arg("run")
            .env("CLOUDFLARE_API_TOKEN", world.emulator.token())
            .env("BATCHD__ADMIN__LISTEN", "")
            .envs(extra.iter().map(|(name, value)| (name, value)))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("daemon log file"))
            .spawn()
            .expect("start batchd");
        Self { child, log }
    }

    /// Waits until every job of `job_ids` has its result; fails at once if the daemon exits, or after [`WAIT`].
    pub(crate) async fn wait_for_results(&mut self, world: &World, job_ids: &HashSet<String>) {
        let started = Instant::now();
        loop {
            let results = world.results().await;
            let done = results.iter().filter_map(|fields| fields.get("job_id")).filter(|id| job_ids.contains(*id));
            if done.count() == job_ids.len() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                panic!("the daemon exited ({status}) before every result:\n{log}");
            }
            assert!(started.elapsed() < WAIT, "timed out waiting for results ({} of {})", results.len(), job_ids.len());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits for the one result of `job_id` (see [`DaemonProcess::wait_for_results`]).
    pub(crate) async fn wait_for_result(&mut self, world: &World, job_id: &str) -> ResultEntry {
        self.wait_for_results(world, &HashSet::from([job_id.to_owned()])).await;
        let results = world.results().await;
        let fields = results.iter().find(|fields| fields.get("job_id").map(String::as_str) == Some(job_id));
        ResultEntry::from_fields(fields.expect("the result just seen")).expect("well-formed result")
    }

    /// A size field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in bytes.
    pub(crate) fn status_bytes(&self, field: &str) -> usize {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("read /proc status");
        let line = status.lines().find(|line| line.starts_with(&format!("{field}:"))).expect("field in status");
        let kib: usize = line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("a size in kB");
        kib * 1024
    }

    /// Whether the process still runs.
    pub(crate) fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A bge-m3 job of about `bytes`, in items of about 1 KB.
fn big_job(id: &str, bytes: usize) -> Vec<u8> {
    let item = format!(r#"{{"query":"{}","contexts":[{{"text":"c"}}]}}"#, "q".repeat(1000));
    let n_items = bytes / (item.len() + 1);
    let mut job = format!(r#"{{"id":"{id}","model":"@cf/baai/bge-m3","requests":["#).into_bytes();
    for i in 0..n_items {
        if i > 0 {
            job.push(b',');
        }
        job.extend_from_slice(item.as_bytes());
    }
    job.extend_from_slice(b"]}");
    job
}

/// `{"id":"empty-items","model":...,"requests":[{},{},...]}` with `n_items` empty items.
fn empty_items_job(n_items: usize) -> Vec<u8> {
    let mut job = br#"{"id":"empty-items","model":"@cf/baai/bge-m3","requests":["#.to_vec();
    job.extend_from_slice(&b"{},".repeat(n_items - 1));
    job.extend_from_slice(b"{}]}");
    job
}

/// What the budget test allows above idle + `workers.inflight_bytes` + 3 × the largest entry (the formula of
/// docs/operations.md): 1.5 × the budget, 48 MiB, so 86 MiB above idle in all. Measured here: 63.2-69.4 MiB above
/// idle in four runs, so the daemon holds about 2 × its 32 MiB budget on jobs of 2,000 items, not the budget plus
/// a few entries (an open finding, docs/operations.md: with 1 MB entries about 20 MiB of the excess was glibc's
/// arenas, gone with `MALLOC_ARENA_MAX=1`, and the rest is held by take-ins and not counted by the budget). A
/// daemon that ignores the budget (built with `ByteBudget::new(usize::MAX / 2)`) took 167.8 MiB above idle here and
/// failed. Once the accounting is fixed, this slack shrinks to the allocator's few MiB.
const SLACK: usize = 48 * MIB;

/// A daemon whose budget is a quarter of the work that arrives at once (64 entries of 2 MB, each a job of about
/// 2,000 items, and 1,000 one-item jobs) while the API answers 2-3 s late: peak RSS stays under idle + the budget +
/// 3 × the largest entry + [`SLACK`]. No entry is over `jobs.max_entry_bytes` (that case has its own test below),
/// so nothing here is exempt from the budget but an entry's read before its size is known.
#[tokio::test]
async fn peak_rss_stays_under_idle_plus_the_budget_and_a_stated_slack_while_four_budgets_of_jobs_arrive() {
    // Every API call answered 2-3 s late: take-ins wait on their submit, so without the budget up to
    // `workers.submit_concurrency` (256) of them would hold their entries at once (with replies in 200-400 ms the
    // daemon's CPU, not the budget, bounds how many are in flight, and ignoring the budget cost only 12 MiB more).
    let latency = DurationRange::new(Duration::from_millis(2_000), Duration::from_millis(3_000));
    let world =
        World::with_emulator(EmulatorConfig { random_latency: Some(latency), ..EmulatorConfig::default() }).await;
    let budget = 32 * MIB;
    let max_entry = 2 * MIB;
    let mut daemon = DaemonProcess::start(
        &world,
        &[
            ("BATCHD__WORKERS__INFLIGHT_BYTES", budget.to_string()),
            ("BATCHD__JOBS__MAX_ENTRY_BYTES", max_entry.to_string()),
            ("BATCHD__POLL__INITIAL_INTERVAL_MS", "200".to_owned()),
            ("BATCHD__POLL__MAX_INTERVAL_MS", "500".to_owned()),
            ("RUST_LOG", "warn".to_owned()),
        ],
    );
    let mut conn = world.conn.clone();
    let submit = world.keys.submit();

    // Idle: past start-up, having taken in (and refused) one small job.
    world.enqueue_raw(&[("job", r#"{"id":"warm-up","model":"@cf/baai/bge-m3","requests":[]}"#.to_owned())]).await;
    daemon.wait_for_results(&world, &HashSet::from(["warm-up".to_owned()])).await;
    let idle_rss = daemon.status_bytes("VmRSS");

    let mut job_ids = HashSet::new();
    let mut largest_entry = 0;
    let mut pipe = redis::pipe();
    for i in 0..64 {
        let id = format!("two-mb-{i}");
        let job = big_job(&id, max_entry - 16 * 1024);
        largest_entry = largest_entry.max(job.len());
        pipe.xadd(&submit, "*", &[("job", job)]).ignore();
        job_ids.insert(id);
    }
    for i in 0..1_000 {
        let id = format!("small-{i}");
        let job = format!(
            r#"{{"id":"{id}","model":"@cf/baai/bge-m3","requests":[{{"query":"q","contexts":[{{"text":"c"}}]}}]}}"#
        );
        pipe.xadd(&submit, "*", &[("job", job.into_bytes())]).ignore();
        job_ids.insert(id);
    }
    let () = pipe.query_async(&mut conn).await.expect("xadd the jobs");
    drop(pipe);
    assert!(largest_entry <= max_entry, "no entry is over jobs.max_entry_bytes");

    daemon.wait_for_results(&world, &job_ids).await;
    let peak_rss = daemon.status_bytes("VmHWM");
    let limit = idle_rss + budget + 3 * largest_entry + SLACK;
    let figures = format!(
        "idle RSS {:.1} MiB, budget {} MiB, largest entry {:.2} MiB, slack {} MiB: peak RSS {:.1} MiB ({:.1} MiB \
         above idle), limit {:.1} MiB",
        idle_rss as f64 / MIB as f64,
        budget / MIB,
        largest_entry as f64 / MIB as f64,
        SLACK / MIB,
        peak_rss as f64 / MIB as f64,
        peak_rss.saturating_sub(idle_rss) as f64 / MIB as f64,
        limit as f64 / MIB as f64,
    );
    eprintln!("{figures}");
    assert!(peak_rss <= limit, "peak RSS over idle + inflight_bytes + 3 × the largest entry + SLACK: {figures}");

    let results = world.results().await;
    let completed = results
        .iter()
        .filter(|fields| fields.get("job_id").is_some_and(|id| job_ids.contains(id)))
        .filter(|fields| fields.get("status").map(String::as_str) == Some("completed"))
        .count();
    assert_eq!(completed, job_ids.len(), "every job completed: the work really went through the budget");
}

/// Finding f2 (docs/reliability.md): an entry over `jobs.max_entry_bytes` is refused unparsed for about twice its
/// size above idle, the least redis-rs 1.8 allows (its read buffer holds the reply until the value is whole, then
/// the value is copied out of it). It used to cost 3.2–4.5 ×: the admin sampler read the entry too (`XRANGE` of
/// the oldest entry: another buffer, resident afterwards, and another value) and the dead-letter record cloned it.
/// The sampler runs every 20 ms here, so a sample that read the entry would show (before the fix this test measured
/// 4.2 ×); three entries in a row show whether anything is kept from one to the next.
#[tokio::test]
async fn an_oversize_entry_is_refused_for_about_twice_its_size_above_idle_and_nothing_of_it_is_kept() {
    let world = World::new().await;
    let mut daemon = DaemonProcess::start(
        &world,
        &[
            ("BATCHD__WORKERS__INFLIGHT_BYTES", (64 * MIB).to_string()),
            ("BATCHD__JOBS__MAX_ENTRY_BYTES", (32 * MIB).to_string()),
            ("BATCHD__ADMIN__SAMPLE_INTERVAL_MS", "20".to_owned()),
            // As in the chaos scenario f2: with the default 2 s, the old code's second read of the entry (by the
            // sampler) did not show in 5 runs; with 200 ms it showed in every run.
            ("BATCHD__INGRESS__BLOCK_MS", "200".to_owned()),
            ("RUST_LOG", "warn".to_owned()),
        ],
    );
    world.enqueue_raw(&[("job", r#"{"id":"warm-up","model":"@cf/baai/bge-m3","requests":[]}"#.to_owned())]).await;
    daemon.wait_for_results(&world, &HashSet::from(["warm-up".to_owned()])).await;
    let idle_rss = daemon.status_bytes("VmRSS");

    let job = empty_items_job(30_000_000);
    let entry_bytes = job.len();
    let mut entry_ids = HashSet::new();
    for _ in 0..3 {
        let entry_id: String =
            world.conn.clone().xadd(world.keys.submit(), "*", &[("job", job.as_slice())]).await.expect("xadd");
        // Refused unparsed, so its result is named by its entry id.
        entry_ids.insert(entry_id);
        daemon.wait_for_results(&world, &entry_ids).await;
    }
    drop(job);
    let peak_rss = daemon.status_bytes("VmHWM");
    let mib = |bytes: usize| bytes as f64 / MIB as f64;
    let figures = format!(
        "entry {:.1} MiB, idle RSS {:.1} MiB, peak RSS {:.1} MiB: {:.2} × the entry above idle",
        mib(entry_bytes),
        mib(idle_rss),
        mib(peak_rss),
        (peak_rss.saturating_sub(idle_rss)) as f64 / entry_bytes as f64,
    );
    eprintln!("{figures}");
    // Measured: 2.00 ×. One more copy of the entry anywhere makes 3 ×.
    assert!(peak_rss <= idle_rss + entry_bytes * 9 / 4, "peak RSS over idle + 2.25 × the entry: {figures}");

    // Nothing of the entries stays resident: no connection keeps a read buffer the size of one.
    let started = Instant::now();
    while daemon.status_bytes("VmRSS") > idle_rss + entry_bytes / 4 {
        assert!(started.elapsed() < Duration::from_secs(30), "RSS stays above idle + a quarter entry: {figures}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let results = world.results().await;
    for entry_id in &entry_ids {
        let result = results.iter().find(|fields| fields.get("job_id") == Some(entry_id)).expect("a result");
        assert_eq!(result.get("status").map(String::as_str), Some("failed"));
    }
    assert_eq!(world.stream(&world.keys.dead()).await.len(), 3, "each one is dead-lettered (a bounded copy)");
}

/// `used_memory` and `used_memory_peak` from `INFO memory`.
async fn redis_memory(world: &World) -> (u64, u64) {
    let info: String = redis::cmd("INFO").arg("memory").query_async(&mut world.conn.clone()).await.expect("info");
    let value = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(&format!("{name}:")))
            .and_then(|value| value.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("INFO memory has {name}"))
    };
    (value("used_memory"), value("used_memory_peak"))
}

/// Reading a job is bounded like writing one (STYLE rule 24): 40 concurrent reads of an in-flight job whose ledger
/// holds 24 MB of request items and 2 MB of metadata (20 dashboard JSON pages, 20 `batchd status --json`) grow Redis's memory by less
/// than 64 MiB; reading the whole ledger (`HGETALL`) each time grew it by over 400 MiB (issue 21). The ledger is
/// written in 1 MB pieces so that Redis's peak before the reads is its size now, and the peak after them is what
/// the reads cost.
#[tokio::test]
async fn forty_concurrent_reads_of_a_job_with_24_mb_of_items_grow_redis_by_less_than_64_mib() {
    let world = World::new().await;
    let job_id = batchd_core::JobId::parse("big-reader").expect("id");
    let ledger = world.keys.job(&job_id);
    let mut admin = world.conn.clone();
    const CHUNKS: usize = 24;
    const ITEMS_PER_CHUNK: usize = 100;
    let _: () = admin
        .hset_multiple(
            &ledger,
            &[
                ("state", "running".to_owned()),
                ("model", "@cf/baai/bge-m3".to_owned()),
                ("n_items", (CHUNKS * ITEMS_PER_CHUNK).to_string()),
                ("n_chunks", CHUNKS.to_string()),
                ("accepted_at", "1000".to_owned()),
                ("reply_to", world.keys.results()),
                // A producer's metadata of 2 MB: shown only by its size.
                ("metadata", serde_json::json!({"note": "m".repeat(2_000_000)}).to_string()),
            ],
        )
        .await
        .expect("ledger head");
    let item = serde_json::json!({"text": "x".repeat(10_000)}).to_string();
    let requests = format!("[{}]", vec![item.as_str(); ITEMS_PER_CHUNK].join(","));
    for index in 0..CHUNKS {
        let _: () = admin
            .hset_multiple(
                &ledger,
                &[
                    (format!("c{index}:state"), "polling".to_owned()),
                    (format!("c{index}:items"), format!("{}:{ITEMS_PER_CHUNK}", index * ITEMS_PER_CHUNK)),
                    (format!("c{index}:request_id"), format!("req-{index}")),
                    (format!("c{index}:requests"), requests.clone()),
                ],
            )
            .await
            .expect("a chunk");
    }
    let size: u64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(&ledger)
        .arg("SAMPLES")
        .arg(0)
        .query_async(&mut admin)
        .await
        .expect("usage");
    assert!(size > 26 * 1_000_000, "the ledger holds 24 MB of items and 2 MB of metadata: {size} bytes");

    let dashboard = batchd_tests::browser::Dashboard::start(&world, &[]).await.expect("start the dashboard");
    let (before, peak_before) = redis_memory(&world).await;
    assert!(peak_before < before + 8 * MIB as u64, "the peak is not left from writing: {peak_before} vs {before}");
    let http = reqwest::Client::new();
    let mut reads = Vec::new();
    for n in 0..40 {
        if n % 2 == 0 {
            let request = http.get(dashboard.url(&format!("/api/jobs/{job_id}"))).header("Accept", "application/json");
            reads.push(tokio::spawn(async move {
                let response = request.send().await.expect("get");
                assert_eq!(response.status(), 200);
                response.text().await.expect("body")
            }));
        } else {
            let mut command = world.batchd();
            command.args(["status", "--json", job_id.as_str()]);
            reads.push(tokio::spawn(async move {
                let output = crate::cli_ops::run(command).await;
                assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
                String::from_utf8(output.stdout).expect("utf-8")
            }));
        }
    }
    for read in reads {
        let body = read.await.expect("join");
        assert!(body.contains("\"c23:state\""), "every chunk is shown: {}", &body[..body.len().min(300)]);
        assert!(body.contains("running") && body.contains("\"metadata_bytes\""), "{}", &body[..body.len().min(300)]);
        assert!(!body.contains("c0:requests") && body.len() < 64 * 1024, "no items are read: {} bytes", body.len());
    }
    let (_, peak_after) = redis_memory(&world).await;
    let growth = peak_after.saturating_sub(before);
    eprintln!("40 concurrent reads of a 24 MB ledger: Redis peak {} KiB above what it held", growth / 1024);
    assert!(growth < 64 * MIB as u64, "Redis grew by {} MiB", growth / MIB as u64);
}
