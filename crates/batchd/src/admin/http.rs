//! The admin routes (`/livez`, `/readyz`, `/metrics`), the host check in front of them, and the HTTP/1 server that serves them within limits, so that
//! no client can hold it: a header-read timeout that also closes idle keep-alive connections, an idle timeout on
//! every connection, a bounded number of requests and a bounded age per connection, a connection cap and a
//! per-peer cap (a connection past either takes the place of the longest-idle one, so a probe is always let in
//! while some connection is only waiting), and a bounded request head. The dashboard (`batchd ui`) is served by
//! the same [`serve_limited`].
//!
//! `/metrics` (and any other path) answers only to the admin port's own host names ([`HostList`]: `localhost`,
//! IP addresses, `admin.allowed_hosts`), like the dashboard, so a page that rebinds its DNS name to the port reads
//! nothing (the rate buckets' labels carry account ids); `/livez` and `/readyz` answer any `Host`, for probes.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use super::{Health, HostList};

/// State of the admin server's handlers.
#[derive(Debug, Clone)]
struct AdminState {
    /// The daemon's health.
    health: Arc<Health>,
    /// Renders the Prometheus text.
    metrics: PrometheusHandle,
}

/// The paths the admin port answers whatever the request's `Host`: the probes, which say only whether the process
/// is alive and ready (a kubelet may send any `Host`).
pub const OPEN_PATHS: [&str; 2] = ["/livez", "/readyz"];

/// The admin routes: `/livez`, `/readyz`, `/metrics`; every path but [`OPEN_PATHS`] only for `hosts`.
pub fn router(health: Arc<Health>, metrics: PrometheusHandle, hosts: HostList) -> Router {
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .layer(axum::middleware::from_fn_with_state(Arc::new(hosts), host_guard))
        .with_state(AdminState { health, metrics })
}

/// Answers `421` to a request for anything but [`OPEN_PATHS`] whose `Host` is not one of the admin port's
/// (DNS rebinding), in one line that does not repeat the request.
async fn host_guard(State(hosts): State<Arc<HostList>>, request: Request, next: Next) -> Response {
    if OPEN_PATHS.contains(&request.uri().path()) || hosts.admits(request.headers(), request.uri()) {
        return next.run(request).await;
    }
    let text = "the admin server answers only to its own host names (localhost, its IP addresses and \
                admin.allowed_hosts)\n";
    (StatusCode::MISDIRECTED_REQUEST, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
}

/// Binds the admin listener (port 0 picks a free port; the bound address is logged by [`serve`]).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Longest time a client may take to send a request's headers, counted from when the server starts waiting for
/// them: from the connection's start, or from the end of the previous response on a kept-alive connection, so an
/// idle keep-alive connection is closed after this long too. Probes, scrapers and browsers send theirs in one packet;
/// a browser opens a new connection when it finds a kept-alive one closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest time a connection may go without a byte moving either way (e.g. a client that stops reading its
/// response) before it is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Most connections served at once. A connection past the cap takes the place of the one that has waited longest
/// for its next request (closed at once; it is between requests), or is closed if every connection is in the
/// middle of a request.
pub const MAX_CONNECTIONS: usize = 128;

/// Most connections served at once for one peer address. A peer's connection past it takes the place of that
/// peer's longest-idle connection, or is closed if all of them are in the middle of a request: one client cannot
/// take more than a quarter of [`MAX_CONNECTIONS`] from the others.
pub const MAX_CONNECTIONS_PER_PEER: usize = 32;

/// Most requests one connection serves; the last answer says `Connection: close`.
pub const MAX_REQUESTS_PER_CONNECTION: u32 = 100;

/// Longest a connection is served: after this long it is closed between two requests (a request in progress is
/// answered first, within [`CLOSE_GRACE`]).
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(60);

/// How long a connection asked to close (for its age, to make room, or at shutdown of a taken place) may take to
/// finish the answer it is writing before it is dropped.
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Connections beyond [`MAX_CONNECTIONS`] that may still be open while the ones they replaced finish closing: the
/// bound on the server's descriptors is the sum. Past it, connections wait in the kernel's listen backlog.
const CLOSING_HEADROOM: usize = 32;

/// Largest request head (request line and headers) read; a larger one is answered `431` and the connection closed.
/// With the connection caps it bounds what clients can make the admin server buffer (about 2.5 MiB).
pub const MAX_REQUEST_HEAD_BYTES: usize = 16 * 1024;

/// Serves the admin routes on `listener` until `stop` is cancelled, within the limits above; then stops accepting,
/// lets requests in flight finish (idle connections close at once) and returns once every connection is closed.
pub async fn serve(listener: TcpListener, router: Router, stop: CancellationToken) -> std::io::Result<()> {
    serve_limited(listener, router, stop, "admin server listening (/livez, /readyz, /metrics)").await
}

/// Serves `router` on `listener` with the admin server's limits (header-read and idle timeouts, requests and age
/// per connection, the connection caps, a bounded request head) until `stop` is cancelled; logs `what` with the
/// bound address first. The dashboard (`batchd ui`) is served the same way.
pub async fn serve_limited(
    listener: TcpListener,
    router: Router,
    stop: CancellationToken,
    what: &str,
) -> std::io::Result<()> {
    tracing::info!(addr = %listener.local_addr()?, "{what}");
    let descriptors = MAX_CONNECTIONS + CLOSING_HEADROOM;
    let slots = Arc::new(Semaphore::new(descriptors));
    let connections = Arc::new(Connections::default());
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT).max_buf_size(MAX_REQUEST_HEAD_BYTES);
    loop {
        // A descriptor first, then the accept: past the bound, connections wait in the backlog, not in the process.
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
        let Some(admitted) = connections.admit(peer.ip(), Instant::now()) else {
            // Every connection of this peer (or of all peers) is in the middle of a request: none can make room.
            tracing::debug!(peer = %peer, "admin connection refused: every connection is busy");
            continue;
        };
        let admitted = Arc::new(admitted);
        let inner = TowerToHyperService::new(router.clone());
        let counted = Arc::clone(&admitted);
        let service = hyper::service::service_fn(move |request| {
            counted.begin_request();
            let answer = inner.call(request);
            let counted = Arc::clone(&counted);
            async move {
                let mut response = answer.await?;
                if counted.end_request() {
                    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        let io = TokioIo::new(IdleTimeout::new(stream, IDLE_TIMEOUT));
        let connection = http.serve_connection(io, service);
        let stop = stop.clone();
        let close = admitted.close.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let _admitted = admitted;
            let mut connection = std::pin::pin!(connection);
            let outcome = tokio::select! {
                outcome = connection.as_mut() => outcome,
                () = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
                () = close.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    tokio::time::timeout(CLOSE_GRACE, connection).await.unwrap_or(Ok(()))
                }
                () = tokio::time::sleep(MAX_CONNECTION_AGE) => {
                    connection.as_mut().graceful_shutdown();
                    tokio::time::timeout(CLOSE_GRACE, connection).await.unwrap_or(Ok(()))
                }
            };
            if let Err(error) = outcome {
                tracing::debug!(peer = %peer, error = %error, "admin connection closed");
            }
        });
    }
    drop(listener);
    // Every slot back means every connection is closed.
    let _all = slots.acquire_many(descriptors as u32).await.map_err(std::io::Error::other)?;
    Ok(())
}

/// The connections a server holds, for the connection caps and for making room under pressure.
#[derive(Debug, Default)]
struct Connections {
    /// Every open connection, by an id of this server's.
    table: Mutex<Table>,
}

/// What [`Connections`] guards.
#[derive(Debug, Default)]
struct Table {
    /// The id of the next connection.
    next_id: u64,
    /// The open connections.
    open: HashMap<u64, Open>,
}

/// One open connection as the caps see it.
#[derive(Debug)]
struct Open {
    /// The peer's address (IPv4-mapped IPv6 as IPv4).
    peer: IpAddr,
    /// Since when it has waited for its next request (from its accept, or the end of its last answer); `None`
    /// while a request is being served.
    idle_since: Option<Instant>,
    /// Cancelled to ask it to close.
    close: CancellationToken,
}

impl Open {
    /// Whether it still counts against the caps (it was not asked to close).
    fn live(&self) -> bool {
        !self.close.is_cancelled()
    }
}

impl Connections {
    /// Admits a new connection from `peer`. Past [`MAX_CONNECTIONS_PER_PEER`] for that peer, or past
    /// [`MAX_CONNECTIONS`] in all, the longest-idle live connection (of that peer, or of anyone) is asked to close
    /// and the new one takes its place; `None` when there is none to ask (all in the middle of a request).
    fn admit(self: &Arc<Self>, peer: IpAddr, now: Instant) -> Option<Admitted> {
        let peer = peer.to_canonical();
        let mut table = self.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let live = table.open.values().filter(|open| open.live()).count();
        let of_peer = table.open.values().filter(|open| open.live() && open.peer == peer).count();
        if of_peer >= MAX_CONNECTIONS_PER_PEER {
            table.close_longest_idle(|open| open.peer == peer)?;
        } else if live >= MAX_CONNECTIONS {
            table.close_longest_idle(|_| true)?;
        }
        let id = table.next_id;
        table.next_id += 1;
        let close = CancellationToken::new();
        table.open.insert(id, Open { peer, idle_since: Some(now), close: close.clone() });
        Some(Admitted { connections: Arc::clone(self), id, close, n_requests: AtomicU32::new(0) })
    }

    fn set_idle_since(&self, id: u64, idle_since: Option<Instant>) {
        let mut table = self.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(open) = table.open.get_mut(&id) {
            open.idle_since = idle_since;
        }
    }
}

impl Table {
    /// Asks the live connection that has waited longest for a request, among those `which` picks, to close.
    fn close_longest_idle(&mut self, which: impl Fn(&Open) -> bool) -> Option<()> {
        let (_, open) = self
            .open
            .iter()
            .filter(|(_, open)| open.live() && which(open))
            .filter_map(|(id, open)| open.idle_since.map(|since| (since, *id, open)))
            .min_by_key(|(since, id, _)| (*since, *id))
            .map(|(_, id, open)| (id, open))?;
        open.close.cancel();
        Some(())
    }
}

/// A connection admitted by [`Connections::admit`]; dropping it (when the connection ends) frees its place.
#[derive(Debug)]
struct Admitted {
    /// Where it is counted.
    connections: Arc<Connections>,
    /// Its id there.
    id: u64,
    /// Cancelled when it is asked to close to make room.
    close: CancellationToken,
    /// Requests it has begun.
    n_requests: AtomicU32,
}

impl Admitted {
    /// A request begins: the connection is busy (it cannot be asked to make room).
    fn begin_request(&self) {
        self.n_requests.fetch_add(1, Ordering::Relaxed);
        self.connections.set_idle_since(self.id, None);
    }

    /// A request's answer is ready: the connection waits for the next one. Returns whether this answer is the
    /// connection's last ([`MAX_REQUESTS_PER_CONNECTION`] reached).
    fn end_request(&self) -> bool {
        self.connections.set_idle_since(self.id, Some(Instant::now()));
        self.n_requests.load(Ordering::Relaxed) >= MAX_REQUESTS_PER_CONNECTION
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut table = self.connections.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        table.open.remove(&self.id);
    }
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

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_peer_past_its_cap_replaces_its_own_longest_idle_connection_never_anothers() {
        let connections = Arc::new(Connections::default());
        let start = Instant::now();
        let other = connections.admit(ip(9), start).unwrap();
        let mut mine: Vec<Admitted> = (0..MAX_CONNECTIONS_PER_PEER)
            .map(|i| connections.admit(ip(1), start + Duration::from_millis(1 + i as u64)).unwrap())
            .collect();
        // The oldest of the peer's connections is busy: the next oldest is the one asked to close.
        mine[0].begin_request();
        let newcomer = connections.admit(ip(1), start + Duration::from_secs(1)).unwrap();
        assert!(!mine[0].close.is_cancelled(), "a busy connection is never asked to close");
        assert!(mine[1].close.is_cancelled(), "the longest idle of the peer's connections makes room");
        assert!(!other.close.is_cancelled(), "another peer's connection is left alone");
        assert!(!newcomer.close.is_cancelled());
        // When every connection of the peer is busy, a new one is refused.
        for admitted in mine.iter().skip(2) {
            admitted.begin_request();
        }
        newcomer.begin_request();
        assert!(connections.admit(ip(1), start + Duration::from_secs(2)).is_none());
        // Connections that end free their places.
        mine.truncate(0);
        drop(newcomer);
        assert!(connections.admit(ip(1), start + Duration::from_secs(3)).is_some());
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn past_the_total_cap_the_longest_idle_connection_of_anyone_makes_room() {
        let connections = Arc::new(Connections::default());
        // In the past, so that the answer sent now is the most recent moment.
        let start = Instant::now() - Duration::from_secs(10);
        let held: Vec<Admitted> = (0..MAX_CONNECTIONS)
            .map(|i| {
                let peer = ip(1 + (i % 8) as u8);
                connections.admit(peer, start + Duration::from_millis(i as u64)).unwrap()
            })
            .collect();
        held[0].begin_request();
        held[1].begin_request();
        let answered_again = held[2].end_request();
        assert!(!answered_again, "one request is far from the per-connection limit");
        let probe = connections.admit(ip(200), Instant::now()).unwrap();
        assert_eq!(held.iter().filter(|admitted| admitted.close.is_cancelled()).count(), 1);
        assert!(held[3].close.is_cancelled(), "the longest idle (not the busy ones, not the one just answered)");
        assert!(!probe.close.is_cancelled());
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn the_last_allowed_request_of_a_connection_is_told_to_close() {
        let connections = Arc::new(Connections::default());
        let admitted = connections.admit(ip(1), Instant::now()).unwrap();
        for _ in 1..MAX_REQUESTS_PER_CONNECTION {
            admitted.begin_request();
            assert!(!admitted.end_request());
        }
        admitted.begin_request();
        assert!(admitted.end_request(), "request {MAX_REQUESTS_PER_CONNECTION} is the last");
    }

    /// On paused time: the write 240 ms in always comes before the 300 ms deadline, however loaded the machine.
    #[tokio::test(start_paused = true)]
    #[allow(clippy::unwrap_used)]
    async fn a_connection_times_out_only_after_idle_without_a_byte_moving() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let idle = Duration::from_millis(300);
        let (client, server) = tokio::io::duplex(64);
        let mut server = IdleTimeout::new(server, idle);
        let mut client = client;
        let started = tokio::time::Instant::now();
        let writer = tokio::spawn(async move {
            tokio::time::sleep(idle * 4 / 5).await;
            client.write_all(b"x").await.unwrap();
            client
        });
        let mut byte = [0u8; 1];
        assert_eq!(server.read(&mut byte).await.unwrap(), 1);
        let moved = tokio::time::Instant::now();
        assert_eq!(moved - started, idle * 4 / 5, "the byte arrived before the first deadline");
        let _client = writer.await.unwrap();
        let error = server.read(&mut byte).await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(moved.elapsed(), idle, "a byte pushes the deadline back: timed out {:?} after it", moved.elapsed());
    }
}
