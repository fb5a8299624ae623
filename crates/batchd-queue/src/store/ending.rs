//! A job's end: what publishing needs, the one publish transition (exactly once per job, guarded by the ledger
//! state) with the finished-jobs counters, and cancellation.

use super::*;

impl Store {
    /// Reads everything needed to build a job's result entry (or decide on a failed-items retry).
    pub async fn publish_context(&self, job_id: &JobId) -> Result<Option<PublishContext>, StoreError> {
        let key = self.keys.job(job_id);
        let head: Vec<Option<String>> = self
            .conn
            .clone()
            .hmget(
                &key,
                &[
                    field::MODEL,
                    field::REPLY_TO,
                    field::METADATA,
                    field::ACCEPTED_AT,
                    field::N_ITEMS,
                    field::N_CHUNKS,
                    field::RETRY_FAILED_ITEMS,
                    field::RETRIED,
                    field::N_REFERENCES,
                ][..],
            )
            .await?;
        let Some(n_chunks) = head[5].as_deref().and_then(|n| n.parse::<u32>().ok()) else {
            return Ok(None);
        };
        let n_references: usize = head[8].as_deref().and_then(|n| n.parse().ok()).unwrap_or(0);
        const PER_CHUNK: [&str; 8] = [
            field::CHUNK_REQUEST_ID,
            field::CHUNK_STATE,
            field::CHUNK_OUTPUT,
            field::CHUNK_LAST_ERROR,
            field::CHUNK_ITEMS,
            field::CHUNK_INDICES,
            field::CHUNK_PACK,
            field::CHUNK_REFERENCES,
        ];
        // A chunk's references are asked for only when the job has some.
        let per_chunk = if n_references > 0 { &PER_CHUNK[..] } else { &PER_CHUNK[..PER_CHUNK.len() - 1] };
        let mut chunks = Vec::with_capacity(n_chunks as usize);
        // Read chunk fields a few chunks at a time: outputs can be large.
        for first in (0..n_chunks).step_by(16) {
            let last = (first + 16).min(n_chunks);
            let names: Vec<String> =
                (first..last).flat_map(|index| per_chunk.iter().map(move |name| field::chunk(index, name))).collect();
            let values: Vec<Option<String>> = self.conn.clone().hmget(&key, &names[..]).await?;
            // Moved out of the reply, not cloned: outputs can be tens of MB.
            let mut values = values.into_iter();
            for index in first..last {
                let mut next = || values.next().flatten();
                let (request_id, state, output, last_error, items, indices, pack) =
                    (next(), next(), next(), next(), next(), next(), next());
                let references = if n_references > 0 { next() } else { None };
                let placement = Placement::parse(items.as_deref().unwrap_or(""), indices.as_deref().unwrap_or(""))
                    .ok_or_else(|| StoreError::Corrupt {
                        job_id: job_id.to_string(),
                        detail: format!("chunk {index} has no valid items"),
                    })?;
                chunks.push(ChunkRecord {
                    index,
                    request_id,
                    state: state.as_deref().and_then(|s| s.parse().ok()),
                    output,
                    last_error,
                    placement,
                    pack,
                    references,
                });
            }
        }
        Ok(Some(PublishContext {
            model: head[0].clone().unwrap_or_default(),
            reply_to: head[1].clone().unwrap_or_else(|| self.keys.results()),
            metadata: head[2].clone(),
            accepted_at: head[3].as_deref().and_then(|v| v.parse().ok()).unwrap_or(0),
            n_items: head[4].as_deref().and_then(|v| v.parse().ok()).unwrap_or(0),
            retry_failed_items: head[6].as_deref() == Some("1"),
            retried: head[7].as_deref() == Some("1"),
            n_references,
            chunks,
        }))
    }

    /// The `external_reference`s stored for `chunk` at take-in ([`field::CHUNK_REFERENCES`]), for a one-batch
    /// job published straight from its poll; asked only for a job that has some.
    pub async fn chunk_references(&self, chunk: &ChunkRef) -> Result<Option<String>, StoreError> {
        let name = field::chunk(chunk.index, field::CHUNK_REFERENCES);
        Ok(self.conn.clone().hget(self.keys.job(&chunk.job_id), name).await?)
    }

    /// Requests cancellation of a job (the `cancel` Redis function, [`crate::functions::cancel`]); returns its
    /// state (empty when no ledger exists yet: the request then waits for the job to arrive, for `ledger_ttl`).
    pub async fn cancel(&self, job_id: &JobId, reason: &str) -> Result<String, StoreError> {
        let state =
            crate::functions::cancel(&mut self.conn.clone(), &self.keys, job_id, self.settings.ledger_ttl, reason)
                .await?;
        if !state.is_empty() && state.parse::<JobState>().is_err() {
            return Err(unknown_answer("cancel", &state, job_id));
        }
        Ok(state)
    }

    /// Publishes `entry` to `reply_to` and closes the ledger with `state`, atomically and at most once per job.
    /// Returns false when the job had already finished (nothing was published).
    pub async fn publish(
        &self,
        job_id: &JobId,
        entry: ResultEntry,
        state: JobState,
        reply_to: &str,
        now: UnixMillis,
    ) -> Result<bool, StoreError> {
        if !self.keys.is_results_stream(reply_to) {
            return Err(StoreError::Corrupt {
                job_id: job_id.to_string(),
                detail: format!("reply_to {reply_to:?} is outside the namespace"),
            });
        }
        // The entry is serialised once and dropped, and the fields are dropped once copied into the command: a
        // merged result can be tens of MB, and each copy held at the same time counts.
        let fields = entry.to_fields();
        let error = entry.error.as_ref().map(JobError::to_json).unwrap_or_default();
        let counts = batchd_core::stats::increments(
            entry.status.as_str(),
            &entry.model,
            entry.result.as_ref().map(|output| &output.usage),
        );
        drop(entry);
        let mut cmd = ScriptCall::new(
            &self.scripts.publish,
            &[
                self.keys.job(job_id),
                reply_to.to_owned(),
                self.keys.schedule(),
                self.keys.cancel(job_id),
                self.stats_minute(now),
                self.keys.remote_batches(),
            ],
        );
        cmd.arg(state.as_str())
            .arg(now)
            .arg(self.settings.results_maxlen)
            .arg(self.settings.ledger_ttl.as_secs().max(1))
            .arg(job_id.as_str())
            .arg(error)
            .arg(fields.len());
        for (name, value) in &fields {
            cmd.arg(*name).arg(value);
        }
        drop(fields);
        count_args(&mut cmd, &counts);
        let published: i64 = self.run(&cmd).await?;
        if published == 2 {
            tracing::warn!(job_id = %job_id, "finished-jobs counters not updated (a counter key of another type)");
        }
        script_flag("publish", published.min(1), job_id)
    }

    /// The counter hash of the minute a job finished in at `now` (Redis's time).
    pub(super) fn stats_minute(&self, now: UnixMillis) -> String {
        self.keys.stats_minute(now / 60_000)
    }

    /// Adds the finished minutes' counters to their hours' (`roll_up.lua`), each minute once whichever replica
    /// calls; the daemon calls it on its sampler's rhythm. `now` only bounds how many minutes are offered: the
    /// script decides by Redis's clock which are over. Returns how many minutes were rolled up.
    pub async fn roll_up_counters(&self, now: UnixMillis) -> Result<u64, StoreError> {
        let cursor: Option<String> = self.conn.clone().get(self.keys.stats_rolled()).await?;
        let last = cursor.as_deref().and_then(|value| value.parse::<u64>().ok());
        let offered = match last {
            // A clock a few minutes behind Redis's still offers every minute that is over.
            Some(last) => (now / 60_000 + 5).saturating_sub(last).clamp(1, MAX_ROLL_UP),
            None => 0,
        };
        let first = last.unwrap_or(0) + 1;
        let mut keys = vec![self.keys.stats_rolled()];
        for minute in first..first + offered {
            keys.push(self.keys.stats_minute(minute));
            keys.push(self.keys.stats_hour(minute / 60));
        }
        let mut cmd = ScriptCall::new(&self.scripts.roll_up, &keys);
        cmd.arg(cursor.unwrap_or_default());
        for minute in first..first + offered {
            cmd.arg(minute);
        }
        self.run(&cmd).await
    }
}

/// A finished job's counts ([`batchd_core::stats::increments`]) as a script's counter pairs (`count_finished` in
/// prelude.lua): their number, then field/amount pairs.
pub(super) fn count_args(cmd: &mut redis::Cmd, counts: &[(String, u64)]) {
    cmd.arg(counts.len());
    for (name, n) in counts {
        cmd.arg(name).arg(*n);
    }
}
