//! The ingress fetcher: reads the submit stream through the consumer group (the commands are the storage's,
//! `batchd_queue::ingress`) and reclaims entries that a dead replica left pending (idle longer than `reclaim_idle`, via `XAUTOCLAIM`), so recovery depends on time only,
//! never on process names.
//!
//! The blocking `XREADGROUP` runs on a connection of its own whose response timeout exceeds `BLOCK`, and it is
//! never cancelled mid-flight (a cancelled read would strand what it read in the pending list).
//!
//! With a [`DeliveryLimit`], an entry that keeps coming back (its take-in fails, or crashes the process, every
//! time) is not handed out again once the consumer group has delivered it more than `max_deliveries` times: it
//! is moved to the dead-letter stream, unread, so it cannot hold a replica forever. Redis 7.0's `XAUTOCLAIM` does
//! not return delivery counts, so they are read with one `XPENDING` per reclaimed entry (one round trip, at most
//! `batch` commands).
//!
//! With an [`EntryBudget`], what is read is bounded by bytes before it is trusted: a read asks for at most
//! `available / max_entry_bytes` entries (at least 1), holding room for that many entries of the largest size while
//! it reads; then each entry keeps room for its own charge (its size, measured) until its handler finishes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use batchd_core::{JobId, Keys};
use batchd_queue::ingress::{self as submit, SubmitEntry};
use batchd_queue::{Endpoint, RetryDelay, StoreError};

use crate::pipeline::Ending;
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::fetch::{BudgetHold, ByteBudget, FetchBackend, HandBack, pause, reserve};

/// A read of more than this many bytes replaces the reader's connection afterwards (see `fetch_loop`).
const BIG_READ: usize = 1024 * 1024;

/// One entry of the submit stream, as read.
#[derive(Debug)]
pub struct IngressEntry {
    /// The stream entry id.
    pub id: String,
    /// The entry's fields, in the order Redis returned them.
    pub fields: Vec<(String, Vec<u8>)>,
    /// The entry's room in the process's byte budget (empty without an [`EntryBudget`]), given back when the
    /// entry is dropped, i.e. when its handler is done with it.
    pub hold: BudgetHold,
}

impl IngressEntry {
    /// The bytes of the entry's fields, names included.
    pub fn size(&self) -> usize {
        self.fields.iter().map(|(name, value)| name.len() + value.len()).sum()
    }

    /// An entry as read, holding no room yet.
    fn read(entry: SubmitEntry) -> Self {
        Self { id: entry.id, fields: entry.fields, hold: BudgetHold::default() }
    }
}

/// The room an entry keeps while it is handled, from its fields.
pub type EntryCharge = dyn Fn(&[(String, Vec<u8>)]) -> usize + Send + Sync;

/// Bounds the ingress fetcher by bytes (see the module docs).
#[derive(Clone)]
pub struct EntryBudget {
    /// The process's budget, shared with everything else in flight.
    pub budget: ByteBudget,
    /// The largest entry that can be read (`jobs.max_entry_bytes`): a read holds this much per entry it asks for.
    pub max_entry_bytes: usize,
    /// The room an entry keeps while it is handled, from its fields (at least its size: the daemon adds what
    /// decoding it costs per item).
    pub charge: Arc<EntryCharge>,
}

impl std::fmt::Debug for EntryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntryBudget")
            .field("budget", &self.budget)
            .field("max_entry_bytes", &self.max_entry_bytes)
            .finish()
    }
}

/// How many entries a read may ask for: as many of the largest size as `available` bytes hold, at least 1 (that
/// one waits for its room), at most `n`.
fn entries_within(available: usize, max_entry_bytes: usize, n: usize) -> usize {
    (available / max_entry_bytes.max(1)).clamp(1, n.max(1))
}

/// Settings of the ingress fetcher.
#[derive(Debug, Clone)]
pub struct IngressSettings {
    /// This replica's consumer name in the group (unique per process start).
    pub consumer: String,
    /// Most entries read at once, and the size of the prefetch channel.
    pub batch: usize,
    /// How long one `XREADGROUP` blocks waiting for new entries.
    pub block: Duration,
    /// An entry pending this long with another consumer is considered abandoned and reclaimed.
    pub reclaim_idle: Duration,
    /// How often to look for abandoned entries.
    pub reclaim_interval: Duration,
}

/// Entries delivered too often go to the dead-letter stream instead of to the worker (see the module docs).
#[derive(Debug, Clone)]
pub struct DeliveryLimit {
    /// An entry the consumer group has delivered more than this many times is moved to the dead-letter stream
    /// (`ingress.max_deliveries`).
    pub max_deliveries: u64,
    /// The pipeline, through whose one ending path ([`crate::pipeline::Ending::Undeliverable`]) it is moved.
    pub pipeline: Arc<crate::pipeline::Pipeline>,
}

/// Starts the ingress fetcher and returns the backend the submit worker reads from. Every entry is handed out
/// however often it was delivered; see [`backend_with_delivery_limit`].
pub fn backend(
    endpoint: Endpoint,
    keys: Keys,
    settings: IngressSettings,
    stop: CancellationToken,
) -> FetchBackend<IngressEntry> {
    backend_with_limits(endpoint, keys, settings, None, None, stop)
}

/// Starts the ingress fetcher and returns the backend the submit worker reads from; with `limit`, a reclaimed
/// entry delivered more than `limit.max_deliveries` times is dead-lettered instead of handed out; with `budget`,
/// reads are bounded by bytes and every entry holds room for itself until it is handled.
pub fn backend_with_limits(
    endpoint: Endpoint,
    keys: Keys,
    settings: IngressSettings,
    limit: Option<DeliveryLimit>,
    budget: Option<EntryBudget>,
    stop: CancellationToken,
) -> FetchBackend<IngressEntry> {
    let hand_back: Arc<dyn HandBack<IngressEntry>> = Arc::new(IngressHandBack {
        endpoint: endpoint.clone(),
        keys: keys.clone(),
        consumer: settings.consumer.clone(),
        reclaim_idle: settings.reclaim_idle,
    });
    FetchBackend::spawn(settings.batch, stop, hand_back, move |tx, stop| {
        fetch_loop(endpoint, keys, settings, limit, budget, tx, stop)
    })
}

async fn fetch_loop(
    endpoint: Endpoint,
    keys: Keys,
    settings: IngressSettings,
    limit: Option<DeliveryLimit>,
    budget: Option<EntryBudget>,
    tx: mpsc::Sender<IngressEntry>,
    stop: CancellationToken,
) {
    // A connection of its own, never shared: a blocking read must not hold up other commands, and its reply
    // timeout must exceed BLOCK.
    let mut conn = endpoint.dedicated(settings.block + Duration::from_secs(10));
    let mut delay = RetryDelay::new();
    let mut last_reclaim: Option<Instant> = None;
    let mut group_ready = false;
    tracing::info!(consumer = %settings.consumer, stream = %keys.submit(), "ingress fetcher started");
    while !stop.is_cancelled() {
        let Some((n, permits)) = reserve(&tx, settings.batch, &stop).await else { break };
        // Room for `n` entries of the largest size, held before the read so that nothing read is uncounted.
        let (n, mut room) = match &budget {
            Some(budget) => {
                let n = entries_within(budget.budget.available_bytes(), budget.max_entry_bytes, n);
                let Some(room) = budget.budget.hold_beating(n.saturating_mul(budget.max_entry_bytes), &stop).await
                else {
                    break;
                };
                (n, room)
            }
            None => (n, BudgetHold::default()),
        };
        let result: Result<Vec<SubmitEntry>, StoreError> = async {
            let connection = &mut conn;
            if !group_ready {
                submit::ensure_group(connection, &keys).await?;
                let idle = (settings.reclaim_idle * 10).max(Duration::from_secs(3600));
                submit::remove_idle_consumers(connection, &keys, idle).await;
                group_ready = true;
            }
            if last_reclaim.is_none_or(|at| at.elapsed() >= settings.reclaim_interval) {
                last_reclaim = Some(Instant::now());
                let mut claimed =
                    submit::reclaim(connection, &keys, &settings.consumer, settings.reclaim_idle, n).await?;
                if let Some(limit) = limit.as_ref().filter(|_| !claimed.is_empty()) {
                    claimed = drop_undeliverable(connection, &keys, limit, claimed).await?;
                }
                if !claimed.is_empty() {
                    tracing::warn!(n = claimed.len(), "reclaimed ingress entries abandoned by another replica");
                    return Ok(claimed);
                }
            }
            // `batchd pause`: while `{ns}:paused` exists, read nothing new (reclaiming above goes on); checked once
            // per read round, so a pause takes effect once the read in flight returns.
            if submit::is_paused(connection, &keys).await? {
                pause(settings.block.min(Duration::from_secs(1)), &stop).await;
                return Ok(Vec::new());
            }
            if let Some(budget) = &budget {
                // Entries waiting: read up to `n` at once, within the room held. None: block for one, holding
                // room for one only, so an idle reader does not sit on the budget.
                let waiting = submit::read_new(connection, &keys, &settings.consumer, n, None).await?;
                if !waiting.is_empty() {
                    return Ok(waiting);
                }
                room.shrink_to(budget.max_entry_bytes);
                return submit::read_new(connection, &keys, &settings.consumer, 1, Some(settings.block)).await;
            }
            submit::read_new(connection, &keys, &settings.consumer, n, Some(settings.block)).await
        }
        .await;
        match result {
            Ok(entries) => {
                delay.succeeded();
                let mut entries: Vec<IngressEntry> = entries.into_iter().map(IngressEntry::read).collect();
                if let Some(budget) = budget.as_ref().filter(|_| !entries.is_empty()) {
                    // Each entry keeps room for its own charge; the rest of the read's room is given back. An entry
                    // larger than it claimed to be fits in no read's room: then the room is given back and the sum
                    // asked for at once (never waiting while holding).
                    let charges: Vec<usize> = entries.iter().map(|entry| (budget.charge)(&entry.fields)).collect();
                    let total = charges.iter().fold(0usize, |sum, charge| sum.saturating_add(*charge));
                    if total > room.bytes() {
                        drop(std::mem::take(&mut room));
                        room = budget.budget.hold_beating(total, &stop).await.unwrap_or_default();
                    }
                    for (entry, charge) in entries.iter_mut().zip(charges) {
                        entry.hold = room.split(charge);
                    }
                }
                drop(room);
                let bytes = entries.iter().fold(0usize, |sum, entry| sum.saturating_add(entry.size()));
                if bytes > BIG_READ {
                    // redis-rs reads a reply into one buffer that grows by doubling until the largest value in it
                    // is whole, copies each value out, and never shrinks it: that buffer is a second copy of the
                    // entry, resident for as long as the connection lives. Dropping the connection frees it; it
                    // goes before the entries are handed out, so no handler's work overlaps with it.
                    conn = endpoint.dedicated(settings.block + Duration::from_secs(10));
                }
                for (permit, entry) in permits.zip(entries) {
                    permit.send(entry);
                }
            }
            Err(error) => {
                if matches!(&error, StoreError::Redis(error) if error.code() == Some("NOGROUP")) {
                    group_ready = false;
                }
                let wait = delay.failed();
                tracing::warn!(error = %error, retry_in = ?wait, "reading the submit stream failed; retrying");
                if !pause(wait, &stop).await {
                    break;
                }
            }
        }
    }
    tracing::info!(consumer = %settings.consumer, "ingress fetcher stopped");
}

/// Moves the entries of `claimed` that were delivered more than `limit.max_deliveries` times to the dead-letter
/// stream and returns the others. An entry that cannot be moved now stays pending (this consumer holds it) and is
/// reclaimed again later; it is never handed out.
async fn drop_undeliverable(
    conn: &mut batchd_queue::Conn,
    keys: &Keys,
    limit: &DeliveryLimit,
    claimed: Vec<SubmitEntry>,
) -> Result<Vec<SubmitEntry>, StoreError> {
    let ids: Vec<&str> = claimed.iter().map(|entry| entry.id.as_str()).collect();
    let counts = submit::delivery_counts(conn, keys, &ids).await?;
    let mut keep = Vec::with_capacity(claimed.len());
    for (entry, deliveries) in claimed.into_iter().zip(counts) {
        match deliveries {
            Some(deliveries) if deliveries > limit.max_deliveries => {
                let moved = match JobId::parse(&entry.id) {
                    Ok(job_id) => {
                        let ending = Ending::Undeliverable {
                            entry_id: &entry.id,
                            fields: &entry.fields,
                            deliveries,
                            max_deliveries: limit.max_deliveries,
                        };
                        limit.pipeline.conclude(&job_id, ending).await
                    }
                    Err(error) => Err(StoreError::Corrupt { job_id: entry.id.clone(), detail: error.to_string() }),
                };
                if let Err(error) = moved {
                    tracing::warn!(
                        entry_id = %entry.id,
                        error = %error,
                        "could not dead-letter an entry delivered too many times; it is tried again when reclaimed"
                    );
                }
            }
            _ => keep.push(entry),
        }
    }
    Ok(keep)
}

/// Hands unstarted entries back by marking them idle past `reclaim_idle`, so any replica's next reclaim takes them.
struct IngressHandBack {
    endpoint: Endpoint,
    keys: Keys,
    consumer: String,
    reclaim_idle: Duration,
}

impl HandBack<IngressEntry> for IngressHandBack {
    fn hand_back(&self, items: Vec<IngressEntry>) -> BoxFuture<'static, ()> {
        let mut conn = self.endpoint.dedicated(Duration::from_secs(10));
        let keys = self.keys.clone();
        let consumer = self.consumer.clone();
        let idle = self.reclaim_idle.as_millis() as u64 + 1;
        let idle = Duration::from_millis(idle);
        async move {
            let ids: Vec<&str> = items.iter().map(|item| item.id.as_str()).collect();
            let result = submit::hand_back(&mut conn, &keys, &consumer, &ids, idle).await;
            match result {
                Ok(_) => tracing::info!(n = items.len(), "handed back unstarted ingress entries"),
                Err(error) => tracing::warn!(
                    error = %error,
                    n = items.len(),
                    "could not hand back ingress entries; they are reclaimed after reclaim_idle"
                ),
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn a_read_asks_for_as_many_entries_of_the_largest_size_as_the_budget_has_room_for() {
        let mib = 1024 * 1024;
        assert_eq!(entries_within(256 * mib, 32 * mib, 64), 8);
        assert_eq!(entries_within(256 * mib, 1024, 64), 64, "capped by the batch");
        assert_eq!(entries_within(10 * mib, 32 * mib, 64), 1, "one entry waits for its room");
        assert_eq!(entries_within(0, 0, 0), 1);
    }

    #[tokio::test]
    async fn a_hold_larger_than_the_budget_takes_the_whole_budget_and_splits_and_shrinks() {
        let budget = ByteBudget::new(64 * 1024);
        let mut whole = budget.hold(1 << 40).await;
        assert_eq!((whole.bytes(), budget.available_bytes()), (64 * 1024, 0));
        assert!(budget.try_hold(1).is_none(), "nothing is left");
        let part = whole.split(1500);
        assert_eq!((part.bytes(), whole.bytes()), (2048, 62 * 1024), "rounded up to whole KiB");
        whole.shrink_to(10 * 1024);
        assert_eq!(budget.available_bytes(), 52 * 1024);
        whole.merge(part);
        drop(whole);
        assert_eq!(budget.available_bytes(), 64 * 1024, "everything is given back");
        assert_eq!(budget.try_hold(0).map(|hold| hold.bytes()), Some(0));
    }
}
