//! A provider's failures, classified by the provider into the kinds the engine acts on. The engine decides
//! "retry, split, wait or give up" from [`ErrorKind`] alone: it never looks at status codes or a provider's own
//! error codes, which only travel on into the job's error for people to read.

use std::fmt;
use std::time::Duration;

use batchd_core::result::code;
use batchd_core::{ApiCode, JobError};

/// What the engine should do about a failed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Try again after a backoff (honouring `retry_after`): timeouts, 5xx, overload, unreadable replies,
    /// connection errors.
    Transient,
    /// The provider asked batchd to slow down (429) or is overloaded or briefly unavailable (5xx, Anthropic's 529
    /// `overloaded_error`): its back-pressure. Try again after `retry_after` or a backoff, without using up an
    /// attempt: being throttled is not a failure of the job, and the batch or request is not given up on for it.
    RateLimited,
    /// A quota is used up (Cloudflare's daily free allocation, a provider's enqueued-token limit): not now, much
    /// later; like a rate limit, it uses no attempt.
    QuotaExhausted,
    /// A submit resuming after an uncertain create sent nothing: its look-up found a batch that may be the one that
    /// create made but cannot be checked until it ends (Anthropic shows custom ids only then). The look is tried
    /// again later, using no attempt and counting no possible duplicate; the earlier create stays uncertain.
    AwaitingLookUp,
    /// The batch is too large: split it, or fail the chunk if it cannot be split.
    TooLarge,
    /// A poll got "no such batch": the provider no longer has the batch or its results.
    NotFound,
    /// The remote batch as a whole failed; permanent for that batch.
    BatchFailed,
    /// A submit was refused because of its input: one bad item refuses the whole batch, so the batch can be split
    /// to isolate it. [`ApiError::refused_item`] names the item when the message does.
    InvalidInput,
    /// The model cannot run batch requests: no retry or split can help, the job fails.
    NotBatchable,
    /// The reply was larger than the client reads; it was not read. Permanent for that batch.
    ReplyTooLarge,
    /// The provider refused the request and will refuse it again (bad credentials, unknown model, any other 4xx).
    Permanent,
    /// The account cannot pay for batches (OpenAI's `insufficient_quota`, Anthropic's 402 `billing_error`): no wait
    /// helps until someone acts on the account, so the job fails at once, saying so (and an alert fires), rather
    /// than waiting silently until its deadline.
    Billing,
}

impl ErrorKind {
    /// A stable snake_case name, for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::RateLimited => "rate_limited",
            Self::QuotaExhausted => "quota_exhausted",
            Self::AwaitingLookUp => "awaiting_look_up",
            Self::TooLarge => "too_large",
            Self::NotFound => "not_found",
            Self::BatchFailed => "batch_failed",
            Self::InvalidInput => "invalid_input",
            Self::NotBatchable => "not_batchable",
            Self::ReplyTooLarge => "reply_too_large",
            Self::Permanent => "permanent",
            Self::Billing => "billing",
        }
    }

    /// Whether waiting is the whole answer (a rate limit, a quota, a look-up waiting for a batch to end): the step
    /// is tried again later and no attempt is used up.
    pub fn is_throttle(self) -> bool {
        matches!(self, Self::RateLimited | Self::QuotaExhausted | Self::AwaitingLookUp)
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed submit, poll, results download or cancel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// What the engine should do about it.
    pub kind: ErrorKind,
    /// The HTTP status of the reply; `None` when no reply arrived (connection error, timeout).
    pub http_status: Option<u16>,
    /// The provider's own error code, when the reply carried one.
    pub api_code: Option<ApiCode>,
    /// The provider's own message, or a description of the failure for humans (one line, bounded).
    pub message: String,
    /// How long the provider asked us to wait (`Retry-After`), when it did.
    pub retry_after: Option<Duration>,
    /// Whether a submit that failed may nevertheless have been accepted: the request was sent and no refusal came
    /// back (timeout or reset after sending, a gateway error page, a 2xx reply that could not be read). Retrying
    /// such a submit may run the batch twice. Always `false` for other calls.
    pub maybe_delivered: bool,
}

impl ApiError {
    /// Whether the same request may succeed later (transient failures, rate limits and quotas).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Transient | ErrorKind::RateLimited | ErrorKind::QuotaExhausted | ErrorKind::AwaitingLookUp
        )
    }

    /// The index of the request item an [`ErrorKind::InvalidInput`] refusal names (`/requests/N` in a schema
    /// message such as `oneOf at '/requests/3' not met`), when it names one.
    pub fn refused_item(&self) -> Option<usize> {
        let at = self.message.find("/requests/")? + "/requests/".len();
        let digits: String = self.message[at..].chars().take_while(char::is_ascii_digit).take(12).collect();
        digits.parse().ok()
    }

    /// What a failed look-up for the batch an uncertain create may have made means to the submit that ran it: the
    /// earlier create stays uncertain (`maybe_delivered`), and a failure worth retrying is a wait
    /// ([`ErrorKind::AwaitingLookUp`]: no attempt used, no possible duplicate counted), since no create was sent and
    /// the batch it looks for may be running, and billed. Seen in a chaos backlog: with looks counted as attempts,
    /// 5% of failed list calls over minutes of waiting used up a chunk's eight attempts and failed its job.
    pub fn into_failed_look(self) -> Self {
        let kind = if self.is_retryable() { ErrorKind::AwaitingLookUp } else { self.kind };
        Self { kind, maybe_delivered: true, ..self }
    }

    /// Whether this failed submit may have reached the provider anyway, so a retry may duplicate the batch.
    pub fn is_ambiguous_submit(&self) -> bool {
        self.maybe_delivered
    }

    /// The job's error when the engine gives up on this failure: `api_error`, `batch_failed`, `results_gone`, or
    /// `retries_exhausted` for kinds that were worth retrying, with the provider's code and status attached.
    pub fn to_job_error(&self) -> JobError {
        let (job_code, preface) = match self.kind {
            ErrorKind::Permanent => (code::API_ERROR, "the Batch API refused the batch"),
            ErrorKind::Billing => (
                code::API_ERROR,
                "the provider account cannot pay for batches (quota or credit used up: check the account's plan and \
                 billing), so nothing was run",
            ),
            ErrorKind::TooLarge => (code::API_ERROR, "the Batch API refused the batch as too large"),
            ErrorKind::BatchFailed => (code::BATCH_FAILED, "the remote batch failed"),
            ErrorKind::InvalidInput => (code::API_ERROR, "the Batch API refused the batch's input"),
            ErrorKind::NotBatchable => (
                code::MODEL_NOT_BATCHABLE,
                "the model does not support batch requests (asynchronous queueing), so nothing was run; use a model \
                 with the Batch capability",
            ),
            ErrorKind::ReplyTooLarge => (code::REPLY_TOO_LARGE, "the batch's reply was not read"),
            ErrorKind::NotFound => (code::RESULTS_GONE, "the Batch API no longer has the batch's results"),
            ErrorKind::QuotaExhausted => {
                (code::RETRIES_EXHAUSTED, "the Batch API quota stayed exhausted until batchd gave up")
            }
            ErrorKind::RateLimited if self.http_status.is_some_and(|status| status >= 500) => {
                (code::RETRIES_EXHAUSTED, "the Batch API stayed overloaded or unavailable until batchd gave up")
            }
            ErrorKind::RateLimited => {
                (code::RETRIES_EXHAUSTED, "the Batch API kept rate limiting until batchd gave up")
            }
            ErrorKind::AwaitingLookUp => (
                code::RETRIES_EXHAUSTED,
                "a batch an uncertain create may have made had not ended, so it could not be checked",
            ),
            ErrorKind::Transient => (code::RETRIES_EXHAUSTED, "the Batch API kept failing; the last error was"),
        };
        JobError {
            code: job_code.to_owned(),
            message: format!("{preface}: {}{}", self.message, self.details()),
            api_code: self.api_code.clone(),
            http_status: self.http_status,
        }
    }

    /// ` (code 10000, HTTP 401)`, ` (HTTP 502)` or nothing.
    fn details(&self) -> String {
        match (&self.api_code, self.http_status) {
            (Some(api_code), Some(status)) => format!(" (code {api_code}, HTTP {status})"),
            (Some(api_code), None) => format!(" (code {api_code})"),
            (None, Some(status)) => format!(" (HTTP {status})"),
            (None, None) => String::new(),
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            ErrorKind::Transient => "transient batch api error",
            ErrorKind::RateLimited => "batch api rate limit",
            ErrorKind::QuotaExhausted => "batch api quota exhausted",
            ErrorKind::AwaitingLookUp => "waiting to check a batch an uncertain create may have made",
            ErrorKind::TooLarge => "batch too large",
            ErrorKind::NotFound => "batch not found",
            ErrorKind::BatchFailed => "batch failed",
            ErrorKind::InvalidInput => "batch api refused the batch's input",
            ErrorKind::NotBatchable => "model does not support batch requests",
            ErrorKind::ReplyTooLarge => "batch api reply too large",
            ErrorKind::Permanent => "batch api refused the request",
            ErrorKind::Billing => "provider account out of quota or credit",
        };
        write!(f, "{what}{}: {}", self.details(), self.message)
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(kind: ErrorKind) -> ApiError {
        ApiError {
            kind,
            http_status: Some(429),
            api_code: Some(ApiCode::Text("rate_limit_error".into())),
            message: "slow down".into(),
            retry_after: None,
            maybe_delivered: false,
        }
    }

    #[test]
    fn a_failed_look_stays_uncertain_and_waits_when_worth_retrying() {
        let reset = ApiError { http_status: None, ..error(ErrorKind::Transient) }.into_failed_look();
        assert_eq!(reset.kind, ErrorKind::AwaitingLookUp);
        assert!(reset.maybe_delivered);
        let refused = error(ErrorKind::Permanent).into_failed_look();
        assert_eq!(refused.kind, ErrorKind::Permanent, "a refusal is not a wait");
        assert!(refused.maybe_delivered);
    }

    #[test]
    fn throttles_use_no_attempt_and_are_retryable() {
        for kind in [ErrorKind::RateLimited, ErrorKind::QuotaExhausted, ErrorKind::AwaitingLookUp] {
            assert!(kind.is_throttle() && error(kind).is_retryable(), "{kind}");
        }
        assert!(!ErrorKind::Transient.is_throttle() && error(ErrorKind::Transient).is_retryable());
        assert!(!error(ErrorKind::Permanent).is_retryable());
    }

    #[test]
    fn a_textual_provider_code_reaches_the_job_error_as_text() {
        let job_error = error(ErrorKind::RateLimited).to_job_error();
        assert_eq!(job_error.code, code::RETRIES_EXHAUSTED);
        assert_eq!(job_error.api_code, Some(ApiCode::Text("rate_limit_error".into())));
        assert!(job_error.message.ends_with("slow down (code rate_limit_error, HTTP 429)"), "{}", job_error.message);
        assert_eq!(
            serde_json::to_value(&job_error).expect("serialises")["api_code"],
            serde_json::json!("rate_limit_error")
        );
    }

    #[test]
    fn an_overload_that_outlasts_the_job_says_so() {
        let overloaded = ApiError { http_status: Some(529), ..error(ErrorKind::RateLimited) }.to_job_error();
        assert!(
            overloaded.message.starts_with("the Batch API stayed overloaded or unavailable"),
            "{}",
            overloaded.message
        );
    }
}
