//! `batchd workers`: the consumers of the ingress group (`XINFO CONSUMERS {ns}:submit batchd`), one per replica
//! start, with the entries each holds (read, not yet taken in) and how long it has been idle, plus the group's
//! totals and whether intake is paused.
//!
//! Redis decides what "idle" means: since the consumer's last read attempt on Redis 7.2 and newer (which also reports
//! `inactive`, the time since its last successful read), since its last read that returned entries on 7.0 and 7.1.
//! A replica that is gone stays listed until a replica starting up removes consumers that hold nothing and have
//! been idle for `max(10 x ingress.reclaim_idle_secs, 1 h)`; what it held is reclaimed after
//! `ingress.reclaim_idle_secs`. Consumer names are the replicas' own (`<host>-<pid>-<random>`) and are printed
//! escaped.

use std::time::Duration;

use anyhow::Context as _;
use batchd_core::Keys;
use batchd_core::keys::CONSUMER_GROUP;
use batchd_queue::Conn;
use serde_json::json;

use super::{escape_for_terminal, format_age, open, print_json};
use crate::settings::Settings;

/// Options of `batchd workers`.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkersArgs {
    /// Print JSON: `{"namespace":..,"stream":..,"group":..,"group_exists":..,"pending":..,"lag":..,"paused":..,
    /// "consumers":[{"name":..,"pending":..,"idle_ms":..,"inactive_ms":..}]}`.
    #[arg(long)]
    pub json: bool,
}

/// One consumer of the ingress group.
type Consumer = batchd_queue::inspect::Consumer;

/// What `batchd workers --json` prints (and the dashboard's overview shows per namespace): the ingress group, its
/// consumers with their idle times (the least idle first), and the pause flag.
pub(crate) async fn report(conn: &mut Conn, keys: &Keys) -> anyhow::Result<serde_json::Value> {
    let stream = keys.submit();
    let paused = super::pause::read(conn, keys).await?;
    let groups =
        batchd_queue::inspect::groups(conn, &stream).await.with_context(|| format!("read the groups of {stream}"))?;
    let group = groups.into_iter().find(|group| group.name.as_deref() == Some(CONSUMER_GROUP));
    let consumers = match group {
        Some(_) => batchd_queue::inspect::ingress_consumers(conn, keys)
            .await
            .with_context(|| format!("read the consumers of {stream}"))?,
        None => Vec::new(),
    };
    Ok(json!({
        "namespace": keys.namespace(),
        "stream": stream,
        "group": CONSUMER_GROUP,
        "group_exists": group.is_some(),
        "pending": group.as_ref().and_then(|group| group.pending),
        "lag": group.as_ref().and_then(|group| group.lag),
        "paused": paused.as_ref().map(super::pause::PauseRecord::to_json),
        "consumers": consumers,
    }))
}

/// `batchd workers`.
pub async fn workers(settings: &Settings, args: &WorkersArgs) -> anyhow::Result<()> {
    let keys = settings.keys();
    let stream = keys.submit();
    let mut conn = open(settings).await?;
    let report = report(&mut conn, &keys).await?;
    if args.json {
        return print_json(&report);
    }
    let paused = super::pause::PauseRecord::from_json(&report["paused"]);
    let group_exists = report["group_exists"].as_bool() == Some(true);
    let pending = report["pending"].as_i64();
    let lag = report["lag"].as_i64();
    let consumers: Vec<Consumer> = serde_json::from_value(report["consumers"].clone()).context("read consumers")?;
    let intake = match &paused {
        Some(record) => format!("intake {}", record.describe()),
        None => "intake running".to_owned(),
    };
    if !group_exists {
        println!(
            "{}: no consumer group {CONSUMER_GROUP} on {stream} yet (no replica has started here); {intake}",
            super::place(settings)
        );
        return Ok(());
    }
    println!(
        "{}: group {CONSUMER_GROUP} on {stream}, {} consumers, {} entries being taken in, {} waiting; {intake}",
        super::place(settings),
        consumers.len(),
        pending.unwrap_or(0),
        lag.map_or_else(|| "unknown".to_owned(), |lag| lag.to_string())
    );
    print!("{}", table(&consumers));
    Ok(())
}

fn table(consumers: &[Consumer]) -> String {
    let names: Vec<String> = consumers.iter().map(|c| escape_for_terminal(&c.name).into_owned()).collect();
    let width = names.iter().map(|name| name.chars().count()).max().unwrap_or(0).clamp(8, 60);
    let mut out = format!("{:<width$}  {:>9}  {:>8}  INACTIVE\n", "CONSUMER", "TAKING IN", "IDLE");
    for (consumer, name) in consumers.iter().zip(&names) {
        let inactive =
            consumer.inactive_ms.map_or_else(|| "-".to_owned(), |ms| format_age(Duration::from_millis(ms as u64)));
        out.push_str(&format!(
            "{name:<width$}  {:>9}  {:>8}  {inactive}\n",
            consumer.pending,
            format_age(Duration::from_millis(consumer.idle_ms))
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumers_read_as_a_table_with_names_escaped() {
        let consumers = [
            Consumer { name: "web-1-1234-abcd".into(), pending: 3, idle_ms: 120, inactive_ms: Some(5_000) },
            Consumer { name: "evil\u{1b}[2J".into(), pending: 0, idle_ms: 65_000, inactive_ms: None },
        ];
        let table = table(&consumers);
        assert_eq!(
            table,
            "CONSUMER         TAKING IN      IDLE  INACTIVE\n\
             web-1-1234-abcd          3     120ms  5.0s\n\
             evil\\x1b[2J              0     1m05s  -\n"
        );
    }
}
