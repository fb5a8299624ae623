//! The dashboard's actions (with `--allow-actions`): cancel a job; retry a failed job, or the failed jobs a filter
//! matched (after a dry run); retry or purge dead letters (one, or all that match a filter); pause and resume a
//! namespace's intake. Each is a `POST` that passes one guard, the [`Act`]
//! extractor, before anything is read from its body: actions on (403 otherwise, even for a bare `POST`), an
//! `Origin` among the dashboard's hosts, and the form's token equal to the session's. Each is carried out through
//! the same functions as the CLI's (the producer's `cancel`, `rerun::prepare`, `dead::requeue`, `dead::delete`,
//! the pause flag),
//! logged with what it did and who asked, and answered with a redirect whose [`Notice`] code the next page shows.

use axum::extract::{Form, FromRequest, Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use batchd_core::{JobId, JobState, Keys};
use batchd_producer::CancelOutcome;
use batchd_queue::rerun::Rerun;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::access::User;
use super::data::DEAD_LIST_LIMIT;
use super::{Notice, Ui, UiError, cookie, json, wants_json};
use crate::cli::dead;
use crate::cli::pause::PauseRecord;

/// An action that passed every guard: the namespace it acts on, who asked, and its own form fields `F`.
pub(super) struct Act<F> {
    /// The namespace acted on (the form's `ns`).
    keys: Keys,
    /// Who asked (for the log).
    user: User,
    /// Whether the answer is JSON (`Accept: application/json`) rather than a redirect.
    json: bool,
    /// The action's own fields.
    fields: F,
}

/// The form of every action: the session's token, the namespace, and the action's own fields.
#[derive(Debug, Deserialize)]
struct ActionForm<F> {
    /// Must equal the session cookie's token.
    token: String,
    /// The namespace acted on.
    ns: Option<String>,
    /// The action's own fields (text only: a flattened form carries strings).
    #[serde(flatten)]
    fields: F,
}

/// The fields of an action that has none of its own.
#[derive(Debug, Deserialize)]
pub(super) struct NoFields {}

impl<F: DeserializeOwned + Send> FromRequest<Ui> for Act<F> {
    type Rejection = UiError;

    /// Refuses an action unless actions are on and the request comes from a page of this dashboard: an `Origin`
    /// among the dashboard's own hosts (checked against its list, not against `Host`, which a rebinding page
    /// controls), and the form's token equal to the session cookie's. The first two are checked before the body is
    /// read, so a read-only dashboard answers 403 to any `POST`, with or without a form.
    async fn from_request(request: axum::extract::Request, ui: &Ui) -> Result<Self, UiError> {
        if !ui.allow_actions {
            return Err(UiError::Forbidden(
                "actions are off: this dashboard is read-only (start it with --allow-actions)".to_owned(),
            ));
        }
        let headers = request.headers();
        if !ui.access.is_own_origin(headers) {
            return Err(UiError::Forbidden(
                "refused: the request does not come from this dashboard's pages".to_owned(),
            ));
        }
        let session =
            cookie(headers, ui.access.session_cookie(headers)).filter(|token| !token.is_empty()).map(str::to_owned);
        let json = wants_json(headers);
        let user = request.extensions().get::<User>().cloned().unwrap_or(User(None));
        let Form(form) = Form::<ActionForm<F>>::from_request(request, ui)
            .await
            .map_err(|rejection| UiError::BadRequest(format!("the action's form: {}", rejection.body_text())))?;
        if session.as_deref() != Some(form.token.as_str()) {
            return Err(UiError::Forbidden(
                "refused: the form's token is not this session's (reload the page)".to_owned(),
            ));
        }
        let keys = ui.keys(form.ns.as_deref())?;
        Ok(Self { keys, user, json, fields: form.fields })
    }
}

impl<F> Act<F> {
    /// Who asked, for the log: the authenticated user, or `-` without authentication.
    fn who(&self) -> &str {
        self.user.0.as_deref().unwrap_or("-")
    }

    /// The answer: `value` as JSON when asked for, otherwise a redirect (`303`) to `path` in this namespace with
    /// the notice's code, so reloading the page after it repeats nothing.
    fn answer(&self, path: &str, notice: Notice, value: serde_json::Value) -> Response {
        if self.json {
            return json(value);
        }
        let separator = if path.contains('?') { '&' } else { '?' };
        let ns = super::pages::encode(self.keys.namespace());
        Redirect::to(&format!("{path}{separator}ns={ns}&notice={}", notice.code())).into_response()
    }
}

pub(super) async fn cancel(
    State(ui): State<Ui>,
    Path(id): Path<String>,
    act: Act<NoFields>,
) -> Result<Response, UiError> {
    let keys = &act.keys;
    let job_id = super::job_id(&id)?;
    let producer =
        crate::cli::producer_on(&ui.settings, ui.conn(), keys.clone()).map_err(|e| UiError::Redis(format!("{e:#}")))?;
    let outcome = producer
        .cancel(&job_id, "cancelled from the dashboard")
        .await
        .map_err(|e| anyhow::Error::new(e).context(format!("cancel job {job_id}")))?;
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
        user = act.who(),
        namespace = keys.namespace(),
        job_id = %job_id,
        state = %state,
        "dashboard action"
    );
    let value = serde_json::json!({"job_id": job_id.as_str(), "state": state, "notice": notice});
    Ok(act.answer(&format!("/jobs/{job_id}"), code, value))
}

pub(super) async fn dead_retry(
    State(ui): State<Ui>,
    Path(entry): Path<String>,
    act: Act<NoFields>,
) -> Result<Response, UiError> {
    let keys = &act.keys;
    let requeued = dead::requeue(&mut ui.conn(), keys, &ui.settings, &entry).await?;
    tracing::info!(
        action = "dead retry",
        user = act.who(),
        namespace = keys.namespace(),
        entry_id = %entry,
        submit_entry_id = %requeued.submit_entry_id,
        job_id = %requeued.job_id,
        "dashboard action"
    );
    Ok(act.answer("/dead", Notice::DeadRequeued, requeued.to_json(&entry)))
}

pub(super) async fn dead_purge(
    State(ui): State<Ui>,
    Path(entry): Path<String>,
    act: Act<NoFields>,
) -> Result<Response, UiError> {
    purge(&act, &ui, std::slice::from_ref(&entry), Notice::DeadPurged).await
}

/// The fields of purging the dead letters a filter matched.
#[derive(Debug, Deserialize)]
pub(super) struct PurgeFields {
    /// The matching entries' ids, as the page listed them, separated by commas.
    entries: String,
}

/// Deletes the dead letters a filter of the dead-letter page matched: exactly the entries the page listed (at
/// most [`DEAD_LIST_LIMIT`]), not whatever matches when the request arrives, so nothing the operator did not see
/// is deleted. All or none, as `batchd dead purge` does.
pub(super) async fn dead_purge_matching(State(ui): State<Ui>, act: Act<PurgeFields>) -> Result<Response, UiError> {
    let entries: Vec<String> =
        act.fields.entries.split(',').map(str::trim).filter(|id| !id.is_empty()).map(str::to_owned).collect();
    if entries.is_empty() || entries.len() > DEAD_LIST_LIMIT {
        return Err(UiError::BadRequest(format!(
            "purge takes 1 to {DEAD_LIST_LIMIT} dead-letter entries, {} given",
            entries.len()
        )));
    }
    purge(&act, &ui, &entries, Notice::DeadPurgedMatching).await
}

/// Deletes dead-letter entries `entries` (all or none) and logs it.
async fn purge<F>(act: &Act<F>, ui: &Ui, entries: &[String], notice: Notice) -> Result<Response, UiError> {
    let keys = &act.keys;
    let purged = dead::delete(&mut ui.conn(), keys, entries).await?;
    tracing::info!(
        action = "dead purge",
        user = act.who(),
        namespace = keys.namespace(),
        entry_ids = %entries.join(","),
        purged,
        "dashboard action"
    );
    let value = serde_json::json!({"namespace": keys.namespace(), "purged": purged});
    Ok(act.answer("/dead", notice, value))
}

/// The fields of a pause.
#[derive(Debug, Deserialize)]
pub(super) struct PauseFields {
    /// Why, shown by `stats`, `workers`, `/readyz` and the overview.
    reason: Option<String>,
}

/// Longest pause reason taken from the form.
const MAX_REASON_CHARS: usize = 200;

/// Pauses the namespace's intake as `batchd pause` does (the pause flag, kept when already set): every replica
/// stops reading the submit stream and finishes what it has.
pub(super) async fn pause(State(ui): State<Ui>, act: Act<PauseFields>) -> Result<Response, UiError> {
    let keys = &act.keys;
    let mut conn = ui.conn();
    let reason = act.fields.reason.as_deref().map(str::trim).filter(|reason| !reason.is_empty());
    let record = PauseRecord {
        by: format!("dashboard ({})", act.who()),
        at: Some(super::redis_now(&mut conn).await?),
        reason: reason.map(|reason| reason.chars().take(MAX_REASON_CHARS).collect()),
    };
    let value = serde_json::to_string(&record).map_err(|e| UiError::BadRequest(format!("pause record: {e}")))?;
    let changed = batchd_queue::inspect::set_pause_flag(&mut conn, keys, &value)
        .await
        .map_err(|e| anyhow::Error::new(e).context("set the pause flag"))?;
    tracing::info!(action = "pause", user = act.who(), namespace = keys.namespace(), changed, "dashboard action");
    let notice = if changed { Notice::IntakePaused } else { Notice::AlreadyPaused };
    Ok(act.answer("/", notice, serde_json::json!({"namespace": keys.namespace(), "paused": true, "changed": changed})))
}

/// Resumes the namespace's intake as `batchd resume` does (deletes the pause flag).
pub(super) async fn resume(State(ui): State<Ui>, act: Act<NoFields>) -> Result<Response, UiError> {
    let keys = &act.keys;
    let was = batchd_queue::inspect::clear_pause_flag(&mut ui.conn(), keys)
        .await
        .map_err(|e| anyhow::Error::new(e).context("clear the pause flag"))?;
    let changed = was.is_some();
    tracing::info!(action = "resume", user = act.who(), namespace = keys.namespace(), changed, "dashboard action");
    let notice = if changed { Notice::IntakeResumed } else { Notice::NotPaused };
    Ok(act.answer("/", notice, serde_json::json!({"namespace": keys.namespace(), "paused": false, "changed": changed})))
}

/// Retries job `job_id` as `batchd retry <id>` does: checks it ended without completing and still holds its items,
/// rebuilds it from its ledger, validates it with the daemon's rules and enqueues it as `<id>.retry-<n>`
/// ([`batchd_queue::rerun::prepare`]). `{"job_id":..,"retry_id":..,"outcome":"retried|already_retried|
/// not_retryable","reason":..,"submit_entry_id":..}`.
async fn retry_one(ui: &Ui, keys: &Keys, job_id: &JobId) -> Result<serde_json::Value, UiError> {
    let mut conn = ui.conn();
    let retry = match super::data::retry_id(job_id) {
        Ok(retry) => retry,
        Err(reason) => {
            return Ok(serde_json::json!({"job_id": job_id.as_str(), "outcome": "not_retryable", "reason": reason}));
        }
    };
    let prepared = batchd_queue::rerun::prepare(&mut conn, keys, &ui.settings.job_limits(), job_id, &retry)
        .await
        .map_err(|e| anyhow::Error::new(e).context(format!("prepare the retry of {job_id}")))?;
    let (outcome, reason, entry) = match prepared {
        Rerun::Ready(job) => {
            let entry = batchd_queue::inspect::enqueue(&mut conn, keys, job.as_bytes())
                .await
                .map_err(|e| anyhow::Error::new(e).context(format!("enqueue the retry of {job_id}")))?;
            ("retried", None, Some(entry))
        }
        Rerun::AlreadyRetried => ("already_retried", None, None),
        Rerun::NotRetryable(reason) => ("not_retryable", Some(reason), None),
        Rerun::Possible => ("not_retryable", Some("not rebuilt".to_owned()), None),
    };
    Ok(serde_json::json!({
        "job_id": job_id.as_str(),
        "retry_id": retry.as_str(),
        "outcome": outcome,
        "reason": reason,
        "submit_entry_id": entry,
    }))
}

/// Retries one job from its page (a job that ended failed, expired or cancelled).
pub(super) async fn retry_job(
    State(ui): State<Ui>,
    Path(id): Path<String>,
    act: Act<NoFields>,
) -> Result<Response, UiError> {
    let job_id = super::job_id(&id)?;
    let row = retry_one(&ui, &act.keys, &job_id).await?;
    tracing::info!(
        action = "retry",
        user = act.who(),
        namespace = act.keys.namespace(),
        job_id = %job_id,
        outcome = %row["outcome"].as_str().unwrap_or(""),
        retry_id = %row["retry_id"].as_str().unwrap_or(""),
        "dashboard action"
    );
    let notice = match row["outcome"].as_str() {
        Some("retried") => Notice::JobRetried,
        Some("already_retried") => Notice::AlreadyRetried,
        _ => {
            let reason = row["reason"].as_str().unwrap_or("");
            return Err(UiError::Conflict(format!("job {job_id} cannot be retried: {reason}")));
        }
    };
    Ok(act.answer(&format!("/jobs/{}", super::pages::encode(job_id.as_str())), notice, row))
}

/// The fields of a bulk retry: the jobs its dry run listed as retryable.
#[derive(Debug, Deserialize)]
pub(super) struct RetryFields {
    /// Their ids, separated by commas.
    jobs: String,
}

/// Retries the jobs a bulk retry's dry run listed (at most [`super::data::RETRY_BATCH`]), each as [`retry_job`]
/// does: exactly those the operator saw and confirmed, not whatever matches when the request arrives.
pub(super) async fn retry_jobs(State(ui): State<Ui>, act: Act<RetryFields>) -> Result<Response, UiError> {
    let ids: Vec<&str> = act.fields.jobs.split(',').map(str::trim).filter(|id| !id.is_empty()).collect();
    if ids.is_empty() || ids.len() > super::data::RETRY_BATCH {
        return Err(UiError::BadRequest(format!(
            "a bulk retry takes 1 to {} jobs, {} given",
            super::data::RETRY_BATCH,
            ids.len()
        )));
    }
    let job_ids = ids
        .iter()
        .map(|id| JobId::parse(id).map_err(|e| UiError::BadRequest(format!("job id {id:?} {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let mut rows = Vec::with_capacity(job_ids.len());
    for job_id in &job_ids {
        rows.push(retry_one(&ui, &act.keys, job_id).await?);
    }
    let count = |outcome: &str| rows.iter().filter(|row| row["outcome"] == outcome).count();
    let (retried, already, refused) = (count("retried"), count("already_retried"), count("not_retryable"));
    tracing::info!(
        action = "retry matching",
        user = act.who(),
        namespace = act.keys.namespace(),
        retried,
        already_retried = already,
        not_retryable = refused,
        job_ids = %ids.join(","),
        "dashboard action"
    );
    let notice = if refused == 0 { Notice::RetriesEnqueued } else { Notice::RetriesPartly };
    let value = serde_json::json!({
        "namespace": act.keys.namespace(),
        "retried": retried,
        "already_retried": already,
        "not_retryable": refused,
        "jobs": rows,
    });
    Ok(act.answer("/failed", notice, value))
}
