//! Why a leftover remote batch (created for a job, not in its result) may exist: each excuse with the evidence it
//! requires, as narrow as the physics of its fault. [`super::check`] asks [`Evidence::excuse`] about every leftover
//! that was never polled; what no excuse covers is a failure.
//!
//! - **Workers AI** has no way to look a batch up, so a batch whose id its daemon could not record is submitted
//!   again. Three faults can cause that, each only inside its window:
//!   - a `kill -9` of the process that created it, when the reply had not been delivered before the kill, or was
//!     delivered less than [`RECORD_MS`] before it (the id is recorded right after the reply); a create the emulator
//!     logged *after* the kill, from the killed process's own port, was on the wire at the kill: a dead process
//!     sends nothing, so it was sent before, and it is admitted when the emulator logged it at most [`ON_WIRE_MS`]
//!     after the kill (the emulator does not record when it received a request, only when it handled it);
//!   - a SIGSTOP that outlasted the lease, for a create sent before the SIGSTOP (it reached the emulator at most
//!     [`ON_WIRE_MS`] after it);
//!   - a Redis outage that outlasted the lease, with the reply during it ([`Evidence::outage_explains`]).
//! - **OpenAI**: the next create of the chunk looks the batch up by its `metadata` first, so no fault excuses a
//!   leftover, except one more creates deep than the look reads (`openai.lookup_pages` × 100).
//! - **Anthropic**: the chunk's create mark (its nonce, in every `custom_id`) is recorded before each create, and the
//!   next create looks for the batches of that mark first, whatever lost the reply (a fault, a kill, an outage, a
//!   freeze). A leftover is excused only when a look ran between it and the next create (an answered list call by
//!   the process that created again) and, replayed on the emulator's state at that moment ([`Evidence::replay`]:
//!   the batches created and not deleted before the list call, their sizes and creation times, the batch duration),
//!   could not have found it: it was past the page the look lists, or outside its time window (replicas whose clocks
//!   are off), or its results read failed, or more ended candidates lay closer to the chunk's first create than the
//!   look reads (it could not tell them apart: counted apart, at most [`MAX_AMBIGUOUS_PER_MILLE`] per mille of the
//!   run's Anthropic jobs).

use std::collections::{HashMap, HashSet};

use super::cluster::{Cluster, End};
use super::load::Provider;
use super::remote::{Created, RemoteLog};

/// A kill -9 of the process that created it, before its reply was recorded (Workers AI).
pub const CAUSE_KILL: &str = "workers ai: kill -9 before the reply was recorded";
/// A create on the wire when its process was killed (Workers AI).
pub const CAUSE_ON_WIRE: &str = "workers ai: create on the wire at a kill -9";
/// A create sent before a SIGSTOP that outlasted the lease (Workers AI).
pub const CAUSE_FREEZE: &str = "workers ai: sent before a SIGSTOP past the lease";
/// A Redis outage that outlasted the lease, with the reply during it (Workers AI).
pub const CAUSE_OUTAGE: &str = "workers ai: redis unavailable for a lease after the reply";
/// More OpenAI creates between it and its chunk's next create than the look reads.
pub const CAUSE_HORIZON: &str = "openai look: more newer batches than it reads (openai.lookup_pages)";
/// The Anthropic look listed the newest batches only, and this one was older.
pub const CAUSE_PAST_PAGE: &str = "anthropic look: batch past the page it lists";
/// The Anthropic look's time window (from the replicas' clocks) did not hold the batch's creation time.
pub const CAUSE_OUTSIDE_WINDOW: &str = "anthropic look: batch outside its time window (clocks)";
/// The Anthropic look's read of the batch's results failed.
pub const CAUSE_UNREADABLE: &str = "anthropic look: its results read failed";
/// The Anthropic look had more ended candidates than it reads, closer to the chunk's first create.
pub const CAUSE_AMBIGUOUS: &str = "anthropic look: more ended candidates than it reads";

/// The excuses a scenario that allows no duplicate accepts: the Anthropic looks that could not find the batch
/// (the API has no idempotency key and no metadata; batchd counts each one).
pub const LOOK_CAUSES: [&str; 4] = [CAUSE_PAST_PAGE, CAUSE_OUTSIDE_WINDOW, CAUSE_UNREADABLE, CAUSE_AMBIGUOUS];

/// How long after its reply a daemon may still be recording a batch's id (an `HSET` on a loaded 2-core machine).
pub const RECORD_MS: u64 = 1_000;
/// How long after a request was sent the emulator may log it (it logs a call once handled, not when received).
pub const ON_WIRE_MS: u64 = 250;
/// Time the emulator spends on a call besides its drawn latency and injected delays (reading the body, handling).
const HANDLING_MS: u64 = 200;
/// Tolerance of the replay's time comparisons: the call log's times against the emulator's `created_at` and the
/// daemons' `now`, a few ms apart.
const TOLERANCE_MS: u64 = 1_000;
/// Most look-ambiguous Anthropic duplicates a scenario accepts, per mille of its Anthropic jobs (rounded up).
pub const MAX_AMBIGUOUS_PER_MILLE: usize = 10;

/// The Anthropic look's constants, as `crates/batchd-anthropic/src/lookup.rs` has them (the replay must read what
/// the product reads): batches listed per look, ended candidates whose results it reads, and the margin around the
/// chunk's create times.
const LOOK_PAGE: usize = 1_000;
const LOOK_MAX_CHECKS: usize = 16;
const LOOK_CLOCK_MARGIN_MS: u64 = 60_000;

/// What a replay of the Anthropic look before a chunk's next create says about an earlier batch of the chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The leftover's create logged no mark (no `custom_id` of batchd's form): nothing to look for.
    NoMark,
    /// The next create carries another mark: the chunk's mark was lost, so nothing looked for this batch.
    NewMark,
    /// No answered list call by the process that created again, between the two creates.
    NoLook,
    /// This many batches newer than it were listed first: past the page.
    PastPage(usize),
    /// Its creation time lay outside the look's window (`from`, `to`: the daemons' Unix ms).
    OutsideWindow(u64, u64),
    /// It was still running at the look (ends this many ms after it): the look waits, it does not create.
    StillRunning(u64),
    /// The look's read of its results failed (HTTP status).
    Unreadable(u16),
    /// This many ended candidates of its size lay at least as close to the chunk's first create: it was not read.
    Ambiguous(usize),
    /// The look read its results (which carry the chunk's nonce), yet the chunk was created again.
    Found,
    /// It was among the candidates the look reads (this many closer), but no read of it is logged.
    NotRead(usize),
}

impl Verdict {
    /// The excuse it gives, if any.
    pub fn cause(&self) -> Option<&'static str> {
        match self {
            Verdict::PastPage(_) => Some(CAUSE_PAST_PAGE),
            Verdict::OutsideWindow(..) => Some(CAUSE_OUTSIDE_WINDOW),
            Verdict::Unreadable(_) => Some(CAUSE_UNREADABLE),
            Verdict::Ambiguous(_) => Some(CAUSE_AMBIGUOUS),
            _ => None,
        }
    }
}

/// Everything outside batchd that can excuse a leftover: the run's kills, freezes, outages and clocks, the emulator's
/// latency and delays, and its Anthropic state over time.
#[derive(Debug)]
pub struct Evidence<'a> {
    /// The call logs.
    log: &'a RemoteLog,
    /// Incarnation index and end of each daemon port.
    ends: HashMap<u16, (usize, Option<End>)>,
    /// Freezes by incarnation: (SIGSTOP, SIGCONT) Unix ms.
    freezes: HashMap<usize, Vec<(u64, u64)>>,
    /// Redis outages (start, end) Unix ms.
    outages: Vec<(u64, u64)>,
    /// `schedule.lease_secs` in ms.
    lease_ms: u64,
    /// `cloudflare.request_timeout_secs` in ms.
    request_timeout_ms: u64,
    /// The emulator's reply latency (shortest, longest), ms.
    latency_ms: (u64, u64),
    /// The delay of the `delay` faults the scenario injected, ms.
    delay_ms: u64,
    /// How long an Anthropic batch runs, ms.
    anthropic_processing_ms: u64,
    /// Each port's wall-clock offset over time: (from Unix ms, offset ms), in order.
    clocks: HashMap<u16, Vec<(u64, i64)>>,
    /// Anthropic batches, oldest first (by log time, then log order).
    anthropic: Vec<&'a Created>,
    /// When each Anthropic create mark began (`<nonce>-<chunk>` → the daemon's Unix ms), as the chunks' ledgers
    /// record it: a mark begins at the chunk's first create attempt, which need not have reached the API.
    mark_started: HashMap<String, u64>,
}

impl<'a> Evidence<'a> {
    /// The evidence of `cluster`'s run, with its call logs `log`.
    pub fn of(cluster: &Cluster, log: &'a RemoteLog) -> Self {
        let mut ends = HashMap::new();
        let mut clocks: HashMap<u16, Vec<(u64, i64)>> = HashMap::new();
        for (index, incarnation) in cluster.incarnations.iter().enumerate() {
            ends.insert(incarnation.port, (index, incarnation.end.clone()));
            let changes = cluster.clocks.iter().filter(|(slot, ..)| *slot == incarnation.slot);
            clocks.insert(incarnation.port, changes.map(|(_, at_ms, offset)| (*at_ms, *offset)).collect());
        }
        let mut freezes: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
        for (index, from, to) in &cluster.freezes {
            freezes.entry(*index).or_default().push((*from, *to));
        }
        let mut anthropic: Vec<&Created> =
            log.created.iter().filter(|created| created.provider == Provider::Anthropic).collect();
        anthropic.sort_by_key(|created| (created.at_ms, created.seq));
        Self {
            log,
            ends,
            freezes,
            outages: cluster.redis_outages.clone(),
            lease_ms: var_or(cluster, "BATCHD__SCHEDULE__LEASE_SECS", 120) * 1000,
            request_timeout_ms: var_or(cluster, "BATCHD__CLOUDFLARE__REQUEST_TIMEOUT_SECS", 60) * 1000,
            latency_ms: cluster.latency_ms,
            delay_ms: cluster.injected_delay_ms,
            anthropic_processing_ms: cluster.emulator.anthropic().config().processing_for.as_millis() as u64,
            clocks,
            anthropic,
            mark_started: HashMap::new(),
        }
    }

    /// The Anthropic create marks' start times, from the ledgers (see [`mark_started`]).
    pub fn with_mark_starts(mut self, mark_started: HashMap<String, u64>) -> Self {
        self.mark_started = mark_started;
        self
    }

    /// When the request reached the emulator, at the latest: Workers AI logs a submit after an injected delay.
    fn arrival_ms(&self, created: &Created) -> u64 {
        let delayed = created.provider == Provider::Cloudflare && created.had_fault("delay");
        created.at_ms.saturating_sub(if delayed { self.delay_ms } else { 0 })
    }

    /// When the create's reply left the emulator: (earliest, latest); never for a held reply (released only after
    /// the kill it was held for).
    fn reply_ms(&self, created: &Created) -> (u64, u64) {
        if created.had_fault("hold") {
            return (u64::MAX, u64::MAX);
        }
        // OpenAI and Anthropic delay a reply after handling; Workers AI delays before (see `arrival_ms`).
        let late =
            if created.provider != Provider::Cloudflare && created.had_fault("delay") { self.delay_ms } else { 0 };
        let at = created.at_ms + late;
        (at + self.latency_ms.0, at + self.latency_ms.1 + HANDLING_MS)
    }

    /// The incarnation that made a call on `port`, and how it ended.
    pub fn incarnation(&self, port: u16) -> Option<&(usize, Option<End>)> {
        self.ends.get(&port)
    }

    /// Whether a kill -9 of its process interrupted this create: its reply had not left when the process died, or
    /// it was on the wire then (logged by the emulator within [`ON_WIRE_MS`] after the kill).
    pub fn interrupted_by_kill(&self, created: &Created) -> bool {
        let Some((_, Some(End::Killed { at_ms: kill_ms }))) = self.ends.get(&created.port) else { return false };
        let arrival = self.arrival_ms(created);
        if arrival > *kill_ms {
            return arrival <= kill_ms + ON_WIRE_MS;
        }
        self.reply_ms(created).0 > *kill_ms
    }

    /// The excuse of a Workers AI leftover, if its evidence holds. `job_kills`: the kills that already excused a
    /// leftover of the same job (one kill excuses one per job).
    pub fn excuse_workers_ai(&self, orphan: &Created, job_kills: &mut HashSet<usize>) -> Option<&'static str> {
        let (index, end) = self.ends.get(&orphan.port)?;
        let arrival = self.arrival_ms(orphan);
        let (_, reply_latest) = self.reply_ms(orphan);
        if let Some(End::Killed { at_ms: kill_ms }) = end {
            let on_wire = arrival > *kill_ms && arrival <= kill_ms + ON_WIRE_MS;
            let unrecorded = arrival <= *kill_ms && reply_latest.saturating_add(RECORD_MS) >= *kill_ms;
            if (on_wire || unrecorded) && job_kills.insert(*index) {
                return Some(if on_wire { CAUSE_ON_WIRE } else { CAUSE_KILL });
            }
        }
        // Sent before the SIGSTOP and never recorded: however long before its reply came, the replica stopped
        // before recording it (a recorded id is in the result, or polled).
        let frozen = self.freezes.get(index).into_iter().flatten().any(|(from_ms, _)| arrival <= from_ms + ON_WIRE_MS);
        if frozen {
            return Some(CAUSE_FREEZE);
        }
        self.outages.iter().any(|outage| self.outage_explains(orphan.at_ms, *outage)).then_some(CAUSE_OUTAGE)
    }

    /// Whether a Redis outage (`start`, `end` in Unix ms) explains a batch created at `at_ms`: its reply arrived
    /// during the outage (created at most one request timeout before it began, and before it ended), and the outage
    /// outlasted the lease. The daemon holding the request id keeps trying to record it for as long as it holds the
    /// chunk's lease, but it cannot renew a lease while Redis is away: the lease it last renewed before the outage
    /// ends at most one lease after the outage began, and the chunk is then another replica's to resubmit. An
    /// outage shorter than the lease explains nothing: the request id is recorded once Redis is back (finding f1).
    fn outage_explains(&self, at_ms: u64, (start, end): (u64, u64)) -> bool {
        at_ms + self.request_timeout_ms + RECORD_MS >= start && at_ms <= end && start + self.lease_ms <= end + RECORD_MS
    }

    /// A daemon's wall clock (Unix ms) when the emulator's clock said `at_ms`, for the process on `port`.
    fn daemon_ms(&self, port: u16, at_ms: u64) -> u64 {
        let offset = self
            .clocks
            .get(&port)
            .and_then(|changes| changes.iter().rev().find(|(from, _)| *from <= at_ms))
            .map_or(0, |(_, offset)| *offset);
        at_ms.saturating_add_signed(offset)
    }

    /// Replays the Anthropic look that preceded `next` (the chunk's next create after `orphan`) on the emulator's
    /// state at that moment: could it have found `orphan`? See the module docs.
    pub fn replay(&self, orphan: &Created, next: &Created) -> Verdict {
        let Some(mark) = orphan.mark.as_deref() else { return Verdict::NoMark };
        if next.mark.as_deref() != Some(mark) {
            return Verdict::NewMark;
        }
        // The look: the last answered list call of the process that created again, before it did.
        let Some(look) = self
            .log
            .lists
            .iter()
            .filter(|list| list.provider == Provider::Anthropic && list.port == next.port && list.http_status == 200)
            .rfind(|list| list.at_ms >= orphan.at_ms && list.at_ms <= next.at_ms)
        else {
            return Verdict::NoLook;
        };
        let look_ms = look.at_ms;
        // The mark's times, as the daemons recorded them (their own clocks): its first create, and its latest one
        // before the look.
        let of_mark: Vec<&&Created> =
            self.anthropic.iter().filter(|created| created.mark.as_deref() == Some(mark)).collect();
        let Some(first) = of_mark.first() else { return Verdict::NoMark };
        let started = self.mark_started.get(mark).copied().unwrap_or_else(|| self.daemon_ms(first.port, first.at_ms));
        let latest = of_mark.iter().rfind(|created| created.at_ms <= look_ms).unwrap_or(first);
        let last = self.daemon_ms(latest.port, latest.at_ms).max(started);
        let (from_ms, to_ms) = (started.saturating_sub(LOOK_CLOCK_MARGIN_MS), last + LOOK_CLOCK_MARGIN_MS);
        let in_window = |at_ms: u64| at_ms + TOLERANCE_MS >= from_ms && at_ms <= to_ms + TOLERANCE_MS;
        if !in_window(orphan.at_ms) {
            return Verdict::OutsideWindow(from_ms, to_ms);
        }
        // What the list showed: the batches created before it and not deleted yet, newest first.
        let listed: Vec<&&Created> = self
            .anthropic
            .iter()
            .rev()
            .filter(|created| created.at_ms <= look_ms)
            .filter(|created| self.log.deleted.get(&created.batch).is_none_or(|deleted| *deleted > look_ms))
            .collect();
        let position = listed.iter().position(|created| created.batch == orphan.batch).unwrap_or(listed.len());
        if position >= LOOK_PAGE {
            return Verdict::PastPage(position);
        }
        let ended = |created: &Created| created.at_ms + self.anthropic_processing_ms <= look_ms + TOLERANCE_MS;
        if !ended(orphan) {
            return Verdict::StillRunning(orphan.at_ms + self.anthropic_processing_ms - look_ms);
        }
        let reads: Vec<u16> = self
            .log
            .touches
            .iter()
            .filter(|touch| touch.provider == Provider::Anthropic && touch.what == "results")
            .filter(|touch| touch.batch == orphan.batch && touch.port == next.port)
            .filter(|touch| touch.at_ms >= look_ms && touch.at_ms <= next.at_ms)
            .map(|touch| if touch.faulted { 0 } else { touch.http_status })
            .collect();
        if let Some(status) = reads.iter().find(|status| **status != 200) {
            return Verdict::Unreadable(*status);
        }
        let distance = orphan.at_ms.abs_diff(started);
        let closer = listed
            .iter()
            .take(LOOK_PAGE)
            .filter(|created| created.batch != orphan.batch && created.n_requests == orphan.n_requests)
            .filter(|created| in_window(created.at_ms) && ended(created))
            .filter(|created| created.at_ms.abs_diff(started) <= distance + TOLERANCE_MS)
            .count();
        if closer >= LOOK_MAX_CHECKS {
            Verdict::Ambiguous(closer)
        } else if reads.is_empty() {
            Verdict::NotRead(closer)
        } else {
            Verdict::Found
        }
    }
}

/// The mark (`<nonce>-<chunk>`) and its start (the daemon's Unix ms) in a chunk's `c<i>:remote` ledger field
/// (`{"tag":"n-<nonce>-<chunk>-@<started>@<last>"}`, wire-format.md).
pub fn mark_started(remote: &str) -> Option<(String, u64)> {
    let value: serde_json::Value = serde_json::from_str(remote).ok()?;
    let tag = value["tag"].as_str()?;
    let mut parts = tag.split('@');
    let prefix = parts.next()?.strip_prefix("n-")?.strip_suffix('-')?;
    let started = parts.next()?.parse().ok()?;
    Some((prefix.to_owned(), started))
}

/// A numeric daemon setting of the run, or its default.
pub fn var_or(cluster: &Cluster, key: &str, default: u64) -> u64 {
    cluster.var(key).and_then(|value| value.parse().ok()).unwrap_or(default)
}
