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
                // (calls seen, faults owed) per emulator.
                let (mut openai_seen, mut anthropic_seen) = (openai.n_calls(), anthropic.n_calls());
                let (mut openai_owed, mut anthropic_owed) = (0.0_f64, 0.0_f64);
                while !stop.is_cancelled() {
                    tokio::time::sleep(TICK).await;
                    let (now_openai, now_anthropic) = (openai.n_calls(), anthropic.n_calls());
                    openai_owed += rate * now_openai.saturating_sub(openai_seen) as f64;
                    anthropic_owed += rate * now_anthropic.saturating_sub(anthropic_seen) as f64;
                    (openai_seen, anthropic_seen) = (now_openai, now_anthropic);
                    let mut tally = |key: String| *injected.entry(key).or_default() += 1;
                    while openai_owed >= 1.0 {
                        openai_owed -= 1.0;
                        if openai.pending_faults().len() >= MAX_PENDING {
                            tally("openai skipped (queue full)".to_owned());
                            continue;
                        }
                        let (name, fault) = openai_fault(dice.index(OPENAI_KINDS));
                        openai.inject(fault);
                        tally(format!("openai {name}"));
                    }
                    while anthropic_owed >= 1.0 {
                        anthropic_owed -= 1.0;
                        if anthropic.pending_faults().len() >= MAX_PENDING {
                            tally("anthropic skipped (queue full)".to_owned());
                            continue;
                        }
                        let (name, fault) = anthropic_fault(dice.index(ANTHROPIC_KINDS));
                        anthropic.inject(fault);
                        tally(format!("anthropic {name}"));
                    }
                }
                let unused = (openai.clear_faults().len(), anthropic.clear_faults().len());
                for (provider, n) in [("openai", unused.0), ("anthropic", unused.1)] {
                    if n > 0 {
                        injected.insert(format!("{provider} unused (taken back at stop)"), n as u64);
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
