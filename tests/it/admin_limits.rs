//! The admin server under slow and hostile clients, against a real daemon: a client that sends its headers too
//! slowly is cut off after `admin::HEADER_READ_TIMEOUT`, and so is an idle kept-alive connection; a connection
//! serves at most `admin::MAX_REQUESTS_PER_CONNECTION` requests; 130 kept-alive connections that each send a request
//! every 1.5 s cannot keep `/livez` from answering within a second; a request head over
//! `admin::MAX_REQUEST_HEAD_BYTES` is refused; a normal scrape works while idle sockets are open; and `/metrics`
//! answers only to the port's own host names (DNS rebinding), the probes to any.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use batchd::admin::{
    HEADER_READ_TIMEOUT, MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER, MAX_REQUEST_HEAD_BYTES, MAX_REQUESTS_PER_CONNECTION,
};
use batchd_tests::{Daemon, World, http_get, wait_for_http, wait_until, with_admin};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};

const WAIT: Duration = Duration::from_secs(30);

/// A daemon with its admin server up (`/livez` answered); returns the daemon and the admin address.
async fn daemon_with_admin(world: &World) -> (Daemon, SocketAddr) {
    let mut settings = world.settings.clone();
    let admin = with_admin(&mut settings);
    let daemon = Daemon::start(settings, &world.emulator);
    wait_for_http(admin, "/livez", WAIT, |status, _| status == 200).await;
    (daemon, admin)
}

/// `n` connections to `addr` that send nothing.
async fn idle_sockets(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut sockets = Vec::with_capacity(n);
    for _ in 0..n {
        sockets.push(TcpStream::connect(addr).await.expect("connect"));
    }
    sockets
}

#[tokio::test]
async fn admin_server_cuts_off_a_client_that_sends_its_headers_too_slowly() {
    let world = World::new().await;
    let (daemon, admin) = daemon_with_admin(&world).await;

    let mut slow = TcpStream::connect(admin).await.expect("connect");
    let connected = Instant::now();
    // A request whose last header never ends, one byte at a time: the head is never complete.
    let head = b"GET /livez HTTP/1.1\r\nHost: admin\r\nX-Slow: ".iter().copied().chain(std::iter::repeat(b'a'));
    let (mut head, mut sent) = (head, 0usize);
    let mut received = Vec::new();
    let mut buf = [0u8; 1024];
    let mut next_byte = tokio::time::interval(Duration::from_millis(250));
    let deadline = HEADER_READ_TIMEOUT + WAIT;
    let closed_after = loop {
        assert!(connected.elapsed() < deadline, "still connected after {deadline:?}, {sent} bytes sent");
        tokio::select! {
            read = slow.read(&mut buf) => match read {
                Ok(0) | Err(_) => break connected.elapsed(),
                Ok(n) => received.extend_from_slice(&buf[..n]),
            },
            _ = next_byte.tick() => {
                let byte = head.next().expect("endless");
                if slow.write_all(&[byte]).await.is_err() {
                    break connected.elapsed();
                }
                sent += 1;
            }
        }
    };
    assert!(
        closed_after >= HEADER_READ_TIMEOUT,
        "closed after {closed_after:?}, before the header read timeout ({HEADER_READ_TIMEOUT:?})"
    );
    let received = String::from_utf8_lossy(&received);
    assert!(!received.contains(" 200 "), "the incomplete request was never answered: {received}");

    let (status, body) = http_get(admin, "/livez").await.expect("livez after the slow client");
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    daemon.stop().await.expect("clean stop");
}

/// A connection to `addr` from the loopback address `source` (any of 127.0.0.0/8 is this machine).
async fn connect_from(source: [u8; 4], addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((source, 0)))?;
    socket.connect(addr).await
}

/// Sends `GET /livez` on a kept-alive connection and reads the one answer: its head (lowercased) and body. `None`
/// when the server closed the connection instead.
async fn livez_on(stream: &mut TcpStream, addr: SocketAddr) -> Option<(String, String)> {
    let request = format!("GET /livez HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let text = String::from_utf8_lossy(&answer);
        if let Some((head, body)) = text.split_once("\r\n\r\n")
            && body.len() >= 3
        {
            return Some((head.to_ascii_lowercase(), body.to_owned()));
        }
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
}

/// Waits up to `within` for the server to close `stream` (end of stream or reset); returns when it did.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 64];
    loop {
        match tokio::time::timeout(within.saturating_sub(started.elapsed()), stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => {}
            Err(_) => return None,
        }
    }
}

#[tokio::test]
async fn admin_closes_an_idle_keep_alive_connection_after_the_header_read_timeout() {
    let world = World::new().await;
    let (daemon, admin) = daemon_with_admin(&world).await;

    let mut client = TcpStream::connect(admin).await.expect("connect");
    let (head, body) = livez_on(&mut client, admin).await.expect("answered");
    assert!(head.starts_with("http/1.1 200") && !head.contains("connection: close"), "{head}");
    assert_eq!(body, "ok\n");
    let closed = closed_within(&mut client, HEADER_READ_TIMEOUT + WAIT).await.expect("closed by the server");
    assert!(
        closed >= HEADER_READ_TIMEOUT - Duration::from_millis(100) && closed < HEADER_READ_TIMEOUT * 3,
        "an idle kept-alive connection closed after {closed:?}, the timeout is {HEADER_READ_TIMEOUT:?}"
    );
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn admin_connection_serves_a_bounded_number_of_requests() {
    let world = World::new().await;
    let (daemon, admin) = daemon_with_admin(&world).await;

    let mut client = TcpStream::connect(admin).await.expect("connect");
    for n in 1..=MAX_REQUESTS_PER_CONNECTION {
        let (head, body) = livez_on(&mut client, admin).await.unwrap_or_else(|| panic!("request {n} answered"));
        assert_eq!(body, "ok\n");
        let last = head.contains("connection: close");
        assert_eq!(last, n == MAX_REQUESTS_PER_CONNECTION, "request {n}: {head}");
    }
    assert!(closed_within(&mut client, WAIT).await.is_some(), "closed after its last request");
    daemon.stop().await.expect("clean stop");
}

/// The attack of issue 21: more keep-alive connections than the server serves, from five addresses, each sending a
/// request every 1.5 s (inside the keep-alive timeout) and reconnecting at once when closed. `/livez` from a sixth
/// address, and from one of the attackers' own, must still answer within 1 s every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_livez_answers_within_a_second_while_130_keep_alive_connections_are_held() {
    const HOLDERS: usize = 130;
    const { assert!(HOLDERS > MAX_CONNECTIONS, "more holders than the server serves") };
    const SOURCES: [[u8; 4]; 5] = [[127, 0, 0, 2], [127, 0, 0, 3], [127, 0, 0, 4], [127, 0, 0, 5], [127, 0, 0, 6]];
    const { assert!(HOLDERS / SOURCES.len() < MAX_CONNECTIONS_PER_PEER, "each address stays under its own cap") };
    let world = World::new().await;
    let (daemon, admin) = daemon_with_admin(&world).await;

    let stop = tokio_util::sync::CancellationToken::new();
    let answers = Arc::new(AtomicUsize::new(0));
    let mut holders = Vec::new();
    for i in 0..HOLDERS {
        let (stop, answers) = (stop.clone(), Arc::clone(&answers));
        let source = SOURCES[i % SOURCES.len()];
        holders.push(tokio::spawn(async move {
            while !stop.is_cancelled() {
                let Ok(mut stream) = connect_from(source, admin).await else { continue };
                while !stop.is_cancelled() && livez_on(&mut stream, admin).await.is_some() {
                    answers.fetch_add(1, Ordering::Relaxed);
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = tokio::time::sleep(Duration::from_millis(1_500)) => {}
                    }
                }
            }
        }));
    }
    // Every holder has been answered twice on average: the connections are up and kept alive.
    wait_until("the holders to be answered", WAIT, async || answers.load(Ordering::Relaxed) >= 2 * HOLDERS).await;

    let probe = reqwest::Client::builder().no_proxy().pool_max_idle_per_host(0).build().expect("client");
    let mut slowest = Duration::ZERO;
    for (round, source) in [[127, 0, 0, 1], SOURCES[0]].into_iter().cycle().take(10).enumerate() {
        let started = Instant::now();
        let mut stream = tokio::time::timeout(Duration::from_secs(1), connect_from(source, admin))
            .await
            .unwrap_or_else(|_| panic!("probe {round} from {source:?}: not even connected within 1 s"))
            .expect("connect");
        let answer = tokio::time::timeout(Duration::from_secs(1), livez_on(&mut stream, admin)).await;
        let (head, body) = answer
            .unwrap_or_else(|_| panic!("probe {round} from {source:?}: no answer within 1 s"))
            .unwrap_or_else(|| panic!("probe {round} from {source:?}: closed without an answer"));
        assert!(head.starts_with("http/1.1 200") && body == "ok\n", "{head}\n\n{body}");
        slowest = slowest.max(started.elapsed());
        assert!(started.elapsed() < Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("slowest of 10 /livez probes among {HOLDERS} held connections: {slowest:?}");
    // A normal client, too (reqwest, a fresh connection).
    let status = tokio::time::timeout(Duration::from_secs(1), probe.get(format!("http://{admin}/readyz")).send())
        .await
        .expect("/readyz within 1 s")
        .expect("GET /readyz")
        .status();
    assert_eq!(status, 200);
    let before = answers.load(Ordering::Relaxed);
    wait_until("the holders to go on being answered", WAIT, async || {
        answers.load(Ordering::Relaxed) >= before + HOLDERS
    })
    .await;

    stop.cancel();
    for holder in holders {
        holder.await.expect("holder");
    }
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn admin_metrics_answer_a_normal_client_while_a_hundred_idle_sockets_are_open() {
    const IDLE: usize = 100;
    const { assert!(IDLE < MAX_CONNECTIONS, "idle sockets below the cap leave room for a scraper") };
    let world = World::new().await;
    let (daemon, admin) = daemon_with_admin(&world).await;

    let idle = idle_sockets(admin, IDLE).await;
    let (status, body) = http_get(admin, "/metrics").await.expect("GET /metrics");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("# TYPE batchd_"), "{body}");
    let (status, _) = http_get(admin, "/livez").await.expect("GET /livez");
    assert_eq!(status, 200);
    drop(idle);
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn admin_server_refuses_a_request_head_over_the_limit() {
    let world = World::new().await;
    let (daemon, admin) = daemon_with_admin(&world).await;

    let mut client = TcpStream::connect(admin).await.expect("connect");
    let big = "a".repeat(MAX_REQUEST_HEAD_BYTES);
    let request = format!("GET /livez HTTP/1.1\r\nHost: {admin}\r\nX-Big: {big}\r\nConnection: close\r\n\r\n");
    // The server may close before it has read everything: what it answered is what counts.
    let _ = client.write_all(request.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(WAIT, client.read_to_end(&mut answer)).await.expect("answered within 30 s");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    let (status, _) = http_get(admin, "/livez").await.expect("GET /livez");
    assert_eq!(status, 200);
    daemon.stop().await.expect("clean stop");
}

/// One `GET` on a fresh connection with exactly these headers (`Host` included, when given): status and body.
async fn get_with(admin: SocketAddr, target: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut client = TcpStream::connect(admin).await.expect("connect");
    let mut request = format!("GET {target} HTTP/1.1\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    client.write_all(request.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, client.read_to_end(&mut answer)).await.expect("answered within 30 s").expect("read");
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no answer to GET {target}: {answer}"));
    let status = head.split(' ').nth(1).and_then(|code| code.parse().ok()).expect("a status");
    (status, body.to_owned())
}

/// A page that rebinds its DNS name to the admin port (the browser then sends `Host: <its name>`) reads no metrics
/// (their labels name models and accounts): `/metrics` and any other path answer 421 to a foreign `Host`, to none,
/// and to an absolute URI naming another host. `/livez` and `/readyz` answer any `Host` (probes); `localhost`, IP
/// addresses and `admin.allowed_hosts` get the metrics.
#[tokio::test]
async fn admin_metrics_answer_only_to_its_own_host_names_while_the_probes_answer_any() {
    let world = World::new().await;
    let mut settings = world.settings.clone();
    let admin = with_admin(&mut settings);
    settings.admin.allowed_hosts = vec!["Metrics.Internal".to_owned()];
    let daemon = Daemon::start(settings, &world.emulator);
    wait_for_http(admin, "/readyz", WAIT, |status, _| status == 200).await;
    let port = admin.port();

    let rebinding = format!("rebind.evil.example:{port}");
    for host in [rebinding.as_str(), "localhost.evil.example", "127.0.0.1.nip.io", "metrics.internal.evil.example"] {
        for path in ["/metrics", "/", "/metrics/", "/nothing"] {
            let (status, body) = get_with(admin, path, &[("Host", host)]).await;
            assert_eq!(status, 421, "GET {path} with Host {host}: {body}");
            assert!(body.starts_with("the admin server answers only to its own host names"), "{body}");
            assert!(!body.contains("evil") && !body.contains("nip") && !body.contains("batchd_"), "{body}");
        }
        for path in ["/livez", "/readyz"] {
            let (status, body) = get_with(admin, path, &[("Host", host)]).await;
            assert_eq!(status, 200, "GET {path} with Host {host}: probes answer any Host: {body}");
        }
    }
    let (status, _) = get_with(admin, "/metrics", &[]).await;
    assert_eq!(status, 421, "a request without Host");
    let (status, _) = get_with(admin, "http://rebind.evil.example/metrics", &[("Host", &admin.to_string())]).await;
    assert_eq!(status, 421, "an absolute URI naming another host");

    for host in [admin.to_string(), format!("localhost:{port}"), format!("[::1]:{port}"), "10.1.2.3:9090".to_owned()]
        .into_iter()
        .chain(["metrics.internal".to_owned(), format!("METRICS.internal:{port}")])
    {
        let (status, body) = get_with(admin, "/metrics", &[("Host", &host)]).await;
        assert_eq!(status, 200, "Host {host}: {body}");
        assert!(body.contains("batchd_"), "Host {host}: the metrics: {body}");
    }
    daemon.stop().await.expect("clean stop");
}
