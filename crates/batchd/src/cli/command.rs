//! The command line as clap reads it: `Cli`, every command and its options. In the library (not in `main.rs`) so
//! tests parse with the real definition: every `batchd ...` command shown in docs/ is checked to parse
//! (`tests/it/cli_docs.rs`).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use super::dead::DeadCommand;
use super::failed::FailedArgs;
use super::inspect::{JobsArgs, StatsArgs};
use super::pause::{PauseArgs, ResumeArgs};
use super::probe::ProbeArgs;
use super::retry::RetryArgs;
use super::tail::TailArgs;
use super::workers::WorkersArgs;
use super::{EXIT_CODES_HELP, SubmitArgs};

/// Run batch inference jobs from Redis at four providers, chosen by the model name: Cloudflare Workers AI
/// (`@cf/...`), OpenAI (`openai/...`), Anthropic (`anthropic/...`) and Gemini (`gemini/...`). Producers XADD jobs,
/// batchd submits and polls them and publishes one result entry per job to a results stream.
#[derive(Debug, Parser)]
#[command(name = "batchd", version, after_help = EXIT_CODES_HELP, max_term_width = 100)]
pub struct Cli {
    /// Configuration file (TOML) layered over the built-in defaults; see config/default.toml for every key.
    #[arg(
        long,
        short = 'c',
        global = true,
        env = "BATCHD_CONFIG",
        value_name = "FILE",
        help_heading = "Global options"
    )]
    pub config: Option<PathBuf>,
    /// Key namespace (overrides redis.namespace).
    #[arg(long, short = 'n', global = true, value_name = "NAME", help_heading = "Global options")]
    pub namespace: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
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
        #[arg(required_unless_present = "remote")]
        id: Option<String>,
        /// Find the job by the id of one of its remote batches instead (a provider's batch id, as its console shows
        /// it; a pack's batch finds the pack): through the events index, else by reading up to 100,000 ledgers.
        #[arg(long, value_name = "BATCH_ID", conflicts_with = "id")]
        remote: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a job: the daemon publishes a `cancelled` result with the batches that had finished.
    #[command(
        after_help = "What becomes of batches already submitted depends on the provider. OpenAI and Anthropic: each
running batch is cancelled remotely, and the result (published once they have ended, within the job's
deadline) holds the responses they finished. Cloudflare has no cancel: its batches keep
running remotely (and may be billed); their results are discarded. A job not taken in yet is never
submitted; a finished job is not changed."
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
    /// Re-enqueue jobs that ended failed, expired or cancelled, chosen by id or by status, model, error code and
    /// time, as new jobs (`<id>.retry-1`).
    #[command(
        after_help = "`batchd retry inv-42 inv-43` retries those jobs (as `batchd failed` lists them). With filters
instead, it finds jobs in the results stream (XRANGE by time, in pages: bounded work). Either way it
rebuilds each job from its ledger and enqueues it under a derived id: a finished job's id stays taken while its ledger
lives (retention.ledger_ttl_secs), so `inv-42` is retried as `inv-42.retry-1`, and that one as
`inv-42.retry-2`. A job whose retry exists already is skipped, so running retry twice enqueues
nothing twice. Exit codes: 0 done (or --dry-run), 1 a job could not be retried (not finished, or
completed; its ledger or its request items are gone)."
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
    /// List the jobs that ended without completing (failed, expired, cancelled), grouped by error code and model,
    /// with counts and the newest examples.
    #[command(
        after_help = "Walks the ledgers with SCAN (O(number of ledgers), at most --max-scanned): an operator's tool, not
something to poll. These are jobs that ran (or were refused) and ended with an error; entries that
could not be read as a job at all are dead letters (`batchd dead list`). Run failed jobs again with
`batchd retry <job id>...` or `batchd retry --code <code> --model <model>`."
    )]
    Failed(FailedArgs),
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
    /// Manage the dead-letter stream: entries that could not be read as a job (jobs that ran and failed are
    /// listed by `batchd failed`).
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
        command: super::events::EventsCommand,
    },
    /// List the providers (model names, capabilities, whether configured) and the Workers AI models that take
    /// batch requests, with their task, rate-limit bucket and limit.
    Models(super::models::ModelsArgs),
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
    Ui(crate::ui::UiArgs),
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
pub enum ConfigCommand {
    /// Load the configuration exactly as `run` would (file, environment, token, TLS files) and print the effective
    /// settings with secrets redacted; exit 78 naming the bad key on error. Does not connect to anything.
    Check {
        /// Print the effective settings as JSON instead of TOML.
        #[arg(long)]
        json: bool,
    },
}
