//! Running it in production: the admin endpoints (`/livez`, `/readyz`, `/metrics`), the queue-depth sampler,
//! systemd notifications and SIGTERM, and the token never leaking. The deployment files are tested in `deploy.rs`.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use batchd::admin::QueueSample;
use batchd_core::ResultStatus;
use batchd_emulator::EmulatorConfig;
use batchd_tests::{World, bge_m3_job, free_port, http_get, wait_for_http, with_admin};
use redis::AsyncCommands;
use tokio::net::UnixDatagram;

const WAIT: Duration = Duration::from_secs(30);

/// Parses Prometheus text exposition format 0.0.4 strictly and returns every sample, keyed by
/// `name{label="value",..}` with labels sorted. Panics on any line that is not a `# HELP`, a `# TYPE` or a
/// well-formed sample, on a second `# TYPE` for one name, and on a sample whose metric has no `# TYPE`.
fn parse_prometheus(text: &str) -> BTreeMap<String, f64> {
    fn is_name(name: &str, colon: bool) -> bool {
        let mut chars = name.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':'))
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':'))
    }
    fn value(text: &str) -> Option<f64> {
        match text {
            "+Inf" => Some(f64::INFINITY),
            "-Inf" => Some(f64::NEG_INFINITY),
            "NaN" => Some(f64::NAN),
            _ => text.parse().ok(),
        }
    }
    let mut types: HashMap<String, String> = HashMap::new();
    let mut samples = BTreeMap::new();
    for line in text.lines().filter(|line| !line.is_empty()) {
        if let Some(comment) = line.strip_prefix("# ") {
            let mut parts = comment.splitn(3, ' ');
            let (keyword, name, rest) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            assert!(is_name(name, true), "bad metric name in: {line}");
            match keyword {
                Some("HELP") => {}
                Some("TYPE") => {
                    assert!(
                        ["counter", "gauge", "histogram", "summary", "untyped"].contains(&rest),
                        "bad type in: {line}"
                    );
                    assert!(types.insert(name.to_owned(), rest.to_owned()).is_none(), "second TYPE: {line}");
                }
                _ => panic!("unknown comment: {line}"),
            }
            continue;
        }
        let (series, rest) = match line.find('{') {
            Some(_) => {
                let close = line.rfind('}').unwrap_or_else(|| panic!("unclosed labels: {line}"));
                (&line[..close + 1], line[close + 1..].trim_start())
            }
            None => line.split_once(' ').unwrap_or_else(|| panic!("no value: {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.strip_suffix('}').expect("closing brace")),
            None => (series, ""),
        };
        assert!(is_name(name, true), "bad metric name in: {line}");
        let mut pairs = Vec::new();
        let mut remaining = labels;
        while !remaining.is_empty() {
            let (label, after) = remaining.split_once("=\"").unwrap_or_else(|| panic!("bad label in: {line}"));
            assert!(is_name(label, false), "bad label name in: {line}");
            let mut escaped = false;
            let end = after
                .char_indices()
                .find(|&(_, c)| {
                    let closing = c == '"' && !escaped;
                    escaped = c == '\\' && !escaped;
                    closing
                })
                .map(|(at, _)| at)
                .unwrap_or_else(|| panic!("unterminated label value in: {line}"));
            pairs.push(format!("{label}=\"{}\"", &after[..end]));
            remaining = after[end + 1..].strip_prefix(',').unwrap_or(&after[end + 1..]);
        }
        pairs.sort();
        let mut fields = rest.split(' ');
        let sample = fields.next().and_then(value).unwrap_or_else(|| panic!("bad value in: {line}"));
        if let Some(timestamp) = fields.next() {
            assert!(timestamp.parse::<i64>().is_ok(), "bad timestamp in: {line}");
        }
        assert!(fields.next().is_none(), "trailing text in: {line}");
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                name.strip_suffix(suffix)
                    .filter(|base| types.get(*base).is_some_and(|t| t == "histogram" || t == "summary"))
            })
            .unwrap_or(name);
        assert!(types.contains_key(family), "sample without TYPE: {line}");
        let key = if pairs.is_empty() { name.to_owned() } else { format!("{name}{{{}}}", pairs.join(",")) };
        assert!(samples.insert(key, sample).is_none(), "duplicate series: {line}");
    }
    samples
}

/// Scrapes `/metrics` and parses it.
async fn scrape(admin: SocketAddr) -> BTreeMap<String, f64> {
    let (status, body) = http_get(admin, "/metrics").await.expect("GET /metrics");
    assert_eq!(status, 200, "{body}");
    parse_prometheus(&body)
}

fn sample(metrics: &BTreeMap<String, f64>, series: &str) -> f64 {
    metrics.get(series).copied().unwrap_or(0.0)
}

#[tokio::test]
async fn health_follows_redis_down_and_back_without_a_restart() {
    let mut world = World::new().await;
    let mut settings = world.settings.clone();
    let admin = with_admin(&mut settings);
    let daemon = batchd_tests::Daemon::start(settings, &world.emulator);

    let (status, body) = wait_for_http(admin, "/livez", WAIT, |status, _| status == 200).await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    wait_for_http(admin, "/readyz", WAIT, |status, _| status == 200).await;

    world.redis.kill();
    let (_, reason) = wait_for_http(admin, "/readyz", WAIT, |status, _| status == 503).await;
    assert!(reason.starts_with("redis unreachable"), "the reason says why: {reason}");
    let (status, _) = http_get(admin, "/livez").await.expect("livez");
    assert_eq!(status, 200, "a Redis outage is not a liveness failure");
    let metrics = scrape(admin).await;
    assert_eq!(sample(&metrics, "batchd_redis_up"), 0.0);
    assert!(sample(&metrics, "batchd_redis_errors_total{operation=\"sample\"}") >= 1.0);

    world.redis.restart().await;
    world.conn = batchd_tests::test_connection(&world.redis.url()).await;
    wait_for_http(admin, "/readyz", WAIT, |status, _| status == 200).await;
    world.enqueue(&bge_m3_job("after-outage", 2)).await;
    let result = world.wait_for_result("after-outage", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed, "the same daemon works on after the outage");
    assert!(daemon.is_running());
    daemon.stop().await.expect("clean stop");
    assert!(http_get(admin, "/livez").await.is_err(), "the admin server stops with the daemon");
}

#[tokio::test]
async fn metrics_parse_and_move_as_jobs_run() {
    let world = World::new().await;
    let mut settings = world.settings.clone();
    let admin = with_admin(&mut settings);
    let daemon = batchd_tests::Daemon::start(settings, &world.emulator);
    wait_for_http(admin, "/readyz", WAIT, |status, _| status == 200).await;
    let (_, text) = http_get(admin, "/metrics").await.expect("metrics");
    assert!(text.contains("# HELP batchd_jobs_accepted_total "), "described: {text}");
    let before = parse_prometheus(&text);
    assert_eq!(sample(&before, "batchd_redis_up"), 1.0);
    let ns = world.settings.redis.namespace.clone();
    let depth = |stream: &str, state: &str| {
        format!("batchd_queue_depth{{queue=\"{ns}\",state=\"{state}\",stream=\"{stream}\"}}")
    };
    for series in [
        depth("submit", "pending"),
        depth("submit", "in_flight"),
        depth("schedule", "scheduled"),
        depth("schedule", "due"),
        depth("dead", "dead"),
        format!("batchd_oldest_waiting_job_age_seconds{{queue=\"{ns}\"}}"),
        format!("batchd_schedule_lag_seconds{{queue=\"{ns}\"}}"),
        "batchd_jobs_accepted_total".to_owned(),
        "batchd_results_published_total".to_owned(),
    ] {
        assert!(before.contains_key(&series), "{series} is exported from the start");
    }

    world.enqueue(&bge_m3_job("metrics-1", 2)).await;
    world.enqueue(&bge_m3_job("metrics-2", 1)).await;
    world.enqueue_raw(&[("not-a-job", "x".to_owned())]).await;
    world.wait_for_results(3, WAIT).await;
    let after = scrape(admin).await;
    let delta = |series: &str| sample(&after, series) - sample(&before, series);
    assert!(delta("batchd_jobs_accepted_total") >= 2.0);
    assert!(delta("batchd_jobs_finished_total{outcome=\"completed\"}") >= 2.0);
    assert!(delta("batchd_results_published_total") >= 2.0);
    assert!(delta("batchd_jobs_rejected_total{reason=\"invalid_entry\"}") >= 1.0);
    assert!(
        delta("batchd_api_requests_total{call=\"submit\",outcome=\"ok\",provider=\"cloudflare\",status_class=\"2xx\"}")
            >= 2.0
    );
    assert!(delta("batchd_api_request_duration_seconds_count{call=\"poll\",provider=\"cloudflare\"}") >= 2.0);
    assert!(delta("batchd_batch_turnaround_seconds_count{outcome=\"completed\"}") >= 2.0);
    assert!(after.contains_key(
        "batchd_api_request_duration_seconds_bucket{call=\"submit\",le=\"+Inf\",provider=\"cloudflare\"}"
    ));
    // The sampler catches up with the dead-letter entry within a few samples.
    let metrics = {
        let started = Instant::now();
        loop {
            let metrics = scrape(admin).await;
            if sample(&metrics, &depth("dead", "dead")) >= 1.0 {
                break metrics;
            }
            assert!(started.elapsed() < WAIT, "dead-letter depth never reached 1");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    assert!(
        metrics.keys().all(|series| series.starts_with("batchd_") || series.starts_with("process_")),
        "only batchd_ metrics and the process_ metrics are exported"
    );
    for process in
        ["process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds", "process_start_time_seconds"]
    {
        assert!(metrics.keys().any(|series| series == process), "{process} is exported");
    }
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn the_sampler_reads_exact_queue_depths_from_redis() {
    let world = World::new().await;
    let mut conn = world.conn.clone();
    let submit = world.keys.submit();
    let now_ms = batchd_queue::now_ms();
    let oldest_ms = now_ms - 90_000;
    let _: String = conn.xadd(&submit, format!("{oldest_ms}-0"), &[("job", "{}")]).await.expect("xadd");
    for _ in 0..3 {
        let _: String = conn.xadd(&submit, "*", &[("job", "{}")]).await.expect("xadd");
    }
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&submit)
        .arg("batchd")
        .arg("0")
        .query_async(&mut conn)
        .await
        .expect("group");
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("batchd")
        .arg("probe")
        .arg("COUNT")
        .arg(2)
        .arg("STREAMS")
        .arg(&submit)
        .arg(">")
        .query_async(&mut conn)
        .await
        .expect("read two");
    let schedule = world.keys.schedule();
    let _: () = conn.zadd(&schedule, "a#0", now_ms - 4_000).await.expect("zadd");
    let _: () = conn.zadd(&schedule, "b#0", now_ms - 1_000).await.expect("zadd");
    let _: () = conn.zadd(&schedule, "c#0", now_ms + 60_000).await.expect("zadd");
    let _: String = conn.xadd(world.keys.dead(), "*", &[("error", "x")]).await.expect("xadd");
    // The remote-batches index: one batch still running, and members a sample removes (a finished chunk of a
    // running job, a job that ended, a ledger that expired, a member that is no chunk reference).
    use batchd_core::ledger::field;
    let ledger = |id: &str| world.keys.job(&batchd_core::JobId::parse(id).expect("id"));
    let chunk = |index: u32| field::chunk(index, field::CHUNK_STATE);
    let running = [(field::STATE, "running".to_owned()), (field::MODEL, "@cf/baai/bge-m3".to_owned())];
    let _: () = conn.hset_multiple(ledger("live"), &running).await.expect("hset");
    let _: () = conn.hset_multiple(ledger("live"), &[(chunk(0), "polling"), (chunk(1), "done")]).await.expect("hset");
    let _: () = conn.hset_multiple(ledger("over"), &[(field::STATE, "cancelled")]).await.expect("hset");
    let _: () = conn.hset_multiple(ledger("over"), &[(chunk(0), "polling")]).await.expect("hset");
    let remote = world.keys.remote_batches();
    for (member, age_ms) in
        [("live#0", 600_000), ("live#1", 700_000), ("over#0", 800_000), ("gone#0", 900_000), ("junk", 1)]
    {
        let _: () = conn.zadd(&remote, member, now_ms - age_ms).await.expect("zadd");
    }

    let manager = batchd_queue::connect(redis::Client::open(world.redis.url()).expect("url"), Duration::from_secs(5))
        .expect("connect");
    let sample = QueueSample::read(&mut manager.clone(), &world.keys, now_ms).await.expect("sample");
    assert_eq!(
        sample,
        QueueSample {
            submit_entries: 4,
            submit_in_flight: 2,
            scheduled: 3,
            due: 2,
            dead: 1,
            oldest_entry_id: Some(format!("{oldest_ms}-0")),
            earliest_due_ms: Some(now_ms - 4_000),
            remote: Some(vec![batchd_queue::inspect::RemoteBatch {
                model: Some("@cf/baai/bge-m3".into()),
                submitted_at: now_ms - 600_000
            }]),
        }
    );
    let left: Vec<String> = conn.zrange(&remote, 0, -1).await.expect("zrange");
    assert_eq!(left, ["live#0"], "what the sample found finished or unreadable left the index");
    let ages = sample.remote_ages(now_ms).expect("read");
    assert_eq!(
        ages.into_iter().collect::<Vec<_>>(),
        [(("cloudflare".to_owned(), "@cf/baai/bge-m3".to_owned()), Duration::from_secs(600))]
    );
    assert_eq!(
        batchd::admin::entry_age(sample.oldest_entry_id.as_deref().expect("oldest id"), now_ms),
        Duration::from_secs(90)
    );

    let other = batchd_core::Keys::new("untouched").expect("namespace");
    let empty = QueueSample::read(&mut manager.clone(), &other, now_ms).await.expect("no keys, no group: zeros");
    assert_eq!(empty, QueueSample { remote: Some(Vec::new()), ..QueueSample::default() });

    // A remote-batches index of another type is reported and leaves the gauges alone; the sample still succeeds.
    let _: () = conn.set(other.remote_batches(), "not a zset").await.expect("set");
    let odd = QueueSample::read(&mut manager.clone(), &other, now_ms).await.expect("the depths are still read");
    assert_eq!(odd.remote, None);
    assert_eq!(odd.remote_ages(now_ms), None);
}

#[tokio::test]
async fn the_keda_lag_signal_stays_valid_although_batchd_deletes_taken_entries() {
    let world = World::new().await;
    let daemon = world.daemon();
    for i in 0..3 {
        world.enqueue(&bge_m3_job(&format!("lag-{i}"), 1)).await;
    }
    world.wait_for_results(3, WAIT).await;
    daemon.stop().await.expect("stop");
    for i in 0..4 {
        world.enqueue(&bge_m3_job(&format!("waiting-{i}"), 1)).await;
    }
    // KEDA's redis-streams scaler with lagCount reads the group's `lag` from XINFO GROUPS.
    let groups: Vec<HashMap<String, redis::Value>> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(world.keys.submit())
        .query_async(&mut world.conn.clone())
        .await
        .expect("xinfo");
    let group = groups
        .iter()
        .find(|group| {
            group
                .get("name")
                .is_some_and(|name| redis::from_redis_value::<String>(name.clone()).ok().as_deref() == Some("batchd"))
        })
        .expect("group batchd");
    let lag: Option<u64> = redis::from_redis_value(group.get("lag").expect("lag field").clone()).expect("lag type");
    assert_eq!(lag, Some(4), "taken entries are deleted, yet the lag is known and counts the waiting entries");
}

/// Starts the real `batchd run` with a clean environment and the world's settings.
fn spawn_batchd(world: &World, admin: SocketAddr, env: &[(&str, &str)]) -> Child {
    let mut command = world.batchd();
    command
        .env("BATCHD__CLOUDFLARE__REQUEST_TIMEOUT_SECS", "5")
        .env("BATCHD__SCHEDULE__LEASE_SECS", "6")
        .env("BATCHD__POLL__INITIAL_INTERVAL_MS", "100")
        .env("BATCHD__POLL__MAX_INTERVAL_MS", "300")
        .env("BATCHD__SHUTDOWN__GRACE_SECS", "5")
        .env("BATCHD__ADMIN__LISTEN", admin.to_string())
        .env("BATCHD__ADMIN__SAMPLE_INTERVAL_MS", "100")
        .env("BATCHD__LOG__FORMAT", "json");
    for (name, value) in env {
        command.env(name, value);
    }
    command.arg("run").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start batchd")
}

fn sigterm(child: &Child) {
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
    assert!(status.success());
}

async fn wait_with_output(child: Child) -> Output {
    tokio::task::spawn_blocking(move || child.wait_with_output().expect("wait")).await.expect("join")
}

/// Receives notify datagrams into `seen` until `n` of them (counted from `from`) carry `line`.
async fn receive_until(socket: &UnixDatagram, line: &str, n: usize, from: usize, seen: &mut Vec<String>) {
    let started = Instant::now();
    let mut buffer = vec![0u8; 4096];
    while seen[from..].iter().filter(|message| message.lines().any(|l| l == line)).count() < n {
        let left =
            WAIT.checked_sub(started.elapsed()).unwrap_or_else(|| panic!("no {line} within {WAIT:?}; got {seen:?}"));
        let received = tokio::time::timeout(left, socket.recv(&mut buffer)).await;
        let size = received.unwrap_or_else(|_| panic!("no {line} within {WAIT:?}; got {seen:?}")).expect("recv");
        seen.push(String::from_utf8_lossy(&buffer[..size]).into_owned());
    }
}

#[tokio::test]
async fn systemd_hears_ready_watchdog_and_stopping_and_sigterm_hands_work_back() {
    let world = World::with_emulator(EmulatorConfig {
        queued_for: Duration::from_millis(1500),
        running_for: Duration::from_millis(500),
        ..Default::default()
    })
    .await;
    let socket_path = world.redis.dir.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).expect("bind notify socket");
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let socket_env = socket_path.to_str().expect("utf-8 path");
    let child = spawn_batchd(
        &world,
        admin,
        &[("CLOUDFLARE_API_TOKEN", world.emulator.token()), ("NOTIFY_SOCKET", socket_env), ("WATCHDOG_USEC", "600000")],
    );

    let mut seen = Vec::new();
    receive_until(&socket, "READY=1", 1, 0, &mut seen).await;
    wait_for_http(admin, "/livez", WAIT, |status, _| status == 200).await;
    // WATCHDOG_USEC=0.6 s: a ping every 0.3 s; two after READY show it is periodic.
    let ready_at = seen.len();
    receive_until(&socket, "WATCHDOG=1", 2, ready_at, &mut seen).await;

    let ids: Vec<String> = (0..4).map(|i| format!("term-{i}")).collect();
    for id in &ids {
        world.enqueue(&bge_m3_job(id, 2)).await;
    }
    let started = Instant::now();
    'polling: loop {
        for id in &ids {
            if world.ledger(id).await.get("c0:state").map(String::as_str) == Some("polling") {
                break 'polling;
            }
        }
        assert!(started.elapsed() < WAIT, "no job reached polling");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    sigterm(&child);
    let stopping_from = seen.len();
    receive_until(&socket, "STOPPING=1", 1, stopping_from, &mut seen).await;
    let output = tokio::time::timeout(WAIT, wait_with_output(child)).await.expect("batchd exits after SIGTERM");
    let logs = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(0), "SIGTERM drains and exits 0:\n{logs}");
    // The daemon times its own drain: the work in flight finished within the 5 s grace, none was abandoned.
    assert!(logs.contains("finishing work in flight") && logs.contains("batchd stopped"), "{logs}");
    assert!(!logs.contains("grace period over"), "the drain fits in the grace period:\n{logs}");
    assert!(logs.contains("systemd watchdog enabled"), "{logs}");

    // Whatever was in flight finished or was handed back: a successor publishes every job exactly once.
    let successor = world.daemon();
    for id in &ids {
        let result = world.wait_for_result(id, WAIT).await;
        assert_eq!(result.status, ResultStatus::Completed, "{id}");
    }
    // With no work left and the successor stopped, no late duplicate can still come.
    world.wait_until_settled(WAIT).await;
    successor.stop().await.expect("stop");
    assert_eq!(world.results().await.len(), ids.len(), "one result per job");
}

#[tokio::test]
async fn the_api_token_never_appears_in_output_logs_metrics_or_results() {
    let world = World::new().await;
    let token = format!("canary-{}", uuid::Uuid::new_v4().simple());
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
    // The emulator expects another token: every submit fails with 401, so the error paths are logged.
    let child = spawn_batchd(&world, admin, &[("CLOUDFLARE_API_TOKEN", &token), ("RUST_LOG", "debug")]);
    wait_for_http(admin, "/readyz", WAIT, |status, _| status == 200).await;
    world.enqueue(&bge_m3_job("leak-1", 1)).await;
    let result = world.wait_for_result("leak-1", WAIT).await;
    assert_eq!(result.status, ResultStatus::Failed, "a wrong token fails the job");
    let (_, metrics) = http_get(admin, "/metrics").await.expect("metrics");
    sigterm(&child);
    let output = wait_with_output(child).await;
    assert_eq!(output.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("401"), "the failing API call is in the logs, so they were worth searching:\n{stderr}");
    for line in stderr.lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap_or_else(|_| panic!("not JSON: {line}"));
    }
    let stored = format!("{:?}{:?}", world.results().await, world.ledger("leak-1").await);
    for (what, text) in [("stdout", &*stdout), ("stderr", &*stderr), ("/metrics", &*metrics), ("redis", &*stored)] {
        assert!(!text.contains(&token), "the token leaked into {what}");
    }
}

/// Issue 26, point 5: a batch that stops completing shows in `batchd_oldest_remote_batch_age_seconds` (by provider
/// and model) and in `batchd status`, and leaves both once it completes.
#[tokio::test]
async fn a_batch_that_does_not_complete_shows_its_age_until_it_does() {
    let world = World::new().await;
    world.emulator.set_timing(Duration::from_secs(3600), Duration::ZERO);
    let mut settings = world.settings.clone();
    let admin = with_admin(&mut settings);
    let daemon = batchd_tests::Daemon::start(settings, &world.emulator);
    world.enqueue(&bge_m3_job("stuck-1", 1)).await;
    let ns = world.settings.redis.namespace.clone();
    let series = format!(
        "batchd_oldest_remote_batch_age_seconds{{model=\"@cf/baai/bge-m3\",provider=\"cloudflare\",queue=\"{ns}\"}}"
    );
    batchd_tests::wait_until("the stuck batch's age passes 1 s", WAIT, async || {
        sample(&scrape(admin).await, &series) >= 1.0
    })
    .await;
    let mut status = world.batchd();
    status.args(["status", "stuck-1"]);
    let output = tokio::task::spawn_blocking(move || status.output()).await.expect("join").expect("batchd status");
    let shown = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success() && shown.contains("batch running for "), "{shown}");

    world.emulator.set_timing(Duration::ZERO, Duration::ZERO);
    assert_eq!(world.wait_for_result("stuck-1", WAIT).await.status, ResultStatus::Completed);
    batchd_tests::wait_until("the age goes back to 0", WAIT, async || sample(&scrape(admin).await, &series) == 0.0)
        .await;
    let left: u64 = world.conn.clone().zcard(world.keys.remote_batches()).await.expect("zcard");
    assert_eq!(left, 0, "the completion took the batch off the index");
    daemon.stop().await.expect("clean stop");
}

/// Issue 26: a batch still at the remote API is shown against its model's usual time (its age from its submit,
/// the measure the usual figures count in). The daemon counts each finished batch in the process and its admin sampler writes the counts into the hour's counters (no Redis
/// command per job); `batchd status` (text and `--json`) and the dashboard's job page read the last 24 hours back.
#[tokio::test]
async fn a_running_batch_is_shown_against_its_models_usual_time() {
    let world = World::new().await;
    let mut settings = world.settings.clone();
    with_admin(&mut settings);
    let daemon = batchd_tests::Daemon::start(settings, &world.emulator);
    let model = "@cf/baai/bge-m3";
    for id in ["quick-1", "quick-2"] {
        world.enqueue(&bge_m3_job(id, 1)).await;
    }
    for id in ["quick-1", "quick-2"] {
        assert_eq!(world.wait_for_result(id, WAIT).await.status, ResultStatus::Completed, "{id}");
    }
    let mut conn = batchd_queue::connect(redis::Client::open(world.redis.url()).unwrap(), WAIT).unwrap();
    batchd_tests::wait_until("the sampler wrote both batches' times", WAIT, async || {
        let usuals = batchd_queue::turnaround::usuals(&mut conn, &world.keys, batchd_queue::now_ms()).await;
        usuals.expect("read").of(model).is_some_and(|usual| usual.n_batches == 2)
    })
    .await;

    // A batch that does not complete yet: status and the dashboard compare its age with the two before it.
    world.emulator.set_timing(Duration::from_secs(3600), Duration::ZERO);
    world.enqueue(&bge_m3_job("slow-1", 1)).await;
    let mut at_remote = serde_json::Value::Null;
    batchd_tests::wait_until("slow-1 is at the remote API", WAIT, async || {
        let (code, stdout, _) = crate::cli_operator::cli(&world, &["status", "slow-1", "--json"]).await;
        let status: serde_json::Value =
            if code == 0 { serde_json::from_str(&stdout).expect("JSON") } else { return false };
        assert_eq!(status["job_id"], "slow-1", "the existing keys stay");
        at_remote = status["at_remote"].clone();
        at_remote.as_array().is_some_and(|chunks| !chunks.is_empty())
    })
    .await;
    let chunk = &at_remote[0];
    assert_eq!(chunk["chunk"], 0);
    assert_eq!(chunk["usual"]["n_batches"], 2, "{at_remote}");
    assert_eq!(chunk["usual"]["p50_secs"], 60, "the emulator answers within a minute: {at_remote}");
    assert_eq!(chunk["older_than_p95"], false);
    let expected = format!("usual for {model}: p50 ≤ 1m, p95 ≤ 1m (2 batches, last 24 h)");
    assert_eq!(chunk["text"], expected.as_str());
    let (code, shown, _) = crate::cli_operator::cli(&world, &["status", "slow-1"]).await;
    assert_eq!(code, 0);
    assert!(shown.contains(&format!("; {expected}")) && shown.contains("batch running for "), "{shown}");
    assert_eq!(chunk["age_secs"], chunk["batch_age_secs"], "the batch's age is the one compared: {at_remote}");

    let dashboard = batchd_tests::browser::Dashboard::start(&world, &["--refresh-secs", "0", "--allow-actions"])
        .await
        .expect("batchd ui");
    let ns = world.keys.namespace();
    let page: serde_json::Value = reqwest::get(dashboard.url(&format!("/api/jobs/slow-1?ns={ns}")))
        .await
        .expect("get")
        .json()
        .await
        .expect("JSON");
    assert_eq!(page["job"]["at_remote"][0]["text"], expected.as_str(), "{page}");
    let html =
        reqwest::get(dashboard.url(&format!("/jobs/slow-1?ns={ns}"))).await.expect("get").text().await.expect("body");
    assert!(html.contains("At the remote API") && html.contains(&expected), "{html}");
    assert!(html.contains("Workers AI has no remote cancel"), "the cancel confirmation names the provider's behaviour");

    world.emulator.set_timing(Duration::ZERO, Duration::ZERO);
    assert_eq!(world.wait_for_result("slow-1", WAIT).await.status, ResultStatus::Completed);
    daemon.stop().await.expect("clean stop");
}
