//! The schedule fetcher: claims due chunks from the schedule sorted set in bounded batches (each claim re-scores
//! its members to now + lease) and sleeps until the next due time when nothing is due.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::fetch::{FetchBackend, HandBack, pause, reserve};
use batchd_queue::{RetryDelay, Store};

/// Settings of the schedule fetcher.
#[derive(Debug, Clone)]
pub struct ScheduleSettings {
    /// Most members claimed at once, and the size of the prefetch channel.
    pub batch: usize,
    /// Longest sleep between two looks at the schedule when nothing is due (bounds how late a chunk scheduled by
    /// another replica can be noticed).
    pub idle_poll: Duration,
}

/// Starts the schedule fetcher and returns the backend the schedule worker reads from. Items are schedule
/// members (`<job_id>#<chunk>`), parsed by the handler so that a hand-written member cannot stop the fetcher.
pub fn backend(store: Store, settings: ScheduleSettings, stop: CancellationToken) -> FetchBackend<String> {
    let hand_back: Arc<dyn HandBack<String>> = Arc::new(ScheduleHandBack { store: store.clone() });
    FetchBackend::spawn(settings.batch, stop, hand_back, move |tx, stop| fetch_loop(store, settings, tx, stop))
}

async fn fetch_loop(store: Store, settings: ScheduleSettings, tx: mpsc::Sender<String>, stop: CancellationToken) {
    let mut delay = RetryDelay::new();
    tracing::info!(schedule = %store.keys().schedule(), "schedule fetcher started");
    while !stop.is_cancelled() {
        let Some((n, permits)) = reserve(&tx, settings.batch, &stop).await else { break };
        let claimed = async {
            // Redis's time: a replica whose wall clock is off must neither take leases early nor leave steps late.
            let now = store.now().await?;
            let members = store.claim_due(now, n).await?;
            let next_due = if members.len() < n { store.next_due().await? } else { None };
            Ok::<_, batchd_queue::StoreError>((members, next_due, now))
        }
        .await;
        match claimed {
            Ok((members, next_due, now)) => {
                delay.succeeded();
                let full = members.len() == n;
                for (permit, member) in permits.zip(members) {
                    permit.send(member);
                }
                if !full {
                    let until_due = next_due
                        .map(|due| Duration::from_millis(due.saturating_sub(now)))
                        .unwrap_or(settings.idle_poll);
                    let wait = until_due.clamp(Duration::from_millis(1), settings.idle_poll);
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = store.soon_due() => {}
                        () = stop.cancelled() => break,
                    }
                }
            }
            Err(error) => {
                let wait = delay.failed();
                tracing::warn!(error = %error, retry_in = ?wait, "claiming from the schedule failed; retrying");
                if !pause(wait, &stop).await {
                    break;
                }
            }
        }
    }
    tracing::info!("schedule fetcher stopped");
}

/// Hands claimed-but-unstarted members back by making them due now.
struct ScheduleHandBack {
    store: Store,
}

impl HandBack<String> for ScheduleHandBack {
    fn hand_back(&self, items: Vec<String>) -> BoxFuture<'static, ()> {
        let store = self.store.clone();
        async move {
            let released = match store.now().await {
                Ok(now) => store.release(&items, now).await,
                Err(error) => Err(error),
            };
            match released {
                Ok(()) => tracing::info!(n = items.len(), "handed back unstarted schedule members"),
                Err(error) => tracing::warn!(
                    error = %error,
                    n = items.len(),
                    "could not hand back schedule members; they become due when their lease ends"
                ),
            }
        }
        .boxed()
    }
}
