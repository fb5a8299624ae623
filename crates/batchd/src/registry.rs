//! The provider kinds this daemon knows: [`REGISTRY`], one line per kind. Each line pairs the kind's registration
//! (exported by its crate: names, model names, capabilities, check and build) with where its instance's settings
//! come from and the background tasks that run on its provider. The daemon, `batchd config check`, the CLI and
//! the dashboard read this list, never a provider's name.

use std::sync::Arc;

use batchd_provider::{BuildContext, Kind, Provider, Registration, SettingError};
use batchd_queue::Store;
use futures::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::settings::{ConfigError, Settings};

/// Every provider kind: adding one is its crate and one line here.
pub static REGISTRY: [&dyn Registered; 4] = [
    &Entry {
        registration: &batchd_cloudflare::REGISTRATION,
        settings: Settings::cloudflare_instance,
        tasks: Some(crate::daemon::cloudflare_tasks),
    },
    &Entry { registration: &batchd_openai::REGISTRATION, settings: Settings::openai_instance, tasks: None },
    &Entry { registration: &batchd_anthropic::REGISTRATION, settings: Settings::anthropic_instance, tasks: None },
    &Entry { registration: &batchd_gemini::REGISTRATION, settings: Settings::gemini_instance, tasks: None },
];

/// Every kind, in the registry's order.
pub fn kinds() -> impl Iterator<Item = &'static Kind> {
    REGISTRY.iter().map(|entry| entry.kind())
}

/// The kind that serves `model` (by its routing name, [`batchd_core::ModelName::provider`]), if batchd knows one.
pub fn kind_of(model: &str) -> Option<&'static Kind> {
    let model = batchd_core::ModelName::parse(model).ok()?;
    kinds().find(|kind| kind.name == model.provider())
}

/// A kind as the CLI's and the dashboard's JSON show it: `{"kind","title","models","capabilities":{..}}`.
pub fn kind_json(kind: &Kind) -> serde_json::Value {
    let capabilities: serde_json::Map<String, serde_json::Value> =
        kind.capabilities.named().iter().map(|(name, has)| ((*name).to_owned(), (*has).into())).collect();
    serde_json::json!({"kind": kind.name, "title": kind.title, "models": kind.models, "capabilities": capabilities})
}

/// What a configured instance's background tasks get from the daemon.
#[derive(Debug)]
pub struct TaskContext<'a> {
    /// The daemon's settings.
    pub settings: &'a Settings,
    /// The storage of every namespace the daemon serves, `redis.namespace` first.
    pub stores: &'a [Store],
    /// Where long-running tasks are handed to the daemon, which stops them last (after the drain).
    pub background: &'a mut Vec<JoinHandle<()>>,
    /// Stops the background tasks.
    pub background_stop: &'a CancellationToken,
    /// Stops the fetchers, first thing at shutdown (tasks that feed the workers stop with them).
    pub fetch_stop: &'a CancellationToken,
}

/// A kind's background tasks, started on its provider before the workers: awaited (what must be done before jobs
/// are taken in, like the first catalog read) and handed over ([`TaskContext::background`]).
pub type Tasks<P> = for<'a> fn(Arc<P>, TaskContext<'a>) -> BoxFuture<'a, anyhow::Result<()>>;

/// A configured instance, built.
pub struct Built {
    /// Its provider.
    pub provider: Arc<dyn Provider>,
    /// Its background tasks, to start.
    pub tasks: Box<dyn StartTasks>,
}

impl std::fmt::Debug for Built {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Built").field("provider", &self.provider).finish_non_exhaustive()
    }
}

/// A built instance's background tasks, not started yet.
pub trait StartTasks: Send {
    /// Starts them (see [`Tasks`]).
    fn start<'a>(self: Box<Self>, context: TaskContext<'a>) -> BoxFuture<'a, anyhow::Result<()>>;
}

/// A kind's tasks on its provider.
struct KindTasks<P: Provider + 'static> {
    /// The provider they run on.
    provider: Arc<P>,
    /// The kind's tasks, if it has any.
    tasks: Option<Tasks<P>>,
}

impl<P: Provider + 'static> StartTasks for KindTasks<P> {
    fn start<'a>(self: Box<Self>, context: TaskContext<'a>) -> BoxFuture<'a, anyhow::Result<()>> {
        match self.tasks {
            Some(tasks) => tasks(self.provider, context),
            None => Box::pin(async { Ok(()) }),
        }
    }
}

/// A registry line, whatever its kind's settings and provider types.
pub trait Registered: Sync {
    /// The kind.
    fn kind(&self) -> &'static Kind;

    /// Whether the instance is configured (its key or account is given; a key file that cannot be read counts as
    /// given: `batchd config check` says why it cannot be used).
    fn configured(&self, settings: &Settings) -> bool;

    /// Checks the instance's settings and builds its provider, then drops it (`batchd config check`, and `batchd
    /// run` before anything starts); `false` when the instance is not configured.
    fn check(&self, settings: &Settings, context: &BuildContext) -> Result<bool, ConfigError>;

    /// Builds the instance's provider for the daemon; `None` when the instance is not configured.
    fn build(&self, settings: &Settings, context: &BuildContext) -> Result<Option<Built>, ConfigError>;
}

/// A registry line: the kind's registration, where its settings come from, its background tasks.
struct Entry<S: 'static, P: Provider + 'static> {
    /// The kind's registration, from its crate.
    registration: &'static Registration<S, P>,
    /// The instance's settings, `None` when it is not configured.
    settings: fn(&Settings) -> Result<Option<S>, ConfigError>,
    /// Its background tasks, if it has any.
    tasks: Option<Tasks<P>>,
}

impl<S: 'static, P: Provider + 'static> Entry<S, P> {
    /// A setting the kind refused, named with its section and environment variable
    /// (`openai.max_requests (BATCHD__OPENAI__MAX_REQUESTS): ...`).
    fn refused(&self, error: SettingError) -> ConfigError {
        ConfigError::at(&format!("{}.{}", self.registration.kind.name, error.key), error.why)
    }
}

impl<S: 'static, P: Provider + 'static> Registered for Entry<S, P> {
    fn kind(&self) -> &'static Kind {
        &self.registration.kind
    }

    fn configured(&self, settings: &Settings) -> bool {
        (self.settings)(settings).map_or(true, |instance| instance.is_some())
    }

    fn check(&self, settings: &Settings, context: &BuildContext) -> Result<bool, ConfigError> {
        let Some(instance) = (self.settings)(settings)? else {
            return Ok(false);
        };
        self.registration.check_and_build(&instance, context).map_err(|error| self.refused(error))?;
        Ok(true)
    }

    fn build(&self, settings: &Settings, context: &BuildContext) -> Result<Option<Built>, ConfigError> {
        let Some(instance) = (self.settings)(settings)? else {
            return Ok(None);
        };
        let provider = (self.registration.build)(&instance, context).map_err(|error| self.refused(error))?;
        Ok(Some(Built {
            provider: Arc::clone(&provider) as Arc<dyn Provider>,
            tasks: Box::new(KindTasks { provider, tasks: self.tasks }),
        }))
    }
}

/// The refusal of a configuration with no provider: what to set for each kind.
pub fn none_configured() -> ConfigError {
    let ways: Vec<String> = kinds().map(|kind| format!("{} ({})", kind.configure, kind.title)).collect();
    ConfigError(format!("no provider is configured: {}", ways.join("; or ")))
}
