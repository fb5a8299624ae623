//! The schedule fetcher: claims due chunks from the schedule sorted set in bounded batches (each claim re-scores
//! its members to now + lease and gives each a fencing token) and sleeps until the next due time when nothing is
//! due.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::fetch::{FetchBackend, HandBack, pause, reserve};
use batchd_queue::{Claim, RetryDelay, Store};

/// Settings of the schedule fetcher.
#[derive(Debug, Clone)]
pub struct ScheduleSettings {
    /// Most members claimed at once, and the size of the prefetch channel.
    pub batch: usize,
    /// Longest sleep between two looks at the schedule when nothing is due (bounds how late a chunk scheduled by
    /// another replica can be noticed).
    pub idle_poll: Duration,
}

/// Starts the schedule fetcher and returns the backend the schedule worker reads from. Items are claims (a chunk
/// and the fencing token of this replica's claim of it); a due member batchd did not write is dropped from the
/// schedule here, so a hand-written member cannot stop the fetcher.
pub fn backend(store: Store, settings: ScheduleSettings, stop: CancellationToken) -> FetchBackend<Claim> {
    let hand_back: Arc<dyn HandBack<Claim>> = Arc::new(ScheduleHandBack { store: store.clone() });
    FetchBackend::spawn(settings.batch, stop, hand_back, move |tx, stop| fetch_loop(store, settings, tx, stop))
}

async fn fetch_loop(store: Store, settings: ScheduleSettings, tx: mpsc::Sender<Claim>, stop: CancellationToken) {
    let mut delay = RetryDelay::new();
    tracing::info!(schedule = %store.keys().schedule(), "schedule fetcher started");
    while !stop.is_cancelled() {
        let Some((n, permits)) = reserve(&tx, settings.batch, &stop).await else { break };
        let claimed = async {
            // Redis's time: a replica whose wall clock is off must neither take leases early nor leave steps late.
            let now = store.now().await?;
            let claimed = store.claim_due(now, n).await?;
            for member in &claimed.unknown {
                tracing::warn!(member = %member, "dropping a schedule member batchd did not write");
                store.drop_member(member).await?;
            }
            Ok::<_, batchd_queue::StoreError>((claimed, now))
        }
        .await;
        match claimed {
            Ok((claimed, now)) => {
                delay.succeeded();
                let full = claimed.claims.len() + claimed.unknown.len() == n;
                let next_due = claimed.next_due;
                for (permit, claim) in permits.zip(claimed.claims) {
                    permit.send(claim);
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

/// Hands claimed-but-unstarted members back by making them due now (each fenced: a claim taken over meanwhile is
/// left to its new holder).
struct ScheduleHandBack {
    store: Store,
}

impl HandBack<Claim> for ScheduleHandBack {
    fn hand_back(&self, items: Vec<Claim>) -> BoxFuture<'static, ()> {
        let store = self.store.clone();
        async move {
            let released = match store.now().await {
                Ok(now) => store.release(&items, now).await,
                Err(error) => Err(error),
            };
            match released {
                Ok(released) => tracing::info!(n = released, "handed back unstarted schedule members"),
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
