//! The dashboard's actions (with `--allow-actions`): cancel a job, retry or purge a dead letter. Each is a `POST`
//! from a page of the dashboard itself (an `Origin` among the dashboard's hosts, the session's token; see
//! [`check_action`]), carried out through the same functions as the CLI's, and logged with what it did and who
//! asked. The page after it shows the outcome as a [`Notice`] code.

use axum::Extension;
use axum::extract::{Form, Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect, Response};
use batchd_core::{JobId, JobState};
use batchd_producer::CancelOutcome;
use serde::Deserialize;

use super::access::User;
use super::{Notice, SESSION_COOKIE, Ui, UiError, cookie, json, wants_json};
use crate::cli::dead;

/// The form of every action: the session's token and the namespace.
#[derive(Debug, Deserialize)]
pub(super) struct ActionForm {
    /// Must equal the session cookie's token.
    token: String,
    /// The namespace acted on.
    ns: Option<String>,
}

/// Refuses an action unless actions are on and the request comes from a page of this dashboard: an `Origin` among
/// the dashboard's own hosts (checked against its list, not against `Host`, which a rebinding page controls), and
/// the form's token equal to the session cookie's.
fn check_action(ui: &Ui, headers: &HeaderMap, form: &ActionForm) -> Result<(), UiError> {
    if !ui.allow_actions {
        return Err(UiError::Forbidden(
            "actions are off: this dashboard is read-only (start it with --allow-actions)".to_owned(),
        ));
    }
    if !ui.access.is_own_origin(headers) {
        return Err(UiError::Forbidden("refused: the request does not come from this dashboard's pages".to_owned()));
    }
    match cookie(headers, SESSION_COOKIE) {
        Some(token) if !token.is_empty() && token == form.token => Ok(()),
        _ => Err(UiError::Forbidden("refused: the form's token is not this session's (reload the page)".to_owned())),
    }
}

/// Where an action's outcome is shown: back to `path` with the notice's code, or as JSON when asked.
fn after_action(headers: &HeaderMap, path: &str, ns: &str, notice: Notice, value: serde_json::Value) -> Response {
    if wants_json(headers) {
        return json(value);
    }
    Redirect::to(&format!("{path}?ns={}&notice={}", super::pages::encode(ns), notice.code())).into_response()
}

/// Who asked, for the log: the authenticated user, or `-` without authentication.
fn who(user: &User) -> &str {
    user.0.as_deref().unwrap_or("-")
}

pub(super) async fn cancel(
    State(ui): State<Ui>,
    Path(id): Path<String>,
    Extension(user): Extension<User>,
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
    let (state, notice, code) = match outcome {
        CancelOutcome::AlreadyFinished(state) => {
            (Some(state), format!("job {job_id} already ended {state}; nothing to cancel"), Notice::AlreadyEnded)
        }
        CancelOutcome::Requested(Some(state)) => {
            (Some(state), format!("cancellation of job {job_id} requested"), Notice::CancelRequested)
        }
        CancelOutcome::Requested(None) => {
            (None, format!("cancellation of job {job_id} requested (not taken in yet)"), Notice::CancelBeforeTakeIn)
        }
    };
    let state = state.map_or("", JobState::as_str);
    tracing::info!(
        action = "cancel",
        user = who(&user),
        namespace = keys.namespace(),
        job_id = %job_id,
        state = %state,
        "dashboard action"
    );
    let value = serde_json::json!({"job_id": job_id.as_str(), "state": state, "notice": notice});
    Ok(after_action(&headers, &format!("/jobs/{job_id}"), keys.namespace(), code, value))
}

pub(super) async fn dead_retry(
    State(ui): State<Ui>,
    Path(entry): Path<String>,
    Extension(user): Extension<User>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Result<Response, UiError> {
    check_action(&ui, &headers, &form)?;
    let keys = ui.keys(form.ns.as_deref())?;
    let requeued = dead::requeue(&mut ui.conn(), &keys, &ui.settings, &entry).await?;
    tracing::info!(
        action = "dead retry",
        user = who(&user),
        namespace = keys.namespace(),
        entry_id = %entry,
        submit_entry_id = %requeued.submit_entry_id,
        job_id = %requeued.job_id,
        "dashboard action"
    );
    Ok(after_action(&headers, "/dead", keys.namespace(), Notice::DeadRequeued, requeued.to_json(&entry)))
}

pub(super) async fn dead_purge(
    State(ui): State<Ui>,
    Path(entry): Path<String>,
    Extension(user): Extension<User>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Result<Response, UiError> {
    check_action(&ui, &headers, &form)?;
    let keys = ui.keys(form.ns.as_deref())?;
    let purged = dead::delete(&mut ui.conn(), &keys, std::slice::from_ref(&entry)).await?;
    tracing::info!(
        action = "dead purge",
        user = who(&user),
        namespace = keys.namespace(),
        entry_id = %entry,
        purged,
        "dashboard action"
    );
    let value = serde_json::json!({"namespace": keys.namespace(), "purged": purged});
    Ok(after_action(&headers, "/dead", keys.namespace(), Notice::DeadPurged, value))
}
