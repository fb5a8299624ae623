//! What every OpenAI call goes through: the error envelope, `x-request-id`, the API key, call-level faults (before
//! or after the call is handled) and the call log.

use std::time::Duration;

use axum::{
    Json,
    body::Bytes,
    extract::{ConnectInfo, FromRequestParts, OriginalUri},
    http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header, request::Parts},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use super::{
    faults::{OpenAiCallKind, OpenAiCallRecord, OpenAiFaultKind},
    store::OpenAi,
};
use crate::listener::Connection;

/// An error reply: `{"error":{"message","type","param","code"}}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {kind}: {message}")]
pub(crate) struct OpenAiError {
    /// HTTP status.
    pub status: StatusCode,
    /// `error.message`.
    pub message: String,
    /// `error.type` (`invalid_request_error`, `server_error`, ...).
    pub kind: String,
    /// `error.param`.
    pub param: Option<String>,
    /// `error.code`.
    pub code: Option<String>,
    /// Value of a `retry-after` header in seconds; no header when `None`.
    pub retry_after_secs: Option<u64>,
}

impl OpenAiError {
    /// A 400 `invalid_request_error`.
    pub fn invalid(message: impl Into<String>, param: Option<&str>, code: Option<&str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error".to_owned(),
            param: param.map(str::to_owned),
            code: code.map(str::to_owned),
            retry_after_secs: None,
        }
    }

    /// A 404 for an object that does not exist (`What` is `File` or `Batch`).
    pub fn not_found(what: &str, id: &str, param: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            ..Self::invalid(format!("No such {what} object: {}", capped(id)), Some(param), None)
        }
    }

    /// The reply a `status` fault (or the emulator) gives for `status`, with the API's usual wording.
    pub fn for_status(status: u16, message: Option<String>, code: Option<String>) -> Self {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let (default_message, kind, default_code) = match status.as_u16() {
            401 => ("Incorrect API key provided.", "invalid_request_error", Some("invalid_api_key")),
            429 => ("Rate limit reached for requests.", "requests", Some("rate_limit_exceeded")),
            500 => ("The server had an error while processing your request. Sorry about that!", "server_error", None),
            503 => ("The engine is currently overloaded, please try again later.", "server_error", None),
            other if other >= 500 => (status.canonical_reason().unwrap_or("Server error"), "server_error", None),
            _ => (status.canonical_reason().unwrap_or("Error"), "invalid_request_error", None),
        };
        Self {
            status,
            message: message.unwrap_or_else(|| default_message.to_owned()),
            kind: kind.to_owned(),
            param: None,
            code: code.or(default_code.map(str::to_owned)),
            retry_after_secs: None,
        }
    }

    /// What the call log records: `error.code`, or `error.type` when the code is null.
    fn log_code(&self) -> String {
        self.code.clone().unwrap_or_else(|| self.kind.clone())
    }
}

/// Caps a caller-given value before it is echoed in a message.
pub(crate) fn capped(value: &str) -> String {
    const MAX_ECHO: usize = 100;
    if value.chars().count() <= MAX_ECHO {
        value.to_owned()
    } else {
        format!("{}…", value.chars().take(MAX_ECHO).collect::<String>())
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.code }
        });
        let mut response = (self.status, Json(body)).into_response();
        if let Some(secs) = self.retry_after_secs {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// A successful reply.
#[derive(Debug)]
pub(crate) enum Reply {
    /// A JSON object, HTTP 200.
    Json(Value),
    /// A file's content, HTTP 200.
    Content(Bytes),
}

/// What every handler takes from a request besides its own arguments: who called, the method, path and query, and
/// the headers (for the API key).
#[derive(Debug)]
pub(crate) struct CallParts {
    /// The caller's connection.
    pub connection: Connection,
    /// The path and query as sent.
    pub uri: Uri,
    /// The method.
    method: Method,
    /// The headers.
    headers: HeaderMap,
}

impl<S: Send + Sync> FromRequestParts<S> for CallParts {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let ConnectInfo(connection) =
            ConnectInfo::<Connection>::from_request_parts(parts, state).await.map_err(IntoResponse::into_response)?;
        let OriginalUri(uri) = OriginalUri::from_request_parts(parts, state).await.map_err(|never| match never {})?;
        Ok(Self { connection, uri, method: parts.method.clone(), headers: parts.headers.clone() })
    }
}

impl CallParts {
    /// Starts the record of a call of `kind` and admits it ([`Call::admit`]). `Err`: the reply that ends the call.
    pub async fn admit(&self, api: &OpenAi, kind: OpenAiCallKind) -> Result<Call, Response> {
        let call = Call::begin(api, kind, self.method.as_str(), self.uri.path(), &self.connection);
        call.admit(api, &self.connection, &self.headers).await
    }

    /// Ends the call ([`Call::finish`]).
    pub async fn finish(&self, api: &OpenAi, call: Call, outcome: Result<Reply, OpenAiError>) -> Response {
        call.finish(api, &self.connection, outcome).await
    }
}

/// One call in progress: its log record, completed as it is handled.
#[derive(Debug)]
pub(crate) struct Call {
    /// The log record.
    pub record: OpenAiCallRecord,
}

impl Call {
    /// Starts the record of a call of `kind` to `path`.
    pub fn begin(api: &OpenAi, kind: OpenAiCallKind, method: &str, path: &str, connection: &Connection) -> Self {
        Self {
            record: OpenAiCallRecord {
                seq: 0,
                kind,
                method: method.to_owned(),
                path: capped(path),
                http_status: 0,
                batch_id: None,
                file_id: None,
                error_code: None,
                fault: None,
                request_id: api.new_request_id(),
                at_ms: 0,
                port: connection.local.port(),
            },
        }
    }

    /// Adds `name` to the faults that shaped this call.
    pub fn add_fault(&mut self, name: &str) {
        self.record.fault = Some(match self.record.fault.take() {
            Some(previous) => format!("{previous}+{name}"),
            None => name.to_owned(),
        });
    }

    /// Applies a call-level fault that hits this call before it is handled, then checks the API key. `Err`: the
    /// reply that ends the call (already logged).
    pub async fn admit(mut self, api: &OpenAi, connection: &Connection, headers: &HeaderMap) -> Result<Self, Response> {
        match self.take_fault(api, false) {
            Some(Action::Delay(delay)) => tokio::time::sleep(delay).await,
            Some(Action::Hold) => api.holds.hold().await,
            Some(Action::Replace(replaced)) => return Err(self.replace(api, connection, replaced)),
            None => {}
        }
        let (name, expected) = match api.dialect.key_header {
            super::OpenAiKeyHeader::Bearer => (header::AUTHORIZATION.as_str(), format!("Bearer {}", api.api_key)),
            super::OpenAiKeyHeader::ApiKey => ("api-key", api.api_key.clone()),
        };
        let authorized = headers.get(name).is_some_and(|value| value.as_bytes() == expected.as_bytes());
        if authorized {
            return Ok(self);
        }
        let message = "Incorrect API key provided. You can find your API key at \
                       https://platform.openai.com/account/api-keys.";
        Err(self.end(api, Err(OpenAiError::for_status(401, Some(message.to_owned()), None))))
    }

    /// Ends a handled call: applies a fault that hits it after handling, logs it, and builds the reply. A delayed or
    /// held reply is logged before the wait: if the client gives up (or is killed) meanwhile, what the call did is
    /// still on record.
    pub async fn finish(
        mut self,
        api: &OpenAi,
        connection: &Connection,
        outcome: Result<Reply, OpenAiError>,
    ) -> Response {
        match self.take_fault(api, true) {
            Some(Action::Delay(delay)) => {
                let response = self.end(api, outcome);
                tokio::time::sleep(delay).await;
                response
            }
            Some(Action::Hold) => {
                let response = self.end(api, outcome);
                api.holds.hold().await;
                response
            }
            Some(Action::Replace(replaced)) => self.replace(api, connection, replaced),
            None => self.end(api, outcome),
        }
    }

    /// Logs the call and builds its reply.
    pub fn end(mut self, api: &OpenAi, outcome: Result<Reply, OpenAiError>) -> Response {
        let mut response = match outcome {
            Ok(Reply::Json(mut value)) => {
                if api.dialect.upper_case_statuses {
                    upper_case_statuses(&mut value);
                }
                self.record.http_status = 200;
                (StatusCode::OK, Json(value)).into_response()
            }
            Ok(Reply::Content(bytes)) => {
                self.record.http_status = 200;
                (StatusCode::OK, [(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response()
            }
            Err(error) => {
                self.record.http_status = error.status.as_u16();
                self.record.error_code = Some(error.log_code());
                error.into_response()
            }
        };
        if let Ok(value) = HeaderValue::from_str(&self.record.request_id) {
            response.headers_mut().insert("x-request-id", value);
        }
        self.log(api);
        response
    }

    fn log(self, api: &OpenAi) {
        let record = self.record;
        tracing::info!(
            kind = ?record.kind,
            path = %record.path,
            http_status = record.http_status,
            batch_id = ?record.batch_id,
            file_id = ?record.file_id,
            fault = ?record.fault,
            "openai call"
        );
        api.record(record);
    }

    /// Takes the oldest call-level fault that hits this call at this stage (`after`: handled), if any.
    fn take_fault(&mut self, api: &OpenAi, after: bool) -> Option<Action> {
        let fault = api.take_call_fault(self.record.kind, after)?;
        self.add_fault(fault.name());
        match fault {
            OpenAiFaultKind::Delay { millis } => Some(Action::Delay(Duration::from_millis(millis))),
            OpenAiFaultKind::Hold => Some(Action::Hold),
            OpenAiFaultKind::Reset => Some(Action::Replace(Replaced::Reset)),
            OpenAiFaultKind::Status { status, message, code, retry_after_secs } => {
                let error = OpenAiError { retry_after_secs, ..OpenAiError::for_status(status, message, code) };
                Some(Action::Replace(Replaced::Error(error)))
            }
            // Batch-level faults never sit in the call-level queue.
            OpenAiFaultKind::TokenLimitExceeded | OpenAiFaultKind::FailItems { .. } | OpenAiFaultKind::Stall { .. } => {
                None
            }
        }
    }

    /// Ends the call with the reply a fault gives instead of the real one.
    fn replace(mut self, api: &OpenAi, connection: &Connection, replaced: Replaced) -> Response {
        match replaced {
            Replaced::Error(error) => self.end(api, Err(error)),
            Replaced::Reset => {
                tracing::info!(remote = %connection.remote, "resetting connection");
                connection.reset();
                self.record.http_status = 0;
                self.log(api);
                StatusCode::INTERNAL_SERVER_ERROR.into_response()
            }
        }
    }
}

/// Spells the status of a batch object, or of each batch in a list, in upper case (a dialect's,
/// [`super::OpenAiDialect::upper_case_statuses`]); other objects (files) are left alone.
fn upper_case_statuses(value: &mut Value) {
    let batch = |object: &mut Value| {
        if object["object"] == "batch"
            && let Some(Value::String(status)) = object.get_mut("status")
        {
            *status = status.to_ascii_uppercase();
        }
    };
    match value.get_mut("data") {
        Some(Value::Array(batches)) => batches.iter_mut().for_each(batch),
        _ => batch(value),
    }
}

/// What a call-level fault does to a call.
#[derive(Debug)]
enum Action {
    /// The reply waits this long.
    Delay(Duration),
    /// The call waits until the test releases it (see [`crate::hold`]).
    Hold,
    /// The reply is replaced.
    Replace(Replaced),
}

/// What replaces the reply of a faulted call.
#[derive(Debug)]
enum Replaced {
    /// The connection is reset: no reply.
    Reset,
    /// This error reply.
    Error(OpenAiError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dialect_spells_batch_statuses_in_upper_case_and_leaves_files_alone() {
        let mut batch = json!({"object": "batch", "status": "in_progress"});
        upper_case_statuses(&mut batch);
        assert_eq!(batch["status"], "IN_PROGRESS");
        let mut list = json!({"object": "list", "data": [{"object": "batch", "status": "completed"}]});
        upper_case_statuses(&mut list);
        assert_eq!(list["data"][0]["status"], "COMPLETED");
        let mut file = json!({"object": "file", "status": "processed"});
        upper_case_statuses(&mut file);
        assert_eq!(file["status"], "processed");
    }
}
