//! The `batchd` binary: argument parsing and exit codes only; everything else is in the library.

use std::process::ExitCode;

use anyhow::Context as _;
use batchd::cli::command::{Cli, Command, ConfigCommand};
use batchd::cli::{self, EXIT_USAGE, Exit};
use batchd::settings::{EXIT_CONFIG, Settings};
use clap::{CommandFactory as _, FromArgMatches as _};
use tokio_util::sync::CancellationToken;

/// Gives every allocation of 1 MiB or more its own mapping, returned to the system when freed. glibc's default
/// threshold rises to the size of the largest block freed so far, after which blocks of several MB (a job's
/// items, a submit body, a result) come from the heap and its free space stays resident: a 9.5 MB job then
/// peaks at 4.3x its size instead of 3.3x (measured in an earlier round; docs/benchmarks.md's scenario 5 has
/// today's peak). An operator's own setting (`MALLOC_MMAP_THRESHOLD_`, or `GLIBC_TUNABLES` naming
/// `mmap_threshold`) is left alone.
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
        Err(error) => return fail_keeping_lines(EXIT_CONFIG, &error.to_string()),
    };
    if let Some(namespace) = cli.namespace {
        if let Err(error) = batchd_core::Keys::new(&namespace) {
            return fail(EXIT_USAGE, &format!("--namespace: {error}"));
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
            Command::Status { id, remote: Some(remote), json } if id.is_none() => {
                cli::inspect::status_of_remote(&settings, remote, *json).await
            }
            Command::Status { id, json, .. } => cli::status(&settings, id.as_deref().unwrap_or_default(), *json).await,
            Command::Cancel { id, reason, before_arrival, json } => {
                cli::cancel(&settings, id, reason, *before_arrival, *json).await
            }
            Command::Uncancel { id, json } => cli::uncancel(&settings, id, *json).await,
            Command::Retry(args) => cli::retry::retry(&settings, args).await,
            Command::Tail(args) => cli::tail::tail(&settings, args).await,
            Command::Jobs(args) => cli::inspect::jobs(&settings, args).await,
            Command::Failed(args) => cli::failed::failed(&settings, args).await,
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
                // What `run` logs at start as warnings (a key file others can read), on stderr: the check passes.
                for warning in settings.warnings() {
                    eprintln!("batchd: warning: {warning}");
                }
                let text = settings.to_redacted_toml();
                if *json {
                    // The same redaction as the TOML: the JSON is made from it.
                    let value: toml::Value = toml::from_str(&text).context("read back the effective settings")?;
                    let value = serde_json::to_value(value).context("effective settings as JSON")?;
                    cli::print_json(&value)?;
                } else {
                    print!("{}{text}", settings.provider_summary());
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
                fail_keeping_lines(EXIT_CONFIG, &cli::error_text(&error))
            }
            None => fail(1, &cli::error_text(&error)),
        },
    }
}

async fn run_daemon(settings: Settings) -> anyhow::Result<()> {
    // The same checks as `batchd config check`, so what it passes `run` starts with, and what `run` refuses
    // exits 78 (a configuration error systemd does not restart) with the same one-line message.
    settings.check_for_run()?;
    batchd::logging::init(&settings.log).map_err(batchd::settings::ConfigError::keyed)?;
    for warning in settings.warnings() {
        tracing::warn!(warning = %warning, "unsafe setting");
    }
    let shutdown = CancellationToken::new();
    let signals = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("stop signal received");
        signals.cancel();
    });
    // Every provider's key, the Cloudflare token included, is read from the settings.
    batchd::run(settings, batchd::settings::Secret::new(""), shutdown).await
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

/// Prints a configuration error with its lines kept (a TOML syntax error shows the line and a caret under the
/// mistake), each line escaped for the terminal.
fn fail_keeping_lines(code: i32, message: &str) -> ExitCode {
    let lines: Vec<String> = message.lines().map(|line| cli::escape_for_terminal(line).into_owned()).collect();
    eprintln!("batchd: {}", lines.join("\n"));
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
