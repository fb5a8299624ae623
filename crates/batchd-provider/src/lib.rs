//! The seam between batchd's engine and a batch inference API.
//!
//! A [`Provider`] is one real batch API (Cloudflare Workers AI, OpenAI Batch, Anthropic Message Batches): it
//! submits a chunk of request items as one remote batch, polls it, fetches its results when they are not in the
//! poll reply, and cancels it where the API can. It states its limits (items, body bytes, the body's shape) and
//! its rate buckets, and classifies every failure into an [`ErrorKind`], the only thing the engine decides on.
//! Everything provider-specific (URLs, JSON, file uploads, custom ids) stays behind the trait; the Redis contract,
//! the ledger, the result entry, the dashboard and the CLI are the same for every provider.
//!
//! A job picks its provider by its model name ([`batchd_core::ModelName::provider`]): `@cf/...` and `@hf/...`
//! are Cloudflare's, `openai/<model>` OpenAI's, `anthropic/<model>` Anthropic's. Each provider's crate exports a
//! [`Registration`] (its [`Kind`]: names, model names, [`Capabilities`]; and how it is built from its settings),
//! which is all the daemon, the CLI and the dashboard know of it.

mod budget;
mod error;
pub mod http;
pub mod items;
mod registration;
mod remote;
mod reply_errors;
pub mod text;

use std::fmt;
use std::time::Duration;

use batchd_core::{JobId, JobOutput, ModelName};
use futures::future::BoxFuture;
use serde_json::value::RawValue;

pub use budget::{REPLY_COPIES, ReplyBudget, ReplyHold};
pub use error::{ApiError, ErrorKind};
pub use registration::{
    BuildContext, Capabilities, Kind, Registration, SettingError, check_request_timeout, instance_name,
};
pub use remote::{MAX_REMOTE_REF_LEN, RemoteBatch};

/// A batch inference API behind batchd's engine. Object-safe: the engine holds one `Arc<dyn Provider>` per
/// configured provider and routes each job to one by its model name.
pub trait Provider: Send + Sync + fmt::Debug {
    /// The provider's routing name: its instance's name (`cloudflare`, `openai`, `anthropic`, `gemini` for the
    /// built-in ones, `<name>` for a named instance `[providers.<name>]`), the first segment of its models' names
    /// (Cloudflare's are scoped, `@cf/...`), and the `provider` label of its metrics.
    fn name(&self) -> &'static str;

    /// What one remote batch may hold.
    fn limits(&self) -> BatchLimits;

    /// A limit of one batch of `model` at `endpoint` that counts something other than items or bytes (OpenAI:
    /// 50,000 embedding inputs in a `/v1/embeddings` batch, where an item's `input` may be an array; Workers AI:
    /// the embeddings whose vectors fit in the largest reply it reads), so the engine plans batches, and fills
    /// packs, under it too; `None` (the default): no such limit.
    fn input_limit(&self, model: &ModelName, endpoint: Option<&str>) -> Option<InputLimit> {
        let _ = (model, endpoint);
        None
    }

    /// What this provider can do: its kind's [`Kind::capabilities`] (the default: nothing beyond the required
    /// calls). [`Provider::can_cancel`], [`Provider::sends_events`] and [`Provider::echoes_external_reference`]
    /// read it.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Refuses a model this provider cannot run as a batch (checked at take-in, before anything is sent), with a
    /// sentence saying why.
    fn check_model(&self, model: &ModelName) -> Result<(), String> {
        let _ = model;
        Ok(())
    }

    /// Whether the remote API echoes each item's top-level `external_reference` in that item's response itself
    /// (Workers AI). When it does not (the default), the engine records each item's reference at take-in and puts
    /// it on the item's response in the result, and the provider leaves it out of what it sends
    /// ([`batchd_core::reference::strip`]), so the contract is the same at every provider.
    fn echoes_external_reference(&self) -> bool {
        self.capabilities().echoes_external_reference
    }

    /// The shared rate limiter bucket a call about `model` takes a slot of, or `None` when it is not limited.
    fn rate_bucket(&self, model: &ModelName, call: Call) -> Option<RateBucket>;

    /// Creates the remote batch of `batch.items` (each sent byte for byte, in order). Where creating takes more
    /// than one request (a file upload, then the batch), what exists so far is recorded through
    /// `batch.checkpoint` before the next request, and a resumed submit (`batch.resume`) reuses it and looks for
    /// a batch an interrupted attempt may have created before creating one.
    fn submit<'a>(&'a self, batch: SubmitBatch<'a>) -> BoxFuture<'a, Result<Submitted, ApiError>>;

    /// Asks where a remote batch of `n_items` items stands. The reply's room in the memory budget is handed back
    /// with the answer, to drop once it is stored or published.
    fn poll<'a>(
        &'a self,
        model: &'a ModelName,
        remote: &'a RemoteBatch,
        n_items: usize,
    ) -> BoxFuture<'a, Result<(Polled, Vec<ReplyHold>), ApiError>>;

    /// Fetches the results of a batch that [`Provider::poll`] found [`Polled::Ready`]: one response per item, in
    /// request order (joined on the provider's per-item ids), read within the memory budget.
    fn fetch_results<'a>(
        &'a self,
        model: &'a ModelName,
        remote: &'a RemoteBatch,
        n_items: usize,
    ) -> BoxFuture<'a, Result<(JobOutput, Vec<ReplyHold>), ApiError>>;

    /// Looks for the batch an earlier, interrupted submit of a chunk may have created (its outcome was unknown: a
    /// timeout, a 5xx after sending, a replica that died between create and record), **without creating one**: what
    /// a cancelled job's chunk needs, so that a batch it may have at the provider is cancelled rather than left
    /// running. `find.resume` is what the interrupted attempt recorded. Providers that cannot look answer
    /// [`Found::Unsupported`] (the default); only a provider that [`Provider::can_cancel`] is asked.
    fn find<'a>(&'a self, find: FindBatch<'a>) -> BoxFuture<'a, Result<Found, ApiError>> {
        let _ = find;
        Box::pin(async { Ok(Found::Unsupported) })
    }

    /// Whether the provider sends completion events batchd consumes (Workers AI, through a Cloudflare Queue): only
    /// then, with `[events]` configured, is a batch's first poll put off to the events' long fallback interval
    /// (the default: no events, polls on the usual schedule).
    fn sends_events(&self) -> bool {
        self.capabilities().events
    }

    /// Whether [`Provider::cancel`] stops a running batch, which then ends (seen through polls) with the results
    /// it had finished. When it does, the engine cancels a cancelled job's running batches and waits for them to
    /// end, so the job's result holds what they ran; when it does not (the default), the job ends at once and its
    /// batches run on, unread.
    fn can_cancel(&self) -> bool {
        self.capabilities().cancel
    }

    /// Asks the provider to cancel a remote batch; called for batches still running, only when
    /// [`Provider::can_cancel`]. Providers without a cancel call answer [`CancelOutcome::Unsupported`] (the batch
    /// runs to its end and its results are dropped).
    fn cancel<'a>(
        &'a self,
        model: &'a ModelName,
        remote: &'a RemoteBatch,
    ) -> BoxFuture<'a, Result<CancelOutcome, ApiError>>;

    /// Deletes what batchd left at the provider for a batch that has ended and whose results are stored (uploaded
    /// input files, result files), where the provider keeps such things. Best effort.
    fn clean_up<'a>(&'a self, remote: &'a RemoteBatch) -> BoxFuture<'a, Result<(), ApiError>> {
        let _ = remote;
        Box::pin(async { Ok(()) })
    }
}

/// Which kind of call a rate bucket is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Call {
    /// Creating a batch.
    Submit,
    /// Asking a batch's status.
    Poll,
}

/// A slot of the shared limiter (GCRA in Redis, shared by every replica and every namespace that uses the same
/// account).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateBucket {
    /// The bucket's name, `<account>:<bucket>` ([`RateBucket::new`]): the provider instance's account label
    /// first, which names the Redis key's hash tag (`batchd_core::Keys::rate_limit`), then the bucket within the
    /// account (`text-generation`, `poll:text-generation`, a model).
    pub name: String,
    /// The time one slot stands for: the window divided by the limit.
    pub interval: Duration,
    /// Slots allowed back to back.
    pub burst: u32,
}

impl RateBucket {
    /// The bucket `bucket` of the account labelled `account` (a label of `[A-Za-z0-9._-]`, [`is_account_label`]).
    pub fn new(account: &str, bucket: &str, interval: Duration, burst: u32) -> Self {
        Self { name: format!("{account}:{bucket}"), interval, burst }
    }
}

/// Whether `label` may name an account's rate buckets: 1-64 characters of `A-Z a-z 0-9 . _ -` (it becomes part
/// of a Redis hash tag, so no `{`, `}` or `:`).
pub fn is_account_label(label: &str) -> bool {
    (1..=64).contains(&label.len()) && label.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// What one remote batch may hold; the engine cuts jobs into chunks within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Largest body of one batch, in bytes, as [`BodyShape::bytes`] counts it.
    pub max_body_bytes: usize,
    /// Most items in one batch.
    pub max_items: Option<usize>,
    /// How the body's size follows from its items' sizes.
    pub body: BodyShape,
}

/// A per-batch limit on inputs, where an item may hold several ([`Provider::input_limit`]).
#[derive(Debug, Clone, Copy)]
pub struct InputLimit {
    /// Most inputs in one batch.
    pub max_inputs: usize,
    /// How many inputs an item holds (at least 1; an item it cannot read counts 1: the provider refuses it anyway).
    pub inputs_of: fn(&RawValue) -> usize,
}

/// The size of a batch's body as a function of its items' sizes: an envelope, each item with a fixed overhead
/// (an id, a wrapper object, the model's name), and a separator between neighbours. Exact for a provider that
/// sends items byte for byte in a JSON array; an upper bound where per-item ids vary in length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyShape {
    /// Bytes of the body with no items.
    pub envelope: usize,
    /// Bytes added to each item.
    pub per_item: usize,
    /// Bytes between two neighbouring items.
    pub separator: usize,
}

impl BodyShape {
    /// The body's size for items of these sizes.
    pub fn bytes(&self, item_sizes: impl IntoIterator<Item = usize>) -> usize {
        let (total, count) =
            item_sizes.into_iter().fold((0usize, 0usize), |(total, count), size| (total + size, count + 1));
        self.envelope + total + count * self.per_item + count.saturating_sub(1) * self.separator
    }
}

/// A fresh nonce for the creates of one chunk: 16 lowercase hex characters (64 random bits). A provider records it
/// in the chunk's ledger before the first create and puts it on the batch (metadata, custom ids), so a look-up
/// after an uncertain create adopts only a batch that carries it: namespaces and deployments that share one
/// account may hold the same job id, never the same nonce (DESIGN decision 23).
pub fn create_nonce() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Whether `text` reads as a nonce [`create_nonce`] made (a ledger is writable by anyone who can write to Redis).
pub fn is_nonce(text: &str) -> bool {
    text.len() == 16 && text.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
}

/// Which chunk a batch is: providers put it in the batch's metadata or per-item ids, so a batch an interrupted
/// submit created can be found again.
#[derive(Debug, Clone, Copy)]
pub struct BatchTag<'a> {
    /// The namespace the job belongs to (several may share one provider account).
    pub namespace: &'a str,
    /// The job.
    pub job_id: &'a JobId,
    /// The chunk's index in the job.
    pub chunk: u32,
    /// The submit attempt (1-based).
    pub attempt: u64,
}

/// Records what a multi-request submit has created so far (in the chunk's ledger, under the chunk's claim).
pub trait Checkpoint: Send + Sync {
    /// Records `remote`; an error means it could not be recorded, and the submit must stop before creating more.
    fn record<'a>(&'a self, remote: &'a RemoteBatch) -> BoxFuture<'a, Result<(), String>>;
}

/// A chunk to submit.
pub struct SubmitBatch<'a> {
    /// The model (routed to this provider).
    pub model: &'a ModelName,
    /// The job's endpoint, for providers with more than one (OpenAI); `None`: the provider's default.
    pub endpoint: Option<&'a str>,
    /// The request items, in order, each sent byte for byte (the provider adds only the model and its own
    /// per-item ids).
    pub items: &'a [&'a RawValue],
    /// Which chunk this is.
    pub tag: BatchTag<'a>,
    /// What an interrupted earlier attempt recorded, if anything.
    pub resume: Option<&'a RemoteBatch>,
    /// Where to record progress between the requests of one submit.
    pub checkpoint: &'a dyn Checkpoint,
}

impl fmt::Debug for SubmitBatch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubmitBatch")
            .field("model", &self.model)
            .field("endpoint", &self.endpoint)
            .field("n_items", &self.items.len())
            .field("tag", &self.tag)
            .field("resume", &self.resume)
            .finish_non_exhaustive()
    }
}

/// A chunk whose earlier submit may have created its batch, to look for (see [`Provider::find`]).
#[derive(Debug, Clone, Copy)]
pub struct FindBatch<'a> {
    /// The model (routed to this provider).
    pub model: &'a ModelName,
    /// The namespace the job belongs to.
    pub namespace: &'a str,
    /// The job.
    pub job_id: &'a JobId,
    /// The chunk's index in the job.
    pub chunk: u32,
    /// The chunk's number of request items.
    pub n_items: usize,
    /// What the interrupted submit recorded (an uploaded file, a mark, a batch id), possibly nothing.
    pub resume: &'a RemoteBatch,
}

/// What [`Provider::find`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// The chunk's batch exists: it is recorded as submitted, then polled (and cancelled) like any.
    Batch(Submitted),
    /// No batch of the chunk exists, as far as the provider can tell: the chunk was never sent.
    Nothing,
    /// The provider cannot look a batch up without creating one.
    Unsupported,
}

/// A batch the provider accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// What to poll it with.
    pub remote: RemoteBatch,
    /// Its status as the provider first reports it (`queued`, `validating`, `in_progress`).
    pub status: String,
    /// Bytes sent.
    pub body_bytes: usize,
}

/// Where a remote batch stands.
#[derive(Debug)]
pub enum Polled {
    /// Not finished: any reply that carries no answer, whatever its status says.
    Pending(PendingStatus),
    /// Finished, with its results in the reply: one response per item, in request order.
    Done(JobOutput),
    /// Finished; its results are fetched with [`Provider::fetch_results`] (the record may have gained the
    /// results' file ids or URL).
    Ready(RemoteBatch),
}

/// The status a pending batch reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingStatus {
    /// The status as the provider gave it, one line of at most [`PendingStatus::MAX_CHARS`] characters.
    status: String,
    /// Whether the provider's docs list it.
    documented: bool,
    /// Whether it says a cancel is under way (OpenAI's `cancelling`, Anthropic's `canceling`): the batch is not
    /// asked to cancel again.
    cancelling: bool,
}

impl PendingStatus {
    /// Longest status text kept, in characters.
    pub const MAX_CHARS: usize = 64;

    /// A status the provider's docs list.
    pub fn documented(status: &str) -> Self {
        Self { status: Self::one_line(status), documented: true, cancelling: false }
    }

    /// The documented status of a batch whose cancel is under way (it ends, with what it finished, on its own).
    pub fn cancelling(status: &str) -> Self {
        Self { cancelling: true, ..Self::documented(status) }
    }

    /// A status the docs do not list (kept, bounded, for logs and the ledger).
    pub fn undocumented(status: &str) -> Self {
        Self { status: Self::one_line(status), documented: false, cancelling: false }
    }

    /// The status text.
    pub fn as_str(&self) -> &str {
        &self.status
    }

    /// Whether the docs list it.
    pub fn is_documented(&self) -> bool {
        self.documented
    }

    /// Whether a cancel of the batch is under way.
    pub fn is_cancelling(&self) -> bool {
        self.cancelling
    }

    fn one_line(status: &str) -> String {
        status.chars().filter(|c| !c.is_control()).take(Self::MAX_CHARS).collect()
    }
}

/// What a cancel request achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The provider is cancelling the batch; its end (with the results that finished) comes through polls.
    Requested,
    /// The provider has no cancel call; the batch runs to its end.
    Unsupported,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_shape_counts_envelope_items_overheads_and_separators() {
        let cloudflare = BodyShape { envelope: r#"{"requests":[]}"#.len(), per_item: 0, separator: 1 };
        assert_eq!(cloudflare.bytes([]), 15);
        assert_eq!(cloudflare.bytes([2, 3]), r#"{"requests":[{},{ }]}"#.len());
        let lines = BodyShape { envelope: 0, per_item: 10, separator: 1 };
        assert_eq!(lines.bytes([5, 5, 5]), 3 * 15 + 2);
    }

    #[test]
    fn nonces_are_fresh_and_only_their_own_shape_reads_as_one() {
        let (a, b) = (create_nonce(), create_nonce());
        assert!(is_nonce(&a) && is_nonce(&b), "{a} {b}");
        assert_ne!(a, b, "two creates never share a nonce");
        for foreign in ["", "0123456789abcde", "0123456789abcdef0", "0123456789ABCDEF", "0123456789abcdeg"] {
            assert!(!is_nonce(foreign), "{foreign:?}");
        }
    }

    #[test]
    fn pending_statuses_are_kept_to_one_bounded_line() {
        let status = PendingStatus::undocumented(&format!("odd\n{}", "x".repeat(100)));
        assert!(!status.is_documented());
        assert_eq!(status.as_str().chars().count(), PendingStatus::MAX_CHARS);
        assert!(!status.as_str().contains('\n'));
        assert!(PendingStatus::documented("queued").is_documented());
        let cancelling = PendingStatus::cancelling("cancelling");
        assert!(cancelling.is_documented() && cancelling.is_cancelling());
        assert!(!PendingStatus::documented("in_progress").is_cancelling());
    }
}
