//! A provider kind's registration: everything the daemon, `batchd config check`, the CLI and the dashboard need
//! to know of a kind, exported by the kind's own crate (`batchd_openai::REGISTRATION`, ...), so none of them
//! hard-codes a provider. Adding a kind is one crate and one line in the daemon's registry list.
//!
//! An instance is a kind, a name and settings: each kind has its built-in instance, named after the kind and
//! configured by the section of that name (`[openai]`), and any number of named instances (`[providers.<name>]`),
//! which hand the same [`Registration::build`] another name ([`instance_name`]) and another section.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{Provider, ReplyBudget};

/// What a provider can do, one value per provider: the engine, the CLI and the dashboard read these, never a
/// provider's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// Its API stops a running batch ([`Provider::cancel`]), which then ends with the results it had finished; a
    /// cancelled job's batches are cancelled and waited for (OpenAI, Anthropic). Without it a cancelled job ends
    /// at once and its batches run on, unread (Workers AI).
    pub cancel: bool,
    /// It sends completion events batchd consumes (Workers AI, through a Cloudflare Queue), so with `[events]`
    /// configured a batch's first poll is put off to the events' long fallback interval.
    pub events: bool,
    /// Its API echoes each item's top-level `external_reference` in the item's response itself (Workers AI);
    /// otherwise the engine keeps the references from take-in and puts them on the responses.
    pub echoes_external_reference: bool,
    /// The longest a batch runs at the provider before it expires (OpenAI and Anthropic: 24 h from its creation);
    /// `None` when its docs give none (Workers AI). A job that sets no deadline gets this window plus the settle
    /// wait and a margin (`jobs.default_deadline_secs` unset), so a batch that uses its whole window is collected.
    pub window: Option<Duration>,
}

impl Capabilities {
    /// Each capability by the name the CLI's and the dashboard's JSON give it, with whether the provider has it.
    pub fn named(&self) -> [(&'static str, bool); 3] {
        [
            ("cancel", self.cancel),
            ("events", self.events),
            ("echoes_external_reference", self.echoes_external_reference),
        ]
    }
}

/// What is known of a kind without any settings: its names, how its models are named, what it can do, and what
/// to set to configure it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// The kind's name (`cloudflare`, `openai`, `anthropic`): the routing name and the settings section of its
    /// built-in instance, and the `provider` label of its metrics.
    pub name: &'static str,
    /// What people call it (`Workers AI`, `OpenAI Batch`, `Anthropic Message Batches`).
    pub title: &'static str,
    /// The model names that route a job to it, as shown to people (`@cf/<model>`, `openai/<model>`).
    pub models: &'static [&'static str],
    /// What it can do.
    pub capabilities: Capabilities,
    /// What to set to configure its built-in instance, for the refusal of a job whose model needs it
    /// (`set OPENAI_API_KEY or api_key_file in [openai]`).
    pub configure: &'static str,
}

/// A setting an instance's kind refused: the key inside the instance's section and why. The daemon names the
/// whole key and its environment variable (`openai.max_requests (BATCHD__OPENAI__MAX_REQUESTS): ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingError {
    /// The key inside the section (`max_requests`, `base_url`).
    pub key: &'static str,
    /// Why it was refused, one lowercase sentence without a trailing dot.
    pub why: String,
}

impl SettingError {
    /// `key` refused for `why`.
    pub fn new(key: &'static str, why: impl Into<String>) -> Self {
        Self { key, why: why.into() }
    }
}

/// What checking and building an instance needs from the daemon besides the instance's own settings.
#[derive(Debug, Clone, Default)]
pub struct BuildContext {
    /// How long a claim of a chunk lasts (`schedule.lease_secs`): one request must end well within it, or a slow
    /// request would be taken over by another replica.
    pub lease: Duration,
    /// Bytes of work in flight one process may hold (`workers.inflight_bytes`): a kind bounds what one submit
    /// builds by it.
    pub inflight_bytes: usize,
    /// The memory budget replies and downloads are read within; `None` when only checking the settings.
    pub reply_budget: Option<ReplyBudget>,
}

/// A kind as its crate exports it: what is known without settings ([`Kind`]), and how an instance of it is
/// checked and built from its settings `S` (the crate's own settings type). `P` is the provider it builds, so a
/// kind's background tasks can be started on it.
///
/// `batchd run` and `batchd config check` take one path: [`Registration::check`], then
/// [`Registration::build`] (which `config check` drops), so what the check passes the daemon starts with and
/// what it refuses exits 78 naming the setting. A daemon embedded in-process (tests) only builds.
pub struct Registration<S: 'static, P: Provider + 'static> {
    /// The kind.
    pub kind: Kind,
    /// Checks an instance's settings against the API's limits and the daemon's (a request within a claim's
    /// lease, a base URL that keeps the key private, an account label).
    pub check: fn(&S, &BuildContext) -> Result<(), SettingError>,
    /// Builds an instance's provider (refusing what its client cannot be built from: a URL, a header value).
    pub build: fn(&S, &BuildContext) -> Result<Arc<P>, SettingError>,
}

impl<S: 'static, P: Provider + 'static> Registration<S, P> {
    /// What `batchd run` and `batchd config check` do with an instance's settings: [`Registration::check`], then
    /// [`Registration::build`].
    pub fn check_and_build(&self, settings: &S, context: &BuildContext) -> Result<Arc<P>, SettingError> {
        (self.check)(settings, context)?;
        (self.build)(settings, context)
    }
}

impl<S: 'static, P: Provider + 'static> std::fmt::Debug for Registration<S, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration").field("kind", &self.kind).finish_non_exhaustive()
    }
}

/// Refuses a request timeout that does not end within the lease of a claim (`key` names the timeout).
pub fn check_request_timeout(key: &'static str, timeout: Duration, context: &BuildContext) -> Result<(), SettingError> {
    if timeout.is_zero() || timeout >= context.lease {
        return Err(SettingError::new(
            key,
            format!("must be at least 1 and below schedule.lease_secs ({} s)", context.lease.as_secs()),
        ));
    }
    Ok(())
}

/// `name` as the `&'static str` a provider answers [`Provider::name`] with: each distinct instance name is kept
/// once for the life of the process (a daemon has a handful; `config check` and tests build the same ones again),
/// so building an instance twice never keeps a second copy.
pub fn instance_name(name: &str) -> &'static str {
    /// Every instance name handed out so far.
    static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut names = NAMES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(kept) = names.get(name) {
        return kept;
    }
    let kept: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(kept);
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_name_is_kept_once() {
        let first = instance_name("groq");
        let again = instance_name(&String::from("groq"));
        assert_eq!(first, "groq");
        assert!(std::ptr::eq(first, again), "the same name is not kept twice");
        assert_eq!(instance_name("azure"), "azure");
    }

    #[test]
    fn a_request_must_end_within_the_lease() {
        let context = BuildContext { lease: Duration::from_secs(30), ..BuildContext::default() };
        assert!(check_request_timeout("request_timeout_secs", Duration::from_secs(29), &context).is_ok());
        for refused in [0, 30, 31] {
            let error = check_request_timeout("request_timeout_secs", Duration::from_secs(refused), &context)
                .expect_err("refused");
            assert_eq!(error.key, "request_timeout_secs");
            assert!(error.why.contains("schedule.lease_secs (30 s)"), "{}", error.why);
        }
    }
}
