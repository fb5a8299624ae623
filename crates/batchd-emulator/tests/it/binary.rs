//! The `batchd-emulator` binary: prints its URL once bound, serves, and stops on SIGTERM; [`EmulatorProcess`] runs it
//! for the tests of its flags.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::Duration,
};

use reqwest::StatusCode;
use serde_json::json;

/// The emulator binary, started with some flags; killed when dropped.
pub(crate) struct EmulatorProcess {
    /// The process; `None` once stopped.
    child: Option<Child>,
    /// The Workers AI base URL it printed (`http://127.0.0.1:<port>/client/v4`).
    pub base_url: String,
}

impl EmulatorProcess {
    /// Starts the binary with `args` (after `--listen 127.0.0.1:0`) and `env`, and reads the URL it prints once bound.
    pub async fn spawn(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_batchd-emulator"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the emulator binary");
        let stdout = child.stdout.take().expect("stdout");
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).map(|_| line)
        })
        .await
        .expect("join")
        .expect("read the first line");
        let base_url = line
            .trim()
            .strip_prefix("batchd-emulator listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .to_owned();
        Self { child: Some(child), base_url }
    }

    /// Sends SIGTERM and asserts that the binary exits with success within 5 s.
    pub async fn stop_with_sigterm(mut self) {
        let mut child = self.child.take().expect("running");
        let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("run kill");
        assert!(status.success());
        let exit = tokio::task::spawn_blocking(move || {
            for _ in 0..100 {
                if let Some(exit) = child.try_wait().expect("wait") {
                    return Some(exit);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            None
        })
        .await
        .expect("join");
        let exit = exit.expect("the emulator must exit within 5 s of SIGTERM");
        assert!(exit.success(), "{exit:?}");
    }
}

impl Drop for EmulatorProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test]
async fn binary_prints_its_url_serves_and_stops_on_sigterm() {
    let emulator = EmulatorProcess::spawn(
        &[
            "--account-id",
            "acc",
            "--queued-ms",
            "0",
            "--running-ms",
            "0",
            "--max-items",
            "1",
            "--rate-limit-requests",
            "2",
            "--rate-limit-per-ms",
            "60000",
            "--strict-items",
            "--unbatchable-model",
            "@cf/baai/bge-m3",
            "--unbatchable-model",
            "@cf/openai/whisper-large-v3-turbo",
        ],
        &[("EMULATOR_TOKEN", "secret")],
    )
    .await;
    let base_url = emulator.base_url.clone();
    assert!(base_url.starts_with("http://127.0.0.1:") && base_url.ends_with("/client/v4"), "{base_url}");

    let url = format!("{base_url}/accounts/acc/ai/run/%40cf/meta/m2m100-1.2b?queueRequest=true");
    let body = json!({ "requests": [{ "text": "hi", "source_lang": "en", "target_lang": "de" }] });
    let reply: serde_json::Value = reqwest::Client::new()
        .post(&url)
        .bearer_auth("secret")
        .json(&body)
        .send()
        .await
        .expect("submit")
        .json()
        .await
        .expect("json");
    let request_id = reply["result"]["request_id"].as_str().expect("request id");
    let response = reqwest::Client::new()
        .post(&url)
        .bearer_auth("secret")
        .json(&json!({ "request_id": request_id }))
        .send()
        .await
        .expect("poll");
    assert_eq!(response.status(), StatusCode::OK);
    let reply: serde_json::Value = response.json().await.expect("json");
    assert_eq!(reply["result"]["results"][0]["result"]["translated_text"], "[de] hi");
    let two_items = json!({ "requests": [{ "text": "a", "target_lang": "de" }, { "text": "b", "target_lang": "de" }] });
    let response =
        reqwest::Client::new().post(&url).bearer_auth("secret").json(&two_items).send().await.expect("submit");
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let response = reqwest::Client::new().post(&url).bearer_auth("secret").json(&body).send().await.expect("submit");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let control = base_url.replace("/client/v4", "/_emulator/stats");
    let stats: serde_json::Value = reqwest::get(&control).await.expect("stats").json().await.expect("json");
    assert_eq!(stats, json!({ "rate_limited": 1, "batches": 1 }));
    let control = base_url.replace("/client/v4", "/_emulator/config");
    let config: serde_json::Value = reqwest::get(&control).await.expect("config").json().await.expect("json");
    assert_eq!(config["strict_items"], true);
    assert_eq!(config["unbatchable_models"], json!(["@cf/baai/bge-m3", "@cf/openai/whisper-large-v3-turbo"]));

    emulator.stop_with_sigterm().await;
}
