//! `batchd ui`: a web dashboard for operators, reading the same Redis as the daemons. Nothing in it is needed for
//! jobs to run; any number of instances can run beside the daemons, and it is read-only unless started with
//! `--allow-actions`.
//!
//! Pages are rendered on the server (maud) with one stylesheet and one small script, both files of this crate
//! served from `/assets/`; nothing is fetched from elsewhere, and the Content-Security-Policy says so. The script
//! only refreshes the page's `<main>` every few seconds; every page works without it. Every page has a JSON twin:
//! `/api/<page>`, or the page's own URL with `Accept: application/json`; its shape is the CLI's `--json` output
//! for the same thing (`stats`, `workers`, `jobs`, `status`, `dead list|show`), see [`data`].
//!
//! Every route answers only requests that name one of the dashboard's own hosts, and, when authentication is
//! configured (`--auth-token-file`, `--trusted-user-header`), authenticated ones ([`access`]). Every answer is
//! `Cache-Control: no-store`.
//!
//! Actions (cancel or retry jobs; pause and resume intake; retry or purge dead letters) exist only with
//! `--allow-actions`, which refuses to start on an address that is not loopback unless authentication is configured.
//! Each action is a `POST` that must come from a page of the dashboard itself: the browser's `Origin` must be one of
//! the dashboard's hosts, exactly with its scheme and port (or, without one, `Sec-Fetch-Site` must say same origin),
//! and the form's token must equal the session's (a random token in a `SameSite=Strict`, `HttpOnly` cookie,
//! `__Host-` prefixed and `Secure` under https: the double-submit pattern); one
//! extractor checks it all before the body is read (`actions::Act`). Every action is logged with what it did and who asked. Its outcome
//! comes back to the page as a [`Notice`] code, never as text. Without the flag the buttons are absent and the
//! endpoints answer 403.
//!
//! Redis may be down when it starts or go away later: the connection is opened on use and healed, pages answer 503
//! with a "Redis unreachable" page that retries by itself, and `/readyz` says whether Redis answers.
//!
//! Its memory is bounded in bytes whatever producers put in Redis ([`data`]: a result entry is read only when its
//! ledger records it at [`data::RESULT_SHOWN_BYTES`] or less, and kept for paging under [`data::RESULT_CACHE_BYTES`]),
//! and the pages that read much run [`EXPENSIVE_AT_ONCE`] at a time, the others waiting their turn (docs/ui.md, "How
//! it stays small").

mod access;
mod actions;
mod data;
mod pages;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use batchd_core::{JobState, Keys};
use batchd_queue::Conn;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::cli::Exit;
use crate::cli::inspect::JobFilter;
use crate::settings::Settings;

/// Options of `batchd ui`.
#[derive(Debug, Clone, clap::Args)]
pub struct UiArgs {
    /// Address to serve the dashboard on.
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Offer the actions (cancel or retry jobs, pause and resume intake, retry or purge dead letters). Without it
    /// the dashboard is read-only. On an address that is not loopback it needs --auth-token-file or
    /// --trusted-user-header.
    #[arg(long)]
    pub allow_actions: bool,
    /// Seconds between the pages' refreshes (0: never).
    #[arg(long, default_value_t = 5, value_name = "SECS")]
    pub refresh_secs: u64,
    /// Also answer to this host name (repeatable), e.g. the name a reverse proxy serves the dashboard under: a
    /// name means the origin https://NAME; give the whole origin (http://NAME:PORT) for another scheme or port.
    /// Actions must come from exactly that origin. localhost and IP addresses are always answered; any other name
    /// is refused (421).
    #[arg(long = "public-host", value_name = "NAME|ORIGIN")]
    pub public_hosts: Vec<String>,
    /// Require the token in this file on every request, as a bearer token or as the basic-auth password (any
    /// user name; a browser asks for it). At least 16 characters; never give it on the command line.
    #[arg(long, value_name = "PATH")]
    pub auth_token_file: Option<PathBuf>,
    /// Accept requests that carry this header (e.g. X-Forwarded-User) as authenticated by a reverse proxy. Safe
    /// only when nothing but that proxy can reach the dashboard, and the proxy sets or removes the header.
    #[arg(long, value_name = "NAME")]
    pub trusted_user_header: Option<String>,
}

/// What every handler shares.
#[derive(Clone)]
struct Ui {
    /// The Redis connection (shared, reconnecting).
    conn: Conn,
    /// The namespaces shown: `redis.namespace` first, then `redis.extra_namespaces`.
    namespaces: Arc<Vec<Keys>>,
    /// The daemon's settings (job limits for `dead retry`, the store's settings for `cancel`).
    settings: Arc<Settings>,
    /// Whether actions are offered.
    allow_actions: bool,
    /// Seconds between refreshes.
    refresh_secs: u64,
    /// Its host names and authentication.
    access: Arc<access::Access>,
    /// Turns to run an expensive page: [`EXPENSIVE_AT_ONCE`] permits ([`Ui::turn`]).
    expensive: Arc<tokio::sync::Semaphore>,
}

/// Most expensive pages (a job's page and its items, the failed jobs, a bulk retry's dry run) served at once: each
/// may copy up to [`data::RESULT_SHOWN_BYTES`] or [`data::ITEMS_SHOWN_BYTES`] out of Redis, or walk up to
/// [`data::FAILED_SCAN`] ledgers, so this bounds the dashboard's memory and the load it puts on Redis whatever the
/// number of tabs or clients. The others wait their turn ([`EXPENSIVE_WAIT`]).
pub const EXPENSIVE_AT_ONCE: usize = 2;

/// Longest wait for a turn to serve an expensive page; past it the page is answered 503 ("busy") and tries again
/// by itself. A page takes milliseconds to a second, so a click normally waits unnoticed instead of meeting an
/// error; the bound stops a flood from holding connections in line without end.
pub const EXPENSIVE_WAIT: Duration = Duration::from_secs(10);

impl Ui {
    /// The namespace a request names with `?ns=` (the first one when it names none); 404 for an unknown one.
    fn keys(&self, ns: Option<&str>) -> Result<Keys, UiError> {
        match ns {
            None | Some("") => Ok(self.namespaces[0].clone()),
            Some(name) => self
                .namespaces
                .iter()
                .find(|keys| keys.namespace() == name)
                .cloned()
                .ok_or_else(|| UiError::NotFound(format!("namespace {name:?} is not served by this dashboard"))),
        }
    }

    /// A connection for one request.
    fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// A turn to serve expensive page `page`, waited for at most [`EXPENSIVE_WAIT`] (503 past it); held until the
    /// permit is dropped.
    async fn turn(&self, page: &'static str) -> Result<tokio::sync::OwnedSemaphorePermit, UiError> {
        take_turn(&self.expensive, EXPENSIVE_WAIT).await.ok_or_else(|| {
            tracing::info!(page, at_once = EXPENSIVE_AT_ONCE, wait = ?EXPENSIVE_WAIT, "page turned away: busy");
            UiError::Busy(format!(
                "{EXPENSIVE_AT_ONCE} pages that read much (job pages, failed jobs, retry dry runs) were being served \
                 for the {} s this one waited",
                EXPENSIVE_WAIT.as_secs()
            ))
        })
    }
}

/// A permit of `turns`, waited for at most `wait`; `None` when none came free in time.
async fn take_turn(turns: &Arc<tokio::sync::Semaphore>, wait: Duration) -> Option<tokio::sync::OwnedSemaphorePermit> {
    tokio::time::timeout(wait, Arc::clone(turns).acquire_owned()).await.ok()?.ok()
}

/// `batchd ui`: serves the dashboard until `stop` is cancelled (by SIGTERM or SIGINT in `main`).
pub async fn ui(settings: Settings, args: &UiArgs, stop: CancellationToken) -> anyhow::Result<()> {
    let access = access::Access::from_args(
        args.listen,
        args.allow_actions,
        &args.public_hosts,
        args.auth_token_file.as_deref(),
        args.trusted_user_header.as_deref(),
    )
    .map_err(|error| Exit { code: crate::cli::EXIT_USAGE, message: format!("{error:#}") })?;
    crate::logging::init(&settings.log).map_err(crate::settings::ConfigError)?;
    // Opened lazily and healed after every connection error: a Redis that is down at start (or goes away later)
    // makes the pages say so, answer 503 and recover by themselves; the dashboard never exits for it (on
    // Kubernetes an exit is a restart loop).
    let conn = settings.redis_endpoint()?.dedicated(Duration::from_secs(settings.redis.response_timeout_secs.max(5)));
    let listener =
        crate::admin::bind(args.listen).await.with_context(|| format!("--listen: cannot listen on {}", args.listen))?;
    let addr = listener.local_addr().context("read the bound address")?;
    let state = Ui {
        conn,
        namespaces: Arc::new(settings.all_keys()),
        settings: Arc::new(settings),
        allow_actions: args.allow_actions,
        refresh_secs: args.refresh_secs,
        access: Arc::new(access),
        expensive: Arc::new(tokio::sync::Semaphore::new(EXPENSIVE_AT_ONCE)),
    };
    let mode = match (args.allow_actions, state.access.authenticates()) {
        (true, true) => "actions allowed, authenticated",
        (true, false) => "actions allowed",
        (false, true) => "read-only, authenticated",
        (false, false) => "read-only",
    };
    // One line on stdout for people and scripts, beside the log.
    println!("batchd ui: serving http://{addr}/ ({mode})");
    let what = format!(
        "dashboard listening ({mode}, namespaces {})",
        state.namespaces.iter().map(Keys::namespace).collect::<Vec<_>>().join(", ")
    );
    tokio::spawn(warn_if_unreachable(state.conn(), crate::settings::redact_url(state.settings.redis.url.expose())));
    crate::admin::serve_limited(listener, router(state), stop, &what).await.context("serve the dashboard")
}

/// Logs once at start when Redis does not answer, so the log says why the pages say "Redis unreachable".
async fn warn_if_unreachable(mut conn: Conn, redis: String) {
    if let Err(error) = ping(&mut conn).await {
        tracing::warn!(
            redis = %redis,
            error = %error,
            "Redis unreachable at start: the pages say so (503) until it answers, /readyz answers 503"
        );
    }
}

/// Longest wait for Redis's answer to the readiness probe's `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// `PING` within [`READY_TIMEOUT`].
async fn ping(conn: &mut Conn) -> Result<(), String> {
    match tokio::time::timeout(READY_TIMEOUT, batchd_queue::results::ping(conn)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no answer within {} s", READY_TIMEOUT.as_secs())),
    }
}

/// `/readyz`: 200 while Redis answers, 503 otherwise (a Kubernetes readiness probe; no token needed, see
/// [`access::PUBLIC_PATHS`]). The dashboard itself stays up either way.
async fn readyz(State(ui): State<Ui>) -> Response {
    let plain = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    match ping(&mut ui.conn()).await {
        Ok(()) => (StatusCode::OK, plain, "ready\n").into_response(),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, plain, "redis unreachable\n").into_response(),
    }
}

fn router(state: Ui) -> Router {
    Router::new()
        // Each page and its JSON twin are one handler (see `answer`).
        .route("/", get(overview))
        .route("/api/overview", get(overview))
        .route("/jobs", get(jobs))
        .route("/api/jobs", get(jobs))
        .route("/jobs/{id}", get(job))
        .route("/api/jobs/{id}", get(job))
        .route("/jobs/{id}/items", get(job_items))
        .route("/api/jobs/{id}/items", get(job_items))
        .route("/jobs/{id}/cancel", post(actions::cancel))
        .route("/jobs/{id}/retry", post(actions::retry_job))
        .route("/retry", get(retry_plan).post(actions::retry_jobs))
        .route("/api/retry", get(retry_plan))
        .route("/failed", get(failed))
        .route("/api/failed", get(failed))
        .route("/dead", get(dead_list))
        .route("/api/dead", get(dead_list))
        .route("/dead/{entry}", get(dead_entry))
        .route("/api/dead/{entry}", get(dead_entry))
        .route("/dead/{entry}/retry", post(actions::dead_retry))
        .route("/dead/{entry}/purge", post(actions::dead_purge))
        .route("/dead/purge", post(actions::dead_purge_matching))
        .route("/pause", post(actions::pause))
        .route("/resume", post(actions::resume))
        .route("/readyz", get(readyz))
        .route("/assets/ui.css", get(|| async { asset("text/css; charset=utf-8", include_str!("ui/ui.css")) }))
        .route("/assets/ui.js", get(|| async { asset("text/javascript; charset=utf-8", include_str!("ui/ui.js")) }))
        .fallback(|| async { UiError::NotFound("no such page".to_owned()) })
        // The guard runs first on every route (and the fallback); the headers go on every answer, refusals too.
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&state.access), access::guard))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(state)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// Headers on every answer: nothing stored by the browser or a proxy, nothing but this origin's own files may run
/// or load, no framing, no sniffing.
async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
             form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
        ),
    );
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// Why a request failed, as the page (or JSON) shows it.
#[derive(Debug)]
enum UiError {
    /// 404: no such job, entry, namespace or page.
    NotFound(String),
    /// 400: a bad parameter.
    BadRequest(String),
    /// 403: actions are off, or the request is not from the dashboard's own page.
    Forbidden(String),
    /// 409: the action cannot be done to this thing as it is (a job that cannot be retried).
    Conflict(String),
    /// 502: Redis failed (an error it answered: a permission, a wrong type).
    Redis(String),
    /// 503: Redis cannot be reached (down, refused, timed out, loading); the page retries by itself.
    Unavailable(String),
    /// 503: an expensive page waited [`EXPENSIVE_WAIT`] for its turn; the page retries by itself.
    Busy(String),
}

impl From<anyhow::Error> for UiError {
    fn from(error: anyhow::Error) -> Self {
        match error.downcast_ref::<Exit>() {
            Some(exit) if exit.code == crate::cli::EXIT_NOT_FOUND => Self::NotFound(exit.message.clone()),
            _ => match error.chain().find_map(|cause| cause.downcast_ref::<redis::RedisError>()) {
                Some(redis) if batchd_queue::connection::is_unreachable(redis) => {
                    Self::Unavailable(format!("{error:#}"))
                }
                Some(_) => Self::Redis(format!("{error:#}")),
                None => Self::BadRequest(format!("{error:#}")),
            },
        }
    }
}

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            Self::NotFound(message) => (StatusCode::NOT_FOUND, message),
            Self::BadRequest(message) => (StatusCode::BAD_REQUEST, message),
            Self::Forbidden(message) => (StatusCode::FORBIDDEN, message),
            Self::Conflict(message) => (StatusCode::CONFLICT, message),
            Self::Redis(message) => (StatusCode::BAD_GATEWAY, message),
            Self::Unavailable(message) => {
                let message = crate::cli::escape_for_terminal(&message).into_owned();
                return (StatusCode::SERVICE_UNAVAILABLE, pages::unavailable_page(&message)).into_response();
            }
            Self::Busy(message) => {
                let retry_after = [(header::RETRY_AFTER, pages::UNAVAILABLE_RETRY_SECS.to_string())];
                return (StatusCode::SERVICE_UNAVAILABLE, retry_after, pages::busy_page(&message)).into_response();
            }
        };
        let message = crate::cli::escape_for_terminal(&message).into_owned();
        (status, pages::error_page(status, &message)).into_response()
    }
}

/// Whether the client asked for JSON (`Accept: application/json`).
fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|accept| accept.contains("application/json") && !accept.contains("text/html"))
}

/// A JSON answer (API routes, and pages asked for JSON).
fn json(value: serde_json::Value) -> Response {
    axum::Json(value).into_response()
}

/// The session's action token, from its cookie (`__Host-` prefixed under https, [`access::Access::session_cookie`]);
/// a new one (with the cookie to set) when it has none.
fn session_token(access: &access::Access, headers: &HeaderMap) -> (String, Option<HeaderValue>) {
    if let Some(token) = cookie(headers, access.session_cookie(headers)).filter(|token| token.len() == 32) {
        return (token.to_owned(), None);
    }
    let token = uuid::Uuid::new_v4().simple().to_string();
    (token.clone(), HeaderValue::from_str(&access.session_set_cookie(headers, &token)).ok())
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find_map(|(key, value)| (key == name).then_some(value))
}

/// Renders an HTML page, setting the session cookie when the browser has none yet.
fn html(markup: maud::Markup, new_cookie: Option<HeaderValue>) -> Response {
    let mut response = markup.into_response();
    if let Some(cookie) = new_cookie {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

/// A page's answer: its JSON as it is, under `/api/` or when asked for (`Accept: application/json`); otherwise
/// `render`ed as HTML for the namespace of `keys`, with `notice` on top.
fn answer(
    ui: &Ui,
    request: &Request,
    keys: &Keys,
    notice: Option<Notice>,
    value: serde_json::Value,
    render: impl FnOnce(&Frame<'_>, &serde_json::Value) -> maud::Markup,
) -> Response {
    if request.uri.path().starts_with("/api/") || wants_json(&request.headers) {
        return json(value);
    }
    let (token, cookie) = session_token(&ui.access, &request.headers);
    let frame = frame(ui, keys, &token, notice);
    html(render(&frame, &value), cookie)
}

/// What [`answer`] needs of a request.
struct Request {
    /// Its URI (`/api/...` answers JSON).
    uri: Uri,
    /// Its headers (`Accept`, the session cookie).
    headers: HeaderMap,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Request {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self { uri: parts.uri.clone(), headers: parts.headers.clone() })
    }
}

/// What a page needs besides its data.
pub(crate) struct Frame<'a> {
    /// The namespace shown, for links and the title.
    pub namespace: &'a str,
    /// Every namespace served, for the switcher.
    pub namespaces: Vec<&'a str>,
    /// The session's token for action forms; `None` when actions are off.
    pub token: Option<&'a str>,
    /// Seconds between refreshes (0: none).
    pub refresh_secs: u64,
    /// An action's outcome to show on top.
    pub notice: Option<Notice>,
}

/// An action's outcome as the page after it shows it: `?notice=<code>` carries the code, never text, so a link
/// cannot make a trusted page say anything else. An unknown code shows nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notice {
    /// A running job's cancellation was recorded.
    CancelRequested,
    /// A cancellation was recorded for a job not taken in yet.
    CancelBeforeTakeIn,
    /// The job had already ended: nothing was cancelled.
    AlreadyEnded,
    /// A dead letter was put back on the submit stream.
    DeadRequeued,
    /// A dead letter was deleted.
    DeadPurged,
    /// The dead letters a filter matched were deleted.
    DeadPurgedMatching,
    /// The namespace's intake was paused.
    IntakePaused,
    /// The namespace's intake was paused already; the first pause was kept.
    AlreadyPaused,
    /// The namespace's intake was resumed.
    IntakeResumed,
    /// The namespace's intake was not paused.
    NotPaused,
    /// A failed job's retry was enqueued.
    JobRetried,
    /// The job had been retried already.
    AlreadyRetried,
    /// Every retry of a bulk retry was enqueued (or had been).
    RetriesEnqueued,
    /// Some retries of a bulk retry could not be enqueued.
    RetriesPartly,
}

impl Notice {
    /// Every notice, for parsing and tests.
    pub const ALL: [Self; 14] = [
        Self::CancelRequested,
        Self::CancelBeforeTakeIn,
        Self::AlreadyEnded,
        Self::DeadRequeued,
        Self::DeadPurged,
        Self::DeadPurgedMatching,
        Self::IntakePaused,
        Self::AlreadyPaused,
        Self::IntakeResumed,
        Self::NotPaused,
        Self::JobRetried,
        Self::AlreadyRetried,
        Self::RetriesEnqueued,
        Self::RetriesPartly,
    ];

    /// The code in the URL.
    pub fn code(self) -> &'static str {
        match self {
            Self::CancelRequested => "cancel-requested",
            Self::CancelBeforeTakeIn => "cancel-before-take-in",
            Self::AlreadyEnded => "already-ended",
            Self::DeadRequeued => "dead-requeued",
            Self::DeadPurged => "dead-purged",
            Self::DeadPurgedMatching => "dead-purged-matching",
            Self::IntakePaused => "intake-paused",
            Self::AlreadyPaused => "already-paused",
            Self::IntakeResumed => "intake-resumed",
            Self::NotPaused => "not-paused",
            Self::JobRetried => "job-retried",
            Self::AlreadyRetried => "already-retried",
            Self::RetriesEnqueued => "retries-enqueued",
            Self::RetriesPartly => "retries-partly",
        }
    }

    /// The notice a code names, if any.
    fn parse(code: Option<&str>) -> Option<Self> {
        code.and_then(|code| Self::ALL.into_iter().find(|notice| notice.code() == code))
    }

    /// The text shown.
    pub fn text(self) -> &'static str {
        match self {
            Self::CancelRequested => "Cancellation of this job requested.",
            Self::CancelBeforeTakeIn => "Cancellation requested; the job was not taken in yet.",
            Self::AlreadyEnded => "This job had already ended; nothing was cancelled.",
            Self::DeadRequeued => "The dead-letter entry was put back on the submit stream.",
            Self::DeadPurged => "The dead-letter entry was deleted.",
            Self::DeadPurgedMatching => "The matching dead-letter entries were deleted.",
            Self::IntakePaused => {
                "Intake paused: replicas stop reading the submit stream and finish the jobs they have."
            }
            Self::AlreadyPaused => "Intake was paused already; the first pause is kept.",
            Self::IntakeResumed => "Intake resumed: replicas read the submit stream again.",
            Self::NotPaused => "Intake was not paused; nothing changed.",
            Self::JobRetried => "A retry of this job was enqueued; it runs as a new job (its id ends in .retry-N).",
            Self::AlreadyRetried => "This job had been retried already; nothing was enqueued.",
            Self::RetriesEnqueued => "The retries were enqueued; each runs as a new job (its id ends in .retry-N).",
            Self::RetriesPartly => {
                "Some retries were enqueued; the others could not be (the action's log line and JSON answer say why)."
            }
        }
    }
}

#[derive(Debug, Deserialize)]
struct NsQuery {
    ns: Option<String>,
    /// A [`Notice`] code.
    notice: Option<String>,
}

/// Redis's clock, for every age and window a page shows.
async fn redis_now(conn: &mut Conn) -> Result<u64, UiError> {
    Ok(crate::cli::pause::redis_now_ms(conn).await?)
}

/// The overview's parameters.
#[derive(Debug, Deserialize)]
struct OverviewQuery {
    ns: Option<String>,
    /// A [`Notice`] code.
    notice: Option<String>,
    /// The chart's [`data::Range`] (`1h`, `24h`, `8d`).
    range: Option<String>,
}

async fn overview(
    State(ui): State<Ui>,
    Query(query): Query<OverviewQuery>,
    request: Request,
) -> Result<Response, UiError> {
    let keys = ui.keys(query.ns.as_deref())?;
    let range = data::Range::parse(query.range.as_deref());
    let mut conn = ui.conn();
    let now = redis_now(&mut conn).await?;
    let mut namespaces = Vec::new();
    for keys in ui.namespaces.iter() {
        namespaces.push(data::overview(&mut conn, keys, now, range).await?);
    }
    let value = serde_json::json!({"at": now, "namespaces": namespaces});
    Ok(answer(&ui, &request, &keys, Notice::parse(query.notice.as_deref()), value, pages::overview))
}

fn frame<'a>(ui: &'a Ui, keys: &'a Keys, token: &'a str, notice: Option<Notice>) -> Frame<'a> {
    Frame {
        namespace: keys.namespace(),
        namespaces: ui.namespaces.iter().map(Keys::namespace).collect(),
        token: ui.allow_actions.then_some(token),
        refresh_secs: ui.refresh_secs,
        notice,
    }
}

/// The jobs list's filters and position, as query parameters.
#[derive(Debug, Default, Deserialize)]
struct JobsQuery {
    ns: Option<String>,
    /// A job state.
    state: Option<String>,
    /// A model name.
    model: Option<String>,
    /// A provider (`cloudflare`, `openai`, ...).
    provider: Option<String>,
    /// A remote batch id: the answer is a redirect to the job (or pack) whose batch it is.
    remote: Option<String>,
    /// A job id prefix.
    prefix: Option<String>,
    /// Accepted within this long (`30m`, `2h`, `1d`) or since this time (`2025-11-22T08:00:00Z`, Unix ms).
    since: Option<String>,
    /// The `SCAN` cursor of the page.
    cursor: Option<u64>,
}

/// A time given as a query parameter, in Unix ms: the CLI's own reading of a time (`batchd retry --since`), an age
/// counted back from `now` (`30m`, `2h`, `1d`) or a time; `None` when absent or empty.
fn time_param(what: &str, value: &Option<String>, now: u64) -> Result<Option<u64>, UiError> {
    nonempty(value)
        .map(|text| {
            crate::cli::retry::parse_time(text)
                .map(|time| time.resolve(now))
                .map_err(|e| UiError::BadRequest(format!("{what} {text:?}: {e}")))
        })
        .transpose()
}

/// A job id from a URL's path, as the CLI parses one; 400 for anything else.
fn job_id(id: &str) -> Result<batchd_core::JobId, UiError> {
    crate::cli::parse_job_id(id).map_err(|e| UiError::BadRequest(format!("{e:#}")))
}

/// A query parameter's value, trimmed; `None` when absent or empty.
fn nonempty(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

impl JobsQuery {
    fn filter(&self, now: u64) -> Result<JobFilter, UiError> {
        let states = match nonempty(&self.state) {
            Some(state) => {
                vec![state.parse::<JobState>().map_err(|_| UiError::BadRequest(format!("no job state {state:?}")))?]
            }
            None => Vec::new(),
        };
        let accepted_since = time_param("accepted within", &self.since, now)?;
        Ok(JobFilter {
            states,
            model: nonempty(&self.model).map(str::to_owned),
            provider: nonempty(&self.provider).map(str::to_owned),
            id_prefix: nonempty(&self.prefix).map(str::to_owned),
            accepted_since,
        })
    }
}

async fn jobs(State(ui): State<Ui>, Query(query): Query<JobsQuery>, request: Request) -> Result<Response, UiError> {
    let keys = ui.keys(query.ns.as_deref())?;
    let mut conn = ui.conn();
    if let Some(remote) = nonempty(&query.remote) {
        // Up to 100,000 ledgers read: an expensive page, taking its turn.
        let _turn = ui.turn("remote batch look-up").await?;
        let (job_id, _) = crate::cli::inspect::job_of_remote(&mut conn, &keys, remote).await?;
        let api = if request.uri.path().starts_with("/api/") { "/api" } else { "" };
        let path = format!("{api}/jobs/{}?ns={}", pages::encode(&job_id), pages::encode(keys.namespace()));
        return Ok(axum::response::Redirect::to(&path).into_response());
    }
    let now = redis_now(&mut conn).await?;
    let filter = query.filter(now)?;
    let page = data::jobs(&mut conn, &keys, &filter, query.cursor.unwrap_or(0)).await?;
    let mut value = serde_json::to_value(&page).map_err(|e| UiError::BadRequest(e.to_string()))?;
    crate::cli::inspect::annotate_jobs(&mut value, now);
    let filters = pages::JobsFilters {
        state: query.state.as_deref().unwrap_or(""),
        model: query.model.as_deref().unwrap_or(""),
        provider: query.provider.as_deref().unwrap_or(""),
        prefix: query.prefix.as_deref().unwrap_or(""),
        since: query.since.as_deref().unwrap_or(""),
    };
    Ok(answer(&ui, &request, &keys, None, value, |frame, value| pages::jobs(frame, &filters, value)))
}

/// What a job's pages take as query parameters: the job page and its request items' page.
#[derive(Debug, Deserialize)]
struct JobQuery {
    ns: Option<String>,
    /// The page of responses, or of the chunk's request items (from 0).
    page: Option<usize>,
    /// A [`Notice`] code.
    notice: Option<String>,
    /// The chunk whose request items are shown (from 0).
    chunk: Option<usize>,
}

impl JobQuery {
    /// The namespace's keys and the job id of `id`, checked.
    fn target(&self, ui: &Ui, id: &str) -> Result<(Keys, batchd_core::JobId), UiError> {
        Ok((ui.keys(self.ns.as_deref())?, job_id(id)?))
    }
}

async fn job(
    State(ui): State<Ui>,
    Path(id): Path<String>,
    Query(query): Query<JobQuery>,
    request: Request,
) -> Result<Response, UiError> {
    let (keys, job_id) = query.target(&ui, &id)?;
    let _turn = ui.turn("job").await?;
    let mut conn = ui.conn();
    let now = redis_now(&mut conn).await?;
    let budget = ui.settings.budget.for_namespace(keys.namespace());
    let mut value = data::job(&mut conn, &keys, &job_id, query.page.unwrap_or(0), budget).await?;
    value["at"] = now.into();
    Ok(answer(&ui, &request, &keys, Notice::parse(query.notice.as_deref()), value, pages::job))
}

/// A job's request items, one chunk and one page at a time, read only here (the job's page reads none).
async fn job_items(
    State(ui): State<Ui>,
    Path(id): Path<String>,
    Query(query): Query<JobQuery>,
    request: Request,
) -> Result<Response, UiError> {
    let (keys, job_id) = query.target(&ui, &id)?;
    let (chunk, page) = (query.chunk.unwrap_or(0), query.page.unwrap_or(0));
    let _turn = ui.turn("job items").await?;
    let value = data::job_items(&mut ui.conn(), &keys, &job_id, chunk, page).await?;
    Ok(answer(&ui, &request, &keys, None, value, pages::job_items))
}

/// The failed-jobs page's filters and position, as query parameters.
#[derive(Debug, Default, Deserialize)]
struct FailedQuery {
    ns: Option<String>,
    /// A [`Notice`] code.
    notice: Option<String>,
    /// `failed`, `expired` or `cancelled` (all three when empty).
    state: Option<String>,
    /// A model name.
    model: Option<String>,
    /// An error code.
    code: Option<String>,
    /// Finished within this long (`30m`, `2h`, `1d`) or since this time.
    since: Option<String>,
    /// The `SCAN` cursor to continue the walk from.
    cursor: Option<u64>,
}

impl FailedQuery {
    /// The listing's query: at most [`data::FAILED_SCAN`] ledgers, [`data::FAILED_EXAMPLES`] examples a group.
    fn query(&self, now: u64) -> Result<batchd_queue::failed::FailedQuery, UiError> {
        let states = match nonempty(&self.state) {
            Some(state) => {
                let state =
                    state.parse::<JobState>().map_err(|_| UiError::BadRequest(format!("no job state {state:?}")))?;
                if !batchd_queue::failed::FAILED_STATES.contains(&state) {
                    return Err(UiError::BadRequest(format!("{state} is not a state of a failed job")));
                }
                vec![state]
            }
            None => Vec::new(),
        };
        Ok(batchd_queue::failed::FailedQuery {
            states,
            model: nonempty(&self.model).map(str::to_owned),
            code: nonempty(&self.code).map(str::to_owned),
            since: time_param("finished within", &self.since, now)?,
            examples: data::FAILED_EXAMPLES,
            max_scanned: data::FAILED_SCAN,
            cursor: self.cursor.unwrap_or(0),
        })
    }

    /// The filters as given, to fill the form again and build links.
    fn filters(&self) -> pages::FailedFilters<'_> {
        pages::FailedFilters {
            state: self.state.as_deref().unwrap_or(""),
            model: self.model.as_deref().unwrap_or(""),
            code: self.code.as_deref().unwrap_or(""),
            since: self.since.as_deref().unwrap_or(""),
        }
    }
}

async fn failed(State(ui): State<Ui>, Query(query): Query<FailedQuery>, request: Request) -> Result<Response, UiError> {
    let keys = ui.keys(query.ns.as_deref())?;
    let _turn = ui.turn("failed").await?;
    let mut conn = ui.conn();
    let now = redis_now(&mut conn).await?;
    let value = data::failed(&mut conn, &keys, &query.query(now)?).await?;
    let filters = query.filters();
    Ok(answer(&ui, &request, &keys, Notice::parse(query.notice.as_deref()), value, |frame, value| {
        pages::failed(frame, &filters, value)
    }))
}

/// A bulk retry's dry run (`/retry` with the failed-jobs page's filters): what would be retried, checked without
/// reading a payload; with actions, the form that retries exactly those jobs.
async fn retry_plan(
    State(ui): State<Ui>,
    Query(query): Query<FailedQuery>,
    request: Request,
) -> Result<Response, UiError> {
    let keys = ui.keys(query.ns.as_deref())?;
    let _turn = ui.turn("retry dry run").await?;
    let mut conn = ui.conn();
    let now = redis_now(&mut conn).await?;
    let value = data::retry_plan(&mut conn, &keys, &query.query(now)?).await?;
    let filters = query.filters();
    Ok(answer(&ui, &request, &keys, None, value, |frame, value| pages::retry_plan(frame, &filters, value)))
}

/// The dead-letter list's filter, as query parameters.
#[derive(Debug, Deserialize)]
struct DeadQuery {
    ns: Option<String>,
    /// A [`Notice`] code.
    notice: Option<String>,
    /// Text the entry's error contains (any case).
    error: Option<String>,
    /// Dead before this time: an age (`30m`, `2h`, `1d`) or a time, read as `batchd retry --since` reads it.
    before: Option<String>,
}

async fn dead_list(
    State(ui): State<Ui>,
    Query(query): Query<DeadQuery>,
    request: Request,
) -> Result<Response, UiError> {
    let keys = ui.keys(query.ns.as_deref())?;
    let mut conn = ui.conn();
    let before = time_param("dead before", &query.before, redis_now(&mut conn).await?)?;
    let filter = data::DeadFilter { error: nonempty(&query.error).map(str::to_lowercase), before };
    let value = data::dead_list(&mut conn, &keys, &filter).await?;
    let filters = pages::DeadFilters {
        error: query.error.as_deref().unwrap_or(""),
        before: query.before.as_deref().unwrap_or(""),
    };
    Ok(answer(&ui, &request, &keys, Notice::parse(query.notice.as_deref()), value, |frame, value| {
        pages::dead_list(frame, &filters, value)
    }))
}

async fn dead_entry(
    State(ui): State<Ui>,
    Path(entry): Path<String>,
    Query(query): Query<NsQuery>,
    request: Request,
) -> Result<Response, UiError> {
    let keys = ui.keys(query.ns.as_deref())?;
    let value = data::dead_entry(&mut ui.conn(), &keys, &entry).await?;
    Ok(answer(&ui, &request, &keys, Notice::parse(query.notice.as_deref()), value, pages::dead_entry))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_cookie_is_read_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, HeaderValue::from_static("a=1; batchd_ui_session=abc; b=2"));
        assert_eq!(cookie(&headers, access::SESSION_COOKIE), Some("abc"));
        assert_eq!(cookie(&headers, "c"), None);
    }

    #[test]
    fn a_notice_is_a_known_code_or_nothing() {
        for notice in Notice::ALL {
            assert_eq!(Notice::parse(Some(notice.code())), Some(notice));
        }
        assert_eq!(Notice::parse(Some("Your session expired: log in at evil.example")), None);
        assert_eq!(Notice::parse(None), None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_expensive_page_waits_its_turn_for_a_while_then_is_told_busy() {
        let turns = Arc::new(tokio::sync::Semaphore::new(EXPENSIVE_AT_ONCE));
        let mut held = Vec::new();
        for _ in 0..EXPENSIVE_AT_ONCE {
            held.push(take_turn(&turns, Duration::ZERO).await.expect("the first ones run at once"));
        }
        // One more waits; a turn that comes free within the wait is taken.
        let waiting = tokio::spawn({
            let turns = Arc::clone(&turns);
            async move { take_turn(&turns, EXPENSIVE_WAIT).await.is_some() }
        });
        tokio::time::sleep(EXPENSIVE_WAIT / 2).await;
        drop(held.pop());
        assert!(waiting.await.unwrap(), "served once a turn came free");
        // With every turn held for longer than the wait, the page is told busy when the wait ends, not before.
        let started = tokio::time::Instant::now();
        let _also_held = take_turn(&turns, Duration::ZERO).await.expect("the freed turn");
        assert!(take_turn(&turns, EXPENSIVE_WAIT).await.is_none());
        assert_eq!(started.elapsed(), EXPENSIVE_WAIT);
    }

    #[test]
    fn busy_is_a_503_that_says_when_to_try_again() {
        let response = UiError::Busy("2 pages".to_owned()).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], pages::UNAVAILABLE_RETRY_SECS.to_string().as_str());
    }

    #[test]
    fn json_is_what_is_asked_for() {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        assert!(wants_json(&headers));
        headers.insert(header::ACCEPT, HeaderValue::from_static("text/html,application/json;q=0.9"));
        assert!(!wants_json(&headers));
    }
}
