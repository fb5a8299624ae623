//! Scenario 8's hostile entries: the entries of `tests/it/{hostile,bad_input,dead_letters,memory}.rs` (and three
//! more: nesting deeper than any parser should follow, closed and cut off, and bytes that are not UTF-8), built to be mixed into a
//! stream of good jobs, with what each must get: a `failed` result with a given error code, and for entries that
//! are not jobs at all a copy in `{ns}:dead`.

use std::collections::{BTreeMap, HashMap};

use batchd_core::{JobId, Keys, ResultEntry, ResultStatus};
use redis::aio::ConnectionManager;

use super::Size;
use super::check::Outcome;

/// The jobs' model in the hostile entries that get that far.
const MODEL: &str = "@cf/baai/bge-m3";

/// One hostile entry and what it must get.
#[derive(Debug, Clone)]
pub struct Hostile {
    /// Its kind, e.g. `not-json` (the row of the table in `docs/reliability.md`).
    pub kind: &'static str,
    /// The entry's fields, as sent.
    pub fields: Vec<(String, Vec<u8>)>,
    /// The job id its result carries: the job's own, or `None` when the daemon cannot know it (the entry id).
    pub job_id: Option<String>,
    /// A key set to a string before the entry is sent: the job's ledger key, so that taking it in fails every
    /// time (and the entry is dead-lettered after `ingress.max_deliveries`).
    pub poison_key: Option<String>,
    /// The error code of its `failed` result.
    pub code: &'static str,
    /// Whether it must also be copied to `{ns}:dead`.
    pub dead: bool,
}

impl Hostile {
    /// Size of the entry in bytes (field names and values).
    pub fn bytes(&self) -> usize {
        self.fields.iter().map(|(name, value)| name.len() + value.len()).sum()
    }
}

/// `{"id":<id>,"model":"@cf/baai/bge-m3","requests":[{},{},...]}` with `n_items` empty items, built with one
/// repeat instead of an item at a time (tests/it/hostile.rs, tests/it/memory.rs).
pub fn empty_items_job(id: &str, n_items: usize) -> Vec<u8> {
    let mut job = format!(r#"{{"id":"{id}","model":"{MODEL}","requests":["#).into_bytes();
    job.extend_from_slice(&b"{},".repeat(n_items.saturating_sub(1)));
    job.extend_from_slice(b"{}]}");
    job
}

/// A job whose `requests` are arrays nested 1,000,000 deep (`[[[[...]]]]`, closed or cut off): a parser that
/// follows nesting without a limit overflows its stack.
fn nested_job(id: &str, closed: bool) -> Vec<u8> {
    let depth = 1_000_000;
    let mut job = format!(r#"{{"id":"{id}","model":"{MODEL}","requests":"#).into_bytes();
    job.extend_from_slice(&b"[".repeat(depth));
    if closed {
        job.extend_from_slice(&b"]".repeat(depth));
        job.push(b'}');
    }
    job
}

/// A job's JSON from `json!`, as the `job` field.
fn job_field(value: serde_json::Value) -> Vec<(String, Vec<u8>)> {
    vec![("job".to_owned(), value.to_string().into_bytes())]
}

/// The hostile entries of one round (`round` makes their job ids unique). `max_entry_bytes` is the daemons'
/// `jobs.max_entry_bytes`: the oversize entry is just over it in a short run, 90 MB in a full one; the entry with
/// too many items is just under it.
pub fn catalogue(round: usize, size: Size, max_entry_bytes: usize, keys: &Keys) -> Vec<Hostile> {
    let id = |kind: &str| format!("hostile-{kind}-r{round}");
    let entry = |kind, fields, code, dead| Hostile { kind, fields, job_id: None, poison_key: None, code, dead };
    let job = |kind, value: serde_json::Value| Hostile {
        kind,
        fields: job_field(value),
        job_id: Some(id(kind)),
        poison_key: None,
        code: "invalid_job",
        dead: false,
    };
    let text = |kind: &str, value: &str| vec![(kind.to_owned(), value.as_bytes().to_vec())];
    // Items that fill the entry to just under the limit, each an empty object (3 bytes with its comma).
    let over_max_items = (max_entry_bytes - 100) / 3;
    let oversize_items = size.pick(30_000_000, max_entry_bytes / 3 + 1000);
    let poison_id = id("poison");
    let poison_key = keys.job(&JobId::parse(&poison_id).expect("a valid job id"));
    vec![
        entry("not-json", text("job", "this is not json"), "invalid_entry", true),
        entry("json-array", text("job", "[1,2,3]"), "invalid_entry", true),
        entry("not-utf8", vec![("job".to_owned(), b"{\"id\":\"\xff\xfe\"}".to_vec())], "invalid_entry", true),
        entry(
            "5000-fields-no-job",
            (0..5_000).map(|i| (format!("f{i}"), b"v".to_vec())).collect(),
            "invalid_entry",
            true,
        ),
        entry("1-mb-not-a-job", text("job", &"x".repeat(1_000_000)), "invalid_entry", true),
        entry(
            "nested-1m-deep-unclosed",
            vec![("job".to_owned(), nested_job(&id("nested-unclosed"), false))],
            "invalid_entry",
            true,
        ),
        Hostile {
            kind: "nested-1m-deep",
            fields: vec![("job".to_owned(), nested_job(&id("nested"), true))],
            job_id: Some(id("nested")),
            poison_key: None,
            code: "invalid_job",
            dead: false,
        },
        entry(
            "oversize",
            vec![("job".to_owned(), empty_items_job(&id("oversize"), oversize_items))],
            "invalid_entry",
            true,
        ),
        Hostile {
            kind: "too-many-items",
            fields: vec![("job".to_owned(), empty_items_job(&id("too-many-items"), over_max_items))],
            job_id: Some(id("too-many-items")),
            poison_key: None,
            code: "invalid_job",
            dead: false,
        },
        job(
            "unknown-field",
            serde_json::json!({"id": id("unknown-field"), "modle": MODEL, "model": MODEL, "requests": [{}]}),
        ),
        job(
            "foreign-reply-to",
            serde_json::json!({"id": id("foreign-reply-to"), "model": MODEL, "requests": [{}], "reply_to": "billing:events"}),
        ),
        job("no-model", serde_json::json!({"id": id("no-model"), "requests": [{"text": "x"}]})),
        job("empty-requests", serde_json::json!({"id": id("empty-requests"), "model": MODEL, "requests": []})),
        job(
            "model-path-escape",
            serde_json::json!({"id": id("model-path-escape"), "model": "@cf/../../accounts/x", "requests": [{"text": "x"}]}),
        ),
        Hostile {
            job_id: None,
            ..job("bad-id", serde_json::json!({"id": format!("bad id! {round}"), "model": MODEL, "requests": [{}]}))
        },
        Hostile {
            kind: "take-in-fails-always",
            fields: job_field(serde_json::json!({"id": poison_id, "model": MODEL, "requests": [{}]})),
            job_id: None,
            poison_key: Some(poison_key),
            code: "invalid_entry",
            dead: true,
        },
    ]
}

/// A hostile entry as sent: its entry id and the job id its result must carry.
#[derive(Debug, Clone)]
pub struct Sent {
    /// What was sent.
    pub hostile: Hostile,
    /// Its entry id in `{ns}:submit`.
    pub entry_id: String,
    /// Unix ms of the `XADD`.
    pub at_ms: u64,
}

impl Sent {
    /// The job id of its result.
    pub fn job_id(&self) -> &str {
        self.hostile.job_id.as_deref().unwrap_or(&self.entry_id)
    }
}

/// Sends the entries (after setting their poison keys), one `XADD` each.
pub async fn send(conn: &mut ConnectionManager, keys: &Keys, entries: Vec<Hostile>) -> redis::RedisResult<Vec<Sent>> {
    let mut sent = Vec::new();
    for hostile in entries {
        if let Some(key) = &hostile.poison_key {
            let () = redis::cmd("SET").arg(key).arg("not a ledger").query_async(conn).await?;
        }
        let mut xadd = redis::cmd("XADD");
        xadd.arg(keys.submit()).arg("*");
        for (name, value) in &hostile.fields {
            xadd.arg(name.as_bytes()).arg(value.as_slice());
        }
        let entry_id: String = xadd.query_async(conn).await?;
        sent.push(Sent { hostile, entry_id, at_ms: super::unix_ms() });
    }
    Ok(sent)
}

/// What one kind of hostile entry got, over every entry of that kind.
#[derive(Debug, Clone, Default)]
pub struct Got {
    /// Entries sent.
    pub sent: usize,
    /// Size of the largest, in bytes.
    pub bytes: usize,
    /// Result statuses and error codes seen, e.g. `failed invalid_entry` → 3.
    pub results: BTreeMap<String, usize>,
    /// One result's error message (the first entry's), cut to 160 characters.
    pub message: String,
    /// Entries copied to `{ns}:dead`.
    pub dead: usize,
    /// One dead-letter copy's `error` field, cut to 160 characters.
    pub dead_error: String,
    /// Whether a dead-letter copy was cut (`truncated` = 1).
    pub dead_truncated: bool,
}

fn cut(text: &str) -> String {
    let mut cut: String = text.chars().take(160).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    cut
}

/// Reads every result and dead-letter entry and checks each sent hostile entry: exactly one result, `failed`
/// with its code, and a dead-letter copy where one is expected (none where not). Returns what each kind got.
pub async fn judge(
    conn: &mut ConnectionManager,
    keys: &Keys,
    sent: &[Sent],
    outcome: &mut Outcome,
) -> redis::RedisResult<BTreeMap<&'static str, Got>> {
    let results: Vec<(String, HashMap<String, String>)> =
        redis::cmd("XRANGE").arg(keys.results()).arg("-").arg("+").query_async(conn).await?;
    let mut by_job: HashMap<String, Vec<HashMap<String, String>>> = HashMap::new();
    for (_, fields) in results {
        by_job.entry(fields.get("job_id").cloned().unwrap_or_default()).or_default().push(fields);
    }
    let dead: Vec<(String, HashMap<String, Vec<u8>>)> =
        redis::cmd("XRANGE").arg(keys.dead()).arg("-").arg("+").query_async(conn).await?;
    let mut dead_by_source: HashMap<String, Vec<HashMap<String, Vec<u8>>>> = HashMap::new();
    for (_, fields) in dead {
        let source = fields.get("source_id").map(|id| String::from_utf8_lossy(id).into_owned()).unwrap_or_default();
        dead_by_source.entry(source).or_default().push(fields);
    }
    let text = |fields: &HashMap<String, Vec<u8>>, name: &str| {
        fields.get(name).map(|value| String::from_utf8_lossy(value).into_owned()).unwrap_or_default()
    };

    let mut got: BTreeMap<&'static str, Got> = BTreeMap::new();
    for one in sent {
        let hostile = &one.hostile;
        let kind = got.entry(hostile.kind).or_default();
        kind.sent += 1;
        kind.bytes = kind.bytes.max(hostile.bytes());
        let entries = by_job.get(one.job_id()).map(Vec::as_slice).unwrap_or_default();
        outcome.expect(entries.len() == 1, || {
            format!(
                "hostile {} (entry {}, job {}): {} result entries",
                hostile.kind,
                one.entry_id,
                one.job_id(),
                entries.len()
            )
        });
        for fields in entries {
            match ResultEntry::from_fields(fields) {
                Ok(result) => {
                    let code = result.error.as_ref().map_or("-", |error| error.code.as_str());
                    *kind.results.entry(format!("{} {code}", result.status.as_str())).or_default() += 1;
                    if kind.message.is_empty() {
                        kind.message = cut(result.error.as_ref().map_or("", |error| error.message.as_str()));
                    }
                    outcome.expect(result.status == ResultStatus::Failed && code == hostile.code, || {
                        format!(
                            "hostile {} (job {}): result {} {code}, expected failed {}",
                            hostile.kind,
                            one.job_id(),
                            result.status.as_str(),
                            hostile.code
                        )
                    });
                }
                Err(error) => outcome.failures.push(format!("hostile {}: malformed result: {error}", hostile.kind)),
            }
        }
        let copies = dead_by_source.get(&one.entry_id).map(Vec::as_slice).unwrap_or_default();
        kind.dead += copies.len();
        if let Some(copy) = copies.first() {
            if kind.dead_error.is_empty() {
                kind.dead_error = cut(&text(copy, "error"));
            }
            kind.dead_truncated |= text(copy, "truncated") == "1";
        }
        let expected = usize::from(hostile.dead);
        outcome.expect(copies.len() == expected, || {
            format!(
                "hostile {} (entry {}): {} dead-letter copies, expected {expected}",
                hostile.kind,
                one.entry_id,
                copies.len()
            )
        });
    }
    Ok(got)
}
