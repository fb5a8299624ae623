//! How long work abandoned by a stopped or killed daemon waits: a tracker per death watches the schedule claims
//! and ingress entries the daemon held until other daemons take them over, and the run's trackers are judged
//! against the lease and reclaim bounds.

use std::time::{Duration, Instant};

use batchd_core::Keys;
use redis::aio::ConnectionManager;
use tokio::task::JoinHandle;

use super::check::Outcome;
use super::{human, unix_ms};

/// What happened to the work a stopped or killed daemon held.
#[derive(Debug, Clone, Default)]
pub struct Abandoned {
    /// When the daemon was killed or stopped, in Unix ms.
    pub at_ms: u64,
    /// Leased schedule members (of any daemon) seen at the moment of the kill or stop.
    pub leased_at_kill: usize,
    /// Schedule claims (leased steps) the daemon held.
    pub claims: usize,
    /// Ingress entries pending for its consumer.
    pub entries: usize,
    /// From the kill until the last of them was taken over.
    pub resumed_after: Option<Duration>,
    /// From the kill until the last claim was taken over.
    pub claims_resumed_after: Option<Duration>,
    /// From the kill until the last entry was taken over.
    pub entries_resumed_after: Option<Duration>,
    /// Members or entries not taken over before the tracker gave up.
    pub stuck: Vec<String>,
}

/// Watches, from the moment a daemon died (`pid`, at `at_ms`), the work it held until other daemons take it
/// over. Claims are schedule members whose score lies more than `threshold` in the future (a lease; polls and
/// retries are never scheduled that far out); those held by live daemons get re-scored before their lease ends,
/// the dead one's only after. Ingress entries are those pending for a consumer named after `pid`.
///
/// Fails on the first query Redis does not answer: the scenarios that track take-over (1 and 4) keep Redis up, so
/// an error is a fault of the run, and a claim the tracker could not see must not count as taken over.
pub fn track_abandoned(
    mut conn: ConnectionManager,
    keys: Keys,
    pid: u32,
    at_ms: u64,
    threshold: Duration,
    give_up: Duration,
) -> JoinHandle<redis::RedisResult<Abandoned>> {
    tokio::spawn(async move {
        let mut abandoned = Abandoned { at_ms, ..Abandoned::default() };
        let floor = at_ms + threshold.as_millis() as u64;
        let claims: Vec<(String, f64)> = redis::cmd("ZRANGEBYSCORE")
            .arg(keys.schedule())
            .arg(format!("({floor}"))
            .arg("+inf")
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await?;
        abandoned.leased_at_kill = claims.len();
        let marker = format!("-{pid}-");
        let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
            .arg(keys.submit())
            .arg("batchd")
            .arg("-")
            .arg("+")
            .arg(100_000)
            .query_async(&mut conn)
            .await?;
        let mut entries: Vec<(String, String)> = pending
            .into_iter()
            .filter(|(_, consumer, _, _)| consumer.contains(&marker))
            .map(|(id, consumer, _, _)| (id, consumer))
            .collect();
        let mut claims_open: Vec<(String, u64)> =
            claims.into_iter().map(|(member, score)| (member, score as u64)).collect();
        let mut claims_orphaned = 0;
        let started = Instant::now();
        while (!claims_open.is_empty() || !entries.is_empty()) && started.elapsed() < give_up {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now = unix_ms();
            if !claims_open.is_empty() {
                let mut cmd = redis::cmd("ZMSCORE");
                cmd.arg(keys.schedule());
                for (member, _) in &claims_open {
                    cmd.arg(member);
                }
                let scores = cmd.query_async::<Vec<Option<f64>>>(&mut conn).await?;
                let mut still = Vec::new();
                for ((member, lease_end), score) in claims_open.into_iter().zip(scores) {
                    if score.map(|score| score as u64) == Some(lease_end) {
                        still.push((member, lease_end));
                    } else if now + 500 >= lease_end {
                        // Changed only once its lease was over: it was the dead daemon's, and is resumed now.
                        claims_orphaned += 1;
                        let after = Duration::from_millis(now.saturating_sub(at_ms));
                        abandoned.claims_resumed_after = abandoned.claims_resumed_after.max(Some(after));
                    }
                }
                claims_open = still;
            }
            if !entries.is_empty() {
                let mut pipe = redis::pipe();
                for (id, _) in &entries {
                    pipe.cmd("XPENDING").arg(keys.submit()).arg("batchd").arg(id).arg(id).arg(1);
                }
                let replies = pipe.query_async::<Vec<Vec<(String, String, u64, u64)>>>(&mut conn).await?;
                let mut still = Vec::new();
                for ((id, consumer), reply) in entries.into_iter().zip(replies) {
                    if reply.first().is_some_and(|(_, owner, _, _)| *owner == consumer) {
                        still.push((id, consumer));
                    } else {
                        abandoned.entries += 1;
                        let after = Duration::from_millis(now.saturating_sub(at_ms));
                        abandoned.entries_resumed_after = abandoned.entries_resumed_after.max(Some(after));
                    }
                }
                entries = still;
            }
        }
        abandoned.claims = claims_orphaned;
        abandoned.stuck = claims_open
            .iter()
            .filter(|(_, lease_end)| unix_ms() > lease_end + 1_000)
            .map(|(member, _)| member.clone())
            .chain(entries.iter().map(|(id, _)| id.clone()))
            .collect();
        abandoned.entries += entries.len();
        abandoned.resumed_after = abandoned.claims_resumed_after.max(abandoned.entries_resumed_after);
        Ok(abandoned)
    })
}

/// Waits for the trackers of a run; a tracker that failed becomes a failure of the outcome (its kill is then not
/// judged), the others are returned for [`judge_abandoned`].
pub async fn collect_trackers(
    outcome: &mut Outcome,
    trackers: Vec<(String, JoinHandle<redis::RedisResult<Abandoned>>)>,
) -> anyhow::Result<Vec<(String, Abandoned)>> {
    let mut reports = Vec::new();
    for (what, tracker) in trackers {
        match tracker.await? {
            Ok(report) => reports.push((what, report)),
            Err(error) => outcome.failures.push(format!("after {what}: cannot follow the work it left: {error}")),
        }
    }
    Ok(reports)
}

/// Summarises the trackers of a run into the outcome: the longest wait, and a failure for work taken over
/// later than `claims_bound` (claims) or `entries_bound` (ingress entries), or never.
pub fn judge_abandoned(
    outcome: &mut Outcome,
    reports: &[(String, Abandoned)],
    claims_bound: Duration,
    entries_bound: Duration,
) {
    let claims: usize = reports.iter().map(|(_, report)| report.claims).sum();
    let leased: usize = reports.iter().map(|(_, report)| report.leased_at_kill).sum();
    outcome.figure("leased_claims_seen_at_kills", leased);
    let entries: usize = reports.iter().map(|(_, report)| report.entries).sum();
    let claims_after = reports.iter().filter_map(|(_, report)| report.claims_resumed_after).max();
    let entries_after = reports.iter().filter_map(|(_, report)| report.entries_resumed_after).max();
    outcome.figure("abandoned_claims", claims);
    outcome.figure("abandoned_ingress_entries", entries);
    outcome.figure("claims_resumed_within_ms", claims_after.map(|d| d.as_millis() as u64));
    outcome.figure("entries_resumed_within_ms", entries_after.map(|d| d.as_millis() as u64));
    for (what, report) in reports {
        outcome.expect(report.stuck.is_empty(), || {
            format!(
                "after {what}: {} claims/entries never taken over: {:?}",
                report.stuck.len(),
                report.stuck.iter().take(5).collect::<Vec<_>>()
            )
        });
    }
    if let Some(after) = claims_after {
        outcome.expect(after <= claims_bound, || {
            format!("an abandoned claim waited {} (bound {})", human(after), human(claims_bound))
        });
    }
    if let Some(after) = entries_after {
        outcome.expect(after <= entries_bound, || {
            format!("an abandoned ingress entry waited {} (bound {})", human(after), human(entries_bound))
        });
    }
    outcome.notes.push(format!(
        "work left behind by stopped or killed daemons: {claims} schedule claims waiting for their lease (all taken over within {}), {entries} ingress entries (within {})",
        claims_after.map_or("-".to_owned(), human),
        entries_after.map_or("-".to_owned(), human)
    ));
}
