//! The admin routes (`/livez`, `/readyz`, `/metrics`) and the HTTP/1 server that serves them within limits: a
//! header-read timeout, an idle timeout on every connection, a connection cap and a bounded request head. The
//! dashboard (`batchd ui`) is served by the same [`serve_limited`].

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use super::Health;

/// State of the admin server's handlers.
#[derive(Debug, Clone)]
struct AdminState {
    /// The daemon's health.
    health: Arc<Health>,
    /// Renders the Prometheus text.
    metrics: PrometheusHandle,
}

/// The admin routes: `/livez`, `/readyz`, `/metrics`.
pub fn router(health: Arc<Health>, metrics: PrometheusHandle) -> Router {
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AdminState { health, metrics })
}

/// Binds the admin listener (port 0 picks a free port; the bound address is logged by [`serve`]).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Longest time a client may take to send a request's headers, counted from when the server starts waiting for
/// them: from the connection's start, or from the end of the previous response on a kept-alive connection (so an
/// idle keep-alive connection is closed after this long too). Probes and scrapers send theirs in one packet.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest time a connection may go without a byte moving either way (e.g. a client that stops reading its
/// response) before it is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Most connections served at once. Further ones are not accepted until one closes: they wait in the kernel's listen
/// backlog (no descriptor of the process) and are served in arrival order.
pub const MAX_CONNECTIONS: usize = 128;

/// Largest request head (request line and headers) read; a larger one is answered `431` and the connection closed.
/// With [`MAX_CONNECTIONS`] it bounds what clients can make the admin server buffer (about 2 MiB).
pub const MAX_REQUEST_HEAD_BYTES: usize = 16 * 1024;

/// Serves the admin routes on `listener` until `stop` is cancelled, within the limits above; then stops accepting,
/// lets requests in flight finish (idle connections close at once) and returns once every connection is closed.
pub async fn serve(listener: TcpListener, router: Router, stop: CancellationToken) -> std::io::Result<()> {
    serve_limited(listener, router, stop, "admin server listening (/livez, /readyz, /metrics)").await
}

/// Serves `router` on `listener` with the admin server's limits (header-read and idle timeouts, a connection cap,
/// a bounded request head) until `stop` is cancelled; logs `what` with the bound address first. The dashboard
/// (`batchd ui`) is served the same way.
pub async fn serve_limited(
    listener: TcpListener,
    router: Router,
    stop: CancellationToken,
    what: &str,
) -> std::io::Result<()> {
    tracing::info!(addr = %listener.local_addr()?, "{what}");
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT).max_buf_size(MAX_REQUEST_HEAD_BYTES);
    loop {
        // A slot first, then the accept: past the cap, connections wait in the backlog, not in the process.
        let slot = tokio::select! {
            () = stop.cancelled() => break,
            slot = Arc::clone(&slots).acquire_owned() => slot.map_err(std::io::Error::other)?,
        };
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors, or a connection reset before it was accepted: neither ends the server.
                    tracing::warn!(error = %error, "admin server cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let io = TokioIo::new(IdleTimeout::new(stream, IDLE_TIMEOUT));
        let connection = http.serve_connection(io, TowerToHyperService::new(router.clone()));
        let stop = stop.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let mut connection = std::pin::pin!(connection);
            let outcome = tokio::select! {
                outcome = connection.as_mut() => outcome,
                () = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = outcome {
                tracing::debug!(peer = %peer, error = %error, "admin connection closed");
            }
        });
    }
    drop(listener);
    // Every slot back means every connection is closed.
    let _all = slots.acquire_many(MAX_CONNECTIONS as u32).await.map_err(std::io::Error::other)?;
    Ok(())
}

/// A connection's stream that fails with `TimedOut` once no byte has moved either way for `idle`.
#[derive(Debug)]
struct IdleTimeout<S> {
    /// The stream.
    stream: S,
    /// How long the stream may go without a byte moving.
    idle: Duration,
    /// When it times out, unless a byte moves first.
    deadline: Pin<Box<Sleep>>,
}

impl<S> IdleTimeout<S> {
    fn new(stream: S, idle: Duration) -> Self {
        Self { stream, idle, deadline: Box::pin(tokio::time::sleep(idle)) }
    }

    /// After an operation on the stream: pushes the deadline back on progress; on `Pending`, fails once it passed.
    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<std::io::Result<T>>,
        moved: bool,
    ) -> Poll<std::io::Result<T>> {
        match poll {
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(std::io::ErrorKind::TimedOut.into())),
                Poll::Pending => Poll::Pending,
            },
            ready => {
                if moved {
                    self.deadline.as_mut().reset(Instant::now() + self.idle);
                }
                ready
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleTimeout<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.stream).poll_read(cx, buf);
        let moved = buf.filled().len() > before;
        self.check(cx, poll, moved)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write(cx, data);
        let moved = matches!(poll, Poll::Ready(Ok(n)) if n > 0);
        self.check(cx, poll, moved)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write_vectored(cx, data);
        let moved = matches!(poll, Poll::Ready(Ok(n)) if n > 0);
        self.check(cx, poll, moved)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.stream).poll_flush(cx);
        self.check(cx, poll, false)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.stream).poll_shutdown(cx);
        self.check(cx, poll, false)
    }
}

async fn livez(State(state): State<AdminState>) -> Response {
    plain(state.health.liveness())
}

async fn readyz(State(state): State<AdminState>) -> Response {
    match state.health.readiness() {
        Ok(()) => (StatusCode::OK, format!("{}\n", state.health.ready_text())).into_response(),
        Err(reason) => plain(Err(reason)),
    }
}

async fn metrics_text(State(state): State<AdminState>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], state.metrics.render()).into_response()
}

/// `200 ok`, or `503` with the reason as plain text.
fn plain(outcome: Result<(), String>) -> Response {
    match outcome {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    #[allow(clippy::unwrap_used)]
    async fn a_connection_times_out_only_after_idle_without_a_byte_moving() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let idle = Duration::from_millis(300);
        let (client, server) = tokio::io::duplex(64);
        let mut server = IdleTimeout::new(server, idle);
        let mut client = client;
        let started = Instant::now();
        let writer = tokio::spawn(async move {
            tokio::time::sleep(idle * 4 / 5).await;
            client.write_all(b"x").await.unwrap();
            client
        });
        let mut byte = [0u8; 1];
        assert_eq!(server.read(&mut byte).await.unwrap(), 1);
        let moved = Instant::now();
        let _client = writer.await.unwrap();
        let error = server.read(&mut byte).await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
        assert!(moved.elapsed() >= idle, "a byte pushes the deadline back: timed out {:?} after it", moved.elapsed());
        assert!(started.elapsed() >= idle + idle * 4 / 5);
    }
}
