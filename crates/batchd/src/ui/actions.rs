//! The dashboard's actions (with `--allow-actions`): cancel a job, retry or purge a dead letter. Each is a `POST`
//! from a page of the dashboard itself (same origin, the session's token; see [`check_action`]), carried out through
//! the same functions as the CLI's, and logged with what it did.

use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Redirect, Response};
use batchd_core::{JobId, JobState};
use batchd_producer::CancelOutcome;
use serde::Deserialize;

use super::{SESSION_COOKIE, Ui, UiError, cookie, json, wants_json};
use crate::cli::dead;

/// The form of every action: the session's token and the namespace.
#[derive(Debug, Deserialize)]
pub(super) struct ActionForm {
    /// Must equal the session cookie's token.
    token: String,
    /// The namespace acted on.
    ns: Option<String>,
}

/// Refuses an action unless actions are on and the request comes from a page of this dashboard: same origin by the
/// browser's own headers, and the form's token equal to the session cookie's.
fn check_action(ui: &Ui, headers: &HeaderMap, form: &ActionForm) -> Result<(), UiError> {
    if !ui.allow_actions {
        return Err(UiError::Forbidden(
            "actions are off: this dashboard is read-only (start it with --allow-actions)".to_owned(),
        ));
    }
    let host = headers.get(header::HOST).and_then(|value| value.to_str().ok()).unwrap_or("");
    let origin = headers.get(header::ORIGIN).and_then(|value| value.to_str().ok());
    let fetch_site = headers.get("sec-fetch-site").and_then(|value| value.to_str().ok());
    let same_origin = match (origin, fetch_site) {
        (Some(origin), _) if origin != "null" => {
            origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")) == Some(host)
        }
        (_, Some(site)) => site == "same-origin",
        _ => false,
    };
    if !same_origin {
        return Err(UiError::Forbidden("refused: the request does not come from this dashboard's pages".to_owned()));
    }
    match cookie(headers, SESSION_COOKIE) {
        Some(token) if !token.is_empty() && token == form.token => Ok(()),
        _ => Err(UiError::Forbidden("refused: the form's token is not this session's (reload the page)".to_owned())),
    }
}

/// Where an action's outcome is shown: back to `path` with a notice, or as JSON when asked.
fn after_action(headers: &HeaderMap, path: &str, ns: &str, notice: &str, value: serde_json::Value) -> Response {
    if wants_json(headers) {
        return json(value);
    }
    Redirect::to(&format!("{path}?ns={}&notice={}", super::pages::encode(ns), super::pages::encode(notice)))
        .into_response()
}

pub(super) async fn cancel(
    State(ui): State<Ui>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Result<Response, UiError> {
    check_action(&ui, &headers, &form)?;
    let keys = ui.keys(form.ns.as_deref())?;
    let job_id = JobId::parse(&id).map_err(|e| UiError::BadRequest(format!("job id {id:?} {e}")))?;
    let producer =
        crate::cli::producer_on(&ui.settings, ui.conn(), keys.clone()).map_err(|e| UiError::Redis(format!("{e:#}")))?;
    let outcome = producer
        .cancel(&job_id, "cancelled from the dashboard")
        .await
        .map_err(|e| UiError::Redis(format!("cancel job {job_id}: {e}")))?;
    let (state, notice) = match outcome {
        CancelOutcome::AlreadyFinished(state) => {
            (Some(state), format!("job {job_id} already ended {state}; nothing to cancel"))
        }
        CancelOutcome::Requested(Some(state)) => (Some(state), format!("cancellation of job {job_id} requested")),
        CancelOutcome::Requested(None) => (None, format!("cancellation of job {job_id} requested (not taken in yet)")),
    };
    let state = state.map_or("", JobState::as_str);
    tracing::info!(action = "cancel", namespace = keys.namespace(), job_id = %job_id, state = %state, "dashboard action");
    let value = serde_json::json!({"job_id": job_id.as_str(), "state": state, "notice": notice});
    Ok(after_action(&headers, &format!("/jobs/{job_id}"), keys.namespace(), &notice, value))
}

pub(super) async fn dead_retry(
    State(ui): State<Ui>,
    Path(entry): Path<String>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Result<Response, UiError> {
    check_action(&ui, &headers, &form)?;
    let keys = ui.keys(form.ns.as_deref())?;
    let requeued = dead::requeue(&mut ui.conn(), &keys, &ui.settings, &entry).await?;
    tracing::info!(
        action = "dead retry",
        namespace = keys.namespace(),
        entry_id = %entry,
        submit_entry_id = %requeued.submit_entry_id,
        job_id = %requeued.job_id,
        "dashboard action"
    );
    let notice = format!(
        "dead-letter entry {entry} requeued as submit entry {} (job {})",
        requeued.submit_entry_id, requeued.job_id
    );
    Ok(after_action(&headers, "/dead", keys.namespace(), &notice, requeued.to_json(&entry)))
}

pub(super) async fn dead_purge(
    State(ui): State<Ui>,
    Path(entry): Path<String>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Result<Response, UiError> {
    check_action(&ui, &headers, &form)?;
    let keys = ui.keys(form.ns.as_deref())?;
    let purged = dead::delete(&mut ui.conn(), &keys, std::slice::from_ref(&entry)).await?;
    tracing::info!(action = "dead purge", namespace = keys.namespace(), entry_id = %entry, purged, "dashboard action");
    let notice = format!("dead-letter entry {entry} purged");
    let value = serde_json::json!({"namespace": keys.namespace(), "purged": purged});
    Ok(after_action(&headers, "/dead", keys.namespace(), &notice, value))
}
