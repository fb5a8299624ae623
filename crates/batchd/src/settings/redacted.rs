//! The effective settings printed as TOML (`batchd config check`), with every secret and URL password masked.

use super::{Settings, redact_url};

impl Settings {
    /// The effective settings as TOML, secrets shown as `[redacted]` (and the Redis URL without its password).
    pub fn to_redacted_toml(&self) -> String {
        let mut value = toml::Value::try_from(self).expect("settings serialise");
        if let Some(redis) = value.get_mut("redis") {
            if let Some(url) = redis.get_mut("url") {
                *url = toml::Value::String(redact_url(self.redis.url.expose()));
            }
            if let Some(nodes) = redis.get_mut("nodes") {
                *nodes = toml::Value::Array(
                    self.redis.nodes.iter().map(|node| toml::Value::String(redact_url(node.expose()))).collect(),
                );
            }
        }
        toml::to_string_pretty(&value).expect("settings render as TOML")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Secret;
    use crate::settings::test_env as env;

    #[test]
    fn node_passwords_are_redacted_when_settings_are_printed() {
        let mut settings = Settings::load_from(None, &env(&[])).unwrap();
        settings.redis.nodes = vec![Secret::new("redis://:s3cret@10.0.0.2:26379"), Secret::new("redis://10.0.0.3:1")];
        let text = settings.to_redacted_toml();
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains("redis://:[redacted]@10.0.0.2:26379") && text.contains("redis://10.0.0.3:1"), "{text}");
        assert!(!format!("{settings:?}").contains("s3cret"));
    }

    #[test]
    fn the_effective_settings_print_without_secrets() {
        let settings = Settings::load_from(
            None,
            &env(&[("REDIS_URL", "redis://app:hunter2@10.0.0.1:6379/0"), ("CLOUDFLARE_API_TOKEN", "tok-secret")]),
        )
        .unwrap();
        let text = settings.to_redacted_toml();
        assert!(text.contains("url = \"redis://app:[redacted]@10.0.0.1:6379/0\""), "{text}");
        assert!(text.contains("api_token = \"[redacted]\""), "{text}");
        assert!(!text.contains("hunter2") && !text.contains("tok-secret"));
        assert!(text.contains("[rate_limits]") && text.contains("max_payload_bytes = 9500000"), "{text}");
    }
}
