//! What finished jobs cost, read from the finished-jobs counters (`cost_nusd:<model>`, written with each result):
//! by provider and model for `batchd stats --since`, and per UTC day for `batchd stats` and the dashboard.

use std::collections::BTreeMap;

use anyhow::Context as _;
use batchd_core::Keys;
use batchd_core::pricing::NANO_PER_USD;
use batchd_core::stats::Totals;
use batchd_queue::Conn;
use serde_json::{Value, json};

use super::escape_for_terminal;

/// Days of cost `batchd stats` and the dashboard show: today and the six before (the hourly counters live 8 days).
pub const DAYS: u64 = 7;

/// One day in milliseconds.
const DAY_MS: u64 = 86_400_000;

/// The provider a model runs on (`openai`, `cloudflare`, ...), `unknown` for a name that is not a model (a
/// counter's, a ledger's).
pub(crate) fn provider_of(model: &str) -> String {
    batchd_core::ModelName::parse(model).map_or_else(|_| "unknown".to_owned(), |name| name.provider().to_owned())
}

/// Nano-dollars as USD.
fn usd(nano: u64) -> f64 {
    nano as f64 / NANO_PER_USD
}

/// Cost by model (nano-dollars) as `{"total": usd, "by_provider": {..}, "by_model": {..}}`.
pub fn cost_json(cost_nano: &BTreeMap<String, u64>) -> Value {
    let mut by_provider: BTreeMap<String, u64> = BTreeMap::new();
    for (model, nano) in cost_nano {
        *by_provider.entry(provider_of(model)).or_default() += nano;
    }
    let as_usd = |map: &BTreeMap<String, u64>| -> BTreeMap<String, f64> {
        map.iter().map(|(name, nano)| (name.clone(), usd(*nano))).collect()
    };
    json!({
        "total": usd(cost_nano.values().sum()),
        "by_provider": as_usd(&by_provider),
        "by_model": as_usd(cost_nano),
    })
}

/// USD for people: cents for a dollar or more, more digits below.
pub fn format_usd(usd: f64) -> String {
    if usd >= 1.0 {
        format!("${usd:.2}")
    } else if usd >= 0.01 {
        format!("${usd:.4}")
    } else {
        format!("${usd:.6}")
    }
}

/// `  <label>  $total (provider $x, ...)` for a [`cost_json`] value; empty when nothing was priced.
pub fn cost_text(label: &str, cost: &Value) -> String {
    let total = cost["total"].as_f64().unwrap_or(0.0);
    if total <= 0.0 {
        return String::new();
    }
    let parts: Vec<String> = cost["by_provider"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(provider, usd)| format!("{} {}", escape_for_terminal(provider), format_usd(usd.as_f64().unwrap_or(0.0))))
        .collect();
    format!("  {label:<16} {} ({})\n", format_usd(total), parts.join(", "))
}

/// The UTC day (`2026-11-28`) that starts at `day_start_ms`.
fn day_name(day_start_ms: u64) -> String {
    super::format_utc(day_start_ms).chars().take(10).collect()
}

/// What finished jobs cost on each of the last [`DAYS`] UTC days, oldest first, up to `now` (Unix ms, Redis's
/// clock): `[{"day":"2026-11-28","from":<ms>,"total":usd,"by_provider":{..},"by_model":{..}}]`, from the hourly
/// counters (with the minutes not rolled up yet: exact to the last result). Bounded: at most 168 hour hashes and
/// 120 minute hashes, in one pipeline.
pub async fn daily(conn: &mut Conn, keys: &Keys, now: u64) -> anyhow::Result<Vec<Value>> {
    let today = now / DAY_MS;
    let first_day = today.saturating_sub(DAYS - 1);
    let (first_hour, last_hour) = (first_day * 24, now / 3_600_000);
    let hours = batchd_queue::inspect::hour_counters(conn, keys, first_hour, last_hour, now)
        .await
        .context("read the finished-jobs counters")?;
    let mut days = Vec::new();
    for day in first_day..=today {
        let from = ((day * 24).saturating_sub(first_hour)) as usize;
        let to = (((day + 1) * 24).saturating_sub(first_hour) as usize).min(hours.len());
        let totals = Totals::of(hours.get(from..to).unwrap_or_default());
        let mut row = cost_json(&totals.cost_nano);
        row["day"] = day_name(day * DAY_MS).into();
        row["from"] = (day * DAY_MS).into();
        days.push(row);
    }
    Ok(days)
}

/// The lines of `batchd stats` for [`daily`]: today's cost by provider, then the days before with a cost.
pub fn daily_text(days: &[Value]) -> String {
    let mut out = String::new();
    for (position, day) in days.iter().enumerate().rev() {
        let label = if position + 1 == days.len() {
            "cost today".to_owned()
        } else {
            format!("cost {}", day["day"].as_str().unwrap_or("?"))
        };
        out.push_str(&cost_text(&label, day));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_adds_up_by_provider_and_reads_in_dollars() {
        let cost = BTreeMap::from([
            ("openai/gpt-4o-mini".to_owned(), 1_500_000_000),
            ("openai/gpt-4o".to_owned(), 500_000_000),
            ("@cf/baai/bge-m3".to_owned(), 12_000),
        ]);
        let json = cost_json(&cost);
        assert_eq!(json["total"], 2.000012);
        assert_eq!(json["by_provider"]["openai"], 2.0);
        assert_eq!(json["by_provider"]["cloudflare"], 0.000012);
        assert_eq!(cost_text("cost", &json), "  cost             $2.00 (cloudflare $0.000012, openai $2.00)\n");
        assert_eq!(cost_text("cost", &cost_json(&BTreeMap::new())), "");
        assert_eq!(format_usd(0.0705), "$0.0705");
    }
}
