//! Every Redis key batchd uses, built in one place and labelled with its Redis type.
//!
//! All keys of one namespace share the hash tag `{<namespace>}`, so on Redis Cluster they live in one slot and
//! every multi-key script stays legal; several deployments share one Redis by using different namespaces.

use crate::ids::JobId;

/// The consumer group every replica reads the ingress stream through.
pub const CONSUMER_GROUP: &str = "batchd";

/// How long a per-minute stats hash ([`Keys::stats_minute`]) is kept: two hours, so the last hour is always whole.
pub const STATS_MINUTE_TTL_SECS: u64 = 2 * 3600;

/// How long a per-hour stats hash ([`Keys::stats_hour`]) is kept: eight days, so the last week is always whole.
pub const STATS_HOUR_TTL_SECS: u64 = 8 * 86_400;

/// The start of every rate limiter key's hash tag (`{batchd-rate:<account>}`, [`Keys::rate_limit`]), which the
/// ACL files grant (`~{batchd-rate:*`).
pub const RATE_LIMIT_TAG: &str = "batchd-rate";

/// Why a namespace was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("namespace {namespace:?} is invalid: use 1-64 characters of A-Z a-z 0-9 . _ -")]
pub struct InvalidNamespace {
    /// The refused value.
    pub namespace: String,
}

/// Key builder for one namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    /// `{<namespace>}`: the hash-tagged prefix of every key.
    prefix: String,
    /// The namespace as configured.
    namespace: String,
}

impl Keys {
    /// Keys for `namespace` (`[A-Za-z0-9._-]`, 1–64 characters).
    pub fn new(namespace: &str) -> Result<Self, InvalidNamespace> {
        let valid = !namespace.is_empty()
            && namespace.len() <= 64
            && namespace.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !valid {
            return Err(InvalidNamespace { namespace: namespace.to_owned() });
        }
        Ok(Self { prefix: format!("{{{namespace}}}"), namespace: namespace.to_owned() })
    }

    /// The namespace these keys belong to.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The hash-tagged prefix shared by every key, `{<namespace>}`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// STREAM of batch-submit jobs written by producers (field `job`), read through [`CONSUMER_GROUP`].
    pub fn submit(&self) -> String {
        format!("{}:submit", self.prefix)
    }

    /// ZSET of chunks waiting for their next step (submit or poll), member `<job_id>#<chunk>`, score = due time in
    /// Unix milliseconds. A claimed member is re-scored to now + lease, so a crash makes it due again.
    pub fn schedule(&self) -> String {
        format!("{}:schedule", self.prefix)
    }

    /// ZSET of packs waiting for their next step, like [`Keys::schedule`] but read only by releases that know
    /// packs (a replica of an earlier release never takes pack work it cannot read). Member `<pack id>#<chunk>`.
    pub fn packs(&self) -> String {
        format!("{}:packs", self.prefix)
    }

    /// The schedule a job's chunks are in: [`Keys::packs`] for a pack, [`Keys::schedule`] otherwise.
    pub fn schedule_of(&self, job_id: &JobId) -> String {
        if job_id.is_pack() { self.packs() } else { self.schedule() }
    }

    /// ZSET of the chunks waiting to be packed under one packing key (`<model>|<endpoint>`), member
    /// `<job_id>#<chunk>`, score = arrival (Unix ms, Redis's clock): packs fill in arrival order.
    pub fn pack_queue(&self, pack_key: &str) -> String {
        format!("{}:packq:{pack_key}", self.prefix)
    }

    /// ZSET of the packing keys with chunks waiting, score = when their next pack is due (the oldest arrival plus
    /// `packing.window_ms`, sooner when arrivals pause or a pack is full).
    pub fn packers(&self) -> String {
        format!("{}:packers", self.prefix)
    }

    /// HASH of each packing key's open pack (field: the packing key, value: the pack's id), the one its packer
    /// fills until the pack is sent or full.
    pub fn open_packs(&self) -> String {
        format!("{}:packopen", self.prefix)
    }

    /// LIST of a pack's members in item order, each `<n_items>:<job_id>#<chunk>`. Expires with the pack's ledger.
    pub fn pack_members(&self, pack_id: &JobId) -> String {
        format!("{}:packm:{pack_id}", self.prefix)
    }

    /// ZSET of the chunks whose remote batch is unfinished (submitted, not yet done or failed), member
    /// `<job_id>#<chunk>`, score = when the batch was submitted (Unix ms, Redis's clock). Added by the transition
    /// that records a submit, removed by the one that stores the chunk's output or failure; the sampler reads its
    /// first members (the oldest batches) for `batchd_oldest_remote_batch_age_seconds` and removes the few left
    /// behind by a job that ended otherwise (cancelled, expired). No expiry.
    pub fn remote_batches(&self) -> String {
        format!("{}:remote", self.prefix)
    }

    /// HASH: the ledger of one job (state, job body, per-chunk request ids, attempts, timestamps, errors).
    /// Expires `retention.ledger_ttl_secs` after the job finished.
    pub fn job(&self, id: &JobId) -> String {
        format!("{}{}", self.job_prefix(), id)
    }

    /// What every ledger key starts with, `{<namespace>}:job:` (for `SCAN MATCH` over the ledgers).
    pub fn job_prefix(&self) -> String {
        format!("{}:job:", self.prefix)
    }

    /// STREAM of result entries, one per finished job (the default `reply_to`). Trimmed with `MAXLEN ~`.
    pub fn results(&self) -> String {
        format!("{}:results", self.prefix)
    }

    /// STREAM of ingress entries that could not be decoded, with the reason and the original fields.
    pub fn dead(&self) -> String {
        format!("{}:dead", self.prefix)
    }

    /// STRING set to request a job's cancellation (by `batchd cancel` or any service); expires with the ledger TTL.
    pub fn cancel(&self, id: &JobId) -> String {
        format!("{}:cancel:{}", self.prefix, id)
    }

    /// STRING: the schedule member (`<job_id>#<chunk>`) of the chunk a remote batch belongs to, by the batch's
    /// request id; written when the request id is recorded (only with `[events]` on), so a batch event can find
    /// its chunk. Expires with the ledger.
    pub fn request(&self, request_id: &str) -> String {
        format!("{}:request:{}", self.prefix, request_id)
    }

    /// STRING present while intake is paused (`batchd pause`, removed by `batchd resume`): every replica stops
    /// reading new entries from [`Self::submit`] within one read round and finishes the work it already has. The
    /// value says who paused and when, as JSON `{"by":..,"at":<Unix ms>,"reason":..}` (informational only: any
    /// value pauses). No expiry.
    pub fn paused(&self) -> String {
        format!("{}:paused", self.prefix)
    }

    /// STRING: the shared rate limiter's state (GCRA theoretical arrival time, ms) for one bucket,
    /// `<account>:<bucket>` (the provider instance's account label, then the task type, model or `poll:...`):
    /// `{batchd-rate:<account>}:<bucket>`. Not in any namespace: every namespace and replica whose provider
    /// instance has the same account label shares the bucket, as the provider's limit is the account's. Each
    /// account's buckets share their own hash tag, so on Redis Cluster the limiter is a call of its own (one key).
    /// A bucket name without an account is kept whole as the tag.
    pub fn rate_limit(bucket: &str) -> String {
        let (account, bucket) = bucket.split_once(':').unwrap_or((bucket, ""));
        format!("{{{RATE_LIMIT_TAG}:{account}}}:{bucket}")
    }

    /// STRING: the Workers AI model catalog of `account` as batchd last read it (JSON: when it was read and, per
    /// model, its task, whether it takes batch requests and whether it needs the paid plan). Written by whichever
    /// replica refreshes it (hourly), read by the others and by `batchd models`. No expiry: a stale catalog is
    /// better than none, and its age is in it.
    pub fn cloudflare_catalog(&self, account: &str) -> String {
        format!("{}:cf:catalog:{}", self.prefix, account)
    }

    /// ZSET of the Cloudflare models of `account` that batchd has submitted batches for, scored by when a replica
    /// first noted one (Unix ms): the "seen" models `batchd events setup` subscribes besides the configured ones.
    pub fn cloudflare_models_seen(&self, account: &str) -> String {
        format!("{}:cf:models:{}", self.prefix, account)
    }

    /// HASH of the jobs that finished in one minute (`minute` = Unix ms / 60,000, Redis's clock): field
    /// `finished:<status>` counts results published with that status, `tokens:<kind>:<model>` the tokens of
    /// their `usage` (`prompt`, `completion`). Written by the publish itself; expires after
    /// [`STATS_MINUTE_TTL_SECS`]. The dashboard's "finished per minute" reads the last 60 of them.
    pub fn stats_minute(&self, minute: u64) -> String {
        format!("{}:stats:m:{minute}", self.prefix)
    }

    /// HASH with the same fields as [`Self::stats_minute`], for one hour (`hour` = Unix ms / 3,600,000): the sum
    /// of its minutes, each added once it is over (a minute is rolled up about two minutes after it ends, so the
    /// current hour lags by that much); expires after [`STATS_HOUR_TTL_SECS`]. The dashboard's "last day" reads
    /// the last 24 of them.
    pub fn stats_hour(&self, hour: u64) -> String {
        format!("{}:stats:h:{hour}", self.prefix)
    }

    /// HASH of how long each model's remote batches took in one hour (`hour` = Unix ms / 3,600,000), from the
    /// job's acceptance to the remote batch's completion: field `<model>:<bucket bound>` counts batches
    /// ([`crate::turnaround`]). Each replica adds what it saw every admin sample; expires
    /// [`STATS_HOUR_TTL_SECS`] after its last write. `batchd status` and the dashboard read the last 24.
    pub fn stats_turnaround(&self, hour: u64) -> String {
        format!("{}:stats:turnaround:{hour}", self.prefix)
    }

    /// STRING: the last minute (as in [`Self::stats_minute`]) whose counters were added to its hour's.
    pub fn stats_rolled(&self) -> String {
        format!("{}:stats:rolled", self.prefix)
    }

    /// Whether `key` is a results stream a job may name in `reply_to`: the default results stream or
    /// `<results>:<suffix>` with a suffix of `[A-Za-z0-9._:-]`.
    pub fn is_results_stream(&self, key: &str) -> bool {
        let results = self.results();
        match key.strip_prefix(results.as_str()) {
            Some("") => true,
            Some(rest) => rest.strip_prefix(':').is_some_and(|suffix| {
                !suffix.is_empty()
                    && suffix.len() <= 200
                    && suffix.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))
            }),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Golden: the key layout is part of the wire format other services rely on.
    #[test]
    fn key_layout_is_stable() {
        let keys = Keys::new("batchd").unwrap();
        let id = JobId::parse("inv-42").unwrap();
        assert_eq!(keys.submit(), "{batchd}:submit");
        assert_eq!(keys.schedule(), "{batchd}:schedule");
        assert_eq!(keys.remote_batches(), "{batchd}:remote");
        assert_eq!(keys.job(&id), "{batchd}:job:inv-42");
        assert_eq!(keys.results(), "{batchd}:results");
        assert_eq!(keys.dead(), "{batchd}:dead");
        assert_eq!(keys.cancel(&id), "{batchd}:cancel:inv-42");
        assert_eq!(keys.paused(), "{batchd}:paused");
        assert_eq!(Keys::rate_limit("acct:embeddings"), "{batchd-rate:acct}:embeddings");
        assert_eq!(Keys::rate_limit("acct:poll:embeddings"), "{batchd-rate:acct}:poll:embeddings");
        assert_eq!(Keys::rate_limit("openai"), "{batchd-rate:openai}:", "no account: the whole name is the tag");
        assert_eq!(keys.stats_minute(29_000_000), "{batchd}:stats:m:29000000");
        assert_eq!(keys.stats_hour(483_000), "{batchd}:stats:h:483000");
        assert_eq!(keys.stats_turnaround(483_000), "{batchd}:stats:turnaround:483000");
        assert_eq!(keys.cloudflare_catalog("acct"), "{batchd}:cf:catalog:acct");
        assert_eq!(keys.cloudflare_models_seen("acct"), "{batchd}:cf:models:acct");
        assert_eq!(CONSUMER_GROUP, "batchd");
    }

    #[test]
    fn namespaces_are_checked() {
        assert!(Keys::new("team-a.prod_1").is_ok());
        for bad in ["", "a b", "{x}", "a:b", &"x".repeat(65)] {
            assert!(Keys::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reply_to_must_stay_inside_the_namespace() {
        let keys = Keys::new("batchd").unwrap();
        assert!(keys.is_results_stream("{batchd}:results"));
        assert!(keys.is_results_stream("{batchd}:results:billing"));
        assert!(!keys.is_results_stream("{batchd}:resultsx"));
        assert!(!keys.is_results_stream("{batchd}:results:"));
        assert!(!keys.is_results_stream("{other}:results"));
        assert!(!keys.is_results_stream("{batchd}:job:x"));
        assert!(!keys.is_results_stream("{batchd}:results:a b"));
    }
}
