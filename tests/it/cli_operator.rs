//! The operator commands against live daemons and a real Redis, run as the real `batchd` binary: `pause`/`resume`
//! (intake stops on every replica, work in flight finishes, `stats` and `/readyz` say so), `workers`, `retry` by
//! filter (with `--dry-run`), `probe`, and the container image's health check. What needs a terminal is in
//! `cli_terminal.rs`, `--json` on every command in `cli_json.rs`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use batchd_core::ResultStatus;
use batchd_emulator::{Calls, Fault};
use batchd_tests::{Daemon, World, bge_m3_job, free_port, wait_for_http, with_admin};
use redis::AsyncCommands;
use serde_json::{Value, json};

use crate::cli_ops::{run, text};

const WAIT: Duration = Duration::from_secs(30);

/// `batchd <args>` with the world's environment: (exit code, stdout, stderr).
pub(crate) async fn cli(world: &World, args: &[&str]) -> (i32, String, String) {
    cli_with(world, args, &[]).await
}

/// `batchd <args>` with the world's environment and `env` added.
pub(crate) async fn cli_with(world: &World, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut command = world.batchd();
    command.args(args).envs(env.iter().copied());
    let output = run(command).await;
    (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr))
}

/// `batchd <args> --json`, which must exit `code` and print JSON.
pub(crate) async fn cli_json(world: &World, args: &[&str], code: i32) -> Value {
    let (actual, stdout, stderr) = cli(world, args).await;
    assert_eq!(actual, code, "{args:?}: {stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {stdout}"))
}

/// Calls of `EXISTS` and `XREADGROUP` the world's Redis has served (`INFO commandstats`).
async fn command_calls(world: &World) -> (u64, u64) {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut world.conn.clone()).await.expect("INFO");
    let calls = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(&format!("cmdstat_{name}:calls="))?.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    (calls("exists"), calls("xreadgroup"))
}

/// Waits until the ingress fetcher has gone `rounds` read rounds without reading: each round checks the pause flag
/// (`EXISTS`) and, unless paused, reads (`XREADGROUP`), so `rounds` checks with no read between them happen only
/// while it is paused. Nothing else in these tests sends `EXISTS` meanwhile (the sampler `GET`s the flag).
async fn wait_for_paused_rounds(world: &World, rounds: u64) {
    let started = Instant::now();
    let (mut exists_from, mut reads_from) = command_calls(world).await;
    loop {
        let (exists, reads) = command_calls(world).await;
        if reads != reads_from {
            (exists_from, reads_from) = (exists, reads);
        } else if exists >= exists_from + rounds {
            return;
        }
        assert!(started.elapsed() < WAIT, "the ingress fetcher kept reading: {reads} reads, {exists} checks");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_for_ledger_field(world: &World, job_id: &str, name: &str, value: &str) {
    let started = Instant::now();
    while world.ledger(job_id).await.get(name).map(String::as_str) != Some(value) {
        assert!(started.elapsed() < WAIT, "{job_id}: {name} never became {value}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn pause_stops_intake_on_every_replica_while_work_in_flight_finishes_until_resume() {
    let world = World::new().await;
    let mut settings = world.settings.clone();
    let admin = with_admin(&mut settings);
    let daemon = Daemon::start(settings.clone(), &world.emulator);
    let mut other_settings = world.settings.clone();
    let _other_admin = with_admin(&mut other_settings);
    let other = Daemon::start(other_settings, &world.emulator);
    wait_for_http(admin, "/readyz", WAIT, |status, body| status == 200 && body == "ok\n").await;

    // A job in flight: its batch stays queued until the test lets it finish.
    world.emulator.set_timing(Duration::from_secs(600), Duration::from_secs(600));
    world.enqueue(&bge_m3_job("in-flight", 2)).await;
    wait_for_ledger_field(&world, "in-flight", "c0:state", "polling").await;

    let paused = cli_json(&world, &["pause", "--reason", "deploy freeze", "--json"], 0).await;
    assert_eq!((paused["paused"].as_bool(), paused["changed"].as_bool()), (Some(true), Some(true)), "{paused}");
    assert_eq!(paused["pause"]["reason"], "deploy freeze");
    assert!(paused["pause"]["at"].as_u64().is_some() && paused["pause"]["by"].as_str().is_some(), "{paused}");
    // Both replicas check the flag once per read round: once both have gone rounds without reading, nothing new is
    // taken in.
    wait_for_paused_rounds(&world, 6).await;
    let waiting = world.enqueue(&bge_m3_job("while-paused", 1)).await;

    // Work in flight goes on while paused and finishes.
    world.emulator.set_timing(Duration::ZERO, Duration::ZERO);
    assert_eq!(world.wait_for_result("in-flight", WAIT).await.status, ResultStatus::Completed);
    wait_for_paused_rounds(&world, 6).await;
    assert_eq!(world.ingress_pending().await, 0, "nobody read the entry enqueued while paused");
    assert_eq!(world.conn.clone().xlen::<_, usize>(world.keys.submit()).await.unwrap(), 1, "it waits");
    assert!(world.ledger("while-paused").await.is_empty(), "not taken in");

    // Visible in stats, in /readyz (still 200: a paused replica is ready) and in the probe.
    let stats = cli_json(&world, &["stats", "--json"], 0).await;
    assert_eq!(stats["paused"]["reason"], "deploy freeze", "{stats}");
    assert_eq!(stats["submit"]["waiting"], 1, "{stats}");
    let (_, stdout, _) = cli(&world, &["stats"]).await;
    let intake = stdout.lines().find(|line| line.starts_with("  intake ")).unwrap_or_default().to_owned();
    assert!(intake.contains(" paused by ") && intake.ends_with(": deploy freeze"), "{stdout}");
    let (_, ready) =
        wait_for_http(admin, "/readyz", WAIT, |status, body| status == 200 && body.contains("paused")).await;
    let namespace = &world.settings.redis.namespace;
    assert!(ready.starts_with(&format!("ok; intake paused in namespace {namespace} (paused by ")), "{ready}");
    assert!(ready.ends_with(": deploy freeze)\n"), "{ready}");
    let (code, stdout, _) = cli(&world, &["probe", "--ready", "--addr", &admin.to_string()]).await;
    assert_eq!((code, stdout.starts_with("ok; intake paused in namespace")), (0, true), "{stdout}");
    let (code, stdout, _) = cli(&world, &["workers"]).await;
    assert_eq!(code, 0);
    assert!(stdout.lines().next().is_some_and(|line| line.contains("; intake paused by ")), "{stdout}");

    // Pausing again keeps the first record.
    let (code, stdout, _) = cli(&world, &["pause", "--reason", "another"]).await;
    assert_eq!(code, 0);
    assert!(
        stdout.contains("was already paused by ") && stdout.contains(": deploy freeze; nothing changed"),
        "{stdout}"
    );

    let resumed = cli_json(&world, &["resume", "--json"], 0).await;
    assert_eq!((resumed["paused"].as_bool(), resumed["changed"].as_bool()), (Some(false), Some(true)), "{resumed}");
    assert_eq!(resumed["was"]["reason"], "deploy freeze");
    let result = world.wait_for_result("while-paused", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed, "taken in after resume (entry {waiting})");
    wait_for_http(admin, "/readyz", WAIT, |status, body| status == 200 && body == "ok\n").await;
    let (code, stdout, _) = cli(&world, &["resume"]).await;
    assert_eq!(
        (code, stdout.trim_end()),
        (0, format!("intake of namespace {namespace} was not paused; nothing changed").as_str())
    );
    let stats = cli_json(&world, &["stats", "--json"], 0).await;
    assert_eq!(stats["paused"], Value::Null);
    daemon.stop().await.unwrap();
    other.stop().await.unwrap();
}

#[tokio::test]
async fn workers_lists_the_live_consumers_of_the_ingress_group() {
    let world = World::new().await;
    let (code, stdout, _) = cli(&world, &["workers"]).await;
    assert_eq!(code, 0);
    assert!(stdout.contains(": no consumer group batchd on ") && stdout.contains("; intake running"), "{stdout}");
    let listed = cli_json(&world, &["workers", "--json"], 0).await;
    assert_eq!(
        (listed["group_exists"].as_bool(), listed["consumers"].as_array().map(Vec::len)),
        (Some(false), Some(0))
    );

    let daemon = world.daemon();
    // Redis 7.0 lists a consumer once it has read an entry.
    world.enqueue(&bge_m3_job("w-1", 1)).await;
    world.wait_for_result("w-1", WAIT).await;
    let listed = cli_json(&world, &["workers", "--json"], 0).await;
    assert_eq!(listed["group_exists"], true, "{listed}");
    assert_eq!(listed["group"], "batchd");
    assert_eq!(listed["stream"], world.keys.submit());
    assert_eq!(listed["pending"], 0);
    let consumers = listed["consumers"].as_array().expect("consumers");
    assert_eq!(consumers.len(), 1, "{listed}");
    let name = consumers[0]["name"].as_str().expect("name").to_owned();
    assert!(name.contains(&format!("-{}-", std::process::id())), "the in-process daemon's consumer: {name}");
    assert_eq!(consumers[0]["pending"], 0);
    assert!(consumers[0]["idle_ms"].as_u64().is_some_and(|ms| ms < WAIT.as_millis() as u64), "{listed}");

    let (code, stdout, _) = cli(&world, &["workers"]).await;
    assert_eq!(code, 0);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].contains(": group batchd on ") && lines[0].contains(", 1 consumers, 0 entries being taken in"));
    assert!(lines[1].starts_with("CONSUMER") && lines[1].ends_with("INACTIVE"), "{stdout}");
    assert!(lines[2].starts_with(&name), "{stdout}");
    assert_eq!(lines.len(), 3, "{stdout}");
    daemon.stop().await.unwrap();
}

/// A job with metadata, for the retry tests.
fn job_with_metadata(id: &str, n: usize, tenant: &str) -> Value {
    let mut job = bge_m3_job(id, n);
    job["metadata"] = json!({"tenant": tenant});
    job
}

/// What a job's result entry id says about when it finished, Unix ms.
async fn finished_ms(world: &World, job_id: &str) -> u64 {
    let ledger = world.ledger(job_id).await;
    let entry = ledger.get("result_entry").expect("result entry id");
    entry.split_once('-').expect("entry id").0.parse().expect("ms")
}

/// The retry outcomes of `batchd retry ... --json`, as `(job id, outcome)` in stream order.
fn outcomes(report: &Value) -> Vec<(String, String)> {
    report["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|job| {
            let field = |name: &str| job[name].as_str().expect("job_id and outcome").to_owned();
            (field("job_id"), field("outcome"))
        })
        .collect()
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

#[tokio::test]
async fn retry_lists_with_dry_run_and_requeues_failed_jobs_matching_each_filter() {
    let world = World::new().await;
    let daemon = world.daemon();
    // The first two submits meet a revoked token (401): those jobs fail with the API's error.
    world.emulator.inject(Fault::status(401).code(10000).on(Calls::Submit).times(2));
    for id in ["tok-1", "tok-2"] {
        world.enqueue(&job_with_metadata(id, 2, id)).await;
        assert_eq!(world.wait_for_result(id, WAIT).await.status, ResultStatus::Failed);
    }
    // One at a time, so the results stream holds them in this order.
    world.enqueue(&json!({"id": "nomodel-1", "model": "@cf/nobody/nothing", "requests": [{"text": "x"}]})).await;
    let nomodel = world.wait_for_result("nomodel-1", WAIT).await;
    assert_eq!(nomodel.status, ResultStatus::Failed);
    let nomodel_code = nomodel.error.as_ref().expect("error").code.clone();
    world.enqueue(&json!({"id": "invalid-1", "requests": [{"text": "x"}]})).await;
    assert_eq!(world.wait_for_result("invalid-1", WAIT).await.error.expect("error").code, "invalid_job");
    world.enqueue(&bge_m3_job("ok-1", 1)).await;
    world.wait_for_result("ok-1", WAIT).await;
    let (tok1_ms, tok2_ms) = (finished_ms(&world, "tok-1").await, finished_ms(&world, "tok-2").await);
    assert!(tok1_ms < tok2_ms, "tok-2 was enqueued after tok-1 had finished");
    let submit_len = |world: &World| {
        let mut conn = world.conn.clone();
        let key = world.keys.submit();
        async move { conn.xlen::<_, usize>(key).await.unwrap() }
    };

    // A job refused before it ran has no request items stored: listed, not retryable (an error outside --dry-run).
    let report = cli_json(&world, &["retry", "--dry-run", "--json", "--code", "invalid_job"], 0).await;
    assert_eq!(outcomes(&report), pairs(&[("invalid-1", "not_retryable")]), "{report}");
    assert!(report["jobs"][0]["reason"].as_str().unwrap().contains("refused before it ran"), "{report}");
    let (code, _, stderr) = cli(&world, &["retry", "--code", "invalid_job"]).await;
    assert_eq!(code, 1, "a job that cannot be retried is an error outside --dry-run: {stderr}");
    assert_eq!(stderr.trim_end(), "batchd: 1 matching jobs could not be retried (listed above)");
    assert_eq!(submit_len(&world).await, 0);

    // Each filter picks its jobs and no others; a dry run writes nothing.
    let dry = |args: &[&str]| {
        let mut all = vec!["retry", "--dry-run", "--json"];
        all.extend_from_slice(args);
        all.into_iter().map(str::to_owned).collect::<Vec<String>>()
    };
    let (tok1, tok2) = (tok1_ms.to_string(), tok2_ms.to_string());
    type Case = (Vec<String>, Vec<(String, String)>);
    let cases: Vec<Case> = vec![
        (
            dry(&[]),
            pairs(&[
                ("tok-1", "would_retry"),
                ("tok-2", "would_retry"),
                ("nomodel-1", "would_retry"),
                ("invalid-1", "not_retryable"),
            ]),
        ),
        (dry(&["--model", "@cf/baai/bge-m3"]), pairs(&[("tok-1", "would_retry"), ("tok-2", "would_retry")])),
        (dry(&["--code", "invalid_job"]), pairs(&[("invalid-1", "not_retryable")])),
        (dry(&["--code", &nomodel_code, "--model", "@cf/nobody/nothing"]), pairs(&[("nomodel-1", "would_retry")])),
        (dry(&["--until", &tok1]), pairs(&[("tok-1", "would_retry")])),
        (dry(&["--since", &tok2, "--until", &tok2]), pairs(&[("tok-2", "would_retry")])),
        (dry(&["--since", "1h", "--model", "@cf/baai/bge-m3", "--limit", "1"]), pairs(&[("tok-1", "would_retry")])),
        (dry(&["--status", "expired", "--status", "cancelled"]), Vec::new()),
        (dry(&["--since", "2099-01-01"]), Vec::new()),
    ];
    for (args, expected) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let report = cli_json(&world, &args, 0).await;
        assert_eq!(outcomes(&report), *expected, "{args:?}: {report}");
        assert_eq!(report["dry_run"], true);
    }
    let capped = cli_json(&world, &dry(&["--limit", "1"]).iter().map(String::as_str).collect::<Vec<_>>(), 0).await;
    assert_eq!((capped["capped"].as_bool(), capped["matched"].as_u64()), (Some(true), Some(1)), "{capped}");
    let report = cli_json(&world, &["retry", "--dry-run", "--json", "--model", "@cf/baai/bge-m3"], 0).await;
    assert_eq!(report["jobs"][0]["retry_id"], "tok-1.retry-1");
    assert_eq!(report["jobs"][0]["code"], "api_error", "{report}");
    let (code, stdout, _) = cli(&world, &["retry", "--dry-run", "--model", "@cf/baai/bge-m3"]).await;
    assert_eq!(code, 0);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("would retry      tok-1 -> tok-1.retry-1  failed  api_error  @cf/baai/bge-m3  "));
    assert!(lines[2].starts_with("would retry 2 of 2 matching jobs (0 already retried, 0 not retryable); 5 result"));
    assert_eq!(submit_len(&world).await, 0, "a dry run enqueues nothing");

    // The real thing: the jobs of one model, as new jobs that run to completion with their items and metadata.
    let report = cli_json(&world, &["retry", "--model", "@cf/baai/bge-m3", "--json"], 0).await;
    assert_eq!(outcomes(&report), pairs(&[("tok-1", "retried"), ("tok-2", "retried")]), "{report}");
    assert!(report["jobs"][0]["submit_entry_id"].as_str().is_some_and(|id| id.contains('-')), "{report}");
    for id in ["tok-1", "tok-2"] {
        let retried = world.wait_for_result(&format!("{id}.retry-1"), WAIT).await;
        assert_eq!(retried.status, ResultStatus::Completed);
        assert_eq!(retried.items_total, 2);
        let metadata: Value = serde_json::from_str(retried.metadata.as_ref().expect("metadata").get()).unwrap();
        assert_eq!(metadata, json!({"tenant": id}));
    }
    assert!(world.ledger("nomodel-1.retry-1").await.is_empty(), "not matched, not retried");
    // Again: nothing twice.
    let report = cli_json(&world, &["retry", "--model", "@cf/baai/bge-m3", "--json"], 0).await;
    assert_eq!(outcomes(&report), pairs(&[("tok-1", "already_retried"), ("tok-2", "already_retried")]), "{report}");

    // Everything that failed: the one left is retried, the refused one is reported (exit code 1).
    let (code, stdout, stderr) = cli(&world, &["retry"]).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stdout.lines().any(|line| line.starts_with("retried          nomodel-1 -> nomodel-1.retry-1  failed")),
        "{stdout}"
    );
    assert!(stdout.lines().any(|line| line.starts_with("not retryable    invalid-1 -> invalid-1.retry-1")), "{stdout}");
    assert!(stdout.contains("retried 1 of 4 matching jobs (2 already retried, 1 not retryable)"), "{stdout}");
    // The retry fails again (the model does not exist); a retry of it counts on.
    assert_eq!(world.wait_for_result("nomodel-1.retry-1", WAIT).await.status, ResultStatus::Failed);
    let report = cli_json(&world, &["retry", "--dry-run", "--json", "--model", "@cf/nobody/nothing"], 0).await;
    assert_eq!(
        outcomes(&report),
        pairs(&[("nomodel-1", "already_retried"), ("nomodel-1.retry-1", "would_retry")]),
        "{report}"
    );
    assert_eq!(report["jobs"][1]["retry_id"], "nomodel-1.retry-2");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn probe_exits_0_against_a_running_daemon_and_1_against_a_closed_port() {
    let world = World::new().await;
    let mut settings = world.settings.clone();
    let admin = with_admin(&mut settings);
    let daemon = Daemon::start(settings, &world.emulator);
    wait_for_http(admin, "/readyz", WAIT, |status, _| status == 200).await;
    let addr = admin.to_string();
    let (code, stdout, stderr) = cli(&world, &["probe", "--addr", &addr]).await;
    assert_eq!((code, stdout.as_str()), (0, "ok\n"), "{stderr}");
    let (code, stdout, _) = cli(&world, &["probe", "--ready", "--url", &format!("http://{addr}")]).await;
    assert_eq!((code, stdout.as_str()), (0, "ok\n"));
    // admin.listen as a container sets it: 0.0.0.0 is asked on loopback.
    let listen = format!("0.0.0.0:{}", admin.port());
    let (code, _, stderr) = cli_with(&world, &["probe"], &[("BATCHD__ADMIN__LISTEN", &listen)]).await;
    assert_eq!(code, 0, "{stderr}");
    let report = cli_json(&world, &["probe", "--addr", &addr, "--json"], 0).await;
    assert_eq!(
        report,
        json!({"url": format!("http://{addr}/livez"), "ok": true, "status": 200, "body": "ok", "error": null})
    );
    let (code, _, stderr) = cli(&world, &["probe", "--url", &format!("http://{addr}/nowhere")]).await;
    assert_eq!(code, 1);
    assert!(stderr.starts_with(&format!("batchd: probe http://{addr}/nowhere: 404")), "{stderr}");

    let closed = SocketAddr::from(([127, 0, 0, 1], free_port())).to_string();
    let (code, stdout, stderr) = cli(&world, &["probe", "--addr", &closed]).await;
    assert_eq!((code, stdout.as_str()), (1, ""));
    assert!(stderr.starts_with(&format!("batchd: probe http://{closed}/livez: connect: ")), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let report = cli_json(&world, &["probe", "--addr", &closed, "--json"], 1).await;
    assert_eq!((report["ok"].as_bool(), report["status"].is_null()), (Some(false), true), "{report}");
    let (code, _, stderr) = cli_with(&world, &["probe"], &[("BATCHD__ADMIN__LISTEN", "")]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("the admin server is off"), "{stderr}");

    // After a stop the port is closed: the probe says so.
    daemon.stop().await.unwrap();
    let (code, _, _) = cli(&world, &["probe", "--addr", &addr]).await;
    assert_eq!(code, 1);
}

#[tokio::test]
async fn the_container_image_probes_itself_on_the_port_it_exposes() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let containerfile = std::fs::read_to_string(root.join("deploy/Containerfile")).expect("deploy/Containerfile");
    let expose = containerfile.lines().find_map(|line| line.strip_prefix("EXPOSE ")).expect("EXPOSE").trim();
    let listen = containerfile
        .lines()
        .find_map(|line| line.strip_prefix("ENV BATCHD__ADMIN__LISTEN="))
        .expect("the image sets admin.listen");
    assert_eq!(listen, format!("0.0.0.0:{expose}"), "the admin server listens on the exposed port, on every interface");
    // The build command in the comment names this file.
    assert!(containerfile.contains("-f deploy/Containerfile "), "{containerfile}");
    // HEALTHCHECK ... CMD ["/usr/local/bin/batchd", "probe", ...], continued on the next line.
    let healthcheck = containerfile.split("\nHEALTHCHECK ").nth(1).expect("HEALTHCHECK").replace("\\\n", " ");
    let exec = healthcheck.split(" CMD ").nth(1).expect("CMD").lines().next().unwrap().trim().to_owned();
    let exec: Vec<String> = serde_json::from_str(&exec).expect("exec form");
    assert_eq!(exec[..2], ["/usr/local/bin/batchd".to_owned(), "probe".to_owned()]);
    let entrypoint = containerfile.lines().find_map(|line| line.strip_prefix("ENTRYPOINT ")).expect("ENTRYPOINT");
    assert_eq!(serde_json::from_str::<Vec<String>>(entrypoint).unwrap(), ["/usr/local/bin/batchd"]);
    let ignore = std::fs::read_to_string(root.join(".dockerignore")).expect(".dockerignore at the repository root");
    for pattern in ["target/", ".git/", "**/node_modules/", "**/.venv/"] {
        assert!(ignore.lines().any(|line| line == pattern), ".dockerignore: {pattern}");
    }

    // The health check's own command, against a daemon listening as the image makes it listen (on another port).
    let world = World::new().await;
    let listening_on_every_interface = || {
        let mut settings = world.settings.clone();
        let admin = with_admin(&mut settings);
        settings.admin.listen = format!("0.0.0.0:{}", admin.port());
        (Daemon::start(settings.clone(), &world.emulator), settings.admin.listen)
    };
    let (mut daemon, mut listen) = listening_on_every_interface();
    let args: Vec<&str> = exec[1..].iter().map(String::as_str).collect();
    let started = Instant::now();
    loop {
        let (code, stdout, stderr) = cli_with(&world, &args, &[("BATCHD__ADMIN__LISTEN", &listen)]).await;
        if code == 0 {
            assert_eq!(stdout, "ok\n");
            break;
        }
        if !daemon.is_running() {
            // The port was free when picked, and taken before the daemon bound it on every interface (a connection
            // of another test on this busy machine has the same local port): another port, the same check.
            let error = format!("{:#}", daemon.stop().await.expect_err("a daemon that ended by itself failed"));
            assert!(error.contains("in use"), "the daemon ended: {error}");
            (daemon, listen) = listening_on_every_interface();
            continue;
        }
        assert!(started.elapsed() < WAIT, "the health check never passed: {stderr}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    daemon.stop().await.unwrap();
    let (code, _, _) = cli_with(&world, &args, &[("BATCHD__ADMIN__LISTEN", &listen)]).await;
    assert_eq!(code, 1, "unhealthy once the daemon is gone");
}
