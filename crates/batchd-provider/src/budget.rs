//! The engine's memory budget as a provider sees it: room for a reply's bytes is taken before (or while) they are
//! read and handed back to the engine with the answer, so what bounds memory is `workers.inflight_bytes`, whatever
//! a provider sends.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// Room held in the engine's memory budget for a reply's bytes; given back when dropped.
pub type ReplyHold = Box<dyn Send + Sync>;

/// Waits for room for that many bytes.
type HoldFn = dyn Fn(usize) -> Pin<Box<dyn Future<Output = ReplyHold> + Send>> + Send + Sync;

/// Takes room for that many bytes if it is free right now.
type TryHoldFn = dyn Fn(usize) -> Option<ReplyHold> + Send + Sync;

/// Counts replies against the engine's memory budget while they are read. Cloning is cheap.
#[derive(Clone)]
pub struct ReplyBudget {
    /// Waits for room.
    hold: Arc<HoldFn>,
    /// Takes room that is free now.
    try_hold: Arc<TryHoldFn>,
}

impl ReplyBudget {
    /// `hold(n)` waits for room for `n` bytes, `try_hold(n)` takes it only if free now; what they return holds the
    /// room until dropped.
    pub fn new<H, F, T>(hold: H, try_hold: T) -> Self
    where
        H: Fn(usize) -> F + Send + Sync + 'static,
        F: Future<Output = ReplyHold> + Send + 'static,
        T: Fn(usize) -> Option<ReplyHold> + Send + Sync + 'static,
    {
        Self { hold: Arc::new(move |bytes| Box::pin(hold(bytes))), try_hold: Arc::new(try_hold) }
    }

    /// Waits for room for `bytes`.
    pub async fn hold(&self, bytes: usize) -> ReplyHold {
        (self.hold)(bytes).await
    }

    /// Takes room for `bytes` if it is free now.
    pub fn try_hold(&self, bytes: usize) -> Option<ReplyHold> {
        (self.try_hold)(bytes)
    }

    /// Grows `held` (room for `held_bytes` bytes) to room for `total` bytes of a reply read piece by piece,
    /// rounded up to a multiple of `step`: takes the difference if it is free now, and otherwise gives back what it
    /// holds and waits for the sum, so it never waits while holding room. Nothing happens while `total` fits.
    pub async fn cover(&self, held: &mut Vec<ReplyHold>, held_bytes: &mut usize, total: usize, step: usize) {
        if total <= *held_bytes {
            return;
        }
        let want = total.next_multiple_of(step);
        match self.try_hold(want - *held_bytes) {
            Some(more) => held.push(more),
            None => {
                held.clear();
                held.push(self.hold(want).await);
            }
        }
        *held_bytes = want;
    }
}

impl fmt::Debug for ReplyBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReplyBudget")
    }
}
