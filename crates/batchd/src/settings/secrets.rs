//! Secrets: the `Secret` type that never prints its value, and where the API tokens come from (the environment,
//! a token file or a systemd credential, never a config file).

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{
    ANTHROPIC_KEY_CREDENTIAL, ConfigError, GEMINI_KEY_CREDENTIAL, OPENAI_KEY_CREDENTIAL, Settings, TOKEN_CREDENTIAL,
};

/// A string that never appears in `Debug` output (tokens, URLs that may carry passwords).
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret text; call only where it is used.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl Serialize for Secret {
    /// Secrets serialise as `[redacted]` (for `batchd config check`), never as their value.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("[redacted]")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl Settings {
    /// The API token from the environment or `api_token_file`. Only the daemon needs it.
    pub fn api_token(&self) -> Result<Secret, ConfigError> {
        if let Some(token) = self.cloudflare.api_token.as_ref().filter(|token| !token.expose().is_empty()) {
            return Ok(token.clone());
        }
        secret_file("cloudflare.api_token_file", &self.cloudflare.api_token_file)?.ok_or_else(|| {
            ConfigError::at(
                "cloudflare.api_token",
                "not set; set it, or cloudflare.api_token_file (BATCHD__CLOUDFLARE__API_TOKEN_FILE)",
            )
        })
    }

    /// The queue's own token for `[events]` (from the environment or `events.api_token_file`); `None` when the
    /// Workers AI API token is to be used.
    pub fn events_token(&self) -> Result<Option<Secret>, ConfigError> {
        if let Some(token) = self.events.api_token.as_ref().filter(|token| !token.expose().is_empty()) {
            return Ok(Some(token.clone()));
        }
        secret_file("events.api_token_file", &self.events.api_token_file)
    }

    /// The Anthropic API key from `ANTHROPIC_API_KEY` (or `BATCHD__ANTHROPIC__API_KEY`) or
    /// `anthropic.api_key_file`; `None` when neither is set (Anthropic is then not configured).
    pub fn anthropic_key(&self) -> Result<Option<Secret>, ConfigError> {
        if let Some(key) = self.anthropic.api_key.as_ref().filter(|key| !key.expose().is_empty()) {
            return Ok(Some(key.clone()));
        }
        secret_file("anthropic.api_key_file", &self.anthropic.api_key_file)
    }

    /// The Gemini API key from `GEMINI_API_KEY` (or `BATCHD__GEMINI__API_KEY`) or `gemini.api_key_file`; `None`
    /// when neither is set (Gemini is then not configured).
    pub fn gemini_key(&self) -> Result<Option<Secret>, ConfigError> {
        if let Some(key) = self.gemini.api_key.as_ref().filter(|key| !key.expose().trim().is_empty()) {
            return Ok(Some(Secret::new(key.expose().trim())));
        }
        secret_file("gemini.api_key_file", &self.gemini.api_key_file)
    }

    /// The OpenAI API key from the environment or `openai.api_key_file`; `None` when neither gives one (the
    /// OpenAI provider is then not configured).
    pub fn openai_api_key(&self) -> Result<Option<Secret>, ConfigError> {
        if let Some(key) = self.openai.api_key.as_ref().filter(|key| !key.expose().trim().is_empty()) {
            return Ok(Some(Secret::new(key.expose().trim())));
        }
        secret_file("openai.api_key_file", &self.openai.api_key_file)
    }

    /// Points each provider's key file at its credential in `$CREDENTIALS_DIRECTORY` (systemd's `LoadCredential=`
    /// sets it; the Kubernetes manifests set it to where the Secrets are mounted) when the key is given no other
    /// way and the credential exists: `cloudflare-api-token`, `openai-api-key`, `anthropic-api-key`,
    /// `gemini-api-key`, and `<name>-api-key` for a named instance `[providers.<name>]`.
    pub(super) fn use_systemd_credential(&mut self, env: &HashMap<String, String>) {
        let Some(dir) = env.get("CREDENTIALS_DIRECTORY").filter(|dir| !dir.is_empty()) else {
            return;
        };
        let given =
            |key: &Option<Secret>, file: &str| key.as_ref().is_some_and(|k| !k.expose().is_empty()) || !file.is_empty();
        let credential = |name: &str| {
            let file = Path::new(dir).join(name);
            file.exists().then(|| file.display().to_string())
        };
        // An optional provider's credential may be present but empty: the unit's `SetCredential=<name>:` fallback
        // for a key file that is not installed. Empty means "not configured", not an error.
        let optional = |name: &str| {
            credential(name).filter(|file| std::fs::read_to_string(file).is_ok_and(|key| !key.trim().is_empty()))
        };
        if !given(&self.cloudflare.api_token, &self.cloudflare.api_token_file)
            && let Some(file) = credential(TOKEN_CREDENTIAL)
        {
            self.cloudflare.api_token_file = file;
        }
        if !given(&self.openai.api_key, &self.openai.api_key_file)
            && let Some(file) = optional(OPENAI_KEY_CREDENTIAL)
        {
            self.openai.api_key_file = file;
        }
        if !given(&self.anthropic.api_key, &self.anthropic.api_key_file)
            && let Some(file) = optional(ANTHROPIC_KEY_CREDENTIAL)
        {
            self.anthropic.api_key_file = file;
        }
        if !given(&self.gemini.api_key, &self.gemini.api_key_file)
            && let Some(file) = optional(GEMINI_KEY_CREDENTIAL)
        {
            self.gemini.api_key_file = file;
        }
        // A named instance's: `<name>-api-key` (no kind's name can be an instance's, so none clashes).
        for (name, section) in &mut self.providers {
            let file_given =
                section.settings.get("api_key_file").and_then(toml::Value::as_str).is_some_and(|f| !f.is_empty());
            if !given(&section.api_key, if file_given { "given" } else { "" })
                && let Some(file) = optional(&format!("{name}-api-key"))
            {
                section.settings.insert("api_key_file".to_owned(), toml::Value::String(file));
            }
        }
    }
}

/// The secret in `file`, trimmed; `None` when no file is named (`file` empty), an error at `field` when the file
/// cannot be read or holds nothing but whitespace.
pub(super) fn secret_file(field: &str, file: &str) -> Result<Option<Secret>, ConfigError> {
    if file.is_empty() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(file).map_err(|e| ConfigError::at(field, format!("cannot read {file}: {e}")))?;
    match text.trim() {
        "" => Err(ConfigError::at(field, format!("{file} is empty"))),
        secret => Ok(Some(Secret::new(secret))),
    }
}

/// Refuses a config file that sets `cloudflare.api_token`: a config file is often world-readable and checked in;
/// the token comes from the environment, `cloudflare.api_token_file` or a systemd credential.
pub(super) fn refuse_token_in_file(file: &Path) -> Result<(), ConfigError> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return Ok(()); // the config layer reports an unreadable file with its own message
    };
    let Ok(value) = text.parse::<toml::Table>() else {
        return Ok(()); // likewise for a file that is not TOML
    };
    let holds_token = |section: &str| value.get(section).and_then(|section| section.get("api_token")).is_some();
    if holds_token("events") {
        return Err(ConfigError(format!(
            "events.api_token: not allowed in a config file ({}); give it through BATCHD__EVENTS__API_TOKEN or \
             events.api_token_file",
            file.display()
        )));
    }
    if value.get("openai").and_then(|section| section.get("api_key")).is_some() {
        return Err(ConfigError(format!(
            "openai.api_key: not allowed in a config file ({}); give the key through OPENAI_API_KEY or \
             openai.api_key_file",
            file.display()
        )));
    }
    if value.get("anthropic").and_then(|section| section.get("api_key")).is_some() {
        return Err(ConfigError(format!(
            "anthropic.api_key: not allowed in a config file ({}); give the key through ANTHROPIC_API_KEY or \
             anthropic.api_key_file",
            file.display()
        )));
    }
    if value.get("gemini").and_then(|section| section.get("api_key")).is_some() {
        return Err(ConfigError(format!(
            "gemini.api_key: not allowed in a config file ({}); give the key through GEMINI_API_KEY or \
             gemini.api_key_file",
            file.display()
        )));
    }
    let named = value.get("providers").and_then(toml::Value::as_table).into_iter().flatten();
    for (name, section) in named {
        if section.get("api_key").is_some() || section.get("api_token").is_some() {
            let variable = super::env_var(&format!("providers.{name}.api_key")).unwrap_or_default();
            return Err(ConfigError(format!(
                "providers.{name}.api_key: not allowed in a config file ({}); give the key through {variable} or \
                 providers.{name}.api_key_file",
                file.display()
            )));
        }
    }
    if holds_token("cloudflare") {
        return Err(ConfigError(format!(
            "cloudflare.api_token: not allowed in a config file ({}); give the token through CLOUDFLARE_API_TOKEN, \
             cloudflare.api_token_file or the systemd credential `{TOKEN_CREDENTIAL}`",
            file.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::test_env as env;

    #[test]
    fn a_config_file_may_not_hold_the_api_token() {
        let dir = std::env::temp_dir().join(format!("batchd-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("batchd.toml");
        std::fs::write(&file, "[cloudflare]\naccount_id = \"a\"\napi_token = \"tok-in-file\"\n").unwrap();
        let error = Settings::load_from(Some(&file), &env(&[])).expect_err("refused").to_string();
        assert!(error.contains("cloudflare.api_token: not allowed in a config file"), "{error}");
        assert!(!error.contains("tok-in-file"));
        std::fs::write(&file, "[cloudflare]\naccount_id = \"a\"\n").unwrap();
        let settings = Settings::load_from(Some(&file), &env(&[("CLOUDFLARE_API_TOKEN", "tok-env")])).unwrap();
        assert_eq!(settings.api_token().unwrap().expose(), "tok-env", "the environment still gives it");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_anthropic_key_comes_from_the_environment_or_a_file_never_the_config_file() {
        let dir = std::env::temp_dir().join(format!("batchd-anthropic-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("batchd.toml");
        std::fs::write(&config, "[anthropic]\napi_key = \"sk-in-file\"\n").unwrap();
        let error = Settings::load_from(Some(&config), &env(&[])).expect_err("refused").to_string();
        assert!(error.contains("anthropic.api_key: not allowed in a config file"), "{error}");
        assert!(!error.contains("sk-in-file"));
        assert!(Settings::load_from(None, &env(&[])).unwrap().anthropic_key().unwrap().is_none(), "not configured");
        let settings = Settings::load_from(None, &env(&[("ANTHROPIC_API_KEY", "sk-env")])).unwrap();
        assert_eq!(settings.anthropic_key().unwrap().expect("key").expose(), "sk-env");
        assert!(!settings.to_redacted_toml().contains("sk-env"));
        let file = dir.join("key");
        std::fs::write(&file, "sk-file\n").unwrap();
        let settings =
            Settings::load_from(None, &env(&[("BATCHD__ANTHROPIC__API_KEY_FILE", file.to_str().unwrap())])).unwrap();
        assert_eq!(settings.anthropic_key().unwrap().expect("key").expose(), "sk-file");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_token_comes_from_a_file_when_not_in_the_environment() {
        let dir = std::env::temp_dir().join(format!("batchd-token-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "file-token\n").unwrap();
        let settings =
            Settings::load_from(None, &env(&[("BATCHD__CLOUDFLARE__API_TOKEN_FILE", file.to_str().unwrap())])).unwrap();
        assert_eq!(settings.api_token().unwrap().expose(), "file-token");
        let missing = Settings::load_from(None, &env(&[])).unwrap().api_token().unwrap_err();
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(
            missing.to_string(),
            "configuration: cloudflare.api_token (CLOUDFLARE_API_TOKEN or BATCHD__CLOUDFLARE__API_TOKEN): not set; set \
             it, or cloudflare.api_token_file (BATCHD__CLOUDFLARE__API_TOKEN_FILE)"
        );
    }

    #[test]
    fn the_token_comes_from_a_systemd_credential_last() {
        let dir = std::env::temp_dir().join(format!("batchd-credentials-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(TOKEN_CREDENTIAL), "credential-token\n").unwrap();
        let credentials = ("CREDENTIALS_DIRECTORY", dir.to_str().unwrap());
        let settings = Settings::load_from(None, &env(&[credentials])).unwrap();
        assert_eq!(settings.api_token().unwrap().expose(), "credential-token");
        let settings = Settings::load_from(None, &env(&[credentials, ("CLOUDFLARE_API_TOKEN", "env-token")])).unwrap();
        assert_eq!(settings.api_token().unwrap().expose(), "env-token", "the environment wins");
        std::fs::remove_dir_all(&dir).ok();
        let empty = std::env::temp_dir().join(format!("batchd-no-credentials-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        let settings = Settings::load_from(None, &env(&[("CREDENTIALS_DIRECTORY", empty.to_str().unwrap())])).unwrap();
        assert!(settings.api_token().is_err(), "no such credential: the token is not set");
        std::fs::remove_dir_all(&empty).ok();
    }

    #[test]
    fn every_providers_key_comes_from_its_credential_when_given_no_other_way() {
        let dir = std::env::temp_dir().join(format!("batchd-provider-credentials-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(OPENAI_KEY_CREDENTIAL), "sk-openai-credential\n").unwrap();
        std::fs::write(dir.join(ANTHROPIC_KEY_CREDENTIAL), "sk-ant-credential\n").unwrap();
        let credentials = ("CREDENTIALS_DIRECTORY", dir.to_str().unwrap());
        let settings = Settings::load_from(None, &env(&[credentials])).unwrap();
        assert_eq!(settings.openai_api_key().unwrap().unwrap().expose(), "sk-openai-credential");
        assert_eq!(settings.anthropic_key().unwrap().unwrap().expose(), "sk-ant-credential");
        assert!(settings.api_token().is_err(), "no Cloudflare credential there");
        let settings = Settings::load_from(
            None,
            &env(&[credentials, ("OPENAI_API_KEY", "sk-openai-env"), ("ANTHROPIC_API_KEY", "sk-ant-env")]),
        )
        .unwrap();
        assert_eq!(settings.openai_api_key().unwrap().unwrap().expose(), "sk-openai-env", "the environment wins");
        assert_eq!(settings.anthropic_key().unwrap().unwrap().expose(), "sk-ant-env", "the environment wins");
        std::fs::write(dir.join("groq-api-key"), "gsk-credential\n").unwrap();
        let named = [credentials, ("BATCHD__PROVIDERS__GROQ__KIND", "openai")];
        let settings = Settings::load_from(None, &env(&named)).unwrap();
        let file = settings.providers["groq"].settings.get("api_key_file").and_then(toml::Value::as_str);
        assert_eq!(file, dir.join("groq-api-key").to_str(), "a named instance's credential is <name>-api-key");
        assert!(settings.openai_named("groq", &settings.providers["groq"]).is_ok(), "its key is read from it");
        std::fs::remove_file(dir.join("groq-api-key")).unwrap();
        std::fs::remove_file(dir.join(ANTHROPIC_KEY_CREDENTIAL)).unwrap();
        std::fs::write(dir.join(OPENAI_KEY_CREDENTIAL), "").unwrap();
        let settings = Settings::load_from(None, &env(&[credentials])).unwrap();
        assert!(settings.anthropic_key().unwrap().is_none(), "no credential: Anthropic is not configured");
        assert!(settings.openai_api_key().unwrap().is_none(), "an empty credential (SetCredential= fallback): off");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_openai_key_comes_from_the_environment_or_a_file_never_from_the_config_file() {
        let dir = std::env::temp_dir().join(format!("batchd-openai-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("batchd.toml");
        std::fs::write(&config, "[openai]\napi_key = \"sk-in-file\"\n").unwrap();
        let error = Settings::load_from(Some(&config), &env(&[])).expect_err("refused").to_string();
        assert!(error.contains("openai.api_key: not allowed in a config file") && !error.contains("sk-in-file"));
        assert_eq!(Settings::load_from(None, &env(&[])).unwrap().openai_api_key().unwrap(), None, "not configured");
        let settings = Settings::load_from(None, &env(&[("OPENAI_API_KEY", "sk-env")])).unwrap();
        assert_eq!(settings.openai_api_key().unwrap().unwrap().expose(), "sk-env");
        assert!(!format!("{settings:?}").contains("sk-env") && !settings.to_redacted_toml().contains("sk-env"));
        let key_file = dir.join("key");
        std::fs::write(&key_file, "sk-file\n").unwrap();
        let settings =
            Settings::load_from(None, &env(&[("BATCHD__OPENAI__API_KEY_FILE", key_file.to_str().unwrap())])).unwrap();
        assert_eq!(settings.openai_api_key().unwrap().unwrap().expose(), "sk-file");
        let settings =
            Settings::load_from(None, &env(&[("BATCHD__OPENAI__BASE_URL", "http://127.0.0.1:9/openai/v1")])).unwrap();
        assert_eq!(settings.openai.base_url, "http://127.0.0.1:9/openai/v1");
        std::fs::remove_dir_all(&dir).ok();
    }
}
