//! Packs: many jobs' chunks in one remote batch. Chunks queued for packing at acceptance wait in their packing
//! key's queue; a packer forms a pack from the queue in arrival order (`pack_form.lua`, runs of
//! [`MAX_PACK_STEP`]), the pack's one chunk goes through the usual fenced steps in the packs' schedule, and
//! when it finishes its results are handed to each member (`pack_deliver.lua`, runs of [`MAX_PACK_STEP`]), whose
//! job then publishes as usual. A pack's items are its members' own, read from their ledgers when it is sent.

use super::*;

impl Store {
    /// The packing keys whose next pack is due at `now` (at most `limit`), and the earliest due time of the
    /// others.
    pub async fn due_packers(
        &self,
        now: UnixMillis,
        limit: usize,
    ) -> Result<(Vec<String>, Option<UnixMillis>), StoreError> {
        let read: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(self.keys.packers())
            .arg(0)
            .arg(limit.max(1))
            .arg("WITHSCORES")
            .query_async(&mut self.conn.clone())
            .await?;
        let mut due = Vec::new();
        let mut next = None;
        for (key, score) in read {
            let score = score as UnixMillis;
            if score <= now {
                due.push(key);
            } else {
                next = Some(next.map_or(score, |next: UnixMillis| next.min(score)));
            }
        }
        Ok((due, next))
    }

    /// Puts a packing key's next pack off until `due` (a packer working on it, or waiting for the provider's
    /// limits). Only a key still listed (chunks still queued) is touched.
    pub async fn defer_packer(&self, key: &str, due: UnixMillis) -> Result<(), StoreError> {
        let _: i64 = redis::cmd("ZADD")
            .arg(self.keys.packers())
            .arg("XX")
            .arg(due)
            .arg(key)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Waits until an accepted job queues a chunk for packing in this process (or returns at once if one did
    /// since the last wait): wakes a packer that sleeps until its next due time.
    pub async fn packing_queued(&self) {
        self.packing_queued.notified().await;
    }

    /// Tells this process's packer that a chunk was queued for packing.
    pub(super) fn queued_for_packing(&self) {
        self.packing_queued.notify_one();
    }

    /// The first `limit` (at most [`MAX_PACK_STEP`]) chunks queued under a packing key, in arrival order.
    pub async fn pack_candidates(&self, key: &str, limit: usize) -> Result<Vec<ChunkRef>, StoreError> {
        let read: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.keys.pack_queue(key))
            .arg(0)
            .arg(limit.clamp(1, MAX_PACK_STEP) - 1)
            .query_async(&mut self.conn.clone())
            .await?;
        // A member batchd did not write cannot be packed; `pack_form.lua` drops it from the queue when offered.
        Ok(read.iter().filter_map(|member| ChunkRef::parse(member).ok()).collect())
    }

    /// Takes `candidates` (read with [`Store::pack_candidates`]) into pack `pack_id`, creating it (its chunk
    /// scheduled under the first claim, leased until `lease_until`) when it does not exist, up to `max_items`
    /// items and `max_bytes` bytes (each item counting `per_item` bytes beside its own). See `pack_form.lua`.
    #[allow(clippy::too_many_arguments, reason = "one script's arguments, named at the one call site")]
    pub async fn form_pack(
        &self,
        key: &str,
        pack_id: &JobId,
        model: &str,
        endpoint: Option<&str>,
        bounds: PackBounds,
        lease_until: UnixMillis,
        candidates: &[ChunkRef],
    ) -> Result<PackFormed, StoreError> {
        let now = self.now().await?;
        let mut keys = vec![
            self.keys.pack_queue(key),
            self.keys.packers(),
            self.keys.job(pack_id),
            self.keys.pack_members(pack_id),
            self.keys.packs(),
            self.keys.open_packs(),
            self.keys.cancel(pack_id),
        ];
        keys.extend(candidates.iter().map(|chunk| self.keys.job(&chunk.job_id)));
        let mut cmd = ScriptCall::new(&self.scripts.pack_form, &keys);
        cmd.arg(key)
            .arg(pack_id.as_str())
            .arg(now)
            .arg(lease_until)
            .arg(bounds.max_items)
            .arg(bounds.max_bytes)
            .arg(bounds.per_item)
            .arg(model)
            .arg(endpoint.unwrap_or(""))
            .arg(bounds.max_inputs.map(|max| max.to_string()).unwrap_or_default());
        for chunk in candidates {
            cmd.arg(chunk.to_string()).arg(chunk.index);
        }
        let (verdict, added, n_items, full, left): (String, usize, usize, u8, usize) = self.run(&cmd).await?;
        let verdict = PackVerdict::parse(&verdict, pack_id)?;
        if verdict == PackVerdict::Formed {
            self.scheduled(lease_until);
        }
        Ok(PackFormed { open: verdict == PackVerdict::Formed, added, n_items, full: full == 1, left })
    }

    /// The pack a packing key's packer fills (it may have been sent meanwhile: [`Store::form_pack`] then says so).
    pub async fn open_pack(&self, key: &str) -> Result<Option<JobId>, StoreError> {
        let id: Option<String> = self.conn.clone().hget(self.keys.open_packs(), key).await?;
        Ok(id.and_then(|id| JobId::parse(&id).ok()).filter(JobId::is_pack))
    }

    /// Makes a pack formed in this packer pass due at `due` (its packer is done filling it for now): it lowers the
    /// score the forming script leased it with. Only for a pack formed in the same pass: a pack taken from the
    /// schedule since (claimed, or waiting for a retry) must not be made due again (a second claim, a second create).
    pub async fn release_pack(&self, pack_id: &JobId, due: UnixMillis) -> Result<(), StoreError> {
        let member = ChunkRef::new(pack_id.clone(), 0).to_string();
        let _: i64 = redis::cmd("ZADD")
            .arg(self.keys.packs())
            .arg("XX")
            .arg("LT")
            .arg(due)
            .arg(member)
            .query_async(&mut self.conn.clone())
            .await?;
        self.scheduled(due);
        Ok(())
    }

    /// Members `start..start + limit` (at most [`MAX_PACK_STEP`]) of a pack, in item order.
    pub async fn pack_members(
        &self,
        pack_id: &JobId,
        start: usize,
        limit: usize,
    ) -> Result<Vec<PackMember>, StoreError> {
        let limit = limit.clamp(1, MAX_PACK_STEP);
        let read: Vec<String> = redis::cmd("LRANGE")
            .arg(self.keys.pack_members(pack_id))
            .arg(start)
            .arg(start + limit - 1)
            .query_async(&mut self.conn.clone())
            .await?;
        read.iter()
            .map(|entry| {
                let parsed = entry.split_once(batchd_core::ids::PACK_MEMBER_SEPARATOR).and_then(|(n, member)| {
                    Some(PackMember { n_items: n.parse().ok()?, chunk: ChunkRef::parse(member).ok()? })
                });
                parsed.ok_or_else(|| StoreError::Corrupt {
                    job_id: pack_id.to_string(),
                    detail: format!("a pack member is not <n_items>:<job#chunk>: {:?}", truncate(entry)),
                })
            })
            .collect()
    }

    /// A pack's items in order: each member's stored requests, read a run of members at a time (one round trip
    /// per run). A member whose requests are gone (its job ended and expired meanwhile) is an error: the pack
    /// cannot be sent as it was formed.
    pub async fn pack_requests(&self, pack_id: &JobId) -> Result<Vec<Box<RawValue>>, StoreError> {
        let mut requests = Vec::new();
        let mut start = 0;
        loop {
            let members = self.pack_members(pack_id, start, MAX_PACK_STEP).await?;
            if members.is_empty() {
                return Ok(requests);
            }
            let mut pipe = redis::pipe();
            for member in &members {
                pipe.hget(self.keys.job(&member.chunk.job_id), field::chunk(member.chunk.index, field::CHUNK_REQUESTS));
            }
            let texts: Vec<Option<String>> = pipe.query_async(&mut self.conn.clone()).await?;
            for (member, text) in members.iter().zip(texts) {
                let items: Option<Vec<Box<RawValue>>> =
                    text.as_deref().and_then(|text| serde_json::from_str(text).ok());
                match items {
                    Some(items) if items.len() == member.n_items => requests.extend(items),
                    _ => {
                        return Err(StoreError::Corrupt {
                            job_id: pack_id.to_string(),
                            detail: format!(
                                "member {} has no stored requests of {} items",
                                member.chunk, member.n_items
                            ),
                        });
                    }
                }
            }
            start += members.len();
        }
    }

    /// Hands a run of a finished pack's members their results (see `pack_deliver.lua`), starting at the pack's
    /// cursor `cursor`; returns the cursor after the run, or `None` when another delivery moved it or the pack is
    /// gone (the caller reads the cursor again).
    pub async fn deliver_pack(
        &self,
        pack_id: &JobId,
        request_id: &str,
        cursor: usize,
        deliveries: &[Delivery],
    ) -> Result<Option<usize>, StoreError> {
        if deliveries.is_empty() {
            return Ok(Some(cursor));
        }
        let now = self.now().await?;
        let mut keys = vec![self.keys.job(pack_id), self.keys.schedule()];
        keys.extend(deliveries.iter().map(|delivery| self.keys.job(&delivery.chunk.job_id)));
        let mut cmd = ScriptCall::new(&self.scripts.pack_deliver, &keys);
        cmd.arg(pack_id.as_str()).arg(now).arg(request_id).arg(cursor);
        for delivery in deliveries {
            cmd.arg(delivery.chunk.to_string())
                .arg(delivery.chunk.index)
                .arg(delivery.state.as_str())
                .arg(delivery.payload.as_str());
        }
        let (verdict, at, delivered): (String, usize, usize) = self.run(&cmd).await?;
        match DeliverVerdict::parse(&verdict, pack_id)? {
            DeliverVerdict::Delivered => {
                if delivered > 0 {
                    self.scheduled(now);
                }
                Ok(Some(at))
            }
            DeliverVerdict::Moved | DeliverVerdict::Gone => Ok(None),
        }
    }

    /// Whether every job of a pack of at most [`MAX_PACK_STEP`] members has ended (cancelled, expired, or served):
    /// then nobody needs its remote batch any more. `false` for a bigger pack (not read: it runs to its end).
    pub async fn pack_unneeded(&self, pack_id: &JobId) -> Result<bool, StoreError> {
        let n: usize = self.conn.clone().llen(self.keys.pack_members(pack_id)).await?;
        if n == 0 || n > MAX_PACK_STEP {
            return Ok(false);
        }
        let members = self.pack_members(pack_id, 0, n).await?;
        let mut pipe = redis::pipe();
        for member in &members {
            pipe.hget(self.keys.job(&member.chunk.job_id), field::STATE);
        }
        let states: Vec<Option<String>> = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(states.iter().all(|state| {
            state.as_deref().is_none_or(|state| state.parse::<JobState>().is_ok_and(JobState::is_terminal))
        }))
    }

    /// How many of a pack's members have been handed their results (the delivery's cursor).
    pub async fn pack_delivered(&self, pack_id: &JobId) -> Result<usize, StoreError> {
        let at: Option<usize> = self.conn.clone().hget(self.keys.job(pack_id), field::PACK_DELIVERED).await?;
        Ok(at.unwrap_or(0))
    }

    /// Closes a pack as `state` (see `pack_close.lua`); whether this call closed it.
    pub async fn close_pack(&self, pack_id: &JobId, state: JobState) -> Result<bool, StoreError> {
        let now = self.now().await?;
        let mut cmd = ScriptCall::new(
            &self.scripts.pack_close,
            &[self.keys.job(pack_id), self.keys.packs(), self.keys.pack_members(pack_id), self.keys.remote_batches()],
        );
        cmd.arg(state.as_str()).arg(now).arg(self.settings.ledger_ttl.as_secs().max(1)).arg(pack_id.as_str());
        let closed: i64 = self.run(&cmd).await?;
        Ok(closed == 1)
    }
}

/// At most 64 characters of a value, for an error message.
fn truncate(text: &str) -> String {
    text.chars().take(64).collect()
}
