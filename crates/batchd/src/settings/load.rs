//! Loading: the layers (built-in defaults, an optional file, `BATCHD__SECTION__KEY` variables, then
//! `CLOUDFLARE_ACCOUNT_ID`, `CLOUDFLARE_API_TOKEN`, `OPENAI_API_KEY`, `ANTHROPIC_API_KEY` and `REDIS_URL`) merged
//! into `Settings`, then checked; lists (`ENV_LISTS`) come comma-separated from the environment. Errors name the key
//! and its environment variables, list the valid keys or values, and keep a TOML error's lines.

use std::cell::Cell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{Error as _, Visitor};

use super::secrets::refuse_token_in_file;
use super::{CONVENTIONAL_ENV, ConfigError, DEFAULTS, ENV_LISTS, LogFormat, RedisMode, Settings, env_var, key_label};

impl Settings {
    /// Loads the layers, reading the process environment.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, &std::env::vars().collect())
    }

    /// Loads the layers with `env` standing for the process environment (for tests).
    pub fn load_from(file: Option<&Path>, env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let mut builder =
            config::Config::builder().add_source(config::File::from_str(DEFAULTS, config::FileFormat::Toml));
        if let Some(file) = file {
            if !file.exists() {
                return Err(ConfigError(format!("config file {} does not exist", file.display())));
            }
            refuse_token_in_file(file)?;
            builder = builder.add_source(config::File::from(PathBuf::from(file)).format(config::FileFormat::Toml));
        }
        let mut batchd_env: HashMap<String, String> =
            env.iter().filter(|(name, _)| name.starts_with("BATCHD__")).map(|(k, v)| (k.clone(), v.clone())).collect();
        // Lists come comma-separated; they are split here rather than by the config crate, which would read a
        // lone `123` as a number and an empty value as one empty item.
        // A named instance's endpoint list too (`BATCHD__PROVIDERS__GROQ__ENDPOINTS`).
        let named_lists: Vec<String> = batchd_env
            .keys()
            .filter_map(|name| {
                let instance = name.strip_prefix("BATCHD__PROVIDERS__")?.strip_suffix("__ENDPOINTS")?;
                Some(format!("providers.{}.endpoints", instance.to_ascii_lowercase()))
            })
            .collect();
        let list_keys = ENV_LISTS.iter().map(|key| (*key).to_owned()).chain(named_lists);
        let lists: Vec<(String, Vec<String>)> = list_keys
            .filter_map(|key| {
                let items = split_list(&batchd_env.remove(&env_var(&key)?)?);
                Some((key, items))
            })
            .collect();
        builder = builder.add_source(
            config::Environment::with_prefix("BATCHD")
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true)
                .source(Some(batchd_env.clone())),
        );
        for (key, items) in lists {
            builder =
                builder.set_override(&key, items).map_err(|e| ConfigError::at(&key, describe_config_error(&e)))?;
        }
        for (conventional, key, own) in CONVENTIONAL_ENV {
            if let (Some(value), false) = (env.get(conventional), env.contains_key(own)) {
                builder = builder
                    .set_override(key, value.clone())
                    .map_err(|e| ConfigError::at(key, describe_config_error(&e)))?;
            }
        }
        let mut settings: Settings =
            builder.build().and_then(|config| config.try_deserialize()).map_err(|error| match (&error, file) {
                // The config crate shows the file's path relative to the working directory; say it as given.
                (config::ConfigError::FileParse { cause, .. }, Some(file)) => {
                    ConfigError(format!("{}: {}", file.display(), cause.to_string().trim_end()))
                }
                _ => ConfigError(describe_config_error(&error)),
            })?;
        settings.use_systemd_credential(env);
        settings.check()?;
        crate::registry::remember_instances(&settings);
        Ok(settings)
    }
}

/// A comma-separated list from the environment: items trimmed, empty ones dropped (so an empty value is an empty
/// list).
fn split_list(value: &str) -> Vec<String> {
    value.split(',').map(str::trim).filter(|item| !item.is_empty()).map(str::to_owned).collect()
}

/// A configuration error of the `config` crate (or of deserialising the settings) as batchd says it: the key with
/// the environment variables that set it ([`key_label`]), what was expected, and where the value came from; an
/// unknown key with the section's valid keys; a value of an enum with the valid values; a TOML syntax error with
/// its file and its lines (the snippet that points at the mistake is kept).
pub fn describe_config_error(error: &config::ConfigError) -> String {
    describe(error, None, None)
}

fn describe(error: &config::ConfigError, key: Option<&str>, origin: Option<&str>) -> String {
    use config::ConfigError as E;
    let place = |origin: Option<&str>| origin.map(|origin| format!(" (in {origin})")).unwrap_or_default();
    match error {
        E::Type { origin: own, unexpected, expected, key: own_key } => {
            let key = own_key.as_deref().or(key).unwrap_or("?");
            format!("{}: expected {expected}, got {unexpected}{}", key_label(key), place(own.as_deref().or(origin)))
        }
        E::At { error, origin: own, key: own_key } => {
            describe(error, own_key.as_deref().or(key), own.as_deref().or(origin))
        }
        E::FileParse { uri, cause } => {
            format!("{}: {}", uri.as_deref().unwrap_or("the config file"), cause.to_string().trim_end())
        }
        E::Message(message) => describe_message(message, key, origin),
        E::NotFound(name) => {
            let full = key.map_or_else(|| name.clone(), |key| format!("{key}.{name}"));
            format!("{}: missing{}", key_label(&full), place(origin))
        }
        other => match key {
            Some(key) => format!("{}: {other}{}", key_label(key), place(origin)),
            None => other.to_string(),
        },
    }
}

/// Serde's messages that name no key of their own: an unknown field, an unknown enum value.
pub(super) fn describe_message(message: &str, key: Option<&str>, origin: Option<&str>) -> String {
    let place = origin.map(|origin| format!(" (in {origin})")).unwrap_or_default();
    if let Some(rest) = message.strip_prefix("enum ")
        && let Some((type_name, value)) = rest.split_once(" does not have variant constructor ")
    {
        let label = key_label(key.unwrap_or("?"));
        return match enum_values(type_name) {
            Some(values) => format!("{label}: {value:?} is not one of {}{place}", values.join(", ")),
            None => format!("{label}: {value:?} is not a valid value{place}"),
        };
    }
    if let Some(rest) = message.strip_prefix("unknown field `")
        && let Some((name, expected)) = rest.split_once('`')
    {
        let full = key.map_or_else(|| name.to_owned(), |key| format!("{key}.{name}"));
        let section = key.map_or_else(|| "the top level".to_owned(), |key| format!("[{key}]"));
        let valid = expected.trim_start_matches(", ").strip_prefix("expected one of ").unwrap_or(expected);
        let valid = valid.strip_prefix("expected ").unwrap_or(valid).replace('`', "");
        return format!("{}: no such key{place}; {section} has {valid}", key_label(&full));
    }
    match key {
        Some(key) => format!("{}: {message}{place}", key_label(key)),
        None => format!("{message}{place}"),
    }
}

/// The valid values of the settings' enums, by type name (as the `config` crate names them in its error), read
/// from the types themselves so a new variant is listed without a change here.
fn enum_values(type_name: &str) -> Option<&'static [&'static str]> {
    match type_name {
        "RedisMode" => Some(variants::<RedisMode>()),
        "LogFormat" => Some(variants::<LogFormat>()),
        "TaskType" => Some(variants::<super::TaskType>()),
        _ => None,
    }
}

/// The names serde gives the variants of enum `T`: its derived `Deserialize` hands them to `deserialize_enum`,
/// which [`Variants`] records and then refuses.
fn variants<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    let found = Cell::new(&[][..]);
    let _ = T::deserialize(Variants(&found));
    found.get()
}

/// A deserializer that only records the variant names it is asked for.
struct Variants<'a>(&'a Cell<&'static [&'static str]>);

impl<'de> serde::Deserializer<'de> for Variants<'_> {
    type Error = serde::de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        Err(Self::Error::custom("not an enum"))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.set(variants);
        Err(Self::Error::custom("recorded"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::LogFormat;
    use crate::settings::test_env as env;

    #[test]
    fn defaults_load_and_are_sane() {
        let settings = Settings::load_from(None, &env(&[])).unwrap();
        assert_eq!(settings.redis.namespace, "batchd");
        assert_eq!(settings.jobs.default_deadline_secs, 0, "per provider");
        assert_eq!(settings.log.format, LogFormat::Text);
    }

    #[test]
    fn environment_overrides_in_order() {
        let settings = Settings::load_from(
            None,
            &env(&[
                ("BATCHD__POLL__MAX_INTERVAL_MS", "5000"),
                ("REDIS_URL", "redis://10.0.0.1:6379"),
                ("CLOUDFLARE_ACCOUNT_ID", "acct"),
                ("BATCHD__CLOUDFLARE__ACCOUNT_ID", "wins"),
                ("CLOUDFLARE_API_TOKEN", "tok-123"),
            ]),
        )
        .unwrap();
        assert_eq!(settings.poll.max_interval_ms, 5000);
        assert_eq!(settings.redis.url.expose(), "redis://10.0.0.1:6379");
        assert_eq!(settings.cloudflare.account_id, "wins");
        assert_eq!(settings.api_token().unwrap().expose(), "tok-123");
        assert!(!format!("{settings:?}").contains("tok-123"));
    }

    #[test]
    fn lists_come_comma_separated_from_the_environment() {
        let settings = Settings::load_from(
            None,
            &env(&[
                ("BATCHD__REDIS__MODE", "cluster"),
                ("BATCHD__REDIS__NODES", "redis://10.0.0.1:6379, redis://10.0.0.2:6379,"),
                ("BATCHD__REDIS__EXTRA_NAMESPACES", "billing,search"),
            ]),
        )
        .unwrap();
        let nodes: Vec<&str> = settings.redis.nodes.iter().map(|node| node.expose()).collect();
        assert_eq!(nodes, ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"], "trimmed, the empty item dropped");
        assert_eq!(settings.redis.extra_namespaces, ["billing", "search"]);
        // One item, even one that looks like a number; an empty value is an empty list.
        let one = Settings::load_from(None, &env(&[("BATCHD__REDIS__EXTRA_NAMESPACES", "2024")])).unwrap();
        assert_eq!(one.redis.extra_namespaces, ["2024"]);
        let none = Settings::load_from(None, &env(&[("BATCHD__REDIS__EXTRA_NAMESPACES", "")])).unwrap();
        assert!(none.redis.extra_namespaces.is_empty());
        // Each item is checked like one from a file.
        let err = Settings::load_from(None, &env(&[("BATCHD__REDIS__EXTRA_NAMESPACES", "ok,not ok")])).unwrap_err();
        assert!(
            err.to_string().starts_with("configuration: redis.extra_namespaces (BATCHD__REDIS__EXTRA_NAMESPACES): ")
        );
        let err = Settings::load_from(None, &env(&[("BATCHD__REDIS__NODES", "redis://a:1,http://b")])).unwrap_err();
        assert!(
            err.to_string().contains("redis.nodes (BATCHD__REDIS__NODES): \"http://b\" is not a Redis URL"),
            "{err}"
        );
    }

    #[test]
    fn every_key_is_named_with_its_environment_variables() {
        use crate::settings::key_label;
        assert_eq!(key_label("redis.url"), "redis.url (REDIS_URL or BATCHD__REDIS__URL)");
        assert_eq!(key_label("poll.jitter"), "poll.jitter (BATCHD__POLL__JITTER)");
        assert_eq!(key_label("rate_limits.models[0].limit"), "rate_limits.models[0].limit");
        assert_eq!(variants::<crate::settings::RedisMode>(), ["standalone", "cluster", "sentinel"]);
        assert_eq!(
            ConfigError::keyed("log.level: invalid filter directive".into()).to_string(),
            "configuration: log.level (BATCHD__LOG__LEVEL): invalid filter directive"
        );
        assert_eq!(ConfigError::keyed("RUST_LOG: bad".into()).to_string(), "configuration: RUST_LOG: bad");
    }

    #[test]
    fn bad_values_name_their_key() {
        let err = Settings::load_from(None, &env(&[("BATCHD__POLL__MAX_INTERVAL_MS", "soon")])).unwrap_err();
        assert!(err.to_string().contains("poll.max_interval_ms"), "{err}");
        let err = Settings::load_from(None, &env(&[("BATCHD__POLL__TYPO", "1")])).unwrap_err();
        assert!(err.to_string().contains("typo"), "{err}");
        let err = Settings::load_from(None, &env(&[("BATCHD__REDIS__NAMESPACE", "a b")])).unwrap_err();
        assert!(err.to_string().contains("redis.namespace"), "{err}");
        let err = Settings::load_from(None, &env(&[("BATCHD__WORKERS__RUNTIME_THREADS", "5000")])).unwrap_err();
        assert!(err.to_string().contains("workers.runtime_threads"), "{err}");
        let one = Settings::load_from(None, &env(&[("BATCHD__WORKERS__RUNTIME_THREADS", "1")])).unwrap();
        assert_eq!(one.workers.runtime_threads, 1);
        let err = Settings::load_from(Some(Path::new("/nonexistent/batchd.toml")), &env(&[])).unwrap_err();
        assert_eq!(err.to_string(), "configuration: config file /nonexistent/batchd.toml does not exist");
    }
}
