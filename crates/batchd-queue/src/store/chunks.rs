//! A chunk's steps: claiming due schedule members under a lease, marking a submit, recording its outcome, adding
//! chunks (a split, the failed-items retry), the shared rate limiter, and batch events' request-id index.

use super::*;

impl Store {
    /// Claims up to `limit` (at most [`MAX_CLAIM`]) due schedule members (re-scored to now + lease).
    pub async fn claim_due(&self, now: UnixMillis, limit: usize) -> Result<Vec<String>, StoreError> {
        let lease_until = now + self.settings.lease.as_millis() as u64;
        let mut cmd = ScriptCall::new(&self.scripts.claim, &[self.keys.schedule()]);
        cmd.arg(now).arg(lease_until).arg(limit.clamp(1, MAX_CLAIM));
        let members: Vec<String> = self.run(&cmd).await?;
        Ok(members)
    }

    /// The score of the earliest schedule member, if any (to sleep until it is due).
    pub async fn next_due(&self) -> Result<Option<UnixMillis>, StoreError> {
        let first: Vec<(String, f64)> = self.conn.clone().zrange_withscores(self.keys.schedule(), 0, 0).await?;
        Ok(first.first().map(|(_, score)| *score as UnixMillis))
    }

    /// Makes `members` due at `due` again (hands back claimed work that was never started).
    pub async fn release(&self, members: &[String], due: UnixMillis) -> Result<(), StoreError> {
        if members.is_empty() {
            return Ok(());
        }
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(self.keys.schedule()).arg("XX");
        for member in members {
            cmd.arg(due).arg(member);
        }
        let _: i64 = cmd.query_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// Marks a chunk `submitting` and counts the attempt (see `begin_submit.lua`), returning what to post.
    pub async fn begin_submit(&self, chunk: &ChunkRef, now: UnixMillis) -> Result<SubmitTicket, StoreError> {
        let mut cmd = ScriptCall::new(
            &self.scripts.begin_submit,
            &[self.keys.job(&chunk.job_id), self.keys.cancel(&chunk.job_id)],
        );
        cmd.arg(chunk.index).arg(now);
        let (verdict, attempt, previous, items, indices, requests, model): (
            String,
            u64,
            String,
            String,
            String,
            String,
            String,
        ) = self.run(&cmd).await?;
        let verdict = SubmitVerdict::parse(&verdict, &chunk.job_id)?;
        Ok(match verdict {
            SubmitVerdict::Submit | SubmitVerdict::Resubmit => {
                let corrupt = |what: &str| StoreError::Corrupt {
                    job_id: chunk.job_id.to_string(),
                    detail: format!("chunk {}: {what}", chunk.index),
                };
                let placement = Placement::parse(&items, &indices).ok_or_else(|| corrupt("items"))?;
                let requests: Vec<Box<RawValue>> = serde_json::from_str(&requests).map_err(|_| corrupt("requests"))?;
                if requests.len() != placement.len() {
                    return Err(corrupt("requests do not match items"));
                }
                SubmitTicket::Go { attempt, resubmit: verdict == SubmitVerdict::Resubmit, model, requests, placement }
            }
            SubmitVerdict::Cancelled => SubmitTicket::Cancelled,
            SubmitVerdict::Skip => SubmitTicket::Skip { chunk_state: previous },
            SubmitVerdict::Gone => SubmitTicket::Gone,
        })
    }

    /// Sets chunk fields (`chunk_fields`, stored as `c<i>:<name>`) and job-level fields (`job_fields`),
    /// optionally increments one chunk field, and schedules the chunk at `due` — one atomic step. Returns false
    /// (and unschedules the chunk) when the job has finished meanwhile.
    pub async fn update_chunk(
        &self,
        chunk: &ChunkRef,
        due: Option<UnixMillis>,
        increment: Option<&str>,
        chunk_fields: &[(&str, String)],
        job_fields: &[(&str, String)],
    ) -> Result<bool, StoreError> {
        let mut cmd =
            ScriptCall::new(&self.scripts.update_chunk, &[self.keys.job(&chunk.job_id), self.keys.schedule()]);
        cmd.arg(chunk.to_string())
            .arg(due.map(|due| due.to_string()).unwrap_or_default())
            .arg(increment.map(|name| field::chunk(chunk.index, name)).unwrap_or_default());
        for (name, value) in chunk_fields {
            cmd.arg(field::chunk(chunk.index, name)).arg(value);
        }
        for (name, value) in job_fields {
            cmd.arg(*name).arg(value);
        }
        let updated: i64 = self.run(&cmd).await?;
        let updated = script_flag("update_chunk", updated, &chunk.job_id)?;
        if let (Some(due), true) = (due, updated) {
            self.scheduled(due);
        }
        Ok(updated)
    }

    /// Reads what a poll of `chunk` needs. `None` when the ledger does not exist (expired or never created).
    pub async fn load_chunk(&self, chunk: &ChunkRef) -> Result<Option<ChunkView>, StoreError> {
        let names = [
            field::STATE.to_owned(),
            field::MODEL.to_owned(),
            field::chunk(chunk.index, field::CHUNK_STATE),
            field::chunk(chunk.index, field::CHUNK_REQUEST_ID),
            field::chunk(chunk.index, field::CHUNK_ITEMS),
            field::chunk(chunk.index, field::CHUNK_N_POLLS),
            field::chunk(chunk.index, field::CHUNK_POLL_FAILURES),
            field::DEADLINE_AT.to_owned(),
            field::ACCEPTED_AT.to_owned(),
            field::N_CHUNKS.to_owned(),
            field::N_ITEMS.to_owned(),
            field::REPLY_TO.to_owned(),
            field::METADATA.to_owned(),
            field::chunk(chunk.index, field::CHUNK_REMOTE_STATUS),
            field::chunk(chunk.index, field::CHUNK_REMOTE),
            field::ENDPOINT.to_owned(),
        ];
        let (values, cancel_requested): (Vec<Option<String>>, Option<String>) = redis::pipe()
            .hmget(self.keys.job(&chunk.job_id), &names[..])
            .get(self.keys.cancel(&chunk.job_id))
            .query_async(&mut self.conn.clone())
            .await?;
        let Some(state) = values[0].as_deref() else {
            return Ok(None);
        };
        let corrupt = |what: &str| StoreError::Corrupt { job_id: chunk.job_id.to_string(), detail: what.to_owned() };
        let number = |index: usize| -> u64 { values[index].as_deref().and_then(|v| v.parse().ok()).unwrap_or(0) };
        let (items_start, items_len) = parse_items(values[4].as_deref()).ok_or_else(|| corrupt("chunk items"))?;
        Ok(Some(ChunkView {
            job_state: state.parse().map_err(|_| corrupt("job state"))?,
            model: values[1].clone().unwrap_or_default(),
            chunk_state: values[2].as_deref().unwrap_or("").parse().map_err(|_| corrupt("chunk state"))?,
            request_id: values[3].clone(),
            items_start,
            items_len,
            n_polls: number(5),
            poll_failures: number(6),
            deadline_at: number(7),
            accepted_at: number(8),
            n_chunks: number(9) as u32,
            n_items: number(10) as usize,
            reply_to: values[11].clone().unwrap_or_else(|| self.keys.results()),
            metadata: values[12].clone(),
            remote_status: values[13].clone(),
            remote: values[14].clone(),
            endpoint: values[15].clone(),
            cancel_requested,
        }))
    }

    /// Stores a finished chunk's output (`state` done) or error (`state` failed) and unschedules it; returns the
    /// number of the job's chunks still open, or `None` when the job already finished.
    pub async fn chunk_done(
        &self,
        chunk: &ChunkRef,
        state: ChunkState,
        payload: &str,
        now: UnixMillis,
    ) -> Result<Option<u32>, StoreError> {
        let mut cmd = ScriptCall::new(&self.scripts.chunk_done, &[self.keys.job(&chunk.job_id), self.keys.schedule()]);
        cmd.arg(chunk.to_string())
            .arg(chunk.index)
            .arg(state.as_str())
            .arg(payload)
            .arg(now)
            .arg(now + self.settings.lease.as_millis() as u64);
        let open: i64 = self.run(&cmd).await?;
        match open {
            -1 => Ok(None),
            open => u32::try_from(open).map(Some).map_err(|_| unknown_answer("chunk_done", open, &chunk.job_id)),
        }
    }

    /// The stored request items of one chunk.
    pub async fn chunk_requests(&self, chunk: &ChunkRef) -> Result<Vec<Box<serde_json::value::RawValue>>, StoreError> {
        let text: Option<String> = self
            .conn
            .clone()
            .hget(self.keys.job(&chunk.job_id), field::chunk(chunk.index, field::CHUNK_REQUESTS))
            .await?;
        text.as_deref().and_then(|text| serde_json::from_str(text).ok()).ok_or_else(|| StoreError::Corrupt {
            job_id: chunk.job_id.to_string(),
            detail: format!("chunk {} has no stored requests", chunk.index),
        })
    }

    /// Adds chunks to a running job, due at `due`: `replaced` (when given) is rewritten with the first of
    /// `chunks`, the rest are appended. With `once_flag`, this happens at most once per job (the flag is set).
    pub async fn add_chunks(
        &self,
        job_id: &JobId,
        due: UnixMillis,
        replaced: Option<u32>,
        once_flag: Option<&str>,
        chunks: &[NewChunk],
    ) -> Result<AddOutcome, StoreError> {
        let mut cmd = ScriptCall::new(&self.scripts.add_chunks, &[self.keys.job(job_id), self.keys.schedule()]);
        cmd.arg(job_id.as_str())
            .arg(due)
            .arg(replaced.map(|index| index.to_string()).unwrap_or_default())
            .arg(once_flag.unwrap_or(""));
        for chunk in chunks {
            let (items, indices) = chunk.placement.encode();
            cmd.arg(items).arg(indices).arg(RequestsArg(&chunk.requests));
        }
        let outcome: i64 = self.run(&cmd).await?;
        if outcome == 1 {
            self.scheduled(due);
        }
        Ok(match outcome {
            1 => AddOutcome::Added,
            0 => AddOutcome::AlreadyDone,
            -1 => AddOutcome::Gone,
            other => return Err(unknown_answer("add_chunks", other, job_id)),
        })
    }

    /// Asks the shared limiter of `bucket` for one slot; `None` means go now (the slot is booked), otherwise how
    /// long to wait before asking again. `interval` is the window divided by the limit.
    pub async fn rate_limit(
        &self,
        bucket: &str,
        interval: Duration,
        burst: u32,
    ) -> Result<Option<Duration>, StoreError> {
        let mut cmd = ScriptCall::new(&self.scripts.rate_limit, &[self.keys.rate_limit(bucket)]);
        cmd.arg(interval.as_secs_f64() * 1000.0).arg(burst.max(1));
        let wait_ms: u64 = self.run(&cmd).await?;
        Ok((wait_ms > 0).then(|| Duration::from_millis(wait_ms)))
    }

    /// Remembers which chunk a remote batch belongs to, by its request id, until the ledger expires (the job's
    /// deadline plus the ledger's lifetime), so a batch event can wake the chunk ([`Store::wake_request`]).
    pub async fn index_request(
        &self,
        request_id: &str,
        chunk: &ChunkRef,
        deadline_at: UnixMillis,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let ledger_ttl = u64::try_from(self.settings.ledger_ttl.as_millis()).unwrap_or(u64::MAX);
        let millis = deadline_at.saturating_sub(now).saturating_add(ledger_ttl).max(1);
        let _: () = redis::cmd("SET")
            .arg(self.keys.request(request_id))
            .arg(chunk.to_string())
            .arg("PX")
            .arg(millis)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Makes the chunk of the batch `request_id` due now, if batchd knows the request id and the chunk is
    /// polling and was not woken within `min_gap` (see `wake.lua`). Returns the chunk and whether it was woken;
    /// `None` for an unknown request id.
    pub async fn wake_request(
        &self,
        request_id: &str,
        now: UnixMillis,
        min_gap: Duration,
    ) -> Result<Option<(ChunkRef, bool)>, StoreError> {
        let member: Option<String> =
            redis::cmd("GET").arg(self.keys.request(request_id)).query_async(&mut self.conn.clone()).await?;
        let Some(chunk) = member.and_then(|member| ChunkRef::parse(&member).ok()) else {
            return Ok(None);
        };
        let mut cmd = ScriptCall::new(&self.scripts.wake, &[self.keys.job(&chunk.job_id), self.keys.schedule()]);
        cmd.arg(chunk.to_string())
            .arg(chunk.index)
            .arg(now)
            .arg(min_gap.as_millis() as u64)
            .arg(crate::ledger_view::CHUNK_WOKEN_AT);
        let woken: i64 = self.run(&cmd).await?;
        let woken = script_flag("wake", woken, &chunk.job_id)?;
        if woken {
            self.soon_due.notify_one();
        }
        Ok(Some((chunk, woken)))
    }

    /// Takes `member` off the schedule (a member batchd did not write, or whose ledger is corrupt).
    pub async fn drop_member(&self, member: &str) -> Result<(), StoreError> {
        let _: i64 =
            redis::cmd("ZREM").arg(self.keys.schedule()).arg(member).query_async(&mut self.conn.clone()).await?;
        Ok(())
    }
}
