//! The Redis ACL rules shipped in `deploy/redis/` against a real redis-server started with them (`--aclfile`): every
//! role does its job as its own user (the daemon end to end, a producer enqueueing and reading its results, operators
//! running the CLI), and every action outside a role is refused with `NOPERM`.
//!
//! The rules are the shipped files themselves, with the namespace and the password placeholder substituted as
//! `deploy/redis/README.md` says, so the files cannot drift from what is tested. The test's own connection is the
//! server's `default` user (not in the files), which plays the Redis administrator.
//!
//! Long because each role's test walks that role's whole list of allowed and refused commands, all on the one
//! ACL set-up at the top.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use batchd::settings::Secret;
use batchd_core::{Keys, ResultStatus};
use batchd_emulator::{Emulator, EmulatorConfig};
use batchd_producer::{NewJob, Producer, ReaderOptions, ResultReader};
use batchd_tests::browser::Dashboard;
use batchd_tests::{RedisServer, World, bge_m3_job, test_connection, test_settings};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde_json::json;

use crate::cli_ops::{run, text};

const WAIT: Duration = Duration::from_secs(30);

/// The roles, by the name of their file in `deploy/redis/` (which is also the Redis user's name).
const ROLES: [&str; 4] = ["batchd", "producer", "operator-ro", "operator"];

/// The password placeholder of the shipped files (a `#<sha256>` rule that Redis refuses until it is replaced).
const PASSWORD_PLACEHOLDER: &str = "#PASSWORD_SHA256";

/// The namespace the shipped files are written for.
const SHIPPED_NAMESPACE: &str = "{batchd}";

fn password(role: &str) -> String {
    format!("test-password-of-{role}")
}

/// The shipped rules for `namespace`, as one ACL file: each role's line with `{batchd}` replaced by `{namespace}` and
/// the placeholder by a plain-text password (`>...`).
fn rules(namespace: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/redis");
    let mut file = String::new();
    for role in ROLES {
        let path = dir.join(format!("{role}.acl"));
        let shipped = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let lines: Vec<&str> = shipped.lines().filter(|line| !line.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{role}.acl holds one user line");
        let line = lines[0];
        assert!(line.starts_with(&format!("user {role} on {PASSWORD_PLACEHOLDER} ")), "{role}.acl: {line}");
        assert!(line.contains(SHIPPED_NAMESPACE), "{role}.acl names the namespace's keys");
        let line = line
            .replace(PASSWORD_PLACEHOLDER, &format!(">{}", password(role)))
            .replace(SHIPPED_NAMESPACE, &format!("{{{namespace}}}"));
        file.push_str(&line);
        file.push('\n');
        if role == "producer" {
            // A second application, written as deploy/redis/README.md says: the producer line with the
            // application's name for `producer` (its user and its results stream).
            file.push_str(&line.replace("producer", OTHER_APPLICATION));
            file.push('\n');
        }
    }
    file
}

/// The second application's user (and results stream suffix), made from `producer.acl`.
const OTHER_APPLICATION: &str = "billing";

/// The results stream of the application whose user is `application` (`{ns}:results:<application>`).
fn app_results(keys: &Keys, application: &str) -> String {
    format!("{}:{application}", keys.results())
}

/// Waits until the daemon loaded batchd's Redis functions (it does so at start).
async fn wait_for_functions(world: &World) {
    let started = Instant::now();
    loop {
        let libraries: Vec<redis::Value> = redis::cmd("FUNCTION")
            .arg("LIST")
            .arg("LIBRARYNAME")
            .arg(batchd_queue::functions::library_name())
            .query_async(&mut world.conn.clone())
            .await
            .expect("function list");
        if !libraries.is_empty() {
            return;
        }
        assert!(started.elapsed() < WAIT, "the daemon never loaded batchd's functions");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A world whose Redis runs with the shipped ACL users, and whose daemon settings connect as the `batchd` user.
async fn acl_world() -> World {
    let namespace = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let acl_dir = std::env::temp_dir().join(format!("batchd-it-acl-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&acl_dir).expect("acl dir");
    let acl_file = acl_dir.join("users.acl");
    std::fs::write(&acl_file, rules(&namespace)).expect("write acl file");
    let redis = RedisServer::start_with(&[
        "--save",
        "",
        "--appendonly",
        "no",
        "--aclfile",
        acl_file.to_str().expect("utf-8 path"),
    ])
    .await;
    // Redis read the file at start; it is not needed any more.
    let _ = std::fs::remove_dir_all(&acl_dir);
    let emulator =
        Emulator::start(EmulatorConfig::default(), "127.0.0.1:0".parse().expect("addr")).await.expect("emulator");
    let settings = test_settings(&user_url(&redis, "batchd"), &emulator, &namespace);
    let keys = settings.keys();
    let conn = test_connection(&redis.url()).await;
    let world = World { redis, emulator, settings, keys, conn };
    let users: Vec<String> = redis::cmd("ACL").arg("USERS").query_async(&mut world.conn.clone()).await.expect("acl");
    for role in ROLES {
        assert!(users.iter().any(|user| user == role), "user {role} loaded from the shipped file: {users:?}");
    }
    world
}

/// `redis://<role>:<password>@127.0.0.1:<port>`.
fn user_url(redis: &RedisServer, role: &str) -> String {
    format!("redis://{role}:{}@127.0.0.1:{}", password(role), redis.port)
}

async fn connect_as(world: &World, role: &str) -> MultiplexedConnection {
    test_connection(&user_url(&world.redis, role)).await
}

/// The ACL log (commands and keys Redis refused), as `user: object (reason, context)` lines.
async fn denials(world: &World) -> Vec<String> {
    let entries: Vec<HashMap<String, redis::Value>> =
        redis::cmd("ACL").arg("LOG").arg(1000).query_async(&mut world.conn.clone()).await.expect("acl log");
    entries
        .iter()
        .map(|entry| {
            let field = |name: &str| {
                entry.get(name).and_then(|v| redis::from_redis_value::<String>(v.clone()).ok()).unwrap_or_default()
            };
            format!("{}: {} ({}, {})", field("username"), field("object"), field("reason"), field("context"))
        })
        .collect()
}

/// Asserts that `role` is refused `command` with `NOPERM`.
async fn refused(conn: &mut MultiplexedConnection, role: &str, what: &str, command: &redis::Cmd) {
    let outcome: redis::RedisResult<redis::Value> = command.query_async(conn).await;
    match outcome {
        Err(error) => assert_eq!(error.code(), Some("NOPERM"), "{role} may not {what}: refused, but with {error}"),
        Ok(value) => panic!("{role} may not {what}, yet Redis answered {value:?}"),
    }
}

fn cmd(args: &[&str]) -> redis::Cmd {
    let mut command = redis::cmd(args[0]);
    for arg in &args[1..] {
        command.arg(*arg);
    }
    command
}

/// `batchd <args>` as the Redis user `role`: (exit code, stdout, stderr).
async fn cli_as(world: &World, role: &str, args: &[&str]) -> (i32, String, String) {
    let mut command = world.batchd();
    command.env("REDIS_URL", user_url(&world.redis, role)).args(args);
    let output = run(command).await;
    (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr))
}

/// Reads `reader` until it delivered `n` entries (acknowledging them); returns them by job id.
async fn read_results(reader: &mut ResultReader, n: usize) -> HashMap<String, batchd_core::ResultEntry> {
    let started = Instant::now();
    let mut results = HashMap::new();
    while results.len() < n {
        assert!(started.elapsed() < WAIT, "timed out with {} of {n} results: {:?}", results.len(), results.keys());
        let batch = reader.next_batch().await.expect("read results as the producer");
        for delivery in &batch {
            let entry = delivery.result().expect("well-formed result");
            results.insert(entry.job_id.clone(), entry);
        }
        reader.ack_all(&batch).await.expect("ack as the producer");
    }
    results
}

fn reader_options(group: &str, stream: Option<String>) -> ReaderOptions {
    let mut options = ReaderOptions::new(group, "worker-1");
    options.stream = stream;
    options.block = Duration::from_millis(200);
    options
}

#[tokio::test]
async fn every_role_does_its_job_with_the_shipped_rules() {
    let mut world = acl_world().await;
    // The shared rate limiter runs its script too: a slot every 36 s, 100 back to back, so nobody waits and its
    // state outlives the test.
    let limits = &mut world.settings.rate_limits;
    (limits.text_generation, limits.embeddings, limits.translation, limits.speech_recognition) = (100, 100, 100, 100);
    (limits.window_secs, limits.burst) = (3600, 100);
    let keys = world.keys.clone();
    let namespace = keys.namespace().to_owned();
    let daemon = world.daemon();

    // An operator cancels a job before it arrives (batchd's `cancel` function, which the daemon loaded, called
    // by name as the operator), and cancelling it again changes nothing.
    wait_for_functions(&world).await;
    for _ in 0..2 {
        let (code, _, stderr) =
            cli_as(&world, "operator", &["cancel", "acl-3", "--before-arrival", "--reason", "not needed"]).await;
        assert_eq!(code, 0, "operator: batchd cancel: {stderr}");
    }

    // A producer enqueues through the Rust library and with a bare XADD, and reads its application's results with
    // consumer groups; another application reads its own.
    let producer = Producer::connect(&user_url(&world.redis, "producer"), &namespace).await.expect("connect");
    let own = app_results(&keys, "producer");
    let billing = app_results(&keys, OTHER_APPLICATION);
    let mut own_reader = producer
        .results_reader(reader_options("app", Some(own.clone())))
        .await
        .expect("create a group as the producer");
    let other = Producer::connect(&user_url(&world.redis, OTHER_APPLICATION), &namespace).await.expect("connect");
    let mut billing_reader = other.results_reader(reader_options("app", Some(billing.clone()))).await.expect("group");
    let text_job = |id: &str| {
        NewJob::new("@cf/baai/bge-m3", vec![json!({"text": format!("text of {id}")})])
            .with_id(id)
            .with_reply_to(own.clone())
    };
    producer.enqueue(&text_job("acl-1")).await.expect("enqueue as the producer");
    producer.enqueue(&text_job("acl-2").with_reply_to(billing.clone())).await.expect("enqueue with reply_to");
    producer.enqueue(&text_job("acl-3")).await.expect("enqueue the cancelled job");
    let mut raw = connect_as(&world, "producer").await;
    let not_a_job: String = raw.xadd(keys.submit(), "*", &[("payload", "hello")]).await.expect("bare XADD");

    let results = read_results(&mut own_reader, 2).await;
    assert_eq!(results["acl-1"].status, ResultStatus::Completed, "{:?}", results["acl-1"]);
    assert_eq!(results["acl-3"].status, ResultStatus::Cancelled, "{:?}", results["acl-3"]);
    // An entry that is not a job names no stream: its failure goes to the default one.
    let refused = world.wait_for_result(&not_a_job, WAIT).await;
    assert_eq!(refused.status, ResultStatus::Failed);
    assert_eq!(refused.error.as_ref().map(|e| e.code.as_str()), Some("invalid_entry"));
    let (_, limiters): (u64, Vec<String>) =
        cmd(&["SCAN", "0", "MATCH", &batchd_core::Keys::rate_limit("*:*"), "COUNT", "1000"])
            .query_async(&mut world.conn.clone())
            .await
            .expect("scan");
    assert!(!limiters.is_empty(), "the shared rate limiter booked its slots as the batchd user");
    let billed = read_results(&mut billing_reader, 1).await;
    assert_eq!(billed["acl-2"].status, ResultStatus::Completed, "{:?}", billed["acl-2"]);

    // The read-only operator runs the CLI's read commands.
    let read_only = |args: &'static [&'static str]| {
        let world = &world;
        async move {
            let (code, stdout, stderr) = cli_as(world, "operator-ro", args).await;
            assert_eq!(code, 0, "operator-ro: batchd {}: {stderr}", args.join(" "));
            stdout
        }
    };
    assert!(read_only(&["status", "acl-1"]).await.contains("state        completed"));
    assert!(read_only(&["jobs"]).await.contains("acl-2"));
    let stats: serde_json::Value = serde_json::from_str(&read_only(&["stats", "--json"]).await).expect("stats JSON");
    assert_eq!(stats["results"]["entries"], 1, "{stats}");
    assert_eq!(stats["dead"]["entries"], 1, "{stats}");
    let dead: serde_json::Value = serde_json::from_str(&read_only(&["dead", "list", "--json"]).await).expect("JSON");
    let dead_id = dead[0]["entry_id"].as_str().expect("a dead-letter entry").to_owned();
    let (code, shown, stderr) = cli_as(&world, "operator-ro", &["dead", "show", &dead_id]).await;
    assert_eq!(code, 0, "operator-ro: batchd dead show: {stderr}");
    assert!(shown.contains("hello"), "{shown}");
    let tailed = read_only(&["tail", "--from-start", "--count", "1", "--timeout", "20"]).await;
    assert_eq!(tailed.lines().count(), 1, "{tailed}");
    let tailed = read_only(&["tail", "--stream", "billing", "--from-start", "--count", "1", "--timeout", "20"]).await;
    assert!(tailed.contains("acl-2"), "{tailed}");
    let workers: serde_json::Value = serde_json::from_str(&read_only(&["workers", "--json"]).await).expect("JSON");
    assert_eq!(workers["consumers"].as_array().map(Vec::len), Some(1), "{workers}");
    let retry: serde_json::Value =
        serde_json::from_str(&read_only(&["retry", "--status", "failed", "--dry-run", "--json"]).await).expect("JSON");
    assert_eq!(retry["namespace"], namespace.as_str(), "{retry}");

    // The read-write operator submits, pauses and resumes intake, and purges dead letters.
    let file = world.redis.dir.join("job.json");
    std::fs::write(&file, bge_m3_job("acl-4", 2).to_string()).expect("job file");
    let (code, _, stderr) = cli_as(&world, "operator", &["submit", file.to_str().expect("path")]).await;
    assert_eq!(code, 0, "operator: batchd submit: {stderr}");
    assert_eq!(world.wait_for_result("acl-4", WAIT).await.status, ResultStatus::Completed);
    for args in [&["pause", "--reason", "acl test"][..], &["resume"]] {
        let (code, _, stderr) = cli_as(&world, "operator", args).await;
        assert_eq!(code, 0, "operator: batchd {}: {stderr}", args.join(" "));
    }
    // `retry` as the operator: it reads the matching result entries and each job's ledger (the entry that was not a
    // job was refused before it ran, so it is reported as not retryable, exit 1), with nothing refused by Redis.
    let (code, stdout, stderr) = cli_as(&world, "operator", &["retry", "--status", "failed", "--json"]).await;
    assert_eq!(code, 1, "operator: batchd retry: {stdout} {stderr}");
    assert!(stdout.contains("refused before it ran") && !stderr.contains("no permissions"), "{stdout} {stderr}");

    // Dead-letter retry (batchd's `dead_retry` function): the entry moves back to the submit stream once.
    let dead_job: String = world
        .conn
        .clone()
        .xadd(
            keys.dead(),
            "*",
            &[("source_id", "1-1"), ("error", "x"), ("field:job", &bge_m3_job("acl-5", 1).to_string())],
        )
        .await
        .expect("seed a dead letter with a job");
    let (code, _, stderr) = cli_as(&world, "operator", &["dead", "retry", &dead_job]).await;
    assert_eq!(code, 0, "operator: batchd dead retry: {stderr}");
    assert_eq!(world.wait_for_result("acl-5", WAIT).await.status, ResultStatus::Completed);
    let (code, _, stderr) = cli_as(&world, "operator", &["dead", "purge", "--all", "--yes"]).await;
    assert_eq!(code, 0, "operator: batchd dead purge: {stderr}");
    assert_eq!(world.conn.clone().xlen::<_, u64>(keys.dead()).await.expect("xlen"), 0);

    // The dashboard: every page as the read-only operator, every action as the operator.
    dashboard_as_each_role(&mut world).await;

    daemon.stop().await.expect("the daemon stops cleanly");
    assert_eq!(denials(&world).await, Vec::<String>::new(), "no role was refused anything while doing its job");
}

/// The dashboard (`batchd ui`) as each role: every page's JSON as the read-only operator, and every action (cancel,
/// dead-letter retry and purge) as the operator, each with the form token and origin the dashboard's own pages send.
async fn dashboard_as_each_role(world: &mut World) {
    let original = world.settings.redis.url.clone();
    let keys = world.keys.clone();
    let http = reqwest::Client::new();
    let mut admin = world.conn.clone();
    let seeded: String = admin
        .xadd(
            keys.dead(),
            "*",
            &[("source_id", "1-2"), ("error", "x"), ("field:job", &bge_m3_job("acl-6", 1).to_string())],
        )
        .await
        .expect("seed a dead letter with a job");

    world.settings.redis.url = Secret::new(user_url(&world.redis, "operator-ro"));
    {
        let dashboard = Dashboard::start(world, &[]).await.expect("the dashboard as operator-ro");
        for path in ["/api/overview", "/api/jobs", "/api/jobs/acl-1", "/api/dead", &format!("/api/dead/{seeded}")] {
            let response = http.get(dashboard.url(path)).send().await.expect("get");
            let status = response.status();
            assert_eq!(status, 200, "operator-ro: {path}: {}", response.text().await.unwrap_or_default());
        }
    }

    world.settings.redis.url = Secret::new(user_url(&world.redis, "operator"));
    let dashboard = Dashboard::start(world, &["--allow-actions"]).await.expect("the dashboard as operator");
    let token = "0123456789abcdef0123456789abcdef";
    let post = |path: String| {
        http.post(dashboard.url(&path))
            .header("Origin", format!("http://{}", dashboard.addr))
            .header("Cookie", format!("batchd_ui_session={token}"))
            .header("Accept", "application/json")
            .form(&[("token", token), ("ns", keys.namespace())])
            .send()
    };
    for (path, expected) in [
        ("/jobs/acl-7/cancel".to_owned(), 200),
        ("/jobs/acl-7/cancel".to_owned(), 200),
        (format!("/dead/{seeded}/retry"), 200),
        (format!("/dead/{seeded}/retry"), 404),
    ] {
        let response = post(path.clone()).await.expect("post");
        let status = response.status();
        assert_eq!(status, expected, "operator: {path}: {}", response.text().await.unwrap_or_default());
    }
    assert!(
        admin.exists::<_, bool>(keys.cancel(&batchd_core::JobId::parse("acl-7").expect("id"))).await.expect("exists")
    );
    assert_eq!(world.wait_for_result("acl-6", WAIT).await.status, ResultStatus::Completed);
    let purged: String = admin.xadd(keys.dead(), "*", &[("error", "x")]).await.expect("seed a dead letter");
    let response = post(format!("/dead/{purged}/purge")).await.expect("post");
    assert_eq!(response.status(), 200, "operator: purge");
    assert_eq!(admin.xlen::<_, u64>(keys.dead()).await.expect("xlen"), 0);
    world.settings.redis.url = original;
}

/// A command of a storage script (or one the daemon sends on a rare path: shutdown, events, idle consumers), with
/// arguments that pass Redis's arity check; `K` stands for a key of the namespace.
const BATCHD_COMMANDS: &[&[&str]] = &[
    &["TYPE", "K"],
    &["EXISTS", "K"],
    &["GET", "K"],
    &["SET", "K", "v", "PX", "1000"],
    &["DEL", "K"],
    &["EXPIRE", "K", "1"],
    &["TIME"],
    &["HGET", "K", "f"],
    &["HGETALL", "K"],
    &["HMGET", "K", "f"],
    &["HSET", "K", "f", "v"],
    &["HDEL", "K", "f"],
    &["HINCRBY", "K", "f", "1"],
    &["HEXISTS", "K", "f"],
    &["XADD", "K", "MAXLEN", "~", "10", "*", "f", "v"],
    &["XRANGE", "K", "-", "+"],
    &["XLEN", "K"],
    &["XACK", "K", "batchd", "1-0"],
    &["XDEL", "K", "1-0"],
    &["XPENDING", "K", "batchd", "1-0", "1-0", "1"],
    &["XREADGROUP", "GROUP", "batchd", "c", "COUNT", "1", "BLOCK", "1", "STREAMS", "K", ">"],
    &["XAUTOCLAIM", "K", "batchd", "c", "1000", "0-0", "COUNT", "1"],
    &["XCLAIM", "K", "batchd", "c", "0", "1-0", "IDLE", "1", "JUSTID"],
    &["XGROUP", "CREATE", "K", "batchd", "0", "MKSTREAM"],
    &["XGROUP", "DELCONSUMER", "K", "batchd", "c"],
    &["XINFO", "CONSUMERS", "K", "batchd"],
    &["ZADD", "K", "XX", "1", "m"],
    &["ZREM", "K", "m"],
    &["ZRANGE", "K", "0", "0", "WITHSCORES"],
    &["ZRANGEBYSCORE", "K", "-inf", "1", "LIMIT", "0", "1"],
    &["ZSCORE", "K", "m"],
    &["ZMSCORE", "K", "m"],
    &["ZCARD", "K"],
    &["ZCOUNT", "K", "-inf", "1"],
    &["HSTRLEN", "K", "f"],
    &["RPUSH", "K", "v"],
    &["LLEN", "K"],
    &["LRANGE", "K", "0", "0"],
    &["SCRIPT", "LOAD", "return 1"],
    &["EVALSHA", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "1", "K"],
    &["FUNCTION", "LOAD", "REPLACE", "#!lua name=probe\nredis.register_function('probe', function() return 1 end)"],
];

/// Every command name a storage script calls (`redis.call('X'`, `redis.pcall('X'`, `call_sliced('X'` or
/// `typed('type', 'X'`), from the scripts as Redis runs them.
fn script_commands() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for script in batchd_queue::store::SCRIPT_NAMES {
        let source = batchd_queue::store::script_source(script).expect("a known script");
        for marker in ["redis.call('", "redis.pcall('", "call_sliced('", "typed('"] {
            for (at, _) in source.match_indices(marker) {
                let mut rest = &source[at + marker.len()..];
                if marker == "typed('" {
                    // typed('zset', 'ZADD', ...): the command is the second word.
                    let Some((_, after)) = rest.split_once("', '") else { continue };
                    rest = after;
                }
                let name: String = rest.chars().take_while(|c| c.is_ascii_alphabetic()).collect();
                if rest[name.len()..].starts_with('\'') && !name.is_empty() {
                    names.insert(name.to_ascii_uppercase());
                }
            }
        }
    }
    names
}

#[tokio::test]
async fn the_daemon_user_may_run_every_command_of_its_scripts_and_rare_paths() {
    let world = acl_world().await;
    let key = format!("{}:probe", world.keys.prefix());
    let listed: BTreeSet<String> = BATCHD_COMMANDS.iter().map(|command| command[0].to_owned()).collect();
    let called = script_commands();
    assert!(called.len() >= 20, "the scripts' commands were found: {called:?}");
    let missing: Vec<&String> = called.difference(&listed).collect();
    assert!(missing.is_empty(), "scripts call {missing:?}: add them to BATCHD_COMMANDS and to deploy/redis/batchd.acl");

    // Scripts run their commands under the caller's ACL (Redis 7), so each must be allowed on the namespace's keys
    // even if the daemon only ever sends it from Lua. ACL DRYRUN asks without running anything.
    let mut conn = world.conn.clone();
    for command in BATCHD_COMMANDS {
        let mut dryrun = redis::cmd("ACL");
        dryrun.arg("DRYRUN").arg("batchd");
        for arg in *command {
            dryrun.arg(if *arg == "K" { key.as_str() } else { arg });
        }
        let answer: String = dryrun.query_async(&mut conn).await.expect("acl dryrun");
        assert_eq!(answer, "OK", "batchd may run {command:?}");
        // Not outside the namespace.
        if command.contains(&"K") {
            let mut elsewhere = redis::cmd("ACL");
            elsewhere.arg("DRYRUN").arg("batchd");
            for arg in *command {
                elsewhere.arg(if *arg == "K" { "{other}:probe" } else { arg });
            }
            let answer: String = elsewhere.query_async(&mut conn).await.expect("acl dryrun");
            assert!(answer.contains("no permissions to access"), "batchd may not run {command:?} on another namespace");
        }
    }
}

#[tokio::test]
async fn a_producer_may_only_enqueue_and_read_results() {
    let world = acl_world().await;
    let keys = &world.keys;
    let other = Keys::new("other").expect("namespace");
    let ledger = keys.job(&batchd_core::JobId::parse("victim-1").expect("id"));
    let mut admin = world.conn.clone();
    let _: () = admin.hset(&ledger, "state", "running").await.expect("seed a ledger");
    let waiting: String = admin.xadd(keys.submit(), "*", &[("job", "{}")]).await.expect("another producer's entry");
    let mut conn = connect_as(&world, "producer").await;

    let submit = keys.submit();
    let results = keys.results();
    let billing = format!("{results}:billing");
    let dead = keys.dead();
    let schedule = keys.schedule();
    let cancel = keys.cancel(&batchd_core::JobId::parse("victim-1").expect("id"));
    let rate_limit = batchd_core::Keys::rate_limit("acct:embeddings");
    let (other_submit, other_results) = (other.submit(), other.results());
    let forbidden: Vec<(&str, Vec<&str>)> = vec![
        ("forge a result", vec!["XADD", &results, "*", "job_id", "victim-1", "status", "completed"]),
        ("forge a result on a reply_to stream", vec!["XADD", &billing, "*", "job_id", "victim-1"]),
        ("write the dead-letter stream", vec!["XADD", &dead, "*", "error", "x"]),
        ("delete a ledger", vec!["DEL", &ledger]),
        ("read a ledger (another producer's input and output)", vec!["HGETALL", &ledger]),
        ("change a ledger", vec!["HSET", &ledger, "state", "completed"]),
        ("cancel another producer's job", vec!["SET", &cancel, "mine now"]),
        ("touch the schedule", vec!["ZADD", &schedule, "0", "victim-1#0"]),
        ("touch the rate limiter", vec!["SET", &rate_limit, "0"]),
        ("read waiting jobs", vec!["XRANGE", &submit, "-", "+"]),
        ("take jobs from the daemon's group", vec!["XREADGROUP", "GROUP", "batchd", "thief", "STREAMS", &submit, ">"]),
        ("delete a waiting job", vec!["XDEL", &submit, &waiting]),
        ("trim the submit stream", vec!["XTRIM", &submit, "MAXLEN", "0"]),
        ("destroy another application's group", vec!["XGROUP", "DESTROY", &results, "billing-app"]),
        (
            "read another application's results through its group",
            vec!["XREADGROUP", "GROUP", "billing-app", "thief", "STREAMS", &billing, ">"],
        ),
        ("acknowledge another application's results", vec!["XACK", &billing, "billing-app", "1-0"]),
        ("claim another application's results", vec!["XAUTOCLAIM", &billing, "billing-app", "thief", "0", "0-0"]),
        ("read another application's results", vec!["XRANGE", &billing, "-", "+"]),
        (
            "read the default results stream through a group",
            vec!["XREADGROUP", "GROUP", "g", "c", "STREAMS", &results, ">"],
        ),
        ("run a function", vec!["FCALL", "anything", "0"]),
        (
            "load a function",
            vec!["FUNCTION", "LOAD", "#!lua name=x\nredis.register_function('x', function() return 1 end)"],
        ),
        ("delete a results stream", vec!["DEL", &results]),
        ("trim a results stream", vec!["XTRIM", &results, "MAXLEN", "0"]),
        ("enqueue into another namespace", vec!["XADD", &other_submit, "*", "job", "{}"]),
        ("read another namespace's results", vec!["XRANGE", &other_results, "-", "+"]),
        ("run a script", vec!["EVAL", "return 1", "0"]),
        ("list keys", vec!["SCAN", "0"]),
        ("flush the database", vec!["FLUSHDB"]),
        ("change the server's configuration", vec!["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]),
        ("publish", vec!["PUBLISH", "channel", "x"]),
    ];
    for (what, args) in &forbidden {
        refused(&mut conn, "a producer", what, &cmd(args)).await;
    }
    // Redis logs refusals (similar ones as one entry with a count): what the other tests rely on to show that
    // nothing was refused.
    let logged = denials(&world).await;
    assert!(logged.iter().all(|line| line.starts_with("producer: ")), "{logged:?}");
    for expected in ["producer: flushdb (command, toplevel)", &format!("producer: {other_submit} (key, toplevel)")] {
        assert!(logged.iter().any(|line| line == expected), "{expected} is in the ACL log: {logged:?}");
    }
    assert_eq!(admin.hget::<_, _, String>(&ledger, "state").await.expect("hget"), "running", "the ledger is intact");
    assert_eq!(admin.xlen::<_, u64>(&submit).await.expect("xlen"), 1, "the waiting entry is intact");

    // What it may do. Its own application's results stream, and the groups on it, are its own business.
    let own = app_results(keys, "producer");
    let _: String = conn.xadd(&submit, "*", &[("job", "{}")]).await.expect("enqueue");
    let _: () = cmd(&["XGROUP", "CREATE", &own, "app", "0", "MKSTREAM"]).query_async(&mut conn).await.expect("group");
    let _: redis::Value = cmd(&["XREADGROUP", "GROUP", "app", "c", "STREAMS", &own, ">"])
        .query_async(&mut conn)
        .await
        .expect("read results");
    let _: i64 = cmd(&["XACK", &own, "app", "1-0"]).query_async(&mut conn).await.expect("ack its own");
    let _: redis::Value = cmd(&["XRANGE", &own, "-", "+"]).query_async(&mut conn).await.expect("read its own stream");

    // What the rules cannot stop inside a namespace (docs/security.md): XADD's own trimming options. A producer
    // that may enqueue may also drop every job still waiting, its own and other producers'.
    let _: String =
        cmd(&["XADD", &submit, "MAXLEN", "0", "*", "job", "{}"]).query_async(&mut conn).await.expect("xadd maxlen");
    assert_eq!(admin.xlen::<_, u64>(&submit).await.expect("xlen"), 0, "XADD MAXLEN 0 emptied the submit stream");
}

#[tokio::test]
async fn the_read_only_operator_cannot_write_through_redis_or_the_cli() {
    let world = acl_world().await;
    let keys = &world.keys;
    let mut admin = world.conn.clone();
    let dead_entry: String = admin.xadd(keys.dead(), "*", &[("error", "x")]).await.expect("seed a dead letter");
    let ledger = keys.job(&batchd_core::JobId::parse("job-1").expect("id"));
    let _: () = admin.hset(&ledger, "state", "running").await.expect("seed a ledger");
    let mut conn = connect_as(&world, "operator-ro").await;

    let submit = keys.submit();
    let results = keys.results();
    let dead = keys.dead();
    let cancel = keys.cancel(&batchd_core::JobId::parse("job-1").expect("id"));
    let forbidden: Vec<(&str, Vec<&str>)> = vec![
        ("enqueue", vec!["XADD", &submit, "*", "job", "{}"]),
        ("cancel", vec!["SET", &cancel, "x"]),
        ("delete a ledger", vec!["DEL", &ledger]),
        ("change a ledger", vec!["HSET", &ledger, "state", "completed"]),
        ("delete a dead letter", vec!["XDEL", &dead, &dead_entry]),
        ("create a group", vec!["XGROUP", "CREATE", &results, "g", "0"]),
        (
            "read through a group (it moves the group's position)",
            vec!["XREADGROUP", "GROUP", "g", "c", "STREAMS", &results, ">"],
        ),
        ("load a script", vec!["SCRIPT", "LOAD", "return 1"]),
        ("run a script", vec!["EVAL", "return 1", "0"]),
        ("start a transaction", vec!["MULTI"]),
        ("read another namespace", vec!["HGETALL", "{other}:job:job-1"]),
        ("read a whole ledger (every item and output, sized by a producer)", vec!["HGETALL", &ledger]),
        ("read a whole ledger through another hash command", vec!["HRANDFIELD", &ledger, "-100", "WITHVALUES"]),
        ("read a ledger's values", vec!["HVALS", &ledger]),
        ("flush the database", vec!["FLUSHDB"]),
        ("change the server's configuration", vec!["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]),
    ];
    for (what, args) in &forbidden {
        refused(&mut conn, "the read-only operator", what, &cmd(args)).await;
    }
    // The counters' hashes (a few hundred fields the daemon sized) are the one place HGETALL is left for `stats`,
    // `status` and the dashboard's overview; a ledger's fields are read by name (HMGET, HGET, HSTRLEN).
    let minute = keys.stats_minute(1);
    let _: () = admin.hset(&minute, "completed", 1).await.expect("seed a counter");
    let counters: HashMap<String, String> =
        cmd(&["HGETALL", &minute]).query_async(&mut conn).await.expect("HGETALL of a counter hash");
    assert_eq!(counters.get("completed").map(String::as_str), Some("1"));
    let state: Option<String> = cmd(&["HGET", &ledger, "state"]).query_async(&mut conn).await.expect("HGET by name");
    assert_eq!(state.as_deref(), Some("running"));

    let file = world.redis.dir.join("job.json");
    std::fs::write(&file, bge_m3_job("job-2", 1).to_string()).expect("job file");
    let commands: [&[&str]; 4] = [
        &["cancel", "job-1", "--before-arrival"],
        &["dead", "purge", "--all", "--yes"],
        &["dead", "purge", "--yes", &dead_entry],
        &["submit", file.to_str().expect("path")],
    ];
    for args in commands {
        let (code, _, stderr) = cli_as(&world, "operator-ro", args).await;
        assert_eq!(code, 1, "operator-ro: batchd {} fails: {stderr}", args.join(" "));
        // `dead purge --all` is a MULTI/EXEC pipeline. When MULTI itself is refused, redis-rs 1.8.1 miscounts the
        // transaction's replies (a usize underflow that panics its connection task), so the CLI reports a broken
        // pipe instead of the refusal; what it did not do is checked below all the same.
        if args.contains(&"--all") {
            continue;
        }
        assert!(
            stderr.contains("no permissions to"),
            "operator-ro: batchd {}: the refusal is named: {stderr}",
            args.join(" ")
        );
    }
    assert!(!admin.exists::<_, bool>(&cancel).await.expect("exists"), "no cancellation was requested");
    assert_eq!(admin.xlen::<_, u64>(&dead).await.expect("xlen"), 1, "the dead letter is kept");
    assert_eq!(admin.xlen::<_, u64>(&submit).await.expect("xlen"), 0, "nothing was enqueued");
}

/// The operator role runs batchd's functions by name and no Lua of its own: `SCRIPT LOAD` then `EVALSHA` of a
/// loop would block Redis for everyone (issue 21), so neither is granted, nor `EVAL` or `FUNCTION LOAD`. Every
/// command batchd's functions send is allowed to it on its namespace (functions run under the caller's ACL).
#[tokio::test]
async fn the_operator_cannot_run_lua_of_its_own_but_may_call_batchds_functions() {
    let world = acl_world().await;
    let mut conn = connect_as(&world, "operator").await;
    let key = format!("{}:probe", world.keys.prefix());
    let forbidden: Vec<(&str, Vec<&str>)> = vec![
        ("load a script", vec!["SCRIPT", "LOAD", "while true do end"]),
        ("run a script", vec!["EVAL", "while true do end", "0"]),
        ("run a loaded script", vec!["EVALSHA", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "1", &key]),
        ("run a read-only script", vec!["EVAL_RO", "return 1", "0"]),
        (
            "load a function",
            vec!["FUNCTION", "LOAD", "#!lua name=x\nredis.register_function('x', function() while true do end end)"],
        ),
        ("delete batchd's functions", vec!["FUNCTION", "FLUSH"]),
        ("kill a running script", vec!["SCRIPT", "KILL"]),
    ];
    for (what, args) in &forbidden {
        refused(&mut conn, "the operator", what, &cmd(args)).await;
    }
    let library = batchd_queue::functions::library_text();
    let mut called = BTreeSet::new();
    for marker in ["redis.call('", "call_sliced('"] {
        for (at, _) in library.match_indices(marker) {
            let name: String = library[at + marker.len()..].chars().take_while(|c| c.is_ascii_alphabetic()).collect();
            called.insert(name.to_ascii_uppercase());
        }
    }
    for command in ["TYPE", "HMGET", "SET", "ZADD", "XDEL", "XADD"] {
        assert!(called.remove(command), "the functions call {command}");
    }
    assert!(called.is_empty(), "the functions call {called:?}: add them to this list and to operator.acl");
    let mut admin = world.conn.clone();
    for command in [
        vec!["FCALL", "f", "1", &key],
        vec!["TYPE", &key],
        vec!["HMGET", &key, "f"],
        vec!["SET", &key, "v", "EX", "1"],
        vec!["ZADD", &key, "XX", "0", "m"],
        vec!["XDEL", &key, "1-0"],
        vec!["XADD", &key, "*", "f", "v"],
    ] {
        let mut dryrun = redis::cmd("ACL");
        dryrun.arg("DRYRUN").arg("operator").arg(&command);
        let answer: String = dryrun.query_async(&mut admin).await.expect("acl dryrun");
        assert_eq!(answer, "OK", "operator may run {command:?}");
    }
}

#[tokio::test]
async fn reply_to_cannot_leave_the_namespace_but_can_reach_any_results_stream_inside_it() {
    let world = acl_world().await;
    let keys = world.keys.clone();
    let daemon = world.daemon();
    let mut conn = connect_as(&world, "producer").await;
    let other = Keys::new("other").expect("namespace");
    let sibling = format!("{}:another-app", keys.results());
    for (id, reply_to) in [("escape-1", other.results()), ("sibling-1", sibling.clone())] {
        let mut job = bge_m3_job(id, 1);
        job["reply_to"] = json!(reply_to);
        let _: String = conn.xadd(keys.submit(), "*", &[("job", job.to_string())]).await.expect("enqueue");
    }

    let escaped = world.wait_for_result("escape-1", WAIT).await;
    assert_eq!(escaped.status, ResultStatus::Failed);
    assert_eq!(escaped.error.as_ref().map(|e| e.code.as_str()), Some("invalid_job"), "{escaped:?}");
    assert!(
        !world.conn.clone().exists::<_, bool>(other.results()).await.expect("exists"),
        "nothing left the namespace"
    );

    // Inside the namespace, batchd writes wherever the job says: results streams are separated by namespace only.
    let started = Instant::now();
    while world.stream(&sibling).await.is_empty() {
        assert!(started.elapsed() < WAIT, "the result of sibling-1 never reached {sibling}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(world.stream(&sibling).await[0]["job_id"], "sibling-1");
    daemon.stop().await.expect("stop");
    assert_eq!(denials(&world).await, Vec::<String>::new());
}
