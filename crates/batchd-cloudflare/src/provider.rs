//! Cloudflare Workers AI as a [`Provider`]: a batch is one `POST ?queueRequest=true` of the items, its results
//! come inside the poll reply, there is no cancel call, and rate limits are shared per account and task type
//! (`[rate_limits]`).
//!
//! The model catalog ([`SharedCatalog`], refreshed by the daemon) refuses at take-in a model it lists without
//! `async_queue`, and gives the task type of a model's bucket; repeated 429s lower a bucket's rate
//! ([`AdaptiveRates`]); every model submitted for is noted ([`SeenModels`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use batchd_core::{JobOutput, ModelName, RequestId};
use batchd_provider::{
    ApiError, BatchLimits, BodyShape, Call, CancelOutcome, ErrorKind, InputLimit, PendingStatus, Polled, Provider,
    RateBucket, RemoteBatch, ReplyHold, SubmitBatch, Submitted,
};
use futures::future::BoxFuture;

use crate::adaptive::AdaptiveRates;
use crate::catalog::{SeenModels, SharedCatalog};
use crate::rate_limits::{RateLimitSettings, TaskType, rate_bucket};
use crate::{BatchClient, PollStatus};

/// The body of a Cloudflare batch: `{"requests":[i0,i1,...]}`, items byte for byte.
pub const BODY_SHAPE: BodyShape = BodyShape { envelope: r#"{"requests":[]}"#.len(), per_item: 0, separator: 1 };

/// The status a batch has just after it was accepted.
const QUEUED: &str = "queued";

/// Workers AI's Batch API behind the provider seam.
#[derive(Debug, Clone)]
pub struct CloudflareProvider {
    /// The API client of the account.
    client: BatchClient,
    /// The account's label, the first part of every rate-limit bucket (the account id unless configured).
    account: String,
    /// The shared limits per task type and model.
    rate_limits: RateLimitSettings,
    /// What one batch may hold.
    limits: BatchLimits,
    /// The model catalog in use (empty: the hand table applies).
    catalog: SharedCatalog,
    /// The adaptive rate of each bucket that was rate-limited.
    adaptive: Arc<AdaptiveRates>,
    /// The models submitted for.
    seen: SeenModels,
}

impl CloudflareProvider {
    /// The provider for the account labelled `account` (its rate buckets' names) through `client`, with batches
    /// of at most `max_body_bytes` (the API's documented limit is 10 MB) and `max_items` items.
    pub fn new(
        client: BatchClient,
        account: impl Into<String>,
        rate_limits: RateLimitSettings,
        max_body_bytes: usize,
        max_items: Option<usize>,
    ) -> Self {
        let adaptive = Arc::new(AdaptiveRates::new(Duration::from_secs(rate_limits.window_secs)));
        Self {
            client,
            account: account.into(),
            rate_limits,
            limits: BatchLimits { max_body_bytes, max_items, body: BODY_SHAPE },
            catalog: SharedCatalog::default(),
            adaptive,
            seen: SeenModels::default(),
        }
    }

    /// The catalog this provider reads (refreshed by whoever holds a clone).
    pub fn catalog(&self) -> &SharedCatalog {
        &self.catalog
    }

    /// The models this provider has submitted for.
    pub fn seen_models(&self) -> &SeenModels {
        &self.seen
    }

    /// The API client.
    pub fn client(&self) -> &BatchClient {
        &self.client
    }

    /// Each bucket's effective limit per window now: the configured one, lowered by repeated 429s
    /// ([`AdaptiveRates`]). Only buckets that were rate-limited are listed.
    pub fn effective_limits(&self) -> Vec<(String, f64)> {
        self.adaptive.snapshot(Instant::now())
    }

    /// Counts a 429 for the model's submit bucket; a repeated one lowers the bucket's rate (logged).
    fn note_rate_limited(&self, model: &ModelName) {
        let catalog = self.catalog.get();
        let Some((bucket, limit)) = rate_bucket(&self.account, model.as_str(), &self.rate_limits, catalog.as_deref())
        else {
            return;
        };
        if let Some(fraction) = self.adaptive.rate_limited(&bucket, limit, Instant::now()) {
            let effective = f64::from(limit) * fraction;
            tracing::warn!(
                bucket = %bucket,
                model = %model,
                configured = limit,
                effective,
                window_secs = self.rate_limits.window_secs,
                "repeated 429s: submitting slower for this bucket until they stop (it recovers a tenth of its limit per quiet window)"
            );
        }
    }

    fn request_id(remote: &RemoteBatch) -> Result<&RequestId, ApiError> {
        remote.id.as_ref().ok_or_else(|| ApiError {
            kind: ErrorKind::NotFound,
            http_status: None,
            api_code: None,
            message: "the chunk records no request id to poll".to_owned(),
            retry_after: None,
            maybe_delivered: false,
        })
    }
}

impl Provider for CloudflareProvider {
    /// No cancel call; completion events; each item's `external_reference` echoed in its response by Workers AI
    /// itself, so items are sent with it.
    fn capabilities(&self) -> batchd_provider::Capabilities {
        crate::registration::CAPABILITIES
    }

    fn name(&self) -> &'static str {
        batchd_core::ids::CLOUDFLARE
    }

    fn limits(&self) -> BatchLimits {
        self.limits
    }

    /// Embeddings are planned under the vectors whose reply fits in `cloudflare.max_reply_bytes`: a batch whose
    /// reply could not be read would run, be billed, and lose its results.
    fn input_limit(&self, model: &ModelName, _endpoint: Option<&str>) -> Option<InputLimit> {
        let catalog = self.catalog.get();
        let (task, _) = self.rate_limits.task_of(model.as_str(), catalog.as_deref());
        (task == TaskType::Embeddings).then(|| InputLimit {
            max_inputs: crate::reply_plan::max_vectors(model.as_str(), self.client.max_reply_bytes()),
            inputs_of: crate::reply_plan::texts_of,
        })
    }

    fn check_model(&self, model: &ModelName) -> Result<(), String> {
        match self.catalog.get() {
            Some(catalog) if catalog.refuses(model.as_str()) => Err(format!(
                "the Workers AI model catalog lists {model} without async_queue: it does not take batch requests, so \
                 nothing was submitted; use a model with the Batch capability (batchd models lists them)"
            )),
            _ => Ok(()),
        }
    }

    fn rate_bucket(&self, model: &ModelName, call: Call) -> Option<RateBucket> {
        if call == Call::Poll && !self.rate_limits.limit_polls {
            return None;
        }
        let catalog = self.catalog.get();
        let (bucket, limit) = rate_bucket(&self.account, model.as_str(), &self.rate_limits, catalog.as_deref())?;
        let fraction = if self.rate_limits.adaptive && call == Call::Submit {
            self.adaptive.fraction(&bucket, Instant::now())
        } else {
            1.0
        };
        // `<account>:<bucket>`; a poll's bucket is the account's `poll:<bucket>`.
        let name = if call == Call::Poll { bucket.replacen(':', ":poll:", 1) } else { bucket };
        Some(RateBucket {
            name,
            interval: Duration::from_secs(self.rate_limits.window_secs).div_f64(f64::from(limit) * fraction),
            burst: self.rate_limits.burst,
        })
    }

    fn submit<'a>(&'a self, batch: SubmitBatch<'a>) -> BoxFuture<'a, Result<Submitted, ApiError>> {
        Box::pin(async move {
            self.seen.saw(batch.model.as_str());
            let submitted = match self.client.submit(batch.model, batch.items).await {
                Ok(submitted) => submitted,
                Err(error) => {
                    if error.kind == ErrorKind::RateLimited && self.rate_limits.adaptive {
                        self.note_rate_limited(batch.model);
                    }
                    return Err(error);
                }
            };
            Ok(Submitted {
                remote: RemoteBatch::with_id(submitted.request_id),
                status: QUEUED.to_owned(),
                body_bytes: submitted.body_bytes,
            })
        })
    }

    fn poll<'a>(
        &'a self,
        model: &'a ModelName,
        remote: &'a RemoteBatch,
        n_items: usize,
    ) -> BoxFuture<'a, Result<(Polled, Vec<ReplyHold>), ApiError>> {
        Box::pin(async move {
            let request_id = Self::request_id(remote)?;
            let (status, held) = self.client.poll_held(model, request_id, n_items).await?;
            let polled = match status {
                PollStatus::Pending(pending) if pending.is_documented() => {
                    Polled::Pending(PendingStatus::documented(pending.as_str()))
                }
                PollStatus::Pending(pending) => Polled::Pending(PendingStatus::undocumented(pending.as_str())),
                PollStatus::Done(output) => Polled::Done(output),
            };
            Ok((polled, held))
        })
    }

    fn fetch_results<'a>(
        &'a self,
        _model: &'a ModelName,
        _remote: &'a RemoteBatch,
        _n_items: usize,
    ) -> BoxFuture<'a, Result<(JobOutput, Vec<ReplyHold>), ApiError>> {
        // Workers AI answers inside the poll reply and never says `Ready`, so this is never asked.
        Box::pin(async {
            Err(ApiError {
                kind: ErrorKind::Permanent,
                http_status: None,
                api_code: None,
                message: "Workers AI returns results with the poll; there is nothing to fetch".to_owned(),
                retry_after: None,
                maybe_delivered: false,
            })
        })
    }

    fn cancel<'a>(
        &'a self,
        _model: &'a ModelName,
        _remote: &'a RemoteBatch,
    ) -> BoxFuture<'a, Result<CancelOutcome, ApiError>> {
        // The Batch API documents no cancel call: a cancelled job's batches run to their end, unread.
        Box::pin(async { Ok(CancelOutcome::Unsupported) })
    }
}
