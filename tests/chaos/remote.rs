//! What the emulator's three call logs say about a run's remote work, in one shape for every provider: each remote
//! batch created (its job, the daemon port that created it, when, and whether the API lost its reply), the batches a
//! daemon polled, and the calls per provider. The check ([`super::check`]) judges duplicates from this alone.
//!
//! Which job a batch is for is read from what batchd sent: Workers AI submits carry the item's
//! `external_reference` (the job id, in the chaos jobs), OpenAI batches carry batchd's `metadata` (`batchd_job`),
//! and Anthropic requests carry the chaos job's `metadata.user_id` (the job id), which batchd passes through (its
//! own `custom_id`s carry a random nonce per chunk, not the job). A pack's batch serves many jobs and its create
//! names one of them (or, at OpenAI, the pack): which pack served which job is the one thing read from batchd's
//! records ([`RemoteLog::attribute_packs`]).

use std::collections::{BTreeMap, HashMap, HashSet};

use batchd_emulator::{AnthropicCallKind, CallKind, EmulatorHandle, OpenAiCallKind};

use super::load::Provider;

/// One remote batch the emulator created.
#[derive(Debug, Clone)]
pub struct Created {
    /// The API that created it.
    pub provider: Provider,
    /// The job it is for (empty when its create named none the run knows); after
    /// [`RemoteLog::attribute_packs`], the unit of remote work: the job, or the pack that served it.
    pub job: String,
    /// Which part of its unit's work it carries: a create made again for the same part is a duplicate, while the
    /// parts of a split batch are not. The first request's job at Workers AI and Anthropic (a split part starts at
    /// another member), the chunk at OpenAI (its `metadata`).
    pub part: String,
    /// Its id (request id, `batch_...`, `msgbatch_...`).
    pub batch: String,
    /// The emulator port of the daemon process that created it.
    pub port: u16,
    /// When the emulator logged its create, Unix ms.
    pub at_ms: u64,
    /// The API made the batch and then lost or replaced the create's reply (an injected fault after handling):
    /// the daemon could not know the batch existed without asking.
    pub reply_lost: bool,
    /// Position in its provider's call log (orders creates logged in the same millisecond).
    pub seq: u64,
    /// The faults that shaped the call, as the emulator names them (`delay`, `hold`, `reset_after`, ...).
    pub fault: Option<String>,
    /// Requests in the batch, where the log says (Anthropic: what a look compares with the chunk's size).
    pub n_requests: Option<usize>,
    /// Anthropic: the chunk's create mark its first `custom_id` carries (`<nonce>-<chunk>`): every create made for
    /// one mark, and the look for it, share it.
    pub mark: Option<String>,
}

impl Created {
    /// Whether a fault named `name` shaped the call.
    pub fn had_fault(&self, name: &str) -> bool {
        self.fault.as_deref().is_some_and(|faults| faults.split('+').any(|fault| fault == name))
    }
}

/// A list call (a page of `GET /v1/batches` at OpenAI or Anthropic): what a look for an uncertain create reads.
#[derive(Debug, Clone)]
pub struct Listed {
    /// The API.
    pub provider: Provider,
    /// The emulator port of the daemon process that made it.
    pub port: u16,
    /// When the emulator logged it, Unix ms.
    pub at_ms: u64,
    /// HTTP status of the reply (0: connection dropped).
    pub http_status: u16,
}

/// A call that touched one remote batch (a poll, a results download), for the checks that follow a batch.
#[derive(Debug, Clone)]
pub struct Touch {
    /// The API.
    pub provider: Provider,
    /// The batch's id.
    pub batch: String,
    /// What the call was (`poll`, `results`).
    pub what: &'static str,
    /// The emulator port of the daemon process that made it.
    pub port: u16,
    /// When the emulator logged it, Unix ms.
    pub at_ms: u64,
    /// HTTP status of the reply (0: connection dropped).
    pub http_status: u16,
    /// Whether an injected or random fault shaped it.
    pub faulted: bool,
}

impl Touch {
    /// A touch of `batch`: the call `what` logged at `at_ms` from the daemon on `port`, answered `http_status`.
    fn new(
        provider: Provider,
        batch: &str,
        what: &'static str,
        port: u16,
        at_ms: u64,
        http_status: u16,
        faulted: bool,
    ) -> Self {
        Self { provider, batch: batch.to_owned(), what, port, at_ms, http_status, faulted }
    }
}

/// A run's remote work, from the call logs.
#[derive(Debug, Clone, Default)]
pub struct RemoteLog {
    /// Every remote batch created, in log order per provider.
    pub created: Vec<Created>,
    /// Polls and results downloads of batches, in log order per provider.
    pub touches: Vec<Touch>,
    /// List calls at OpenAI and Anthropic, in log order per provider.
    pub lists: Vec<Listed>,
    /// Anthropic batches deleted (answered 200), with when: a deleted batch is not listed after.
    pub deleted: HashMap<String, u64>,
    /// API calls per provider.
    pub calls: BTreeMap<Provider, usize>,
    /// Calls an injected or random fault shaped, per provider.
    pub faulted: BTreeMap<Provider, usize>,
    /// Batches the emulator itself counts as created, per provider (must equal the creates in its log).
    pub batches_counted: BTreeMap<Provider, usize>,
    /// OpenAI files still stored at the end (inputs and results not deleted).
    pub openai_files_left: usize,
    /// The jobs each pack served ([`RemoteLog::attribute_packs`]), by pack id.
    pub members: HashMap<String, Vec<String>>,
    /// Each packed job's pack.
    pub pack_of: HashMap<String, String>,
}

impl RemoteLog {
    /// Reads the three logs. `jobs` are the run's job ids (acknowledged and hostile), for Anthropic's hashes.
    pub fn read<'a>(emulator: &EmulatorHandle, jobs: impl IntoIterator<Item = &'a String>) -> Self {
        let mut log = Self::default();
        log.read_cloudflare(emulator);
        log.read_openai(emulator);
        log.read_anthropic(emulator, jobs);
        log
    }

    fn read_cloudflare(&mut self, emulator: &EmulatorHandle) {
        let calls = emulator.calls();
        for call in &calls {
            let Some(batch) = call.request_id.clone() else { continue };
            let touch = |what| {
                Touch::new(
                    Provider::Cloudflare,
                    &batch,
                    what,
                    call.port,
                    call.at_ms,
                    call.http_status,
                    call.fault.is_some(),
                )
            };
            match call.kind {
                CallKind::Submit if (200..300).contains(&call.http_status) => self.created.push(Created {
                    provider: Provider::Cloudflare,
                    job: call.first_reference.clone().unwrap_or_default(),
                    part: call.first_reference.clone().unwrap_or_default(),
                    batch,
                    port: call.port,
                    at_ms: call.at_ms,
                    reply_lost: false,
                    seq: call.seq,
                    fault: call.fault.clone(),
                    n_requests: call.n_items,
                    mark: None,
                }),
                CallKind::Poll => self.touches.push(touch("poll")),
                _ => {}
            }
        }
        self.count(Provider::Cloudflare, calls.len(), calls.iter().filter(|call| call.fault.is_some()).count());
        self.batches_counted.insert(Provider::Cloudflare, emulator.batch_count());
    }

    fn read_openai(&mut self, emulator: &EmulatorHandle) {
        let openai = emulator.openai();
        let batches = openai.batches();
        let text = |batch: &serde_json::Value, key: &str| batch[key].as_str().map(str::to_owned);
        // Every batch's job (from its metadata), and the batch each result file belongs to.
        let mut job_of: HashMap<String, String> = HashMap::new();
        let mut chunk_of: HashMap<String, String> = HashMap::new();
        let mut batch_of_file: HashMap<String, String> = HashMap::new();
        for batch in &batches {
            let Some(id) = text(batch, "id") else { continue };
            job_of.insert(id.clone(), batch["metadata"]["batchd_job"].as_str().unwrap_or_default().to_owned());
            chunk_of.insert(id.clone(), batch["metadata"]["batchd_chunk"].as_str().unwrap_or_default().to_owned());
            for file in ["output_file_id", "error_file_id"] {
                if let Some(file) = text(batch, file) {
                    batch_of_file.insert(file, id.clone());
                }
            }
        }
        let calls = openai.calls();
        for call in &calls {
            // A call a fault hit before it was handled names its batch or file only in its path.
            let batch_id = call.batch_id.clone().or_else(|| path_id(&call.path, "batches"));
            let file_id = call.file_id.clone().or_else(|| path_id(&call.path, "files"));
            let touch = |batch: &String, what| {
                Touch::new(Provider::OpenAi, batch, what, call.port, call.at_ms, call.http_status, call.fault.is_some())
            };
            match (call.kind, &batch_id) {
                (OpenAiCallKind::CreateBatch, Some(batch)) => self.created.push(Created {
                    provider: Provider::OpenAi,
                    job: job_of.get(batch).cloned().unwrap_or_default(),
                    part: chunk_of.get(batch).cloned().unwrap_or_default(),
                    batch: batch.clone(),
                    port: call.port,
                    at_ms: call.at_ms,
                    reply_lost: call.http_status != 200,
                    seq: call.seq,
                    fault: call.fault.clone(),
                    n_requests: None,
                    mark: None,
                }),
                (OpenAiCallKind::GetBatch, Some(batch)) => self.touches.push(touch(batch, "poll")),
                (OpenAiCallKind::ListBatches, _) => self.lists.push(Listed {
                    provider: Provider::OpenAi,
                    port: call.port,
                    at_ms: call.at_ms,
                    http_status: call.http_status,
                }),
                (OpenAiCallKind::FileContent, _) => {
                    if let Some(batch) = file_id.as_ref().and_then(|file| batch_of_file.get(file)) {
                        self.touches.push(touch(batch, "results"));
                    }
                }
                _ => {}
            }
        }
        self.count(Provider::OpenAi, calls.len(), calls.iter().filter(|call| call.fault.is_some()).count());
        self.batches_counted.insert(Provider::OpenAi, openai.batch_count());
        self.openai_files_left = openai.file_ids().len();
    }

    fn read_anthropic<'a>(&mut self, emulator: &EmulatorHandle, jobs: impl IntoIterator<Item = &'a String>) {
        let anthropic = emulator.anthropic();
        let jobs: HashSet<&String> = jobs.into_iter().collect();
        let calls = anthropic.calls();
        for call in &calls {
            if call.kind == AnthropicCallKind::List {
                self.lists.push(Listed {
                    provider: Provider::Anthropic,
                    port: call.port,
                    at_ms: call.at_ms,
                    http_status: call.status,
                });
            }
            let Some(batch) = call.batch_id.clone() else { continue };
            let touch = |what| {
                Touch::new(Provider::Anthropic, &batch, what, call.port, call.at_ms, call.status, call.fault.is_some())
            };
            match call.kind {
                AnthropicCallKind::Create => {
                    // What batchd sent: the first request's `metadata.user_id`, the job id in these jobs.
                    let job = call.first_user_id.clone().filter(|job| jobs.contains(job));
                    self.created.push(Created {
                        provider: Provider::Anthropic,
                        job: job.clone().unwrap_or_default(),
                        part: job.unwrap_or_default(),
                        batch,
                        port: call.port,
                        at_ms: call.at_ms,
                        reply_lost: call.status != 200,
                        seq: call.seq,
                        fault: call.fault.clone(),
                        n_requests: call.n_requests,
                        mark: call.first_custom_id.as_deref().and_then(mark_of),
                    });
                }
                AnthropicCallKind::Retrieve => self.touches.push(touch("poll")),
                AnthropicCallKind::Results => self.touches.push(touch("results")),
                AnthropicCallKind::Delete if call.status == 200 => {
                    self.deleted.insert(batch, call.at_ms);
                }
                _ => {}
            }
        }
        self.count(Provider::Anthropic, calls.len(), calls.iter().filter(|call| call.fault.is_some()).count());
        self.batches_counted.insert(Provider::Anthropic, anthropic.batch_count());
    }

    /// Attributes every create to its unit of remote work: a job's own batch to the job, a pack's batch to the pack
    /// (DESIGN decision 20), so a pack created twice is one pack's duplicate, not a duplicate of each of its jobs.
    /// What batchd sent names a pack's batch only in part (OpenAI's metadata names the pack; a Workers AI or
    /// Anthropic create names its first request's job), so each job's pack is read from its ledger (`c0:pack`,
    /// a packable job has one chunk); the checks then hold a pack to its members' results and its own ledger.
    pub async fn attribute_packs(
        &mut self,
        conn: &mut redis::aio::ConnectionManager,
        keys: &batchd_core::Keys,
        jobs: &[String],
    ) -> redis::RedisResult<()> {
        let field = batchd_core::ledger::field::chunk(0, batchd_core::ledger::field::CHUNK_PACK);
        let mut pack_of: HashMap<String, String> = HashMap::new();
        for page in jobs.chunks(1000) {
            let mut pipe = redis::pipe();
            for id in page {
                let key = batchd_core::JobId::parse(id).map(|id| keys.job(&id)).unwrap_or_default();
                pipe.cmd("HGET").arg(key).arg(&field);
            }
            let packs: Vec<Option<String>> = pipe.query_async(conn).await?;
            for (job, pack) in page.iter().zip(packs) {
                if let Some(pack) = pack.filter(|pack| pack.starts_with(batchd_core::ids::PACK_PREFIX)) {
                    pack_of.insert(job.clone(), pack);
                }
            }
        }
        for (job, pack) in &pack_of {
            self.members.entry(pack.clone()).or_default().push(job.clone());
        }
        for members in self.members.values_mut() {
            members.sort();
        }
        for created in &mut self.created {
            if let Some(pack) = pack_of.get(&created.job) {
                created.job.clone_from(pack);
            }
        }
        self.pack_of = pack_of;
        Ok(())
    }

    /// The jobs a unit of remote work served: a pack's members, or the job itself.
    pub fn jobs_of<'a>(&'a self, unit: &'a str) -> Vec<&'a str> {
        match self.members.get(unit) {
            Some(members) => members.iter().map(String::as_str).collect(),
            None => vec![unit],
        }
    }

    /// The unit of remote work that served `job`: its pack, or the job itself.
    pub fn unit_of<'a>(&'a self, job: &'a str) -> &'a str {
        self.pack_of.get(job).map_or(job, String::as_str)
    }

    /// Writes the three call logs as they are now to `dir` (`calls-cloudflare.json`, `calls-openai.json`,
    /// `calls-anthropic.json`), beside the daemons' logs, for reading a failure afterwards.
    pub fn save(emulator: &EmulatorHandle, dir: &std::path::Path) -> std::io::Result<()> {
        let write = |name: &str, value: serde_json::Result<String>| {
            std::fs::write(dir.join(format!("calls-{name}.json")), value.map_err(std::io::Error::other)?)
        };
        write("cloudflare", serde_json::to_string(&emulator.calls()))?;
        write("openai", serde_json::to_string(&emulator.openai().calls()))?;
        write("anthropic", serde_json::to_string(&emulator.anthropic().calls()))
    }

    fn count(&mut self, provider: Provider, calls: usize, faulted: usize) {
        self.calls.insert(provider, calls);
        self.faulted.insert(provider, faulted);
    }

    /// The ids of every batch a daemon polled. A daemon polls a batch only once its id is recorded in the chunk's
    /// ledger (an Anthropic look for an uncertain create lists batches and reads results, but never retrieves one).
    pub fn polled(&self) -> HashSet<&str> {
        self.touches.iter().filter(|touch| touch.what == "poll").map(|touch| touch.batch.as_str()).collect()
    }

    /// Creates per provider.
    pub fn creates(&self, provider: Provider) -> usize {
        self.created.iter().filter(|created| created.provider == provider).count()
    }

    /// Polls per provider.
    pub fn polls(&self, provider: Provider) -> usize {
        self.touches.iter().filter(|touch| touch.provider == provider && touch.what == "poll").count()
    }
}

/// The create mark in one of batchd's Anthropic `custom_id`s (`n-<nonce>-<chunk>-<attempt>-<index>`), as
/// `<nonce>-<chunk>`.
fn mark_of(custom_id: &str) -> Option<String> {
    let mut parts = custom_id.split('-');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("n"), Some(nonce), Some(chunk)) if !nonce.is_empty() && !chunk.is_empty() => {
            Some(format!("{nonce}-{chunk}"))
        }
        _ => None,
    }
}

/// The id after `/<collection>/` in an OpenAI call's path (`/openai/v1/files/{id}/content` → the file id).
fn path_id(path: &str, collection: &str) -> Option<String> {
    let rest = path.split(&format!("/{collection}/")).nth(1)?;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then(|| id.to_owned())
}
