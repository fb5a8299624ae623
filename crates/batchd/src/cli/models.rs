//! `batchd models`: the provider kinds batchd knows and the named instances configured (from the registry: model
//! names, capabilities, whether this configuration has each), then, when Workers AI is configured, its models that
//! take batch requests, with the task type, rate-limit bucket and limit batchd gives each, from the model catalog (the copy the daemons share in
//! Redis; read from the API when there is none, or with `--refresh`), or from the `[rate_limits]` tables when the
//! catalog cannot be read; and for each other configured provider, that batchd does not list its models, with the
//! models its settings name.

use anyhow::Context as _;
use batchd_cloudflare::{BatchClient, ModelCatalog, rate_bucket};
use serde_json::json;

use super::{escape_for_terminal, print_json};
use crate::settings::Settings;

/// Options of `batchd models`.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelsArgs {
    /// Read the catalog from the API now (and share it through Redis) instead of using the daemons' copy.
    #[arg(long)]
    pub refresh: bool,
    /// Print JSON: `{"providers":[{"kind":..,"title":..,"models":[..],"capabilities":{..},"configured":..}],` (a
    /// named instance has `"name"` too),
    /// "source":..,"fetched_at":..,"models":[{"model":..,"task":..,"bucket":..,"limit":..}],
    /// "unlisted":[{"kind":..,"why":..,"named_in_settings":[..]}]}`.
    #[arg(long)]
    pub json: bool,
}

/// One listed model.
struct Row {
    /// The model's name.
    model: String,
    /// The task type batchd limits it under.
    task: &'static str,
    /// Where that task type came from.
    task_source: &'static str,
    /// Its limiter bucket, `None` when not limited.
    bucket: Option<String>,
    /// Requests per window of that bucket (0: not limited).
    limit: u32,
    /// Whether the catalog says it needs the Workers Paid plan.
    paid_only: bool,
}

/// A provider instance as `batchd models` lists it.
struct Listed {
    /// Its routing name: the kind's for a built-in instance, `<name>` for a named one.
    name: String,
    /// Its kind.
    kind: &'static batchd_provider::Kind,
    /// Whether it is a named instance (`[providers.<name>]`).
    named: bool,
    /// Whether it is configured.
    configured: bool,
}

impl Listed {
    /// The model names that route to it: the kind's for a built-in instance, `<name>/<model>` for a named one.
    fn models(&self) -> Vec<String> {
        if self.named {
            vec![format!("{}/<model>", self.name)]
        } else {
            self.kind.models.iter().map(|model| (*model).to_owned()).collect()
        }
    }
}

/// Every provider instance of `settings`: each kind's built-in one (configured or not), then the named ones.
fn listed(settings: &Settings) -> Vec<Listed> {
    crate::registry::instances(settings)
        .into_iter()
        .map(|(entry, instance)| Listed {
            name: instance.name(entry.kind()).to_owned(),
            kind: entry.kind(),
            named: matches!(instance, crate::registry::Instance::Named { .. }),
            configured: entry.configured(settings, instance),
        })
        .collect()
}

/// A configured provider whose models batchd cannot list (it reads no model list of theirs), what it accepts, and
/// the models its settings name.
fn unlisted(settings: &Settings, providers: &[Listed]) -> Vec<serde_json::Value> {
    providers
        .iter()
        .filter(|listed| listed.configured && listed.name != batchd_core::ids::CLOUDFLARE)
        .map(|listed| {
            let kind = listed.kind;
            let named: Vec<String> = match listed.name.as_str() {
                "openai" => {
                    let limits = settings.openai.models.iter().map(|limit| &limit.model);
                    let tokens = settings.openai.enqueued_token_limits.iter().map(|limit| &limit.model);
                    let mut named: Vec<String> = limits
                        .chain(tokens)
                        .map(|model| format!("openai/{}", model.strip_prefix("openai/").unwrap_or(model)))
                        .collect();
                    named.dedup();
                    named
                }
                _ => Vec::new(),
            };
            let why = format!(
                "batchd does not read {}'s model list: any {} its Batch API takes is accepted (an unknown one \
                 fails when its batch is created)",
                kind.title,
                listed.models().join(" ")
            );
            json!({"kind": listed.name, "why": why, "named_in_settings": named})
        })
        .collect()
}

/// Prints [`unlisted`] as text.
fn print_unlisted(unlisted: &[serde_json::Value]) {
    for provider in unlisted {
        println!();
        println!("{}: {}", provider["kind"].as_str().unwrap_or_default(), provider["why"].as_str().unwrap_or_default());
        let named: Vec<&str> =
            provider["named_in_settings"].as_array().into_iter().flatten().filter_map(|m| m.as_str()).collect();
        if !named.is_empty() {
            println!("  named in its settings: {}", escape_for_terminal(&named.join(" ")));
        }
    }
}

/// Runs `batchd models`.
pub async fn models(settings: &Settings, args: &ModelsArgs) -> anyhow::Result<()> {
    let providers = listed(settings);
    let unlisted = unlisted(settings, &providers);
    if !settings.cloudflare_configured() {
        let catalog = json!({"source": null, "fetched_at": null, "models": [], "unlisted": unlisted});
        print_providers(&providers, args.json, Some(catalog))?;
        if !args.json {
            println!();
            println!("Workers AI is not configured: its models are listed once it is ([cloudflare]).");
            print_unlisted(&unlisted);
        }
        return Ok(());
    }
    let mut conn = super::connect(settings).await?;
    let keys = settings.keys();
    let account = &settings.cloudflare.account_id;
    let cached = if args.refresh {
        None
    } else {
        batchd_queue::provider_cache::read_catalog(&mut conn, &keys, account)
            .await?
            .as_deref()
            .and_then(ModelCatalog::from_json)
    };
    let (catalog, source) = match cached {
        Some(catalog) => (Some(catalog), "cache".to_owned()),
        None => {
            let token = settings.api_token()?;
            let client = BatchClient::new(settings.client_settings(&token)).context("cloudflare settings")?;
            match client.model_catalog().await {
                Ok(mut catalog) => {
                    catalog.fetched_at_ms = batchd_queue::inspect::redis_now(&mut conn).await?;
                    batchd_queue::provider_cache::write_catalog(&mut conn, &keys, account, &catalog.to_json()).await?;
                    (Some(catalog), "api".to_owned())
                }
                Err(error) => (None, format!("tables (the catalog could not be read: {error})")),
            }
        }
    };
    let limits = &settings.rate_limits;
    let names: Vec<(String, bool)> = match &catalog {
        Some(catalog) => catalog.batchable().map(|model| (model.name.clone(), model.paid_only)).collect(),
        None => {
            limits.task_types.iter().chain(&limits.extra_task_types).map(|entry| (entry.model.clone(), false)).collect()
        }
    };
    let mut rows: Vec<Row> = Vec::with_capacity(names.len());
    for (model, paid_only) in names {
        if rows.iter().any(|row| row.model == model) {
            continue;
        }
        let (task, task_source) = limits.task_of(&model, catalog.as_ref());
        let bucket = rate_bucket(account, &model, limits, catalog.as_ref());
        rows.push(Row {
            task: task.as_str(),
            task_source: if limits.model_limit(&model).is_some() { "models" } else { task_source.as_str() },
            limit: bucket.as_ref().map_or(0, |(_, limit)| *limit),
            bucket: bucket.map(|(bucket, _)| bucket),
            paid_only,
            model,
        });
    }
    let fetched_at = catalog.as_ref().map(|catalog| catalog.fetched_at_ms);
    if args.json {
        let models: Vec<_> = rows
            .iter()
            .map(|row| {
                json!({"model": row.model, "task": row.task, "task_source": row.task_source, "bucket": row.bucket,
                       "limit": row.limit, "window_secs": limits.window_secs, "paid_only": row.paid_only})
            })
            .collect();
        return print_providers(
            &providers,
            true,
            Some(json!({"source": source, "fetched_at": fetched_at, "models": models, "unlisted": unlisted})),
        );
    }
    print_providers(&providers, false, None)?;
    println!();
    println!(
        "{} batchable Workers AI models (source: {}; limits per {} s)",
        rows.len(),
        escape_for_terminal(&source),
        limits.window_secs
    );
    let width = rows.iter().map(|row| row.model.chars().count()).max().unwrap_or(5).max(5);
    println!("{:<width$}  {:<18}  {:<18}  {:>6}  BUCKET", "MODEL", "TASK", "FROM", "LIMIT");
    for row in &rows {
        let limit = if row.limit == 0 { "-".to_owned() } else { row.limit.to_string() };
        let bucket = row.bucket.as_deref().unwrap_or("(not limited)");
        let paid = if row.paid_only { "  (Workers Paid plan)" } else { "" };
        println!(
            "{:<width$}  {:<18}  {:<18}  {:>6}  {}{paid}",
            escape_for_terminal(&row.model),
            row.task,
            row.task_source,
            limit,
            escape_for_terminal(bucket)
        );
    }
    print_unlisted(&unlisted);
    Ok(())
}

/// Prints the provider kinds: a table (`PROVIDER  MODELS  CAPABILITIES  CONFIGURED`), or with `json` one object
/// with `providers` and the fields of `catalog` (the Workers AI models; without it, `models` is empty).
fn print_providers(providers: &[Listed], json: bool, catalog: Option<serde_json::Value>) -> anyhow::Result<()> {
    if json {
        let listed: Vec<serde_json::Value> = providers
            .iter()
            .map(|listed| {
                let mut value = crate::registry::kind_json(listed.kind);
                value["configured"] = listed.configured.into();
                if listed.named {
                    value["name"] = listed.name.clone().into();
                    value["models"] = listed.models().into();
                }
                value
            })
            .collect();
        let mut value = catalog.unwrap_or_else(|| json!({"source": null, "fetched_at": null, "models": []}));
        value["providers"] = listed.into();
        return print_json(&value);
    }
    println!("{:<12}  {:<28}  {:<40}  CONFIGURED", "PROVIDER", "MODELS", "CAPABILITIES");
    for listed in providers {
        let capabilities: Vec<&str> =
            listed.kind.capabilities.named().iter().filter(|(_, has)| *has).map(|(name, _)| *name).collect();
        let capabilities = if capabilities.is_empty() { "-".to_owned() } else { capabilities.join(",") };
        let configured = if listed.configured { "yes" } else { "no" };
        let name = if listed.named { format!("{} ({})", listed.name, listed.kind.name) } else { listed.name.clone() };
        println!(
            "{:<12}  {:<28}  {capabilities:<40}  {configured}",
            escape_for_terminal(&name),
            escape_for_terminal(&listed.models().join(" "))
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_instances_are_listed_after_the_kinds_with_their_own_models() {
        let env = [
            ("BATCHD__PROVIDERS__GROQ__KIND", "openai"),
            ("BATCHD__PROVIDERS__GROQ__API_KEY", "gsk"),
            ("OPENAI_API_KEY", "sk"),
        ];
        let env = env.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect();
        let settings = Settings::load_from(None, &env).expect("settings");
        let listed = listed(&settings);
        let names: Vec<(&str, bool, bool)> =
            listed.iter().map(|listed| (listed.name.as_str(), listed.named, listed.configured)).collect();
        assert_eq!(
            names,
            [
                ("cloudflare", false, false),
                ("openai", false, true),
                ("anthropic", false, false),
                ("gemini", false, false),
                ("groq", true, true)
            ]
        );
        assert_eq!(listed[4].models(), ["groq/<model>"]);
        assert_eq!(listed[4].kind.name, "openai");
        let unlisted = unlisted(&settings, &listed);
        let kinds: Vec<&str> = unlisted.iter().map(|provider| provider["kind"].as_str().expect("kind")).collect();
        assert_eq!(kinds, ["openai", "groq"], "batchd lists neither's models");
    }
}
