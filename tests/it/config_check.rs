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
