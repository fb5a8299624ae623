//! A private `redis-server` per measurement (fresh memory, no AOF carried over from the previous run), and the
//! Redis-side counters the report uses: `INFO commandstats` and `INFO memory`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use redis::aio::MultiplexedConnection;

/// How Redis persists, the two settings every scenario runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Persistence {
    /// `--save "" --appendonly no`.
    Off,
    /// `--appendonly yes --appendfsync everysec` (no RDB snapshots).
    AofEverysec,
}

impl Persistence {
    /// Short name for tables and JSON.
    pub fn label(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::AofEverysec => "aof",
        }
    }
}

/// A running private `redis-server`; stopped (and its directory removed) on drop.
#[derive(Debug)]
pub struct RedisServer {
    /// The server process.
    child: Child,
    /// Its loopback port.
    pub port: u16,
    /// Its working directory (AOF files).
    dir: PathBuf,
}

/// A free loopback port (bound and released; good enough for a private benchmark).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl RedisServer {
    /// Starts `redis-server` on a free port with `persistence`, and waits until it answers PING.
    pub async fn start(persistence: Persistence, work_dir: &std::path::Path) -> anyhow::Result<Self> {
        let port = free_port()?;
        let dir = work_dir.join(format!("redis-{port}"));
        std::fs::create_dir_all(&dir)?;
        let mut command = Command::new("redis-server");
        command
            .arg("--port")
            .arg(port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(&dir)
            .arg("--save")
            .arg("")
            .arg("--logfile")
            .arg(dir.join("redis.log"));
        match persistence {
            Persistence::Off => command.args(["--appendonly", "no"]),
            Persistence::AofEverysec => command.args(["--appendonly", "yes", "--appendfsync", "everysec"]),
        };
        let child = command.stdout(Stdio::null()).stderr(Stdio::null()).spawn().context("start redis-server")?;
        let server = Self { child, port, dir };
        let started = Instant::now();
        loop {
            if let Ok(mut conn) = server.connect().await
                && redis::cmd("PING").query_async::<String>(&mut conn).await.is_ok()
            {
                return Ok(server);
            }
            if started.elapsed() > Duration::from_secs(10) {
                bail!("redis-server on port {port} did not answer within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// batchd's way to reach this server (standalone, plain TCP).
    pub fn endpoint(&self) -> anyhow::Result<batchd_queue::Endpoint> {
        Ok(batchd_queue::Endpoint::new(&batchd_queue::RedisSettings {
            url: self.url(),
            topology: batchd_queue::Topology::Standalone,
            nodes: Vec::new(),
            sentinel_master: String::new(),
            tls_ca_file: None,
            tls_client: None,
            response_timeout: Duration::from_secs(30),
        })?)
    }

    /// A new multiplexed connection with a generous response timeout (big payloads, big XRANGEs).
    pub async fn connect(&self) -> anyhow::Result<MultiplexedConnection> {
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(60)));
        Ok(redis::Client::open(self.url())?.get_multiplexed_async_connection_with_config(&config).await?)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Calls per command name since the server started (`INFO commandstats`), commands run inside scripts included.
pub async fn commandstats(conn: &mut MultiplexedConnection) -> anyhow::Result<BTreeMap<String, u64>> {
    let text: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.strip_prefix("calls=")?.split(',').next()?.parse().ok()?;
            Some((name.to_owned(), calls))
        })
        .collect())
}

/// `after - before` per command, leaving out the names in `exclude` (the harness's own probes).
pub fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>, exclude: &[&str]) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter(|(name, _)| !exclude.contains(&name.as_str()))
        .filter_map(|(name, calls)| {
            let d = calls.saturating_sub(before.get(name).copied().unwrap_or(0));
            (d > 0).then(|| (name.clone(), d))
        })
        .collect()
}

/// Sum of a command-count map.
pub fn total(counts: &BTreeMap<String, u64>) -> u64 {
    counts.values().sum()
}

/// `used_memory` from `INFO memory`, in bytes.
pub async fn used_memory(conn: &mut MultiplexedConnection) -> anyhow::Result<u64> {
    let text: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    text.lines()
        .find_map(|line| line.strip_prefix("used_memory:").and_then(|v| v.trim().parse().ok()))
        .context("INFO memory has no used_memory")
}

/// redis-server's CPU time so far (`INFO cpu`: user + sys), seconds.
pub async fn cpu_secs(conn: &mut MultiplexedConnection) -> anyhow::Result<f64> {
    let text: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    let field = |name: &str| -> anyhow::Result<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
            .with_context(|| format!("INFO cpu has no {name}"))
    };
    Ok(field("used_cpu_user")? + field("used_cpu_sys")?)
}
