//! The deployment files in `deploy/`: the configs load, the supervisors (Kubernetes, systemd) wait longer than the
//! drain, and the Grafana dashboard parses and queries only metrics that batchd exports.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use batchd::settings::{LogFormat, Settings};

/// The repository root (the test package lives in `tests/`).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repo root").to_path_buf()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// Loads a deployment's config file the way `batchd --config FILE run` would (no environment).
fn load_config(path: &str) -> Settings {
    Settings::load_from(Some(&repo_root().join(path)), &HashMap::new()).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The first `key: <number>` / `key=<number>` in `text`.
fn number_after(text: &str, key: &str) -> u64 {
    let at = text.find(key).unwrap_or_else(|| panic!("{key} not found")) + key.len();
    let digits: String =
        text[at..].trim_start_matches([':', '=', ' ', '"']).chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|_| panic!("{key} has no number"))
}

#[test]
fn deployment_configs_load_and_supervisors_outwait_the_drain() {
    for path in ["deploy/kubernetes/base/batchd.toml", "deploy/kubernetes/overlays/example/batchd.toml"] {
        let settings = load_config(path);
        assert_eq!(settings.admin.listen, "0.0.0.0:9090", "{path}: probes and Prometheus reach the pod");
        assert_eq!(settings.log.format, LogFormat::Json, "{path}");
        assert_eq!(settings.cloudflare.api_token_file, "/var/run/secrets/batchd/cloudflare-api-token", "{path}");
        let deployment = read("deploy/kubernetes/base/deployment.yaml");
        assert!(
            deployment.contains("mountPath: /var/run/secrets/batchd"),
            "the token file is where the Secret is mounted"
        );
        assert!(deployment.contains("path: /livez") && deployment.contains("path: /readyz"));
        let termination = number_after(&deployment, "terminationGracePeriodSeconds:");
        assert!(termination >= settings.shutdown.grace_secs + 10, "{path}: pods get longer than the drain");
        assert!(
            settings.shutdown.grace_secs > settings.cloudflare.request_timeout_secs,
            "{path}: a submit in flight at SIGTERM can finish"
        );
        let keda = read("deploy/kubernetes/base/scaledobject.yaml");
        assert!(
            keda.contains(&format!("stream: \"{{{}}}:submit\"", settings.redis.namespace)),
            "KEDA watches the submit stream"
        );
        assert!(keda.contains("consumerGroup: batchd"));
        let address = keda.split("address: ").nth(1).and_then(|rest| rest.lines().next()).expect("KEDA address");
        assert!(settings.redis.url.expose().ends_with(&format!("//{address}")), "{path}: KEDA reads the same Redis");
    }
    let settings = load_config("deploy/systemd/batchd.toml");
    let unit = read("deploy/systemd/batchd.service");
    assert!(
        number_after(&unit, "\nTimeoutStopSec=") >= settings.shutdown.grace_secs + 10,
        "systemd outwaits the drain"
    );
    assert!(settings.shutdown.grace_secs > settings.cloudflare.request_timeout_secs, "a submit in flight can finish");
    let watchdog = number_after(&unit, "\nWatchdogSec=");
    assert!(watchdog * 1000 >= settings.admin.sample_interval_ms * 2 && watchdog >= 10);
    assert!(unit.contains("RestartPreventExitStatus=78"));
    assert!(unit.contains("LoadCredential=cloudflare-api-token:"));
}

/// Every provider's key reaches the daemon the same way: a systemd credential (optional ones with an empty
/// fallback, so a missing file does not stop the unit) and a file of a Kubernetes Secret mounted 0440 where
/// `CREDENTIALS_DIRECTORY` points, by the names `batchd` looks for.
#[test]
fn every_providers_key_is_a_systemd_credential_and_a_kubernetes_secret_file() {
    use batchd::settings::{ANTHROPIC_KEY_CREDENTIAL, GEMINI_KEY_CREDENTIAL, OPENAI_KEY_CREDENTIAL, TOKEN_CREDENTIAL};
    let unit = read("deploy/systemd/batchd.service");
    let deployment = read("deploy/kubernetes/base/deployment.yaml");
    assert!(deployment.contains("- name: CREDENTIALS_DIRECTORY\n              value: /var/run/secrets/batchd\n"));
    assert!(deployment.contains("- name: provider-keys\n              mountPath: /var/run/secrets/batchd\n"));
    let volume = deployment.split("- name: provider-keys\n          projected:").nth(1).expect("the keys' volume");
    assert!(volume.trim_start().starts_with("defaultMode: 0440"), "{volume}");
    for (name, secret, optional) in [
        (TOKEN_CREDENTIAL, "batchd-cloudflare", false),
        (OPENAI_KEY_CREDENTIAL, "batchd-openai", true),
        (ANTHROPIC_KEY_CREDENTIAL, "batchd-anthropic", true),
        (GEMINI_KEY_CREDENTIAL, "batchd-gemini", true),
    ] {
        assert!(unit.contains(&format!("\nLoadCredential={name}:/etc/batchd/{name}\n")), "{name}");
        assert_eq!(unit.contains(&format!("\nSetCredential={name}:\\n\n")), optional, "{name}: the fallback");
        let source = format!("name: {secret}\n");
        let at = volume.find(&source).unwrap_or_else(|| panic!("{secret} is not a source of the keys' volume"));
        let entry = volume[at..].split("- secret:").next().expect("the source");
        assert_eq!(entry.contains("optional: true"), optional, "{secret}: {entry}");
        assert!(entry.contains(&format!("- key: {name}\n")) && entry.contains(&format!("path: {name}\n")), "{entry}");
    }
}

/// The shipped dashboard listens on every address of its pod, so it authenticates: a token file from a Secret,
/// mounted where `--auth-token-file` reads it; its probes need no token (`/assets/ui.css`, `/readyz`).
#[test]
fn the_shipped_dashboard_requires_a_token_from_a_secret() {
    let deployment = read("deploy/kubernetes/ui/deployment.yaml");
    let args = deployment.lines().find(|line| line.trim_start().starts_with("args:")).expect("args");
    assert!(args.contains("\"--listen\", \"0.0.0.0:8080\""), "{args}");
    assert!(args.contains("\"--auth-token-file\", \"/var/run/secrets/batchd-ui/token\""), "{args}");
    assert!(!args.contains("--allow-actions"), "read-only: {args}");
    assert!(deployment.contains("- name: ui-token\n              mountPath: /var/run/secrets/batchd-ui\n"));
    let volume = deployment.split("- name: ui-token\n          secret:").nth(1).expect("the token's volume");
    assert!(volume.contains("secretName: batchd-ui-token") && volume.contains("- key: token\n"), "{volume}");
    assert!(volume.contains("defaultMode: 0440"), "{volume}");
    assert!(deployment.contains("path: /assets/ui.css") && deployment.contains("path: /readyz"));
}

/// Every PromQL expression of the dashboard.
fn dashboard_exprs(node: &serde_json::Value, out: &mut Vec<String>) {
    match node {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", serde_json::Value::String(expr)) => out.push(expr.clone()),
                    _ => dashboard_exprs(value, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| dashboard_exprs(item, out)),
        _ => {}
    }
}

#[test]
fn the_grafana_dashboard_parses_and_queries_only_exported_metrics() {
    let dashboard: serde_json::Value = serde_json::from_str(&read("deploy/grafana/batchd.json")).expect("valid JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let titles: Vec<&str> = panels.iter().filter_map(|panel| panel["title"].as_str()).collect();
    for question in ["Is work flowing?", "Is anything stuck?", "Is the API refusing us?", "What does it cost?"] {
        assert!(titles.contains(&question), "a row answers {question:?}; titles: {titles:?}");
    }
    let mut exprs = Vec::new();
    dashboard_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 8, "{exprs:?}");
    let mut used = Vec::new();
    for expr in &exprs {
        for (at, _) in expr.match_indices("batchd_") {
            let name: String = expr[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    name.strip_suffix(suffix).filter(|base| batchd_engine::metrics::NAMES.contains(base))
                })
                .unwrap_or(&name)
                .to_owned();
            assert!(
                batchd_engine::metrics::NAMES.contains(&base.as_str()),
                "{name} (in {expr}) is not a batchd metric"
            );
            used.push(base);
        }
    }
    for panel in panels.iter().filter(|panel| panel["type"] != "row") {
        assert!(
            panel["targets"].as_array().is_some_and(|targets| !targets.is_empty()),
            "panel {} has a query",
            panel["title"]
        );
    }
    for essential in [
        "batchd_jobs_finished_total",
        "batchd_oldest_waiting_job_age_seconds",
        "batchd_api_requests_total",
        "batchd_oldest_remote_batch_age_seconds",
        "batchd_api_calls_in_flight",
        "batchd_models_without_events",
        "batchd_rate_limit_effective",
        "batchd_events_backlog",
        "batchd_events_oldest_message_age_seconds",
    ] {
        assert!(used.iter().any(|name| name == essential), "{essential} is on the dashboard");
    }
    let mut ids: Vec<u64> = panels.iter().filter_map(|panel| panel["id"].as_u64()).collect();
    assert_eq!(ids.len(), panels.len(), "every panel has an id");
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
    let cells: Vec<[u64; 4]> = panels
        .iter()
        .map(|panel| ["x", "y", "w", "h"].map(|key| panel["gridPos"][key].as_u64().expect("gridPos")))
        .collect();
    for (i, a) in cells.iter().enumerate() {
        for b in &cells[i + 1..] {
            let apart = a[0] + a[2] <= b[0] || b[0] + b[2] <= a[0] || a[1] + a[3] <= b[1] || b[1] + b[3] <= a[1];
            assert!(apart, "panels at {a:?} and {b:?} overlap");
        }
    }
}
