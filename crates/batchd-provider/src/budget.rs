//! The engine's memory budget as a provider sees it: room for a reply's bytes is taken before (or while) they are
//! read and handed back to the engine with the answer, so what bounds memory is `workers.inflight_bytes`, whatever
//! a provider sends.
//!
//! A reply read piece by piece grows its room by doubling (or to its declared length at once), and stops growing at
//! the most one reply can hold ([`ReplyBudget::capacity`]): a download keeps what it holds to its end. (Growing a
//! MiB at a time, each step that found no free room gave back everything and waited for the sum; once a reply
//! held the whole budget, every further MiB waited for the whole budget again: a 160 MB result crawled at
//! 0.8 MiB/s.)

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

/// How many bytes of memory one byte of a reply stands for while it is read and stored: the bytes, the responses
/// read from them and what is written to Redis. The daemon counts replies this many times in
/// `workers.inflight_bytes`, so a reply of more than `inflight_bytes / REPLY_COPIES` cannot be held within it.
pub const REPLY_COPIES: usize = 3;

/// Counts replies against the engine's memory budget while they are read. Cloning is cheap.
#[derive(Clone)]
pub struct ReplyBudget {
    /// Waits for room.
    hold: Arc<HoldFn>,
    /// Takes room that is free now.
    try_hold: Arc<TryHoldFn>,
    /// The most room one reply is given (the whole budget, in reply bytes); `usize::MAX`: unbounded.
    capacity: usize,
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
        Self { hold: Arc::new(move |bytes| Box::pin(hold(bytes))), try_hold: Arc::new(try_hold), capacity: usize::MAX }
    }

    /// The same budget, giving one reply room for at most `bytes` (the whole budget, counted in reply bytes): a
    /// reply that has that much keeps it to its end and asks for no more.
    #[must_use]
    pub fn with_capacity(mut self, bytes: usize) -> Self {
        self.capacity = bytes.max(1);
        self
    }

    /// The most room one reply is given, in reply bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Waits for room for `bytes`.
    pub async fn hold(&self, bytes: usize) -> ReplyHold {
        (self.hold)(bytes).await
    }

    /// Takes room for `bytes` if it is free now.
    pub fn try_hold(&self, bytes: usize) -> Option<ReplyHold> {
        (self.try_hold)(bytes)
    }

    /// Grows `held` (room for `held_bytes` bytes) to room for `total` bytes of a reply read piece by piece: to
    /// twice what it holds (at least `step`, at most [`ReplyBudget::capacity`]), or to `total` rounded up to
    /// `step` when that is more. Takes the difference if it is free now, and otherwise gives back what it holds and
    /// waits for the sum, so it never waits while holding room. Nothing happens while `total` fits, or once the
    /// reply holds the capacity: it keeps that to its end.
    pub async fn cover(&self, held: &mut Vec<ReplyHold>, held_bytes: &mut usize, total: usize, step: usize) {
        if total <= *held_bytes || *held_bytes >= self.capacity {
            return;
        }
        let doubled = held_bytes.saturating_mul(2).max(step);
        let want = total.next_multiple_of(step.max(1)).max(doubled).min(self.capacity);
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
    fn room_doubles_and_is_given_back_before_waiting() {
        let (free, log) = (Arc::new(AtomicBool::new(true)), Arc::new(Mutex::new(Vec::new())));
        let budget = budget(free.clone(), log.clone());
        let (mut held, mut held_bytes) = (Vec::new(), 0);
        futures::executor::block_on(async {
            budget.cover(&mut held, &mut held_bytes, 15, 10).await;
            assert_eq!((held.len(), held_bytes), (1, 20));
            budget.cover(&mut held, &mut held_bytes, 20, 10).await;
            assert_eq!((held.len(), held_bytes), (1, 20), "what fits takes nothing");
            budget.cover(&mut held, &mut held_bytes, 21, 10).await;
            assert_eq!((held.len(), held_bytes), (2, 40), "doubled");
            free.store(false, Ordering::SeqCst);
            budget.cover(&mut held, &mut held_bytes, 45, 10).await;
            assert_eq!((held.len(), held_bytes), (1, 80), "gave back its two holds and waited for the sum");
        });
        assert_eq!(*log.lock().unwrap(), ["try 20", "try 20", "try 40", "hold 80"]);
    }

    /// Issue 34: a reply that holds the whole budget keeps it and asks for nothing more, however much follows.
    #[test]
    fn a_reply_at_the_capacity_keeps_what_it_holds_to_its_end() {
        let (free, log) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Vec::new())));
        let budget = budget(free, log.clone()).with_capacity(85);
        let (mut held, mut held_bytes) = (Vec::new(), 0);
        futures::executor::block_on(async {
            budget.cover(&mut held, &mut held_bytes, 60, 10).await;
            assert_eq!(held_bytes, 60);
            for total in (61..=160).step_by(7) {
                budget.cover(&mut held, &mut held_bytes, total, 10).await;
            }
            assert_eq!(held_bytes, 85, "the capacity, held once");
        });
        assert_eq!(*log.lock().unwrap(), ["try 60", "hold 60", "try 25", "hold 85"]);
    }
}
