//! A rolling upgrade from the previous release under load (scenario 11): what a Deployment's rollout does to a
//! fleet when a release changes what is in Redis (this build packs small jobs into shared remote batches; the
//! previous release knows nothing of packs).

use std::path::PathBuf;
use std::time::Instant;

use super::process_faults::replace_in_slot;
use super::{FAULT_RATE, NO_PERSISTENCE, Timing, finish, secs, seed, start_daemons, supervised_sleep};
use crate::chaos::Size;
use crate::chaos::check::Outcome;
use crate::chaos::cluster::Cluster;
use crate::chaos::load::{self, Collector, Mix, spawn_producer};

/// The variable naming the previous release's `batchd` binary (`make chaos` builds it with
/// `scripts/previous-release.sh`, from the commit `PREVIOUS_RELEASE` names).
pub const PREVIOUS_RELEASE_BIN: &str = "BATCHD_PREVIOUS_RELEASE_BIN";

/// Scenario 11: three replicas of the previous release take jobs of all three providers; each is then replaced in
/// turn by a replica of this build (started, ready, then the old one gets SIGTERM, as a rollout does), with several
/// seconds between the steps, so both releases run side by side while packs are formed, sent and delivered. The
/// producer writes jobs both releases accept (none names `"pack"`, a field the previous release refuses). Every
/// job gets exactly one result, nothing is lost, and every duplicate remote submit is explained, as in every
/// scenario.
pub(super) async fn rolling_upgrade(size: Size) -> anyhow::Result<Outcome> {
    let previous =
        std::env::var_os(PREVIOUS_RELEASE_BIN).map(PathBuf::from).filter(|bin| bin.is_file()).ok_or_else(|| {
            anyhow::anyhow!(
                "{PREVIOUS_RELEASE_BIN} must name a batchd binary of the previous release (`make chaos` builds it \
                 with scripts/previous-release.sh)"
            )
        })?;
    let started = Instant::now();
    let seed = seed(size);
    let timing = Timing::new(size, size.pick((secs(1), secs(10)), (secs(1), secs(3))));
    let n_jobs = size.pick(3_000, 150);
    let mut outcome =
        Outcome::new("11-upgrade", "rolling upgrade of 3 replicas from the previous release under load", size);
    let mut cluster =
        Cluster::start("11-upgrade", size, &NO_PERSISTENCE, timing.emulator(FAULT_RATE, seed), &timing.vars).await?;
    cluster.event(format!(
        "scenario 11-upgrade ({}), seed {seed}, {n_jobs} jobs, from {}",
        size.as_str(),
        previous.display()
    ));
    for slot in 0..3 {
        cluster.set_slot_bin(slot, Some(previous.clone()));
    }
    start_daemons(&mut cluster, 3).await?;
    cluster.wait_ready(secs(30)).await?;
    let collector = Collector::start(cluster.conn.clone(), cluster.keys.clone());
    let (batch, every) =
        size.pick((50, std::time::Duration::from_millis(500)), (15, std::time::Duration::from_millis(400)));
    let mix = Mix::ALL.without_opt_outs();
    let producer =
        spawn_producer(cluster.conn.clone(), cluster.keys.clone(), load::ids("u", n_jobs), mix, batch, every);
    let mut stops = Vec::new();
    for slot in 0..3 {
        // Both releases run side by side for a while before each step.
        supervised_sleep(&mut cluster, size.pick(secs(8), secs(2))).await;
        cluster.set_slot_bin(slot, None);
        stops.extend(replace_in_slot(&mut cluster, slot, timing.grace, &mut outcome).await?);
    }
    let produced = producer.await?;
    finish(&mut cluster, collector, &produced, size.pick(secs(600), secs(120)), true, &mut outcome).await;
    outcome.expect(outcome.duplicated_results.is_empty() && outcome.lost.is_empty(), || {
        "the rolling upgrade lost or duplicated work".to_owned()
    });
    // The releases ran side by side while this build packed: a run with no pack tested no upgrade.
    let packs = outcome.figures.get("packs_created").and_then(serde_json::Value::as_u64).unwrap_or(0);
    outcome.expect(packs >= 1, || "no pack was created: the releases never ran side by side with packs".to_owned());
    outcome.figure("sigterm_to_exit_ms", stops.iter().map(|took| took.as_millis() as u64).collect::<Vec<_>>());
    outcome.figure("previous_release", previous.display().to_string());
    outcome.figure("seed", seed);
    outcome.wall = started.elapsed();
    Ok(outcome)
}
