//! A results reader that does not lose results: a consumer group on a results stream, read with `XREADGROUP` and
//! acknowledged with `XACK`.
//!
//! Delivery is at least once. On start (and after a read was cancelled) the reader first re-reads its own pending
//! entries (`XREADGROUP ... 0`): what it read but did not acknowledge before it stopped. It also claims entries that
//! another consumer of the group left unacknowledged for `claim_min_idle` (`XAUTOCLAIM`), so a consumer that died for
//! good loses nothing either. Both kinds come back with [`Delivery::redelivered`] set; an entry that was acknowledged
//! is never delivered again. Each job has one result entry, so a handler that is not idempotent dedupes on `job_id`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use batchd_core::result::MalformedResult;
use batchd_core::{Keys, ResultEntry};
use batchd_queue::results::{self, GroupRead};
use batchd_queue::{Conn, Endpoint};

use crate::error::ProducerError;
use crate::reply::{self, RawEntry};

/// Where a consumer group that does not exist yet starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupStart {
    /// At the start of the stream: every result still kept is delivered (`XGROUP CREATE ... 0`).
    #[default]
    Beginning,
    /// At the end: only results published after the group was created (`XGROUP CREATE ... $`).
    End,
}

/// Options of a [`ResultReader`].
#[derive(Debug, Clone)]
pub struct ReaderOptions {
    /// The results stream: `None` for the namespace's `{ns}:results`, or a `reply_to` stream `{ns}:results:<suffix>`.
    pub stream: Option<String>,
    /// The consumer group; every group gets every result once (one group per consuming application).
    pub group: String,
    /// This reader's name in the group. Keep it stable across restarts (e.g. the pod or host name), so a restarted
    /// reader resumes its own pending entries at once instead of waiting `claim_min_idle`.
    pub consumer: String,
    /// Most entries returned by one [`ResultReader::next_batch`].
    pub count: usize,
    /// How long one read waits for new entries before returning an empty batch.
    pub block: Duration,
    /// An entry another consumer has held unacknowledged this long is claimed by this one. Make it longer than your
    /// handler ever takes, or live consumers lose entries to others (they are then handled twice).
    pub claim_min_idle: Duration,
    /// How often to look for such entries.
    pub claim_interval: Duration,
    /// Where a new group starts.
    pub start: GroupStart,
}

impl ReaderOptions {
    /// Options for consumer `consumer` of group `group` on the default results stream, with the defaults:
    /// 100 entries per read, 5 s block, claim after 60 s idle, looked for every 10 s, new groups start at the beginning.
    pub fn new(group: impl Into<String>, consumer: impl Into<String>) -> Self {
        Self {
            stream: None,
            group: group.into(),
            consumer: consumer.into(),
            count: 100,
            block: Duration::from_secs(5),
            claim_min_idle: Duration::from_secs(60),
            claim_interval: Duration::from_secs(10),
            start: GroupStart::Beginning,
        }
    }
}

/// One result entry handed to the application; acknowledge it with [`ResultReader::ack`] once handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The entry's stream id (what `XACK` takes).
    pub entry_id: String,
    /// The entry's fields (see docs/wire-format.md; `result`, `error`, `metadata`, `request_ids` are JSON text).
    pub fields: HashMap<String, String>,
    /// Whether the entry may have been delivered before: it was pending for this consumer when it (re)started, or it
    /// was claimed from another consumer. Fresh entries are never redelivered ones.
    pub redelivered: bool,
}

impl Delivery {
    /// The job this is the result of (the key to dedupe on).
    pub fn job_id(&self) -> &str {
        self.fields.get("job_id").map(String::as_str).unwrap_or_default()
    }

    /// The entry parsed as a v1 result.
    pub fn result(&self) -> Result<ResultEntry, MalformedResult> {
        ResultEntry::from_fields(&self.fields)
    }
}

/// Reads one results stream through a consumer group. See the module docs for the delivery guarantees.
#[derive(Debug)]
pub struct ResultReader {
    /// A connection of its own: a blocking read would hold up every other command on a shared one.
    conn: Conn,
    /// The results stream.
    stream: String,
    /// The options it was opened with.
    options: ReaderOptions,
    /// Where the next read of this consumer's own pending entries starts; `None` once they are all delivered.
    backlog: Option<String>,
    /// Cursor of an `XAUTOCLAIM` sweep in progress; `None` between sweeps.
    claim_cursor: Option<String>,
    /// When the last sweep finished.
    last_sweep: Option<Instant>,
    /// Set while a read is in flight; still set at the next call means that read was cancelled, and what it read
    /// sits in this consumer's pending list.
    reading: bool,
    /// Entries that were trimmed from the stream before they were acknowledged (their results are lost to this
    /// group: the stream rolled past `retention.results_maxlen` faster than it was read).
    n_trimmed: u64,
}

impl ResultReader {
    /// Opens a reader on its own connection and creates the group if it does not exist.
    pub async fn open(endpoint: &Endpoint, keys: &Keys, options: ReaderOptions) -> Result<Self, ProducerError> {
        let stream = match &options.stream {
            None => keys.results(),
            Some(stream) if keys.is_results_stream(stream) => stream.clone(),
            Some(stream) => {
                return Err(ProducerError::Option(format!(
                    "stream {stream:?} is not a results stream of namespace {}",
                    keys.namespace()
                )));
            }
        };
        if options.group.is_empty() || options.consumer.is_empty() {
            return Err(ProducerError::Option("group and consumer names must not be empty".to_owned()));
        }
        if options.count == 0 {
            return Err(ProducerError::Option("count must be at least 1".to_owned()));
        }
        // Its own connection, patient enough for its blocking reads; it heals after connection errors.
        let conn = endpoint.dedicated(options.block + Duration::from_secs(10));
        let mut reader = Self {
            conn,
            stream,
            options,
            backlog: Some("0".to_owned()),
            claim_cursor: None,
            last_sweep: None,
            reading: false,
            n_trimmed: 0,
        };
        reader.ensure_group().await?;
        Ok(reader)
    }

    /// The stream this reader reads.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// Entries found trimmed from the stream before they were acknowledged (their results were lost).
    pub fn n_trimmed(&self) -> u64 {
        self.n_trimmed
    }

    /// The next entries: first this consumer's own pending ones, then entries claimed from consumers that stopped,
    /// then new ones (waiting up to `block`). An empty batch means nothing arrived within `block`.
    ///
    /// Cancelling this call (dropping the future) is safe: entries it read stay pending and come back on the next
    /// call, flagged `redelivered`.
    pub async fn next_batch(&mut self) -> Result<Vec<Delivery>, ProducerError> {
        if self.reading {
            self.backlog = Some("0".to_owned());
        }
        self.reading = true;
        let batch = match self.fetch().await {
            Err(ProducerError::Redis(error)) if error.code() == Some("NOGROUP") => {
                // The group vanished (Redis restarted without persistence, or someone deleted it).
                self.ensure_group().await?;
                self.backlog = Some("0".to_owned());
                self.fetch().await
            }
            other => other,
        };
        self.reading = false;
        batch
    }

    /// Acknowledges one handled entry; it is never delivered to this group again.
    pub async fn ack(&mut self, entry_id: &str) -> Result<(), ProducerError> {
        self.ack_ids(&[entry_id]).await
    }

    /// Acknowledges several handled entries with one `XACK`.
    pub async fn ack_all(&mut self, deliveries: &[Delivery]) -> Result<(), ProducerError> {
        let ids: Vec<&str> = deliveries.iter().map(|delivery| delivery.entry_id.as_str()).collect();
        self.ack_ids(&ids).await
    }

    async fn ack_ids(&mut self, ids: &[&str]) -> Result<(), ProducerError> {
        if ids.is_empty() {
            return Ok(());
        }
        results::ack(&mut self.conn, &self.stream, &self.options.group, ids).await?;
        Ok(())
    }

    async fn ensure_group(&mut self) -> Result<(), ProducerError> {
        let start = match self.options.start {
            GroupStart::Beginning => "0",
            GroupStart::End => "$",
        };
        Ok(results::create_group(&mut self.conn, &self.stream, &self.options.group, start).await?)
    }

    async fn fetch(&mut self) -> Result<Vec<Delivery>, ProducerError> {
        // 1. This consumer's own pending entries, left by a previous run (or a cancelled read).
        while let Some(cursor) = self.backlog.clone() {
            let reply = self.read_group(GroupRead::Pending(&cursor)).await?;
            let entries = reply::read_reply(&reply)?;
            let Some(last) = entries.last() else {
                self.backlog = None;
                break;
            };
            self.backlog = Some(last.id.clone());
            let deliveries = self.deliveries(entries, true).await?;
            if !deliveries.is_empty() {
                return Ok(deliveries);
            }
        }
        // 2. Entries abandoned by other consumers.
        let sweep_due = self.last_sweep.is_none_or(|at| at.elapsed() >= self.options.claim_interval);
        if self.claim_cursor.is_some() || sweep_due {
            let cursor = self.claim_cursor.take().unwrap_or_else(|| "0-0".to_owned());
            let reply = results::autoclaim(
                &mut self.conn,
                &self.stream,
                &self.options.group,
                &self.options.consumer,
                self.options.claim_min_idle,
                &cursor,
                self.options.count,
            )
            .await?;
            let (next, claimed, deleted) = reply::autoclaim_reply(&reply)?;
            self.n_trimmed += deleted.len() as u64;
            if next == "0-0" {
                self.last_sweep = Some(Instant::now());
            } else {
                self.claim_cursor = Some(next);
            }
            let deliveries = self.deliveries(claimed, true).await?;
            if !deliveries.is_empty() {
                return Ok(deliveries);
            }
        }
        // 3. New entries.
        let reply = self.read_group(GroupRead::New(self.options.block)).await?;
        self.deliveries(reply::read_reply(&reply)?, false).await
    }

    async fn read_group(&mut self, read: GroupRead<'_>) -> Result<redis::Value, ProducerError> {
        let options = &self.options;
        Ok(results::read_group(&mut self.conn, &self.stream, &options.group, &options.consumer, options.count, read)
            .await?)
    }

    /// Turns read entries into deliveries; entries deleted from the stream meanwhile are acknowledged and counted.
    async fn deliveries(&mut self, entries: Vec<RawEntry>, redelivered: bool) -> Result<Vec<Delivery>, ProducerError> {
        let mut gone = Vec::new();
        let mut deliveries = Vec::with_capacity(entries.len());
        for entry in entries {
            match entry.fields {
                Some(fields) => deliveries.push(Delivery { entry_id: entry.id, fields, redelivered }),
                None => gone.push(entry.id),
            }
        }
        if !gone.is_empty() {
            self.n_trimmed += gone.len() as u64;
            let ids: Vec<&str> = gone.iter().map(String::as_str).collect();
            self.ack_ids(&ids).await?;
        }
        Ok(deliveries)
    }
}
