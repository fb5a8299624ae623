//! A chunk's steps: claiming due schedule members under a lease (each claim a fencing token), the named transitions
//! a claim holder makes (marking a submit, recording its outcome, renewing or handing back the lease, adding
//! chunks for a split or the failed-items retry), the shared rate limiter, and batch events' request-id index.

use super::*;

/// The error of a fenced write the script refused.
fn stale(claim: &Claim, detail: String) -> StoreError {
    StoreError::StaleClaim { job_id: claim.chunk.job_id.to_string(), chunk: claim.chunk.index, detail }
}

impl Store {
    /// Claims up to `limit` (at most [`MAX_CLAIM`]) due schedule members: each is re-scored to now + lease and its
    /// chunk's claim counter incremented (`claim.lua`), so the [`Claim`]s returned fence out any earlier holder.
    /// Each claim carries the chunk's view ([`ChunkView`]) as the claim read it, so its step starts without a read.
    /// One read of the schedule finds the candidates (and, when fewer are due, the next due time); the script
    /// claims those still due. Nothing due: no script runs.
    /// Packs' work ([`Keys::packs`]) is claimed first, then jobs' ([`Keys::schedule`]).
    pub async fn claim_due(&self, now: UnixMillis, limit: usize) -> Result<Claimed, StoreError> {
        let limit = limit.clamp(1, MAX_CLAIM);
        let mut claimed = self.claim_due_in(&self.keys.packs(), now, limit).await?;
        let left = limit - claimed.claims.len() - claimed.unknown.len();
        if left == 0 {
            return Ok(claimed);
        }
        let jobs = self.claim_due_in(&self.keys.schedule(), now, left).await?;
        claimed.next_due = match (claimed.next_due, jobs.next_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        claimed.claims.extend(jobs.claims);
        claimed.unknown.extend(jobs.unknown);
        Ok(claimed)
    }

    async fn claim_due_in(&self, schedule: &str, now: UnixMillis, limit: usize) -> Result<Claimed, StoreError> {
        let read: Vec<(String, f64)> = redis::cmd("ZRANGEBYSCORE")
            .arg(schedule)
            .arg("-inf")
            .arg("+inf")
            .arg("WITHSCORES")
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut self.conn.clone())
            .await?;
        let mut claimed = Claimed::default();
        if read.len() == limit {
            // Every member read may be due (and a few of them claimed by another replica meanwhile): look again soon.
            claimed.next_due = Some(now);
        }
        let mut candidates = Vec::new();
        for (member, score) in read {
            let score = score as UnixMillis;
            if score > now {
                claimed.next_due = Some(score);
                break;
            }
            match ChunkRef::parse(&member) {
                Ok(chunk) => candidates.push((member, chunk)),
                Err(_) => claimed.unknown.push(member),
            }
        }
        if candidates.is_empty() {
            return Ok(claimed);
        }
        let lease_until = now + self.settings.lease.as_millis() as u64;
        let mut keys = Vec::with_capacity(2 * candidates.len() + 1);
        keys.push(schedule.to_owned());
        for (_, chunk) in &candidates {
            keys.push(self.keys.job(&chunk.job_id));
            keys.push(self.keys.cancel(&chunk.job_id));
        }
        let mut cmd = ScriptCall::new(&self.scripts.claim, &keys);
        cmd.arg(now).arg(lease_until);
        for (member, chunk) in &candidates {
            cmd.arg(member).arg(chunk.index);
        }
        let answer: Vec<redis::Value> = self.run(&cmd).await?;
        let mut answer = answer.into_iter();
        let bad = |what: &str| unknown_answer("claim", what, &"a claim");
        while let Some(member) = answer.next() {
            let member: String = redis::from_redis_value(member).map_err(|_| bad("member"))?;
            let chunk = ChunkRef::parse(&member).map_err(|_| unknown_answer("claim", &member, &member))?;
            let token: u64 =
                redis::from_redis_value(answer.next().ok_or_else(|| bad("no token"))?).map_err(|_| bad("token"))?;
            let mut claim = Claim::new(chunk, token);
            if token > 0 {
                // The chunk's view as the claim found it, then its cancel flag.
                let mut values = Vec::with_capacity(VIEW_FIELDS.len());
                for _ in 0..VIEW_FIELDS.len() {
                    let value = answer.next().ok_or_else(|| bad("a short view"))?;
                    values.push(redis::from_redis_value(value).map_err(|_| bad("a view value"))?);
                }
                let cancel = redis::from_redis_value(answer.next().ok_or_else(|| bad("no cancel flag"))?)
                    .map_err(|_| bad("the cancel flag"))?;
                // A ledger the view cannot be read from is the step's to report (its own read fails the same
                // way), never the whole claim's: the other members claimed with it go on.
                claim.view = self.view(&claim.chunk, values, cancel).ok().flatten().map(Box::new);
            }
            claimed.claims.push(claim);
        }
        Ok(claimed)
    }

    /// The score of the earliest member of the schedules (jobs' and packs'), if any (to sleep until it is due).
    pub async fn next_due(&self) -> Result<Option<UnixMillis>, StoreError> {
        let mut next: Option<UnixMillis> = None;
        for schedule in [self.keys.schedule(), self.keys.packs()] {
            let first: Vec<(String, f64)> = self.conn.clone().zrange_withscores(schedule, 0, 0).await?;
            if let Some((_, score)) = first.first() {
                let score = *score as UnixMillis;
                next = Some(next.map_or(score, |next| next.min(score)));
            }
        }
        Ok(next)
    }

    /// Hands claimed work that was never started back, due at `due` (each claim fenced: one taken over meanwhile
    /// is left to its new holder). Returns how many were handed back.
    pub async fn release(&self, claims: &[Claim], due: UnixMillis) -> Result<usize, StoreError> {
        let mut released = 0;
        for claim in claims {
            match self.transition(claim, Transition::Release, Some(due), &[]).await {
                Ok(_) => released += 1,
                Err(StoreError::StaleClaim { .. }) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(released)
    }

    /// Marks a chunk `submitting` and counts the attempt (see `begin_submit.lua`), returning what to post; a claim
    /// taken over meanwhile is [`StoreError::StaleClaim`].
    pub async fn begin_submit(&self, claim: &Claim, now: UnixMillis) -> Result<SubmitTicket, StoreError> {
        let chunk = &claim.chunk;
        let mut cmd = ScriptCall::new(
            &self.scripts.begin_submit,
            &[self.keys.job(&chunk.job_id), self.keys.cancel(&chunk.job_id)],
        );
        cmd.arg(chunk.index).arg(now).arg(claim.token);
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
            SubmitVerdict::Submit | SubmitVerdict::Resubmit | SubmitVerdict::ResumeLook => {
                let corrupt = |what: &str| StoreError::Corrupt {
                    job_id: chunk.job_id.to_string(),
                    detail: format!("chunk {}: {what}", chunk.index),
                };
                let placement = Placement::parse(&items, &indices).ok_or_else(|| corrupt("items"))?;
                let requests: Vec<Box<RawValue>> = if requests.is_empty() && chunk.job_id.is_pack() {
                    // A pack's first chunk: its members' items, read from their ledgers.
                    self.pack_requests(&chunk.job_id).await?
                } else {
                    serde_json::from_str(&requests).map_err(|_| corrupt("requests"))?
                };
                if requests.len() != placement.len() {
                    return Err(corrupt("requests do not match items"));
                }
                SubmitTicket::Go {
                    attempt,
                    resubmit: verdict != SubmitVerdict::Submit,
                    looked: verdict == SubmitVerdict::ResumeLook,
                    model,
                    requests,
                    placement,
                }
            }
            SubmitVerdict::Stale => {
                return Err(stale(claim, format!("begin_submit found the chunk {previous} under a later claim")));
            }
            SubmitVerdict::Cancelled => SubmitTicket::Cancelled,
            SubmitVerdict::Skip => SubmitTicket::Skip { chunk_state: previous },
            SubmitVerdict::Gone => SubmitTicket::Gone,
        })
    }

    /// The remote batch of a `submitting` chunk exists: records its request id and `remote_status`, marks the
    /// chunk `polling` (the job `running`) and schedules its first poll at `due`. [`Fenced::Gone`] when the job
    /// has finished.
    pub async fn mark_submitted(
        &self,
        claim: &Claim,
        request_id: &str,
        remote_status: &str,
        remote: Option<&str>,
        due: UnixMillis,
    ) -> Result<Fenced, StoreError> {
        let values = [request_id, remote_status, remote.unwrap_or("")];
        self.fenced(claim, Transition::MarkSubmitted, Some(due), &values).await
    }

    /// A multi-request submit of the `submitting` chunk created part of its remote batch: records `remote` (the
    /// provider's references, JSON) so a resumed submit reuses it, and renews the lease to `lease_until`.
    pub async fn record_remote(
        &self,
        claim: &Claim,
        remote: &str,
        lease_until: UnixMillis,
    ) -> Result<bool, StoreError> {
        self.transition(claim, Transition::RecordRemote, Some(lease_until), &[remote]).await
    }

    /// A poll found the `polling` chunk's batch still running with `remote_status`: counts the poll, resets the
    /// failed polls and schedules the next one at `due`.
    pub async fn mark_pending_poll(
        &self,
        claim: &Claim,
        remote_status: &str,
        due: UnixMillis,
    ) -> Result<bool, StoreError> {
        self.transition(claim, Transition::MarkPendingPoll, Some(due), &[remote_status]).await
    }

    /// The `polling` chunk's batch was refused for a quota after it was created (OpenAI's enqueued-token limit):
    /// it goes back to `submitting`, due at `due`, with `failures` in a row and the error recorded; the resubmit
    /// reuses what the provider recorded.
    pub async fn mark_recreate(
        &self,
        claim: &Claim,
        failures: u64,
        last_error: &str,
        due: UnixMillis,
    ) -> Result<bool, StoreError> {
        self.transition(claim, Transition::MarkRecreate, Some(due), &[&failures.to_string(), last_error]).await
    }

    /// A poll of the `polling` chunk failed and is retried at `due`: records `failures` in a row and the error.
    pub async fn mark_poll_failed(
        &self,
        claim: &Claim,
        failures: u64,
        last_error: &str,
        due: UnixMillis,
    ) -> Result<bool, StoreError> {
        self.transition(claim, Transition::MarkPollFailed, Some(due), &[&failures.to_string(), last_error]).await
    }

    /// A submit of the `submitting` chunk failed and is retried at `due`, from the state in `record` (left
    /// `submitting`, its attempt is recorded as uncertain: no submit of it is in flight until the retry).
    pub async fn mark_submit_retry(
        &self,
        claim: &Claim,
        record: &SubmitRetryRecord,
        due: UnixMillis,
    ) -> Result<Fenced, StoreError> {
        let attempts = record.attempts.map(|n| n.to_string()).unwrap_or_default();
        self.fenced(
            claim,
            Transition::MarkSubmitRetry,
            Some(due),
            &[record.state.as_str(), &record.last_error, &attempts, if record.looked { "1" } else { "" }],
        )
        .await
    }

    /// A cancelled job's `submitting` chunk whose earlier submit was looked up at its provider and created
    /// nothing: it is `pending` (never sent), due at `due`.
    pub async fn mark_unsent(&self, claim: &Claim, due: UnixMillis) -> Result<bool, StoreError> {
        self.transition(claim, Transition::MarkUnsent, Some(due), &[]).await
    }

    /// The daemon acts on the job's cancellation: records when (the claim's time, Redis's clock) unless a step
    /// already did, and renews the claim's lease to `lease_until`. Returns when the cancel was first seen, or
    /// `None` when the job has finished.
    pub async fn note_cancel(&self, claim: &Claim, lease_until: UnixMillis) -> Result<Option<UnixMillis>, StoreError> {
        Ok(match self.fenced(claim, Transition::NoteCancel, Some(lease_until), &[]).await? {
            Fenced::Applied { cancel_seen_at } => cancel_seen_at,
            Fenced::Gone => None,
        })
    }

    /// The job's cancellation was withdrawn after a step acted on it: drops when it was first seen (so a later
    /// cancel waits from when it is acted on) and renews the claim's lease to `lease_until`.
    pub async fn forget_cancel(&self, claim: &Claim, lease_until: UnixMillis) -> Result<bool, StoreError> {
        self.transition(claim, Transition::ForgetCancel, Some(lease_until), &[]).await
    }

    /// The rate limiter said wait: the unfinished chunk is due again at `due`, nothing else changes.
    pub async fn reschedule(&self, claim: &Claim, due: UnixMillis) -> Result<bool, StoreError> {
        self.transition(claim, Transition::Reschedule, Some(due), &[]).await
    }

    /// Extends the claim's lease to `lease_until` while its step is still working (a heartbeat). A claim taken over
    /// meanwhile is [`StoreError::StaleClaim`]: the step's own writes will be refused too.
    pub async fn renew(&self, claim: &Claim, lease_until: UnixMillis) -> Result<bool, StoreError> {
        self.transition(claim, Transition::Renew, Some(lease_until), &[]).await
    }

    /// Takes a chunk of a finished (or vanished) job off the schedule; a chunk of a live job is left alone.
    pub async fn forget(&self, claim: &Claim) -> Result<(), StoreError> {
        match self.transition(claim, Transition::Forget, None, &[]).await {
            Ok(_) | Err(StoreError::StaleClaim { .. }) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Runs `transition.lua`: `Ok(true)` applied, `Ok(false)` the job has finished (the member was unscheduled),
    /// [`StoreError::StaleClaim`] when the claim was taken over or the chunk is not in a state `transition` starts
    /// from (nothing written).
    async fn transition(
        &self,
        claim: &Claim,
        transition: Transition,
        due: Option<UnixMillis>,
        values: &[&str],
    ) -> Result<bool, StoreError> {
        Ok(self.fenced(claim, transition, due, values).await?.applied())
    }

    /// [`Store::transition`], with what the script read of the job's cancellation.
    async fn fenced(
        &self,
        claim: &Claim,
        transition: Transition,
        due: Option<UnixMillis>,
        values: &[&str],
    ) -> Result<Fenced, StoreError> {
        let chunk = &claim.chunk;
        let now = self.now().await?;
        let mut cmd = ScriptCall::new(
            &self.scripts.transition,
            &[self.keys.job(&chunk.job_id), self.keys.schedule_of(&chunk.job_id), self.keys.remote_batches()],
        );
        cmd.arg(transition.as_str())
            .arg(chunk.to_string())
            .arg(chunk.index)
            .arg(claim.token)
            .arg(due.map(|due| due.to_string()).unwrap_or_default())
            .arg(now);
        for value in values {
            cmd.arg(*value);
        }
        let (verdict, chunk_state, held, cancel_seen_at): (String, String, String, String) = self.run(&cmd).await?;
        match FenceVerdict::parse(&verdict, &chunk.job_id)? {
            FenceVerdict::Applied => {
                let lease_only = matches!(
                    transition,
                    Transition::Renew | Transition::RecordRemote | Transition::NoteCancel | Transition::ForgetCancel
                );
                if let Some(due) = due.filter(|_| !lease_only) {
                    self.scheduled(due);
                }
                Ok(Fenced::Applied { cancel_seen_at: cancel_seen_at.parse().ok() })
            }
            FenceVerdict::Gone => Ok(Fenced::Gone),
            FenceVerdict::Stale => {
                Err(stale(claim, format!("{} found the chunk {chunk_state} under claim {held}", transition.as_str())))
            }
            FenceVerdict::Refused => {
                Err(stale(claim, format!("{} does not start from a {chunk_state:?} chunk", transition.as_str())))
            }
        }
    }

    /// Reads what a step of `chunk` needs (what [`Store::claim_due`] reads in the claim). `None` when the ledger
    /// does not exist (expired or never created).
    pub async fn load_chunk(&self, chunk: &ChunkRef) -> Result<Option<ChunkView>, StoreError> {
        let names: Vec<String> = VIEW_FIELDS.iter().map(|field| field.name(chunk.index)).collect();
        let (values, cancel_requested): (Vec<Option<String>>, Option<String>) = redis::pipe()
            .hmget(self.keys.job(&chunk.job_id), &names[..])
            .get(self.keys.cancel(&chunk.job_id))
            .query_async(&mut self.conn.clone())
            .await?;
        self.view(chunk, values, cancel_requested)
    }

    /// A [`ChunkView`] from the values of [`VIEW_FIELDS`] (in that order) and the cancel flag; `None` when the
    /// ledger has no state (it does not exist).
    fn view(
        &self,
        chunk: &ChunkRef,
        values: Vec<Option<String>>,
        cancel_requested: Option<String>,
    ) -> Result<Option<ChunkView>, StoreError> {
        let corrupt = |what: &str| StoreError::Corrupt { job_id: chunk.job_id.to_string(), detail: what.to_owned() };
        if values.len() != VIEW_FIELDS.len() {
            return Err(corrupt("the chunk's view has the wrong number of fields"));
        }
        let mut values = values.into_iter();
        let mut next = || values.next().flatten();
        let Some(state) = next() else {
            return Ok(None);
        };
        let number = |value: Option<String>| -> u64 { value.as_deref().and_then(|v| v.parse().ok()).unwrap_or(0) };
        let model = next().unwrap_or_default();
        let chunk_state = next().unwrap_or_default().parse().map_err(|_| corrupt("chunk state"))?;
        let request_id = next();
        let (items_start, items_len) = parse_items(next().as_deref()).ok_or_else(|| corrupt("chunk items"))?;
        Ok(Some(ChunkView {
            job_state: state.parse().map_err(|_| corrupt("job state"))?,
            model,
            chunk_state,
            request_id,
            items_start,
            items_len,
            n_polls: number(next()),
            poll_failures: number(next()),
            deadline_at: number(next()),
            accepted_at: number(next()),
            n_chunks: number(next()) as u32,
            n_items: number(next()) as usize,
            reply_to: next().unwrap_or_else(|| self.keys.results()),
            metadata: next(),
            remote_status: next(),
            claim: number(next()),
            remote: next(),
            endpoint: next(),
            n_references: number(next()) as usize,
            cancel_seen_at: next().and_then(|value| value.parse().ok()),
            submitted_at: next().and_then(|value| value.parse().ok()),
            pack: next(),
            pack_members: next().and_then(|value| value.parse().ok()),
            cancel_requested,
        }))
    }

    /// Stores a finished chunk's output (`state` done) or error (`state` failed) and unschedules it; returns the
    /// number of the job's chunks still open, or `None` when the job already finished. A claim taken over meanwhile
    /// (or a chunk not in a state a step finishes) is [`StoreError::StaleClaim`], and nothing is stored.
    pub async fn chunk_done(
        &self,
        claim: &Claim,
        state: ChunkState,
        payload: &str,
        now: UnixMillis,
    ) -> Result<Option<u32>, StoreError> {
        let chunk = &claim.chunk;
        let mut cmd = ScriptCall::new(
            &self.scripts.chunk_done,
            &[self.keys.job(&chunk.job_id), self.keys.schedule_of(&chunk.job_id), self.keys.remote_batches()],
        );
        cmd.arg(chunk.to_string())
            .arg(chunk.index)
            .arg(state.as_str())
            .arg(payload)
            .arg(now)
            .arg(now + self.settings.lease.as_millis() as u64)
            .arg(claim.token);
        let (verdict, open): (String, i64) = self.run(&cmd).await?;
        match FenceVerdict::parse(&verdict, &chunk.job_id)? {
            FenceVerdict::Applied => {
                u32::try_from(open).map(Some).map_err(|_| unknown_answer("chunk_done", open, &chunk.job_id))
            }
            FenceVerdict::Gone => Ok(None),
            FenceVerdict::Stale => Err(stale(claim, "chunk_done found the chunk under a later claim".to_owned())),
            FenceVerdict::Refused => {
                Err(stale(claim, "chunk_done found the chunk in no state a step finishes".to_owned()))
            }
        }
    }

    /// The stored request items of one chunk.
    pub async fn chunk_requests(&self, chunk: &ChunkRef) -> Result<Vec<Box<serde_json::value::RawValue>>, StoreError> {
        let text: Option<String> = self
            .conn
            .clone()
            .hget(self.keys.job(&chunk.job_id), field::chunk(chunk.index, field::CHUNK_REQUESTS))
            .await?;
        if text.is_none() && chunk.job_id.is_pack() {
            // A pack's first chunk holds no copy of its members' items.
            return self.pack_requests(&chunk.job_id).await;
        }
        text.as_deref().and_then(|text| serde_json::from_str(text).ok()).ok_or_else(|| StoreError::Corrupt {
            job_id: chunk.job_id.to_string(),
            detail: format!("chunk {} has no stored requests", chunk.index),
        })
    }

    /// Adds chunks to a running job, due at `due`, for the holder of `claim`: with `replace`, the claimed chunk
    /// (still `submitting`) is rewritten with the first of `chunks` (a split) and the rest are appended. With
    /// `once_flag`, this happens at most once per job (the flag is set). A claim taken over meanwhile is
    /// [`StoreError::StaleClaim`].
    pub async fn add_chunks(
        &self,
        claim: &Claim,
        due: UnixMillis,
        replace: bool,
        once_flag: Option<&str>,
        chunks: &[NewChunk],
    ) -> Result<AddOutcome, StoreError> {
        let job_id = &claim.chunk.job_id;
        let mut cmd =
            ScriptCall::new(&self.scripts.add_chunks, &[self.keys.job(job_id), self.keys.schedule_of(job_id)]);
        cmd.arg(job_id.as_str())
            .arg(due)
            .arg(if replace { claim.chunk.index.to_string() } else { String::new() })
            .arg(once_flag.unwrap_or(""))
            .arg(claim.chunk.index)
            .arg(claim.token);
        for chunk in chunks {
            let (items, indices) = chunk.placement.encode();
            cmd.arg(items).arg(indices).arg(RequestsArg(&chunk.requests));
        }
        let verdict: String = self.run(&cmd).await?;
        Ok(match AddVerdict::parse(&verdict, job_id)? {
            AddVerdict::Added => {
                self.scheduled(due);
                AddOutcome::Added
            }
            AddVerdict::Guarded => AddOutcome::AlreadyDone,
            AddVerdict::Gone => AddOutcome::Gone,
            AddVerdict::Stale => return Err(stale(claim, "add_chunks found the chunk under a later claim".to_owned())),
            AddVerdict::Refused => {
                return Err(stale(claim, "add_chunks found the chunk to split no longer submitting".to_owned()));
            }
        })
    }

    /// Asks the shared limiter of `bucket` (`<account>:<bucket>`, shared by every namespace using that account:
    /// [`batchd_core::Keys::rate_limit`]) for one slot; `None` means go now (the slot is booked), otherwise how
    /// long to wait before asking again. `interval` is the window divided by the limit.
    pub async fn rate_limit(
        &self,
        bucket: &str,
        interval: Duration,
        burst: u32,
    ) -> Result<Option<Duration>, StoreError> {
        let mut cmd = ScriptCall::new(&self.scripts.rate_limit, &[batchd_core::Keys::rate_limit(bucket)]);
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
        let mut cmd =
            ScriptCall::new(&self.scripts.wake, &[self.keys.job(&chunk.job_id), self.keys.schedule_of(&chunk.job_id)]);
        cmd.arg(chunk.to_string()).arg(chunk.index).arg(now).arg(min_gap.as_millis() as u64);
        let woken: i64 = self.run(&cmd).await?;
        let woken = script_flag("wake", woken, &chunk.job_id)?;
        if woken {
            self.soon_due.notify_one();
        }
        Ok(Some((chunk, woken)))
    }

    /// Takes `member` off the schedules (a member batchd did not write, or whose ledger is corrupt).
    pub async fn drop_member(&self, member: &str) -> Result<(), StoreError> {
        // A member that is not a chunk's is removed from both schedules (a rare path).
        let schedules = match ChunkRef::parse(member) {
            Ok(chunk) => vec![self.keys.schedule_of(&chunk.job_id)],
            Err(_) => vec![self.keys.schedule(), self.keys.packs()],
        };
        for schedule in schedules {
            let _: i64 = redis::cmd("ZREM").arg(schedule).arg(member).query_async(&mut self.conn.clone()).await?;
        }
        Ok(())
    }
}
