//! The provider kinds this daemon knows: [`REGISTRY`], one line per kind. Each line pairs the kind's registration
//! (exported by its crate: names, model names, capabilities, check and build) with where its instances' settings
//! come from and the background tasks that run on its provider. The daemon, `batchd config check`, the CLI and
//! the dashboard read this list and the configured instances ([`instances`]), never a provider's name.
//!
//! An instance is a kind's built-in one (its section, `[openai]`, routing name = the kind's name) or a named one
//! (`[providers.<name>]` with `kind = "openai"`, routing name = `<name>`, models `<name>/<model>`).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use batchd_provider::{BuildContext, Kind, Provider, Registration, SettingError};
use batchd_queue::Store;
use futures::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::settings::{ConfigError, InstanceSection, Settings};

/// Every provider kind: adding one is its crate and one line here.
pub static REGISTRY: [&dyn Registered; 4] = [
    // Workers AI's named instances are not built yet: its model catalog, events and `[rate_limits]` tables are read
    // from `[cloudflare]` by its background tasks.
    &Entry {
        registration: &batchd_cloudflare::REGISTRATION,
        settings: Settings::cloudflare_instance,
        named: None,
        tasks: Some(crate::daemon::cloudflare_tasks),
    },
    &Entry {
        registration: &batchd_openai::REGISTRATION,
        settings: Settings::openai_instance,
        named: Some(Settings::openai_named),
        tasks: None,
    },
    &Entry {
        registration: &batchd_anthropic::REGISTRATION,
        settings: Settings::anthropic_instance,
        named: Some(Settings::anthropic_named),
        tasks: None,
    },
    &Entry {
        registration: &batchd_gemini::REGISTRATION,
        settings: Settings::gemini_instance,
        named: Some(Settings::gemini_named),
        tasks: None,
    },
];

/// Every kind, in the registry's order.
pub fn kinds() -> impl Iterator<Item = &'static Kind> {
    REGISTRY.iter().map(|entry| entry.kind())
}

/// The registry line of the kind named `kind` (`openai`), if batchd knows one.
pub fn entry(kind: &str) -> Option<&'static dyn Registered> {
    REGISTRY.iter().copied().find(|entry| entry.kind().name == kind)
}

/// Which instance of a kind: its built-in one, configured by the kind's own section, or a named one.
#[derive(Debug, Clone, Copy)]
pub enum Instance<'s> {
    /// The kind's built-in instance (`[openai]`), routed by the kind's name.
    BuiltIn,
    /// A named instance `[providers.<name>]`, routed by its name.
    Named {
        /// Its name: its routing name and its models' first segment.
        name: &'s str,
        /// Its section.
        section: &'s InstanceSection,
    },
}

impl Instance<'_> {
    /// The full name of the instance's setting `key`: `openai.<key>`, or `providers.<name>.<key>`.
    pub fn setting(&self, kind: &Kind, key: &str) -> String {
        match self {
            Self::BuiltIn => format!("{}.{key}", kind.name),
            Self::Named { name, .. } => format!("providers.{name}.{key}"),
        }
    }

    /// The instance's routing name: the kind's for the built-in one.
    pub fn name<'k>(&'k self, kind: &'k Kind) -> &'k str {
        match self {
            Self::BuiltIn => kind.name,
            Self::Named { name, .. } => name,
        }
    }
}

/// Every instance these settings can have, with its kind's registry line: each kind's built-in instance (in the
/// registry's order, configured or not), then the named instances in name order. A named instance of a kind batchd
/// does not know is refused at load ([`check_named`]) and left out here.
pub fn instances(settings: &Settings) -> Vec<(&'static dyn Registered, Instance<'_>)> {
    let built_in = REGISTRY.iter().map(|entry| (*entry, Instance::BuiltIn));
    let named = settings
        .providers
        .iter()
        .filter_map(|(name, section)| Some((entry(&section.kind)?, Instance::Named { name: name.as_str(), section })));
    built_in.chain(named).collect()
}

/// The kinds of the named instances of the configurations loaded in this process, by instance name, so the
/// dashboard and the CLI can tell what a `<name>/<model>` job's provider can do ([`kind_of`]).
static NAMED_KINDS: RwLock<BTreeMap<String, &'static Kind>> = RwLock::new(BTreeMap::new());

/// Remembers the kinds of `settings`' named instances for [`kind_of`] (at every load of the settings and at the
/// daemon's start).
pub fn remember_instances(settings: &Settings) {
    let mut named = NAMED_KINDS.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    for (name, section) in &settings.providers {
        if let Some(entry) = entry(&section.kind) {
            named.insert(name.clone(), entry.kind());
        }
    }
}

/// The kind that serves `model` (by its routing name, [`batchd_core::ModelName::provider`]): a built-in instance's
/// kind, or a named instance's ([`remember_instances`]); `None` when batchd knows neither.
pub fn kind_of(model: &str) -> Option<&'static Kind> {
    let model = batchd_core::ModelName::parse(model).ok()?;
    let name = model.provider();
    kinds()
        .find(|kind| kind.name == name)
        .or_else(|| NAMED_KINDS.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(name).copied())
}

/// Longest name of a named instance, in bytes.
pub const MAX_INSTANCE_NAME: usize = 32;

/// Checks a named instance's name and kind (at every load): a name of `[a-z][a-z0-9_]{0,31}` (no `__`, no trailing
/// `_`: it is part of its environment variables' names, `BATCHD__PROVIDERS__<NAME>__API_KEY`) that is no kind's
/// name (each is a built-in instance's), and a kind batchd knows that has named instances.
pub fn check_named(name: &str, section: &InstanceSection) -> Result<(), ConfigError> {
    let well_formed = name.len() <= MAX_INSTANCE_NAME
        && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.contains("__")
        && !name.ends_with('_');
    let key = format!("providers.{name}");
    if !well_formed {
        let shown: String = name.chars().take(MAX_INSTANCE_NAME + 1).collect();
        return Err(ConfigError(format!(
            "{key:?}: {shown:?} is not an instance name: 1-{MAX_INSTANCE_NAME} of a-z 0-9 _, starting with a letter, \
             without __ or a trailing _ (it is the models' prefix, <name>/<model>, and part of the environment \
             variables BATCHD__PROVIDERS__<NAME>__...)"
        )));
    }
    if let Some(kind) = kinds().find(|kind| kind.name == name) {
        return Err(ConfigError::at(
            &key,
            format!(
                "{name:?} is the built-in {} instance's name (configured in [{name}]); give the instance another \
                 name",
                kind.title
            ),
        ));
    }
    let known: Vec<&str> = REGISTRY.iter().filter(|entry| entry.names_instances()).map(|e| e.kind().name).collect();
    match entry(&section.kind) {
        Some(entry) if entry.names_instances() => Ok(()),
        Some(entry) => Err(ConfigError::at(
            &format!("{key}.kind"),
            format!(
                "{} has no named instances yet; configure it in [{}] (kinds with named instances: {})",
                entry.kind().title,
                entry.kind().name,
                known.join(", ")
            ),
        )),
        None => Err(ConfigError::at(
            &format!("{key}.kind"),
            format!("{:?} is not a provider kind; one of {}", section.kind, known.join(", ")),
        )),
    }
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

    /// Whether the kind can have named instances (`[providers.<name>]`).
    fn names_instances(&self) -> bool;

    /// Whether the instance is configured (the built-in one: its key or account is given, and a key file that
    /// cannot be read counts as given: `batchd config check` says why it cannot be used; a named one always is).
    fn configured(&self, settings: &Settings, instance: Instance<'_>) -> bool;

    /// Checks the instance's settings and builds its provider, then drops it (`batchd config check`, and `batchd
    /// run` before anything starts); `false` when the instance is not configured.
    fn check(&self, settings: &Settings, instance: Instance<'_>, context: &BuildContext) -> Result<bool, ConfigError>;

    /// Builds the instance's provider for the daemon; `None` when the instance is not configured.
    fn build(
        &self,
        settings: &Settings,
        instance: Instance<'_>,
        context: &BuildContext,
    ) -> Result<Option<Built>, ConfigError>;
}

/// Where a named instance's settings come from: its name and section (key included), as the kind's settings.
pub type NamedSettings<S> = fn(&Settings, &str, &InstanceSection) -> Result<S, ConfigError>;

/// A registry line: the kind's registration, where its instances' settings come from, its background tasks.
struct Entry<S: 'static, P: Provider + 'static> {
    /// The kind's registration, from its crate.
    registration: &'static Registration<S, P>,
    /// The built-in instance's settings, `None` when it is not configured.
    settings: fn(&Settings) -> Result<Option<S>, ConfigError>,
    /// A named instance's settings; `None`: the kind has no named instances.
    named: Option<NamedSettings<S>>,
    /// Its background tasks, if it has any.
    tasks: Option<Tasks<P>>,
}

impl<S: 'static, P: Provider + 'static> Entry<S, P> {
    /// A setting the kind refused, named with its instance's section and environment variable
    /// (`openai.max_requests (BATCHD__OPENAI__MAX_REQUESTS): ...`, `providers.groq.base_url
    /// (BATCHD__PROVIDERS__GROQ__BASE_URL): ...`).
    fn refused(&self, instance: Instance<'_>, error: SettingError) -> ConfigError {
        ConfigError::at(&instance.setting(&self.registration.kind, error.key), error.why)
    }

    /// The instance's settings, `None` when it is not configured.
    fn settings_of(&self, settings: &Settings, instance: Instance<'_>) -> Result<Option<S>, ConfigError> {
        match (instance, self.named) {
            (Instance::BuiltIn, _) => (self.settings)(settings),
            (Instance::Named { name, section }, Some(named)) => named(settings, name, section).map(Some),
            (Instance::Named { name, section }, None) => check_named(name, section).map(|()| None),
        }
    }
}

impl<S: 'static, P: Provider + 'static> Registered for Entry<S, P> {
    fn kind(&self) -> &'static Kind {
        &self.registration.kind
    }

    fn names_instances(&self) -> bool {
        self.named.is_some()
    }

    fn configured(&self, settings: &Settings, instance: Instance<'_>) -> bool {
        match instance {
            Instance::BuiltIn => (self.settings)(settings).map_or(true, |instance| instance.is_some()),
            Instance::Named { .. } => true,
        }
    }

    fn check(&self, settings: &Settings, instance: Instance<'_>, context: &BuildContext) -> Result<bool, ConfigError> {
        let Some(built) = self.settings_of(settings, instance)? else {
            return Ok(false);
        };
        self.registration.check_and_build(&built, context).map_err(|error| self.refused(instance, error))?;
        Ok(true)
    }

    fn build(
        &self,
        settings: &Settings,
        instance: Instance<'_>,
        context: &BuildContext,
    ) -> Result<Option<Built>, ConfigError> {
        let Some(built) = self.settings_of(settings, instance)? else {
            return Ok(None);
        };
        let provider = (self.registration.build)(&built, context).map_err(|error| self.refused(instance, error))?;
        Ok(Some(Built {
            provider: Arc::clone(&provider) as Arc<dyn Provider>,
            tasks: Box::new(KindTasks { provider, tasks: self.tasks }),
        }))
    }
}

/// The refusal of a configuration with no provider: what to set for each kind.
pub fn none_configured() -> ConfigError {
    let ways: Vec<String> = kinds().map(|kind| format!("{} ({})", kind.configure, kind.title)).collect();
    ConfigError(format!(
        "no provider is configured: {}; or a named instance [providers.<name>] with kind = \"openai\" (an \
         OpenAI-compatible API such as Groq or Azure OpenAI), \"anthropic\" or \"gemini\"",
        ways.join("; or ")
    ))
}
