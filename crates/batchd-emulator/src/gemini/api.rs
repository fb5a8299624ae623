//! The HTTP surface of the Gemini emulator, under `/gemini`: batches (`v1beta/models/{model}:batchGenerateContent`,
//! `v1beta/batches[/{id}[:cancel]]`), the resumable upload (`upload/v1beta/files`), files (`v1beta/files/{id}`) and
//! downloads (`download/v1beta/files/{id}:download?alt=media`); checks in order (injected fault, API key, route,
//! body); the google.rpc error envelope `{"error":{"code","message","status"}}`; the call log.
//!
//! One catch-all route parses the path itself: the `:verb` suffixes are not axum segments, and every unknown path
//! gets Google's 404 envelope.

use std::{sync::Arc, time::SystemTime};

use axum::{
    Json,
    body::Body,
    extract::{ConnectInfo, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};
use percent_encoding::percent_decode_str;
use serde_json::{Value, json};

use super::{
    Gemini, GeminiConfig, PATH_PREFIX,
    fault::{GeminiCall, GeminiCallKind, GeminiFaultKind, take_fault},
    store::{Batch, Item, PendingUpload, Source, StoredFile, file_json, run_request},
};
use crate::listener::Connection;

/// Page size of a list without `pageSize`, and the largest one (bigger ones are clamped): UNCONFIRMED.
const DEFAULT_PAGE_SIZE: usize = 50;
const MAX_PAGE_SIZE: usize = 1000;

/// A google.rpc error reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GeminiError {
    /// HTTP status (`error.code`).
    code: u16,
    /// `error.status`.
    status: &'static str,
    /// `error.message`.
    message: String,
}

impl GeminiError {
    /// An error of HTTP `code` with the status name Google uses for it.
    fn new(code: u16, message: impl Into<String>) -> Self {
        let status = match code {
            400 => "INVALID_ARGUMENT",
            401 => "UNAUTHENTICATED",
            403 => "PERMISSION_DENIED",
            404 => "NOT_FOUND",
            409 => "ABORTED",
            429 => "RESOURCE_EXHAUSTED",
            501 => "NOT_IMPLEMENTED",
            503 => "UNAVAILABLE",
            504 => "DEADLINE_EXCEEDED",
            _ if code >= 500 => "INTERNAL",
            _ => "UNKNOWN",
        };
        Self { code, status, message: message.into() }
    }

    fn invalid(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }

    fn not_found() -> Self {
        Self::new(404, "Requested entity was not found.")
    }

    /// The reply a `status` fault gives: Google's usual wording for the status.
    fn for_fault(code: u16, message: Option<String>) -> Self {
        let default = match code {
            429 => "Resource has been exhausted (e.g. check quota).",
            500 => {
                "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting"
            }
            503 => "The model is overloaded. Please try again later.",
            _ => "Error",
        };
        Self::new(code, message.unwrap_or_else(|| default.to_owned()))
    }
}

impl IntoResponse for GeminiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "code": self.code, "message": self.message, "status": self.status } });
        let status = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(body)).into_response()
    }
}

/// What a method and path (after `/gemini`, percent-decoded) name: the kind of call and its id (model, batch id or
/// file id).
fn parse_route(method: &Method, path: &str, query: &str) -> (GeminiCallKind, Option<String>) {
    let method = method.as_str();
    let route = if let Some(rest) = path.strip_prefix("/v1beta/models/") {
        match rest.split_once(':') {
            Some((model, "batchGenerateContent")) if method == "POST" && !model.contains('/') => {
                Some((GeminiCallKind::Create, model))
            }
            _ => None,
        }
    } else if path == "/v1beta/batches" {
        (method == "GET").then_some((GeminiCallKind::List, ""))
    } else if let Some(rest) = path.strip_prefix("/v1beta/batches/") {
        match (method, rest.split_once(':')) {
            ("POST", Some((id, "cancel"))) => Some((GeminiCallKind::Cancel, id)),
            ("GET", None) => Some((GeminiCallKind::Get, rest)),
            ("DELETE", None) => Some((GeminiCallKind::Delete, rest)),
            _ => None,
        }
    } else if path == "/upload/v1beta/files" && method == "POST" {
        let has_upload_id = query.split('&').any(|pair| pair.starts_with("upload_id="));
        Some((if has_upload_id { GeminiCallKind::UploadBytes } else { GeminiCallKind::UploadStart }, ""))
    } else if let Some(id) = path.strip_prefix("/v1beta/files/") {
        match method {
            "GET" => Some((GeminiCallKind::GetFile, id)),
            "DELETE" => Some((GeminiCallKind::DeleteFile, id)),
            _ => None,
        }
    } else if let Some(rest) = path.strip_prefix("/download/v1beta/files/") {
        match rest.split_once(':') {
            Some((id, "download")) if method == "GET" => Some((GeminiCallKind::Download, id)),
            _ => None,
        }
    } else {
        None
    };
    match route {
        Some((kind, id)) if id.is_empty() || !id.contains('/') => (kind, (!id.is_empty()).then(|| id.to_owned())),
        _ => (GeminiCallKind::Unknown, None),
    }
}

/// The value of query parameter `name`, percent-decoded.
fn query_param(query: &str, name: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| percent_decode_str(&value.replace('+', " ")).decode_utf8_lossy().into_owned())
}

/// A successful reply.
#[derive(Debug)]
enum Reply {
    /// A JSON object, HTTP 200.
    Json(Value),
    /// HTTP 200 with these headers and an empty body (the steps of a resumable upload).
    Headers(Vec<(&'static str, String)>),
    /// HTTP 200 with a JSON body and these headers (the finalize of an upload).
    JsonWithHeaders(Value, Vec<(&'static str, String)>),
    /// A file's content.
    Bytes(Vec<u8>, String),
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let with_headers = |mut response: Response, headers: Vec<(&'static str, String)>| {
            for (name, value) in headers {
                if let Ok(value) = HeaderValue::from_str(&value) {
                    response.headers_mut().insert(name, value);
                }
            }
            response
        };
        match self {
            Reply::Json(value) => (StatusCode::OK, Json(value)).into_response(),
            Reply::Headers(headers) => with_headers(StatusCode::OK.into_response(), headers),
            Reply::JsonWithHeaders(value, headers) => {
                with_headers((StatusCode::OK, Json(value)).into_response(), headers)
            }
            Reply::Bytes(bytes, mime) => (StatusCode::OK, [(header::CONTENT_TYPE, mime)], bytes).into_response(),
        }
    }
}

/// Every call under `/gemini`.
pub(crate) async fn handle(
    State(gemini): State<Arc<Gemini>>,
    ConnectInfo(connection): ConnectInfo<Connection>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let raw_path = uri.path().strip_prefix(PATH_PREFIX).unwrap_or(uri.path());
    let path = percent_decode_str(raw_path).decode_utf8_lossy().into_owned();
    let query = uri.query().unwrap_or("");
    let (kind, id) = parse_route(&method, &path, query);
    let mut record = GeminiCall::arriving(kind, method.as_str(), &path, connection.local.port());
    if matches!(kind, GeminiCallKind::Get | GeminiCallKind::Cancel | GeminiCallKind::Delete) {
        record.batch_name = id.as_ref().map(|id| format!("batches/{id}"));
    }
    let (fault, config) = {
        let mut inner = gemini.lock();
        (take_fault(&mut inner.faults, kind), inner.config.clone())
    };
    record.fault = fault.as_ref().map(|fault| fault.name().to_owned());

    // Faults that hit before the call is handled.
    match &fault {
        Some(GeminiFaultKind::Status { status, message }) => {
            return finish(&gemini, record, Err(GeminiError::for_fault(*status, message.clone())));
        }
        Some(GeminiFaultKind::Reset) => {
            tracing::info!(remote = %connection.remote, "gemini reset");
            connection.reset();
            gemini.record(record);
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
        _ => {}
    }

    let host = headers
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .map_or_else(|| connection.local.to_string(), str::to_owned);
    let call = Call {
        gemini: &gemini,
        config: &config,
        id: id.as_deref(),
        query,
        headers: &headers,
        host: &host,
        fails: fault == Some(GeminiFaultKind::FailBatch),
    };
    let outcome = call.handle(kind, body, &mut record).await;

    // Faults that hit once the call took effect: only its reply is held or lost.
    match fault {
        Some(GeminiFaultKind::StatusAfter { status }) => {
            finish(&gemini, record, Err(GeminiError::for_fault(status, None)))
        }
        Some(GeminiFaultKind::Hold) => {
            // Logged before the hold: a client killed meanwhile leaves the call (and its batch) on record.
            let response = finish(&gemini, record, outcome);
            gemini.holds.hold().await;
            response
        }
        _ => finish(&gemini, record, outcome),
    }
}

/// Logs the call and builds its reply.
fn finish(gemini: &Gemini, mut record: GeminiCall, outcome: Result<Reply, GeminiError>) -> Response {
    match outcome {
        Ok(reply) => {
            record.status = 200;
            gemini.record(record);
            reply.into_response()
        }
        Err(error) => {
            record.status = error.code;
            record.error_status = Some(error.status.to_owned());
            gemini.record(record);
            error.into_response()
        }
    }
}

/// One call being handled: what it names and the settings it sees.
struct Call<'a> {
    /// The emulator's state.
    gemini: &'a Gemini,
    /// Settings at the call's arrival.
    config: &'a GeminiConfig,
    /// The model, batch id or file id the path names.
    id: Option<&'a str>,
    /// The query string.
    query: &'a str,
    /// The headers.
    headers: &'a HeaderMap,
    /// The `Host` the client called, for the URLs the emulator hands out.
    host: &'a str,
    /// Whether a `fail_batch` fault hit this create.
    fails: bool,
}

impl Call<'_> {
    /// The API key check, then the call itself.
    async fn handle(&self, kind: GeminiCallKind, body: Body, record: &mut GeminiCall) -> Result<Reply, GeminiError> {
        // The upload URL carries its own authorization (the upload id), as Google's does.
        if kind != GeminiCallKind::UploadBytes {
            self.check_key()?;
        }
        let now = SystemTime::now();
        let id = self.id.unwrap_or_default();
        match kind {
            GeminiCallKind::Create => self.create(id, body, now, record).await,
            GeminiCallKind::Get => {
                let mut inner = self.gemini.lock();
                let name = format!("batches/{id}");
                inner.store.operation(&name, now, self.config).map(Reply::Json).ok_or_else(GeminiError::not_found)
            }
            GeminiCallKind::List => self.list(now),
            GeminiCallKind::Cancel => match self.gemini.lock().store.cancel(&format!("batches/{id}"), now, self.config)
            {
                None => Err(GeminiError::not_found()),
                Some(Ok(())) => Ok(Reply::Json(json!({}))),
                Some(Err(_)) => Err(GeminiError {
                    status: "FAILED_PRECONDITION",
                    ..GeminiError::invalid("The batch has already ended and cannot be cancelled.")
                }),
            },
            GeminiCallKind::Delete => {
                if self.gemini.lock().store.delete(&format!("batches/{id}")) {
                    Ok(Reply::Json(json!({})))
                } else {
                    Err(GeminiError::not_found())
                }
            }
            GeminiCallKind::UploadStart => self.start_upload(body).await,
            GeminiCallKind::UploadBytes => self.upload_bytes(body, now).await,
            GeminiCallKind::GetFile => {
                let inner = self.gemini.lock();
                let file = inner.store.files.get(&format!("files/{id}")).ok_or_else(GeminiError::not_found)?;
                Ok(Reply::Json(file_json(file, self.host)))
            }
            GeminiCallKind::DeleteFile => match self.gemini.lock().store.files.remove(&format!("files/{id}")) {
                Some(_) => Ok(Reply::Json(json!({}))),
                None => Err(GeminiError::not_found()),
            },
            GeminiCallKind::Download => {
                if query_param(self.query, "alt").as_deref() != Some("media") {
                    return Err(GeminiError::invalid("Download requires alt=media."));
                }
                let inner = self.gemini.lock();
                let file = inner.store.files.get(&format!("files/{id}")).ok_or_else(GeminiError::not_found)?;
                Ok(Reply::Bytes(file.content.clone(), file.mime_type.clone()))
            }
            GeminiCallKind::Unknown => Err(GeminiError::not_found()),
        }
    }

    /// The key as `x-goog-api-key` or `?key=`: none is 403, a wrong one 400 (Google's usual answers; UNCONFIRMED).
    fn check_key(&self) -> Result<(), GeminiError> {
        let given = self
            .headers
            .get("x-goog-api-key")
            .map(|value| value.to_str().unwrap_or("").to_owned())
            .or_else(|| query_param(self.query, "key"));
        match given {
            None => Err(GeminiError::new(
                403,
                "Method doesn't allow unregistered callers (callers without established identity). Please use API \
                 Key or other form of API consumer identity to call this API.",
            )),
            Some(key) if key == self.config.api_key => Ok(()),
            Some(_) => Err(GeminiError::invalid("API key not valid. Please pass a valid API key.")),
        }
    }

    /// `POST /v1beta/models/{model}:batchGenerateContent`: checks the batch, runs its requests, stores it, and
    /// answers the operation.
    async fn create(
        &self,
        model: &str,
        body: Body,
        now: SystemTime,
        record: &mut GeminiCall,
    ) -> Result<Reply, GeminiError> {
        let limit = self.config.max_inline_bytes;
        let too_large = || GeminiError::invalid(format!("Request payload size exceeds the limit: {limit} bytes."));
        let bytes = axum::body::to_bytes(body, limit.saturating_add(1)).await.map_err(|_| too_large())?;
        if bytes.len() > limit {
            return Err(too_large());
        }
        let body: Value = serde_json::from_slice(&bytes)
            .map_err(|_| GeminiError::invalid("Invalid JSON payload received. The body is not JSON."))?;
        drop(bytes);
        let batch = body
            .get("batch")
            .filter(|batch| batch.is_object())
            .ok_or_else(|| GeminiError::invalid("* BatchGenerateContentRequest.batch: batch is required"))?;
        let field = |camel: &str, snake: &str| batch.get(camel).or_else(|| batch.get(snake));
        let display_name = field("displayName", "display_name")
            .and_then(Value::as_str)
            .filter(|name| !name.is_empty())
            .ok_or_else(|| GeminiError::invalid("* GenerateContentBatch.display_name: display_name is required"))?;
        record.display_name = Some(display_name.chars().take(200).collect());
        let input = field("inputConfig", "input_config")
            .ok_or_else(|| GeminiError::invalid("* GenerateContentBatch.input_config: input_config is required"))?;
        if !self.config.models.is_empty() && !self.config.models.iter().any(|served| served == model) {
            return Err(GeminiError::new(
                404,
                format!(
                    "models/{model:.100} is not found for API version v1beta, or is not supported for batchGenerateContent."
                ),
            ));
        }
        let model_name = format!("models/{model}");
        let inline = input.get("requests");
        let file_name = input.get("fileName").or_else(|| input.get("file_name")).and_then(Value::as_str);
        let (items, source) = match (inline, file_name) {
            (Some(requests), None) => (inline_items(requests, &model_name)?, Source::Inline),
            (None, Some(file_name)) => (self.file_items(file_name, &model_name)?, Source::File(file_name.to_owned())),
            _ => return Err(GeminiError::invalid("input_config must set exactly one of requests and file_name")),
        };
        record.n_requests = Some(items.len());
        record.first_key = items.first().and_then(|item| item.key.clone());
        let batch = Batch {
            name: String::new(),
            model: model_name,
            display_name: display_name.to_owned(),
            created: now,
            items,
            source,
            fails: self.fails,
            ended: None,
            responses_file: None,
        };
        let mut inner = self.gemini.lock();
        let name = inner.store.create(batch);
        record.batch_name = Some(name.clone());
        inner.store.operation(&name, now, self.config).map(Reply::Json).ok_or_else(GeminiError::not_found)
    }

    /// The items of a file-sourced batch: one per non-blank line `{"key": .., "request": {..}}`.
    fn file_items(&self, file_name: &str, model: &str) -> Result<Vec<Item>, GeminiError> {
        let inner = self.gemini.lock();
        let file = inner.store.files.get(file_name).ok_or_else(GeminiError::not_found)?;
        let text =
            std::str::from_utf8(&file.content).map_err(|_| GeminiError::invalid("The input file is not UTF-8."))?;
        let mut items = Vec::new();
        for (index, line) in text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty()) {
            let bad_line =
                || GeminiError::invalid(format!("Line {} of {file_name} is not a valid request.", index + 1));
            let line: Value = serde_json::from_str(line).map_err(|_| bad_line())?;
            let request = line.get("request").filter(|request| request.is_object()).ok_or_else(bad_line)?;
            let key = line.get("key").and_then(Value::as_str).map(str::to_owned);
            items.push(Item { key, metadata: None, outcome: run_request(request, model) });
        }
        if items.is_empty() {
            return Err(GeminiError::invalid(format!("The input file {file_name} has no requests.")));
        }
        Ok(items)
    }

    /// `GET /v1beta/batches?pageSize=&pageToken=`: newest first; `nextPageToken` while more remain.
    fn list(&self, now: SystemTime) -> Result<Reply, GeminiError> {
        let page_size = match query_param(self.query, "pageSize") {
            None => DEFAULT_PAGE_SIZE,
            Some(size) => match size.parse::<usize>() {
                Ok(0) => DEFAULT_PAGE_SIZE,
                Ok(size) => size.min(MAX_PAGE_SIZE),
                Err(_) => return Err(GeminiError::invalid(format!("Invalid value for pageSize: {size:.40}"))),
            },
        };
        let token = query_param(self.query, "pageToken");
        let page = self
            .gemini
            .lock()
            .store
            .page(token.as_deref(), page_size, now, self.config)
            .map_err(|()| GeminiError::invalid("Invalid page token."))?;
        // proto3 JSON leaves out empty fields: an empty list is `{}`.
        let mut reply = json!({});
        if !page.operations.is_empty() {
            reply["operations"] = Value::Array(page.operations);
        }
        if let Some(token) = page.next_page_token {
            reply["nextPageToken"] = json!(token);
        }
        Ok(Reply::Json(reply))
    }

    /// `POST /upload/v1beta/files` with `x-goog-upload-protocol: resumable` and `x-goog-upload-command: start`:
    /// answers the upload URL in `x-goog-upload-url`.
    async fn start_upload(&self, body: Body) -> Result<Reply, GeminiError> {
        let header = |name: &str| self.headers.get(name).and_then(|value| value.to_str().ok()).map(str::to_owned);
        if header("x-goog-upload-protocol").as_deref() != Some("resumable")
            || header("x-goog-upload-command").as_deref() != Some("start")
        {
            return Err(GeminiError::invalid(
                "Only the resumable upload protocol is emulated: x-goog-upload-protocol: resumable, \
                 x-goog-upload-command: start.",
            ));
        }
        let declared_len = header("x-goog-upload-header-content-length").and_then(|len| len.parse::<u64>().ok());
        if declared_len.is_some_and(|len| len > self.config.max_file_bytes) {
            return Err(GeminiError::invalid(format!("Files are limited to {} bytes.", self.config.max_file_bytes)));
        }
        let bytes =
            axum::body::to_bytes(body, 64 * 1024).await.map_err(|_| GeminiError::invalid("Metadata too large."))?;
        let metadata: Value =
            if bytes.is_empty() { json!({}) } else { serde_json::from_slice(&bytes).unwrap_or(json!({})) };
        let file = &metadata["file"];
        let display_name = file.get("displayName").or_else(|| file.get("display_name")).and_then(Value::as_str);
        let upload = PendingUpload {
            display_name: display_name.unwrap_or_default().chars().take(512).collect(),
            mime_type: header("x-goog-upload-header-content-type")
                .unwrap_or_else(|| "application/octet-stream".to_owned()),
            declared_len,
            content: Vec::new(),
        };
        let upload_id = uuid::Uuid::new_v4().simple().to_string();
        self.gemini.lock().store.uploads.insert(upload_id.clone(), upload);
        let url = format!(
            "http://{}{PATH_PREFIX}/upload/v1beta/files?upload_id={upload_id}&upload_protocol=resumable",
            self.host
        );
        Ok(Reply::Headers(vec![("x-goog-upload-url", url), ("x-goog-upload-status", "active".to_owned())]))
    }

    /// `POST <upload URL>` with `x-goog-upload-command: upload`, `finalize` or `upload, finalize` and
    /// `x-goog-upload-offset`: appends the bytes at the offset; a finalize stores the file and answers
    /// `{"file": {..}}`.
    async fn upload_bytes(&self, body: Body, now: SystemTime) -> Result<Reply, GeminiError> {
        let upload_id = query_param(self.query, "upload_id").unwrap_or_default();
        let command = self.headers.get("x-goog-upload-command").and_then(|value| value.to_str().ok()).unwrap_or("");
        let commands: Vec<&str> = command.split(',').map(str::trim).collect();
        let max = usize::try_from(self.config.max_file_bytes).unwrap_or(usize::MAX);
        let too_large = || GeminiError::invalid(format!("Files are limited to {max} bytes."));
        let bytes = axum::body::to_bytes(body, max.saturating_add(1)).await.map_err(|_| too_large())?;
        let mut inner = self.gemini.lock();
        let upload = inner.store.uploads.get_mut(&upload_id).ok_or_else(GeminiError::not_found)?;
        if commands.contains(&"upload") {
            let offset = self.headers.get("x-goog-upload-offset").and_then(|value| value.to_str().ok());
            if offset.and_then(|offset| offset.parse::<usize>().ok()) != Some(upload.content.len()) {
                return Err(GeminiError::invalid(format!(
                    "x-goog-upload-offset must be {}, the bytes received so far.",
                    upload.content.len()
                )));
            }
            if upload.content.len() + bytes.len() > max {
                return Err(too_large());
            }
            upload.content.extend_from_slice(&bytes);
        }
        let received = upload.content.len().to_string();
        if !commands.contains(&"finalize") {
            return Ok(Reply::Headers(vec![
                ("x-goog-upload-status", "active".to_owned()),
                ("x-goog-upload-size-received", received),
            ]));
        }
        if upload.declared_len.is_some_and(|declared| u64::try_from(upload.content.len()).ok() != Some(declared)) {
            return Err(GeminiError::invalid(
                "The upload's size is not the declared x-goog-upload-header-content-length.",
            ));
        }
        let Some(upload) = inner.store.uploads.remove(&upload_id) else {
            return Err(GeminiError::not_found());
        };
        let name = format!("files/{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
        let file = StoredFile {
            name: name.clone(),
            display_name: upload.display_name,
            mime_type: upload.mime_type,
            content: upload.content,
            created: now,
        };
        let view = file_json(&file, self.host);
        inner.store.files.insert(name, file);
        Ok(Reply::JsonWithHeaders(json!({ "file": view }), vec![("x-goog-upload-status", "final".to_owned())]))
    }
}

/// The items of an inline batch: `{"requests": [{"request": {..}, "metadata": {"key": ..}}]}`.
fn inline_items(requests: &Value, model: &str) -> Result<Vec<Item>, GeminiError> {
    let list = requests
        .get("requests")
        .and_then(Value::as_array)
        .filter(|list| !list.is_empty())
        .ok_or_else(|| GeminiError::invalid("* InlinedRequests.requests: at least one request is required"))?;
    list.iter()
        .enumerate()
        .map(|(index, entry)| {
            let request = entry.get("request").filter(|request| request.is_object()).ok_or_else(|| {
                GeminiError::invalid(format!("* InlinedRequests.requests[{index}].request: request is required"))
            })?;
            let metadata = entry.get("metadata").cloned();
            let key =
                metadata.as_ref().and_then(|metadata| metadata.get("key")).and_then(Value::as_str).map(str::to_owned);
            Ok(Item { key, metadata, outcome: run_request(request, model) })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_with_their_verbs() {
        let post = Method::POST;
        let get = Method::GET;
        assert_eq!(
            parse_route(&post, "/v1beta/models/gemini-2.5-flash:batchGenerateContent", ""),
            (GeminiCallKind::Create, Some("gemini-2.5-flash".to_owned()))
        );
        assert_eq!(
            parse_route(&post, "/v1beta/batches/abc:cancel", ""),
            (GeminiCallKind::Cancel, Some("abc".to_owned()))
        );
        assert_eq!(parse_route(&get, "/v1beta/batches/abc", ""), (GeminiCallKind::Get, Some("abc".to_owned())));
        assert_eq!(parse_route(&Method::DELETE, "/v1beta/batches/abc", "").0, GeminiCallKind::Delete);
        assert_eq!(parse_route(&get, "/v1beta/batches", "pageSize=2").0, GeminiCallKind::List);
        assert_eq!(parse_route(&post, "/upload/v1beta/files", "").0, GeminiCallKind::UploadStart);
        assert_eq!(parse_route(&post, "/upload/v1beta/files", "upload_id=x").0, GeminiCallKind::UploadBytes);
        assert_eq!(
            parse_route(&get, "/download/v1beta/files/f1:download", "alt=media"),
            (GeminiCallKind::Download, Some("f1".to_owned()))
        );
        assert_eq!(parse_route(&get, "/v1beta/batches/a/b", "").0, GeminiCallKind::Unknown);
        assert_eq!(parse_route(&get, "/v1beta/models/m:batchGenerateContent", "").0, GeminiCallKind::Unknown);
    }

    #[test]
    fn errors_carry_google_status_names() {
        assert_eq!(GeminiError::for_fault(429, None).status, "RESOURCE_EXHAUSTED");
        assert_eq!(GeminiError::for_fault(503, None).status, "UNAVAILABLE");
        assert_eq!(GeminiError::new(500, "x").status, "INTERNAL");
        assert_eq!(GeminiError::not_found().status, "NOT_FOUND");
    }
}
