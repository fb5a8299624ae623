//! Running a finished job again (the dashboard's **Retry**; `batchd retry` does the same steps): a job that ended
//! `failed`, `expired` or `cancelled` is rebuilt from what its ledger still holds and enqueued as a new job under a
//! derived id (the caller's; `batchd retry` derives `<id>.retry-<n>`), because a job id is its identity while its
//! ledger lives and an entry repeating it is never run.
//!
//! Two depths, both bounded: [`check`] answers from two small round trips and reads no payload (for a dry run a
//! read-only page may trigger); [`prepare`] checks, then reads the ledger's view, its metadata when the view left
//! it out, and each chunk's stored request items one chunk per command, puts the items back in request order
//! ([`rebuild_job`]) and validates the result with the daemon's own rules, so what is enqueued is what the daemon
//! would accept.

use batchd_core::ledger::field;
use batchd_core::{Job, JobId, JobLimits, JobState, Keys};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::failed::FAILED_STATES;
use crate::ledger_view::{chunk_requests, job_metadata, rerun_check};
use crate::{Conn, LedgerView, StoreError};

/// Whether (and how) a finished job can run again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rerun {
    /// [`prepare`]: its retry, as job JSON accepted by the daemon's rules; enqueue it.
    Ready(String),
    /// [`check`]: its ledger holds what a retry needs (the rebuild itself is [`prepare`]'s).
    Possible,
    /// Its retry's id already has a ledger: it was retried before.
    AlreadyRetried,
    /// It cannot run again, and why (for people).
    NotRetryable(String),
}

/// Whether job `job_id` can run again as `retry_id`, from two small round trips that read no payload: its state
/// (one that ended without completing), its ledger and first chunk's stored items still there, and no ledger for
/// `retry_id` yet.
pub async fn check(conn: &mut Conn, keys: &Keys, job_id: &JobId, retry_id: &JobId) -> Result<Rerun, StoreError> {
    let state: Option<String> = redis::cmd("HGET").arg(keys.job(job_id)).arg(field::STATE).query_async(conn).await?;
    let Some(state) = state else {
        return Ok(Rerun::NotRetryable(
            "it has no ledger (never taken in, or its ledger expired: retention.ledger_ttl_secs)".to_owned(),
        ));
    };
    if !state.parse::<JobState>().is_ok_and(|state| FAILED_STATES.contains(&state)) {
        return Ok(Rerun::NotRetryable(format!(
            "it is {state}; only a job that ended failed, expired or cancelled is retried"
        )));
    }
    let found = rerun_check(conn, keys, job_id, retry_id).await?;
    Ok(if found.retry_exists {
        Rerun::AlreadyRetried
    } else if !found.exists {
        Rerun::NotRetryable("its ledger expired (retention.ledger_ttl_secs), and its request items with it".to_owned())
    } else if found.n_chunks == 0 {
        Rerun::NotRetryable(
            "it was refused before it ran (nothing of it was stored); fix it and enqueue it again".to_owned(),
        )
    } else if !found.has_requests {
        Rerun::NotRetryable(GONE.to_owned())
    } else {
        Rerun::Possible
    })
}

/// Why a job whose items are gone cannot run again.
const GONE: &str = "its request items are no longer stored (a finished job's ledger keeps only its timeline)";

/// [`check`], then the retry of `job_id` as job JSON with id `retry_id`, validated with the daemon's rules
/// (`limits`): [`Rerun::Ready`] to enqueue, or why not.
pub async fn prepare(
    conn: &mut Conn,
    keys: &Keys,
    limits: &JobLimits,
    job_id: &JobId,
    retry_id: &JobId,
) -> Result<Rerun, StoreError> {
    let checked = check(conn, keys, job_id, retry_id).await?;
    if checked != Rerun::Possible {
        return Ok(checked);
    }
    let Some(mut view) = LedgerView::read(conn, keys, job_id).await? else {
        return Ok(Rerun::NotRetryable("its ledger expired meanwhile".to_owned()));
    };
    if view.metadata_bytes.is_some() {
        // A view leaves a large metadata out; the retry carries it over whole.
        let metadata = job_metadata(conn, keys, job_id).await?;
        view.header.extend(metadata.map(|metadata| (field::METADATA, metadata)));
    }
    // The items, one chunk per command: Redis never holds more than one chunk's for this reader.
    let mut requests = Vec::with_capacity(view.chunks.len());
    for index in 0..view.chunks.len() as u32 {
        requests.push(chunk_requests(conn, keys, job_id, index).await?);
    }
    let text = match rebuild_job(&view, &requests, retry_id, keys) {
        Ok(text) => text,
        Err(reason) => return Ok(Rerun::NotRetryable(reason)),
    };
    Ok(match Job::decode_json(&text, "0-0", limits, keys) {
        Ok(_) => Rerun::Ready(text),
        Err(error) => Rerun::NotRetryable(format!("its retry would be refused: {error}")),
    })
}

/// The body of a retry of the job whose ledger is `view`, as job JSON with id `id`: every request item in request
/// order, rebuilt from the chunks' stored items (`requests[i]`, read one chunk at a time) and their placements (a
/// run of items, `start:len`, or the items listed in `indices`); the first chunk holding an item gives it. Model,
/// metadata, `reply_to` (unless the namespace's default stream), deadline length and `retry_failed_items` carry
/// over.
pub fn rebuild_job(view: &LedgerView, requests: &[Option<String>], id: &JobId, keys: &Keys) -> Result<String, String> {
    let get = |name: &str| view.get(name);
    let number = |name: &str| view.number(name);
    let model = get(field::MODEL).ok_or("its ledger has no model")?;
    let n_items = number(field::N_ITEMS).ok_or("its ledger has no item count")? as usize;
    if view.chunks.is_empty() || n_items == 0 {
        return Err("it was refused before it ran (nothing of it was stored); fix it and enqueue it again".into());
    }
    let mut items: Vec<Option<Box<RawValue>>> = (0..n_items).map(|_| None).collect();
    for (chunk, metadata) in view.chunks.iter().enumerate() {
        let stored = requests.get(chunk).and_then(Option::as_deref).ok_or(GONE)?;
        let stored: Vec<Box<RawValue>> =
            serde_json::from_str(stored).map_err(|_| format!("chunk {chunk}'s stored requests are not valid"))?;
        let placement =
            metadata.placement().ok_or_else(|| format!("chunk {chunk} does not say which items it holds"))?;
        if placement.len() != stored.len() {
            return Err(format!("chunk {chunk} holds {} requests for {} items", stored.len(), placement.len()));
        }
        for (local, request) in stored.into_iter().enumerate() {
            let index = placement.job_index(local).unwrap_or(usize::MAX);
            match items.get_mut(index) {
                Some(slot @ None) => *slot = Some(request),
                Some(Some(_)) => {}
                None => return Err(format!("chunk {chunk} names item {index}, past the job's {n_items} items")),
            }
        }
    }
    let requests: Vec<Box<RawValue>> = items.into_iter().collect::<Option<_>>().ok_or(GONE)?;
    let metadata: Option<Box<RawValue>> = get(field::METADATA)
        .map(|text| serde_json::from_str(text).map_err(|_| "its stored metadata is not valid JSON".to_owned()))
        .transpose()?;
    let deadline_secs = match (number(field::DEADLINE_AT), number(field::ACCEPTED_AT)) {
        (Some(deadline), Some(accepted)) if deadline > accepted => Some((deadline - accepted).div_ceil(1000)),
        _ => None,
    };
    /// The retry as the job format has it.
    #[derive(Serialize)]
    struct Retry<'a> {
        id: &'a str,
        model: &'a str,
        requests: Vec<Box<RawValue>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        reply_to: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        metadata: Option<Box<RawValue>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        deadline_secs: Option<u64>,
        retry_failed_items: bool,
    }
    let results = keys.results();
    let job = Retry {
        id: id.as_str(),
        model,
        requests,
        reply_to: get(field::REPLY_TO).filter(|stream| *stream != results),
        metadata,
        deadline_secs,
        retry_failed_items: get(field::RETRY_FAILED_ITEMS) == Some("1"),
    };
    serde_json::to_string(&job).map_err(|e| format!("encode the retry: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger_view::ChunkMetadata;

    fn view(header: &[(&'static str, &str)], chunks: &[&[(&'static str, &str)]]) -> LedgerView {
        let fields = |pairs: &[(&'static str, &str)]| pairs.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        LedgerView {
            job_id: JobId::parse("inv-1").unwrap_or_else(|e| panic!("{e}")),
            header: fields(header),
            metadata_bytes: None,
            chunks: chunks.iter().map(|chunk| ChunkMetadata { fields: fields(chunk) }).collect(),
        }
    }

    #[test]
    fn a_retry_is_rebuilt_in_request_order_from_its_chunks() {
        let keys = Keys::new("batchd").unwrap_or_else(|e| panic!("{e}"));
        let header = [("model", "@cf/m"), ("n_items", "3"), ("accepted_at", "1000"), ("deadline_at", "61000")];
        // Chunk 0 holds item 1; chunk 1, split off later, holds items 2 and 0 (listed by index).
        let ledger = view(&header, &[&[("items", "1:1")], &[("items", "0:2"), ("indices", "[2,0]")]]);
        let requests = [Some(r#"[{"t":"b"}]"#.to_owned()), Some(r#"[{"t":"c"},{"t":"a"}]"#.to_owned())];
        let retry = JobId::parse("inv-1.retry-1").unwrap_or_else(|e| panic!("{e}"));
        let job = rebuild_job(&ledger, &requests, &retry, &keys).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            job,
            r#"{"id":"inv-1.retry-1","model":"@cf/m","requests":[{"t":"a"},{"t":"b"},{"t":"c"}],"deadline_secs":60,"retry_failed_items":false}"#
        );
        let gone = rebuild_job(&ledger, &[requests[0].clone(), None], &retry, &keys).unwrap_err();
        assert!(gone.contains("no longer stored"), "{gone}");
        let short = [Some(r#"[{"t":"b"}]"#.to_owned()), Some(r#"[{"t":"c"}]"#.to_owned())];
        assert_eq!(rebuild_job(&ledger, &short, &retry, &keys).unwrap_err(), "chunk 1 holds 1 requests for 2 items");
    }
}
