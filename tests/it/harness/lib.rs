//! Test harness: a private `redis-server` per test (on a port of its own, so tests can kill and restart it), the
//! Batch API emulator over HTTP, and the real daemon, in-process or as a process.
//!
//! Each test uses its own namespace, so `REDIS_URL` may point every test at one shared server instead; tests that
//! must kill Redis always start their own. The harness never trusts a port alone: a server it starts is used only
//! once the process answering on its port is the one it spawned.

use std::collections::{BTreeSet, HashMap};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use batchd::settings::{Secret, Settings};
use batchd_core::{Keys, ResultEntry};
use batchd_emulator::{Emulator, EmulatorConfig, EmulatorHandle};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How many ports below the kernel's ephemeral range [`free_port`] draws from.
const PORT_POOL: u16 = 16_384;

/// A port for a server that a test starts, free when picked. Drawn at random from the [`PORT_POOL`] ports just
/// below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`, 32768-60999 by default), where neither the
/// local port of an outgoing connection nor another program's port-0 bind can take it between the pick and the
/// server's bind (a port from the ephemeral range could be, and was: a test's own Redis connection took the port
/// its daemon was about to listen on); never handed out twice by one process, so a restart on the same port cannot
/// meet a sibling test there. Two test processes can still draw the same port (about one chance in 16,000 per
/// pair), so a starter that can tell checks who answers: [`RedisServer`] retries on another port.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let low = ephemeral_low.saturating_sub(PORT_POOL).max(1_024);
    let span = u128::from(ephemeral_low.saturating_sub(low).max(1));
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for _ in 0..1_000 {
        let port = low + (uuid::Uuid::new_v4().as_u128() % span) as u16;
        // Free on every address (a server bound to 0.0.0.0:port or 127.0.0.1:port makes this bind fail).
        if !handed_out.contains(&port) && TcpListener::bind(("0.0.0.0", port)).is_ok() {
            handed_out.insert(port);
            return port;
        }
    }
    panic!("no free port in {low}..{ephemeral_low} after 1,000 draws")
}

/// How many ports [`RedisServer::start`] tries: each clash (the port taken between the pick and redis-server's
/// bind, or another server answering on it) costs one.
const REDIS_START_ATTEMPTS: usize = 5;

/// How long a redis-server may take to answer once spawned (an AOF restart loads its file first).
const REDIS_START_TIMEOUT: Duration = Duration::from_secs(10);

/// A private redis-server process, killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    /// The server's port.
    pub port: u16,
    /// Its working directory (AOF files live here when persistence is on).
    pub dir: PathBuf,
    /// Extra arguments it was started with.
    args: Vec<String>,
    /// The running process, if any.
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server without persistence.
    pub async fn start() -> Self {
        Self::start_with(&["--save", "", "--appendonly", "no"]).await
    }

    /// Starts a server with extra arguments.
    pub async fn start_with(args: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("batchd-it-redis-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("redis dir");
        Self::start_in(dir, args.iter().map(|s| s.to_string()).collect()).await.expect("start redis-server")
    }

    /// Starts a server in `dir` on a fresh port, trying another port after a clash.
    async fn start_in(dir: PathBuf, args: Vec<String>) -> anyhow::Result<Self> {
        let mut server = Self { port: 0, dir, args, child: None };
        let mut clashes = Vec::new();
        for _ in 0..REDIS_START_ATTEMPTS {
            server.port = free_port();
            match server.spawn().await {
                Ok(()) => return Ok(server),
                Err(clash) => clashes.push(format!("{clash:#}")),
            }
        }
        bail!("redis-server did not start on a port of its own in {REDIS_START_ATTEMPTS} tries: {clashes:?}")
    }

    /// Starts a server without persistence on `port` exactly, once: fails when the port is taken or another
    /// process answers there (what [`RedisServer::start`] retries on another port).
    pub async fn start_on(port: u16) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("batchd-it-redis-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).context("redis dir")?;
        let args = ["--save", "", "--appendonly", "no"].map(str::to_owned).to_vec();
        let mut server = Self { port, dir, args, child: None };
        server.spawn().await?;
        Ok(server)
    }

    /// Spawns redis-server on `self.port` and waits until it answers; fails (having killed what it spawned) when
    /// the process exits first (the port was taken) or when the server answering on the port is another process.
    async fn spawn(&mut self) -> anyhow::Result<()> {
        let mut child = Command::new("redis-server")
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(&self.dir)
            .arg("--daemonize")
            .arg("no")
            .arg("--loglevel")
            .arg("warning")
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (make test installs it; or apt-get install redis-server)");
        let answer = answered_by(&mut child, &self.url()).await;
        match answer {
            Ok(()) => {
                self.child = Some(child);
                Ok(())
            }
            Err(error) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(error)
            }
        }
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and directory; panics if another process took the port meanwhile (the
    /// test's clients would reach it, not this server's data).
    pub async fn restart(&mut self) {
        self.kill();
        if let Err(error) = self.spawn().await {
            panic!("redis-server did not restart on port {}: {error:#}", self.port);
        }
    }
}

impl RedisServer {
    /// The process id of the running server, if it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends a signal by name (`STOP`, `CONT`, `TERM`, ...) to the running server with `kill(1)`.
    pub fn signal(&self, name: &str) -> anyhow::Result<()> {
        let pid = self.pid().context("redis-server is not running")?;
        send_signal(pid, name)
    }

    /// Waits (at most `timeout`) for the server to exit on its own, e.g. after `SHUTDOWN`; returns whether it did.
    pub fn wait_for_exit(&mut self, timeout: Duration) -> bool {
        let started = Instant::now();
        while let Some(child) = self.child.as_mut() {
            if matches!(child.try_wait(), Ok(Some(_)) | Err(_)) {
                self.child = None;
                return true;
            }
            if started.elapsed() >= timeout {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }
}

impl RedisServer {
    /// Starts a second server, with the same arguments, on a copy of this one's directory as it is now: after a
    /// kill, exactly the data a restart will load (the AOF), readable before any client writes to it again.
    pub async fn start_copy(&self) -> anyhow::Result<RedisServer> {
        let dir = std::env::temp_dir().join(format!("batchd-it-redis-{}", uuid::Uuid::new_v4().simple()));
        copy_dir(&self.dir, &dir).with_context(|| format!("copy {}", self.dir.display()))?;
        Self::start_in(dir, self.args.clone()).await
    }
}

/// Waits until the redis-server `child` answers on `url` and is done loading; fails when it exits first, when
/// another process answers there (`INFO server`'s `process_id` is not the child's), or after
/// [`REDIS_START_TIMEOUT`].
async fn answered_by(child: &mut Child, url: &str) -> anyhow::Result<()> {
    let pid = child.id();
    let client = redis::Client::open(url).context("redis url")?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().context("wait for redis-server")? {
            bail!("redis-server (pid {pid}) exited with {status} before answering on {url}: the port is taken");
        }
        if let Ok(mut conn) = client.get_multiplexed_async_connection().await
            && let Ok(info) = redis::cmd("INFO").arg("server").query_async::<String>(&mut conn).await
        {
            let answering = info_field(&info, "process_id");
            if answering != Some(pid.to_string()) {
                bail!(
                    "{url} is answered by another redis-server (process_id {answering:?}), not the one spawned (pid {pid})"
                );
            }
            // Ours: ready once it is done loading its AOF (PING answers LOADING until then).
            if redis::cmd("PING").query_async::<String>(&mut conn).await.is_ok() {
                return Ok(());
            }
        }
        if started.elapsed() > REDIS_START_TIMEOUT {
            bail!("redis-server (pid {pid}) did not answer on {url} within {REDIS_START_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of `name` in an `INFO` reply (`name:value` lines).
fn info_field(info: &str, name: &str) -> Option<String> {
    info.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(':')).map(|value| value.trim().to_owned())
}

/// Copies a directory tree (a redis-server's working directory: files and `appendonlydir/`).
fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// Sends a signal by name (`TERM`, `STOP`, `CONT`, `KILL`, ...) to a process with `kill(1)` (the workspace
/// forbids `unsafe`, so no `libc::kill`).
pub fn send_signal(pid: u32, name: &str) -> anyhow::Result<()> {
    let status = Command::new("kill").arg(format!("-{name}")).arg(pid.to_string()).status().context("run kill")?;
    if !status.success() {
        bail!("kill -{name} {pid} failed: {status}");
    }
    Ok(())
}

/// Path of a binary built by this workspace, for callers that are binaries themselves (next to them in
/// `target/<profile>/`) as well as tests (one level up from `target/<profile>/deps/`); builds it if missing.
pub fn workspace_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("exe dir")?;
    for candidate in [dir.join(name), dir.parent().context("target dir")?.join(name)] {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    binary(name)
}

/// A real browser and a real `batchd ui`, for the dashboard's tests.
pub mod browser;

/// The chaos suite (`make chaos`; short versions run in `tests/it/chaos.rs`).
#[path = "../../chaos/mod.rs"]
pub mod chaos;

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One test's world: Redis, the emulator, a namespace and settings pointing at both.
#[allow(missing_debug_implementations)]
pub struct World {
    /// The private Redis server.
    pub redis: RedisServer,
    /// The emulator.
    pub emulator: EmulatorHandle,
    /// Settings for daemons and the CLI (namespace unique to the test).
    pub settings: Settings,
    /// Keys of the test's namespace.
    pub keys: Keys,
    /// A connection for the test's own commands.
    pub conn: MultiplexedConnection,
}

impl World {
    /// A world with default emulator timing (batches take ~0.5 s).
    pub async fn new() -> Self {
        Self::with_emulator(EmulatorConfig::default()).await
    }

    /// A world with the given emulator configuration.
    pub async fn with_emulator(config: EmulatorConfig) -> Self {
        let redis = RedisServer::start().await;
        let emulator = Emulator::start(config, "127.0.0.1:0".parse().expect("addr")).await.expect("emulator");
        let namespace = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
        let settings = test_settings(&redis.url(), &emulator, &namespace);
        let keys = settings.keys();
        let conn = test_connection(&redis.url()).await;
        Self { redis, emulator, settings, keys, conn }
    }

    /// Starts a daemon in-process with the world's settings.
    pub fn daemon(&self) -> Daemon {
        Daemon::start(self.settings.clone(), &self.emulator)
    }

    /// Enqueues a job the way a producer does: one XADD with a `job` field. Returns the entry id.
    pub async fn enqueue(&self, job: &serde_json::Value) -> String {
        self.enqueue_raw(&[("job", job.to_string())]).await
    }

    /// Enqueues an entry with arbitrary fields (for bad input).
    pub async fn enqueue_raw(&self, fields: &[(&str, String)]) -> String {
        let mut conn = self.conn.clone();
        conn.xadd(self.keys.submit(), "*", fields).await.expect("xadd")
    }

    /// All entries of the default results stream, as field maps.
    pub async fn results(&self) -> Vec<HashMap<String, String>> {
        self.stream(&self.keys.results()).await
    }

    /// All entries of a stream, as field maps.
    pub async fn stream(&self, key: &str) -> Vec<HashMap<String, String>> {
        self.entries(key).await.into_iter().map(|(_, fields)| fields).collect()
    }

    /// All entries of a stream with their ids, oldest first.
    pub async fn entries(&self, key: &str) -> Vec<(String, HashMap<String, String>)> {
        redis::cmd("XRANGE").arg(key).arg("-").arg("+").query_async(&mut self.conn.clone()).await.expect("xrange")
    }

    /// Waits until the results stream holds at least `n` entries; returns them.
    pub async fn wait_for_results(&self, n: usize, timeout: Duration) -> Vec<HashMap<String, String>> {
        let started = Instant::now();
        loop {
            let length: usize = self.conn.clone().xlen(self.keys.results()).await.expect("xlen");
            if length >= n {
                return self.results().await;
            }
            assert!(started.elapsed() < timeout, "timed out after {timeout:?} waiting for {n} results; have {length}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits for the one result of `job_id` and parses it.
    pub async fn wait_for_result(&self, job_id: &str, timeout: Duration) -> ResultEntry {
        let started = Instant::now();
        loop {
            let results = self.results().await;
            let mine: Vec<&HashMap<String, String>> =
                results.iter().filter(|fields| fields.get("job_id").map(String::as_str) == Some(job_id)).collect();
            if let Some(fields) = mine.first() {
                assert_eq!(mine.len(), 1, "job {job_id} has {} result entries", mine.len());
                return ResultEntry::from_fields(fields).expect("well-formed result");
            }
            assert!(started.elapsed() < timeout, "timed out waiting for the result of {job_id}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Requests the cancellation of `job_id` the way `batchd cancel` and the dashboard do (the `cancel` Redis
    /// function, through the producer library).
    pub async fn cancel(&self, job_id: &str, reason: &str) {
        let producer =
            batchd_producer::Producer::connect(self.settings.redis.url.expose(), &self.settings.redis.namespace)
                .await
                .expect("connect");
        producer.cancel(&batchd_core::JobId::parse(job_id).expect("job id"), reason).await.expect("cancel");
    }

    /// The ledger of a job.
    pub async fn ledger(&self, job_id: &str) -> HashMap<String, String> {
        let id = batchd_core::JobId::parse(job_id).expect("job id");
        self.conn.clone().hgetall(self.keys.job(&id)).await.expect("hgetall")
    }

    /// Number of entries pending in the ingress consumer group (0 while the group does not exist yet); panics on
    /// any other error, so a check of "nothing pending" cannot pass because Redis did not answer.
    pub async fn ingress_pending(&self) -> usize {
        ingress_pending(&mut self.conn.clone(), &self.keys).await.expect("XPENDING of the ingress group") as usize
    }

    /// The environment a `batchd` process gets: the world's Redis, namespace and emulator, and nothing else (no
    /// token: `run` needs `CLOUDFLARE_API_TOKEN` added).
    pub fn batchd_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("PATH", std::env::var("PATH").unwrap_or_default()),
            ("REDIS_URL", self.settings.redis.url.expose().to_owned()),
            ("BATCHD__REDIS__NAMESPACE", self.settings.redis.namespace.clone()),
            ("BATCHD__CLOUDFLARE__BASE_URL", self.emulator.base_url()),
            ("CLOUDFLARE_ACCOUNT_ID", self.emulator.account_id().to_owned()),
            // As in `test_settings`: the suite's per-job checks drive jobs with remote batches of their own.
            ("BATCHD__PACKING__ENABLED", "false".to_owned()),
        ]
    }

    /// The real `batchd` binary with only [`World::batchd_env`] as its environment.
    pub fn batchd(&self) -> Command {
        let mut command = Command::new(binary("batchd").expect("batchd binary"));
        command.env_clear().envs(self.batchd_env());
        command
    }

    /// Number of members in the schedule.
    pub async fn scheduled(&self) -> usize {
        self.conn.clone().zcard(self.keys.schedule()).await.expect("zcard")
    }

    /// Waits until no work is left anywhere: the schedule is empty (no chunk is due, waiting or leased by a
    /// worker) and the ingress group holds no unacknowledged entry. Past that point nothing can publish a result or
    /// submit a batch until a new job arrives, so "nothing more happens" can be checked at once.
    pub async fn wait_until_settled(&self, timeout: Duration) {
        wait_until("the schedule to empty and every entry to be acknowledged", timeout, async || {
            self.scheduled().await == 0 && self.ingress_pending().await == 0
        })
        .await;
    }
}

/// Number of entries pending in the ingress consumer group `batchd` (`XPENDING {ns}:submit batchd`). Only
/// `NOGROUP` (no daemon has created the group yet, so nothing can be pending) reads as 0; every other error, and a
/// reply that is not the summary `XPENDING` sends, is returned.
pub async fn ingress_pending(conn: &mut impl redis::aio::ConnectionLike, keys: &Keys) -> redis::RedisResult<u64> {
    let reply = redis::cmd("XPENDING").arg(keys.submit()).arg("batchd").query_async::<redis::Value>(conn).await;
    match reply {
        Ok(redis::Value::Array(items)) if !items.is_empty() => Ok(redis::from_redis_value_ref::<u64>(&items[0])?),
        Ok(other) => Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "XPENDING summary",
            format!("{other:?}"),
        ))),
        Err(error) if error.code() == Some("NOGROUP") => Ok(0),
        Err(error) => Err(error),
    }
}

/// A connection for the test's own commands, patient enough for reading 20,000-entry streams.
pub async fn test_connection(url: &str) -> MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
    redis::Client::open(url).expect("url").get_multiplexed_async_connection_with_config(&config).await.expect("connect")
}

/// Settings for tests: fast polls and retries, short leases so recovery tests finish quickly.
pub fn test_settings(redis_url: &str, emulator: &EmulatorHandle, namespace: &str) -> Settings {
    let env: HashMap<String, String> = [
        ("REDIS_URL", redis_url.to_owned()),
        // Port 0: the admin server of every in-process daemon gets a free port (tests run in parallel).
        ("BATCHD__ADMIN__LISTEN", "127.0.0.1:0".to_owned()),
        ("BATCHD__REDIS__NAMESPACE", namespace.to_owned()),
        ("BATCHD__CLOUDFLARE__BASE_URL", emulator.base_url()),
        ("BATCHD__CLOUDFLARE__ACCOUNT_ID", emulator.account_id().to_owned()),
        ("BATCHD__CLOUDFLARE__REQUEST_TIMEOUT_SECS", "5".to_owned()),
        ("BATCHD__SCHEDULE__LEASE_SECS", "6".to_owned()),
        ("BATCHD__SCHEDULE__IDLE_POLL_MS", "20".to_owned()),
        ("BATCHD__INGRESS__BLOCK_MS", "200".to_owned()),
        ("BATCHD__INGRESS__RECLAIM_IDLE_SECS", "2".to_owned()),
        ("BATCHD__INGRESS__RECLAIM_INTERVAL_SECS", "1".to_owned()),
        ("BATCHD__POLL__INITIAL_INTERVAL_MS", "100".to_owned()),
        ("BATCHD__POLL__MAX_INTERVAL_MS", "300".to_owned()),
        ("BATCHD__RETRY__INITIAL_BACKOFF_MS", "50".to_owned()),
        ("BATCHD__RETRY__MAX_BACKOFF_MS", "200".to_owned()),
        ("BATCHD__RETRY__MAX_ATTEMPTS", "4".to_owned()),
        ("BATCHD__SHUTDOWN__GRACE_SECS", "5".to_owned()),
        // Packing (on by default) has its own tests (tests/it/packing.rs, kill_create.rs): the rest of the suite
        // drives the path of a job with remote batches of its own (big jobs, `"pack": false`, packing off), whose
        // per-job calls and ledgers they check.
        ("BATCHD__PACKING__ENABLED", "false".to_owned()),
        // Rate limiting has its own tests; elsewhere it would only slow the tests down.
        ("BATCHD__RATE_LIMITS__TEXT_GENERATION", "0".to_owned()),
        ("BATCHD__RATE_LIMITS__EMBEDDINGS", "0".to_owned()),
        ("BATCHD__RATE_LIMITS__TRANSLATION", "0".to_owned()),
        ("BATCHD__RATE_LIMITS__SPEECH_RECOGNITION", "0".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let mut settings = Settings::load_from(None, &env).expect("test settings");
    // The per-model limits (20 a minute for the large text models) too.
    settings.rate_limits.models.clear();
    settings
}

/// A daemon running in-process (`batchd::run`) on its own task.
#[derive(Debug)]
pub struct Daemon {
    /// Cancelling it asks for a graceful shutdown.
    pub shutdown: CancellationToken,
    /// The daemon's task.
    pub task: JoinHandle<anyhow::Result<()>>,
}

impl Daemon {
    /// Starts `batchd::run` with the emulator's token.
    pub fn start(settings: Settings, emulator: &EmulatorHandle) -> Self {
        let shutdown = CancellationToken::new();
        let token = Secret::new(emulator.token());
        let task = tokio::spawn(batchd::run(settings, token, shutdown.clone()));
        Self { shutdown, task }
    }

    /// Starts `batchd::daemon::run_with_providers`: the configured providers and `extra` beside them.
    pub fn start_with_providers(
        settings: Settings,
        emulator: &EmulatorHandle,
        extra: Vec<std::sync::Arc<dyn batchd_provider::Provider>>,
    ) -> Self {
        let shutdown = CancellationToken::new();
        let token = Secret::new(emulator.token());
        let task = tokio::spawn(batchd::daemon::run_with_providers(settings, token, extra, shutdown.clone()));
        Self { shutdown, task }
    }

    /// Graceful stop; returns what `run` returned.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task).await.context("daemon did not stop in 30 s")??
    }

    /// Simulates a crash: the task is aborted mid-flight, nothing is handed back.
    pub async fn crash(self) {
        self.task.abort();
        let _ = self.task.await;
    }

    /// Whether the daemon is still running.
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }
}

/// Path of a binary built by this workspace (`batchd`, `batchd-emulator`), next to the test executable.
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().and_then(|deps| deps.parent()).context("target dir")?;
    let path = dir.join(name);
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo).args(["build", "--quiet", "--bin", name]).status()?;
        if !status.success() || !path.exists() {
            bail!("cannot build {name}");
        }
    }
    Ok(path)
}

/// Emulator settings whose bge-small embeddings have 4 dimensions instead of 384, for tests that move tens of
/// thousands of items and do not look at the vectors.
pub fn small_embeddings() -> EmulatorConfig {
    EmulatorConfig {
        extra_models: vec![("@cf/baai/bge-small-en-v1.5".to_owned(), batchd_emulator::Family::Embeddings { dim: 4 })],
        ..EmulatorConfig::default()
    }
}

/// Settings for moving tens of megabytes on a busy 2-core machine: patient API requests (and a lease longer than
/// them, as the configuration requires).
pub fn patient(mut settings: Settings) -> Settings {
    settings.cloudflare.request_timeout_secs = 60;
    settings.schedule.lease_secs = 120;
    settings
}

/// A job JSON with `n` bge-m3 query/contexts items.
pub fn bge_m3_job(id: &str, n: usize) -> serde_json::Value {
    let requests: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({
                "query": format!("question {i}"),
                "contexts": [{"text": format!("context a{i}")}, {"text": format!("context b{i}")}],
                "external_reference": format!("q{i}"),
            })
        })
        .collect();
    serde_json::json!({"id": id, "model": "@cf/baai/bge-m3", "requests": requests})
}

/// Configures the OpenAI provider against the emulator's `/openai/v1` (its key; creates not rate limited, which
/// has its own tests).
pub fn with_openai(settings: &mut Settings, emulator: &EmulatorHandle) {
    settings.openai.api_key = Some(Secret::new(emulator.openai().api_key()));
    settings.openai.base_url = emulator.openai_base_url();
    settings.openai.batches_per_hour = 0;
    settings.openai.request_timeout_secs = 5;
}

/// Configures the Anthropic provider against the emulator's `/anthropic`.
pub fn with_anthropic(settings: &mut Settings, emulator: &EmulatorHandle) {
    let control = emulator.anthropic();
    settings.anthropic.api_key = Some(Secret::new(control.api_key()));
    settings.anthropic.base_url = control.base_url();
    settings.anthropic.request_timeout_secs = 2;
}

/// Configures Gemini Batch Mode against the emulator's `/gemini`.
pub fn with_gemini(settings: &mut Settings, emulator: &EmulatorHandle) {
    let control = emulator.gemini();
    settings.gemini.api_key = Some(Secret::new(control.api_key()));
    settings.gemini.base_url = control.base_url();
    settings.gemini.request_timeout_secs = 5;
}

/// Puts the admin server of `settings` on a free loopback port with a fast sampler (100 ms); returns its address.
pub fn with_admin(settings: &mut Settings) -> SocketAddr {
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    settings.admin.listen = addr.to_string();
    settings.admin.sample_interval_ms = 100;
    addr
}

/// `GET http://<addr><path>` on a fresh connection (no pooling, no proxy): the status code and the body. Fails when
/// the connection is refused or no complete answer arrives within 10 s.
pub async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .build()
        .context("build the HTTP client")?;
    let response = client.get(format!("http://{addr}{path}")).send().await.with_context(|| format!("GET {path}"))?;
    let status = response.status().as_u16();
    let body = response.text().await.with_context(|| format!("read the body of GET {path}"))?;
    Ok((status, body))
}

/// Polls `condition` every 25 ms until it holds; panics after `timeout`, naming `what` was awaited.
pub async fn wait_until(what: &str, timeout: Duration, mut condition: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !condition().await {
        assert!(started.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Repeats `GET path` until `accept(status, body)` holds; panics after `timeout` with the last answer.
pub async fn wait_for_http(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    accept: impl Fn(u16, &str) -> bool,
) -> (u16, String) {
    let started = Instant::now();
    loop {
        let answer = http_get(addr, path).await;
        match &answer {
            Ok((status, body)) if accept(*status, body) => return (*status, body.clone()),
            _ => {}
        }
        assert!(started.elapsed() < timeout, "GET {path}: still {answer:?} after {timeout:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
