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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// A budget that logs what is asked of it; `try_hold` succeeds while `free` is set.
    fn budget(free: Arc<AtomicBool>, log: Arc<Mutex<Vec<String>>>) -> ReplyBudget {
        let hold_log = log.clone();
        ReplyBudget::new(
            move |bytes| {
                hold_log.lock().unwrap().push(format!("hold {bytes}"));
                async move { Box::new(bytes) as ReplyHold }
            },
            move |bytes| {
                log.lock().unwrap().push(format!("try {bytes}"));
                free.load(Ordering::SeqCst).then(|| Box::new(bytes) as ReplyHold)
            },
        )
    }

    #[test]
    fn room_grows_a_step_at_a_time_and_is_given_back_before_waiting() {
        let (free, log) = (Arc::new(AtomicBool::new(true)), Arc::new(Mutex::new(Vec::new())));
        let budget = budget(free.clone(), log.clone());
        let (mut held, mut held_bytes) = (Vec::new(), 0);
        futures::executor::block_on(async {
            budget.cover(&mut held, &mut held_bytes, 15, 10).await;
            assert_eq!((held.len(), held_bytes), (1, 20));
            budget.cover(&mut held, &mut held_bytes, 20, 10).await;
            assert_eq!((held.len(), held_bytes), (1, 20), "what fits takes nothing");
            budget.cover(&mut held, &mut held_bytes, 21, 10).await;
            assert_eq!((held.len(), held_bytes), (2, 30));
            free.store(false, Ordering::SeqCst);
            budget.cover(&mut held, &mut held_bytes, 35, 10).await;
            assert_eq!((held.len(), held_bytes), (1, 40), "gave back its two holds and waited for the sum");
        });
        assert_eq!(*log.lock().unwrap(), ["try 20", "try 10", "try 10", "hold 40"]);
    }
}
