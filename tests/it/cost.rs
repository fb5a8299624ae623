//! The Redis work one job costs, as a guard, per step and in total: one-item jobs go take-in → submit → poll →
//! publish through the real daemon (in-process) and the emulator over HTTP, each batch done at its first poll,
//! while a `MONITOR` connection attributes every command to the step that ran it (a script by its SHA, with the
//! commands it ran inside; a command the daemon sent itself by its name).
//!
//! Two runs on the same daemon, of [`JOBS`] and 2 × [`JOBS`] jobs, and the cost of a job is their difference
//! divided by [`JOBS`]: what does not grow with the jobs (start-up, the wait for the last result, reads that run on
//! a timer over a fixed stretch) cancels, so the script steps are exact and a change that adds one command per job
//! anywhere fails here, in `make test`, and not in a benchmark nobody re-ran. The daemon's reads on a timer do grow
//! with the runs' length (the larger run lasts longer): they are a step of their own ("outside scripts"), at the
//! default idle intervals, held apart from the steps a job pays for. The test runs in nextest's one-at-a-time group
//! (`.config/nextest.toml`), so no other test's load stretches its runs. docs/benchmarks.md has the table.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use batchd_emulator::EmulatorConfig;
use batchd_tests::{World, wait_until};

/// Jobs of the smaller run (the larger has twice as many): with a daemon's fixed work cancelled by the
/// difference, 1 / 250 = 0.004 command per job is the resolution.
const JOBS: usize = 250;

/// Ceilings per step, in commands per job (script internals included; the script call itself counts one): the
/// count measured here (docs/benchmarks.md, "Redis work per job") with less than one command of room, so one more
/// command per job in any step fails.
/// What the difference of the two runs may show above a step's ceiling without a cost per job: 5 commands over the
/// jobs between the runs (a cold run at the ceiling once measured 11.004 for publish's 11).
const NOISE_PER_JOB: f64 = 5.0 / JOBS as f64;

const STEPS: [(&str, f64); 5] = [
    // 8.00 measured. EVALSHA; HMGET (duplicate id), XRANGE (the entry), EXISTS (cancel flag), ZADD, HSET, XACK, XDEL.
    ("take-in (accept)", 8.0),
    // 5.00 measured. EVALSHA; HMGET (fencing token, state), ZADD (first poll), HSET, ZADD of the remote-batches index.
    ("submit record (transition)", 5.0),
    // 3.38 measured. Per job: HMGET of the view, GET of the cancel flag, HSET of the fencing token; per call, shared
    // by the members it claims: EVALSHA, ZMSCORE, ZADD XX (0.13 calls per job measured; room for one per 3 jobs).
    ("poll claim (claim)", 4.0),
    // 12.00 measured. EVALSHA; HMGET, TYPE, XADD (the result), HSET, HDEL, EXPIRE, ZREM × 2, HINCRBY × 3 (finished,
    // prompt tokens, and the cost of a priced model: bge-m3 has a built-in price since issue 39).
    ("publish (publish)", 12.0),
    // 0.45 measured. The daemon's own reads: XREADGROUP of the ingress and EXISTS of the pause flag (a read takes
    // about 7 entries here), ZRANGEBYSCORE of the schedule, and whatever runs on a timer over the larger run's
    // extra length.
    ("outside scripts", 0.9),
];

/// Commands per lifecycle job in all: 28.83 measured (the steps above), with room for the claim's batching and the
/// timed reads to vary, and not for one more command per job.
const MAX_COMMANDS_PER_JOB: f64 = 29.5;

/// Ceilings per step of a packed job (packing on, its defaults), measured the same way (docs/benchmarks.md, "Redis
/// work per job"): the steps every job pays (take-in, its share of forming and delivering its pack, its claim, its
/// ledger read and its publish) with less than one command of room, and the pack's own steps (its create, record,
/// poll, end and close: a few commands per pack, shared by a few hundred jobs) with room for the runs to differ by
/// a pack or two.
const PACKED_STEPS: [(&str, f64); 11] = [
    // 13.00 measured: the unpacked take-in's 8, and the packing queue's ZRANGE (the first to go), ZCARD, ZSCORE of the
    // packers (its type), ZADD of the job's deadline watcher, of the queue and of the packers.
    ("take-in (accept)", 13.0),
    // 3.00 measured. Per member: HMGET of its view, HSTRLEN of its items, HSET of its pack; per run of 500, the rest.
    ("script pack_form", 3.0),
    // 3.00 measured. Per member: HMGET, HSET of its output, ZADD (its job due now); per run of 500, the rest.
    ("script pack_deliver", 3.0),
    // 3.02 measured: the member's claim to publish (as the unpacked poll claim).
    ("poll claim (claim)", 4.0),
    // 12.00 measured, as unpacked (the model has a price: one HINCRBY of its cost).
    ("publish (publish)", 12.0),
    // 3.72 measured: the member's finish reads its ledger (HGET, 2 × HMGET) outside scripts, plus the daemon's
    // timed reads (the packer's ZRANGE of the due keys among them).
    ("outside scripts", 4.2),
    ("script begin_submit", 0.2),
    ("submit record (transition)", 0.2),
    ("script chunk_done", 0.2),
    ("script pack_close", 0.2),
    ("script rate_limit", 0.2),
];

/// Commands per packed job in all: 37.74 measured (36.74 before the cost counter), nine more than a job of its own
/// pays (the packing queue at take-in, forming, delivering, the member's ledger read); what issue 35's group commit
/// starts from.
const MAX_PACKED_COMMANDS_PER_JOB: f64 = 38.5;

/// Calls per command (`INFO commandstats`, commands inside scripts included).
pub(crate) async fn commandstats(world: &World) -> BTreeMap<String, u64> {
    let text: String = redis::cmd("INFO").arg("commandstats").query_async(&mut world.conn.clone()).await.expect("INFO");
    text.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.strip_prefix("calls=")?.split(',').next()?.parse().ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// One line of `MONITOR`: who sent the command (`lua` for a command a script ran) and its first two words.
#[derive(Debug, Clone)]
struct Seen {
    /// The client's address, or `lua`.
    source: String,
    /// The command, lowercase.
    command: String,
    /// Its first argument (a script's SHA, a function's name, an `ECHO`'s text), if any.
    first: String,
}

/// Parses `1795850028.218711 [0 127.0.0.1:5555] "evalsha" "3f2a..." "3" ...`.
fn parse_monitor_line(line: &str) -> Option<Seen> {
    let open = line.find('[')?;
    let close = open + line[open..].find(']')?;
    let source = line[open + 1..close].split_whitespace().nth(1)?.to_owned();
    let mut words = line[close + 1..].trim_start().split('"').skip(1).step_by(2);
    let command = words.next()?.to_lowercase();
    let first = words.next().unwrap_or_default().to_owned();
    Some(Seen { source, command, first })
}

/// A `MONITOR` connection read on its own thread until the test ends (the socket is closed with the server).
struct Monitor {
    /// Every line so far.
    lines: Arc<Mutex<Vec<Seen>>>,
}

impl Monitor {
    fn start(port: u16) -> Self {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect MONITOR");
        stream.write_all(b"MONITOR\r\n").expect("MONITOR");
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                if let Some(seen) = parse_monitor_line(&line) {
                    sink.lock().expect("lines").push(seen);
                }
                line.clear();
            }
        });
        Self { lines }
    }

    /// The lines between the `ECHO` of `start` and that of `end` (both sent by the test, so both are there once
    /// `end` is seen).
    async fn between(&self, start: &str, end: &str) -> Vec<Seen> {
        let has = |text: &str| self.lines.lock().expect("lines").iter().any(|s| s.command == "echo" && s.first == text);
        wait_until("MONITOR to show the end marker", Duration::from_secs(30), async || has(end)).await;
        let lines = self.lines.lock().expect("lines");
        let from = lines.iter().position(|s| s.command == "echo" && s.first == start).expect("start marker");
        let to = lines.iter().position(|s| s.command == "echo" && s.first == end).expect("end marker");
        lines[from + 1..to].to_vec()
    }
}

/// What one run cost, per step: commands (a script's call and the commands it ran) and calls.
#[derive(Debug, Default)]
struct Run {
    /// Commands per step.
    commands: BTreeMap<String, u64>,
    /// Script calls (or, outside scripts, commands) per step.
    calls: BTreeMap<String, u64>,
    /// Commands per step and command name, for the breakdown.
    detail: BTreeMap<(String, String), u64>,
    /// Commands the test sent (its waits and markers), left out above.
    own: u64,
}

/// The step a script belongs to, by its file name.
fn step_of_script(name: &str) -> String {
    match name {
        "accept" => "take-in (accept)".to_owned(),
        "transition" => "submit record (transition)".to_owned(),
        "claim" => "poll claim (claim)".to_owned(),
        "publish" => "publish (publish)".to_owned(),
        other => format!("script {other}"),
    }
}

/// Attributes `lines` to steps. A command a script ran follows the line of the call that ran it (Redis runs a
/// script whole, and shows its call first); one that follows no call fails the test, as the attribution would be
/// wrong.
fn attribute(lines: &[Seen], scripts: &HashMap<String, String>, own: &str) -> Run {
    let mut run = Run::default();
    let mut current: Option<String> = None;
    for seen in lines {
        if seen.source == "lua" {
            let step = current.clone().unwrap_or_else(|| {
                panic!("MONITOR showed {} run by a script before any script call: cannot attribute it", seen.command)
            });
            *run.commands.entry(step.clone()).or_default() += 1;
            *run.detail.entry((step, seen.command.clone())).or_default() += 1;
            continue;
        }
        if seen.source == own {
            run.own += 1;
            current = None;
            continue;
        }
        let step = match seen.command.as_str() {
            "evalsha" => step_of_script(scripts.get(&seen.first).map_or("unknown", String::as_str)),
            "eval" => "script (EVAL)".to_owned(),
            "fcall" | "fcall_ro" => format!("function {}", seen.first),
            _ => "outside scripts".to_owned(),
        };
        current = (step != "outside scripts").then(|| step.clone());
        *run.commands.entry(step.clone()).or_default() += 1;
        *run.calls.entry(step.clone()).or_default() += 1;
        *run.detail.entry((step, seen.command.clone())).or_default() += 1;
    }
    run
}

/// Enqueues `n` one-item jobs named `<tag>-<i>` in one pipeline.
async fn enqueue(world: &World, tag: &str, n: usize) {
    let mut pipe = redis::pipe();
    for i in 0..n {
        let job = serde_json::json!({"id": format!("{tag}-{i}"), "model": "@cf/baai/bge-m3",
            "requests": [{"query": "What is batchd?", "contexts": [{"text": "A batch daemon."}]}]});
        pipe.xadd(world.keys.submit(), "*", &[("job", job.to_string())]);
    }
    let _: Vec<String> = pipe.query_async(&mut world.conn.clone()).await.expect("enqueue");
}

/// Sends `ECHO text` on the test's connection: a marker in the `MONITOR` stream.
async fn mark(world: &World, text: &str) {
    let _: String = redis::cmd("ECHO").arg(text).query_async(&mut world.conn.clone()).await.expect("ECHO");
}

/// One run of `n` jobs, from its enqueue until the daemon is settled again; returns what MONITOR saw and the
/// `INFO commandstats` total over the same stretch (the test's own `INFO` included).
async fn measure(world: &World, monitor: &Monitor, scripts: &HashMap<String, String>, own: &str, n: usize) -> Run {
    let tag = format!("n{n}");
    let (start, end) = (format!("cost-{tag}-start"), format!("cost-{tag}-end"));
    let results_before = world.results().await.len();
    mark(world, &start).await;
    let before = commandstats(world).await;
    enqueue(world, &tag, n).await;
    world.wait_for_results(results_before + n, Duration::from_secs(180)).await;
    world.wait_until_settled(Duration::from_secs(60)).await;
    let after = commandstats(world).await;
    mark(world, &end).await;
    let run = attribute(&monitor.between(&start, &end).await, scripts, own);
    // The reader missed nothing: MONITOR's count of what everyone sent and ran is `INFO commandstats`'s, up to
    // the commands of the instants between a marker and the INFO beside it.
    let stats: u64 = after.iter().map(|(name, calls)| calls - before.get(name).copied().unwrap_or(0)).sum();
    let monitored = run.commands.values().sum::<u64>() + run.own;
    assert!(
        stats.abs_diff(monitored) <= 20,
        "MONITOR saw {monitored} commands, INFO commandstats counted {stats}: the attribution is incomplete"
    );
    assert_eq!(run.calls.get("take-in (accept)"), Some(&(n as u64)), "one take-in per job: {run:?}");
    assert_eq!(run.calls.get("publish (publish)"), Some(&(n as u64)), "one publish per job: {run:?}");
    run
}

/// What one lifecycle guard found: commands per job, per step and in all, with the table that explains them.
struct Lifecycle {
    /// Commands per job, per step (the larger run's count less the smaller one's, over the jobs between them).
    per_step: BTreeMap<String, f64>,
    /// Commands per job in all.
    total: f64,
    /// The table, printed and quoted by every failure.
    report: String,
}

/// Runs [`JOBS`] and then 2 × [`JOBS`] one-item jobs through the daemon (packed or each in its own remote batch)
/// under `MONITOR`, and checks that every job went the whole way with one completed result; `remote_batches` checks
/// the emulator's submits and polls (as many as the remote batches made, each polled once).
async fn lifecycle(packing: bool, remote_batches: impl Fn(usize, usize, &str)) -> Lifecycle {
    let config =
        EmulatorConfig { queued_for: Duration::ZERO, running_for: Duration::ZERO, ..EmulatorConfig::default() };
    let mut world = World::with_emulator(config).await;
    world.settings.packing.enabled = packing;
    // First poll right after the submit, so every batch is polled exactly once (it is done by then).
    world.settings.poll.initial_interval_ms = 1;
    world.settings.poll.max_interval_ms = 1;
    world.settings.poll.jitter = 0.0;
    // The idle reads at their defaults (the test settings shorten them for speed): what a job costs in production.
    world.settings.schedule.idle_poll_ms = 100;
    world.settings.ingress.block_ms = 2_000;
    let scripts: HashMap<String, String> = batchd_queue::store::SCRIPT_NAMES
        .iter()
        .map(|name| {
            let source = batchd_queue::store::script_source(name).expect("a script");
            (redis::Script::new(&source).get_hash().to_owned(), (*name).to_owned())
        })
        .collect();
    let own_info: String = redis::cmd("CLIENT").arg("INFO").query_async(&mut world.conn.clone()).await.expect("CLIENT");
    let own = own_info.split_whitespace().find_map(|kv| kv.strip_prefix("addr=")).expect("addr").to_owned();
    let monitor = Monitor::start(world.redis.port);

    let daemon = world.daemon();
    // Warm up: the first job creates the consumer group, loads the scripts and starts every loop.
    enqueue(&world, "warm", 1).await;
    world.wait_for_results(1, Duration::from_secs(30)).await;
    world.wait_until_settled(Duration::from_secs(30)).await;

    let small = measure(&world, &monitor, &scripts, &own, JOBS).await;
    let large = measure(&world, &monitor, &scripts, &own, 2 * JOBS).await;
    daemon.stop().await.expect("daemon stops");

    // Per job: the larger run's count less the smaller one's, over the jobs between them.
    let per_job = |large: &BTreeMap<String, u64>, small: &BTreeMap<String, u64>, step: &str| {
        let count = |run: &BTreeMap<String, u64>| run.get(step).copied().unwrap_or(0) as f64;
        (count(large) - count(small)) / JOBS as f64
    };
    let steps: BTreeSet<&String> = large.commands.keys().chain(small.commands.keys()).collect();
    let mut table = Vec::new();
    let mut per_step = BTreeMap::new();
    for step in &steps {
        let commands = per_job(&large.commands, &small.commands, step);
        let calls = per_job(&large.calls, &small.calls, step);
        per_step.insert((*step).clone(), commands);
        let detail: Vec<String> = large
            .detail
            .iter()
            .filter(|((s, _), _)| s == *step)
            .map(|((_, command), n)| {
                let before = small.detail.get(&((*step).clone(), command.clone())).copied().unwrap_or(0);
                format!("{command} {:.2}", (*n as f64 - before as f64) / JOBS as f64)
            })
            .collect();
        table.push(format!(
            "  {step}: {commands:.2} commands per job, {calls:.3} calls per job ({})",
            detail.join(", ")
        ));
    }
    let total = per_step.values().sum::<f64>();
    let mode = if packing { "packed" } else { "each in its own remote batch" };
    let report =
        format!("{total:.2} Redis commands per job, {mode} ({JOBS} vs {} jobs):\n{}", 2 * JOBS, table.join("\n"));
    println!("{report}");
    // The jobs really went the whole way: one completed result each (checked first, so a re-poll fails as one and
    // not as a cost).
    let results = world.results().await;
    assert_eq!(results.len(), 3 * JOBS + 1);
    assert!(results.iter().all(|fields| fields.get("status").map(String::as_str) == Some("completed")));
    remote_batches(world.emulator.submits().len(), world.emulator.polls().len(), &report);
    Lifecycle { per_step, total, report }
}

/// Fails when a step costs more than its ceiling in `steps`, when a step the ceilings do not name grows with the
/// jobs, or when the whole lifecycle costs more than `max_total`.
fn guard(lifecycle: &Lifecycle, steps: &[(&str, f64)], max_total: f64) {
    let report = &lifecycle.report;
    for (step, commands) in &lifecycle.per_step {
        match steps.iter().find(|(name, _)| *name == step.as_str()) {
            Some((_, ceiling)) => {
                // A few commands more in the larger run (a lease renewed, a claim split in two) show as a few
                // thousandths per job: a cost per job is at least one command per job, so the guard allows those.
                assert!(
                    *commands <= *ceiling + NOISE_PER_JOB,
                    "{step}: {commands:.2} commands per job, over {ceiling}:\n{report}"
                )
            }
            // A step this guard does not know that grows with the jobs is a cost nobody accounted for.
            None => assert!(commands.abs() < 0.05, "{step} is new: {commands:.2} commands per job:\n{report}"),
        }
    }
    assert!(
        lifecycle.total <= max_total,
        "a job costs {:.2} Redis commands, over {max_total}:\n{report}",
        lifecycle.total
    );
}

#[tokio::test]
async fn a_job_costs_no_more_redis_commands_per_step_than_measured_from_take_in_to_result() {
    // Each job submitted once and polled once, so the count is the lifecycle's and not a retry's or a re-poll's.
    let lifecycle = lifecycle(false, |submits, polls, report| {
        assert_eq!(submits, 3 * JOBS + 1, "{report}");
        assert_eq!(polls, 3 * JOBS + 1, "{report}");
    })
    .await;
    guard(&lifecycle, &STEPS, MAX_COMMANDS_PER_JOB);
}

#[tokio::test]
async fn a_packed_job_costs_no_more_redis_commands_per_step_than_measured_from_take_in_to_result() {
    // The jobs shared remote batches (a few per run, as the packer's passes met the arrivals), each polled once.
    let lifecycle = lifecycle(true, |submits, polls, report| {
        assert!(submits <= 3 * JOBS / 20, "{submits} remote batches for {} packed jobs:\n{report}", 3 * JOBS + 1);
        assert_eq!(polls, submits, "{report}");
    })
    .await;
    guard(&lifecycle, &PACKED_STEPS, MAX_PACKED_COMMANDS_PER_JOB);
}
