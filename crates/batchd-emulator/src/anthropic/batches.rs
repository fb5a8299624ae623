//! The batch store and the lifecycle of one batch: `in_progress` → (`canceling` →) `ended`.
//!
//! A batch's state is a function of its create time, the clock and the settings (see [`Batch::settle`]); the
//! first observation of its end freezes it, so what a client once saw never changes. Items finish one by one in
//! request order, evenly spread over [`AnthropicConfig::processing_for`]; a cancel or an expiry ends the batch
//! with the items finished by then, the others `canceled` or `expired`.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, SystemTime},
};

use serde_json::{Value, json};

use super::{
    AnthropicConfig,
    results::{Fate, Item, Outcome},
};

/// How a batch ended: when, how many of its items (the first ones, in request order) ran, and the fate of the
/// others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ended {
    /// `ended_at`.
    pub at: SystemTime,
    /// Items that ran (the first `n_ran` in request order).
    pub n_ran: usize,
    /// What the other items became.
    pub rest: Fate,
    /// Items that ran and succeeded.
    pub n_succeeded: usize,
}

/// A cancel in progress: when it was asked and how many items had finished by then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cancel {
    /// `cancel_initiated_at`.
    at: SystemTime,
    /// Items finished when the cancel came; they keep their results.
    n_ran: usize,
}

/// One batch.
#[derive(Debug)]
pub(crate) struct Batch {
    /// `msgbatch_...`.
    pub id: String,
    /// `created_at`.
    created_at: SystemTime,
    /// The items, in request order, with their outcomes decided at create.
    items: Arc<Vec<Item>>,
    /// Items a test marked finished (the first ones), whatever the timing.
    n_forced: usize,
    /// Set once a cancel was asked.
    cancel: Option<Cancel>,
    /// Set once the batch was seen ended; never changes after.
    ended: Option<Ended>,
}

/// Items finished `elapsed` after create when `n` items are spread evenly over `processing_for`.
pub(crate) fn items_done(n: usize, elapsed: Duration, processing_for: Duration) -> usize {
    if elapsed >= processing_for {
        return n;
    }
    let done = u128::try_from(n).unwrap_or(u128::MAX).saturating_mul(elapsed.as_nanos()) / processing_for.as_nanos();
    usize::try_from(done).unwrap_or(n).min(n)
}

/// `at + duration`, or `None` when that is past what the clock can hold (never, in practice).
fn after(at: SystemTime, duration: Duration) -> Option<SystemTime> {
    at.checked_add(duration)
}

/// An RFC 3339 time with microseconds, as the API writes them (`2024-08-20T18:37:24.100435Z`).
fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_micros(at).to_string()
}

impl Batch {
    fn new(id: String, created_at: SystemTime, items: Vec<Item>) -> Self {
        Self { id, created_at, items: Arc::new(items), n_forced: 0, cancel: None, ended: None }
    }

    /// How it ended, once it has (call [`Batch::settle`] first).
    pub fn ended(&self) -> Option<Ended> {
        self.ended
    }

    /// The items, to render results outside the lock.
    pub fn items(&self) -> Arc<Vec<Item>> {
        Arc::clone(&self.items)
    }

    /// Items finished by `now` if nothing stops the batch.
    fn n_finished(&self, now: SystemTime, config: &AnthropicConfig) -> usize {
        let elapsed = now.duration_since(self.created_at).unwrap_or_default();
        items_done(self.items.len(), elapsed, config.processing_for).max(self.n_forced)
    }

    fn end(&mut self, at: SystemTime, n_ran: usize, rest: Fate) {
        let n_ran = n_ran.min(self.items.len());
        let n_succeeded =
            self.items[..n_ran].iter().filter(|item| matches!(item.outcome, Outcome::Succeeded(_))).count();
        self.ended = Some(Ended { at, n_ran, rest, n_succeeded });
    }

    /// Moves the batch forward to `now`: a cancel ends after `canceling_for`; otherwise the batch ends when its
    /// last item finishes, or at `expires_at` if that comes first. Once ended, nothing changes.
    pub fn settle(&mut self, now: SystemTime, config: &AnthropicConfig) {
        if self.ended.is_some() {
            return;
        }
        if let Some(cancel) = self.cancel {
            if let Some(end) = after(cancel.at, config.canceling_for).filter(|end| now >= *end) {
                self.end(end, cancel.n_ran, Fate::Canceled);
            }
            return;
        }
        let n = self.items.len();
        if self.n_forced >= n {
            self.end(now, n, Fate::Ran);
            return;
        }
        let natural_end = after(self.created_at, config.processing_for);
        let expires_at = after(self.created_at, config.expires_after);
        let expires_first = match (natural_end, expires_at) {
            (Some(end), Some(expires)) => expires < end,
            (None, Some(_)) => true,
            (_, None) => false,
        };
        if expires_first {
            if let Some(expires) = expires_at.filter(|expires| now >= *expires) {
                let n_ran = self.n_finished(expires, config);
                self.end(expires, n_ran, Fate::Expired);
            }
        } else if let Some(end) = natural_end.filter(|end| now >= *end) {
            self.end(end, n, Fate::Ran);
        }
    }

    /// Asks for a cancel at `now`: the batch goes `canceling` with the items finished so far. Canceling twice is
    /// a no-op; `false` when the batch has ended already.
    pub fn cancel(&mut self, now: SystemTime, config: &AnthropicConfig) -> bool {
        self.settle(now, config);
        if self.ended.is_some() {
            return false;
        }
        if self.cancel.is_none() {
            self.cancel = Some(Cancel { at: now, n_ran: self.n_finished(now, config) });
            self.settle(now, config);
        }
        true
    }

    /// `processing_status`.
    pub fn processing_status(&self) -> &'static str {
        match (self.ended, self.cancel) {
            (Some(_), _) => "ended",
            (None, Some(_)) => "canceling",
            (None, None) => "in_progress",
        }
    }

    /// Whether its results can no longer be downloaded at `now`.
    pub fn is_archived(&self, now: SystemTime, config: &AnthropicConfig) -> bool {
        self.ended.is_some() && after(self.created_at, config.results_kept_for).is_some_and(|until| now >= until)
    }

    /// The MessageBatch object; `api_base` is the client's base URL (`http://HOST/anthropic`) for `results_url`.
    pub fn to_json(&self, now: SystemTime, config: &AnthropicConfig, api_base: &str) -> Value {
        let n = self.items.len();
        let counts = match self.ended {
            None => json!({ "processing": n, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0 }),
            Some(ended) => {
                let n_rest = n - ended.n_ran;
                json!({
                    "processing": 0,
                    "succeeded": ended.n_succeeded,
                    "errored": ended.n_ran - ended.n_succeeded,
                    "canceled": if ended.rest == Fate::Canceled { n_rest } else { 0 },
                    "expired": if ended.rest == Fate::Expired { n_rest } else { 0 },
                })
            }
        };
        let archived_at = self
            .is_archived(now, config)
            .then(|| after(self.created_at, config.results_kept_for))
            .flatten()
            .map(rfc3339);
        json!({
            "id": self.id,
            "type": "message_batch",
            "processing_status": self.processing_status(),
            "request_counts": counts,
            "ended_at": self.ended.map(|ended| rfc3339(ended.at)),
            "created_at": rfc3339(self.created_at),
            "expires_at": after(self.created_at, config.expires_after).map(rfc3339),
            "archived_at": archived_at,
            "cancel_initiated_at": self.cancel.map(|cancel| rfc3339(cancel.at)),
            "results_url": self.ended.map(|_| format!("{api_base}/v1/messages/batches/{}/results", self.id)),
        })
    }
}

/// Why a list call is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ListError {
    /// `before_id` or `after_id` names no batch.
    UnknownCursor(&'static str),
}

/// One page of the list, newest first.
#[derive(Debug)]
pub(crate) struct Page<'a> {
    /// The batches of the page.
    pub batches: Vec<&'a Batch>,
    /// Whether more batches lie beyond the page in the direction asked.
    pub has_more: bool,
}

/// Every batch not deleted, in create order.
#[derive(Debug, Default)]
pub(crate) struct Batches {
    /// Batches by id.
    by_id: HashMap<String, Batch>,
    /// Ids in create order, oldest first.
    order: Vec<String>,
    /// Batches created since start, deleted ones included.
    n_created: usize,
}

impl Batches {
    /// Stores a new batch created at `now` and returns it.
    pub fn create(&mut self, items: Vec<Item>, now: SystemTime) -> &Batch {
        let id = format!("msgbatch_01{}", &uuid::Uuid::new_v4().simple().to_string()[..22]);
        self.n_created += 1;
        self.order.push(id.clone());
        self.by_id.entry(id.clone()).or_insert_with(|| Batch::new(id, now, items))
    }

    pub fn n_created(&self) -> usize {
        self.n_created
    }

    /// The ids of the batches not deleted, oldest first.
    pub fn ids(&self) -> Vec<String> {
        self.order.clone()
    }

    /// The batch `id`, settled to `now`.
    pub fn get(&mut self, id: &str, now: SystemTime, config: &AnthropicConfig) -> Option<&mut Batch> {
        let batch = self.by_id.get_mut(id)?;
        batch.settle(now, config);
        Some(batch)
    }

    /// Deletes an ended batch: `None` when there is no such batch, `Some(false)` when it has not ended.
    pub fn delete(&mut self, id: &str, now: SystemTime, config: &AnthropicConfig) -> Option<bool> {
        let ended = self.get(id, now, config)?.ended.is_some();
        if ended {
            self.by_id.remove(id);
            self.order.retain(|other| other != id);
        }
        Some(ended)
    }

    /// Marks the first `n_items` items of a batch finished now; `false` when there is no such batch or it has
    /// ended (a canceling batch keeps what it had).
    pub fn finish_items(&mut self, id: &str, n_items: usize, now: SystemTime, config: &AnthropicConfig) -> bool {
        let Some(batch) = self.get(id, now, config) else { return false };
        if batch.ended.is_some() || batch.cancel.is_some() {
            return false;
        }
        batch.n_forced = batch.n_forced.max(n_items);
        batch.settle(now, config);
        true
    }

    /// Requests in batches that have not ended, settled to `now`.
    pub fn n_queued_requests(&mut self, now: SystemTime, config: &AnthropicConfig) -> usize {
        self.by_id
            .values_mut()
            .map(|batch| {
                batch.settle(now, config);
                if batch.ended.is_none() { batch.items.len() } else { 0 }
            })
            .sum()
    }

    /// A page of at most `limit` batches, newest first: the first page, the one right after `after_id` (older
    /// batches) or the one right before `before_id` (newer batches); each settled to `now`.
    pub fn page(
        &mut self,
        before_id: Option<&str>,
        after_id: Option<&str>,
        limit: usize,
        now: SystemTime,
        config: &AnthropicConfig,
    ) -> Result<Page<'_>, ListError> {
        let newest_first: Vec<&String> = self.order.iter().rev().collect();
        let position = |cursor: &str, name: &'static str| {
            newest_first.iter().position(|id| id.as_str() == cursor).ok_or(ListError::UnknownCursor(name))
        };
        let (start, end, has_more) = match (before_id, after_id) {
            (Some(before), _) => {
                let end = position(before, "before_id")?;
                let start = end.saturating_sub(limit);
                (start, end, start > 0)
            }
            (None, Some(after_id)) => {
                let start = position(after_id, "after_id")? + 1;
                let end = (start + limit).min(newest_first.len());
                (start, end, end < newest_first.len())
            }
            (None, None) => {
                let end = limit.min(newest_first.len());
                (0, end, end < newest_first.len())
            }
        };
        let ids: Vec<String> = newest_first[start..end].iter().map(|id| (*id).clone()).collect();
        for id in &ids {
            if let Some(batch) = self.by_id.get_mut(id) {
                batch.settle(now, config);
            }
        }
        let batches = ids.iter().filter_map(|id| self.by_id.get(id)).collect();
        Ok(Page { batches, has_more })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::anthropic::results::run_item;

    const SECOND: Duration = Duration::from_secs(1);

    fn items(n: usize) -> Vec<Item> {
        let params = json!({ "model": "m", "max_tokens": 5, "messages": [{ "role": "user", "content": "hi" }] });
        let params = params.as_object().expect("an object");
        (0..n).map(|i| Item { custom_id: format!("c{i}"), outcome: run_item(&format!("c{i}"), params) }).collect()
    }

    fn settings(processing_secs: u64, expires_secs: u64) -> AnthropicConfig {
        AnthropicConfig {
            processing_for: Duration::from_secs(processing_secs),
            canceling_for: SECOND,
            expires_after: Duration::from_secs(expires_secs),
            ..AnthropicConfig::default()
        }
    }

    #[test]
    fn items_finish_evenly_over_the_processing_time() {
        assert_eq!(items_done(4, Duration::ZERO, 4 * SECOND), 0);
        assert_eq!(items_done(4, SECOND, 4 * SECOND), 1);
        assert_eq!(items_done(4, 3 * SECOND, 4 * SECOND), 3);
        assert_eq!(items_done(4, 5 * SECOND, 4 * SECOND), 4);
        assert_eq!(items_done(4, Duration::ZERO, Duration::ZERO), 4);
    }

    #[test]
    fn a_batch_ends_when_its_last_item_finishes_and_stays_ended() {
        let t0 = SystemTime::UNIX_EPOCH + 1000 * SECOND;
        let mut batch = Batch::new("b".to_owned(), t0, items(4));
        let config = settings(4, 100);
        batch.settle(t0 + 3 * SECOND, &config);
        assert_eq!(batch.processing_status(), "in_progress");
        batch.settle(t0 + 5 * SECOND, &config);
        let ended = batch.ended().expect("ended");
        assert_eq!((ended.at, ended.n_ran, ended.n_succeeded, ended.rest), (t0 + 4 * SECOND, 4, 4, Fate::Ran));
        batch.settle(t0 + 50 * SECOND, &settings(1, 2));
        assert_eq!(batch.ended(), Some(ended), "an end once seen never moves");
    }

    #[test]
    fn a_cancel_keeps_the_finished_items_and_ends_after_canceling_for() {
        let t0 = SystemTime::UNIX_EPOCH + 1000 * SECOND;
        let mut batch = Batch::new("b".to_owned(), t0, items(4));
        let config = settings(4, 100);
        assert!(batch.cancel(t0 + 2 * SECOND, &config));
        assert_eq!(batch.processing_status(), "canceling");
        assert!(batch.cancel(t0 + 2 * SECOND, &config), "a second cancel is a no-op");
        batch.settle(t0 + 2 * SECOND + SECOND / 2, &config);
        assert_eq!(batch.processing_status(), "canceling");
        batch.settle(t0 + 10 * SECOND, &config);
        let ended = batch.ended().expect("ended");
        assert_eq!((ended.at, ended.n_ran, ended.rest), (t0 + 3 * SECOND, 2, Fate::Canceled));
        assert!(!batch.cancel(t0 + 11 * SECOND, &config), "an ended batch cannot be canceled");
    }

    #[test]
    fn a_batch_still_processing_at_expires_at_expires_its_unfinished_items() {
        let t0 = SystemTime::UNIX_EPOCH + 1000 * SECOND;
        let mut batch = Batch::new("b".to_owned(), t0, items(4));
        let config = settings(8, 4);
        batch.settle(t0 + 3 * SECOND, &config);
        assert_eq!(batch.processing_status(), "in_progress");
        batch.settle(t0 + 20 * SECOND, &config);
        let ended = batch.ended().expect("ended");
        assert_eq!((ended.at, ended.n_ran, ended.rest), (t0 + 4 * SECOND, 2, Fate::Expired));
        let json = batch.to_json(t0 + 20 * SECOND, &config, "http://h/anthropic");
        assert_eq!(json["request_counts"], json!({"processing":0,"succeeded":2,"errored":0,"canceled":0,"expired":2}));
        assert_eq!(json["results_url"], "http://h/anthropic/v1/messages/batches/b/results");
    }

    #[test]
    fn request_counts_always_sum_to_the_total() {
        let t0 = SystemTime::UNIX_EPOCH + 1000 * SECOND;
        let sum = |batch: &Batch, now: SystemTime, config: &AnthropicConfig| -> u64 {
            let counts = batch.to_json(now, config, "http://h")["request_counts"].clone();
            ["processing", "succeeded", "errored", "canceled", "expired"]
                .iter()
                .map(|field| counts[field].as_u64().expect("a count"))
                .sum()
        };
        let mut items = items(7);
        items[3].outcome = Outcome::Errored { error_type: "api_error", message: "m".to_owned() };
        for (cancel_at, expires_secs) in [(None, 100), (Some(3), 100), (None, 5), (Some(0), 100)] {
            let config = settings(10, expires_secs);
            let mut batch = Batch::new("b".to_owned(), t0, items.clone());
            for second in 0..=12 {
                let now = t0 + second * SECOND;
                if cancel_at == Some(second) {
                    batch.cancel(now, &config);
                }
                batch.settle(now, &config);
                assert_eq!(sum(&batch, now, &config), 7, "cancel {cancel_at:?}, expiry {expires_secs}, t {second}");
            }
            assert!(batch.ended().is_some());
        }
    }

    #[test]
    fn pages_run_newest_first_with_both_cursors() {
        let mut batches = Batches::default();
        let now = SystemTime::now();
        let config = settings(100, 1000);
        let ids: Vec<String> = (0..5).map(|_| batches.create(items(1), now).id.clone()).collect();
        let page_ids = |page: Page<'_>| -> (Vec<String>, bool) {
            (page.batches.iter().map(|batch| batch.id.clone()).collect(), page.has_more)
        };
        let first = page_ids(batches.page(None, None, 2, now, &config).expect("page"));
        assert_eq!(first, (vec![ids[4].clone(), ids[3].clone()], true));
        let next = page_ids(batches.page(None, Some(&ids[3]), 2, now, &config).expect("page"));
        assert_eq!(next, (vec![ids[2].clone(), ids[1].clone()], true));
        let last = page_ids(batches.page(None, Some(&ids[1]), 2, now, &config).expect("page"));
        assert_eq!(last, (vec![ids[0].clone()], false));
        let back = page_ids(batches.page(Some(&ids[1]), None, 2, now, &config).expect("page"));
        assert_eq!(back, (vec![ids[3].clone(), ids[2].clone()], true));
        let top = page_ids(batches.page(Some(&ids[3]), None, 2, now, &config).expect("page"));
        assert_eq!(top, (vec![ids[4].clone()], false));
        assert_eq!(
            batches.page(None, Some("msgbatch_nope"), 2, now, &config).err(),
            Some(ListError::UnknownCursor("after_id"))
        );
    }
}
