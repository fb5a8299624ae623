//! Liveness means progress: a fetch loop that stops going round turns `/livez` to 503 (naming it) and stops the
//! systemd watchdog pings, and both come back once the loop moves again. The loop is frozen for real: Redis is
//! paused (`CLIENT PAUSE`) longer than `admin.stall_secs`, so the schedule fetcher's claim waits for its reply.

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use batchd_tests::{World, binary, free_port, http_get};

/// The daemon's process, killed when dropped.
struct Process(std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads every notification waiting on `socket`, recording when each `WATCHDOG=1` arrived.
fn drain(socket: &UnixDatagram, pings: &mut Vec<Instant>) {
    let mut buffer = [0u8; 4096];
    while let Ok(n) = socket.recv(&mut buffer) {
        if String::from_utf8_lossy(&buffer[..n]).lines().any(|line| line == "WATCHDOG=1") {
            pings.push(Instant::now());
        }
    }
}

#[tokio::test]
async fn a_frozen_fetch_loop_fails_livez_and_stops_the_watchdog_until_it_moves_again() {
    let world = World::new().await;
    let dir = std::env::temp_dir().join(format!("batchd-liveness-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let notify_path = dir.join("notify");
    let notify = UnixDatagram::bind(&notify_path).expect("bind the notify socket");
    notify.set_nonblocking(true).expect("nonblocking");
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let _daemon = Process(
        Command::new(binary("batchd").expect("batchd binary"))
            .arg("run")
            .env_clear()
            .envs(world.batchd_env())
            .env("CLOUDFLARE_API_TOKEN", world.emulator.token())
            .env("BATCHD__ADMIN__LISTEN", admin.to_string())
            .env("BATCHD__ADMIN__STALL_SECS", "3")
            .env("BATCHD__SCHEDULE__IDLE_POLL_MS", "50")
            .env("NOTIFY_SOCKET", &notify_path)
            // Pings every second while alive.
            .env("WATCHDOG_USEC", "2000000")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start batchd"),
    );

    let mut pings = Vec::new();
    let wait_for = |what: &str, started: Instant, limit: Duration| {
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
    };
    let started = Instant::now();
    loop {
        drain(&notify, &mut pings);
        if !pings.is_empty() && http_get(admin, "/livez").await.is_ok_and(|(status, _)| status == 200) {
            break;
        }
        wait_for("the daemon to run and ping", started, Duration::from_secs(30));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Freeze: every Redis command waits 8 s, longer than admin.stall_secs (3 s).
    let mut pauser = batchd_tests::test_connection(&world.redis.url()).await;
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(8000).arg("ALL").query_async(&mut pauser).await.expect("pause");
    let frozen_at = Instant::now();
    let body = loop {
        drain(&notify, &mut pings);
        if let Ok((503, body)) = http_get(admin, "/livez").await {
            break body;
        }
        wait_for("/livez to turn 503", frozen_at, Duration::from_secs(8));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(body.contains("fetch loop made no progress"), "{body}");
    assert!(frozen_at.elapsed() >= Duration::from_secs(3), "not before the bound");

    // Redis answers again after the pause: the loop moves, /livez is 200 and the pings come back.
    let recovered = loop {
        drain(&notify, &mut pings);
        if http_get(admin, "/livez").await.is_ok_and(|(status, _)| status == 200) {
            break Instant::now();
        }
        wait_for("/livez to recover", frozen_at, Duration::from_secs(30));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    loop {
        drain(&notify, &mut pings);
        if pings.last().is_some_and(|last| *last > recovered) {
            break;
        }
        wait_for("the pings to resume", recovered, Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let longest_gap = pings.windows(2).map(|pair| pair[1] - pair[0]).max().expect("pings");
    assert!(longest_gap >= Duration::from_secs(3), "the pings stopped while the loop was frozen: {longest_gap:?}");
    std::fs::remove_dir_all(&dir).ok();
}
