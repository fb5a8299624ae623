//! The `batchd` binary: argument parsing and exit codes only; everything else is in the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use batchd::cli::{self, Exit, SubmitOptions};
use batchd::settings::{EXIT_CONFIG, Settings};
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

const EXIT_CODES: &str = "Exit codes:
  0   success (for `submit --wait`: the job completed)
  1   error (bad input, Redis unreachable, ...), with a one-line message on stderr
  3   `submit --wait`: the job ended failed or expired
  4   `submit --wait`: gave up waiting (--timeout); the job goes on
  5   `status`: no such job
  78  configuration error (bad or missing key); the message names the key";

/// Run Cloudflare Workers AI batch jobs from Redis: producers XADD jobs, batchd submits and polls them and
/// publishes one result entry per job to a results stream.
#[derive(Debug, Parser)]
#[command(name = "batchd", version, after_help = EXIT_CODES)]
struct Cli {
    /// Configuration file (TOML) layered over the built-in defaults; see config/default.toml for every key.
    #[arg(long, short = 'c', global = true, env = "BATCHD_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Key namespace (overrides redis.namespace).
    #[arg(long, global = true, value_name = "NAME")]
    namespace: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon until SIGTERM or SIGINT, then drain within shutdown.grace_secs and exit 0.
    Run,
    /// Enqueue a job (JSON file or `-` for stdin) and print its id.
    #[command(after_help = "The file holds one v1 job: {\"id\":\"inv-42\",\"model\":\"@cf/baai/bge-m3\",\"requests\":[...]}.\nIt is validated here with the daemon's own rules before it is enqueued.")]
    Submit {
        /// Job JSON file, or `-` to read standard input.
        #[arg(value_name = "FILE", default_value = "-")]
        file: PathBuf,
        /// Job id (overrides the file's `id`; without either, the stream entry id is the job id).
        #[arg(long)]
        id: Option<String>,
        /// Follow the job (progress on stderr) and print its result entry when it finishes.
        #[arg(long)]
        wait: bool,
        /// With --wait: give up after this many seconds (the job goes on).
        #[arg(long, default_value_t = 3600, value_name = "SECS")]
        timeout: u64,
        /// Print JSON (`{"job_id":..}`) instead of the bare id.
        #[arg(long)]
        json: bool,
    },
    /// Show one job's ledger: state, chunks, request ids, attempts, timestamps, errors.
    Status {
        /// The job id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut settings = match Settings::load(cli.config.as_deref()) {
        Ok(settings) => settings,
        Err(error) => return fail(EXIT_CONFIG, &error.to_string()),
    };
    if let Some(namespace) = cli.namespace {
        if let Err(error) = batchd_core::Keys::new(&namespace) {
            return fail(EXIT_CONFIG, &format!("--namespace: {error}"));
        }
        settings.redis.namespace = namespace;
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => return fail(1, &format!("cannot start the async runtime: {error}")),
    };
    let outcome = runtime.block_on(async move {
        match cli.command {
            Command::Run => run_daemon(settings).await,
            Command::Submit { file, id, wait, timeout, json } => {
                let options = SubmitOptions { file, id, wait, timeout: Duration::from_secs(timeout), json };
                cli::submit(&settings, &options).await
            }
            Command::Status { id, json } => cli::status(&settings, &id, json).await,
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => match error.downcast_ref::<Exit>() {
            Some(exit) => fail(exit.code, &exit.message),
            None if error.downcast_ref::<batchd::settings::ConfigError>().is_some() => {
                fail(EXIT_CONFIG, &format!("{error:#}"))
            }
            None => fail(1, &format!("{error:#}")),
        },
    }
}

async fn run_daemon(settings: Settings) -> anyhow::Result<()> {
    batchd::logging::init(&settings.log).map_err(|message| batchd::settings::ConfigError(message))?;
    let token = settings.api_token()?;
    let shutdown = CancellationToken::new();
    let signals = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("stop signal received");
        signals.cancel();
    });
    batchd::run(settings, token, shutdown).await
}

async fn wait_for_signal() {
    let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(signal) => signal,
        Err(error) => {
            tracing::error!(error = %error, "cannot listen for SIGTERM; only SIGINT stops the daemon");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

fn fail(code: i32, message: &str) -> ExitCode {
    eprintln!("batchd: {message}");
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
