//! The processes a scenario runs besides Redis: the release `batchd` daemon and `batchd-emulator` (each its own
//! process, so the daemon's memory is read from `/proc/<pid>/status` alone), and the settings the daemon gets.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use batchd_core::Keys;
use redis::aio::MultiplexedConnection;

/// The workspace root (for `bench/peers/` and `target/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("bench/ has a parent").to_path_buf()
}

/// A binary next to this one (`target/release/batchd`, `target/release/batchd-emulator`).
pub fn sibling_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe.parent().context("exe dir")?.join(name);
    if !path.exists() {
        bail!("{} is missing: build it first (cargo build --release --bins)", path.display());
    }
    Ok(path)
}

/// A child process that is terminated (SIGTERM, then SIGKILL after 30 s) when dropped.
#[derive(Debug)]
pub struct Proc {
    /// The process.
    child: Child,
    /// Kept open so the child never writes into a closed pipe.
    _stdout: Option<ChildStdout>,
}

impl Proc {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits for the exit (SIGKILL after `grace`).
    pub fn terminate(&mut self, grace: Duration) {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let started = Instant::now();
        while started.elapsed() < grace {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.terminate(Duration::from_secs(30));
        }
    }
}

/// A running emulator and its base URL (`http://127.0.0.1:<port>/client/v4`).
#[derive(Debug)]
pub struct Emulator {
    /// The process (stopped when this is dropped).
    _proc: Proc,
    /// Base URL of the API.
    pub base_url: String,
}

impl Emulator {
    /// The emulator's process id.
    pub fn pid(&self) -> u32 {
        self._proc.pid()
    }

    /// The emulator's origin, for the control API (`/_emulator/...`).
    pub fn origin(&self) -> String {
        self.base_url.trim_end_matches("/client/v4").to_owned()
    }
}

/// Starts the release emulator on a free port with the given batch timing and `extra_args` (`--latency-min-ms`,
/// `--events`, ...); logs go to `log`.
pub fn start_emulator(queued_ms: u64, running_ms: u64, extra_args: &[String], log: &Path) -> anyhow::Result<Emulator> {
    let mut child = Command::new(sibling_binary("batchd-emulator")?)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--queued-ms",
            &queued_ms.to_string(),
            "--running-ms",
            &running_ms.to_string(),
        ])
        .args(extra_args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .context("start batchd-emulator")?;
    let stdout = child.stdout.take().context("emulator stdout")?;
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let base_url = line
        .trim()
        .strip_prefix("batchd-emulator listening on ")
        .with_context(|| format!("unexpected emulator output {line:?}"))?
        .to_owned();
    Ok(Emulator { _proc: Proc { child, _stdout: Some(reader.into_inner()) }, base_url })
}

/// Environment of a benchmark daemon: `redis_url`, the emulator, no admin server, no submit rate limits (the
/// emulator has none), and `extra` on top (later entries win).
pub fn daemon_env(redis_url: &str, emulator: &Emulator, extra: &[(&str, String)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("REDIS_URL", redis_url.to_owned()),
        ("BATCHD__CLOUDFLARE__BASE_URL", emulator.base_url.clone()),
        ("CLOUDFLARE_ACCOUNT_ID", "emulator-account".to_owned()),
        ("CLOUDFLARE_API_TOKEN", "emulator-token".to_owned()),
        ("BATCHD__ADMIN__LISTEN", String::new()),
        ("BATCHD__RATE_LIMITS__TEXT_GENERATION", "0".to_owned()),
        ("BATCHD__RATE_LIMITS__EMBEDDINGS", "0".to_owned()),
        ("BATCHD__RATE_LIMITS__TRANSLATION", "0".to_owned()),
        ("BATCHD__RATE_LIMITS__SPEECH_RECOGNITION", "0".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for (key, value) in extra {
        env.push(((*key).to_owned(), value.clone()));
    }
    // What-if runs: BENCH_DAEMON_ENV="BATCHD__LOG__LEVEL=warn,BATCHD__SCHEDULE__IDLE_POLL_MS=5" goes to every daemon.
    if let Ok(overrides) = std::env::var("BENCH_DAEMON_ENV") {
        for pair in overrides.split(',').filter(|pair| !pair.is_empty()) {
            if let Some((key, value)) = pair.split_once('=') {
                env.push((key.trim().to_owned(), value.trim().to_owned()));
            }
        }
    }
    env
}

/// Starts `batchd run` (release) with `env`; logs go to `log`.
pub fn start_daemon(env: &[(String, String)], log: &Path) -> anyhow::Result<Proc> {
    start_batchd(&["run"], env, log)
}

/// Starts `batchd <args>` (release) with `env` only; logs go to `log`.
pub fn start_batchd(args: &[&str], env: &[(String, String)], log: &Path) -> anyhow::Result<Proc> {
    let mut command = Command::new(sibling_binary("batchd")?);
    command.args(args).env_clear();
    for key in ["PATH", "HOME"] {
        if let Ok(value) = std::env::var(key) {
            command.env(key, value);
        }
    }
    for (key, value) in env {
        command.env(key, value);
    }
    let child = command.stdout(Stdio::null()).stderr(std::fs::File::create(log)?).spawn().context("start batchd")?;
    Ok(Proc { child, _stdout: None })
}

/// Waits until the daemon has created its consumer group (its ingress fetcher runs).
pub async fn wait_daemon_ready(conn: &mut MultiplexedConnection, keys: &Keys, daemon: &mut Proc) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let groups: redis::RedisResult<redis::Value> =
            redis::cmd("XINFO").arg("GROUPS").arg(keys.submit()).query_async(conn).await;
        if matches!(groups, Ok(redis::Value::Array(ref groups)) if !groups.is_empty()) {
            return Ok(());
        }
        if let Ok(Some(status)) = daemon.child.try_wait() {
            bail!("batchd exited at start: {status}");
        }
        if started.elapsed() > Duration::from_secs(20) {
            bail!("batchd did not create its consumer group within 20 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A field of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`).
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.trim().trim_end_matches("kB").trim().parse().ok()
    })
}

/// CPU time (user + system) a process has used so far, in seconds (from `/proc/<pid>/stat`).
pub fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return f64::NAN };
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; clock ticks are 100 per second.
    (ticks(11) + ticks(12)) / 100.0
}

/// `status_kib` in MiB, as f64.
pub fn status_mib(pid: u32, field: &str) -> f64 {
    status_kib(pid, field).map_or(f64::NAN, |kib| kib as f64 / 1024.0)
}
