//! The [`ApiError`]s every provider's client builds the same way, written once: a refusal batchd decided on itself
//! (nothing was sent), a 2xx reply that is not what the API documents, and a reply over the size a setting allows.

use crate::{ApiError, ErrorKind};

impl ApiError {
    /// An error batchd decided on itself: nothing was sent (or nothing more is to be sent), so nothing was
    /// created.
    pub fn decided(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            http_status: None,
            api_code: None,
            message: message.into(),
            retry_after: None,
            maybe_delivered: false,
        }
    }

    /// A 2xx reply that is not what the API documents: worth retrying; a create's (`creates`) may have created
    /// its batch.
    pub fn undocumented_reply(creates: bool, http_status: u16, what: &str) -> Self {
        Self {
            kind: ErrorKind::Transient,
            http_status: Some(http_status),
            api_code: None,
            message: what.to_owned(),
            retry_after: None,
            maybe_delivered: creates,
        }
    }

    /// Results of `bytes` bytes or more, over the `limit` the setting `setting` allows: not read.
    pub fn reply_over_limit(http_status: u16, bytes: u64, limit: usize, setting: &str) -> Self {
        Self {
            kind: ErrorKind::ReplyTooLarge,
            http_status: Some(http_status),
            api_code: None,
            message: format!(
                "the results are {bytes} bytes or more, over the limit of {limit} bytes ({setting}); raise the limit \
                 to read them"
            ),
            retry_after: None,
            maybe_delivered: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_form_says_what_the_engine_does_with_it() {
        let decided = ApiError::decided(ErrorKind::Permanent, "no such endpoint");
        assert_eq!((decided.http_status, decided.maybe_delivered), (None, false));
        assert!(ApiError::undocumented_reply(true, 200, "no id").maybe_delivered, "a create's may have created");
        assert!(!ApiError::undocumented_reply(false, 200, "no id").maybe_delivered);
        let over = ApiError::reply_over_limit(200, 10, 5, "gemini.max_result_bytes");
        assert_eq!(over.kind, ErrorKind::ReplyTooLarge);
        assert!(over.message.contains("(gemini.max_result_bytes)"), "{}", over.message);
    }
}
