//! The Batch API's failures, classified once into the kinds the daemon acts on.
//!
//! Every HTTP status, API error code and unreadable reply is mapped here, by [`classify`] and the constructors
//! below, following the error table of the API reference (a transport failure, the same at every provider, by
//! `batchd_provider::http::transport_error`). The daemon then decides
//! "retry or give up" from [`ErrorKind`] alone and never looks at status codes itself.
//!
//! Long because its tests walk the reference's error table row by row, with the transport failures and unreadable
//! replies beside them: the table is one concern and reads best whole.

use std::time::Duration;

use batchd_core::ApiCode;

use crate::wire;

pub(crate) use batchd_provider::text::one_line;

pub use batchd_provider::{ApiError, ErrorKind};

/// API error codes the classification depends on.
mod api_code {
    /// Request too large.
    pub const TOO_LARGE: i64 = 3006;
    /// The request timed out.
    pub const TIMEOUT: i64 = 3007;
    /// The request was aborted.
    pub const ABORTED: i64 = 3008;
    /// The daily free allocation is used up.
    pub const DAILY_ALLOCATION: i64 = 3036;
    /// Out of capacity, try again.
    pub const OUT_OF_CAPACITY: i64 = 3040;
    /// Model execution failed: the whole batch failed.
    pub const MODEL_EXECUTION_FAILED: i64 = 5001;
    /// Incomplete request (`requests` missing or empty): the batch as a whole is wrong, not one item.
    pub const INCOMPLETE_REQUEST: i64 = 3003;
    /// Invalid data: an item does not fit the model's schema.
    pub const INVALID_DATA: i64 = 5004;
    /// Bad input (`AiError: Bad input: Error: oneOf at '/requests/N' not met`, seen live).
    pub const BAD_INPUT: i64 = 5006;
    /// The model does not support request queuing (batch requests).
    pub const NOT_BATCHABLE: i64 = 8007;
}

/// Which request failed; a 404 means different things for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    /// Sending a new batch.
    Submit,
    /// Asking for a batch's status or results.
    Poll,
    /// Pulling messages from a Cloudflare Queue (batch events).
    Pull,
    /// Acknowledging pulled messages.
    Ack,
    /// Reading the model catalog (`ai/models/search`).
    Catalog,
    /// Listing, creating or updating event subscriptions.
    Subscriptions,
}

/// Longest body excerpt quoted in an error message, in characters.
const SNIPPET_CHARS: usize = 512;

/// Longest API error message kept, in characters: generous, so a schema error listing every mismatch survives
/// into the result and the ledger, and still bounded, so a hostile reply cannot fill them.
const MESSAGE_CHARS: usize = 4096;

/// Classifies a reply by its HTTP status, the API's error code and message (the reference's error table).
///
/// The code wins over the status where it is specific (5001, 3006, 3036, 3040, 3007, 3008, 8007); a submit refused
/// with a 4xx because of its input (5004, 5006, or a schema message `oneOf ... not met` or `anyOf ... not met`; 3003 is the batch as a
/// whole) is invalid input, to be split; otherwise 429 is a rate limit, 408 is transient, 413 is too large, 404 on a poll
/// means the results are gone, 5xx is transient and everything else (401, 403, 400, 404 on submit, unexpected
/// 3xx, a 2xx with `success:false`) is permanent.
pub(crate) fn classify(operation: Operation, http_status: u16, api_code: Option<i64>, message: &str) -> ErrorKind {
    let lower = message.to_ascii_lowercase();
    let not_batchable = api_code == Some(api_code::NOT_BATCHABLE) || lower.contains("does not support request queu");
    let names_input = matches!(api_code, Some(api_code::INVALID_DATA | api_code::BAD_INPUT))
        || ((lower.contains("oneof") || lower.contains("anyof")) && lower.contains("not met"));
    match (http_status, api_code) {
        (_, Some(api_code::MODEL_EXECUTION_FAILED)) => ErrorKind::BatchFailed,
        (413, _) | (_, Some(api_code::TOO_LARGE)) => ErrorKind::TooLarge,
        _ if not_batchable && operation == Operation::Submit => ErrorKind::NotBatchable,
        (_, Some(api_code::DAILY_ALLOCATION)) => ErrorKind::QuotaExhausted,
        (429, _) => ErrorKind::RateLimited,
        (408, _) | (_, Some(api_code::OUT_OF_CAPACITY | api_code::TIMEOUT | api_code::ABORTED)) => ErrorKind::Transient,
        (404, _) if operation == Operation::Poll => ErrorKind::NotFound,
        (400..=499, code)
            if operation == Operation::Submit && names_input && code != Some(api_code::INCOMPLETE_REQUEST) =>
        {
            ErrorKind::InvalidInput
        }
        (500..=599, _) => ErrorKind::Transient,
        _ => ErrorKind::Permanent,
    }
}

/// Whether a submit that got this reply may have been accepted anyway: a timeout reported by the server, or a
/// server-side failure that does not say the batch was refused. Over-counting possible duplicates is the safe side.
fn submit_maybe_delivered(http_status: u16, api_code: Option<i64>) -> bool {
    match (http_status, api_code) {
        (_, Some(api_code::MODEL_EXECUTION_FAILED)) => false,
        (408, _) | (_, Some(api_code::TIMEOUT | api_code::ABORTED)) => true,
        (500..=599, _) => true,
        _ => false,
    }
}

/// The constructors of the provider-neutral [`ApiError`] from what the Cloudflare API answered.
pub(crate) trait Build: Sized {
    /// The error for a reply larger than the client accepts (`cloudflare.max_reply_bytes`); `bytes` is what the
    /// reply declared or what had arrived when reading stopped.
    fn reply_too_large(operation: Operation, http_status: u16, bytes: u64, limit: usize) -> Self;
    /// The error for a non-2xx reply, or a 2xx reply whose envelope says `success:false`.
    fn from_reply(operation: Operation, http_status: u16, retry_after: Option<Duration>, body: &[u8]) -> Self;
    /// The error for a 2xx reply that is not what the API documents (unreadable JSON, unexpected shape).
    /// A submit with such a reply may well have been accepted.
    fn unreadable_reply(operation: Operation, http_status: u16, what: &str, body: &[u8]) -> Self;
}

impl Build for ApiError {
    /// The error for a reply larger than the client accepts (`cloudflare.max_reply_bytes`); `bytes` is what the
    /// reply declared or what had arrived when reading stopped.
    fn reply_too_large(operation: Operation, http_status: u16, bytes: u64, limit: usize) -> Self {
        let message = format!(
            "the reply is {bytes} bytes or more, over the limit of {limit} bytes (cloudflare.max_reply_bytes); \
             raise the limit to read it"
        );
        Self {
            // A submit's reply is tiny when it is what the API documents: one this large is a broken reply that
            // may still have queued the batch.
            kind: if operation == Operation::Submit { ErrorKind::Transient } else { ErrorKind::ReplyTooLarge },
            http_status: Some(http_status),
            api_code: None,
            message,
            retry_after: None,
            maybe_delivered: operation == Operation::Submit,
        }
    }

    /// The error for a non-2xx reply, or a 2xx reply whose envelope says `success:false`.
    fn from_reply(operation: Operation, http_status: u16, retry_after: Option<Duration>, body: &[u8]) -> Self {
        let (api_code, message, kind) = match serde_json::from_slice::<wire::ErrorEnvelope>(body) {
            Ok(envelope) => {
                let (api_code, message) = wire::first_error(envelope.errors.as_ref());
                let message = message
                    // A message of nothing but blanks and control characters is no message once made one line.
                    .filter(|message| message.chars().any(|c| !c.is_whitespace() && !c.is_control()))
                    .unwrap_or_else(|| format!("HTTP {http_status} without an error message: {}", body_snippet(body)));
                let kind = classify(operation, http_status, api_code, &message);
                (api_code, message, kind)
            }
            Err(_) => {
                let message = format!("HTTP {http_status} with a non-JSON body: {}", body_snippet(body));
                // A 2xx that cannot be read is a broken reply, worth another try; otherwise the status decides.
                let kind = if (200..300).contains(&http_status) {
                    ErrorKind::Transient
                } else {
                    classify(operation, http_status, None, "")
                };
                (None, message, kind)
            }
        };
        Self {
            kind,
            http_status: Some(http_status),
            api_code: api_code.map(ApiCode::Number),
            message: one_line(&message, MESSAGE_CHARS),
            retry_after,
            maybe_delivered: operation == Operation::Submit && submit_maybe_delivered(http_status, api_code),
        }
    }

    /// The error for a 2xx reply that is not what the API documents (unreadable JSON, unexpected shape).
    /// A submit with such a reply may well have been accepted.
    fn unreadable_reply(operation: Operation, http_status: u16, what: &str, body: &[u8]) -> Self {
        Self {
            kind: ErrorKind::Transient,
            http_status: Some(http_status),
            api_code: None,
            message: format!("{what}: {}", body_snippet(body)),
            retry_after: None,
            maybe_delivered: operation == Operation::Submit,
        }
    }
}

/// A short, single-line excerpt of a reply body for an error message: an HTML page's `<title>` when it has one,
/// otherwise its start, whitespace collapsed, at most 200 characters.
pub(crate) fn body_snippet(body: &[u8]) -> String {
    if body.is_empty() {
        return "(empty)".to_owned();
    }
    let text = String::from_utf8_lossy(body);
    let title = text.find("<title>").and_then(|start| {
        let rest = &text[start + "<title>".len()..];
        rest.find("</title>").map(|end| &rest[..end])
    });
    one_line(title.filter(|title| !title.trim().is_empty()).unwrap_or(&text), SNIPPET_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;

    use Operation::{Poll, Submit};

    /// Every row of the reference's error table, for both operations where they differ.
    #[test]
    fn classification_follows_the_reference_table() {
        let rows: &[(u16, Option<i64>, ErrorKind, ErrorKind)] = &[
            // HTTP, code, on submit, on poll
            (401, Some(10000), ErrorKind::Permanent, ErrorKind::Permanent),
            (403, Some(10000), ErrorKind::Permanent, ErrorKind::Permanent),
            (404, Some(7003), ErrorKind::Permanent, ErrorKind::NotFound),
            (404, None, ErrorKind::Permanent, ErrorKind::NotFound),
            (400, Some(5007), ErrorKind::Permanent, ErrorKind::Permanent),
            (400, Some(3042), ErrorKind::Permanent, ErrorKind::Permanent),
            (400, Some(3003), ErrorKind::Permanent, ErrorKind::Permanent),
            (400, Some(5004), ErrorKind::InvalidInput, ErrorKind::Permanent),
            (400, Some(5006), ErrorKind::InvalidInput, ErrorKind::Permanent),
            (422, Some(5006), ErrorKind::InvalidInput, ErrorKind::Permanent),
            (400, Some(8007), ErrorKind::NotBatchable, ErrorKind::Permanent),
            (403, Some(3023), ErrorKind::Permanent, ErrorKind::Permanent),
            (403, Some(5016), ErrorKind::Permanent, ErrorKind::Permanent),
            (403, Some(5018), ErrorKind::Permanent, ErrorKind::Permanent),
            (403, Some(3041), ErrorKind::Permanent, ErrorKind::Permanent),
            (403, Some(5035), ErrorKind::Permanent, ErrorKind::Permanent),
            (413, Some(3006), ErrorKind::TooLarge, ErrorKind::TooLarge),
            (413, None, ErrorKind::TooLarge, ErrorKind::TooLarge),
            (400, Some(3006), ErrorKind::TooLarge, ErrorKind::TooLarge),
            (408, Some(3007), ErrorKind::Transient, ErrorKind::Transient),
            (408, Some(3008), ErrorKind::Transient, ErrorKind::Transient),
            (408, None, ErrorKind::Transient, ErrorKind::Transient),
            (429, Some(3040), ErrorKind::RateLimited, ErrorKind::RateLimited),
            (429, None, ErrorKind::RateLimited, ErrorKind::RateLimited),
            (429, Some(3036), ErrorKind::QuotaExhausted, ErrorKind::QuotaExhausted),
            (500, Some(5001), ErrorKind::BatchFailed, ErrorKind::BatchFailed),
            (500, None, ErrorKind::Transient, ErrorKind::Transient),
            (500, Some(7000), ErrorKind::Transient, ErrorKind::Transient),
            (502, None, ErrorKind::Transient, ErrorKind::Transient),
            (503, None, ErrorKind::Transient, ErrorKind::Transient),
            (504, None, ErrorKind::Transient, ErrorKind::Transient),
            (400, None, ErrorKind::Permanent, ErrorKind::Permanent),
            (422, Some(1234), ErrorKind::Permanent, ErrorKind::Permanent),
            (301, None, ErrorKind::Permanent, ErrorKind::Permanent),
            (200, Some(1234), ErrorKind::Permanent, ErrorKind::Permanent),
        ];
        for &(status, api_code, on_submit, on_poll) in rows {
            assert_eq!(classify(Submit, status, api_code, ""), on_submit, "submit {status} {api_code:?}");
            assert_eq!(classify(Poll, status, api_code, ""), on_poll, "poll {status} {api_code:?}");
        }
    }

    #[test]
    fn messages_classify_where_codes_are_missing_or_unknown() {
        let schema = "AiError: Bad input: Error: oneOf at '/requests/12' not met, 0 matches: required properties";
        assert_eq!(classify(Submit, 400, None, schema), ErrorKind::InvalidInput);
        assert_eq!(classify(Submit, 400, Some(1234), schema), ErrorKind::InvalidInput);
        assert_eq!(classify(Submit, 400, Some(3003), schema), ErrorKind::Permanent, "3003 is the whole batch");
        assert_eq!(classify(Submit, 500, None, schema), ErrorKind::Transient, "only 4xx names the input");
        assert_eq!(classify(Poll, 400, None, schema), ErrorKind::Permanent);
        // Newer model schemas use anyOf; refusals come with or without a code and with or without a pointer.
        for any_of in ["AiError: Bad input: Error: anyOf at '/requests/3' not met", "anyOf at '/' not met"] {
            assert_eq!(classify(Submit, 400, None, any_of), ErrorKind::InvalidInput, "{any_of}");
            assert_eq!(classify(Submit, 400, Some(5006), any_of), ErrorKind::InvalidInput, "{any_of}");
        }
        let queuing = "@cf/x/y does not support request queuing";
        assert_eq!(classify(Submit, 400, None, queuing), ErrorKind::NotBatchable);
        assert_eq!(
            classify(Submit, 403, Some(9999), "Model Does Not Support Request Queueing"),
            ErrorKind::NotBatchable
        );
        let error = ApiError::from_reply(
            Submit,
            400,
            None,
            br#"{"result":{},"success":false,"errors":{"message":"AiError: Bad input: Error: oneOf at '/requests/7' not met","code":5006},"messages":[]}"#,
        );
        assert_eq!(
            (error.kind, error.api_code.clone()),
            (ErrorKind::InvalidInput, Some(ApiCode::Number(5006))),
            "errors as one object (seen live)"
        );
        assert_eq!(error.refused_item(), Some(7));
        assert!(!error.is_ambiguous_submit());
        let whole = ApiError { message: "oneOf at '/' not met".into(), ..error.clone() };
        assert_eq!(whole.refused_item(), None, "no pointer: the engine bisects");
        let any_of = ApiError { message: "anyOf at '/requests/3' not met".into(), ..error.clone() };
        assert_eq!(any_of.refused_item(), Some(3));
        let job_error =
            ApiError::from_reply(Submit, 400, None, br#"{"errors":[{"code":"8007","message":"no queue"}]}"#)
                .to_job_error();
        assert_eq!(job_error.code, "model_not_batchable");
        assert_eq!((job_error.api_code.clone(), job_error.http_status), (Some(ApiCode::Number(8007)), Some(400)));
        assert!(job_error.message.contains("does not support batch requests"), "{}", job_error.message);
    }

    #[test]
    fn long_api_messages_are_kept_up_to_a_generous_bound() {
        let long = "x".repeat(3000);
        let body = format!(r#"{{"errors":[{{"code":5006,"message":"{long}"}}]}}"#);
        let error = ApiError::from_reply(Submit, 400, None, body.as_bytes());
        assert_eq!(error.message.len(), 3000, "a 3,000-character schema error is kept whole");
        let huge = format!(r#"{{"errors":[{{"code":5006,"message":"{}"}}]}}"#, "y".repeat(100_000));
        let error = ApiError::from_reply(Submit, 400, None, huge.as_bytes());
        assert_eq!(error.message.chars().count(), MESSAGE_CHARS + 1, "cut, with a marker");
        assert!(error.message.ends_with('…'));
    }

    #[test]
    fn only_transient_and_quota_errors_are_retryable() {
        for (kind, retryable) in [
            (ErrorKind::Transient, true),
            (ErrorKind::QuotaExhausted, true),
            (ErrorKind::TooLarge, false),
            (ErrorKind::NotFound, false),
            (ErrorKind::BatchFailed, false),
            (ErrorKind::Permanent, false),
        ] {
            let error = ApiError {
                kind,
                http_status: None,
                api_code: None,
                message: "x".into(),
                retry_after: None,
                maybe_delivered: false,
            };
            assert_eq!(error.is_retryable(), retryable, "{kind}");
        }
    }

    #[test]
    fn the_error_envelope_gives_code_and_message() {
        let body = br#"{"result":null,"success":false,"errors":[{"code":10000,"message":"Authentication error"},{"code":1,"message":"second"}],"messages":[]}"#;
        let error = ApiError::from_reply(Submit, 401, None, body);
        assert_eq!(error.kind, ErrorKind::Permanent);
        assert_eq!(error.api_code.clone(), Some(ApiCode::Number(10000)));
        assert_eq!(error.http_status, Some(401));
        assert_eq!(error.message, "Authentication error");
        assert!(!error.is_ambiguous_submit());
        assert_eq!(error.to_string(), "batch api refused the request (code 10000, HTTP 401): Authentication error");
        let job_error = error.to_job_error();
        assert_eq!(job_error.code, "api_error");
        assert_eq!(job_error.message, "the Batch API refused the batch: Authentication error (code 10000, HTTP 401)");
        assert_eq!(job_error.api_code.clone(), Some(ApiCode::Number(10000)));
        assert_eq!(job_error.http_status, Some(401));
    }

    #[test]
    fn codes_given_as_strings_are_read_too() {
        let body = br#"{"success":false,"errors":[{"code":"3040","message":"Capacity temporarily exceeded, please try again."}]}"#;
        let error = ApiError::from_reply(Poll, 429, Some(Duration::from_secs(3)), body);
        assert_eq!((error.kind, error.api_code.clone()), (ErrorKind::RateLimited, Some(ApiCode::Number(3040))));
        assert_eq!(error.retry_after, Some(Duration::from_secs(3)));
    }

    #[test]
    fn job_error_codes_follow_the_kind() {
        let cases = [
            (500, br#"{"errors":[{"code":5001,"message":"Model execution failed"}]}"#.as_slice(), "batch_failed"),
            (404, br#"{"errors":[{"code":7003,"message":"Could not route"}]}"#.as_slice(), "results_gone"),
            (413, br#"{"errors":[{"code":3006,"message":"Request is too large"}]}"#.as_slice(), "api_error"),
            (429, br#"{"errors":[{"code":3036,"message":"daily allocation"}]}"#.as_slice(), "retries_exhausted"),
            (502, b"<html>bad gateway</html>".as_slice(), "retries_exhausted"),
        ];
        for (status, body, job_code) in cases {
            assert_eq!(ApiError::from_reply(Poll, status, None, body).to_job_error().code, job_code, "{status}");
        }
        let failed = ApiError::from_reply(Poll, 500, None, cases[0].1).to_job_error();
        assert_eq!(failed.message, "the remote batch failed: Model execution failed (code 5001, HTTP 500)");
    }

    #[test]
    fn html_error_pages_are_transient_with_a_bounded_one_line_snippet() {
        let page = format!(
            "<!DOCTYPE html>\n<html>\n<head>\n<title>api.cloudflare.com | 502:\n Bad gateway</title></head><body>{}</body></html>",
            "x".repeat(5000)
        );
        let error = ApiError::from_reply(Submit, 502, None, page.as_bytes());
        assert_eq!(error.kind, ErrorKind::Transient);
        assert_eq!(error.api_code.clone(), None);
        assert_eq!(error.message, "HTTP 502 with a non-JSON body: api.cloudflare.com | 502: Bad gateway");
        assert!(error.is_ambiguous_submit(), "a gateway page does not say the batch was refused");
        assert!(!ApiError::from_reply(Poll, 502, None, page.as_bytes()).is_ambiguous_submit());

        let text = format!("line one\nline two {}", "y".repeat(1000));
        let error = ApiError::from_reply(Poll, 503, None, text.as_bytes());
        assert!(!error.message.contains('\n'));
        let snippet = error.message.trim_start_matches("HTTP 503 with a non-JSON body: ");
        assert!(snippet.starts_with("line one line two yyy"));
        assert_eq!(snippet.chars().count(), SNIPPET_CHARS + 1, "cut, with the ellipsis");
    }

    #[test]
    fn non_json_client_errors_are_classified_by_status() {
        assert_eq!(ApiError::from_reply(Submit, 401, None, b"Unauthorized").kind, ErrorKind::Permanent);
        assert_eq!(ApiError::from_reply(Submit, 413, None, b"<html>413</html>").kind, ErrorKind::TooLarge);
        assert_eq!(ApiError::from_reply(Poll, 404, None, b"not found").kind, ErrorKind::NotFound);
        assert_eq!(ApiError::from_reply(Poll, 200, None, b"<html>").kind, ErrorKind::Transient);
        let empty = ApiError::from_reply(Poll, 500, None, b"");
        assert_eq!(empty.message, "HTTP 500 with a non-JSON body: (empty)");
    }

    #[test]
    fn json_without_errors_keeps_a_snippet() {
        let error = ApiError::from_reply(Poll, 400, None, br#"{"success":false}"#);
        assert_eq!(error.kind, ErrorKind::Permanent);
        assert_eq!(error.message, r#"HTTP 400 without an error message: {"success":false}"#);
    }

    #[test]
    fn submits_that_may_have_been_accepted_are_flagged() {
        assert!(ApiError::from_reply(Submit, 504, None, b"").is_ambiguous_submit());
        assert!(
            ApiError::from_reply(Submit, 408, None, br#"{"errors":[{"code":3007,"message":"t"}]}"#)
                .is_ambiguous_submit()
        );
        assert!(
            !ApiError::from_reply(Submit, 500, None, br#"{"errors":[{"code":5001,"message":"m"}]}"#)
                .is_ambiguous_submit()
        );
        assert!(
            !ApiError::from_reply(Submit, 429, None, br#"{"errors":[{"code":3040,"message":"c"}]}"#)
                .is_ambiguous_submit()
        );
        assert!(
            !ApiError::from_reply(Submit, 400, None, br#"{"errors":[{"code":5004,"message":"d"}]}"#)
                .is_ambiguous_submit()
        );
    }
}
