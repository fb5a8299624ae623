//! The providers are discoverable (issue 39): `batchd --help` names all four, and `batchd config check` prints a
//! summary of each (configured or not, base URL, limits, where the key comes from, never the key), and `batchd
//! models` says which configured providers it cannot list.

use batchd_tests::World;

use crate::cli_ops::{batchd, run, text};

#[tokio::test]
async fn help_names_the_four_providers_and_config_check_summarises_each() {
    let world = World::new().await;
    let mut command = batchd(&world);
    command.arg("--help");
    let help = text(&run(command).await.stdout);
    for provider in
        ["Workers AI (`@cf/...`)", "OpenAI (`openai/...`)", "Anthropic (`anthropic/...`)", "Gemini (`gemini/...`)"]
    {
        assert!(help.replace('\n', " ").contains(provider), "{provider} in: {help}");
    }

    let mut command = batchd(&world);
    command
        .env("CLOUDFLARE_API_TOKEN", "cf-token-value")
        .env("OPENAI_API_KEY", "sk-openai-key-value")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("GEMINI_API_KEY")
        .args(["config", "check"]);
    let output = run(command).await;
    let shown = text(&output.stdout);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let line = |name: &str| {
        shown
            .lines()
            .find(|line| line.starts_with(&format!("#   {name} (")))
            .unwrap_or_else(|| panic!("{name}: {shown}"))
    };
    assert!(line("cloudflare").contains(": configured; base URL "), "{shown}");
    assert!(line("cloudflare").ends_with("key from the environment (CLOUDFLARE_API_TOKEN)"), "{shown}");
    let openai = line("openai");
    assert!(openai.starts_with("#   openai (OpenAI Batch): configured; base URL "), "{openai}");
    assert!(openai.contains("limits openai.batches_per_hour "), "{openai}");
    assert!(openai.ends_with("key from the environment (OPENAI_API_KEY)"), "{openai}");
    assert!(line("anthropic").contains(": not configured; "), "{shown}");
    assert!(line("anthropic").ends_with("no key (ANTHROPIC_API_KEY or the key file)"), "{shown}");
    assert!(line("gemini").contains(": not configured; "), "{shown}");
    assert!(!shown.contains("sk-openai-key-value") && !shown.contains("cf-token-value"), "never a key: {shown}");
    let head: Vec<&str> = shown.lines().take_while(|line| !line.starts_with('[')).collect();
    assert!(head.iter().all(|line| line.is_empty() || line.starts_with('#')), "the summary is TOML comments: {shown}");
    assert_eq!(head.len(), 6, "a heading, a line per provider, a blank line: {shown}");
}

#[tokio::test]
async fn models_says_which_configured_providers_it_cannot_list_with_the_models_their_settings_name() {
    let world = World::new().await;
    // `openai.models` takes a model with or without its `openai/`.
    let config = world.redis.dir.join("openai.toml");
    std::fs::write(&config, "[openai]\nmodels = [{ model = \"openai/gpt-4o\", batches_per_hour = 3 }]\n").unwrap();
    let mut command = batchd(&world);
    command
        .env("OPENAI_API_KEY", "sk-openai-key-value")
        // An OpenAI-only setup: no Workers AI account or token.
        .env_remove("CLOUDFLARE_API_TOKEN")
        .env("BATCHD__CLOUDFLARE__ACCOUNT_ID", "")
        .arg("--config")
        .arg(&config)
        .arg("models");
    let output = run(command).await;
    let shown = text(&output.stdout);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        shown.contains("Workers AI is not configured: its models are listed once it is ([cloudflare])."),
        "{shown}"
    );
    assert!(
        shown.contains(
            "openai: batchd does not read OpenAI Batch's model list: any openai/<model> its Batch API takes is \
             accepted (an unknown one fails when its batch is created)\n  named in its settings: openai/gpt-4o\n"
        ),
        "{shown}"
    );
    assert!(!shown.contains("anthropic: batchd does not read"), "only configured providers: {shown}");

    let mut command = batchd(&world);
    command
        .env("OPENAI_API_KEY", "sk-openai-key-value")
        // An OpenAI-only setup: no Workers AI account or token.
        .env_remove("CLOUDFLARE_API_TOKEN")
        .env("BATCHD__CLOUDFLARE__ACCOUNT_ID", "")
        .arg("--config")
        .arg(&config)
        .args(["models", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&run(command).await.stdout).expect("JSON");
    assert_eq!(listed["unlisted"][0]["kind"], "openai", "{listed}");
    assert_eq!(listed["unlisted"][0]["named_in_settings"], serde_json::json!(["openai/gpt-4o"]), "{listed}");
}
