//! The storage scripts are all-or-nothing: each one is driven into each of its error paths (keys of the wrong
//! type, malformed arguments, oversized inputs, corrupt or missing ledgers) against a real redis-server, and a
//! snapshot of the namespace (every key's `DUMP` and whether it expires) must be the same afterwards. Redis keeps
//! the writes a script made before an error, so this holds only if every check comes before the first write.
//!
//! Also here: the ledger's count of unfinished chunks, including ledgers written before it existed.
//!
//! Long because `cases` is the table of every script's error paths, one entry each, so a new check is added
//! beside its siblings.

use std::collections::BTreeMap;

use batchd_core::keys::CONSUMER_GROUP;
use batchd_core::{ChunkRef, ChunkState, JobId, Keys};
use batchd_queue::store::{MAX_CLAIM, MAX_SCRIPT_PAIRS, OPEN_CHUNKS, script_source};
use batchd_queue::{Claim, MAX_CHUNKS_PER_JOB, Store, StoreSettings};
use batchd_tests::{RedisServer, test_connection};
use redis::aio::MultiplexedConnection;

/// Every key of a namespace: its `DUMP` (type, value, consumer groups and their pending entries) and whether it
/// has a time to live.
type Snapshot = BTreeMap<String, (Vec<u8>, bool)>;

async fn snapshot(conn: &mut MultiplexedConnection, keys: &Keys) -> Snapshot {
    let names: Vec<String> =
        redis::cmd("KEYS").arg(format!("{}*", keys.prefix())).query_async(conn).await.expect("redis");
    let mut snapshot = Snapshot::new();
    for name in names {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(&name).query_async(conn).await.expect("redis");
        let ttl: i64 = redis::cmd("PTTL").arg(&name).query_async(conn).await.expect("redis");
        snapshot.insert(name, (dump, ttl > 0));
    }
    snapshot
}

/// One namespace with a bit of everything: a submit stream with a pending entry (read by consumer `c`), a
/// running two-chunk job `live` on the schedule, a results stream, a dead-letter stream and a rate-limit bucket.
struct Fixture {
    keys: Keys,
    /// The pending ingress entry.
    entry_id: String,
}

impl Fixture {
    async fn new(conn: &mut MultiplexedConnection) -> Self {
        let namespace = format!("s{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
        let keys = Keys::new(&namespace).expect("namespace");
        let _: () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(keys.submit())
            .arg(CONSUMER_GROUP)
            .arg("$")
            .arg("MKSTREAM")
            .query_async(conn)
            .await
            .expect("redis");
        let entry_id: String = redis::cmd("XADD")
            .arg(keys.submit())
            .arg("*")
            .arg("job")
            .arg(r#"{"model":"@cf/baai/bge-m3","requests":[{"text":"x"}]}"#)
            .query_async(conn)
            .await
            .expect("redis");
        let _: redis::Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(CONSUMER_GROUP)
            .arg("c")
            .arg("STREAMS")
            .arg(keys.submit())
            .arg(">")
            .query_async(conn)
            .await
            .expect("redis");
        let fixture = Self { keys, entry_id };
        let _: () = redis::cmd("HSET")
            .arg(fixture.ledger("live"))
            .arg(&[
                ("state", "running"),
                ("model", "@cf/baai/bge-m3"),
                ("n_chunks", "2"),
                (OPEN_CHUNKS, "2"),
                ("duplicates", "0"),
                ("c0:state", "polling"),
                ("c0:items", "0:1"),
                ("c0:requests", "[{}]"),
                ("c0:attempts", "1"),
                ("c0:n_polls", "0"),
                ("c1:state", "pending"),
                ("c1:items", "1:1"),
                ("c1:requests", "[{}]"),
                ("c1:attempts", "0"),
            ])
            .query_async(conn)
            .await
            .expect("redis");
        fixture.run(conn, &["ZADD", &fixture.keys.schedule(), "9000", "live#0", "9000", "live#1"]).await;
        fixture.run(conn, &["XADD", &fixture.keys.results(), "*", "v", "1"]).await;
        fixture.run(conn, &["XADD", &fixture.keys.dead(), "*", "source_id", "1-0"]).await;
        fixture.run(conn, &["SET", &batchd_core::Keys::rate_limit("b"), "123"]).await;
        fixture
    }

    fn ledger(&self, job: &str) -> String {
        self.keys.job(&JobId::parse(job).expect("job id"))
    }

    fn cancel(&self, job: &str) -> String {
        self.keys.cancel(&JobId::parse(job).expect("job id"))
    }

    async fn run(&self, conn: &mut MultiplexedConnection, command: &[&str]) {
        let mut cmd = redis::cmd(command[0]);
        for arg in &command[1..] {
            cmd.arg(*arg);
        }
        let _: redis::Value = cmd.query_async(conn).await.expect("redis");
    }
}

/// One way to call a script, and what it must answer.
struct Case {
    /// What the case tries.
    name: &'static str,
    /// The script (file name without `.lua`).
    script: &'static str,
    /// Commands run before the snapshot, to break something.
    setup: Vec<Vec<String>>,
    keys: Vec<String>,
    args: Vec<String>,
    /// `Err(part of the message)`, or `Ok(the reply, as text)` for an answer that changes nothing.
    expect: Result<&'static str, &'static str>,
}

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|value| (*value).to_owned()).collect()
}

/// `base` with the argument at `index` replaced (or, past the end, the list cut to `index`).
fn with(base: &[String], index: usize, value: Option<&str>) -> Vec<String> {
    let mut args = base.to_vec();
    match value {
        Some(value) => args[index] = value.to_owned(),
        None => args.truncate(index),
    }
    args
}

fn cases(f: &Fixture) -> Vec<Case> {
    let k = &f.keys;
    let e = f.entry_id.as_str();
    let over_chunks = (MAX_CHUNKS_PER_JOB + 1).to_string();
    let over_pairs = (MAX_SCRIPT_PAIRS + 1).to_string();
    let wrong = |key: String, kind: &str| -> Vec<Vec<String>> {
        let mut setup = vec![strings(&["DEL", &key])];
        setup.push(match kind {
            "string" => strings(&["SET", &key, "x"]),
            "hash" => strings(&["HSET", &key, "a", "b"]),
            _ => strings(&["RPUSH", &key, "x"]),
        });
        setup
    };
    let hset = |job: &str, field: &str, value: &str| vec![strings(&["HSET", &f.ledger(job), field, value])];
    let mut cases = Vec::new();
    let mut case = |name: &'static str,
                    script: &'static str,
                    setup: Vec<Vec<String>>,
                    keys: Vec<String>,
                    args: Vec<String>,
                    expect: Result<&'static str, &'static str>| {
        cases.push(Case { name, script, setup, keys, args, expect });
    };

    // accept: KEYS ledger, submit, schedule, cancel
    let keys = vec![f.ledger("new"), k.submit(), k.schedule(), f.cancel("new")];
    let args = strings(&[
        CONSUMER_GROUP,
        e,
        "new",
        "1",
        "5000",
        "5000",
        "pending",
        "inline",
        "state",
        "accepted",
        "--chunks",
        "0:1",
        "[{}]",
    ]);
    case("accept: entry id", "accept", vec![], keys.clone(), with(&args, 1, Some("x")), Err("entry id"));
    case("accept: no chunks", "accept", vec![], keys.clone(), with(&args, 3, Some("0")), Err("chunks"));
    case("accept: too many chunks", "accept", vec![], keys.clone(), with(&args, 3, Some(&over_chunks)), Err("chunks"));
    case("accept: n_chunks text", "accept", vec![], keys.clone(), with(&args, 3, Some("two")), Err("n_chunks"));
    case("accept: due time", "accept", vec![], keys.clone(), with(&args, 4, Some("-1")), Err("due time"));
    case("accept: first state", "accept", vec![], keys.clone(), with(&args, 6, Some("polling")), Err("first chunk"));
    case("accept: source", "accept", vec![], keys.clone(), with(&args, 7, Some("disk")), Err("items source"));
    case("accept: no marker", "accept", vec![], keys.clone(), with(&args, 10, None), Err("--chunks"));
    case("accept: chunk count", "accept", vec![], keys.clone(), with(&args, 3, Some("2")), Err("chunk argument pairs"));
    case("accept: chunk items", "accept", vec![], keys.clone(), with(&args, 11, Some("0-1")), Err("chunk items"));
    case("accept: requests", "accept", vec![], keys.clone(), with(&args, 12, Some("{}")), Err("JSON array"));
    case(
        "accept: ledger type",
        "accept",
        wrong(f.ledger("new"), "string"),
        keys.clone(),
        args.clone(),
        Err("holds a string"),
    );
    case("accept: stream type", "accept", wrong(k.submit(), "hash"), keys.clone(), args.clone(), Err("holds a hash"));
    case(
        "accept: schedule type",
        "accept",
        wrong(k.schedule(), "list"),
        keys.clone(),
        args.clone(),
        Err("holds a list"),
    );
    let dup_keys = vec![f.ledger("live"), k.submit(), k.schedule(), f.cancel("live")];
    case(
        "accept: duplicate counter",
        "accept",
        hset("live", "duplicates", "many"),
        dup_keys,
        args.clone(),
        Err("duplicates"),
    );
    let mut from_entry = with(&args, 7, Some("entry"));
    from_entry[12] = "3:9".to_owned();
    case("accept: entry not as read", "accept", vec![], keys.clone(), from_entry, Ok("missing"));

    // reject: KEYS ledger, submit, results, dead, minute counters
    let keys = vec![f.ledger("rj"), k.submit(), k.results(), k.dead(), k.stats_minute(1)];
    let args = strings(&[
        CONSUMER_GROUP,
        e,
        "100",
        "100",
        "60",
        "0",
        "1",
        "v",
        "1",
        "1",
        "state",
        "failed",
        "1",
        "source_id",
        e,
        "1",
        "finished:failed",
        "1",
    ]);
    case("reject: entry id", "reject", vec![], keys.clone(), with(&args, 1, Some("1")), Err("entry id"));
    case("reject: maxlen", "reject", vec![], keys.clone(), with(&args, 2, Some("~")), Err("results maxlen"));
    case("reject: ttl", "reject", vec![], keys.clone(), with(&args, 4, Some("0")), Err("ledger ttl"));
    case("reject: guard", "reject", vec![], keys.clone(), with(&args, 5, Some("-")), Err("delivery guard"));
    case(
        "reject: pairs over the limit",
        "reject",
        vec![],
        keys.clone(),
        with(&args, 6, Some(&over_pairs)),
        Err("at most"),
    );
    case(
        "reject: pairs past the end",
        "reject",
        vec![],
        keys.clone(),
        with(&args, 12, Some("3")),
        Err("fewer arguments"),
    );
    let mut leftover = args.clone();
    leftover.push("extra".into());
    case("reject: arguments left over", "reject", vec![], keys.clone(), leftover, Err("left over"));
    let no_result = strings(&[CONSUMER_GROUP, e, "100", "100", "60", "0", "0", "1", "state", "failed", "0", "0"]);
    case("reject: no result", "reject", vec![], keys.clone(), no_result, Err("needs result"));
    let mut huge =
        strings(&[CONSUMER_GROUP, e, "100", "100", "60", "0", "1", "v", "1", "1", "state", "failed", "5000"]);
    for i in 0..5_000 {
        huge.push(format!("field:f{i}"));
        huge.push("v".into());
    }
    case("reject: 5,000 dead-letter fields", "reject", vec![], keys.clone(), huge, Err("at most"));
    case(
        "reject: ledger type",
        "reject",
        wrong(f.ledger("rj"), "string"),
        keys.clone(),
        args.clone(),
        Err("holds a string"),
    );
    case(
        "reject: stream type",
        "reject",
        wrong(k.submit(), "string"),
        keys.clone(),
        args.clone(),
        Err("holds a string"),
    );
    case("reject: results type", "reject", wrong(k.results(), "hash"), keys.clone(), args.clone(), Err("holds a hash"));
    case("reject: dead type", "reject", wrong(k.dead(), "list"), keys.clone(), args.clone(), Err("holds a list"));
    case("reject: counter amount", "reject", vec![], keys.clone(), with(&args, 17, Some("-1")), Err("counter amount"));
    let dup_keys = vec![f.ledger("live"), k.submit(), k.results(), k.dead()];
    case(
        "reject: duplicate counter",
        "reject",
        hset("live", "duplicates", "x"),
        dup_keys,
        args.clone(),
        Err("duplicates"),
    );
    case("reject: guard not reached", "reject", vec![], keys.clone(), with(&args, 5, Some("5")), Ok("gone"));
    let mut not_pending = with(&args, 5, Some("1"));
    not_pending[1] = "1-1".to_owned();
    case("reject: guard, entry not pending", "reject", vec![], keys.clone(), not_pending, Ok("gone"));

    // chunk_done: KEYS ledger, schedule, remote batches
    let keys = vec![f.ledger("live"), k.schedule(), k.remote_batches()];
    let args = strings(&["live#0", "0", "done", "{}", "5000", "6000", "0"]);
    case("chunk_done: index", "chunk_done", vec![], keys.clone(), with(&args, 1, Some("x")), Err("chunk index"));
    case(
        "chunk_done: state",
        "chunk_done",
        vec![],
        keys.clone(),
        with(&args, 2, Some("polling")),
        Err("done or failed"),
    );
    case("chunk_done: no output", "chunk_done", vec![], keys.clone(), with(&args, 3, None), Err("no output"));
    case("chunk_done: now", "chunk_done", vec![], keys.clone(), with(&args, 4, Some("soon")), Err("now"));
    case("chunk_done: lease", "chunk_done", vec![], keys.clone(), with(&args, 5, Some("")), Err("lease end"));
    case("chunk_done: token", "chunk_done", vec![], keys.clone(), with(&args, 6, Some("t")), Err("claim token"));
    case("chunk_done: claim", "chunk_done", hset("live", "c0:claim", "x"), keys.clone(), args.clone(), Err("claim"));
    case("chunk_done: stale", "chunk_done", vec![], keys.clone(), with(&args, 6, Some("1")), Ok("stale"));
    case(
        "chunk_done: not started",
        "chunk_done",
        hset("live", "c0:state", "pending"),
        keys.clone(),
        args.clone(),
        Ok("refused"),
    );
    case(
        "chunk_done: chunk out of range",
        "chunk_done",
        vec![],
        keys.clone(),
        with(&args, 1, Some("2")),
        Err("not one of"),
    );
    case(
        "chunk_done: n_chunks",
        "chunk_done",
        hset("live", "n_chunks", "two"),
        keys.clone(),
        args.clone(),
        Err("n_chunks"),
    );
    case(
        "chunk_done: huge n_chunks",
        "chunk_done",
        hset("live", "n_chunks", &over_chunks),
        keys.clone(),
        args.clone(),
        Err("more than"),
    );
    case(
        "chunk_done: counter",
        "chunk_done",
        hset("live", OPEN_CHUNKS, "-1"),
        keys.clone(),
        args.clone(),
        Err(OPEN_CHUNKS),
    );
    case(
        "chunk_done: ledger type",
        "chunk_done",
        wrong(f.ledger("live"), "string"),
        keys.clone(),
        args.clone(),
        Err("holds a string"),
    );
    case(
        "chunk_done: schedule type",
        "chunk_done",
        wrong(k.schedule(), "hash"),
        keys.clone(),
        args.clone(),
        Err("holds a hash"),
    );

    // add_chunks: KEYS ledger, schedule
    let keys = vec![f.ledger("live"), k.schedule()];
    let args = strings(&["live", "5000", "", "", "0", "0", "2:1", "", "[{}]"]);
    case("add_chunks: due", "add_chunks", vec![], keys.clone(), with(&args, 1, Some("now")), Err("due time"));
    case(
        "add_chunks: replaced",
        "add_chunks",
        vec![],
        keys.clone(),
        with(&args, 2, Some("first")),
        Err("replaced chunk"),
    );
    case("add_chunks: half a chunk", "add_chunks", vec![], keys.clone(), with(&args, 8, None), Err("triples"));
    case("add_chunks: no chunk", "add_chunks", vec![], keys.clone(), with(&args, 6, None), Err("triples"));
    case("add_chunks: items", "add_chunks", vec![], keys.clone(), with(&args, 6, Some("2")), Err("chunk items"));
    case("add_chunks: indices", "add_chunks", vec![], keys.clone(), with(&args, 7, Some("{}")), Err("indices"));
    case("add_chunks: requests", "add_chunks", vec![], keys.clone(), with(&args, 8, Some("{}")), Err("JSON array"));
    case("add_chunks: claimed", "add_chunks", vec![], keys.clone(), with(&args, 4, Some("-")), Err("claimed chunk"));
    case("add_chunks: token", "add_chunks", vec![], keys.clone(), with(&args, 5, Some("")), Err("claim token"));
    case(
        "add_chunks: a split of another chunk",
        "add_chunks",
        vec![],
        keys.clone(),
        with(&args, 2, Some("1")),
        Err("replaces the claimed chunk"),
    );
    let mut far = with(&args, 2, Some("7"));
    far[4] = "7".to_owned();
    case("add_chunks: replaced out of range", "add_chunks", vec![], keys.clone(), far, Err("not one of"));
    case("add_chunks: claim", "add_chunks", hset("live", "c0:claim", "?"), keys.clone(), args.clone(), Err("claim"));
    case("add_chunks: stale", "add_chunks", vec![], keys.clone(), with(&args, 5, Some("2")), Ok("stale"));
    case(
        "add_chunks: a split of a chunk no longer submitting",
        "add_chunks",
        vec![],
        keys.clone(),
        with(&args, 2, Some("0")),
        Ok("refused"),
    );
    let full = (MAX_CHUNKS_PER_JOB).to_string();
    case(
        "add_chunks: past the chunk limit",
        "add_chunks",
        hset("live", "n_chunks", &full),
        keys.clone(),
        args.clone(),
        Err("more than"),
    );
    case(
        "add_chunks: n_chunks",
        "add_chunks",
        hset("live", "n_chunks", ""),
        keys.clone(),
        args.clone(),
        Err("n_chunks"),
    );
    case(
        "add_chunks: counter",
        "add_chunks",
        hset("live", OPEN_CHUNKS, "x"),
        keys.clone(),
        args.clone(),
        Err(OPEN_CHUNKS),
    );
    case(
        "add_chunks: ledger type",
        "add_chunks",
        wrong(f.ledger("live"), "list"),
        keys.clone(),
        args.clone(),
        Err("holds a list"),
    );
    case(
        "add_chunks: schedule type",
        "add_chunks",
        wrong(k.schedule(), "string"),
        keys.clone(),
        args.clone(),
        Err("holds a string"),
    );
    case(
        "add_chunks: guard already set",
        "add_chunks",
        hset("live", "retried", "1"),
        keys.clone(),
        with(&args, 3, Some("retried")),
        Ok("guarded"),
    );
    let missing = vec![f.ledger("ghost"), k.schedule()];
    case("add_chunks: no ledger", "add_chunks", vec![], missing, args.clone(), Ok("gone"));

    // begin_submit: KEYS ledger, cancel
    let keys = vec![f.ledger("live"), f.cancel("live")];
    let args = strings(&["1", "5000", "0"]);
    case("begin_submit: index", "begin_submit", vec![], keys.clone(), with(&args, 0, Some("c1")), Err("chunk index"));
    case("begin_submit: now", "begin_submit", vec![], keys.clone(), with(&args, 1, None), Err("now"));
    case("begin_submit: token", "begin_submit", vec![], keys.clone(), with(&args, 2, Some("1.0")), Err("claim token"));
    case(
        "begin_submit: claim",
        "begin_submit",
        hset("live", "c1:claim", "-2"),
        keys.clone(),
        args.clone(),
        Err("claim"),
    );
    case("begin_submit: stale", "begin_submit", vec![], keys.clone(), with(&args, 2, Some("1")), Ok("stale"));
    case(
        "begin_submit: attempts",
        "begin_submit",
        hset("live", "c1:attempts", "1.5"),
        keys.clone(),
        args.clone(),
        Err("attempts"),
    );
    let resubmit =
        vec![strings(&["HSET", &f.ledger("live"), "c1:state", "submitting", "possible_duplicate_submits", "x"])];
    case(
        "begin_submit: duplicate counter",
        "begin_submit",
        resubmit,
        keys.clone(),
        args.clone(),
        Err("possible_duplicate_submits"),
    );
    case(
        "begin_submit: ledger type",
        "begin_submit",
        wrong(f.ledger("live"), "string"),
        keys.clone(),
        args.clone(),
        Err("holds a string"),
    );
    let missing = vec![f.ledger("ghost"), f.cancel("ghost")];
    case("begin_submit: no ledger", "begin_submit", vec![], missing, args.clone(), Ok("gone"));

    // cancel: KEYS ledger, cancel flag, schedule
    let keys = vec![f.ledger("live"), f.cancel("live"), k.schedule()];
    let args = strings(&["live", "60", "operator"]);
    case("cancel: ttl", "cancel", vec![], keys.clone(), with(&args, 1, Some("0")), Err("flag ttl"));
    case("cancel: ttl text", "cancel", vec![], keys.clone(), with(&args, 1, Some("soon")), Err("flag ttl"));
    case("cancel: no reason", "cancel", vec![], keys.clone(), with(&args, 2, None), Err("reason"));
    case("cancel: n_chunks", "cancel", hset("live", "n_chunks", "?"), keys.clone(), args.clone(), Err("n_chunks"));
    case(
        "cancel: huge n_chunks",
        "cancel",
        hset("live", "n_chunks", &over_chunks),
        keys.clone(),
        args.clone(),
        Err("more than"),
    );
    case(
        "cancel: ledger type",
        "cancel",
        wrong(f.ledger("live"), "string"),
        keys.clone(),
        args.clone(),
        Err("holds a string"),
    );
    case(
        "cancel: schedule type",
        "cancel",
        wrong(k.schedule(), "hash"),
        keys.clone(),
        args.clone(),
        Err("holds a hash"),
    );

    // dead_retry (a function): KEYS dead, submit
    let keys = vec![k.dead(), k.submit()];
    let args = strings(&["1-1", "{}"]);
    case("dead_retry: entry id", "dead_retry", vec![], keys.clone(), with(&args, 0, Some("1")), Err("entry id"));
    case("dead_retry: no job", "dead_retry", vec![], keys.clone(), with(&args, 1, None), Err("missing job"));
    case(
        "dead_retry: dead type",
        "dead_retry",
        wrong(k.dead(), "hash"),
        keys.clone(),
        args.clone(),
        Err("holds a hash"),
    );
    case(
        "dead_retry: submit type",
        "dead_retry",
        wrong(k.submit(), "list"),
        keys.clone(),
        args.clone(),
        Err("holds a list"),
    );

    // claim: KEYS schedule, a ledger and a cancel flag per candidate
    let keys = vec![k.schedule(), f.ledger("live"), f.cancel("live"), f.ledger("live"), f.cancel("live")];
    let args = strings(&["9999", "20000", "live#0", "0", "live#1", "1"]);
    let mut too_many = vec![k.schedule()];
    too_many.extend((0..=MAX_CLAIM).flat_map(|_| [f.ledger("live"), f.cancel("live")]));
    case("claim: now", "claim", vec![], keys.clone(), with(&args, 0, Some("+inf")), Err("now"));
    case("claim: lease", "claim", vec![], keys.clone(), with(&args, 1, Some("later")), Err("lease end"));
    case("claim: no candidate", "claim", vec![], vec![k.schedule()], with(&args, 2, None), Err("candidates"));
    case("claim: too many candidates", "claim", vec![], too_many, args.clone(), Err("candidates"));
    case("claim: a key short", "claim", vec![], keys[..4].to_vec(), args.clone(), Err("each candidate"));
    case(
        "claim: cancel flag type",
        "claim",
        wrong(f.cancel("live"), "hash"),
        keys.clone(),
        args.clone(),
        Err("holds a hash"),
    );
    case("claim: index", "claim", vec![], keys.clone(), with(&args, 5, Some("one")), Err("chunk index"));
    case("claim: claim", "claim", hset("live", "c1:claim", "x"), keys.clone(), args.clone(), Err("claim"));
    case(
        "claim: ledger type",
        "claim",
        wrong(f.ledger("live"), "string"),
        keys.clone(),
        args.clone(),
        Err("holds a string"),
    );
    case("claim: nothing due", "claim", vec![], keys.clone(), with(&args, 0, Some("8999")), Ok(""));
    case(
        "claim: schedule type",
        "claim",
        wrong(k.schedule(), "string"),
        keys.clone(),
        args.clone(),
        Err("holds a string"),
    );

    // publish: KEYS ledger, results, schedule, cancel flag, minute and hour counters
    let keys = vec![f.ledger("live"), k.results(), k.schedule(), f.cancel("live"), k.stats_minute(1), k.stats_hour(1)];
    let args = strings(&["completed", "5000", "100", "60", "live", "", "1", "v", "1", "1", "finished:completed", "1"]);
    case("publish: state", "publish", vec![], keys.clone(), with(&args, 0, Some("running")), Err("final state"));
    case("publish: now", "publish", vec![], keys.clone(), with(&args, 1, Some("-")), Err("now"));
    case("publish: maxlen", "publish", vec![], keys.clone(), with(&args, 2, Some("lots")), Err("results maxlen"));
    case("publish: ttl", "publish", vec![], keys.clone(), with(&args, 3, Some("0")), Err("ledger ttl"));
    case(
        "publish: pairs over the limit",
        "publish",
        vec![],
        keys.clone(),
        with(&args, 6, Some(&over_pairs)),
        Err("at most"),
    );
    case(
        "publish: pairs past the end",
        "publish",
        vec![],
        keys.clone(),
        with(&args, 6, Some("2")),
        Err("fewer arguments"),
    );
    case(
        "publish: no pairs",
        "publish",
        vec![],
        keys.clone(),
        strings(&["completed", "5000", "100", "60", "live", "", "0", "0"]),
        Err("needs fields"),
    );
    case("publish: counter amount", "publish", vec![], keys.clone(), with(&args, 11, Some("x")), Err("counter amount"));
    case(
        "publish: counters past the end",
        "publish",
        vec![],
        keys.clone(),
        with(&args, 9, Some("2")),
        Err("fewer arguments"),
    );
    let mut leftover = args.clone();
    leftover.push("extra".into());
    case("publish: arguments left over", "publish", vec![], keys.clone(), leftover, Err("left over"));
    case("publish: n_chunks", "publish", hset("live", "n_chunks", "x"), keys.clone(), args.clone(), Err("n_chunks"));
    case(
        "publish: huge n_chunks",
        "publish",
        hset("live", "n_chunks", &over_chunks),
        keys.clone(),
        args.clone(),
        Err("more than"),
    );
    case(
        "publish: ledger type",
        "publish",
        wrong(f.ledger("live"), "list"),
        keys.clone(),
        args.clone(),
        Err("holds a list"),
    );
    case(
        "publish: results type",
        "publish",
        wrong(k.results(), "string"),
        keys.clone(),
        args.clone(),
        Err("holds a string"),
    );
    case(
        "publish: schedule type",
        "publish",
        wrong(k.schedule(), "hash"),
        keys.clone(),
        args.clone(),
        Err("holds a hash"),
    );
    let missing =
        vec![f.ledger("ghost"), k.results(), k.schedule(), f.cancel("ghost"), k.stats_minute(1), k.remote_batches()];
    case("publish: no ledger", "publish", vec![], missing, args.clone(), Ok("0"));

    // roll_up: KEYS cursor, then per minute its counters and its hour's; the fixture's cursor is at minute 5
    let setup =
        vec![strings(&["SET", &k.stats_rolled(), "5"]), strings(&["HSET", &k.stats_minute(6), "finished:failed", "2"])];
    let with_setup = |extra: Vec<Vec<String>>| setup.iter().cloned().chain(extra).collect::<Vec<_>>();
    let keys = vec![k.stats_rolled(), k.stats_minute(6), k.stats_hour(0), k.stats_minute(7), k.stats_hour(0)];
    let args = strings(&["5", "6", "7"]);
    case("roll_up: a key short", "roll_up", setup.clone(), keys[..4].to_vec(), args.clone(), Err("each minute"));
    case("roll_up: a number short", "roll_up", setup.clone(), keys.clone(), with(&args, 2, None), Err("each minute"));
    case("roll_up: cursor moved", "roll_up", setup.clone(), keys.clone(), with(&args, 0, Some("4")), Ok("0"));
    case("roll_up: gap", "roll_up", setup.clone(), keys.clone(), with(&args, 2, Some("9")), Err("one by one"));
    case("roll_up: minute", "roll_up", setup.clone(), keys.clone(), with(&args, 1, Some("six")), Err("minute"));
    case(
        "roll_up: cursor",
        "roll_up",
        vec![strings(&["SET", &k.stats_rolled(), "x"])],
        keys.clone(),
        with(&args, 0, Some("x")),
        Err("cursor"),
    );
    case(
        "roll_up: cursor type",
        "roll_up",
        with_setup(vec![strings(&["DEL", &k.stats_rolled()]), strings(&["HSET", &k.stats_rolled(), "a", "1"])]),
        keys.clone(),
        args.clone(),
        Err("holds a hash"),
    );
    case(
        "roll_up: counter",
        "roll_up",
        with_setup(vec![strings(&["HSET", &k.stats_minute(7), "finished:completed", "many"])]),
        keys.clone(),
        args.clone(),
        Err("not an integer"),
    );
    case(
        "roll_up: minute type",
        "roll_up",
        with_setup(vec![strings(&["SET", &k.stats_minute(7), "x"])]),
        keys.clone(),
        args.clone(),
        Err("holds a string"),
    );
    case(
        "roll_up: hour type",
        "roll_up",
        with_setup(vec![strings(&["SET", &k.stats_hour(0), "x"])]),
        keys.clone(),
        args.clone(),
        Err("holds a string"),
    );

    // rate_limit: KEYS bucket
    let keys = vec![batchd_core::Keys::rate_limit("b")];
    let args = strings(&["20", "1"]);
    case("rate_limit: interval", "rate_limit", vec![], keys.clone(), with(&args, 0, Some("fast")), Err("interval"));
    case("rate_limit: zero interval", "rate_limit", vec![], keys.clone(), with(&args, 0, Some("0")), Err("interval"));
    case("rate_limit: nan", "rate_limit", vec![], keys.clone(), with(&args, 0, Some("nan")), Err("interval"));
    case("rate_limit: burst", "rate_limit", vec![], keys.clone(), with(&args, 1, Some("0")), Err("burst"));
    case(
        "rate_limit: bucket type",
        "rate_limit",
        wrong(batchd_core::Keys::rate_limit("b"), "hash"),
        keys.clone(),
        args.clone(),
        Err("holds a hash"),
    );

    // transition: KEYS ledger, schedule, remote batches
    let keys = vec![f.ledger("live"), k.schedule(), k.remote_batches()];
    let args = strings(&["mark_pending_poll", "live#0", "0", "0", "5000", "4000", "running"]);
    case("transition: unknown", "transition", vec![], keys.clone(), with(&args, 0, Some("done")), Err("unknown"));
    case("transition: arguments", "transition", vec![], keys.clone(), with(&args, 6, None), Err("takes 7"));
    case("transition: index", "transition", vec![], keys.clone(), with(&args, 2, Some("c0")), Err("chunk index"));
    case("transition: token", "transition", vec![], keys.clone(), with(&args, 3, Some("-1")), Err("claim token"));
    case("transition: due", "transition", vec![], keys.clone(), with(&args, 4, Some("later")), Err("due time"));
    case("transition: now", "transition", vec![], keys.clone(), with(&args, 5, Some("")), Err("now"));
    let retry = strings(&["mark_submit_retry", "live#1", "1", "0", "5000", "4000", "polling", "{}", "", ""]);
    case("transition: retried state", "transition", vec![], keys.clone(), retry.clone(), Err("retried"));
    case(
        "transition: attempts",
        "transition",
        vec![],
        keys.clone(),
        [&retry[..6], &strings(&["pending", "{}", "x", ""])].concat(),
        Err("attempts"),
    );
    case(
        "transition: looked",
        "transition",
        vec![],
        keys.clone(),
        [&retry[..6], &strings(&["pending", "{}", "", "1"])].concat(),
        Err("looked"),
    );
    let failed = strings(&["mark_poll_failed", "live#0", "0", "0", "5000", "4000", "many", "{}"]);
    case("transition: failures", "transition", vec![], keys.clone(), failed, Err("failures"));
    case(
        "transition: counter",
        "transition",
        hset("live", "c0:n_polls", "x"),
        keys.clone(),
        args.clone(),
        Err("n_polls"),
    );
    case("transition: claim", "transition", hset("live", "c0:claim", "1e3"), keys.clone(), args.clone(), Err("claim"));
    case(
        "transition: ledger type",
        "transition",
        wrong(f.ledger("live"), "string"),
        keys.clone(),
        args.clone(),
        Err("holds a string"),
    );
    case(
        "transition: schedule type",
        "transition",
        wrong(k.schedule(), "string"),
        keys.clone(),
        args.clone(),
        Err("holds a string"),
    );
    case("transition: stale", "transition", vec![], keys.clone(), with(&args, 3, Some("1")), Ok("stale"));
    let submitted = strings(&["mark_submitted", "live#0", "0", "0", "5000", "4000", "r-1", "queued", ""]);
    case("transition: not submitting", "transition", vec![], keys.clone(), submitted, Ok("refused"));
    let ghost = vec![f.ledger("ghost"), k.schedule()];
    case("transition: no ledger", "transition", vec![], ghost, with(&args, 1, Some("ghost#0")), Ok("gone"));

    // wake: KEYS ledger, schedule
    let keys = vec![f.ledger("live"), k.schedule()];
    let args = strings(&["live#0", "0", "5000", "1000"]);
    case("wake: now", "wake", vec![], keys.clone(), with(&args, 2, Some("now")), Err("now"));
    case("wake: gap", "wake", vec![], keys.clone(), with(&args, 3, Some("-1")), Err("wake gap"));
    case("wake: index", "wake", vec![], keys.clone(), with(&args, 1, Some("c0")), Err("chunk index"));
    case(
        "wake: ledger type",
        "wake",
        wrong(f.ledger("live"), "string"),
        keys.clone(),
        args.clone(),
        Err("holds a string"),
    );
    case("wake: schedule type", "wake", wrong(k.schedule(), "list"), keys.clone(), args.clone(), Err("holds a list"));
    case("wake: not due later", "wake", vec![], keys.clone(), with(&args, 2, Some("10000")), Ok("0"));

    // pack_form: KEYS packing queue, packers, pack ledger, members, packs, open packs, pack's cancel flag, then
    // each candidate's ledger; ARGV key, pack id, now, lease end, most items, most bytes, bytes per item, model,
    // endpoint, most inputs, then each candidate's member and chunk index
    let pack = "pack:00000000000000000000000000000001";
    let pack_id = JobId::parse(pack).expect("pack id");
    let packq = k.pack_queue("m|");
    let keys = vec![
        packq.clone(),
        k.packers(),
        f.ledger(pack),
        k.pack_members(&pack_id),
        k.packs(),
        k.open_packs(),
        f.cancel(pack),
        f.ledger("queued"),
    ];
    let args =
        strings(&["m|", pack, "1000", "7000", "100", "100000", "10", "@cf/baai/bge-m3", "", "", "queued#0", "0"]);
    let queued = vec![
        strings(&["ZADD", &packq, "1", "queued#0"]),
        strings(&["HSET", &f.ledger("queued"), "state", "accepted", "c0:state", "pending", "c0:pack", "queued"]),
        strings(&["HSET", &f.ledger("queued"), "c0:items", "x"]),
    ];
    case("pack_form: now", "pack_form", vec![], keys.clone(), with(&args, 2, Some("x")), Err("now"));
    case("pack_form: candidates", "pack_form", vec![], keys.clone(), with(&args, 11, None), Err("candidates"));
    case("pack_form: most inputs", "pack_form", vec![], keys.clone(), with(&args, 9, Some("x")), Err("most inputs"));
    case("pack_form: queue type", "pack_form", wrong(packq.clone(), "list"), keys.clone(), args.clone(), Err("list"));
    case(
        "pack_form: members type",
        "pack_form",
        wrong(keys[3].clone(), "string"),
        keys.clone(),
        args.clone(),
        Err("string"),
    );
    case("pack_form: items", "pack_form", queued, keys.clone(), args.clone(), Err("start:len"));
    case("pack_form: nothing queued", "pack_form", vec![], keys.clone(), args.clone(), Ok("empty"));

    // pack_deliver: KEYS pack ledger, schedule, then each member's ledger; ARGV pack id, now, request id, cursor,
    // then each member's member, chunk index, state, payload
    let keys = vec![f.ledger(pack), k.schedule(), f.ledger("live")];
    let args = strings(&[pack, "1000", "batch_1", "0", "live#1", "1", "done", "{}"]);
    let open_pack = vec![strings(&["HSET", &f.ledger(pack), "state", "running", "pack_delivered", "0"])];
    case("pack_deliver: members", "pack_deliver", vec![], keys.clone(), with(&args, 7, None), Err("members"));
    case("pack_deliver: now", "pack_deliver", vec![], keys.clone(), with(&args, 1, Some("x")), Err("now"));
    case(
        "pack_deliver: state",
        "pack_deliver",
        open_pack.clone(),
        keys.clone(),
        with(&args, 6, Some("pending")),
        Err("state"),
    );
    let mut broken = open_pack.clone();
    broken.extend(wrong(k.schedule(), "list"));
    case("pack_deliver: schedule type", "pack_deliver", broken, keys.clone(), args.clone(), Err("holds a list"));
    case("pack_deliver: no pack", "pack_deliver", vec![], keys.clone(), args.clone(), Ok("gone"));

    // pack_close: KEYS pack ledger, packs, members, remote batches; ARGV final state, now, ledger ttl, pack id
    let keys = vec![f.ledger(pack), k.packs(), k.pack_members(&pack_id), k.remote_batches()];
    let args = strings(&["completed", "1000", "60", pack]);
    case("pack_close: state", "pack_close", vec![], keys.clone(), with(&args, 0, Some("running")), Err("final state"));
    case("pack_close: ttl", "pack_close", vec![], keys.clone(), with(&args, 2, Some("0")), Err("ledger ttl"));
    let mut broken = open_pack.clone();
    broken.extend(wrong(k.packs(), "list"));
    case("pack_close: packs type", "pack_close", broken, keys.clone(), args.clone(), Err("holds a list"));
    case("pack_close: no pack", "pack_close", vec![], keys.clone(), args.clone(), Ok("0"));
    cases
}

fn reply_text(value: &redis::Value) -> String {
    match value {
        redis::Value::Int(n) => n.to_string(),
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        redis::Value::SimpleString(text) => text.clone(),
        redis::Value::Array(items) => items.first().map(reply_text).unwrap_or_default(),
        other => format!("{other:?}"),
    }
}

/// The functions of batchd's Redis Functions library whose error paths are driven here.
const FUNCTIONS: [&str; 2] = ["cancel", "dead_retry"];

#[tokio::test]
async fn every_script_error_path_leaves_the_namespace_untouched() {
    let redis = RedisServer::start().await;
    let mut conn = test_connection(&redis.url()).await;
    // The cases are built against one fixture's names; each runs on a fresh fixture with those names' shape.
    let mut scripts_seen = std::collections::BTreeSet::new();
    let n_cases = cases(&Fixture::new(&mut conn).await).len();
    for index in 0..n_cases {
        let fixture = Fixture::new(&mut conn).await;
        let case = cases(&fixture).swap_remove(index);
        for command in &case.setup {
            let refs: Vec<&str> = command.iter().map(String::as_str).collect();
            fixture.run(&mut conn, &refs).await;
        }
        let before = snapshot(&mut conn, &fixture.keys).await;
        // `cancel` and `dead_retry` are functions of batchd's library (called with FCALL), the others scripts.
        let reply: redis::RedisResult<redis::Value> = if FUNCTIONS.contains(&case.script) {
            let _: redis::Value = redis::cmd("FUNCTION")
                .arg("LOAD")
                .arg("REPLACE")
                .arg(batchd_queue::functions::library_text())
                .query_async(&mut conn)
                .await
                .expect("load batchd's functions");
            let name = format!("{}_{}", batchd_queue::functions::library_name(), case.script);
            redis::cmd("FCALL")
                .arg(name)
                .arg(case.keys.len())
                .arg(&case.keys)
                .arg(&case.args)
                .query_async(&mut conn)
                .await
        } else {
            let source = script_source(case.script).unwrap_or_else(|| panic!("no script {}", case.script));
            let script = redis::Script::new(&source);
            let mut invocation = script.prepare_invoke();
            for key in &case.keys {
                invocation.key(key);
            }
            for arg in &case.args {
                invocation.arg(arg);
            }
            invocation.invoke_async(&mut conn).await
        };
        match (&case.expect, &reply) {
            (Err(part), Err(error)) => {
                let message = error.to_string();
                assert!(message.contains("batchd: ") && message.contains(part), "{}: {message}", case.name);
            }
            (Ok(expected), Ok(value)) => assert_eq!(reply_text(value), *expected, "{}", case.name),
            _ => panic!("{}: expected {:?}, got {reply:?}", case.name, case.expect),
        }
        let after = snapshot(&mut conn, &fixture.keys).await;
        assert!(before == after, "{}: the script wrote before failing", case.name);
        scripts_seen.insert(case.script);
    }
    let all: std::collections::BTreeSet<&str> =
        batchd_queue::store::SCRIPT_NAMES.into_iter().chain(FUNCTIONS).collect();
    assert_eq!(scripts_seen, all, "every script has its error paths driven");
}

#[tokio::test]
async fn the_ledger_counts_unfinished_chunks_and_old_ledgers_are_counted_once() {
    let redis = RedisServer::start().await;
    let mut conn = test_connection(&redis.url()).await;
    let fixture = Fixture::new(&mut conn).await;
    let store = Store::new(
        batchd_queue::connect(redis::Client::open(redis.url()).expect("url"), std::time::Duration::from_secs(5))
            .expect("connect"),
        fixture.keys.clone(),
        StoreSettings::default(),
    );
    // Never claimed: token 0.
    let chunk = |job: &str, index: u32| Claim::new(ChunkRef::new(JobId::parse(job).expect("job id"), index), 0);
    let reader = conn.clone();
    let open = |job: &str| {
        let mut conn = reader.clone();
        let ledger = fixture.ledger(job);
        async move {
            let value: Option<String> =
                redis::cmd("HGET").arg(ledger).arg(OPEN_CHUNKS).query_async(&mut conn).await.expect("redis");
            value
        }
    };

    // A ledger written before the counter existed: three chunks, one of them done already.
    let old = fixture.ledger("old");
    let fields = [
        ("state", "running"),
        ("n_chunks", "3"),
        ("c0:state", "done"),
        ("c1:state", "polling"),
        ("c2:state", "polling"),
    ];
    let _: () = redis::cmd("HSET").arg(&old).arg(&fields[..]).query_async(&mut conn).await.expect("redis");
    assert_eq!(store.chunk_done(&chunk("old", 1), ChunkState::Done, "{}", 1).await.expect("store"), Some(1));
    assert_eq!(open("old").await.as_deref(), Some("1"), "counted once, then kept");
    // Finishing a chunk twice counts it once.
    assert_eq!(store.chunk_done(&chunk("old", 1), ChunkState::Done, "{}", 2).await.expect("store"), Some(1));
    assert_eq!(store.chunk_done(&chunk("old", 2), ChunkState::Failed, "{}", 3).await.expect("store"), Some(0));

    // The fixture's job has the counter; a split adds to it, and the last completion leaves the chunk leased.
    let piece = |start: usize| batchd_queue::NewChunk {
        placement: batchd_queue::Placement::Range { start, len: 1 },
        requests: vec![serde_json::value::RawValue::from_string("{}".into()).expect("json")],
    };
    fixture.run(&mut conn, &["HSET", &fixture.ledger("live"), "c1:state", "submitting"]).await;
    let added = store.add_chunks(&chunk("live", 1), 5, true, None, &[piece(1), piece(2)]).await.expect("store");
    assert_eq!(added, batchd_queue::AddOutcome::Added);
    assert_eq!(open("live").await.as_deref(), Some("3"));
    // The pieces are submitted (a step finishes a chunk only from submitting or polling).
    fixture.run(&mut conn, &["HSET", &fixture.ledger("live"), "c1:state", "polling", "c2:state", "polling"]).await;
    for (index, left) in [(0, 2), (2, 1), (1, 0)] {
        assert_eq!(
            store.chunk_done(&chunk("live", index), ChunkState::Done, "{}", 10).await.expect("store"),
            Some(left)
        );
    }
    let score: Option<f64> =
        redis::cmd("ZSCORE").arg(fixture.keys.schedule()).arg("live#1").query_async(&mut conn).await.expect("redis");
    assert!(score.is_some(), "the last chunk stays on the schedule, leased, until the job is published");
}

/// Publishing counts the job in the minute's counters in the same script: a counter hash gets its time to live
/// when it (or one of its fields) is new, not on every job; a counter key of another type is skipped and reported
/// (reply 2), never in the way of the result.
#[tokio::test]
async fn publish_counts_the_job_and_sets_a_counter_ttl_only_for_new_fields() {
    use batchd_core::keys::STATS_MINUTE_TTL_SECS;
    let redis = RedisServer::start().await;
    let mut conn = test_connection(&redis.url()).await;
    let f = Fixture::new(&mut conn).await;
    let k = &f.keys;
    let minute = k.stats_minute(7);
    let script = redis::Script::new(&script_source("publish").expect("publish"));
    let publish = async |conn: &mut MultiplexedConnection, job: &str, counts: &[(&str, &str)]| -> i64 {
        f.run(conn, &["HSET", &f.ledger(job), "state", "running", "n_chunks", "1"]).await;
        let mut call = script.prepare_invoke();
        for key in [f.ledger(job), k.results(), k.schedule(), f.cancel(job), minute.clone(), k.remote_batches()] {
            call.key(key);
        }
        call.arg("completed").arg("5000").arg("100").arg("60").arg(job).arg("").arg(1).arg("v").arg("1");
        call.arg(counts.len());
        for (name, n) in counts {
            call.arg(*name).arg(*n);
        }
        call.invoke_async(conn).await.expect("publish")
    };
    let ttl = async |conn: &mut MultiplexedConnection, key: &str| -> i64 {
        redis::cmd("TTL").arg(key).query_async(conn).await.expect("TTL")
    };
    let count = async |conn: &mut MultiplexedConnection, key: &str, field: &str| -> Option<u64> {
        redis::cmd("HGET").arg(key).arg(field).query_async(conn).await.expect("HGET")
    };

    let first = [("finished:completed", "1"), ("tokens:prompt:m", "5")];
    assert_eq!(publish(&mut conn, "a", &first).await, 1);
    assert_eq!(count(&mut conn, &minute, "tokens:prompt:m").await, Some(5));
    assert_eq!(count(&mut conn, &minute, "finished:completed").await, Some(1));
    assert!(ttl(&mut conn, &minute).await > STATS_MINUTE_TTL_SECS as i64 - 60);

    // Same fields again: counted, and the time to live is left alone.
    f.run(&mut conn, &["EXPIRE", &minute, "100"]).await;
    assert_eq!(publish(&mut conn, "b", &first).await, 1);
    assert_eq!(count(&mut conn, &minute, "finished:completed").await, Some(2));
    assert!(ttl(&mut conn, &minute).await <= 100);
    // A new field (another outcome) sets it again.
    assert_eq!(publish(&mut conn, "c", &[("finished:failed", "1")]).await, 1);
    assert!(ttl(&mut conn, &minute).await > 100);

    // A minute key of another type: the result is published, the foreign key untouched.
    f.run(&mut conn, &["DEL", &minute]).await;
    f.run(&mut conn, &["SET", &minute, "not a hash"]).await;
    assert_eq!(publish(&mut conn, "d", &first).await, 2);
    let state: String = redis::cmd("HGET").arg(f.ledger("d")).arg("state").query_async(&mut conn).await.expect("HGET");
    assert_eq!(state, "completed");
    let foreign: String = redis::cmd("GET").arg(&minute).query_async(&mut conn).await.expect("GET");
    assert_eq!(foreign, "not a hash");
    assert_eq!(ttl(&mut conn, &minute).await, -1);
}

/// Publishing records the result entry's size in the ledger beside its id, in bytes of the entry's field names and
/// values as Redis holds them (a character of several bytes counts its bytes), so a reader can decide before it reads
/// the entry (issue 38); a publish refused by a check records nothing.
#[tokio::test]
async fn publish_records_the_result_entrys_size_in_bytes() {
    let redis = RedisServer::start().await;
    let mut conn = test_connection(&redis.url()).await;
    let f = Fixture::new(&mut conn).await;
    let k = &f.keys;
    let script = redis::Script::new(&script_source("publish").expect("publish"));
    let publish = async |conn: &mut MultiplexedConnection, job: &str, fields: &[(&str, &str)], state: &str| {
        f.run(conn, &["HSET", &f.ledger(job), "state", "running", "n_chunks", "1"]).await;
        let mut call = script.prepare_invoke();
        for key in [f.ledger(job), k.results(), k.schedule(), f.cancel(job), k.stats_minute(7), k.remote_batches()] {
            call.key(key);
        }
        call.arg(state).arg("5000").arg("100").arg("60").arg(job).arg("").arg(fields.len());
        for (name, value) in fields {
            call.arg(*name).arg(*value);
        }
        call.arg(0);
        call.invoke_async::<i64>(conn).await
    };
    let hget = async |conn: &mut MultiplexedConnection, job: &str, name: &str| -> Option<String> {
        redis::cmd("HGET").arg(f.ledger(job)).arg(name).query_async(conn).await.expect("HGET")
    };

    let fields = [
        ("v", "1"),
        ("job_id", "caf\u{e9}-\u{65e5}\u{672c}"),
        ("result", "{\"responses\":[{\"text\":\"\u{1f600}\"}]}"),
    ];
    assert_eq!(publish(&mut conn, "a", &fields, "completed").await.expect("publish"), 1);
    let entry: String = hget(&mut conn, "a", "result_entry").await.expect("result_entry");
    let entries: Vec<(String, Vec<(String, String)>)> =
        redis::cmd("XRANGE").arg(k.results()).arg(&entry).arg(&entry).query_async(&mut conn).await.expect("XRANGE");
    let held: usize = entries[0].1.iter().map(|(name, value)| name.len() + value.len()).sum();
    let expected: usize = fields.iter().map(|(name, value)| name.len() + value.len()).sum();
    assert_eq!(held, expected);
    assert!(expected > fields.iter().map(|(name, value)| name.chars().count() + value.chars().count()).sum());
    assert_eq!(hget(&mut conn, "a", "result_bytes").await, Some(expected.to_string()));

    // Refused before any write: no entry, no size.
    let refused = publish(&mut conn, "b", &fields, "running").await;
    assert!(refused.is_err_and(|error| error.to_string().contains("final state")));
    assert_eq!(hget(&mut conn, "b", "result_bytes").await, None);
    assert_eq!(hget(&mut conn, "b", "state").await.as_deref(), Some("running"));
}

/// The hours' counters are the sums of their minutes', each minute added once after it is over, whoever calls.
#[tokio::test]
async fn finished_minutes_roll_up_into_their_hours_once() {
    let redis = RedisServer::start().await;
    let mut conn = test_connection(&redis.url()).await;
    let keys = Keys::new("rollup").expect("namespace");
    let open = || {
        let client = redis::Client::open(redis.url()).expect("url");
        let conn = batchd_queue::connect(client, std::time::Duration::from_secs(5)).expect("connect");
        Store::new(conn, keys.clone(), StoreSettings::default())
    };
    let store = open();
    let (seconds, _): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.expect("TIME");
    let current = seconds / 60;
    let now = seconds * 1000;

    // The first call only sets the cursor (what came before was counted into hours directly).
    assert_eq!(store.roll_up_counters(now).await.expect("roll up"), 0);
    let cursor: u64 = redis::cmd("GET").arg(keys.stats_rolled()).query_async(&mut conn).await.expect("GET");
    assert_eq!(cursor, current - 2);

    // Counters of three earlier minutes, of the minute before the current one and of the current one.
    let _: () = redis::cmd("SET").arg(keys.stats_rolled()).arg(current - 11).query_async(&mut conn).await.unwrap();
    for (minute, n) in [(current - 10, 1), (current - 9, 2), (current - 3, 4), (current - 1, 8), (current, 16)] {
        let _: () = redis::cmd("HSET")
            .arg(keys.stats_minute(minute))
            .arg("finished:completed")
            .arg(n)
            .arg("tokens:prompt:m")
            .arg(10 * n)
            .query_async(&mut conn)
            .await
            .expect("HSET");
    }
    let hour_sum = async |conn: &mut MultiplexedConnection, field: &str| -> u64 {
        let mut sum = 0;
        for hour in (current - 10) / 60..=current / 60 {
            let n: Option<u64> =
                redis::cmd("HGET").arg(keys.stats_hour(hour)).arg(field).query_async(conn).await.unwrap();
            sum += n.unwrap_or(0);
        }
        sum
    };
    // Minutes current-10 ..= current-2 are over by a minute; current-1 and current are not.
    assert_eq!(store.roll_up_counters(now).await.expect("roll up"), 9);
    assert_eq!(hour_sum(&mut conn, "finished:completed").await, 1 + 2 + 4);
    assert_eq!(hour_sum(&mut conn, "tokens:prompt:m").await, 70);
    // Minute current-3 was rolled up, so its hour exists (current / 60 may not: early in an hour, every rolled
    // minute lies in the hour before).
    let hour_ttl: i64 =
        redis::cmd("TTL").arg(keys.stats_hour((current - 3) / 60)).query_async(&mut conn).await.unwrap();
    assert!(hour_ttl > 0, "an hour's counters expire");
    // Again, and from a second store (another replica): nothing is added twice.
    let other = open();
    assert_eq!(store.roll_up_counters(now).await.expect("roll up"), 0);
    assert_eq!(other.roll_up_counters(now).await.expect("roll up"), 0);
    assert_eq!(hour_sum(&mut conn, "finished:completed").await, 7);
    let cursor: u64 = redis::cmd("GET").arg(keys.stats_rolled()).query_async(&mut conn).await.expect("GET");
    assert_eq!(cursor, current - 2);
}
