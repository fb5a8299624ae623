//! Random faults for the OpenAI and Anthropic emulators, at the rate the Workers AI emulator draws its own
//! (`RandomFaults`): those two emulators take faults only by injection, so a task watches how many calls each one
//! has logged and injects one fault, of a kind drawn from the run's seed, for every `1 / rate` calls. A fault waits
//! in the emulator's queue for the next call it matches.
//!
//! Faults must not pile up: one aimed at a kind of call that has stopped coming (creates, once every job is in)
//! would wait in the queue and a later stretch of faults would hit the next calls all at once, or the drain after
//! the faults stop. So a fault is owed, not injected, while [`MAX_PENDING`] wait in an emulator's queue (what is
//! owed beyond that is dropped and counted as skipped), and [`ProviderFaults::stop`] takes back the ones never used
//! and counts them as unused: the figures report only faults that hit a call.
//!
//! The kinds are the trouble a batch API gives: 5xx and 429 refusals (nothing done), a dropped connection (nothing
//! done), and the same after the call took effect — the "uncertain create" of issues 23 and 24: the batch exists,
//! its reply never arrives, and the client must look before creating again.

use std::collections::BTreeMap;
use std::time::Duration;

use batchd_emulator::{AnthropicCalls, AnthropicControl, AnthropicFault, OpenAiCallKind, OpenAiFault, OpenAiHandle};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::scenarios::Dice;

/// How often the call counts are read.
const TICK: Duration = Duration::from_millis(100);

/// Most faults waiting in one emulator's queue at a time.
const MAX_PENDING: usize = 4;

/// The injecting task of a run.
#[derive(Debug)]
pub struct ProviderFaults {
    /// Stops it.
    stop: CancellationToken,
    /// The task; answers what it injected, by provider and kind.
    task: JoinHandle<BTreeMap<String, u64>>,
}

impl ProviderFaults {
    /// Injects a fault for every `1 / rate` calls each emulator logs, until [`ProviderFaults::stop`].
    pub fn start(openai: OpenAiHandle, anthropic: AnthropicControl, rate: f64, seed: u64) -> Self {
        let stop = CancellationToken::new();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut dice = Dice::new(seed ^ 0x005e_ed0f_fa17);
                let mut injected: BTreeMap<String, u64> = BTreeMap::new();
                let mut targets =
                    [Target::new("openai", Box::new(openai)), Target::new("anthropic", Box::new(anthropic))];
                while !stop.is_cancelled() {
                    tokio::time::sleep(TICK).await;
                    for target in &mut targets {
                        let now = target.emulator.n_calls();
                        target.owed += rate * now.saturating_sub(target.seen) as f64;
                        target.seen = now;
                    }
                    let mut tally = |key: String| *injected.entry(key).or_default() += 1;
                    for target in &mut targets {
                        while target.owed >= 1.0 {
                            target.owed -= 1.0;
                            if target.emulator.n_pending() >= MAX_PENDING {
                                tally(format!("{} skipped (queue full)", target.name));
                                continue;
                            }
                            let kind = dice.index(target.emulator.n_kinds());
                            tally(format!("{} {}", target.name, target.emulator.inject(kind)));
                        }
                    }
                }
                for target in &targets {
                    let unused = target.emulator.clear_faults();
                    if unused > 0 {
                        injected.insert(format!("{} unused (taken back at stop)", target.name), unused as u64);
                    }
                }
                injected
            })
        };
        Self { stop, task }
    }

    /// Stops injecting and takes back the faults never used; what was injected, by `"<provider> <kind>"`, with
    /// the owed faults skipped while the queue was full and the ones taken back unused.
    pub async fn stop(self) -> BTreeMap<String, u64> {
        self.stop.cancel();
        self.task.await.expect("the fault injector panicked")
    }
}

/// One emulator the task injects faults into, and where its count stands.
struct Target {
    /// `openai`, `anthropic`: how its faults are named in the figures.
    name: &'static str,
    /// Its in-process control.
    emulator: Box<dyn Injectable>,
    /// Calls it had logged at the last look.
    seen: u64,
    /// Faults owed and not injected yet (a fraction of one between calls).
    owed: f64,
}

impl Target {
    fn new(name: &'static str, emulator: Box<dyn Injectable>) -> Self {
        let seen = emulator.n_calls();
        Self { name, emulator, seen, owed: 0.0 }
    }
}

/// What the task needs of an emulator's control: its call count, its fault queue, and its kinds of fault.
trait Injectable: Send {
    /// Calls logged since start.
    fn n_calls(&self) -> u64;
    /// Faults waiting in its queue.
    fn n_pending(&self) -> usize;
    /// How many kinds of fault [`Injectable::inject`] knows.
    fn n_kinds(&self) -> usize;
    /// Injects a fault of kind `kind` (below [`Injectable::n_kinds`]); its name.
    fn inject(&self, kind: usize) -> &'static str;
    /// Takes back the faults never used; how many.
    fn clear_faults(&self) -> usize;
}

impl Injectable for OpenAiHandle {
    fn n_calls(&self) -> u64 {
        OpenAiHandle::n_calls(self)
    }

    fn n_pending(&self) -> usize {
        self.pending_faults().len()
    }

    fn n_kinds(&self) -> usize {
        OPENAI_KINDS
    }

    fn inject(&self, kind: usize) -> &'static str {
        let (name, fault) = openai_fault(kind);
        OpenAiHandle::inject(self, fault);
        name
    }

    fn clear_faults(&self) -> usize {
        OpenAiHandle::clear_faults(self).len()
    }
}

impl Injectable for AnthropicControl {
    fn n_calls(&self) -> u64 {
        AnthropicControl::n_calls(self)
    }

    fn n_pending(&self) -> usize {
        self.pending_faults().len()
    }

    fn n_kinds(&self) -> usize {
        ANTHROPIC_KINDS
    }

    fn inject(&self, kind: usize) -> &'static str {
        let (name, fault) = anthropic_fault(kind);
        AnthropicControl::inject(self, fault);
        name
    }

    fn clear_faults(&self) -> usize {
        AnthropicControl::clear_faults(self).len()
    }
}

/// Kinds of [`openai_fault`].
const OPENAI_KINDS: usize = 6;

/// One OpenAI fault: refusals and resets hit the next call of any kind; the two after-handling ones make the call
/// take effect first (an upload stores its file, a create makes its batch) and then lose or replace its reply.
fn openai_fault(kind: usize) -> (&'static str, OpenAiFault) {
    match kind {
        0 => ("500", OpenAiFault::status(500)),
        1 => ("503", OpenAiFault::status(503)),
        2 => ("429 on create", OpenAiFault::status(429).retry_after(1).on(OpenAiCallKind::CreateBatch)),
        3 => ("reset", OpenAiFault::reset()),
        4 => ("create reply lost (reset)", OpenAiFault::reset().on(OpenAiCallKind::CreateBatch).after_handling()),
        _ => ("500 after handling", OpenAiFault::status(500).after_handling()),
    }
}

/// Kinds of [`anthropic_fault`].
const ANTHROPIC_KINDS: usize = 6;

/// One Anthropic fault, as [`openai_fault`]; 529 is the API's `overloaded_error`.
fn anthropic_fault(kind: usize) -> (&'static str, AnthropicFault) {
    match kind {
        0 => ("500", AnthropicFault::status(500)),
        1 => ("529", AnthropicFault::status(529)),
        2 => ("429 on create", AnthropicFault::status(429).retry_after(1).on(AnthropicCalls::Create)),
        3 => ("reset", AnthropicFault::reset()),
        4 => ("create reply lost (reset)", AnthropicFault::reset_after().on(AnthropicCalls::Create)),
        _ => ("500 after handling", AnthropicFault::status_after(500)),
    }
}
