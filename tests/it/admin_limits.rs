//! The admin server under slow and hostile clients, against a real daemon: a client that sends its headers too
//! slowly is cut off after `admin::HEADER_READ_TIMEOUT`, connections past `admin::MAX_CONNECTIONS` wait (they are
//! not accepted) and are served once a slot frees, a request head over `admin::MAX_REQUEST_HEAD_BYTES` is refused,
//! and a normal scrape works while idle sockets are open.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use batchd::admin::{HEADER_READ_TIMEOUT, MAX_CONNECTIONS, MAX_REQUEST_HEAD_BYTES};
use batchd_tests::{Daemon, World, http_get, wait_for_http, with_admin};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

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

/// Whether the server has closed `socket` (end of stream or reset), without waiting.
fn closed_by_server(socket: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    !matches!(socket.try_read(&mut byte), Err(error) if error.kind() == std::io::ErrorKind::WouldBlock)
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

#[tokio::test]
async fn admin_connections_past_the_cap_wait_and_are_served_once_slots_free() {
    let world = World::new().await;
    let (daemon, admin) = daemon_with_admin(&world).await;

    // The cap's worth of connections that send nothing, then more: the kernel's accept queue is first in, first
    // out, so the probe after them is not accepted while every slot is held.
    let holders = idle_sockets(admin, MAX_CONNECTIONS).await;
    let extra = idle_sockets(admin, 36).await;
    let mut probe = TcpStream::connect(admin).await.expect("connect probe");
    probe
        .write_all(format!("GET /livez HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    // For a second, the probe gets no answer. It could only be served once a held connection is gone (the server
    // closes an idle one after the header read timeout): never while every holder is still open.
    if let Ok(read) = tokio::time::timeout(Duration::from_secs(1), probe.read(&mut buf)).await {
        let n = read.expect("read probe");
        assert!(
            holders.iter().any(closed_by_server),
            "a connection past the cap was served while all {MAX_CONNECTIONS} slots were held: {:?}",
            String::from_utf8_lossy(&buf[..n])
        );
        answer.extend_from_slice(&buf[..n]);
    }

    // Dropping the held connections frees their slots: the waiting probe is served, and so is a new client.
    drop(holders);
    drop(extra);
    let started = Instant::now();
    loop {
        match tokio::time::timeout(WAIT.saturating_sub(started.elapsed()), probe.read(&mut buf)).await {
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
            Ok(Err(error)) => panic!("probe: {error}"),
            Err(_) => panic!("the waiting probe was not served within {WAIT:?} of the slots freeing"),
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n") && answer.ends_with("\r\n\r\nok\n"), "{answer}");
    let (status, body) = wait_for_http(admin, "/livez", WAIT, |status, _| status == 200).await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
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
