//! Loading: the layers (built-in defaults, an optional file, `BATCHD__SECTION__KEY` variables, then
//! `CLOUDFLARE_ACCOUNT_ID`, `CLOUDFLARE_API_TOKEN`, `OPENAI_API_KEY`, `ANTHROPIC_API_KEY` and `REDIS_URL`) merged
//! into `Settings`, then checked.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::secrets::refuse_token_in_file;
use super::{ConfigError, DEFAULTS, Settings};

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
        let batchd_env: HashMap<String, String> =
            env.iter().filter(|(name, _)| name.starts_with("BATCHD__")).map(|(k, v)| (k.clone(), v.clone())).collect();
        builder = builder.add_source(
            config::Environment::with_prefix("BATCHD")
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true)
                .source(Some(batchd_env.clone())),
        );
        for (conventional, key, own) in [
            ("CLOUDFLARE_ACCOUNT_ID", "cloudflare.account_id", "BATCHD__CLOUDFLARE__ACCOUNT_ID"),
            ("CLOUDFLARE_API_TOKEN", "cloudflare.api_token", "BATCHD__CLOUDFLARE__API_TOKEN"),
            ("OPENAI_API_KEY", "openai.api_key", "BATCHD__OPENAI__API_KEY"),
            ("REDIS_URL", "redis.url", "BATCHD__REDIS__URL"),
            ("ANTHROPIC_API_KEY", "anthropic.api_key", "BATCHD__ANTHROPIC__API_KEY"),
        ] {
            if let (Some(value), false) = (env.get(conventional), batchd_env.contains_key(own)) {
                builder = builder
                    .set_override(key, value.clone())
                    .map_err(|e| ConfigError(format!("{conventional}: {e}")))?;
            }
        }
        let mut settings: Settings =
            builder.build().and_then(|config| config.try_deserialize()).map_err(|e| ConfigError(e.to_string()))?;
        settings.use_systemd_credential(env);
        settings.check()?;
        Ok(settings)
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
        assert_eq!(settings.jobs.default_deadline_secs, 86_400);
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
