//! `batchd run`: wires storage, the API client and two apalis workers together, and runs them until shutdown.
//!
//! The workers are run one task each (not under apalis's `Monitor`, which reports success even when a worker
//! died): a worker that ends before shutdown was requested makes `run` return an error, so the process exits
//! non-zero and its supervisor restarts it. On shutdown the fetchers stop reading at once, in-flight work gets
//! `shutdown.grace_secs` to finish, and unstarted work is handed back to Redis.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use apalis::layers::WorkerBuilderExt;
use apalis_core::worker::builder::WorkerBuilder;
use batchd_cloudflare::{ApiToken, BatchClient, ClientSettings};
use batchd_queue::{IngressSettings, ScheduleSettings, Store};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::pipeline::{handle_due, handle_entry, Pipeline};
use crate::settings::{Secret, Settings};

/// Runs the daemon until `shutdown` is cancelled (then drains within the grace period and returns `Ok`), or
/// until a worker stops on its own (returns an error).
pub async fn run(settings: Settings, token: Secret, shutdown: CancellationToken) -> anyhow::Result<()> {
    let keys = settings.keys();
    let redis_client = settings.redis_client()?;
    let conn = batchd_queue::connect(redis_client.clone(), Duration::from_secs(settings.redis.response_timeout_secs))
        .context("redis.url")?;
    let store = Store::new(conn, keys.clone(), settings.store_settings());
    let mut client_settings = ClientSettings::new(settings.cloudflare.account_id.clone(), ApiToken::new(token.expose().to_owned()));
    client_settings.base_url = settings.cloudflare.base_url.clone();
    client_settings.request_timeout = Duration::from_secs(settings.cloudflare.request_timeout_secs);
    client_settings.connect_timeout = Duration::from_secs(settings.cloudflare.connect_timeout_secs);
    let client = BatchClient::new(client_settings).context("cloudflare settings")?;

    let pipeline = Arc::new(Pipeline {
        store: store.clone(),
        client,
        poll: settings.poll.clone(),
        retry: settings.retry.clone(),
        limits: settings.job_limits(),
        default_deadline: Duration::from_secs(settings.jobs.default_deadline_secs),
        lease: Duration::from_secs(settings.schedule.lease_secs),
    });

    let consumer = consumer_name();
    let fetch_stop = shutdown.child_token();
    let ingress = batchd_queue::ingress::backend(
        redis_client,
        keys.clone(),
        IngressSettings {
            consumer: consumer.clone(),
            batch: settings.ingress.batch,
            block: Duration::from_millis(settings.ingress.block_ms),
            reclaim_idle: Duration::from_secs(settings.ingress.reclaim_idle_secs),
            reclaim_interval: Duration::from_secs(settings.ingress.reclaim_interval_secs),
        },
        fetch_stop.clone(),
    );
    let schedule = batchd_queue::schedule::backend(
        store,
        ScheduleSettings {
            batch: settings.schedule.batch,
            idle_poll: Duration::from_millis(settings.schedule.idle_poll_ms),
        },
        fetch_stop.clone(),
    );

    let stop_signal = |token: CancellationToken| async move {
        token.cancelled().await;
        Ok::<(), std::io::Error>(())
    };
    let submit_worker = WorkerBuilder::new(format!("submit@{consumer}"))
        .backend(ingress)
        .data(Arc::clone(&pipeline))
        .concurrency(settings.workers.submit_concurrency)
        .build(handle_entry);
    let poll_worker = WorkerBuilder::new(format!("schedule@{consumer}"))
        .backend(schedule)
        .data(Arc::clone(&pipeline))
        .concurrency(settings.workers.poll_concurrency)
        .build(handle_due);

    let mut workers = JoinSet::new();
    let stop = shutdown.clone();
    workers.spawn(async move { ("submit", submit_worker.run_until(stop_signal(stop)).await) });
    let stop = shutdown.clone();
    workers.spawn(async move { ("schedule", poll_worker.run_until(stop_signal(stop)).await) });
    tracing::info!(
        consumer = %consumer,
        namespace = %keys.namespace(),
        submit_concurrency = settings.workers.submit_concurrency,
        poll_concurrency = settings.workers.poll_concurrency,
        "batchd running"
    );

    // Biased: workers also end on the stop signal, and that must read as a shutdown, not as a worker dying.
    tokio::select! {
        biased;
        () = shutdown.cancelled() => {}
        finished = workers.join_next() => {
            let detail = match finished {
                Some(Ok((name, Ok(())))) => format!("{name} worker stopped"),
                Some(Ok((name, Err(error)))) => format!("{name} worker failed: {error}"),
                Some(Err(error)) => format!("a worker task panicked: {error}"),
                None => "no workers".to_owned(),
            };
            shutdown.cancel();
            drain(&mut workers, Duration::from_secs(settings.shutdown.grace_secs)).await;
            bail!("{detail} before shutdown was requested");
        }
    }
    tracing::info!(grace_secs = settings.shutdown.grace_secs, "shutting down: no new work taken, finishing work in flight");
    drain(&mut workers, Duration::from_secs(settings.shutdown.grace_secs)).await;
    tracing::info!("batchd stopped");
    Ok(())
}

/// Waits for the workers to finish their in-flight work, up to `grace`; then abandons what is left (it is
/// resumed from Redis by the next replica, after its lease or idle timeout).
async fn drain(workers: &mut JoinSet<(&'static str, Result<(), apalis_core::error::WorkerError>)>, grace: Duration) {
    let finished = tokio::time::timeout(grace, async {
        while let Some(result) = workers.join_next().await {
            match result {
                Ok((name, Ok(()))) => tracing::debug!(worker = name, "worker finished"),
                Ok((name, Err(error))) => tracing::warn!(worker = name, error = %error, "worker ended with an error"),
                Err(error) => tracing::warn!(error = %error, "worker task failed"),
            }
        }
    })
    .await;
    if finished.is_err() {
        tracing::warn!(
            grace = ?grace,
            "grace period over; abandoning work in flight (it resumes after its lease on another replica)"
        );
        workers.abort_all();
    }
}

/// A consumer name unique to this process start: `<host>-<pid>-<random>`. Uniqueness matters only for
/// reading; recovery of a dead replica's entries works by idle time, whatever the names.
fn consumer_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|name| !name.is_empty())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|name| name.trim().to_owned()))
        .unwrap_or_else(|| "batchd".to_owned());
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}-{}", std::process::id(), &random[..8])
}
