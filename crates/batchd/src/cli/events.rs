//! `batchd events setup`: creates (or checks, with `--dry-run`) the event subscriptions that deliver Workers AI
//! batch events to the events queue, one per model: the configured ones (`[rate_limits]` `models`, `task_types`,
//! `extra_task_types`), those batchd has submitted for (recorded in Redis), and those named with `--model`.
//!
//! A `workersAi.model` subscription names one model, so a model without one is found only by its fallback poll,
//! minutes after it finished. Each model gets `batch.succeeded` and `batch.failed`; a subscription that exists but
//! is disabled or lacks one of them is updated (its other events are kept). Needs a token with Queues Edit.

use anyhow::{Context as _, bail};
use batchd_cloudflare::{BATCH_EVENTS, ModelCatalog, Step, SubscriptionClient, plan};
use batchd_core::ModelName;
use serde_json::json;

use super::{escape_for_terminal, print_json};
use crate::settings::Settings;

/// Most seen models read from Redis.
const MAX_SEEN: usize = 1000;

/// `batchd events ...`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum EventsCommand {
    /// Create the missing event subscriptions of the events queue, one per configured and seen model.
    Setup(SetupArgs),
}

/// Options of `batchd events setup`.
#[derive(Debug, Clone, clap::Args)]
pub struct SetupArgs {
    /// Print what would be created or updated, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Also subscribe this model (repeatable).
    #[arg(long = "model", value_name = "MODEL")]
    pub models: Vec<String>,
    /// Print JSON: `{"queue_id":..,"dry_run":..,"models":[{"model":..,"action":..,"subscription_id":..}]}`.
    #[arg(long)]
    pub json: bool,
}

/// Runs `batchd events ...`.
pub async fn events(settings: &Settings, command: &EventsCommand) -> anyhow::Result<()> {
    match command {
        EventsCommand::Setup(args) => setup(settings, args).await,
    }
}

/// Every Cloudflare model to subscribe: the configured ones, the seen ones, the catalog's batchable ones when the
/// cached catalog lists them among those, and `extra`; each once, in that order.
async fn models_to_subscribe(settings: &Settings, extra: &[String]) -> anyhow::Result<Vec<String>> {
    let limits = &settings.rate_limits;
    let mut models: Vec<String> = Vec::new();
    let configured = limits.models.iter().map(|limit| &limit.model);
    let tables = limits.task_types.iter().chain(&limits.extra_task_types).map(|entry| &entry.model);
    for model in configured.chain(tables).chain(extra) {
        if !models.contains(model) {
            models.push(model.clone());
        }
    }
    let mut conn = super::connect(settings).await?;
    let keys = settings.keys();
    let account = &settings.cloudflare.account_id;
    let seen = batchd_queue::provider_cache::models_seen(&mut conn, &keys, account, MAX_SEEN).await?;
    for model in seen {
        if !models.contains(&model) {
            models.push(model);
        }
    }
    // A model the catalog says cannot batch gets no events; it is left out (and said so).
    let catalog = batchd_queue::provider_cache::read_catalog(&mut conn, &keys, account)
        .await?
        .as_deref()
        .and_then(ModelCatalog::from_json);
    if let Some(catalog) = catalog {
        models.retain(|model| {
            let keep = !catalog.refuses(model);
            if !keep {
                eprintln!("skipping {}: the model catalog says it takes no batch requests", escape_for_terminal(model));
            }
            keep
        });
    }
    // Only Cloudflare's models have Workers AI events.
    models.retain(|model| ModelName::parse(model).is_ok_and(|name| name.provider() == batchd_core::ids::CLOUDFLARE));
    Ok(models)
}

async fn setup(settings: &Settings, args: &SetupArgs) -> anyhow::Result<()> {
    if !settings.events.enabled() {
        bail!("events.queue_id is empty: set the events queue first (docs/operations.md, \"Batch events\")");
    }
    let token = match settings.events_token()? {
        Some(token) => token,
        None => settings.api_token()?,
    };
    let queue_id = &settings.events.queue_id;
    let client = SubscriptionClient::new(settings.client_settings(&token), queue_id).context("events settings")?;
    let models = models_to_subscribe(settings, &args.models).await?;
    let subscriptions = client.list().await.context("list the events queue's subscriptions")?;
    let steps = plan(models.iter().map(String::as_str), &subscriptions, queue_id);
    let mut rows = Vec::with_capacity(steps.len());
    let mut failed = 0;
    for step in &steps {
        let (action, id, error) = match step {
            Step::Ready { id, .. } => ("ok", Some(id.clone()), None),
            Step::Create { .. } if args.dry_run => ("would create", None, None),
            Step::Update { id, .. } if args.dry_run => ("would update", Some(id.clone()), None),
            Step::Create { model } => match client.create(model).await {
                Ok(created) => ("created", Some(created.id), None),
                Err(error) => ("failed", None, Some(error.to_string())),
            },
            Step::Update { id, events, .. } => match client.update(id, events).await {
                Ok(updated) => ("updated", Some(updated.id), None),
                Err(error) => ("failed", Some(id.clone()), Some(error.to_string())),
            },
        };
        failed += usize::from(error.is_some());
        rows.push((step.model().to_owned(), action, id, error));
    }
    if args.json {
        let models: Vec<_> = rows
            .iter()
            .map(|(model, action, id, error)| {
                json!({"model": model, "action": action, "subscription_id": id, "error": error})
            })
            .collect();
        print_json(&json!({"queue_id": queue_id, "dry_run": args.dry_run, "events": BATCH_EVENTS, "models": models}))?;
    } else {
        println!(
            "events queue {} ({}), events {}{}",
            escape_for_terminal(queue_id),
            steps.len(),
            BATCH_EVENTS.join(", "),
            if args.dry_run { ", dry run: nothing changed" } else { "" }
        );
        for (model, action, id, error) in &rows {
            let id = id.as_deref().map(|id| format!(" {}", escape_for_terminal(id))).unwrap_or_default();
            let error = error.as_deref().map(|error| format!(": {}", escape_for_terminal(error))).unwrap_or_default();
            println!("{:<13} {}{id}{error}", action, escape_for_terminal(model));
        }
    }
    if failed > 0 {
        bail!("{failed} of {} subscriptions could not be created or updated", steps.len());
    }
    Ok(())
}
