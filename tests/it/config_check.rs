//! `batchd config check` validates exactly what `batchd run` validates: on the same bad configuration both exit 78
//! (EX_CONFIG, which systemd does not restart) with the same one clean line, and neither touches Redis or the API.

use std::process::Command;

use batchd_tests::binary;

/// Runs `batchd <args>` with only `env` (plus a token and an unreachable Redis); returns the exit code and stderr.
fn batchd(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let output = Command::new(binary("batchd").expect("batchd binary"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        // Nothing listens there: a check that tried to connect would hang or fail differently.
        .env("REDIS_URL", "redis://127.0.0.1:1")
        .env("CLOUDFLARE_API_TOKEN", "tok-check")
        .env("CLOUDFLARE_ACCOUNT_ID", "acct")
        .envs(env.iter().copied())
        .output()
        .expect("run batchd");
    (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn config_check_and_run_refuse_the_same_configurations_the_same_way() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("CLOUDFLARE_ACCOUNT_ID", "")],
            "cloudflare.account_id (CLOUDFLARE_ACCOUNT_ID or BATCHD__CLOUDFLARE__ACCOUNT_ID): not set",
        ),
        (
            &[("CLOUDFLARE_ACCOUNT_ID", "a/b")],
            "cloudflare.account_id (CLOUDFLARE_ACCOUNT_ID or BATCHD__CLOUDFLARE__ACCOUNT_ID): contains '/'",
        ),
        (&[("BATCHD__LOG__LEVEL", "batchd=loud")], "log.level"),
        (&[("RUST_LOG", "batchd=loud")], "RUST_LOG"),
        (&[("BATCHD__CLOUDFLARE__BASE_URL", "http://api.example.com/client/v4")], "cloudflare.base_url"),
        (&[("REDIS_URL", "rediss://10.0.0.1:6380/#insecure")], "redis.tls_insecure"),
        (
            &[("CLOUDFLARE_API_TOKEN", "")],
            "cloudflare.api_token (CLOUDFLARE_API_TOKEN or BATCHD__CLOUDFLARE__API_TOKEN): not set",
        ),
        (&[("BATCHD__EVENTS__QUEUE_ID", "bad/queue")], "events.queue_id (BATCHD__EVENTS__QUEUE_ID): \"bad/queue\""),
    ];
    for (env, expected) in cases {
        let (check_code, check_err) = batchd(&["config", "check"], env);
        let (run_code, run_err) = batchd(&["run"], env);
        assert_eq!((check_code, run_code), (78, 78), "{env:?}: check said {check_err:?}, run said {run_err:?}");
        assert_eq!(check_err, run_err, "{env:?}: the same message from both");
        assert_eq!(check_err.lines().count(), 1, "{env:?}: one line: {check_err:?}");
        assert!(check_err.starts_with("batchd: configuration: "), "{env:?}: {check_err:?}");
        assert_eq!(check_err.matches("configuration:").count(), 1, "{env:?}: no doubled prefix: {check_err:?}");
        assert!(check_err.contains(expected), "{env:?}: {check_err:?} should name {expected:?}");
        assert!(!check_err.contains("tok-check"), "the token is never printed");
    }
    let (code, out) = batchd(&["config", "check"], &[]);
    assert_eq!(code, 0, "a good configuration passes: {out}");
}

/// A provider's settings, one of them wrong, and the start of the refusal's line.
type Case<'a> = (&'a [(&'a str, &'a str)], (&'a str, &'a str), &'a str);

/// Every provider is optional, and each configured one's settings are checked the same way: by its kind's
/// registration, at `config check` and at `run`, exit 78 naming the setting and its environment variable (an
/// OpenAI base URL of another scheme used to pass the check and stop `run` with exit 1).
#[test]
fn a_wrong_setting_of_any_provider_stops_config_check_and_run_with_78_naming_it_and_its_variable() {
    let no_cloudflare: [(&str, &str); 2] = [("CLOUDFLARE_ACCOUNT_ID", ""), ("CLOUDFLARE_API_TOKEN", "")];
    let openai = [no_cloudflare[0], no_cloudflare[1], ("OPENAI_API_KEY", "sk-check")];
    let anthropic = [no_cloudflare[0], no_cloudflare[1], ("ANTHROPIC_API_KEY", "sk-ant-check")];
    let gemini = [no_cloudflare[0], no_cloudflare[1], ("GEMINI_API_KEY", "gm-check")];
    for alone in [&openai, &anthropic, &gemini] {
        let (code, err) = batchd(&["config", "check"], alone);
        assert_eq!(code, 0, "{alone:?}: one provider is enough: {err}");
    }
    let (code, err) = batchd(&["config", "check"], &no_cloudflare);
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("no provider is configured") && err.contains("ANTHROPIC_API_KEY"), "{err}");
    let cases: &[Case<'_>] = &[
        (&openai, ("BATCHD__OPENAI__MAX_REQUESTS", "50001"), "openai.max_requests (BATCHD__OPENAI__MAX_REQUESTS): "),
        (
            &openai,
            ("BATCHD__OPENAI__BASE_URL", "ftp://api.openai.com/v1"),
            "openai.base_url (BATCHD__OPENAI__BASE_URL): ",
        ),
        (&openai, ("BATCHD__OPENAI__PROJECT", "p\u{1}"), "openai.project (BATCHD__OPENAI__PROJECT): "),
        (&openai, ("BATCHD__OPENAI__REQUEST_TIMEOUT_SECS", "600"), "openai.request_timeout_secs (BATCHD__OPENAI__"),
        (
            &anthropic,
            ("BATCHD__ANTHROPIC__MAX_BODY_BYTES", "10"),
            "anthropic.max_body_bytes (BATCHD__ANTHROPIC__MAX_BODY_BYTES): ",
        ),
        (&anthropic, ("BATCHD__ANTHROPIC__VERSION", ""), "anthropic.version (BATCHD__ANTHROPIC__VERSION): "),
        (&anthropic, ("BATCHD__ANTHROPIC__ACCOUNT", "a b"), "anthropic.account (BATCHD__ANTHROPIC__ACCOUNT): "),
        (
            &gemini,
            ("BATCHD__GEMINI__MAX_INLINE_BYTES", "30000000"),
            "gemini.max_inline_bytes (BATCHD__GEMINI__MAX_INLINE_BYTES): ",
        ),
        (
            &gemini,
            ("BATCHD__GEMINI__BASE_URL", "http://generativelanguage.googleapis.com"),
            "gemini.base_url (BATCHD__GEMINI__BASE_URL): ",
        ),
        (
            &[],
            ("BATCHD__CLOUDFLARE__MAX_REPLY_BYTES", "100"),
            "cloudflare.max_reply_bytes (BATCHD__CLOUDFLARE__MAX_REPLY_BYTES): ",
        ),
        (&[], ("BATCHD__CLOUDFLARE__ACCOUNT", "{x}"), "cloudflare.account (BATCHD__CLOUDFLARE__ACCOUNT): "),
    ];
    for (base, wrong, expected) in cases {
        let env: Vec<(&str, &str)> = base.iter().copied().chain([*wrong]).collect();
        let (check_code, check_err) = batchd(&["config", "check"], &env);
        let (run_code, run_err) = batchd(&["run"], &env);
        assert_eq!((check_code, run_code), (78, 78), "{wrong:?}: check said {check_err:?}, run said {run_err:?}");
        assert_eq!(check_err, run_err, "{wrong:?}: the same message from both");
        assert!(check_err.starts_with(&format!("batchd: configuration: {expected}")), "{wrong:?}: {check_err:?}");
        for key in ["sk-check", "sk-ant-check", "gm-check"] {
            assert!(!check_err.contains(key), "keys are never printed: {check_err:?}");
        }
    }
}

/// Lists come comma-separated from the environment (a Redis Cluster's nodes, the extra namespaces), as a
/// Kubernetes Deployment sets them without a mounted file.
#[test]
fn lists_are_set_from_the_environment_comma_separated() {
    let output = Command::new(binary("batchd").expect("batchd binary"))
        .args(["config", "check", "--json"])
        .env_clear()
        .env("REDIS_URL", "redis://10.0.0.1:6379")
        .env("CLOUDFLARE_API_TOKEN", "tok-check")
        .env("CLOUDFLARE_ACCOUNT_ID", "acct")
        .env("BATCHD__REDIS__MODE", "cluster")
        .env("BATCHD__REDIS__NODES", "redis://10.0.0.2:6379,redis://10.0.0.3:6379")
        .env("BATCHD__REDIS__EXTRA_NAMESPACES", "billing, search")
        .output()
        .expect("run batchd");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let settings: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(settings["redis"]["extra_namespaces"], serde_json::json!(["billing", "search"]));
    assert_eq!(settings["redis"]["nodes"].as_array().map(Vec::len), Some(2), "{settings}");
}

/// A named instance (`[providers.<name>]`, tests/it/instances.rs) is checked like a built-in one: each wrong setting
/// exits 78 naming `providers.<name>.<key>` and its environment variable; a key in the config file is refused.
#[test]
fn a_wrong_named_instance_setting_is_refused_naming_it_and_its_variable() {
    let groq = [
        ("BATCHD__PROVIDERS__GROQ__KIND", "openai"),
        ("BATCHD__PROVIDERS__GROQ__API_KEY", "gsk-check"),
        ("BATCHD__PROVIDERS__GROQ__BASE_URL", "https://api.groq.com/openai/v1"),
    ];
    let (code, out) = batchd(&["config", "check"], &groq);
    assert_eq!(code, 0, "a good instance passes: {out}");
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("BATCHD__PROVIDERS__GROQ__BASE_URL", "http://api.groq.com/openai/v1")],
            "providers.groq.base_url (BATCHD__PROVIDERS__GROQ__BASE_URL): ",
        ),
        (
            &[("BATCHD__PROVIDERS__GROQ__KIND", "mistral")],
            "providers.groq.kind (BATCHD__PROVIDERS__GROQ__KIND): \"mistral\"",
        ),
        (
            &[("BATCHD__PROVIDERS__GROQ__COMPLETION_WINDOW", "2 days")],
            "providers.groq.completion_window (BATCHD__PROVIDERS__GROQ__COMPLETION_WINDOW)",
        ),
        (
            &[("BATCHD__PROVIDERS__GROQ__API_KEY", "")],
            "providers.groq.api_key (BATCHD__PROVIDERS__GROQ__API_KEY): not set",
        ),
        (
            &[("BATCHD__PROVIDERS__OPENAI__KIND", "openai"), ("BATCHD__PROVIDERS__OPENAI__API_KEY", "k")],
            "providers.openai (BATCHD__PROVIDERS__OPENAI): \"openai\" is the built-in OpenAI Batch instance's name",
        ),
        (
            &[("BATCHD__PROVIDERS__2GROQ__KIND", "openai"), ("BATCHD__PROVIDERS__2GROQ__API_KEY", "k")],
            "\"2groq\" is not an instance name",
        ),
    ];
    for (changes, expected) in cases {
        let env: Vec<(&str, &str)> = groq
            .iter()
            .copied()
            .filter(|(name, _)| !changes.iter().any(|(changed, _)| changed == name))
            .chain(changes.iter().copied())
            .collect();
        let (code, out) = batchd(&["config", "check"], &env);
        assert_eq!(code, 78, "{changes:?}: {out}");
        assert!(out.contains(expected), "{changes:?}: {out:?} should name {expected:?}");
        assert!(!out.contains("gsk-check"), "the key is never printed");
    }
    // A key in the config file is refused, never printed.
    let dir = std::env::temp_dir().join(format!("batchd-instances-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("batchd.toml");
    std::fs::write(&file, "[providers.groq]\nkind = \"openai\"\napi_key = \"gsk-in-file\"\n").expect("write");
    let (code, out) = batchd(&["--config", file.to_str().expect("utf-8"), "config", "check"], &[]);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(code, 78, "{out}");
    assert!(out.contains("providers.groq.api_key: not allowed in a config file"), "{out}");
    assert!(out.contains("BATCHD__PROVIDERS__GROQ__API_KEY") && !out.contains("gsk-in-file"), "{out}");
}
