//! `batchd-emulator`: runs the Workers AI Batch API emulator (and, with `--events`, its events queue), with the
//! OpenAI (`/openai/v1`), Anthropic (`/anthropic`) and Gemini (`/gemini`) ones on the same address, until SIGTERM or
//! SIGINT.
//!
//! Prints `batchd-emulator listening on http://ADDR/client/v4` on stdout once bound; logs go to stderr.

use std::{io::Write, net::SocketAddr, time::Duration};

use anyhow::Context;
use batchd_emulator::{
    AnthropicConfig, DurationRange, Emulator, EmulatorConfig, EventBody, EventFaults, EventsConfig, GeminiConfig,
    OpenAiConfig, OpenAiLimits, OpenAiMount, OpenAiTiming, ProviderLimits, PullOrder, RandomFaults, RateLimit,
};
use clap::{Parser, ValueEnum};

/// Fake Cloudflare Workers AI Batch API for local tests. Its control API (/_emulator/) has no auth:
/// listen on loopback only.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8787")]
    listen: SocketAddr,
    /// API token callers must send as `Authorization: Bearer <token>`.
    #[arg(long, env = "EMULATOR_TOKEN", default_value = "emulator-token")]
    token: String,
    /// The account id the emulator accepts.
    #[arg(long, default_value = "emulator-account")]
    account_id: String,
    /// Milliseconds a batch stays queued.
    #[arg(long, default_value_t = 200)]
    queued_ms: u64,
    /// Milliseconds a batch then stays running.
    #[arg(long, default_value_t = 300)]
    running_ms: u64,
    /// Bodies of this many bytes or more get HTTP 413.
    #[arg(long, default_value_t = 10_000_000)]
    max_body_bytes: usize,
    /// Submits with more items than this get HTTP 413 (no cap when absent).
    #[arg(long)]
    max_items: Option<usize>,
    /// Calls allowed per account and model in any window of --rate-limit-per-ms; over it, HTTP 429
    /// (unlimited when absent).
    #[arg(long)]
    rate_limit_requests: Option<u32>,
    /// Length of the rate-limit window in milliseconds.
    #[arg(long, default_value_t = 60_000)]
    rate_limit_per_ms: u64,
    /// Make the rate limit a token bucket of this many calls, refilled at --rate-limit-requests per
    /// --rate-limit-per-ms (a sliding window when absent).
    #[arg(long, requires = "rate_limit_requests")]
    rate_limit_burst: Option<u32>,
    /// Count polls against the rate limit too (by default only submits).
    #[arg(long)]
    limit_polls: bool,
    /// The providers' creation and request limits: `documented` enforces OpenAI's 2,000 batch creates an hour
    /// (burst 1), Anthropic's 50 requests a minute (every call, burst 50) and Workers AI's 300 submits a minute per
    /// model (polls free); the flags of each limit override it.
    #[arg(long, value_enum, default_value_t = LimitsArg::Off)]
    provider_limits: LimitsArg,
    /// Every provider's remote batch takes this many milliseconds from create to results (overrides --queued-ms,
    /// --running-ms, --openai-*-ms, --anthropic-processing-ms and --gemini-*-ms; see
    /// `EmulatorConfig::with_batch_duration`).
    #[arg(long, value_name = "MS")]
    batch_duration_ms: Option<u64>,
    /// Milliseconds a finished batch can still be polled before it answers 404 (forever when absent).
    #[arg(long)]
    retention_ms: Option<u64>,
    /// HTTP status of an accepted submit (200 or 202).
    #[arg(long, default_value_t = 200)]
    submit_status: u16,
    /// Give every batch its own random duration of at least this many milliseconds (with --duration-max-ms;
    /// replaces --queued-ms/--running-ms).
    #[arg(long, requires = "duration_max_ms")]
    duration_min_ms: Option<u64>,
    /// Longest random batch duration in milliseconds.
    #[arg(long, requires = "duration_min_ms")]
    duration_max_ms: Option<u64>,
    /// Share of calls (0 to 1) that fail at random with HTTP 500, 502 (HTML), 503 or a connection reset.
    #[arg(long)]
    fault_rate: Option<f64>,
    /// Answer every handled call after a random delay of at least this many milliseconds (with
    /// --latency-max-ms).
    #[arg(long, requires = "latency_max_ms")]
    latency_min_ms: Option<u64>,
    /// Longest random reply delay in milliseconds.
    #[arg(long, requires = "latency_min_ms")]
    latency_max_ms: Option<u64>,
    /// Refuse a whole submit (HTTP 400, code 5006) when any of its items does not fit its model's schema, as
    /// the live API does; by default such an item fails alone.
    #[arg(long)]
    strict_items: bool,
    /// Complete every batch in the shape Cloudflare's docs show (`responses[]` keyed by `id`) instead of the one
    /// live replies have (`results[]` keyed by `index`).
    #[arg(long)]
    documented_shape: bool,
    /// A model that does not support request queuing: its queued submits get HTTP 400, code 8007 (repeatable).
    #[arg(long = "unbatchable-model", value_name = "MODEL")]
    unbatchable_models: Vec<String>,
    /// Publish Workers AI batch events (queued, succeeded, failed) to a queue served by the Queues pull consumer
    /// endpoints (.../queues/ID/messages/pull and /ack).
    #[arg(long)]
    events: bool,
    /// Id of the events queue.
    #[arg(long, default_value = batchd_emulator::DEFAULT_EVENTS_QUEUE, value_name = "ID")]
    events_queue: String,
    /// Token the queue endpoints accept instead of the API token (which they then refuse).
    #[arg(long, env = "EMULATOR_EVENTS_TOKEN", value_name = "TOKEN")]
    events_token: Option<String>,
    /// Write event request ids as `req-<id>`, like the docs' example.
    #[arg(long)]
    events_prefix_request_ids: bool,
    /// How a pulled message carries its event.
    #[arg(long, value_enum, default_value_t = BodyArg::Base64)]
    events_body: BodyArg,
    /// Redeliveries a message gets before it is dropped for good.
    #[arg(long, default_value_t = 3)]
    events_max_retries: u32,
    /// Pulls allowed per queue in any window of --events-pull-rate-limit-per-ms; over it, HTTP 429 (unlimited when
    /// absent).
    #[arg(long, value_name = "N")]
    events_pull_rate_limit: Option<u32>,
    /// Length of the pull rate-limit window in milliseconds.
    #[arg(long, default_value_t = 1000)]
    events_pull_rate_limit_per_ms: u64,
    /// Event fault: the first N events are never enqueued.
    #[arg(long, default_value_t = 0, value_name = "N")]
    event_drop_next: u32,
    /// Event fault: share of events (0 to 1) never enqueued.
    #[arg(long, default_value_t = 0.0, value_name = "RATE")]
    event_drop_rate: f64,
    /// Event fault: enqueue every event twice.
    #[arg(long)]
    event_duplicate: bool,
    /// Event fault: events enter the queue this many milliseconds after they happen.
    #[arg(long, default_value_t = 0, value_name = "MS")]
    event_delay_ms: u64,
    /// Event fault: the order in which pulls hand out messages.
    #[arg(long, value_enum, default_value_t = OrderArg::Fifo)]
    event_order: OrderArg,
    /// Seed of the random durations, faults and latency (and of the event faults' draws).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Key the Anthropic Message Batches emulator (under /anthropic) accepts as `x-api-key`.
    #[arg(long, env = "EMULATOR_ANTHROPIC_KEY", default_value = "emulator-anthropic-key")]
    anthropic_api_key: String,
    /// Milliseconds an Anthropic batch processes before it ends.
    #[arg(long, default_value_t = 300)]
    anthropic_processing_ms: u64,
    /// Key callers of the OpenAI emulator (under /openai/v1) must send as `Authorization: Bearer <key>`.
    #[arg(long, env = "EMULATOR_OPENAI_KEY", default_value = "emulator-openai-key")]
    openai_api_key: String,
    /// Milliseconds an OpenAI batch stays `validating`.
    #[arg(long, default_value_t = 50)]
    openai_validating_ms: u64,
    /// Milliseconds an OpenAI batch stays `in_progress` (its requests finish evenly over it).
    #[arg(long, default_value_t = 100)]
    openai_in_progress_ms: u64,
    /// Milliseconds an OpenAI batch stays `finalizing`.
    #[arg(long, default_value_t = 50)]
    openai_finalizing_ms: u64,
    /// Milliseconds an OpenAI batch stays `cancelling`.
    #[arg(long, default_value_t = 100)]
    openai_cancelling_ms: u64,
    /// Milliseconds after its create an unfinished OpenAI batch expires (24 h when absent).
    #[arg(long)]
    openai_completion_window_ms: Option<u64>,
    /// Largest OpenAI upload in bytes.
    #[arg(long, default_value_t = 200 * 1024 * 1024)]
    openai_max_file_bytes: u64,
    /// Keep input order in OpenAI result files (by default they are shuffled, as the API documents).
    #[arg(long)]
    openai_keep_order: bool,
    /// Mount the OpenAI module again as these vendors' APIs (comma-separated): `groq` under /groq/openai/v1 (key
    /// emulator-groq-key, windows 24h to 7d), `azure` under /azure/openai/v1 (key emulator-azure-key in `api-key`,
    /// model = deployment `gpt-4o-mini-batch`), `novita` under /novita/openai/v1 (key emulator-novita-key, 48h,
    /// upper-case statuses).
    #[arg(long, value_delimiter = ',')]
    openai_mounts: Vec<MountArg>,
    /// Key callers of the Gemini emulator (under /gemini) must send as `x-goog-api-key` or `?key=`.
    #[arg(long, env = "EMULATOR_GEMINI_KEY", default_value = "emulator-gemini-key")]
    gemini_api_key: String,
    /// Milliseconds a Gemini batch stays `PENDING`.
    #[arg(long, default_value_t = 100)]
    gemini_pending_ms: u64,
    /// Milliseconds a Gemini batch then stays `RUNNING` before it ends.
    #[arg(long, default_value_t = 200)]
    gemini_running_ms: u64,
    /// OpenAI batch creates allowed per --openai-create-limit-per-ms; over it, HTTP 429 `rate_limit_exceeded`.
    #[arg(long, value_name = "N")]
    openai_create_limit: Option<u32>,
    /// The window (or refill period) of --openai-create-limit, in milliseconds.
    #[arg(long, default_value_t = 3_600_000, value_name = "MS")]
    openai_create_limit_per_ms: u64,
    /// Make --openai-create-limit a token bucket of this many creates (a sliding window when absent).
    #[arg(long, requires = "openai_create_limit", value_name = "N")]
    openai_create_burst: Option<u32>,
    /// Anthropic calls of any kind allowed per --anthropic-rate-limit-per-ms; over it, HTTP 429
    /// `rate_limit_error`.
    #[arg(long, value_name = "N")]
    anthropic_rate_limit: Option<u32>,
    /// The window (or refill period) of --anthropic-rate-limit, in milliseconds.
    #[arg(long, default_value_t = 60_000, value_name = "MS")]
    anthropic_rate_limit_per_ms: u64,
    /// Make --anthropic-rate-limit a token bucket of this many calls (a sliding window when absent).
    #[arg(long, requires = "anthropic_rate_limit", value_name = "N")]
    anthropic_rate_limit_burst: Option<u32>,
}

/// `--provider-limits`.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum LimitsArg {
    /// No creation or request limits.
    Off,
    /// The documented ones (see `ProviderLimits::Documented`).
    Documented,
}

/// A rate limit from a flag's count, window and optional burst.
fn rate_limit(requests: u32, per_ms: u64, burst: Option<u32>) -> RateLimit {
    let limit = RateLimit::new(requests, Duration::from_millis(per_ms));
    match burst {
        Some(burst) => limit.burst(burst),
        None => limit,
    }
}

/// `--events-body`.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum BodyArg {
    /// Base64 of the event JSON, content type `json`.
    Base64,
    /// The event JSON as plain text, content type `json` (the docs' sample).
    PlainJson,
    /// The event JSON as plain text, content type `text`.
    Text,
}

/// `--event-order`.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum OrderArg {
    /// Oldest first.
    Fifo,
    /// Newest first.
    Reverse,
    /// Shuffled (seeded).
    Random,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let mut config = EmulatorConfig {
        token: args.token,
        account_id: args.account_id,
        queued_for: Duration::from_millis(args.queued_ms),
        running_for: Duration::from_millis(args.running_ms),
        max_body_bytes: args.max_body_bytes,
        max_items: args.max_items,
        rate_limit: None,
        limit_polls: false,
        retention: args.retention_ms.map(Duration::from_millis),
        submit_status: args.submit_status,
        extra_models: Vec::new(),
        random_durations: args
            .duration_min_ms
            .zip(args.duration_max_ms)
            .map(|(min, max)| DurationRange::new(Duration::from_millis(min), Duration::from_millis(max))),
        random_faults: args.fault_rate.map(RandomFaults::new),
        random_latency: args
            .latency_min_ms
            .zip(args.latency_max_ms)
            .map(|(min, max)| DurationRange::new(Duration::from_millis(min), Duration::from_millis(max))),
        strict_items: args.strict_items,
        strict_refusal: batchd_emulator::RefusalForm::default(),
        documented_shape: args.documented_shape,
        unbatchable_models: args.unbatchable_models,
        events: args.events.then(|| EventsConfig {
            queue_id: args.events_queue,
            queue_token: args.events_token,
            prefix_request_ids: args.events_prefix_request_ids,
            body: match args.events_body {
                BodyArg::Base64 => EventBody::Base64,
                BodyArg::PlainJson => EventBody::PlainJson,
                BodyArg::Text => EventBody::Text,
            },
            max_retries: Some(args.events_max_retries),
            pull_rate_limit: args
                .events_pull_rate_limit
                .map(|requests| RateLimit::new(requests, Duration::from_millis(args.events_pull_rate_limit_per_ms))),
            ..EventsConfig::default()
        }),
        event_faults: EventFaults {
            drop_next: args.event_drop_next,
            drop_rate: args.event_drop_rate,
            duplicate: args.event_duplicate,
            delay: Duration::from_millis(args.event_delay_ms),
            order: match args.event_order {
                OrderArg::Fifo => PullOrder::Fifo,
                OrderArg::Reverse => PullOrder::Reverse,
                OrderArg::Random => PullOrder::Random,
            },
        },
        seed: args.seed,
        anthropic: AnthropicConfig {
            api_key: args.anthropic_api_key,
            processing_for: Duration::from_millis(args.anthropic_processing_ms),
            ..AnthropicConfig::default()
        },
        openai: OpenAiConfig {
            api_key: args.openai_api_key,
            timing: OpenAiTiming {
                validating_for: Duration::from_millis(args.openai_validating_ms),
                in_progress_for: Duration::from_millis(args.openai_in_progress_ms),
                finalizing_for: Duration::from_millis(args.openai_finalizing_ms),
                cancelling_for: Duration::from_millis(args.openai_cancelling_ms),
                completion_window: args
                    .openai_completion_window_ms
                    .map_or(OpenAiTiming::default().completion_window, Duration::from_millis),
            },
            limits: OpenAiLimits { max_file_bytes: args.openai_max_file_bytes, ..OpenAiLimits::default() },
            shuffle: !args.openai_keep_order,
            create_limit: None,
            ..OpenAiConfig::default()
        },
        openai_mounts: args
            .openai_mounts
            .iter()
            .map(|mount| match mount {
                MountArg::Groq => OpenAiMount::groq(),
                MountArg::Azure => OpenAiMount::azure(),
                MountArg::Novita => OpenAiMount::novita(),
            })
            .collect(),
        gemini: GeminiConfig {
            api_key: args.gemini_api_key,
            pending_for: Duration::from_millis(args.gemini_pending_ms),
            running_for: Duration::from_millis(args.gemini_running_ms),
            ..GeminiConfig::default()
        },
    };
    config = config.with_provider_limits(match args.provider_limits {
        LimitsArg::Off => ProviderLimits::Off,
        LimitsArg::Documented => ProviderLimits::Documented,
    });
    config.limit_polls = args.limit_polls;
    if let Some(requests) = args.rate_limit_requests {
        config.rate_limit = Some(rate_limit(requests, args.rate_limit_per_ms, args.rate_limit_burst));
    }
    if let Some(requests) = args.openai_create_limit {
        config.openai.create_limit =
            Some(rate_limit(requests, args.openai_create_limit_per_ms, args.openai_create_burst));
    }
    if let Some(requests) = args.anthropic_rate_limit {
        config.anthropic.rate_limit =
            Some(rate_limit(requests, args.anthropic_rate_limit_per_ms, args.anthropic_rate_limit_burst));
    }
    if let Some(ms) = args.batch_duration_ms {
        config = config.with_batch_duration(Duration::from_millis(ms));
    }
    let shutdown = shutdown_signal().context("install signal handlers")?;
    let handle = Emulator::start(config, args.listen).await.with_context(|| format!("listen on {}", args.listen))?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "batchd-emulator listening on {}", handle.base_url()).context("write to stdout")?;
    stdout.flush().context("flush stdout")?;
    drop(stdout);

    shutdown.await;
    tracing::info!("shutdown signal received");
    handle.shutdown().await;
    Ok(())
}

/// Installs the SIGTERM and SIGINT handlers now, and resolves on the first of them.
///
/// Installing before the "listening" line is printed means a caller may signal as soon as it reads that line.
#[cfg(unix)]
fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}

/// Resolves on Ctrl-C.
#[cfg(not(unix))]
fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

/// A vendor-shaped mount of the OpenAI module (`--openai-mounts`).
#[derive(Debug, Clone, Copy, ValueEnum)]
enum MountArg {
    /// Groq's batch API ([`OpenAiMount::groq`]).
    Groq,
    /// Azure OpenAI's global batch ([`OpenAiMount::azure`]).
    Azure,
    /// Novita's batch API ([`OpenAiMount::novita`]).
    Novita,
}
