//! Fake Batch API servers: an axum router on a free port, or a raw TCP listener that misbehaves.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Response, StatusCode, Uri};
use axum::routing::post;
use batchd_cloudflare::{ApiToken, BatchClient, ClientSettings};
use batchd_core::ModelName;
use serde_json::value::RawValue;

/// The token every test client sends; no error or debug output may contain it.
pub const TOKEN: &str = "tok-SECRET-4f9a2c";
/// The account every test client uses.
pub const ACCOUNT: &str = "acct0123";

/// One request the fake server received.
#[derive(Debug, Clone)]
pub struct Received {
    /// Path and query.
    pub uri: String,
    /// The `Authorization` header.
    pub authorization: Option<String>,
    /// The `Content-Type` header.
    pub content_type: Option<String>,
    /// The body, as text.
    pub body: String,
}

/// What the fake server answers: status, extra headers, body.
#[derive(Debug, Clone)]
pub struct Canned {
    /// HTTP status.
    pub status: u16,
    /// Extra headers.
    pub headers: Vec<(&'static str, String)>,
    /// Body text.
    pub body: String,
    /// Delay before answering.
    pub delay: Duration,
}

impl Canned {
    /// A reply with a status and a body.
    pub fn new(status: u16, body: impl Into<String>) -> Self {
        Self { status, headers: Vec::new(), body: body.into(), delay: Duration::ZERO }
    }

    /// Adds a header.
    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    /// Answers only after `delay`.
    pub fn delayed(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// A fake server that gives `replies` in turn (the last one forever) and records what it received.
pub struct FakeApi {
    /// The server's address.
    pub addr: SocketAddr,
    /// Requests received so far.
    pub received: Arc<Mutex<Vec<Received>>>,
}

impl FakeApi {
    /// Starts the server.
    pub async fn start(replies: Vec<Canned>) -> Self {
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let replies = Arc::new(replies);
        let log = received.clone();
        let handler = move |uri: Uri, headers: HeaderMap, body: Bytes| {
            let log = log.clone();
            let replies = replies.clone();
            async move {
                let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
                let n_before = {
                    let mut log = log.lock().expect("lock");
                    log.push(Received {
                        uri: uri.to_string(),
                        authorization: header("authorization"),
                        content_type: header("content-type"),
                        body: String::from_utf8_lossy(&body).into_owned(),
                    });
                    log.len() - 1
                };
                let canned = replies[n_before.min(replies.len() - 1)].clone();
                tokio::time::sleep(canned.delay).await;
                let mut response = Response::builder().status(StatusCode::from_u16(canned.status).expect("status"));
                for (name, value) in &canned.headers {
                    response = response.header(*name, value);
                }
                response.body(Body::from(canned.body)).expect("response")
            }
        };
        let router = Router::new().route("/client/v4/accounts/{account}/ai/run/{*model}", post(handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
        Self { addr, received }
    }

    /// A client for this server.
    pub fn client(&self) -> BatchClient {
        client_for(self.addr, Duration::from_secs(5))
    }

    /// Requests received so far.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().expect("lock").clone()
    }
}

/// Settings pointing at `addr`.
pub fn settings_for(addr: SocketAddr, request_timeout: Duration) -> ClientSettings {
    ClientSettings {
        base_url: format!("http://{addr}/client/v4"),
        request_timeout,
        connect_timeout: Duration::from_secs(2),
        max_reply_bytes: batchd_cloudflare::DEFAULT_MAX_REPLY_BYTES,
        ..ClientSettings::new(ACCOUNT, ApiToken::new(TOKEN.to_owned()))
    }
}

/// A client for `addr`.
pub fn client_for(addr: SocketAddr, request_timeout: Duration) -> BatchClient {
    BatchClient::new(settings_for(addr, request_timeout)).expect("client")
}

/// The model the tests use.
pub fn model() -> ModelName {
    ModelName::parse("@cf/baai/bge-m3").expect("model")
}

/// Raw request items from JSON texts.
pub fn items(texts: &[&str]) -> Vec<Box<RawValue>> {
    texts.iter().map(|text| RawValue::from_string((*text).to_owned()).expect("json")).collect()
}

/// An error envelope with one error.
pub fn error_body(code: i64, message: &str) -> String {
    serde_json::json!({"result": null, "success": false, "errors": [{"code": code, "message": message}], "messages": []})
        .to_string()
}

/// A submit reply accepting the batch as `request_id`.
pub fn queued_body(request_id: &str) -> String {
    serde_json::json!({
        "result": {"status": "queued", "request_id": request_id, "model": "@cf/baai/bge-m3"},
        "success": true, "errors": [], "messages": []
    })
    .to_string()
}
