//! The Files endpoints: `POST /v1/files` (multipart, `purpose=batch`, a `.jsonl` file), `GET /v1/files` (a list,
//! to find uploads a client lost track of), `GET /v1/files/{id}`, `GET /v1/files/{id}/content` and
//! `DELETE /v1/files/{id}`.
//!
//! An upload is read as a stream and refused as soon as it passes `max_file_bytes`, so a too-large file is never
//! held in memory.

use std::sync::Arc;
use std::time::Duration;

use axum::{
    body::Bytes,
    extract::{FromRequest, Multipart, Path, Request, State},
    response::Response,
};
use percent_encoding::percent_decode_str;
use serde_json::{Value, json};

use super::{
    OpenAi,
    faults::OpenAiCallKind,
    http::{CallParts, OpenAiError, Reply, capped},
    store::StoredFile,
};

/// Longest text form field read (`purpose`, `expires_after[...]`).
const MAX_FIELD_BYTES: usize = 1024;

/// The file object.
pub(crate) fn file_json(api: &OpenAi, file: &StoredFile) -> Value {
    let clock = api.clock();
    let created_at = clock.unix_secs(file.created);
    json!({
        "id": file.id,
        "object": "file",
        "bytes": file.content.len(),
        "created_at": created_at,
        "expires_at": created_at + file.expires_in.as_secs(),
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "status_details": null,
    })
}

/// `POST /v1/files`.
pub(crate) async fn upload(State(api): State<Arc<OpenAi>>, parts: CallParts, request: Request) -> Response {
    let mut call = match parts.admit(&api, OpenAiCallKind::Upload).await {
        Ok(call) => call,
        Err(response) => return response,
    };
    let outcome = match read_upload(&api, request).await {
        Ok(file) => {
            call.record.file_id = Some(file.id.clone());
            Ok(Reply::Json(file_json(&api, &file)))
        }
        Err(error) => Err(error),
    };
    parts.finish(&api, call, outcome).await
}

async fn read_upload(api: &OpenAi, request: Request) -> Result<StoredFile, OpenAiError> {
    let mut multipart = Multipart::from_request(request, &()).await.map_err(|rejection| {
        OpenAiError::invalid(format!("Invalid multipart body: {}", capped(&rejection.body_text())), None, None)
    })?;
    let max_bytes = api.limits().max_file_bytes;
    let malformed = |error: axum::extract::multipart::MultipartError| {
        OpenAiError::invalid(format!("Invalid multipart body: {}", capped(&error.body_text())), None, None)
    };
    let mut purpose: Option<String> = None;
    let mut file: Option<(String, Bytes)> = None;
    let (mut anchor, mut seconds): (Option<String>, Option<String>) = (None, None);
    while let Some(mut field) = multipart.next_field().await.map_err(malformed)? {
        let name = field.name().unwrap_or_default().to_owned();
        match name.as_str() {
            "file" => {
                let filename = field.file_name().unwrap_or_default().to_owned();
                let mut content = Vec::new();
                while let Some(chunk) = field.chunk().await.map_err(malformed)? {
                    if (content.len() + chunk.len()) as u64 > max_bytes {
                        return Err(OpenAiError::invalid(
                            format!("File exceeds the maximum size of {max_bytes} bytes for purpose 'batch'."),
                            Some("file"),
                            Some("file_too_large"),
                        ));
                    }
                    content.extend_from_slice(&chunk);
                }
                file = Some((filename, Bytes::from(content)));
            }
            "purpose" => purpose = Some(read_text(field, "purpose").await?),
            // Reported as the file's `expires_at`; files are never deleted by time here.
            "expires_after[anchor]" => anchor = Some(read_text(field, &name).await?),
            "expires_after[seconds]" => seconds = Some(read_text(field, &name).await?),
            other => {
                return Err(OpenAiError::invalid(
                    format!("Unrecognized request argument supplied: {}", capped(other)),
                    None,
                    None,
                ));
            }
        }
    }
    match purpose.as_deref() {
        None => {
            return Err(OpenAiError::invalid(
                "Missing required parameter: 'purpose'.",
                Some("purpose"),
                Some("missing_required_parameter"),
            ));
        }
        Some("batch") => {}
        Some(other) => {
            return Err(OpenAiError::invalid(
                format!("Invalid value for 'purpose': '{}'; this emulator accepts only 'batch'.", capped(other)),
                Some("purpose"),
                Some("invalid_value"),
            ));
        }
    }
    let Some((filename, content)) = file else {
        return Err(OpenAiError::invalid(
            "Missing required parameter: 'file'.",
            Some("file"),
            Some("missing_required_parameter"),
        ));
    };
    if !filename.ends_with(".jsonl") {
        return Err(OpenAiError::invalid("Invalid file format for Batch API. Must be .jsonl", Some("file"), None));
    }
    let expires_in = match (anchor, seconds) {
        (None, None) => None,
        (Some(anchor), Some(seconds)) if anchor == "created_at" => {
            match seconds.parse::<u64>().ok().filter(|seconds| EXPIRY_SECONDS.contains(seconds)) {
                Some(seconds) => Some(Duration::from_secs(seconds)),
                None => return Err(bad_expiry()),
            }
        }
        _ => return Err(bad_expiry()),
    };
    Ok(api.store_file(filename, content, expires_in))
}

/// Bounds of `expires_after[seconds]`: one hour to 30 days.
const EXPIRY_SECONDS: std::ops::RangeInclusive<u64> = 3600..=2_592_000;

fn bad_expiry() -> OpenAiError {
    OpenAiError::invalid(
        "'expires_after' needs anchor 'created_at' and seconds between 3600 and 2592000.",
        Some("expires_after"),
        Some("invalid_value"),
    )
}

/// Reads a small text field; a longer one is refused.
async fn read_text(mut field: axum::extract::multipart::Field<'_>, name: &str) -> Result<String, OpenAiError> {
    let mut text = Vec::new();
    while let Some(chunk) = field.chunk().await.map_err(|error| {
        OpenAiError::invalid(format!("Invalid multipart body: {}", capped(&error.body_text())), None, None)
    })? {
        if text.len() + chunk.len() > MAX_FIELD_BYTES {
            return Err(OpenAiError::invalid(format!("'{}' is too long.", capped(name)), Some(name), None));
        }
        text.extend_from_slice(&chunk);
    }
    String::from_utf8(text)
        .map_err(|_| OpenAiError::invalid(format!("'{}' is not UTF-8.", capped(name)), Some(name), None))
}

/// Largest `limit` of a files list, and its default.
const MAX_FILES_LIMIT: usize = 10_000;

/// `purpose`, `after`, `limit` and `order` of a files list.
fn parse_files_query(query: Option<&str>) -> Result<(Option<String>, Option<String>, usize, bool), OpenAiError> {
    let (mut purpose, mut after, mut limit, mut descending) = (None, None, MAX_FILES_LIMIT, true);
    for (key, value) in query.unwrap_or("").split('&').filter_map(|pair| pair.split_once('=')) {
        let value = percent_decode_str(value).decode_utf8_lossy().into_owned();
        match key {
            "purpose" => purpose = Some(value),
            "after" => after = Some(value),
            "limit" => {
                limit = value.parse().ok().filter(|limit| (1..=MAX_FILES_LIMIT).contains(limit)).ok_or_else(|| {
                    OpenAiError::invalid(
                        format!("Invalid 'limit': expected an integer from 1 to {MAX_FILES_LIMIT}."),
                        Some("limit"),
                        Some("invalid_value"),
                    )
                })?;
            }
            "order" => {
                descending = match value.as_str() {
                    "desc" => true,
                    "asc" => false,
                    _ => {
                        return Err(OpenAiError::invalid(
                            "Invalid 'order': expected 'asc' or 'desc'.",
                            Some("order"),
                            Some("invalid_value"),
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    Ok((purpose, after, limit, descending))
}

/// `GET /v1/files`.
pub(crate) async fn list(State(api): State<Arc<OpenAi>>, parts: CallParts) -> Response {
    let call = match parts.admit(&api, OpenAiCallKind::ListFiles).await {
        Ok(call) => call,
        Err(response) => return response,
    };
    let outcome = parse_files_query(parts.uri.query()).and_then(|(purpose, after, limit, descending)| {
        let (files, has_more) =
            api.list_files(purpose.as_deref(), after.as_deref(), limit, descending).ok_or_else(|| {
                OpenAiError::invalid(
                    format!("Invalid 'after': no file '{}'.", capped(after.as_deref().unwrap_or(""))),
                    Some("after"),
                    Some("invalid_value"),
                )
            })?;
        let data: Vec<Value> = files.iter().map(|file| file_json(&api, file)).collect();
        let first_id = files.first().map(|file| file.id.clone());
        let last_id = files.last().map(|file| file.id.clone());
        Ok(Reply::Json(json!({
            "object": "list", "data": data, "first_id": first_id, "last_id": last_id, "has_more": has_more,
        })))
    });
    parts.finish(&api, call, outcome).await
}

/// `GET /v1/files/{id}`.
pub(crate) async fn get(State(api): State<Arc<OpenAi>>, parts: CallParts, Path(id): Path<String>) -> Response {
    let outcome = |api: &OpenAi| api.file(&id).map(|file| Reply::Json(file_json(api, &file)));
    file_call(&api, &parts, OpenAiCallKind::GetFile, &id, outcome).await
}

/// `GET /v1/files/{id}/content`.
pub(crate) async fn content(State(api): State<Arc<OpenAi>>, parts: CallParts, Path(id): Path<String>) -> Response {
    let outcome = |api: &OpenAi| api.file(&id).map(|file| Reply::Content(file.content));
    file_call(&api, &parts, OpenAiCallKind::FileContent, &id, outcome).await
}

/// `DELETE /v1/files/{id}`.
pub(crate) async fn delete(State(api): State<Arc<OpenAi>>, parts: CallParts, Path(id): Path<String>) -> Response {
    let outcome = |api: &OpenAi| {
        api.delete_file(&id).then(|| Reply::Json(json!({ "id": id, "object": "file", "deleted": true })))
    };
    file_call(&api, &parts, OpenAiCallKind::DeleteFile, &id, outcome).await
}

/// A call on one file, `/v1/files/{id}...`: admitted, logged with the file id, answered by `answer` or with a 404
/// when `answer` finds no such file.
async fn file_call(
    api: &OpenAi,
    parts: &CallParts,
    kind: OpenAiCallKind,
    id: &str,
    answer: impl FnOnce(&OpenAi) -> Option<Reply>,
) -> Response {
    let mut call = match parts.admit(api, kind).await {
        Ok(call) => call,
        Err(response) => return response,
    };
    call.record.file_id = Some(capped(id));
    let outcome = answer(api).ok_or_else(|| OpenAiError::not_found("File", id, "id"));
    parts.finish(api, call, outcome).await
}
