//! The apalis `Backend` of both workers: a bounded channel filled by a fetcher task.
//!
//! Why not apalis's own Redis backend or its `BackendBuilder`: a backend error ends an apalis worker, and
//! there is no hook to hand back prefetched work at shutdown (see docs/architecture.md). So the backend's
//! error type is `Infallible`: the fetcher retries Redis errors itself, and the worker only ever sees tasks.
//! The fetcher reserves channel room before it reads from Redis, so nothing it reads can be stranded;
//! at shutdown it stops reading, and whatever is still in the channel is handed back to Redis.

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use apalis_core::backend::{Backend, BackendConfig};
use apalis_core::task::Task;
use apalis_core::task::builder::TaskBuilder;
use apalis_core::worker::context::WorkerContext;
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Returns fetched-but-unstarted work to Redis so another replica (or this one, later) takes it.
pub trait HandBack<T>: Send + Sync + 'static {
    /// Hands `items` back. Errors are logged by the implementation; work not handed back is recovered
    /// by its lease or idle timeout anyway.
    fn hand_back(&self, items: Vec<T>) -> BoxFuture<'static, ()>;
}

/// An apalis backend over a fetcher task.
pub struct FetchBackend<T> {
    /// Tasks fetched and not yet given to the worker; `None` once closing began.
    rx: Option<mpsc::Receiver<T>>,
    /// Stops the fetcher.
    stop: CancellationToken,
    /// The fetcher task.
    fetcher: Option<JoinHandle<()>>,
    /// Where unstarted work goes at shutdown.
    hand_back: Arc<dyn HandBack<T>>,
    /// The shutdown sequence, once started.
    closing: Option<BoxFuture<'static, ()>>,
    /// The fetch loop's heartbeat (see [`crate::runtime::heartbeat`]).
    heartbeat: Arc<crate::runtime::heartbeat::Heartbeat>,
}

impl<T> fmt::Debug for FetchBackend<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FetchBackend").field("stopped", &self.stop.is_cancelled()).finish()
    }
}

impl<T: Send + 'static> FetchBackend<T> {
    /// Starts `fetch` as a task feeding a channel of `capacity` items; `stop` ends it (also cancelled when the
    /// backend closes). `fetch` must stop promptly once `stop` is cancelled, sending only into permits it holds.
    pub fn spawn<F, Fut>(capacity: usize, stop: CancellationToken, hand_back: Arc<dyn HandBack<T>>, fetch: F) -> Self
    where
        F: FnOnce(mpsc::Sender<T>, CancellationToken) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let heartbeat = crate::runtime::heartbeat::Heartbeat::new();
        let fetcher = tokio::spawn(Arc::clone(&heartbeat).scope(fetch(tx, stop.clone())));
        Self { rx: Some(rx), stop, fetcher: Some(fetcher), hand_back, closing: None, heartbeat }
    }

    /// The fetch loop's heartbeat: stamped every time the loop goes round or waits for room.
    pub fn heartbeat(&self) -> Arc<crate::runtime::heartbeat::Heartbeat> {
        Arc::clone(&self.heartbeat)
    }
}

impl<T: Send + 'static> Backend for FetchBackend<T> {
    type Task = Task<T>;
    type Error = Infallible;

    fn poll_ready(&mut self, _cx: &mut Context<'_>, _worker: &WorkerContext) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
        _worker: &WorkerContext,
    ) -> Poll<Option<Result<Self::Task, Self::Error>>> {
        let Some(rx) = self.rx.as_mut() else {
            return Poll::Ready(None);
        };
        rx.poll_recv(cx).map(|item| item.map(|args| Ok(TaskBuilder::new(args).build())))
    }

    fn poll_close(&mut self, cx: &mut Context<'_>, _worker: &WorkerContext) -> Poll<Result<(), Self::Error>> {
        if self.closing.is_none() {
            self.stop.cancel();
            let fetcher = self.fetcher.take();
            let rx = self.rx.take();
            let hand_back = Arc::clone(&self.hand_back);
            self.closing = Some(
                async move {
                    if let Some(fetcher) = fetcher
                        && let Err(e) = fetcher.await
                    {
                        tracing::error!(error = %e, "fetcher task ended abnormally");
                    }
                    let mut unstarted = Vec::new();
                    if let Some(mut rx) = rx {
                        rx.close();
                        while let Ok(item) = rx.try_recv() {
                            unstarted.push(item);
                        }
                    }
                    if !unstarted.is_empty() {
                        tracing::info!(n = unstarted.len(), "handing back unstarted work");
                        hand_back.hand_back(unstarted).await;
                    }
                }
                .boxed(),
            );
        }
        match self.closing.as_mut().map(|closing| closing.poll_unpin(cx)) {
            Some(Poll::Pending) => Poll::Pending,
            _ => Poll::Ready(Ok(())),
        }
    }
}

impl<T: Send + 'static> BackendConfig for FetchBackend<T> {
    type Args = T;
    type Id = apalis_core::task::task_id::RandomId;
    type Kind = apalis_core::backend::finalize::Ephemeral;
    type Config = ();
    type Layer = tower_layer::Identity;

    fn config(&self) -> &Self::Config {
        &()
    }

    fn middleware(&mut self, _worker: &mut WorkerContext) -> Self::Layer {
        tower_layer::Identity::new()
    }
}

impl<T> Drop for FetchBackend<T> {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Sleeps for `duration` unless `stop` is cancelled first; returns false when stopped.
pub(crate) async fn pause(duration: std::time::Duration, stop: &CancellationToken) -> bool {
    crate::runtime::heartbeat::beat();
    let slept = tokio::select! {
        () = tokio::time::sleep(duration) => true,
        () = stop.cancelled() => false,
    };
    crate::runtime::heartbeat::beat();
    slept
}

/// Waits for room for between 1 and `batch` items in the channel (as many as are free right now), so that
/// everything read from Redis next can be sent without waiting; `None` when stopped or the worker is gone.
pub(crate) async fn reserve<'a, T>(
    tx: &'a mpsc::Sender<T>,
    batch: usize,
    stop: &CancellationToken,
) -> Option<(usize, mpsc::PermitIterator<'a, T>)> {
    let n = tx.capacity().clamp(1, batch);
    loop {
        // Waiting for the workers to make room is not being stuck: stamp the heartbeat every second meanwhile.
        crate::runtime::heartbeat::beat();
        tokio::select! {
            permits = tx.reserve_many(n) => return permits.ok().map(|permits| (n, permits)),
            () = stop.cancelled() => return None,
            () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
    }
}

/// The bytes of work a daemon process may hold in flight (`workers.inflight_bytes`): one budget per process,
/// shared by every namespace's fetchers and handlers. Work waits for room before it reads or builds anything
/// big, and gives its room back when it is done (its [`BudgetHold`] is dropped). Counted in KiB (one semaphore
/// permit each, rounded up), so a budget can exceed 4 GiB. A request larger than the whole budget takes the whole
/// budget (it waits until nothing else is held, and runs alone) rather than waiting forever. Cloning shares it.
///
/// Rule that keeps it free of deadlocks: nothing waits for room while it holds room (a holder that needs more
/// gives back what it holds and asks for the sum at once).
#[derive(Debug, Clone)]
pub struct ByteBudget {
    /// One permit per KiB.
    semaphore: Arc<tokio::sync::Semaphore>,
    /// The budget in KiB.
    total_kib: u32,
}

/// Room held in a [`ByteBudget`], given back when dropped. An empty hold holds nothing.
#[derive(Debug, Default)]
pub struct BudgetHold {
    /// The permits, none for an empty hold.
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl ByteBudget {
    /// A budget of `bytes` (rounded up to whole KiB, at least 1 KiB, at most 4 TiB).
    pub fn new(bytes: usize) -> Self {
        let total_kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX).max(1);
        Self { semaphore: Arc::new(tokio::sync::Semaphore::new(total_kib as usize)), total_kib }
    }

    /// The whole budget, in bytes.
    pub fn total_bytes(&self) -> usize {
        self.total_kib as usize * 1024
    }

    /// What is not held right now, in bytes.
    pub fn available_bytes(&self) -> usize {
        self.semaphore.available_permits() * 1024
    }

    /// The permits `bytes` takes: rounded up to KiB, at most the whole budget.
    fn kib(&self, bytes: usize) -> u32 {
        u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX).min(self.total_kib)
    }

    /// Waits until `bytes` (at most the whole budget) are free and holds them. Waiters are served in order, so a
    /// big request is not starved by small ones.
    pub async fn hold(&self, bytes: usize) -> BudgetHold {
        let kib = self.kib(bytes);
        if kib == 0 {
            return BudgetHold::default();
        }
        let permit = Arc::clone(&self.semaphore).acquire_many_owned(kib).await.expect("the budget is never closed");
        BudgetHold { permit: Some(permit) }
    }

    /// Holds `bytes` (at most the whole budget) if they are free right now.
    pub fn try_hold(&self, bytes: usize) -> Option<BudgetHold> {
        let kib = self.kib(bytes);
        if kib == 0 {
            return Some(BudgetHold::default());
        }
        Arc::clone(&self.semaphore).try_acquire_many_owned(kib).ok().map(|permit| BudgetHold { permit: Some(permit) })
    }

    /// [`ByteBudget::hold`], stamping the calling loop's heartbeat every second while it waits (waiting for room
    /// is not being stuck); `None` when `stop` is cancelled first.
    pub(crate) async fn hold_beating(&self, bytes: usize, stop: &CancellationToken) -> Option<BudgetHold> {
        let held = self.hold(bytes);
        tokio::pin!(held);
        loop {
            crate::runtime::heartbeat::beat();
            tokio::select! {
                hold = &mut held => return Some(hold),
                () = stop.cancelled() => return None,
                () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            }
        }
    }
}

impl BudgetHold {
    /// The bytes held (whole KiB).
    pub fn bytes(&self) -> usize {
        self.permit.as_ref().map_or(0, |permit| permit.num_permits() * 1024)
    }

    /// Takes `bytes` (rounded up to KiB; at most what is held) out of this hold into a hold of its own.
    pub fn split(&mut self, bytes: usize) -> BudgetHold {
        let kib = bytes.div_ceil(1024);
        let Some(permit) = self.permit.as_mut() else { return BudgetHold::default() };
        if kib >= permit.num_permits() {
            return BudgetHold { permit: self.permit.take() };
        }
        BudgetHold { permit: permit.split(kib) }
    }

    /// Gives back everything held beyond `bytes`.
    pub fn shrink_to(&mut self, bytes: usize) {
        drop(self.split(self.bytes().saturating_sub(bytes.div_ceil(1024) * 1024)));
    }

    /// Adds `other`'s room to this hold.
    pub fn merge(&mut self, other: BudgetHold) {
        match (self.permit.as_mut(), other.permit) {
            (Some(permit), Some(other)) => permit.merge(other),
            (None, other) => self.permit = other,
            (Some(_), None) => {}
        }
    }
}
