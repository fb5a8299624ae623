//! The Gemini emulator's control API under `/_emulator/gemini/`, for tests outside the process (the in-process
//! [`super::GeminiControl`] does the same without HTTP). No authentication: loopback only.

use std::{sync::Arc, time::SystemTime};

use axum::{
    Json, Router,
    extract::State,
    http::StatusCode,
    routing::{get, post},
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Gemini, GeminiCall, GeminiConfig, GeminiFault};
use crate::hold::{HeldView, Released};

/// The control routes.
pub(crate) fn routes() -> Router<Arc<Gemini>> {
    Router::new()
        .route("/_emulator/gemini/faults", get(list_faults).post(add_faults))
        .route("/_emulator/gemini/calls", get(list_calls))
        .route("/_emulator/gemini/config", get(get_config).post(set_config))
        .route("/_emulator/gemini/reset", post(reset))
        .route("/_emulator/gemini/batches", get(list_batches))
        .route("/_emulator/gemini/held", get(held))
        .route("/_emulator/gemini/held/release", post(release_held))
}

/// `POST /_emulator/gemini/faults`: one fault or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum FaultsBody {
    /// A single fault.
    One(GeminiFault),
    /// Several, queued in order.
    Many(Vec<GeminiFault>),
}

fn control(gemini: &Arc<Gemini>) -> super::GeminiControl {
    // The address only shapes `base_url`, which the control routes never answer.
    super::GeminiControl::new(([127, 0, 0, 1], 0).into(), Arc::clone(gemini))
}

async fn add_faults(State(gemini): State<Arc<Gemini>>, Json(body): Json<FaultsBody>) -> Json<Vec<GeminiFault>> {
    let faults = match body {
        FaultsBody::One(fault) => vec![fault],
        FaultsBody::Many(faults) => faults,
    };
    let control = control(&gemini);
    for fault in faults {
        control.inject(fault);
    }
    Json(control.pending_faults())
}

async fn list_faults(State(gemini): State<Arc<Gemini>>) -> Json<Vec<GeminiFault>> {
    Json(control(&gemini).pending_faults())
}

async fn list_calls(State(gemini): State<Arc<Gemini>>) -> Json<Vec<GeminiCall>> {
    Json(control(&gemini).calls())
}

async fn get_config(State(gemini): State<Arc<Gemini>>) -> Json<GeminiConfig> {
    Json(control(&gemini).config())
}

/// `POST /_emulator/gemini/config`: the fields given replace the settings' (`{"pending_ms":0,"running_ms":5000}`);
/// unknown fields are refused (422).
async fn set_config(
    State(gemini): State<Arc<Gemini>>,
    Json(change): Json<Value>,
) -> Result<Json<GeminiConfig>, StatusCode> {
    let control = control(&gemini);
    let mut merged = serde_json::to_value(control.config()).map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    let (Value::Object(fields), Value::Object(settings)) = (change, &mut merged) else {
        return Err(StatusCode::UNPROCESSABLE_ENTITY);
    };
    settings.extend(fields);
    let config: GeminiConfig = serde_json::from_value(merged).map_err(|_| StatusCode::UNPROCESSABLE_ENTITY)?;
    tracing::info!(?config, "gemini settings changed");
    Ok(Json(control.update_config(|current| *current = config)))
}

async fn reset(State(gemini): State<Arc<Gemini>>) -> StatusCode {
    control(&gemini).reset();
    StatusCode::NO_CONTENT
}

/// `GET /_emulator/gemini/batches`: every batch's name and state, oldest first.
async fn list_batches(State(gemini): State<Arc<Gemini>>) -> Json<Value> {
    let now = SystemTime::now();
    let mut inner = gemini.lock();
    let config = inner.config.clone();
    let batches: Vec<Value> = inner
        .store
        .names()
        .into_iter()
        .filter_map(|name| {
            let state = inner.store.state(&name, now, &config)?;
            Some(json!({ "name": name, "state": state.name(config.job_state_names) }))
        })
        .collect();
    Json(Value::Array(batches))
}

/// `GET /_emulator/gemini/held`: how many replies a `hold` fault keeps open now, and ever did.
async fn held(State(gemini): State<Arc<Gemini>>) -> Json<HeldView> {
    Json(gemini.holds.view())
}

/// `POST /_emulator/gemini/held/release`: lets every held reply go.
async fn release_held(State(gemini): State<Arc<Gemini>>) -> Json<Released> {
    Json(Released { released: gemini.holds.release() })
}
