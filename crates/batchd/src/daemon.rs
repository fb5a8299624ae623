//! `batchd run`: wires storage, the configured providers (each kind's built-in instance whose settings are given,
//! and the named instances `[providers.<name>]`, as the registry builds them, `registry.rs`; at least one) with
//! their background tasks, and two apalis workers per namespace together,
//! and runs them until shutdown.
//!
//! The workers are run one task each (not under apalis's `Monitor`, which reports success even when a worker
//! died): a worker that ends before shutdown was requested makes `run` return an error, so the process exits
//! non-zero and its supervisor restarts it. On shutdown the fetchers stop reading at once, in-flight work gets
//! `shutdown.grace_secs` to finish, and unstarted work is handed back to Redis.
//!
//! Around the workers run the admin server (`admin.listen`: `/livez`, `/readyz`, `/metrics`), the Redis sampler
//! (queue-depth gauges and readiness) and, under systemd, the watchdog pings; systemd hears `READY=1` once the
//! workers run and `STOPPING=1` when the drain begins.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use apalis::layers::WorkerBuilderExt;
use apalis_core::worker::builder::WorkerBuilder;
use batchd_cloudflare::{CloudflareProvider, QueueClient, SubscriptionClient};
use batchd_engine::providers::Providers;
use batchd_provider::{BuildContext, Provider, ReplyBudget, ReplyHold};
use batchd_queue::Store;
use futures::future::BoxFuture;

use batchd_engine::runtime::{ByteBudget, DeliveryLimit, EntryBudget, IngressSettings, ScheduleSettings};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::admin::{self, Health};
use crate::registry::{Instance, TaskContext};
use crate::settings::{Secret, Settings};
use batchd_engine::pipeline::{Pipeline, SplitSettings, handle_due, handle_entry};

/// Bytes per request item that taking a job in builds besides the entry (a view of the item and its size, 24
/// bytes, rounded up); measured in `tests/it/memory.rs`.
const ITEM_BYTES: usize = 32;

/// Room a poll holds per byte of its reply: the reply, what is read from it (the items' results), and the result
/// or chunk output written from that to Redis.
use batchd_provider::REPLY_COPIES;

/// Longest wait for the model catalog at start, before jobs are taken in.
const CATALOG_AT_START: Duration = Duration::from_secs(10);

/// How long the admin server, the sampler and the watchdog get to stop once the workers are done.
const BACKGROUND_STOP: Duration = Duration::from_secs(2);

/// Runs the daemon until `shutdown` is cancelled (then drains within the grace period and returns `Ok`), or
/// until a worker stops on its own (returns an error). `token` is the Cloudflare API token when the settings
/// configure Cloudflare without one (an embedder's; `batchd run` finds it in the settings and passes an empty
/// one).
pub async fn run(settings: Settings, token: Secret, shutdown: CancellationToken) -> anyhow::Result<()> {
    run_with_providers(settings, token, Vec::new(), shutdown).await
}

/// [`run`], with providers of the embedder's own beside the configured ones (routed by their names; one with a
/// configured provider's name replaces it). Tests use it to drive the real pipeline through a test provider.
pub async fn run_with_providers(
    mut settings: Settings,
    token: Secret,
    extra: Vec<Arc<dyn Provider>>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let given = |token: &Option<Secret>| token.as_ref().is_some_and(|token| !token.expose().is_empty());
    if !settings.cloudflare.account_id.trim().is_empty() && !given(&settings.cloudflare.api_token) {
        settings.cloudflare.api_token = Some(token).filter(|token| !token.expose().is_empty());
    }
    let recorder = batchd_engine::metrics::install().map_err(anyhow::Error::msg)?;
    let health = Arc::new(Health::default());
    // The admin port first: one that is taken fails the start at once, before any work is taken.
    let admin_listener = match settings.admin.listen_addr() {
        Some(addr) => Some(admin::bind(addr).await.with_context(|| format!("admin.listen: cannot listen on {addr}"))?),
        None => None,
    };
    let namespaces = settings.all_keys();
    let endpoint = settings.redis_endpoint()?;
    let sampler_conn = endpoint.dedicated(Duration::from_secs(5));
    let conn = endpoint.shared().context("redis")?;
    // One memory budget for the process, shared by every namespace (docs/operations.md, "Memory and threads").
    let budget = ByteBudget::new(settings.workers.inflight_bytes);
    let context = BuildContext {
        lease: Duration::from_secs(settings.schedule.lease_secs),
        inflight_bytes: settings.workers.inflight_bytes,
        reply_budget: Some(reply_budget(&budget)),
    };
    let mut providers = Providers::new().with_kinds(crate::registry::kinds());
    let mut starts = Vec::new();
    crate::registry::remember_instances(&settings);
    for (entry, instance) in crate::registry::instances(&settings) {
        if let Some(built) = entry.build(&settings, instance, &context)? {
            let kind = entry.kind();
            match instance {
                Instance::BuiltIn => {
                    tracing::info!(provider = kind.name, models = %kind.models.join(", "), "{} configured", kind.title);
                }
                Instance::Named { name, .. } => {
                    tracing::info!(provider = name, kind = kind.name, models = %format!("{name}/<model>"), "named {} instance configured", kind.title);
                }
            }
            providers = providers.with(built.provider);
            starts.push(built.tasks);
        }
    }
    let providers = extra
        .into_iter()
        .fold(providers, |providers, extra| providers.with(extra))
        .with_call_cap(settings.workers.calls_per_provider);
    if providers.names().next().is_none() {
        return Err(crate::registry::none_configured().into());
    }
    batchd_engine::metrics::providers_configured(providers.names());

    // Stopped last, after the drain, so probes and scrapes are answered while work in flight finishes.
    let background_stop = CancellationToken::new();
    let _stop_background_on_return = background_stop.clone().drop_guard();
    let mut background: Vec<JoinHandle<()>> = Vec::new();
    if let Some(listener) = admin_listener {
        let router = admin::router(Arc::clone(&health), recorder.clone(), settings.admin.hosts());
        let stop = background_stop.clone();
        background.push(tokio::spawn(async move {
            if let Err(error) = admin::serve(listener, router, stop).await {
                tracing::error!(error = %error, "admin server failed");
            }
        }));
    }
    background.push(tokio::spawn(admin::run_sampler(
        sampler_conn,
        namespaces.clone(),
        settings.admin.sample_interval(),
        Arc::clone(&health),
        recorder,
        background_stop.clone(),
    )));
    {
        // The process metrics (RSS, CPU, open fds) are read on the sampler's rhythm.
        let (interval, stop) = (settings.admin.sample_interval(), background_stop.clone());
        background.push(tokio::spawn(async move {
            loop {
                batchd_engine::metrics::collect_process();
                tokio::select! {
                    () = tokio::time::sleep(interval) => {}
                    () = stop.cancelled() => break,
                }
            }
        }));
    }
    if let Some(interval) = admin::watchdog_interval() {
        background.push(tokio::spawn(admin::run_watchdog(interval, Arc::clone(&health), background_stop.clone())));
    }

    // Operators and producers call batchd's Redis functions (cancel, dead-letter retry) by name; a daemon that
    // cannot load them still runs (they may be loaded already, or the administrator loads them).
    if let Err(error) = batchd_queue::functions::load(&mut conn.clone()).await {
        tracing::warn!(error = %error, library = batchd_queue::functions::library_name(), "could not load batchd's Redis functions; `batchd cancel` and dead-letter retries need them (docs/security.md)");
    }
    let consumer = consumer_name();
    let fetch_stop = shutdown.child_token();
    let stores: Vec<Store> = namespaces
        .iter()
        .map(|keys| {
            Store::new(conn.clone(), keys.clone(), settings.store_settings())
                .with_dead_entry_bytes(settings.retention.dead_entry_bytes)
        })
        .collect();
    // Each provider's background tasks start before any job is taken in (Workers AI reads its model catalog
    // first, so the first jobs are checked against it).
    for tasks in starts {
        tasks
            .start(TaskContext {
                settings: &settings,
                stores: &stores,
                background: &mut background,
                background_stop: &background_stop,
                fetch_stop: &fetch_stop,
            })
            .await?;
    }
    let mut workers = JoinSet::new();
    for store in &stores {
        let pipeline = Arc::new(Pipeline {
            store: store.clone(),
            providers: providers.clone(),
            poll: settings.poll.clone(),
            retry: settings.retry.clone(),
            split: SplitSettings {
                retry_failed_items: settings.jobs.retry_failed_items,
                resend_expired_items: settings.jobs.resend_expired_items,
            },
            limits: settings.job_limits(),
            default_deadline: Some(settings.jobs.default_deadline_secs)
                .filter(|secs| *secs > 0)
                .map(Duration::from_secs),
            deadline_settle: Duration::from_secs(settings.jobs.deadline_settle_secs),
            cancel_wait: Duration::from_secs(settings.workers.cancel_wait_secs),
            lease: Duration::from_secs(settings.schedule.lease_secs),
            events: settings.events.enabled(),
            budget: budget.clone(),
            packing: settings.packing.clone(),
            pricing: settings.pricing.table(),
            spend: batchd_engine::spend::DailyBudget::new(settings.budget.for_namespace(store.keys().namespace())),
        });
        // Always: jobs queued while packing was on still get their packs after it is turned off.
        background.push(tokio::spawn(Arc::clone(&pipeline).run_packer(fetch_stop.clone())));
        spawn_workers(&mut workers, &settings, &endpoint, pipeline, &consumer, &fetch_stop, &shutdown, &health);
    }
    health.workers_running();
    admin::notify_ready();
    let names: Vec<&str> = namespaces.iter().map(|keys| keys.namespace()).collect();
    tracing::info!(
        consumer = %consumer,
        namespaces = %names.join(","),
        submit_concurrency = settings.workers.submit_concurrency,
        poll_concurrency = settings.workers.poll_concurrency,
        inflight_bytes = settings.workers.inflight_bytes,
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
            health.worker_failed();
            admin::notify_stopping();
            shutdown.cancel();
            drain(&mut workers, Duration::from_secs(settings.shutdown.grace_secs)).await;
            stop_background(background_stop, background).await;
            bail!("{detail} before shutdown was requested");
        }
    }
    health.draining();
    admin::notify_stopping();
    tracing::info!(
        grace_secs = settings.shutdown.grace_secs,
        "shutting down: no new work taken, finishing work in flight"
    );
    drain(&mut workers, Duration::from_secs(settings.shutdown.grace_secs)).await;
    stop_background(background_stop, background).await;
    // A replica that stopped cleanly holding nothing leaves the ingress group, so it is no longer listed.
    for store in &stores {
        match batchd_queue::ingress::remove_stopped_consumer(&mut store.connection(), store.keys(), &consumer).await {
            Ok(removed) => tracing::debug!(consumer = %consumer, removed, "own consumer at stop"),
            Err(error) => {
                tracing::warn!(consumer = %consumer, error = %error, "could not remove this replica's consumer")
            }
        }
    }
    tracing::info!("batchd stopped");
    Ok(())
}

/// Workers AI's background tasks (its registry line's): the model catalog's upkeep, read once (or taken from
/// Redis) before any job is taken in (a slow or failing catalog only delays the start by its timeout; the
/// `[rate_limits]` tables apply meanwhile) then kept fresh, and with `[events]` the events queue's consumer.
pub fn cloudflare_tasks(
    provider: Arc<CloudflareProvider>,
    context: TaskContext<'_>,
) -> BoxFuture<'_, anyhow::Result<()>> {
    Box::pin(async move {
        let TaskContext { settings, stores, background, background_stop, fetch_stop } = context;
        batchd_engine::metrics::known_models(settings.rate_limits.task_types.iter().map(|entry| entry.model.as_str()));
        let events_token = if settings.events.enabled() {
            Some(match settings.events_token()? {
                Some(token) => token,
                None => settings.api_token()?,
            })
        } else {
            None
        };
        let upkeep = batchd_engine::catalog::CloudflareUpkeep {
            provider,
            account_id: settings.cloudflare.account_id.clone(),
            store: stores[0].clone(),
            refresh: Some(Duration::from_secs(settings.cloudflare.catalog_refresh_secs))
                .filter(|refresh| !refresh.is_zero()),
            subscriptions: match &events_token {
                Some(events_token) => Some(
                    SubscriptionClient::new(settings.client_settings(events_token), &settings.events.queue_id)
                        .context("events settings")?,
                ),
                None => None,
            },
        };
        if tokio::time::timeout(CATALOG_AT_START, upkeep.load_catalog()).await.is_err() {
            tracing::warn!(timeout = ?CATALOG_AT_START, "the model catalog did not load in time; the [rate_limits] tables apply until it does");
        }
        background.push(tokio::spawn(upkeep.run(background_stop.clone())));
        if let Some(events_token) = events_token {
            let mut queue_settings = settings.client_settings(&events_token);
            // A pull brings at most 100 small event messages.
            queue_settings.max_reply_bytes = 16 * 1024 * 1024;
            let queue = QueueClient::new(queue_settings, &settings.events.queue_id).context("events settings")?;
            background.push(tokio::spawn(batchd_engine::events::run_puller(
                queue,
                stores.to_vec(),
                settings.event_pull(),
                Duration::from_millis(settings.poll.initial_interval_ms),
                fetch_stop.clone(),
            )));
        }
        Ok(())
    })
}

/// Counts a provider's poll replies and results downloads against the process's memory budget: the bytes, the
/// responses read from them and the output built from those ([`REPLY_COPIES`] times the bytes).
fn reply_budget(budget: &ByteBudget) -> ReplyBudget {
    let (hold, try_hold) = (budget.clone(), budget.clone());
    ReplyBudget::new(
        move |bytes: usize| {
            let budget = hold.clone();
            async move { Box::new(budget.hold(bytes.saturating_mul(REPLY_COPIES)).await) as ReplyHold }
        },
        move |bytes: usize| {
            try_hold.try_hold(bytes.saturating_mul(REPLY_COPIES)).map(|room| Box::new(room) as ReplyHold)
        },
    )
    // One reply is given the whole budget at most, and keeps it to its end.
    .with_capacity(budget.total_bytes() / REPLY_COPIES)
}

/// The result of one worker task: its name and how it ended.
type WorkerExit = (String, Result<(), apalis_core::error::WorkerError>);

/// Starts the two apalis workers of one namespace: the submit worker on the ingress stream and the schedule
/// worker on the schedule, each fed by its fetcher.
#[allow(clippy::too_many_arguments)]
fn spawn_workers(
    workers: &mut JoinSet<WorkerExit>,
    settings: &Settings,
    endpoint: &batchd_queue::Endpoint,
    pipeline: Arc<Pipeline>,
    consumer: &str,
    fetch_stop: &CancellationToken,
    shutdown: &CancellationToken,
    health: &Health,
) {
    let keys = pipeline.store.keys().clone();
    let namespace = keys.namespace().to_owned();
    // An entry whose take-in keeps failing (or crashing the replica) ends in the dead-letter stream.
    let limit = DeliveryLimit { max_deliveries: settings.ingress.max_deliveries, pipeline: Arc::clone(&pipeline) };
    // Reads are bounded by bytes; each entry holds room for what taking it in builds until its handler is done.
    let (max_entry_bytes, max_items) = (settings.jobs.max_entry_bytes, settings.jobs.max_items);
    let budget = EntryBudget {
        budget: pipeline.budget.clone(),
        max_entry_bytes,
        charge: Arc::new(move |fields: &[(String, Vec<u8>)]| entry_charge(fields, max_entry_bytes, max_items)),
    };
    let ingress = batchd_engine::runtime::ingress::backend_with_limits(
        endpoint.clone(),
        keys,
        IngressSettings {
            consumer: consumer.to_owned(),
            batch: settings.ingress.batch,
            block: Duration::from_millis(settings.ingress.block_ms),
            reclaim_idle: Duration::from_secs(settings.ingress.reclaim_idle_secs),
            reclaim_interval: Duration::from_secs(settings.ingress.reclaim_interval_secs),
        },
        Some(limit),
        Some(budget),
        fetch_stop.clone(),
    );
    let schedule = batchd_engine::runtime::schedule::backend(
        pipeline.store.clone(),
        ScheduleSettings {
            batch: settings.schedule.batch,
            idle_poll: Duration::from_millis(settings.schedule.idle_poll_ms),
        },
        fetch_stop.clone(),
    );
    health.watch(format!("ingress:{namespace}"), ingress.heartbeat(), settings.admin.stall());
    health.watch(format!("schedule:{namespace}"), schedule.heartbeat(), settings.admin.stall());
    let submit_worker = WorkerBuilder::new(format!("submit:{namespace}@{consumer}"))
        .backend(ingress)
        .data(Arc::clone(&pipeline))
        .concurrency(settings.workers.submit_concurrency)
        .build(handle_entry);
    let poll_worker = WorkerBuilder::new(format!("schedule:{namespace}@{consumer}"))
        .backend(schedule)
        .data(pipeline)
        .concurrency(settings.workers.poll_concurrency)
        .build(handle_due);
    let stop_signal = |token: CancellationToken| async move {
        token.cancelled().await;
        Ok::<(), std::io::Error>(())
    };
    let (stop, name) = (shutdown.clone(), format!("submit:{namespace}"));
    workers.spawn(async move { (name, submit_worker.run_until(stop_signal(stop)).await) });
    let (stop, name) = (shutdown.clone(), format!("schedule:{namespace}"));
    workers.spawn(async move { (name, poll_worker.run_until(stop_signal(stop)).await) });
}

/// The room an ingress entry holds while it is taken in: its bytes, plus [`ITEM_BYTES`] per item it may hold (at
/// most one more than its commas, and at most `max_items`: the decoder counts items before it builds anything per
/// item, and refuses more). An entry over `max_entry_bytes` is refused before it is parsed: its bytes only. The
/// first batch's body takes room of its own (`Pipeline::take_in`).
fn entry_charge(fields: &[(String, Vec<u8>)], max_entry_bytes: usize, max_items: usize) -> usize {
    let bytes: usize = fields.iter().map(|(name, value)| name.len() + value.len()).sum();
    if fields.iter().any(|(_, value)| value.len() > max_entry_bytes) {
        return bytes;
    }
    let commas: usize = fields.iter().map(|(_, value)| value.iter().filter(|byte| **byte == b',').count()).sum();
    bytes.saturating_add((commas + 1).min(max_items).saturating_mul(ITEM_BYTES))
}

/// Stops the admin server, the sampler and the watchdog, waiting briefly for them (an idle keep-alive scrape
/// connection must not hold the exit up).
async fn stop_background(stop: CancellationToken, tasks: Vec<JoinHandle<()>>) {
    stop.cancel();
    for mut task in tasks {
        if tokio::time::timeout(BACKGROUND_STOP, &mut task).await.is_err() {
            task.abort();
        }
    }
}

/// Waits for the workers to finish their in-flight work, up to `grace`; then abandons what is left (it is
/// resumed from Redis by the next replica, after its lease or idle timeout).
async fn drain(workers: &mut JoinSet<WorkerExit>, grace: Duration) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn job(text: &str) -> Vec<(String, Vec<u8>)> {
        vec![("job".to_owned(), text.as_bytes().to_vec())]
    }

    #[test]
    fn an_entry_holds_its_bytes_and_room_for_each_item_it_may_hold() {
        let entry = job(r#"{"requests":[{},{},{}]}"#);
        assert_eq!(entry_charge(&entry, 1000, 1000), 3 + 23 + 3 * ITEM_BYTES, "two commas: at most three items");
        assert_eq!(entry_charge(&entry, 1000, 2), 3 + 23 + 2 * ITEM_BYTES, "never more than max_items");
        assert_eq!(entry_charge(&entry, 10, 1000), 3 + 23, "refused unparsed: its bytes only");
    }
}
