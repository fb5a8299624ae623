//! A chaos run's world: one `redis-server`, the emulator (in this process: Workers AI, OpenAI Batch and Anthropic
//! Message Batches on one server) and `batchd run` processes with all three providers configured.
//!
//! Every daemon process ("incarnation") gets its own emulator port ([`EmulatorHandle::listen_also`]) for all three
//! APIs, so the emulator's call logs say which process made each call; a duplicate remote batch can then be traced
//! to the process that submitted it and to how that process ended. Processes are started with only the environment
//! given here (`env_clear`), like a supervisor would, and log to files under `target/chaos/logs/`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use batchd_core::Keys;
use batchd_emulator::{Emulator, EmulatorConfig, EmulatorHandle};
use redis::aio::ConnectionManager;

use super::provider_faults::ProviderFaults;
use super::{Size, human, unix_ms};
use crate::{RedisServer, free_port, http_get, send_signal, workspace_binary};

/// The model every chaos job uses (its embeddings are cut to 4 dimensions, so polls stay cheap).
pub const MODEL: &str = "@cf/baai/bge-small-en-v1.5";

/// How one daemon process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// `kill -9` by the runner.
    Killed {
        /// When, in Unix ms.
        at_ms: u64,
    },
    /// SIGTERM by the runner, then it exited by itself.
    Stopped {
        /// When the signal was sent, in Unix ms.
        at_ms: u64,
        /// Its exit code (`None`: killed by a signal).
        code: Option<i32>,
        /// From SIGTERM to exit.
        took: Duration,
    },
    /// It exited without being asked to: a failure in every scenario.
    Died {
        /// When the runner noticed, in Unix ms.
        at_ms: u64,
        /// Its exit code.
        code: Option<i32>,
    },
}

/// One daemon process, from start to end.
#[derive(Debug, Clone)]
pub struct Incarnation {
    /// Which replica it is (a rolling restart starts the new one in the old one's slot).
    pub slot: usize,
    /// Its process id.
    pub pid: u32,
    /// The emulator port it talks to (unique to it).
    pub port: u16,
    /// Its admin server (`/readyz`).
    pub admin: SocketAddr,
    /// When it started, in Unix ms.
    pub started_ms: u64,
    /// How it ended, once it has.
    pub end: Option<End>,
    /// Its log file.
    pub log: PathBuf,
}

/// Something the runner did or saw, for the report.
#[derive(Debug, Clone)]
pub struct Event {
    /// Time since the start of the run.
    pub at: Duration,
    /// What happened.
    pub what: String,
}

/// Redis, the emulator and the daemon processes of one run.
#[allow(missing_debug_implementations)]
pub struct Cluster {
    /// The redis-server.
    pub redis: RedisServer,
    /// The emulator.
    pub emulator: EmulatorHandle,
    /// The run's namespace.
    pub namespace: String,
    /// Keys of the namespace.
    pub keys: Keys,
    /// The runner's own connection (reconnects by itself after Redis restarts).
    pub conn: ConnectionManager,
    /// Every daemon process ever started, in start order.
    pub incarnations: Vec<Incarnation>,
    /// What happened, in order.
    pub events: Vec<Event>,
    /// Windows (Unix ms, start and end) in which Redis was unavailable.
    pub redis_outages: Vec<(u64, u64)>,
    /// When the run started.
    pub started: Instant,
    /// Daemon restarts after a kill -9 or during a rolling restart (not the initial starts).
    pub restarts: usize,
    /// kill -9 of daemons, and kills or freezes of Redis.
    pub kills: usize,
    /// Daemons frozen with SIGSTOP: (incarnation index, Unix ms of the SIGSTOP, of the SIGCONT).
    pub freezes: Vec<(usize, u64, u64)>,
    /// The emulator's reply latency, shortest and longest, in ms (0, 0 without random latency).
    pub latency_ms: (u64, u64),
    /// The delay of the `delay` faults the scenario injects into the emulator, in ms (one value per run).
    pub injected_delay_ms: u64,
    /// Wall-clock changes of the daemons of a slot: (slot, from Unix ms, offset ms), in order (faked clocks).
    pub clocks: Vec<(usize, u64, i64)>,
    /// Kills aimed at a create whose reply the emulator held: (provider, incarnation index).
    pub aimed_kills: Vec<(batchd_emulator::Provider, usize)>,
    /// The batchd binary.
    bin: PathBuf,
    /// Another batchd binary for the daemons of a slot (a previous release), kept across restarts until cleared.
    slot_bins: HashMap<usize, PathBuf>,
    /// Environment of every daemon, besides the per-process variables.
    vars: Vec<(String, String)>,
    /// Where the daemons' logs go.
    log_dir: PathBuf,
    /// Environment of the daemons of one slot on top of `vars` (a faked clock), kept across restarts.
    slot_vars: HashMap<usize, Vec<(String, String)>>,
    /// Running processes by index into `incarnations`.
    running: HashMap<usize, Child>,
    /// The random faults of the OpenAI and Anthropic emulators, while they are injected.
    provider_faults: Option<ProviderFaults>,
}

/// `target/chaos` (or `$CARGO_TARGET_DIR/chaos`).
pub fn output_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join("target"));
    target.join("chaos")
}

impl Cluster {
    /// Starts Redis (with `redis_args`) and the emulator; no daemon yet. `vars` are the scenario's
    /// `BATCHD__...` settings.
    pub async fn start(
        scenario: &str,
        size: Size,
        redis_args: &[&str],
        emulator: EmulatorConfig,
        vars: &[(&str, String)],
    ) -> anyhow::Result<Self> {
        let bin = workspace_binary("batchd")?;
        let redis = RedisServer::start_with(redis_args).await;
        let fault_rate = emulator.random_faults.as_ref().map(|faults| faults.rate);
        let latency_ms = emulator
            .random_latency
            .as_ref()
            .map_or((0, 0), |range| (range.min.as_millis() as u64, range.max.as_millis() as u64));
        let seed = emulator.seed;
        let emulator = Emulator::start(emulator, "127.0.0.1:0".parse()?).await.context("start the emulator")?;
        // The OpenAI and Anthropic APIs fail at the rate the Workers AI emulator draws.
        let provider_faults = fault_rate
            .filter(|rate| *rate > 0.0)
            .map(|rate| ProviderFaults::start(emulator.openai(), emulator.anthropic(), rate, seed));
        let namespace = format!("chaos{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let keys = Keys::new(&namespace).map_err(|error| anyhow::anyhow!("{error}"))?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(Duration::from_secs(30)))
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(3);
        let conn = ConnectionManager::new_with_config(redis::Client::open(redis.url())?, config).await?;
        let log_dir = output_dir().join("logs").join(format!("{}-{scenario}-{namespace}", size.as_str()));
        std::fs::create_dir_all(&log_dir).with_context(|| format!("create {}", log_dir.display()))?;
        let mut all_vars: Vec<(String, String)> = vec![
            ("REDIS_URL".into(), redis.url()),
            ("BATCHD__REDIS__NAMESPACE".into(), namespace.clone()),
            ("CLOUDFLARE_ACCOUNT_ID".into(), emulator.account_id().to_owned()),
            ("CLOUDFLARE_API_TOKEN".into(), emulator.token().to_owned()),
            // All three providers, as `make demo` configures them; each daemon's base URLs name its own port.
            ("OPENAI_API_KEY".into(), emulator.openai().api_key().to_owned()),
            ("ANTHROPIC_API_KEY".into(), emulator.anthropic().api_key()),
            ("BATCHD__ADMIN__SAMPLE_INTERVAL_MS".into(), "500".into()),
            ("BATCHD__LOG__LEVEL".into(), "warn".into()),
            // The chaos runs measure recovery, not the shared limiter (which has its own tests).
            ("BATCHD__RATE_LIMITS__TEXT_GENERATION".into(), "0".into()),
            ("BATCHD__RATE_LIMITS__EMBEDDINGS".into(), "0".into()),
            ("BATCHD__RATE_LIMITS__TRANSLATION".into(), "0".into()),
            ("BATCHD__RATE_LIMITS__SPEECH_RECOGNITION".into(), "0".into()),
            ("BATCHD__OPENAI__BATCHES_PER_HOUR".into(), "0".into()),
            // A submit holds room for twice the provider's body limit before it reads its items (finding f3): at
            // the defaults, an OpenAI submit holds half of `workers.inflight_bytes` and an Anthropic one all of it.
            // The runs use Workers AI's 10 MB for all three, as an operator would once f3 is known.
            ("BATCHD__OPENAI__MAX_FILE_BYTES".into(), "10000000".into()),
            ("BATCHD__ANTHROPIC__MAX_BODY_BYTES".into(), "10000000".into()),
            ("BATCHD__ANTHROPIC__REQUESTS_PER_MINUTE".into(), "0".into()),
        ];
        all_vars.extend(vars.iter().map(|(key, value)| ((*key).to_owned(), value.clone())));
        Ok(Self {
            redis,
            emulator,
            namespace,
            keys,
            conn,
            incarnations: Vec::new(),
            events: Vec::new(),
            redis_outages: Vec::new(),
            started: Instant::now(),
            restarts: 0,
            kills: 0,
            freezes: Vec::new(),
            latency_ms,
            injected_delay_ms: 0,
            clocks: Vec::new(),
            aimed_kills: Vec::new(),
            bin,
            slot_bins: HashMap::new(),
            vars: all_vars,
            log_dir,
            slot_vars: HashMap::new(),
            running: HashMap::new(),
            provider_faults,
        })
    }

    /// Stops injecting faults into the OpenAI and Anthropic emulators; what was injected, by provider and kind
    /// (empty when the run has no random faults, or on a second call).
    pub async fn stop_provider_faults(&mut self) -> std::collections::BTreeMap<String, u64> {
        match self.provider_faults.take() {
            Some(faults) => faults.stop().await,
            None => std::collections::BTreeMap::new(),
        }
    }

    /// Records an event (also printed to stderr, so a long run shows progress).
    pub fn event(&mut self, what: impl Into<String>) {
        let what = what.into();
        let at = self.started.elapsed();
        eprintln!("[chaos {:>7}] {what}", human(at));
        self.events.push(Event { at, what });
    }

    /// The value of a daemon setting this run uses (e.g. `BATCHD__SCHEDULE__LEASE_SECS`).
    pub fn var(&self, key: &str) -> Option<&str> {
        self.vars.iter().rev().find(|(name, _)| name == key).map(|(_, value)| value.as_str())
    }

    /// Gives every daemon started in `slot` from now on these variables on top of the run's (`LD_PRELOAD` of a
    /// faked clock, ...).
    pub fn set_slot_vars(&mut self, slot: usize, vars: Vec<(String, String)>) {
        self.slot_vars.insert(slot, vars);
    }

    /// Runs the daemons started in `slot` from now on from `bin` (a previous release), or from this build's
    /// binary again with `None`.
    pub fn set_slot_bin(&mut self, slot: usize, bin: Option<PathBuf>) {
        match bin {
            Some(bin) => self.slot_bins.insert(slot, bin),
            None => self.slot_bins.remove(&slot),
        };
    }

    /// Starts a daemon process in `slot`; returns its incarnation index.
    pub async fn start_daemon(&mut self, slot: usize) -> anyhow::Result<usize> {
        let port = self.emulator.listen_also("127.0.0.1:0".parse()?).await?.port();
        let origin = format!("http://127.0.0.1:{port}");
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let index = self.incarnations.len();
        let log = self.log_dir.join(format!("daemon-{index:03}-slot{slot}.log"));
        let file = std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let bin = self.slot_bins.get(&slot).unwrap_or(&self.bin).clone();
        let child = Command::new(&bin)
            .arg("run")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.vars.iter().map(|(key, value)| (key.as_str(), value.as_str())))
            .envs(self.slot_vars.get(&slot).into_iter().flatten().map(|(key, value)| (key.as_str(), value.as_str())))
            .env("BATCHD__CLOUDFLARE__BASE_URL", EmulatorHandle::base_url_of(SocketAddr::from(([127, 0, 0, 1], port))))
            .env("BATCHD__OPENAI__BASE_URL", format!("{origin}{}", batchd_emulator::OPENAI_PREFIX))
            .env("BATCHD__ANTHROPIC__BASE_URL", format!("{origin}/anthropic"))
            .env("BATCHD__ADMIN__LISTEN", admin.to_string())
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        let pid = child.id();
        self.incarnations.push(Incarnation { slot, pid, port, admin, started_ms: unix_ms(), end: None, log });
        self.running.insert(index, child);
        let which = if bin == self.bin { String::new() } else { format!(", from {}", bin.display()) };
        self.event(format!("daemon #{index} started in slot {slot} (pid {pid}{which})"));
        Ok(index)
    }

    /// Incarnation indices of the running daemons, in start order.
    pub fn live(&self) -> Vec<usize> {
        let mut live: Vec<usize> = self.running.keys().copied().collect();
        live.sort_unstable();
        live
    }

    /// The running daemon in `slot`, if any.
    pub fn in_slot(&self, slot: usize) -> Option<usize> {
        self.live().into_iter().find(|index| self.incarnations[*index].slot == slot)
    }

    /// `kill -9` of a running daemon (reaped at once).
    pub fn kill9(&mut self, index: usize) -> anyhow::Result<()> {
        let mut child = self.running.remove(&index).context("not running")?;
        child.kill().context("kill -9")?;
        let at_ms = unix_ms();
        child.wait().context("reap")?;
        self.incarnations[index].end = Some(End::Killed { at_ms });
        self.kills += 1;
        let pid = self.incarnations[index].pid;
        self.event(format!("kill -9 daemon #{index} (pid {pid})"));
        Ok(())
    }

    /// Freezes a running daemon with SIGSTOP for `duration`, then resumes it with SIGCONT (recorded in `freezes`).
    pub async fn freeze(&mut self, index: usize, duration: Duration) -> anyhow::Result<()> {
        anyhow::ensure!(self.running.contains_key(&index), "daemon #{index} is not running");
        let pid = self.incarnations[index].pid;
        send_signal(pid, "STOP")?;
        let from_ms = unix_ms();
        self.event(format!("SIGSTOP daemon #{index} (pid {pid}) for {}", human(duration)));
        tokio::time::sleep(duration).await;
        send_signal(pid, "CONT")?;
        self.freezes.push((index, from_ms, unix_ms()));
        self.event(format!("SIGCONT daemon #{index} (pid {pid})"));
        Ok(())
    }

    /// `GET path` of a daemon's admin server.
    pub async fn admin_get(&self, index: usize, path: &str) -> anyhow::Result<(u16, String)> {
        http_get(self.incarnations[index].admin, path).await
    }

    /// SIGTERM to a running daemon, then waits up to `timeout` for it to exit (killed after that).
    pub async fn terminate(&mut self, index: usize, timeout: Duration) -> anyhow::Result<End> {
        let mut child = self.running.remove(&index).context("not running")?;
        let at_ms = unix_ms();
        let sent = Instant::now();
        send_signal(child.id(), "TERM")?;
        let code = loop {
            if let Some(status) = child.try_wait()? {
                break status.code();
            }
            if sent.elapsed() > timeout {
                child.kill().ok();
                child.wait().ok();
                let end = End::Stopped { at_ms, code: None, took: sent.elapsed() };
                self.incarnations[index].end = Some(end.clone());
                bail!("daemon #{index} did not exit within {timeout:?} of SIGTERM; killed");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let end = End::Stopped { at_ms, code, took: sent.elapsed() };
        self.incarnations[index].end = Some(end.clone());
        self.event(format!("daemon #{index} exited {code:?} {} after SIGTERM", human(sent.elapsed())));
        Ok(end)
    }

    /// Looks for daemons that exited by themselves; records them (a failure), restarts them in their slot as a
    /// supervisor would, and returns how many it found.
    pub async fn supervise(&mut self) -> anyhow::Result<usize> {
        let mut died = Vec::new();
        for (index, child) in &mut self.running {
            if let Some(status) = child.try_wait()? {
                died.push((*index, status.code()));
            }
        }
        for (index, code) in &died {
            self.running.remove(index);
            self.incarnations[*index].end = Some(End::Died { at_ms: unix_ms(), code: *code });
            let slot = self.incarnations[*index].slot;
            let log = self.incarnations[*index].log.display().to_string();
            self.event(format!("daemon #{index} EXITED BY ITSELF with {code:?} (log: {log}); restarting slot {slot}"));
            self.start_daemon(slot).await?;
            self.restarts += 1;
        }
        Ok(died.len())
    }

    /// Incarnations that exited without being asked to.
    pub fn unexpected_exits(&self) -> Vec<String> {
        self.incarnations
            .iter()
            .enumerate()
            .filter_map(|(index, incarnation)| match &incarnation.end {
                Some(End::Died { code, .. }) => {
                    Some(format!("daemon #{index} exited by itself with {code:?} ({})", incarnation.log.display()))
                }
                _ => None,
            })
            .collect()
    }

    /// A size field of a running daemon's `/proc/<pid>/status` (`VmRSS`, `VmHWM`: peak RSS), in bytes.
    pub fn status_bytes(&self, index: usize, field: &str) -> anyhow::Result<u64> {
        anyhow::ensure!(self.running.contains_key(&index), "daemon #{index} is not running");
        let path = format!("/proc/{}/status", self.incarnations[index].pid);
        let status = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
        let line = status
            .lines()
            .find(|line| line.strip_prefix(field).is_some_and(|rest| rest.starts_with(':')))
            .with_context(|| format!("no {field} in {path}"))?;
        let kib: u64 = line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).context("a size in kB")?;
        Ok(kib * 1024)
    }

    /// `GET /readyz` of a daemon.
    pub async fn readyz(&self, index: usize) -> anyhow::Result<(u16, String)> {
        http_get(self.incarnations[index].admin, "/readyz").await
    }

    /// Waits until every running daemon answers `/readyz` with 200; returns how long it took.
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<Duration> {
        let started = Instant::now();
        loop {
            let mut ready = 0;
            let live = self.live();
            for index in &live {
                if matches!(self.readyz(*index).await, Ok((200, _))) {
                    ready += 1;
                }
            }
            if ready == live.len() {
                return Ok(started.elapsed());
            }
            if started.elapsed() > timeout {
                bail!("{ready} of {} daemons ready after {timeout:?}", live.len());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops every running daemon with SIGTERM (the end of a run; not counted as restarts); returns one failure
    /// for each daemon that did not exit within 60 s (it is killed) or exited with anything but 0.
    pub async fn stop_all(&mut self) -> Vec<String> {
        let mut failures = Vec::new();
        for index in self.live() {
            match self.terminate(index, Duration::from_secs(60)).await {
                Ok(End::Stopped { code: Some(0), .. }) => {}
                Ok(end) => failures.push(format!(
                    "daemon #{index} ended {end:?} after SIGTERM at the end of the run, not with exit code 0 ({})",
                    self.incarnations[index].log.display()
                )),
                Err(error) => {
                    self.event(format!("stopping daemon #{index}: {error:#}"));
                    failures.push(format!("stopping daemon #{index} at the end of the run: {error:#}"));
                }
            }
        }
        failures
    }

    /// The daemon process that talked to the emulator on `port`, with its index.
    pub fn by_port(&self, port: u16) -> Option<(usize, &Incarnation)> {
        self.incarnations.iter().enumerate().find(|(_, incarnation)| incarnation.port == port)
    }

    /// A short description of the daemon settings that differ from the defaults.
    pub fn settings_summary(&self) -> Vec<String> {
        self.vars
            .iter()
            .filter(|(key, _)| key.starts_with("BATCHD__") && !key.starts_with("BATCHD__RATE_LIMITS__"))
            .filter(|(key, _)| key != "BATCHD__REDIS__NAMESPACE")
            .map(|(key, value)| format!("{key}={value}"))
            .collect()
    }

    /// Where the daemons' logs are.
    pub fn log_dir(&self) -> &std::path::Path {
        &self.log_dir
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.running.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
