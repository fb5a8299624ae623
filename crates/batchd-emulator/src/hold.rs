//! Replies held open until a test releases them: what the `hold` fault of the OpenAI and Anthropic emulators waits
//! on.
//!
//! A held call has been handled (a create's batch exists, the call is in the log) and only its reply has not left.
//! That is the one moment a client cannot know what its create did, so a test can aim a `kill -9` at it: wait until
//! a reply is held ([`Holds::wait_held`]), kill the client, then let whatever is still held go
//! ([`Holds::release`]). A held reply ends when it is released, when the server drops the call (its client went
//! away), or when the emulator stops; the count of replies held now follows all three.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use serde::Serialize;
use tokio::sync::{Notify, watch};

/// What `GET /_emulator/openai/held` and `GET /_emulator/anthropic/held` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct HeldView {
    /// Replies held now.
    pub held: usize,
    /// Replies ever held (released, dropped or still held).
    pub ever_held: u64,
}

/// What `POST /_emulator/openai/held/release` and `POST /_emulator/anthropic/held/release` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Released {
    /// Replies that were held and are let go.
    pub released: usize,
}

/// The replies held now, and the switch that lets them go.
#[derive(Debug)]
pub(crate) struct Holds {
    /// How many replies are held now; a test waits on its changes.
    held: watch::Sender<usize>,
    /// How many replies were ever held (released, dropped or still held).
    ever_held: AtomicU64,
    /// Wakes every held reply at once.
    release: Notify,
}

impl Default for Holds {
    fn default() -> Self {
        Self { held: watch::Sender::new(0), ever_held: AtomicU64::new(0), release: Notify::new() }
    }
}

impl Holds {
    /// Holds the caller (a handled call about to send its reply) until [`Holds::release`]; counted as held
    /// meanwhile, also if the caller is dropped while it waits.
    pub async fn hold(&self) {
        let released = self.release.notified();
        tokio::pin!(released);
        // Registered before it is counted: a release that follows a test seeing the count cannot be missed.
        released.as_mut().enable();
        let _held = Held::new(self);
        released.await;
    }

    /// Lets every reply held now go; answers how many there were.
    pub fn release(&self) -> usize {
        let held = *self.held.borrow();
        self.release.notify_waiters();
        held
    }

    /// How many replies are held now.
    pub fn n_held(&self) -> usize {
        *self.held.borrow()
    }

    /// How many replies were ever held.
    pub fn n_ever_held(&self) -> u64 {
        self.ever_held.load(Ordering::Acquire)
    }

    /// The counts, as the control API shows them.
    pub fn view(&self) -> HeldView {
        HeldView { held: self.n_held(), ever_held: self.n_ever_held() }
    }

    /// Waits until at least `n` replies are held at once, at most `timeout`; answers whether they were.
    pub async fn wait_held(&self, n: usize, timeout: Duration) -> bool {
        let mut held = self.held.subscribe();
        matches!(tokio::time::timeout(timeout, held.wait_for(|held| *held >= n)).await, Ok(Ok(_)))
    }
}

/// One held reply, counted from creation to drop.
#[derive(Debug)]
struct Held<'a> {
    /// Where it is counted.
    holds: &'a Holds,
}

impl<'a> Held<'a> {
    fn new(holds: &'a Holds) -> Self {
        holds.ever_held.fetch_add(1, Ordering::AcqRel);
        holds.held.send_modify(|held| *held += 1);
        Self { holds }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.holds.held.send_modify(|held| *held = held.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn a_held_caller_waits_until_released_and_is_counted_meanwhile() {
        let holds = Arc::new(Holds::default());
        let mut callers = Vec::new();
        for _ in 0..2 {
            let holds = Arc::clone(&holds);
            callers.push(tokio::spawn(async move { holds.hold().await }));
        }
        assert!(holds.wait_held(2, Duration::from_secs(10)).await, "both callers are held");
        assert!(callers.iter().all(|caller| !caller.is_finished()));
        assert_eq!(holds.release(), 2);
        for caller in callers {
            tokio::time::timeout(Duration::from_secs(10), caller).await.expect("released").expect("joined");
        }
        assert_eq!((holds.n_held(), holds.n_ever_held()), (0, 2));
    }

    #[tokio::test]
    async fn a_dropped_caller_is_no_longer_held() {
        let holds = Arc::new(Holds::default());
        let caller = tokio::spawn({
            let holds = Arc::clone(&holds);
            async move { holds.hold().await }
        });
        assert!(holds.wait_held(1, Duration::from_secs(10)).await);
        caller.abort();
        let _ = caller.await;
        assert_eq!((holds.n_held(), holds.n_ever_held()), (0, 1));
    }
}
