//! `batchd submit`: enqueue one job from a job JSON file, or build one from JSONL request items (`--model`), and
//! optionally follow it to its result (`--wait`), writing the responses as JSONL in request order (`--out`).
//!
//! The job is validated here with the daemon's own decoder before it is written, so a job the daemon would refuse
//! never reaches the stream, and the error names the file (and for JSONL, the line).

use std::collections::HashMap;
use std::io::{BufWriter, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use batchd_core::ledger::field;
use batchd_core::{ChunkState, Job, JobId, JobOutput, JobState, Keys, ResultEntry};
use batchd_producer::JobStatus;
use batchd_queue::{Conn, LedgerView};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::value::RawValue;

use super::{EXIT_ALL_ITEMS_FAILED, EXIT_JOB_FAILED, EXIT_USAGE, EXIT_WAIT_TIMEOUT, Exit, endpoint, open, result_json};
use crate::settings::Settings;

/// Chunks listed one by one in a progress line; more are summarised by state.
const MAX_CHUNKS_LISTED: usize = 8;

/// Options of `batchd submit`.
#[derive(Debug, Clone, clap::Args)]
pub struct SubmitArgs {
    /// Job JSON file; with --model, a JSONL file of request items, one per line. `-` reads standard input.
    #[arg(value_name = "FILE", default_value = "-")]
    pub file: PathBuf,
    /// Build one job for this model from FILE read as JSONL (one request item per line, blank lines skipped).
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,
    /// Job id (overrides the file's `id`; without either, the stream entry id is the job id).
    #[arg(long)]
    pub id: Option<String>,
    /// With --model: the job's metadata, a JSON object echoed back in the result.
    #[arg(long, value_name = "JSON", requires = "model")]
    pub metadata: Option<String>,
    /// With --model: the results stream the job publishes to, as the full key `{ns}:results:<suffix>` or just the
    /// suffix (default: `{ns}:results`).
    #[arg(long, value_name = "STREAM", requires = "model")]
    pub reply_to: Option<String>,
    /// With --model: the provider endpoint every item is a request body of (OpenAI: `/v1/embeddings`,
    /// `/v1/responses`, ...; default `/v1/chat/completions`, or the one endpoint an embeddings or moderation model
    /// serves), checked against openai.endpoints.
    #[arg(long, value_name = "PATH", requires = "model")]
    pub endpoint: Option<String>,
    /// Follow the job (a progress bar on a terminal, one line per change otherwise, on stderr) and print its
    /// result entry when it finishes.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up after this many seconds (the job goes on).
    #[arg(long, default_value_t = 3600, value_name = "SECS")]
    pub timeout: u64,
    /// With --wait: write the result's responses to this file as JSONL, one line per request item in request
    /// order; the result entry printed then leaves the responses out.
    #[arg(long, value_name = "OUT", requires = "wait")]
    pub out: Option<PathBuf>,
    /// Print the ids as JSON (`{"job_id":..,"entry_id":..}`) instead of the bare job id.
    #[arg(long)]
    pub json: bool,
}

/// `batchd submit`: validates a job locally, enqueues it with one XADD and prints its id; with `--wait`, follows it
/// and prints the result entry.
pub async fn submit(settings: &Settings, args: &SubmitArgs) -> anyhow::Result<()> {
    let keys = settings.keys();
    let limits = settings.job_limits();
    // --reply-to takes the full key or the suffix, as --stream does; the job holds the full key.
    let args = &SubmitArgs {
        reply_to: args
            .reply_to
            .as_deref()
            .map(|given| super::results_stream(&keys, "--reply-to", Some(given)))
            .transpose()?,
        ..args.clone()
    };
    // An OpenAI endpoint is checked against its instance's endpoints, and a model that serves one only gets it.
    let args = &match &args.model {
        Some(model) => match endpoint::check(model, args.endpoint.as_deref(), settings) {
            Ok(endpoint::Checked::Fine) => args.clone(),
            Ok(endpoint::Checked::Only(only)) => {
                eprintln!("batchd: note: model {model} serves {only} only; the job names it as its endpoint");
                SubmitArgs { endpoint: Some(only.to_owned()), ..args.clone() }
            }
            Err(reason) => return Err(Exit { code: EXIT_USAGE, message: format!("--endpoint: {reason}") }.into()),
        },
        None => args.clone(),
    };
    let input = read_input(&args.file)?;
    let name = display_name(&args.file);
    let (text, explicit_id) = match &args.model {
        Some(model) => (jsonl_job(&input, &name, model, args)?, args.id.is_some()),
        None => {
            let explicit = args.id.is_some() || has_id(&input);
            (input, explicit)
        }
    };
    if text.len() > limits.max_entry_bytes {
        bail!(
            "{name}: the job is {} bytes, the limit (jobs.max_entry_bytes) is {}",
            text.len(),
            limits.max_entry_bytes
        );
    }
    let mut job = Job::decode_json(&text, "0-0", &limits, &keys).map_err(|e| {
        let hint = if args.model.is_none() && looks_like_jsonl(&name, &text) {
            " (for JSONL request items, give --model)"
        } else {
            ""
        };
        anyhow!("{name}: {e}{hint}")
    })?;
    if args.model.is_none() {
        match endpoint::check(job.model.as_str(), job.endpoint.as_deref(), settings) {
            Ok(endpoint::Checked::Fine) => {}
            Ok(endpoint::Checked::Only(only)) => bail!(
                "{name}: model {} serves {only} only: give the job \"endpoint\": \"{only}\" (without it the job goes \
                 to /v1/chat/completions and every item fails)",
                job.model
            ),
            Err(reason) => bail!("{name}: {reason}"),
        }
    }
    let text = match (&args.id, &args.model) {
        (Some(id), None) => {
            job.id = JobId::parse(id).map_err(|e| anyhow!("--id: {e}"))?;
            job.to_json()
        }
        _ => text,
    };

    let mut conn = open(settings).await?;
    if explicit_id && let Some(existing) = LedgerView::read(&mut conn, &keys, &job.id).await.context("read ledger")? {
        bail!("{}", duplicate_message(&job.id, &existing));
    }
    if explicit_id
        && let Some(reason) =
            batchd_queue::inspect::cancel_request(&mut conn, &keys, &job.id).await.context("read cancel requests")?
    {
        eprintln!(
            "batchd: warning: a cancellation of job {} is pending (reason {:?}): the job is cancelled when it \
             arrives; `batchd uncancel {}` withdraws it",
            job.id,
            super::escape_for_terminal(&reason),
            job.id
        );
    }
    let entry_id = batchd_queue::inspect::enqueue(&mut conn, &keys, text.as_bytes()).await.context("enqueue job")?;
    let job_id = if explicit_id { job.id.clone() } else { JobId::parse(&entry_id).context("entry id")? };
    if args.json {
        println!("{}", super::json_text(&serde_json::json!({"job_id": job_id.as_str(), "entry_id": entry_id}), false)?);
    } else {
        println!("{job_id}");
    }
    if !args.wait {
        return Ok(());
    }
    let state = follow(&mut conn, &keys, &job_id, Duration::from_secs(args.timeout)).await?;
    let view = LedgerView::read(&mut conn, &keys, &job_id).await.context("read ledger")?;
    if let Some(refusal) = view.as_ref().and_then(refusal) {
        // Refused at take-in: its ledger holds the reason, and nothing ran.
        super::print_json(&serde_json::json!({"job_id": job_id.as_str(), "status": state.as_str(), "error": refusal}))?;
        let message = refusal.get("message").and_then(|message| message.as_str()).unwrap_or("no reason recorded");
        return Err(Exit {
            code: EXIT_JOB_FAILED,
            message: format!("job {job_id} was refused by the daemon before it ran: {message}"),
        }
        .into());
    }
    let fields = read_result(&mut conn, view.as_ref()).await?;
    let mut shown = result_json(&fields);
    if let Some(out) = &args.out {
        match fields.get("result") {
            Some(result) => {
                let n = write_responses(out, result)?;
                if let Some(result) = shown.get_mut("result").and_then(|r| r.as_object_mut()) {
                    result.remove("responses");
                }
                shown["out"] = serde_json::json!({"file": out.display().to_string(), "lines": n});
            }
            None => {
                eprintln!("batchd: job {job_id} has no responses (it ended {state}); {} not written", out.display())
            }
        }
    }
    super::print_json(&shown)?;
    if state != JobState::Completed {
        return Err(Exit { code: EXIT_JOB_FAILED, message: format!("job {job_id} ended {state}") }.into());
    }
    let count = |name: &str| fields.get(name).and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
    let (total, failed) = (count("items_total"), count("items_failed"));
    if total > 0 && failed == total {
        let message = format!(
            "job {job_id} completed, but all {total} of its request items failed (each response's `error` says why)"
        );
        return Err(Exit { code: EXIT_ALL_ITEMS_FAILED, message }.into());
    }
    Ok(())
}

fn display_name(file: &Path) -> String {
    if file == Path::new("-") { "<stdin>".to_owned() } else { file.display().to_string() }
}

fn read_input(file: &Path) -> anyhow::Result<String> {
    if file == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("cannot read standard input")?;
        return Ok(text);
    }
    std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))
}

/// Whether a job's JSON has an `id` (other fields are skipped, not built).
pub(crate) fn has_id(text: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct IdOnly {
        #[serde(default)]
        id: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_str::<IdOnly>(text).is_ok_and(|job| job.id.is_some())
}

/// Whether input refused as a job looks like JSONL (named so, or several lines that are not one JSON value).
fn looks_like_jsonl(name: &str, text: &str) -> bool {
    let several_lines = text.lines().filter(|line| !line.trim().is_empty()).count() > 1;
    name.ends_with(".jsonl") || (several_lines && serde_json::from_str::<&RawValue>(text).is_err())
}

/// The job built from JSONL request items: each non-blank line must be one JSON object, kept byte for byte.
fn jsonl_job(input: &str, name: &str, model: &str, args: &SubmitArgs) -> anyhow::Result<String> {
    let mut requests: Vec<&RawValue> = Vec::new();
    for (index, line) in input.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let item: &RawValue =
            serde_json::from_str(line).map_err(|e| anyhow!("{name}:{}: not valid JSON: {e}", index + 1))?;
        if !item.get().starts_with('{') {
            bail!("{name}:{}: a request item must be a JSON object, got {}", index + 1, json_kind(item.get()));
        }
        requests.push(item);
    }
    if requests.is_empty() {
        bail!("{name}: no request items (the JSONL input is empty)");
    }
    let metadata: Option<&RawValue> = args
        .metadata
        .as_deref()
        .map(|text| serde_json::from_str(text).map_err(|e| anyhow!("--metadata: not valid JSON: {e}")))
        .transpose()?;
    #[derive(serde::Serialize)]
    struct Built<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<&'a str>,
        model: &'a str,
        requests: Vec<&'a RawValue>,
        #[serde(skip_serializing_if = "Option::is_none")]
        reply_to: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        metadata: Option<&'a RawValue>,
        #[serde(skip_serializing_if = "Option::is_none")]
        endpoint: Option<&'a str>,
    }
    let job = Built {
        id: args.id.as_deref(),
        model,
        requests,
        reply_to: args.reply_to.as_deref(),
        metadata,
        endpoint: args.endpoint.as_deref(),
    };
    serde_json::to_string(&job).context("encode job")
}

fn json_kind(raw: &str) -> &'static str {
    match raw.as_bytes().first() {
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

/// Writes the responses of a `result` field as JSONL, one line per request item, ordered by item index.
fn write_responses(out: &Path, result: &str) -> anyhow::Result<usize> {
    let mut output: JobOutput = serde_json::from_str(result).context("the result entry's `result` is not valid")?;
    output.responses.sort_by_key(|response| response.index);
    let file = std::fs::File::create(out).with_context(|| format!("cannot write {}", out.display()))?;
    let mut writer = BufWriter::new(file);
    for response in &output.responses {
        serde_json::to_writer(&mut writer, response).context("encode response")?;
        writer.write_all(b"\n").with_context(|| format!("cannot write {}", out.display()))?;
    }
    writer.flush().with_context(|| format!("cannot write {}", out.display()))?;
    Ok(output.responses.len())
}

/// How progress is shown on stderr.
enum Progress {
    /// A terminal (without `NO_COLOR`): a live progress bar (items and chunks done, elapsed, ETA).
    Bar(ProgressBar),
    /// Not a terminal, or `NO_COLOR`: one plain line whenever it changes.
    Lines {
        /// The last line printed.
        last: String,
    },
}

impl Progress {
    fn new(job_id: &JobId) -> Self {
        // NO_COLOR turns the animated bar off too: plain lines, as off a terminal.
        if !std::io::stderr().is_terminal() || super::no_color() {
            return Self::Lines { last: String::new() };
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(spinner_style());
        bar.set_message(format!("{job_id}: waiting for the daemon to take the job in"));
        bar.enable_steady_tick(Duration::from_millis(120));
        Self::Bar(bar)
    }

    fn update(&mut self, job_id: &JobId, view: Option<&LedgerView>) {
        match self {
            Self::Lines { last } => {
                let line = super::escape_for_terminal(&progress_line(job_id, view)).into_owned();
                if line != *last {
                    eprintln!("{line}");
                    *last = line;
                }
            }
            Self::Bar(bar) => match view.and_then(JobStatus::from_view) {
                None => bar.set_message(format!("{job_id}: waiting for the daemon to take the job in")),
                Some(status) => {
                    let first = bar.length().is_none();
                    bar.set_length(status.n_items as u64);
                    bar.set_position(status.items_done() as u64);
                    if first {
                        bar.set_prefix(job_id.to_string());
                        bar.set_style(bar_style());
                    }
                    bar.set_message(format!(
                        "{}, chunks {}/{}",
                        status.state,
                        status.chunks_done(),
                        status.chunks.len()
                    ));
                }
            },
        }
    }

    fn finish(&self) {
        if let Self::Bar(bar) = self {
            bar.finish();
        }
    }
}

fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {msg}  {elapsed}").expect("valid template")
}

fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {prefix} [{bar:20}] {pos}/{len} items, {msg}, {elapsed} (ETA {eta})")
        .expect("valid template")
        .progress_chars("=> ")
}

/// Follows a job's ledger until it is terminal, showing progress on stderr.
async fn follow(conn: &mut Conn, keys: &Keys, job_id: &JobId, timeout: Duration) -> anyhow::Result<JobState> {
    let started = Instant::now();
    let mut progress = Progress::new(job_id);
    loop {
        let view = LedgerView::read(conn, keys, job_id).await.context("read ledger")?;
        progress.update(job_id, view.as_ref());
        let state = view.as_ref().and_then(LedgerView::state);
        if let Some(state) = state.filter(|state| state.is_terminal()) {
            progress.finish();
            return Ok(state);
        }
        if started.elapsed() >= timeout {
            progress.finish();
            return Err(Exit {
                code: EXIT_WAIT_TIMEOUT,
                message: format!(
                    "gave up waiting for job {job_id} after {}s; it goes on in the daemon",
                    timeout.as_secs()
                ),
            }
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `inv-42: running (chunk 0: running, 3 polls)` — the job state and each chunk's remote status; past
/// eight chunks, a count per state instead.
fn progress_line(job_id: &JobId, view: Option<&LedgerView>) -> String {
    let Some((view, state)) = view.and_then(|view| Some((view, view.get(field::STATE)?))) else {
        return format!("{job_id}: waiting for the daemon to take the job in");
    };
    let n_chunks = view.chunks.len();
    let shown: Vec<String> = view
        .chunks
        .iter()
        .map(|chunk| {
            let get = |name: &str| chunk.get(name).unwrap_or_default().to_owned();
            if chunk.state() == Some(ChunkState::Polling) {
                get(field::CHUNK_REMOTE_STATUS)
            } else {
                get(field::CHUNK_STATE)
            }
        })
        .collect();
    if shown.is_empty() || JobState::Completed.as_str() == state {
        return format!("{job_id}: {state}");
    }
    if shown.len() > MAX_CHUNKS_LISTED {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for chunk_state in shown {
            match counts.iter_mut().find(|(name, _)| *name == chunk_state) {
                Some((_, n)) => *n += 1,
                None => counts.push((chunk_state, 1)),
            }
        }
        let summary: Vec<String> = counts.iter().map(|(name, n)| format!("{n} {name}")).collect();
        return format!("{job_id}: {state} ({n_chunks} chunks: {})", summary.join(", "));
    }
    let chunks: Vec<String> =
        shown.iter().enumerate().map(|(index, chunk_state)| format!("chunk {index}: {chunk_state}")).collect();
    format!("{job_id}: {state} ({})", chunks.join(", "))
}

/// Why a job whose id already has a ledger is not enqueued again (the daemon would acknowledge the entry and run
/// nothing: one result per id), and what to do instead.
fn duplicate_message(job_id: &JobId, existing: &LedgerView) -> String {
    let state = existing.get(field::STATE).unwrap_or("being taken in");
    let what = format!("job {job_id} already exists ({state}); a job id runs once, so it was not enqueued again");
    match existing.state() {
        Some(state) if !state.is_terminal() => format!("{what}: `batchd status {job_id}` follows it"),
        Some(JobState::Completed) => format!("{what}: give the file a new id (--id) to run it again"),
        Some(_) if refusal(existing).is_some() => format!(
            "{what}: it was refused before it ran (`batchd status {job_id}` says why); after the fix, give it a new \
             id (--id) to run it"
        ),
        _ => format!(
            "{what}: `batchd retry {job_id}` runs it again as {}",
            super::retry::retry_id(job_id.as_str()).map_or_else(|| "a retry id".to_owned(), |id| id.to_string())
        ),
    }
}

/// The error of a job the daemon refused at take-in (a finished ledger with no chunks and no result entry: its
/// `failed` result went to the namespace's default results stream, and the ledger keeps the reason).
fn refusal(view: &LedgerView) -> Option<serde_json::Value> {
    let refused = view.get(field::N_CHUNKS) == Some("0") && view.get(field::RESULT_ENTRY).is_none();
    let error = view.get(field::ERROR).filter(|_| refused)?;
    Some(serde_json::from_str(error).unwrap_or_else(|_| serde_json::json!({"message": error})))
}

/// Reads the job's published result entry (its fields).
async fn read_result(conn: &mut Conn, view: Option<&LedgerView>) -> anyhow::Result<HashMap<String, String>> {
    let place = view.and_then(|view| Some((view.get(field::REPLY_TO)?, view.get(field::RESULT_ENTRY)?)));
    let Some((stream, entry_id)) = place else {
        bail!("the job finished but its ledger does not say where its result entry is");
    };
    let entries: batchd_queue::inspect::Entries<String> =
        batchd_queue::inspect::entries(conn, stream, entry_id, entry_id, 1, false).await.context("read result")?;
    let Some((_, fields)) = entries.into_iter().next() else {
        bail!("result entry {entry_id} is no longer in {stream} (trimmed by retention.results_maxlen)");
    };
    ResultEntry::from_fields(&fields).map_err(|e| anyhow!("{e}"))?;
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(header: &[(&'static str, &str)], chunks: &[&[(&'static str, &str)]]) -> LedgerView {
        let map = |pairs: &[(&'static str, &str)]| pairs.iter().map(|(k, v)| (*k, v.to_string())).collect();
        LedgerView {
            job_id: JobId::parse("inv-42").unwrap(),
            metadata_bytes: None,
            header: map(header),
            chunks: chunks
                .iter()
                .map(|pairs| batchd_queue::ledger_view::ChunkMetadata { fields: map(pairs) })
                .collect(),
        }
    }

    fn args(model: &str) -> SubmitArgs {
        SubmitArgs {
            file: "items.jsonl".into(),
            model: Some(model.into()),
            id: Some("j-1".into()),
            metadata: Some(r#"{"tenant":"acme"}"#.into()),
            reply_to: None,
            endpoint: None,
            wait: false,
            timeout: 1,
            out: None,
            json: false,
        }
    }

    #[test]
    fn progress_names_each_chunks_remote_status() {
        let id = JobId::parse("inv-42").unwrap();
        let running =
            view(&[("state", "running"), ("n_chunks", "1")], &[&[("state", "polling"), ("remote_status", "queued")]]);
        assert_eq!(progress_line(&id, Some(&running)), "inv-42: running (chunk 0: queued)");
        assert_eq!(progress_line(&id, None), "inv-42: waiting for the daemon to take the job in");
        let chunks: Vec<&[(&'static str, &str)]> = (0..10)
            .map(|index| if index < 3 { &[("state", "done")][..] } else { &[("state", "pending")][..] })
            .collect();
        let many = view(&[("state", "running"), ("n_chunks", "10")], &chunks);
        assert_eq!(progress_line(&id, Some(&many)), "inv-42: running (10 chunks: 3 done, 7 pending)");
    }

    #[test]
    fn jsonl_items_are_kept_byte_for_byte_and_bad_lines_are_named() {
        let job = jsonl_job(
            "{\"text\": \"a\"}\n\n{\"text\":\"b\" }\n",
            "items.jsonl",
            "@cf/baai/bge-m3",
            &args("@cf/baai/bge-m3"),
        )
        .unwrap();
        assert_eq!(
            job,
            r#"{"id":"j-1","model":"@cf/baai/bge-m3","requests":[{"text": "a"},{"text":"b" }],"metadata":{"tenant":"acme"}}"#
        );
        let error = jsonl_job("{\"text\":\"a\"}\n{\"text\":\n", "items.jsonl", "m", &args("m")).unwrap_err();
        assert_eq!(error.to_string(), "items.jsonl:2: not valid JSON: EOF while parsing a value at line 1 column 8");
        let error = jsonl_job("{}\n[1]\n", "items.jsonl", "m", &args("m")).unwrap_err();
        assert_eq!(error.to_string(), "items.jsonl:2: a request item must be a JSON object, got an array");
        let error = jsonl_job("\n\n", "items.jsonl", "m", &args("m")).unwrap_err();
        assert_eq!(error.to_string(), "items.jsonl: no request items (the JSONL input is empty)");
    }

    #[test]
    fn an_endpoint_goes_into_the_job_and_is_checked_as_the_job_contract_checks_it() {
        let keys = Keys::new("batchd").expect("namespace");
        let limits = batchd_core::JobLimits::default();
        let with =
            |endpoint: &str| SubmitArgs { endpoint: Some(endpoint.into()), ..args("openai/text-embedding-3-small") };
        let job =
            jsonl_job("{\"input\":\"a\"}\n", "items.jsonl", "openai/text-embedding-3-small", &with("/v1/embeddings"))
                .unwrap();
        assert!(job.ends_with(r#""endpoint":"/v1/embeddings"}"#), "{job}");
        let decoded = Job::decode_json(&job, "0-0", &limits, &keys).expect("a valid job");
        assert_eq!(decoded.endpoint.as_deref(), Some("/v1/embeddings"));
        let bad = jsonl_job("{}\n", "items.jsonl", "openai/m", &with("v1/../x?")).unwrap();
        let error = Job::decode_json(&bad, "0-0", &limits, &keys).unwrap_err();
        assert!(error.to_string().contains("invalid `endpoint`"), "{error}");
    }

    #[test]
    fn an_explicit_id_is_recognised_without_building_the_job() {
        assert!(has_id(r#"{"id":"a","requests":[{"x":[1,2,3]}]}"#));
        assert!(!has_id(r#"{"id":null,"model":"m"}"#));
        assert!(!has_id(r#"{"model":"m"}"#));
    }
}
