//! OpenAI's failures classified once into the kinds the engine acts on ([`ErrorKind`]): 429, and 5xx on an upload
//! or a create, are the API's back-pressure, waits that use no attempt (`insufficient_quota`, also a 429, fails
//! fast as a billing problem), 408/409, other 5xx and broken connections are transient, 413 and `file_too_large` are
//! too large, 404 while polling or downloading means the batch or file is gone, and every other 4xx is permanent.
//! A create whose outcome is unknown (timeout or reset after sending, a 5xx, an unreadable 2xx) is marked
//! `maybe_delivered`, so the engine resumes it by looking the batch up instead of creating it again.
//! A failed request (no complete reply) is classified as at every provider, by `batchd_provider::http`.

use std::time::Duration;

pub(crate) use batchd_provider::text::one_line;

use batchd_core::ApiCode;
use batchd_provider::{ApiError, ErrorKind};

use crate::wire::ErrorEnvelope;

/// Which call failed; a 404 or a lost reply means different things for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    /// `POST /files`.
    Upload,
    /// `POST /batches`.
    Create,
    /// `GET /batches/{id}`.
    Retrieve,
    /// `GET /batches`.
    List,
    /// `GET /files/{id}/content`.
    Content,
    /// `DELETE /files/{id}`.
    Delete,
    /// `POST /batches/{id}/cancel`.
    Cancel,
}

/// Longest provider message kept, in characters.
pub(crate) const MESSAGE_CHARS: usize = 2048;

/// The kind of a non-2xx reply.
pub(crate) fn classify(operation: Operation, http_status: u16, code: Option<&str>) -> ErrorKind {
    match (http_status, code) {
        (_, Some("insufficient_quota")) => ErrorKind::Billing,
        (429, _) => ErrorKind::RateLimited,
        // The API's back-pressure on work not yet at the API: an overloaded or briefly unavailable API is waited
        // out, never an attempt. Elsewhere (a poll, a download) a 5xx is transient: a batch that exists is never
        // given up on for it either, and its polls back off to `poll.max_interval_ms` as failures add up.
        (500..=599, _) if matches!(operation, Operation::Upload | Operation::Create) => ErrorKind::RateLimited,
        (413, _) | (_, Some("file_too_large")) => ErrorKind::TooLarge,
        (404, _) if matches!(operation, Operation::Retrieve | Operation::Content | Operation::Delete) => {
            ErrorKind::NotFound
        }
        (408 | 409 | 500..=599, _) => ErrorKind::Transient,
        _ => ErrorKind::Permanent,
    }
}

/// The error of a non-2xx reply, from its `{"error": {...}}` envelope when it has one.
pub(crate) fn from_reply(
    operation: Operation,
    http_status: u16,
    retry_after: Option<Duration>,
    body: &[u8],
) -> ApiError {
    let envelope = serde_json::from_slice::<ErrorEnvelope>(body).ok().and_then(|envelope| envelope.error);
    let code = envelope.as_ref().and_then(|error| match &error.code {
        Some(serde_json::Value::String(code)) => Some(code.clone()),
        Some(serde_json::Value::Number(code)) => Some(code.to_string()),
        _ => error.kind.clone(),
    });
    let message = envelope
        .and_then(|error| error.message)
        .filter(|message| !message.trim().is_empty())
        .unwrap_or_else(|| format!("HTTP {http_status}: {}", snippet(body)));
    let kind = classify(operation, http_status, code.as_deref());
    ApiError {
        kind,
        http_status: Some(http_status),
        api_code: code.map(|code| ApiCode::Text(one_line(&code, 64))),
        message: one_line(&message, MESSAGE_CHARS),
        retry_after,
        maybe_delivered: operation == Operation::Create && (http_status >= 500 || http_status == 408),
    }
}

/// The error of a 2xx reply that is not what the API documents. A create with such a reply may have worked.
pub(crate) fn unreadable(operation: Operation, http_status: u16, what: &str, body: &[u8]) -> ApiError {
    ApiError {
        kind: ErrorKind::Transient,
        http_status: Some(http_status),
        api_code: None,
        message: format!("{what}: {}", snippet(body)),
        retry_after: None,
        maybe_delivered: operation == Operation::Create,
    }
}

/// A failure batchd itself detects (no usable reply).
pub(crate) fn local(kind: ErrorKind, message: impl Into<String>) -> ApiError {
    ApiError {
        kind,
        http_status: None,
        api_code: None,
        message: message.into(),
        retry_after: None,
        maybe_delivered: false,
    }
}

/// The start of a body for a message, one line.
pub(crate) fn snippet(body: &[u8]) -> String {
    if body.is_empty() {
        return "(empty)".to_owned();
    }
    one_line(&String::from_utf8_lossy(&body[..body.len().min(2048)]), 200)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_classified_by_status_and_code() {
        use Operation::*;
        assert_eq!(classify(Create, 429, Some("rate_limit_exceeded")), ErrorKind::RateLimited);
        assert_eq!(classify(Create, 429, Some("insufficient_quota")), ErrorKind::Billing, "not a wait: fails fast");
        assert_eq!(classify(Upload, 400, Some("file_too_large")), ErrorKind::TooLarge);
        assert_eq!(classify(Retrieve, 404, None), ErrorKind::NotFound);
        assert_eq!(classify(Create, 404, None), ErrorKind::Permanent, "an unknown input file");
        assert_eq!(classify(Create, 500, Some("server_error")), ErrorKind::RateLimited, "back-pressure: a wait");
        assert_eq!(classify(Upload, 503, None), ErrorKind::RateLimited);
        assert_eq!(classify(Content, 503, None), ErrorKind::Transient, "a batch's download backs off");
        assert_eq!(classify(Retrieve, 408, None), ErrorKind::Transient);
        assert_eq!(classify(Create, 401, Some("invalid_api_key")), ErrorKind::Permanent);
    }

    #[test]
    fn an_error_envelope_gives_code_message_and_whether_a_create_may_have_worked() {
        let body = br#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
        let error = from_reply(Operation::Create, 429, Some(Duration::from_secs(2)), body);
        assert_eq!(error.kind, ErrorKind::RateLimited);
        assert_eq!(error.api_code, Some(ApiCode::Text("rate_limit_exceeded".into())));
        assert_eq!(error.message, "Rate limit reached");
        assert!(!error.maybe_delivered, "a 429 created nothing");
        let lost = from_reply(Operation::Create, 502, None, b"<html>bad gateway</html>");
        assert!(lost.maybe_delivered && lost.kind == ErrorKind::RateLimited);
        assert!(lost.message.contains("bad gateway"));
        assert!(!from_reply(Operation::Upload, 502, None, b"").maybe_delivered);
    }
}
