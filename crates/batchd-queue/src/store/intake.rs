//! Take-in: accepting a job (its ledger, chunks and first step in one script, its items copied from the entry
//! inside Redis), and finishing an entry that is not a runnable job (rejected, duplicate, or dead-lettered after
//! too many deliveries) with bounded dead-letter copies.

use super::*;

/// What goes to the dead-letter stream, before it is bounded.
#[derive(Debug, Clone, Copy)]
pub(super) struct DeadCopy<'a> {
    /// The entry's fields as they were.
    fields: &'a [(String, Vec<u8>)],
    /// The dead-letter `error`.
    reason: &'a str,
    /// The consumer group's delivery count, for an entry dead-lettered for it.
    deliveries: Option<u64>,
}

/// The bounded part of an entry's fields that a dead-letter entry holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DeadLetterCopy<'a> {
    /// The fields copied, in order: whole, except the last one, which may be cut.
    fields: Vec<(&'a str, &'a [u8])>,
    /// How many fields the entry had.
    original_fields: usize,
    /// Bytes of the entry's field names and values.
    original_bytes: usize,
    /// Whether anything was left out or cut.
    truncated: bool,
}

impl<'a> DeadLetterCopy<'a> {
    /// At most `max_bytes` of names and values and at most [`DEAD_MAX_FIELDS`] fields of `fields`: fields are
    /// copied whole while they fit; the first one that does not has its value cut to what is left (a name is
    /// never cut: a field whose name does not fit is left out), and copying stops there.
    fn new(fields: &'a [(String, Vec<u8>)], max_bytes: usize) -> Self {
        let original_bytes = fields.iter().map(|(name, value)| name.len() + value.len()).sum();
        let mut copied = Vec::new();
        let mut budget = max_bytes;
        let mut truncated = false;
        for (name, value) in fields {
            if copied.len() == DEAD_MAX_FIELDS || name.len() > budget {
                truncated = true;
                break;
            }
            budget -= name.len();
            let kept = value.len().min(budget);
            budget -= kept;
            copied.push((name.as_str(), &value[..kept]));
            if kept < value.len() {
                truncated = true;
                break;
            }
        }
        Self { fields: copied, original_fields: fields.len(), original_bytes, truncated }
    }
}

/// The latest time a script takes (15 digits of Unix ms).
const MAX_SCRIPT_TIME: UnixMillis = 999_999_999_999_999;

impl Store {
    /// Accepts `job` from ingress entry `entry_id`: ledger created, chunks scheduled, entry acknowledged.
    /// The first chunk is scheduled at `first_due` (the accepting replica submits it right away and holds it
    /// by that lease); the others are due at once.
    pub async fn accept<R: Borrow<RawValue>>(&self, job: &Job<R>, intake: &Intake<'_>) -> Result<Accepted, StoreError> {
        // The chunks' items are copied inside Redis from the entry (which is still in the stream) when their
        // byte spans are known: a big job then never travels back. If the entry is gone, they are sent along.
        let source = if job.item_spans.is_empty() { ItemsSource::Inline } else { ItemsSource::Entry };
        let mut reply = self.accept_with(job, intake, source).await?;
        if reply.0 == AcceptVerdict::Missing {
            reply = self.accept_with(job, intake, ItemsSource::Inline).await?;
        }
        let (verdict, state) = reply;
        if matches!(verdict, AcceptVerdict::Accepted | AcceptVerdict::Cancelled) {
            if intake.plan.len() > 1 || verdict == AcceptVerdict::Cancelled {
                self.scheduled(intake.now); // chunks due at once
            }
            if intake.pack.is_some() && verdict == AcceptVerdict::Accepted {
                self.queued_for_packing();
            } else if !intake.submit_first {
                self.scheduled(intake.first_due); // a first chunk the caller does not post (throttled)
            }
        }
        Ok(match verdict {
            AcceptVerdict::Accepted => Accepted::New,
            AcceptVerdict::Cancelled => Accepted::CancelRequested,
            AcceptVerdict::Duplicate => Accepted::Duplicate { state },
            AcceptVerdict::Missing => {
                return Err(StoreError::Corrupt {
                    job_id: job.id.to_string(),
                    detail: "accept answered \"missing\" for items sent inline: the ingress entry vanished while it \
                             was taken in"
                        .to_owned(),
                });
            }
        })
    }

    async fn accept_with<R: Borrow<RawValue>>(
        &self,
        job: &Job<R>,
        intake: &Intake<'_>,
        source: ItemsSource,
    ) -> Result<(AcceptVerdict, String), StoreError> {
        let Intake { entry_id, plan, now, deadline_at, first_due, retry_failed_items, submit_first, references, pack } =
            *intake;
        let reply_to = job.reply_to.clone().unwrap_or_else(|| self.keys.results());
        let mut keys =
            vec![self.keys.job(&job.id), self.keys.submit(), self.keys.schedule(), self.keys.cancel(&job.id)];
        if let Some(pack) = &pack {
            keys.push(self.keys.pack_queue(pack.key));
            keys.push(self.keys.packers());
        }
        let mut cmd = ScriptCall::new(&self.scripts.accept, &keys);
        let first_state = match (&pack, submit_first) {
            (Some(_), _) => batchd_core::ids::PACK_QUEUED,
            (None, true) => ChunkState::Submitting.as_str(),
            (None, false) => ChunkState::Pending.as_str(),
        };
        // A packed job's chunk is scheduled only for its deadline (its pack does the submit).
        // (The scripts' numbers have at most 15 digits: a deadline centuries away is watched in the year 33658.)
        let other_due = if pack.is_some() { deadline_at.min(MAX_SCRIPT_TIME) } else { now };
        cmd.arg(batchd_core::keys::CONSUMER_GROUP)
            .arg(entry_id)
            .arg(job.id.as_str())
            .arg(plan.len())
            .arg(first_due)
            .arg(other_due)
            .arg(first_state)
            .arg(source.as_str());
        if let Some(pack) = &pack {
            cmd.arg(pack.key).arg(now).arg(pack.window_ms).arg(pack.pause_ms).arg(pack.full_members);
        }
        let mut ledger: Vec<(&str, String)> = vec![
            (field::STATE, JobState::Accepted.as_str().to_owned()),
            (field::MODEL, job.model.to_string()),
            (field::ENTRY_ID, entry_id.to_owned()),
            (field::N_CHUNKS, plan.len().to_string()),
            (field::N_ITEMS, job.requests.len().to_string()),
            (field::ACCEPTED_AT, now.to_string()),
            (field::UPDATED_AT, now.to_string()),
            (field::DEADLINE_AT, deadline_at.to_string()),
            (field::REPLY_TO, reply_to),
        ];
        if let Some(metadata) = &job.metadata {
            ledger.push((field::METADATA, metadata.get().to_owned()));
        }
        if retry_failed_items {
            ledger.push((field::RETRY_FAILED_ITEMS, "1".to_owned()));
        }
        if let Some(endpoint) = &job.endpoint {
            ledger.push((field::ENDPOINT, endpoint.clone()));
        }
        if let Some(inputs) = pack.as_ref().and_then(|pack| pack.n_inputs) {
            ledger.push((field::N_INPUTS, inputs.to_string()));
        }
        for (name, value) in &ledger {
            cmd.arg(*name).arg(value);
        }
        // The items' references, with the job in the same step (only for a job that has any).
        if !references.is_empty() {
            let n_references: usize = references.iter().map(|(_, chunk)| chunk.count()).sum();
            cmd.arg(field::N_REFERENCES).arg(n_references);
            for (chunk, chunk_references) in references {
                cmd.arg(field::chunk(*chunk, field::CHUNK_REFERENCES)).arg(chunk_references.as_str());
            }
        }
        cmd.arg(CHUNKS_MARKER);
        for &(start, len) in plan {
            cmd.arg(format!("{start}:{len}"));
            match (source == ItemsSource::Entry, job.item_spans.get(start), job.item_spans.get(start + len - 1)) {
                (true, Some((from, _)), Some((_, to))) => cmd.arg(format!("{from}:{to}")),
                _ => cmd.arg(RequestsArg(&job.requests[start..start + len])),
            };
        }
        let (verdict, state): (String, String) = self.run(&cmd).await?;
        Ok((AcceptVerdict::parse(&verdict, &job.id)?, state))
    }

    /// Finishes ingress entry `entry_id` as a failed job `job_id` without running it: one `failed` result entry
    /// with `error`, a finished ledger, the entry acknowledged; and, for an undecodable entry, a dead-letter copy
    /// (bounded: see [`Store::with_dead_entry_bytes`]). Returns false when `job_id` already had a ledger (the
    /// entry was a duplicate: only acknowledged, and copied to the dead-letter stream if it had to be).
    pub async fn reject(&self, rejection: &Rejection<'_>, now: UnixMillis) -> Result<bool, StoreError> {
        let dead = rejection.dead.map(|dead| DeadCopy { fields: &dead.fields, reason: &dead.reason, deliveries: None });
        Ok(match self.finish_entry(rejection, dead, 0, now).await? {
            RejectVerdict::Rejected => true,
            RejectVerdict::Duplicate => false,
            RejectVerdict::Gone => {
                return Err(StoreError::Corrupt {
                    job_id: rejection.job_id.to_string(),
                    detail: "reject answered \"gone\" without a delivery guard".to_owned(),
                });
            }
        })
    }

    /// Moves an ingress entry that was delivered more than `max_deliveries` times (`deliveries`, the consumer
    /// group's count) to the dead-letter stream with the error [`TOO_MANY_DELIVERIES`], without reading it as a
    /// job: its `fields` are only copied (bounded). Its default job id, the entry id, gets a `failed` result
    /// (`invalid_entry`) unless that id already has a ledger. Done only if the entry is still pending with more
    /// than `max_deliveries` deliveries, atomically; otherwise nothing changes ([`Undeliverable::Gone`]).
    pub async fn dead_letter_undeliverable(
        &self,
        entry_id: &str,
        fields: &[(String, Vec<u8>)],
        deliveries: u64,
        max_deliveries: u64,
        now: UnixMillis,
    ) -> Result<Undeliverable, StoreError> {
        let job_id = JobId::parse(entry_id)
            .map_err(|e| StoreError::Corrupt { job_id: entry_id.to_owned(), detail: e.to_string() })?;
        let error = JobError::new(
            batchd_core::result::code::INVALID_ENTRY,
            format!(
                "{TOO_MANY_DELIVERIES}: the entry was delivered {deliveries} times, more than ingress.max_deliveries \
                 ({max_deliveries}), without being taken in; it was moved to the dead-letter stream"
            ),
        );
        let rejection = Rejection { entry_id, job_id: &job_id, model: "", error: &error, dead: None, items_total: 0 };
        let dead = DeadCopy { fields, reason: TOO_MANY_DELIVERIES, deliveries: Some(deliveries) };
        Ok(match self.finish_entry(&rejection, Some(dead), max_deliveries.max(1), now).await? {
            RejectVerdict::Rejected => Undeliverable::Moved { published: true },
            RejectVerdict::Duplicate => Undeliverable::Moved { published: false },
            RejectVerdict::Gone => Undeliverable::Gone,
        })
    }

    /// Runs `reject.lua`: see [`Store::reject`]; with `guard` > 0 only for an entry still pending with more than
    /// `guard` deliveries.
    async fn finish_entry(
        &self,
        rejection: &Rejection<'_>,
        dead: Option<DeadCopy<'_>>,
        guard: u64,
        now: UnixMillis,
    ) -> Result<RejectVerdict, StoreError> {
        let Rejection { entry_id, job_id, model, error, dead: _, items_total } = *rejection;
        let entry = ResultEntry {
            job_id: job_id.to_string(),
            status: batchd_core::ResultStatus::Failed,
            model: model.to_owned(),
            result: None,
            error: Some(error.clone()),
            metadata: None,
            request_ids: Vec::new(),
            accepted_at: now,
            finished_at: now,
            items_total,
            items_failed: items_total,
        };
        let result_fields = entry.to_fields();
        let ledger: Vec<(&str, String)> = vec![
            (field::STATE, JobState::Failed.as_str().to_owned()),
            (field::MODEL, model.to_owned()),
            (field::ENTRY_ID, entry_id.to_owned()),
            (field::N_CHUNKS, "0".to_owned()),
            (field::N_ITEMS, items_total.to_string()),
            (field::ACCEPTED_AT, now.to_string()),
            (field::UPDATED_AT, now.to_string()),
            (field::FINISHED_AT, now.to_string()),
            (field::REPLY_TO, self.keys.results()),
            (field::ERROR, error.to_json()),
        ];
        let mut cmd = ScriptCall::new(
            &self.scripts.reject,
            &[self.keys.job(job_id), self.keys.submit(), self.keys.results(), self.keys.dead(), self.stats_minute(now)],
        );
        cmd.arg(batchd_core::keys::CONSUMER_GROUP)
            .arg(entry_id)
            .arg(self.settings.results_maxlen)
            .arg(self.settings.dead_maxlen)
            .arg(self.settings.ledger_ttl.as_secs().max(1))
            .arg(guard)
            .arg(result_fields.len());
        for (name, value) in &result_fields {
            cmd.arg(*name).arg(value);
        }
        cmd.arg(ledger.len());
        for (name, value) in &ledger {
            cmd.arg(*name).arg(value);
        }
        match dead {
            None => {
                cmd.arg(0);
            }
            Some(dead) => {
                let copy = DeadLetterCopy::new(dead.fields, self.dead_entry_bytes);
                let mut head: Vec<(&str, String)> = vec![
                    ("source_id", entry_id.to_owned()),
                    ("error", dead.reason.to_owned()),
                    ("dead_at", now.to_string()),
                    ("original_fields", copy.original_fields.to_string()),
                    ("original_bytes", copy.original_bytes.to_string()),
                    ("truncated", if copy.truncated { "1" } else { "0" }.to_owned()),
                ];
                if let Some(deliveries) = dead.deliveries {
                    head.push(("deliveries", deliveries.to_string()));
                }
                cmd.arg(head.len() + copy.fields.len());
                for (name, value) in &head {
                    cmd.arg(*name).arg(value);
                }
                for (name, value) in &copy.fields {
                    cmd.arg(format!("field:{name}")).arg(*value);
                }
            }
        }
        let counts = batchd_core::stats::increments(batchd_core::ResultStatus::Failed.as_str(), model, None);
        super::ending::count_args(&mut cmd, &counts);
        let verdict: String = self.run(&cmd).await?;
        RejectVerdict::parse(&verdict, job_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, usize)]) -> Vec<(String, Vec<u8>)> {
        pairs.iter().map(|(name, size)| ((*name).to_owned(), vec![b'x'; *size])).collect()
    }

    #[test]
    fn a_dead_letter_copy_keeps_whole_fields_while_they_fit() {
        let entry = fields(&[("job", 10), ("source", 5)]);
        let copy = DeadLetterCopy::new(&entry, 1000);
        assert_eq!(copy.fields, [("job", &[b'x'; 10][..]), ("source", &[b'x'; 5][..])]);
        assert_eq!((copy.original_fields, copy.original_bytes, copy.truncated), (2, 24, false));
    }

    #[test]
    fn a_dead_letter_copy_cuts_the_field_that_does_not_fit_and_stops() {
        let entry = fields(&[("job", 1_000_000), ("after", 1)]);
        let copy = DeadLetterCopy::new(&entry, 64 * 1024);
        assert_eq!(copy.fields.len(), 1);
        assert_eq!(copy.fields[0].1.len(), 64 * 1024 - 3, "name and value together fill the budget");
        assert_eq!((copy.original_fields, copy.original_bytes, copy.truncated), (2, 1_000_009, true));
    }

    #[test]
    fn a_dead_letter_copy_never_cuts_a_name_and_holds_at_most_dead_max_fields() {
        let entry = fields(&[("a", 2), ("a-very-long-name", 0)]);
        let copy = DeadLetterCopy::new(&entry, 5);
        assert_eq!(copy.fields, [("a", &b"xx"[..])]);
        assert!(copy.truncated);

        let names: Vec<String> = (0..5_000).map(|i| format!("f{i}")).collect();
        let many: Vec<(String, Vec<u8>)> = names.iter().map(|name| (name.clone(), b"v".to_vec())).collect();
        let copy = DeadLetterCopy::new(&many, usize::MAX);
        assert_eq!(copy.fields.len(), DEAD_MAX_FIELDS);
        assert_eq!((copy.original_fields, copy.truncated), (5_000, true));
    }
}
