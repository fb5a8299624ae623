//! The `batchd` binary: argument parsing and exit codes only; everything else is in the library.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use batchd::cli::dead::DeadCommand;
use batchd::cli::inspect::{JobsArgs, StatsArgs};
use batchd::cli::pause::{PauseArgs, ResumeArgs};
use batchd::cli::probe::ProbeArgs;
use batchd::cli::retry::RetryArgs;
use batchd::cli::tail::TailArgs;
use batchd::cli::workers::WorkersArgs;
use batchd::cli::{self, EXIT_CODES_HELP, EXIT_USAGE, Exit, SubmitArgs};
use batchd::settings::{EXIT_CONFIG, Settings};
use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

/// Run Cloudflare Workers AI batch jobs from Redis: producers XADD jobs, batchd submits and polls them and
/// publishes one result entry per job to a results stream.
#[derive(Debug, Parser)]
#[command(name = "batchd", version, after_help = EXIT_CODES_HELP, max_term_width = 100)]
struct Cli {
    /// Configuration file (TOML) layered over the built-in defaults; see config/default.toml for every key.
    #[arg(
        long,
        short = 'c',
        global = true,
        env = "BATCHD_CONFIG",
        value_name = "FILE",
        help_heading = "Global options"
    )]
    config: Option<PathBuf>,
    /// Key namespace (overrides redis.namespace).
    #[arg(long, global = true, value_name = "NAME", help_heading = "Global options")]
    namespace: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon until SIGTERM or SIGINT, then drain within shutdown.grace_secs and exit 0.
    Run,
    /// Enqueue a job (a job JSON file, or JSONL request items with --model) and print its id.
    #[command(
        after_help = "A job file holds one v1 job: {\"id\":\"inv-42\",\"model\":\"@cf/baai/bge-m3\",\"requests\":[...]}.
With --model, FILE holds one request item per line ({\"text\":\"...\"}) and one job is built from them.
Either way the job is checked with the daemon's own rules before it is enqueued (a bad JSONL line is
named by its line number). Exit codes: 0 enqueued (with --wait: completed), 1 error, 3 the job ended
failed, expired or cancelled, 4 --timeout passed first."
    )]
    Submit(SubmitArgs),
    /// Show one job's ledger: state, chunks, request ids, attempts, timestamps, errors.
    Status {
        /// The job id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a job: the daemon publishes a `cancelled` result with the batches that had finished.
    #[command(
        after_help = "The Batch API has no cancel: batches already submitted keep running remotely; their results are
discarded. A job not taken in yet is never submitted; a finished job is not changed."
    )]
    Cancel {
        /// The job id.
        id: String,
        /// Why, for the result's error message.
        #[arg(long, default_value = "cancelled", value_name = "TEXT")]
        reason: String,
        /// Also when no job with this id was taken in yet: the job is cancelled when it arrives (within
        /// retention.ledger_ttl_secs). Without it, an unknown id is "not found" (exit 5).
        #[arg(long)]
        before_arrival: bool,
        /// Print JSON: `{"job_id":..,"outcome":"requested"|"already_finished"|"not_taken_in","state":..}`.
        #[arg(long)]
        json: bool,
    },
    /// Withdraw a pending cancellation request (e.g. one made with `cancel --before-arrival`)
    Uncancel {
        /// The job id.
        id: String,
        /// Print JSON: `{"job_id":..,"withdrawn":true,"reason":..}`.
        #[arg(long)]
        json: bool,
    },
    /// Re-enqueue finished failed jobs, chosen by status, model, error code and time, as new jobs
    /// (`<id>.retry-1`).
    #[command(
        after_help = "Finds jobs in the results stream (XRANGE by time, in pages: bounded work), rebuilds each job
from its ledger and enqueues it under a derived id: a finished job's id stays taken while its ledger
lives (retention.ledger_ttl_secs), so `inv-42` is retried as `inv-42.retry-1`, and that one as
`inv-42.retry-2`. A job whose retry exists already is skipped, so running retry twice enqueues
nothing twice. Exit codes: 0 done (or --dry-run), 1 a matching job could not be retried (its
ledger or its request items are gone)."
    )]
    Retry(RetryArgs),
    /// Follow the results stream: one line (or JSON object) per result entry, from now or from the start.
    Tail(TailArgs),
    /// List jobs by state from their ledgers, the most recently accepted first.
    #[command(
        after_help = "Walks every ledger of the namespace with SCAN (O(number of ledgers), memory O(--limit)): an
operator's tool, not something to poll. Ledgers expire retention.ledger_ttl_secs after their job finished."
    )]
    Jobs(JobsArgs),
    /// Show queue depths, work in flight, the oldest waiting job and throughput over the last minutes.
    Stats(StatsArgs),
    /// List the replicas reading the submit stream (the ingress group's consumers), with the entries each
    /// holds and how long each has been idle.
    Workers(WorkersArgs),
    /// Stop taking new jobs from the submit stream, on every replica of the namespace; work in flight
    /// finishes.
    #[command(
        after_help = "Sets {ns}:paused (who, when, why). Replicas stop reading new entries once their read in flight
returns (within ingress.block_ms), keep running every job already taken in, and stay live and
ready: /readyz answers 200 with `paused` in its text. Entries enqueued meanwhile wait in the stream
(the KEDA lag grows). `batchd resume` undoes it."
    )]
    Pause(PauseArgs),
    /// Take new jobs from the submit stream again, after `batchd pause`.
    Resume(ResumeArgs),
    /// Manage the dead-letter stream: entries that could not be read as a job.
    Dead {
        #[command(subcommand)]
        command: DeadCommand,
    },
    /// Ask a daemon's admin server whether it is alive (/livez) or ready (/readyz): exit 0 or 1, for
    /// container health checks.
    #[command(
        after_help = "Needs no curl and no Redis. The address is admin.listen (0.0.0.0 and [::] are asked on loopback)
unless --addr or --url is given. Prints the answer's text (`ok`) and exits 0 on 200; otherwise one
line on stderr and exit code 1."
    )]
    Probe(ProbeArgs),
    /// Manage the Workers AI batch events of the events queue ([events]).
    Events {
        #[command(subcommand)]
        command: batchd::cli::events::EventsCommand,
    },
    /// List the Cloudflare models that take batch requests, with their task, rate-limit bucket and limit.
    Models(batchd::cli::models::ModelsArgs),
    /// Check the configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Serve the web dashboard: queue depths, jobs, a job's chunks and result, dead letters (read-only unless
    /// --allow-actions).
    #[command(after_help = "Reads the same Redis as the daemons (every namespace of redis.namespace and
redis.extra_namespaces); nothing in it is needed for jobs to run, and any number can run. Every page has a
JSON twin under /api/ (or the page with Accept: application/json), shaped like the CLI's JSON output.
With --allow-actions it offers cancel, dead-letter retry and purge, each guarded against cross-site
requests and logged. See docs/ui.md.")]
    Ui(batchd::ui::UiArgs),
    /// Print a shell completion script: `batchd completions bash > /etc/bash_completion.d/batchd`.
    #[command(after_help = "bash: source it, or put it in /etc/bash_completion.d/batchd (or
~/.local/share/bash-completion/completions/batchd). zsh: put it in a directory of $fpath as _batchd.
fish: put it in ~/.config/fish/completions/batchd.fish.")]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Load the configuration exactly as `run` would (file, environment, token, TLS files) and print the effective
    /// settings with secrets redacted; exit 78 naming the bad key on error. Does not connect to anything.
    Check {
        /// Print the effective settings as JSON instead of TOML.
        #[arg(long)]
        json: bool,
    },
}

/// Gives every allocation of 1 MiB or more its own mapping, returned to the system when freed. glibc's default
/// threshold rises to the size of the largest block freed so far, after which blocks of several MB (a job's
/// items, a submit body, a result) come from the heap and its free space stays resident: a 9.5 MB job then
/// peaks at 4.3x its size instead of 3.3x (docs/benchmarks.md, B3). An operator's own setting
/// (`MALLOC_MMAP_THRESHOLD_`, or `GLIBC_TUNABLES` naming `mmap_threshold`) is left alone.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn tune_malloc() {
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some() || tunables.contains("mmap_threshold") {
        return;
    }
    // SAFETY: mallopt only sets an allocator parameter; it runs first thing in main, before any other thread
    // exists, and a refusal (return value 0) leaves glibc's defaults in place.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_malloc() {}

fn main() -> ExitCode {
    tune_malloc();
    // NO_COLOR (no-color.org): no colours in help and errors; the CLI's progress bars check it too.
    let color = if cli::no_color() { clap::ColorChoice::Never } else { clap::ColorChoice::Auto };
    let cli = match Cli::command().color(color).try_get_matches().and_then(|matches| Cli::from_arg_matches(&matches)) {
        Ok(cli) => cli,
        Err(error) => return usage_error(error),
    };
    // Completions need no configuration: they work wherever the binary runs.
    if let Command::Completions { shell } = &cli.command {
        let mut script = Vec::new();
        clap_complete::generate(*shell, &mut Cli::command(), "batchd", &mut script);
        return match std::io::Write::write_all(&mut std::io::stdout(), &script) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => fail(1, &format!("cannot write the completion script: {error}")),
        };
    }
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
    let runtime = match settings.workers.runtime_threads {
        0 => tokio::runtime::Runtime::new(),
        threads => tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build(),
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => return fail(1, &format!("cannot start the async runtime: {error}")),
    };
    let outcome = runtime.block_on(async move {
        match &cli.command {
            Command::Run => run_daemon(settings).await,
            Command::Submit(args) => cli::submit(&settings, args).await,
            Command::Status { id, json } => cli::status(&settings, id, *json).await,
            Command::Cancel { id, reason, before_arrival, json } => {
                cli::cancel(&settings, id, reason, *before_arrival, *json).await
            }
            Command::Uncancel { id, json } => cli::uncancel(&settings, id, *json).await,
            Command::Retry(args) => cli::retry::retry(&settings, args).await,
            Command::Tail(args) => cli::tail::tail(&settings, args).await,
            Command::Jobs(args) => cli::inspect::jobs(&settings, args).await,
            Command::Stats(args) => cli::inspect::stats(&settings, args).await,
            Command::Workers(args) => cli::workers::workers(&settings, args).await,
            Command::Pause(args) => cli::pause::pause(&settings, args).await,
            Command::Resume(args) => cli::pause::resume(&settings, args).await,
            Command::Dead { command } => cli::dead::dead(&settings, command).await,
            Command::Probe(args) => cli::probe::probe(&settings, args).await,
            Command::Events { command } => cli::events::events(&settings, command).await,
            Command::Models(args) => cli::models::models(&settings, args).await,
            Command::Ui(args) => {
                let stop = tokio_util::sync::CancellationToken::new();
                let signals = stop.clone();
                tokio::spawn(async move {
                    wait_for_signal().await;
                    signals.cancel();
                });
                batchd::ui::ui(settings, args, stop).await
            }
            Command::Config { command: ConfigCommand::Check { json } } => {
                settings.check_for_run()?;
                let text = settings.to_redacted_toml();
                if *json {
                    // The same redaction as the TOML: the JSON is made from it.
                    let value: toml::Value = toml::from_str(&text).context("read back the effective settings")?;
                    let value = serde_json::to_value(value).context("effective settings as JSON")?;
                    cli::print_json(&value)?;
                } else {
                    print!("{text}");
                }
                Ok(())
            }
            Command::Completions { .. } => Ok(()),
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
    // The same checks as `batchd config check`, so what it passes `run` starts with, and what `run` refuses
    // exits 78 (a configuration error systemd does not restart) with the same one-line message.
    settings.check_for_run()?;
    batchd::logging::init(&settings.log).map_err(batchd::settings::ConfigError)?;
    for warning in settings.warnings() {
        tracing::warn!(warning = %warning, "unsafe setting");
    }
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

/// Help and version go to stdout as clap renders them; a usage error becomes one line on stderr, exit code 2.
fn usage_error(error: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        error.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = error.print();
        return ExitCode::from(if error.use_stderr() { 2 } else { 0 });
    }
    let rendered = error.render().to_string();
    let message: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .take_while(|line| !line.starts_with("Usage:") && !line.starts_with("For more information"))
        .filter(|line| !line.is_empty())
        .collect();
    let message = message.join(" ");
    let message = message.strip_prefix("error: ").unwrap_or(&message);
    fail(EXIT_USAGE, &format!("{message} (see --help)"))
}

/// Prints the one-line error, with newlines flattened so it stays one line.
fn fail(code: i32, message: &str) -> ExitCode {
    eprintln!("batchd: {}", message.replace('\n', " "));
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
