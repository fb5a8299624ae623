//! Pacing of OpenAI's per-model enqueued-token limit (`openai.enqueued_token_limits`): the estimated input tokens
//! of the batches batchd has running for a model are kept under the model's configured limit, so a create waits
//! (using no attempt) instead of making a batch that fails validation with `token_limit_exceeded`.
//!
//! Tokens are estimated from bytes, a third of each request's bytes ([`estimate_tokens`]): OpenAI counts a
//! batch's input tokens with the model's tokenizer, which batchd does not carry (the tokenizer crates ship
//! megabytes of vocabulary per model family); JSON, code and markup tokenize at about 2.5-4 characters a token, so a
//! third rarely undercounts (the reference, "Observed in practice").
//!
//! Counted per replica, in memory: a batch is counted from its create until a poll of this replica sees it end,
//! and batches counted here whose end another replica saw are asked about (retrieved) before a create is made to
//! wait for them. With several replicas, each should be given a share of the limit (docs/providers.md).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A batch no poll saw end is counted at most this long: the 24 h completion window and the 10 minutes a cancel
/// may take, with a margin.
const LONGEST_RUN: Duration = Duration::from_secs(25 * 3600);

/// Estimated input tokens of requests of `item_bytes` bytes each: a third of their bytes, rounded up.
pub(crate) fn estimate_tokens(item_bytes: impl IntoIterator<Item = usize>) -> u64 {
    item_bytes.into_iter().map(|bytes| bytes.div_ceil(3) as u64).sum()
}

/// One counted batch (or a create under way).
#[derive(Debug, Clone)]
struct Counted {
    /// The model, as OpenAI names it.
    model: String,
    /// Its estimated input tokens.
    tokens: u64,
    /// When it was counted.
    since: Instant,
}

/// What is counted: batches by id, and creates under way by a number of their own.
#[derive(Debug, Default)]
struct Ledger {
    /// Batches created and not yet seen to end, by batch id.
    batches: HashMap<String, Counted>,
    /// Creates under way, by reservation number.
    creating: HashMap<u64, Counted>,
    /// The next reservation number.
    next: u64,
}

impl Ledger {
    /// Tokens counted for `model` (entries older than [`LONGEST_RUN`] are dropped first).
    fn enqueued(&mut self, model: &str, now: Instant) -> u64 {
        self.batches.retain(|_, counted| now.duration_since(counted.since) < LONGEST_RUN);
        self.batches
            .values()
            .chain(self.creating.values())
            .filter(|counted| counted.model == model)
            .map(|counted| counted.tokens)
            .sum()
    }
}

/// The per-model enqueued-token limits and what is counted against them. Cloning shares the count.
#[derive(Debug, Clone, Default)]
pub(crate) struct TokenPacer {
    /// Limits by model; a model not listed is not paced.
    limits: Arc<HashMap<String, u64>>,
    /// What is counted.
    ledger: Arc<Mutex<Ledger>>,
}

/// Why a create must wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OverLimit {
    /// Tokens counted for the model.
    pub enqueued: u64,
    /// The create's estimate.
    pub tokens: u64,
    /// The model's limit.
    pub limit: u64,
}

impl TokenPacer {
    /// A pacer for these `(model, tokens)` limits.
    pub(crate) fn new(limits: &[(String, u64)]) -> Self {
        Self { limits: Arc::new(limits.iter().cloned().collect()), ledger: Arc::default() }
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The limit of `model`, when it is paced.
    pub(crate) fn limit(&self, model: &str) -> Option<u64> {
        self.limits.get(model).copied()
    }

    /// Counts a create of `tokens` for `model` if it fits under the model's limit (or nothing else of the model is
    /// counted: a batch alone over the limit is sent rather than held forever). The reservation is released when
    /// dropped, or moved to the batch by [`Reservation::created`]. `None` when `model` is not paced.
    pub(crate) fn reserve(&self, model: &str, tokens: u64) -> Option<Result<Reservation, OverLimit>> {
        let limit = self.limit(model)?;
        let mut ledger = self.ledger();
        let enqueued = ledger.enqueued(model, Instant::now());
        if enqueued > 0 && enqueued.saturating_add(tokens) > limit {
            return Some(Err(OverLimit { enqueued, tokens, limit }));
        }
        let number = ledger.next;
        ledger.next += 1;
        ledger.creating.insert(number, Counted { model: model.to_owned(), tokens, since: Instant::now() });
        Some(Ok(Reservation { pacer: self.clone(), number: Some(number) }))
    }

    /// The batches of `model` counted here (ids), to ask whether they have ended.
    pub(crate) fn counted_batches(&self, model: &str) -> Vec<String> {
        let ledger = self.ledger();
        ledger.batches.iter().filter(|(_, counted)| counted.model == model).map(|(id, _)| id.clone()).collect()
    }

    /// Counts a batch found running that this replica did not create (a resumed submit's), if `model` is paced.
    pub(crate) fn count_found(&self, batch_id: &str, model: &str, tokens: u64) {
        if self.limit(model).is_some() {
            let counted = Counted { model: model.to_owned(), tokens, since: Instant::now() };
            self.ledger().batches.entry(batch_id.to_owned()).or_insert(counted);
        }
    }

    /// Stops counting batch `batch_id`: it has ended (completed, failed, expired or cancelled).
    pub(crate) fn ended(&self, batch_id: &str) {
        self.ledger().batches.remove(batch_id);
    }
}

/// Tokens counted for a create under way; released when dropped unless the create made its batch.
#[derive(Debug)]
pub(crate) struct Reservation {
    /// The pacer it is counted in.
    pacer: TokenPacer,
    /// Its number in the ledger; `None` once moved to a batch.
    number: Option<u64>,
}

impl Reservation {
    /// The create made batch `batch_id`: its tokens are counted until a poll sees it end.
    pub(crate) fn created(mut self, batch_id: &str) {
        if let Some(number) = self.number.take() {
            let mut ledger = self.pacer.ledger();
            if let Some(mut counted) = ledger.creating.remove(&number) {
                counted.since = Instant::now();
                ledger.batches.insert(batch_id.to_owned(), counted);
            }
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(number) = self.number.take() {
            self.pacer.ledger().creating.remove(&number);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_a_third_of_the_bytes_rounded_up() {
        assert_eq!(estimate_tokens([3, 4, 0]), 1 + 2);
    }

    #[test]
    fn creates_wait_while_the_models_batches_fill_its_limit_and_go_once_they_end() {
        let pacer = TokenPacer::new(&[("gpt-4o-mini".to_owned(), 100)]);
        assert!(pacer.reserve("gpt-4o", 1_000_000).is_none(), "a model without a limit is not paced");
        let first = pacer.reserve("gpt-4o-mini", 60).expect("paced").expect("fits");
        let refused = pacer.reserve("gpt-4o-mini", 50).expect("paced").expect_err("over the limit");
        assert_eq!(refused, OverLimit { enqueued: 60, tokens: 50, limit: 100 }, "a create under way counts");
        first.created("batch_1");
        assert_eq!(pacer.counted_batches("gpt-4o-mini"), ["batch_1"]);
        assert!(pacer.reserve("gpt-4o-mini", 40).expect("paced").is_ok(), "what fits goes; dropped: released");
        assert!(pacer.reserve("gpt-4o-mini", 50).expect("paced").is_err());
        pacer.ended("batch_1");
        let alone = pacer.reserve("gpt-4o-mini", 500).expect("paced");
        assert!(alone.is_ok(), "a batch alone over the limit is sent rather than held forever");
        drop(alone);
        pacer.count_found("batch_2", "gpt-4o-mini", 70);
        assert!(pacer.reserve("gpt-4o-mini", 31).expect("paced").is_err(), "a found batch counts");
    }
}
