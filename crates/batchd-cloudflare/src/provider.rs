//! Cloudflare Workers AI as a [`Provider`]: a batch is one `POST ?queueRequest=true` of the items, its results
//! come inside the poll reply, there is no cancel call, and rate limits are shared per account and task type
//! (`[rate_limits]`).

use std::time::Duration;

use batchd_core::{JobOutput, ModelName, RequestId};
use batchd_provider::{
    ApiError, BatchLimits, BodyShape, Call, CancelOutcome, ErrorKind, PendingStatus, Polled, Provider, RateBucket,
    RemoteBatch, ReplyHold, SubmitBatch, Submitted,
};
use futures::future::BoxFuture;

use crate::rate_limits::{RateLimitSettings, rate_bucket};
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
    /// The account id (part of every rate-limit bucket).
    account_id: String,
    /// The shared limits per task type and model.
    rate_limits: RateLimitSettings,
    /// What one batch may hold.
    limits: BatchLimits,
}

impl CloudflareProvider {
    /// The provider for `account_id` through `client`, with batches of at most `max_body_bytes` (the API's
    /// documented limit is 10 MB) and `max_items` items.
    pub fn new(
        client: BatchClient,
        account_id: impl Into<String>,
        rate_limits: RateLimitSettings,
        max_body_bytes: usize,
        max_items: Option<usize>,
    ) -> Self {
        Self {
            client,
            account_id: account_id.into(),
            rate_limits,
            limits: BatchLimits { max_body_bytes, max_items, body: BODY_SHAPE },
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
    fn name(&self) -> &'static str {
        batchd_core::ids::CLOUDFLARE
    }

    fn limits(&self) -> BatchLimits {
        self.limits
    }

    fn rate_bucket(&self, model: &ModelName, call: Call) -> Option<RateBucket> {
        if call == Call::Poll && !self.rate_limits.limit_polls {
            return None;
        }
        let (bucket, limit) = rate_bucket(&self.account_id, model.as_str(), &self.rate_limits)?;
        let name = if call == Call::Poll { format!("poll:{bucket}") } else { bucket };
        Some(RateBucket {
            name,
            interval: Duration::from_secs(self.rate_limits.window_secs).div_f64(f64::from(limit)),
            burst: self.rate_limits.burst,
        })
    }

    fn submit<'a>(&'a self, batch: SubmitBatch<'a>) -> BoxFuture<'a, Result<Submitted, ApiError>> {
        Box::pin(async move {
            let submitted = self.client.submit(batch.model, batch.items).await?;
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
