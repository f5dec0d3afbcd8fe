//! What a request learns of its model (window, tokenizer calibration, answer sizes) and of its
//! conversation's run, merged into what is stored field by field at the commit.

use std::time::Duration;

use super::{CALIBRATION_MILLI, ModelKey, SessionCtx};
use crate::session::error::StoreError;
use crate::session::runs::RunLengths;
use crate::session::state::{Learned, LearnedChange, MAX_MEASURED, ModelRun, Usage};

impl SessionCtx {
    /// Says which (tenant, upstream, model) the request talks to. When the session learned nothing of
    /// that model yet (a new session, or one that switched models), it starts with what earlier
    /// sessions learned of it.
    pub async fn use_model(&mut self, model: ModelKey) {
        if self.session.counters.learned.model_tag != model.tag {
            let mut learned = match self.store.load(&model.store_key, "-").await {
                Ok((profile, _)) if profile.counters.learned.model_tag == model.tag => profile.counters.learned,
                Ok(_) => Learned::default(),
                Err(StoreError::OtherVersion(_)) => {
                    self.foreign_model = true;
                    Learned::default()
                }
                Err(error) => {
                    self.report(&error, "load");
                    Learned::default()
                }
            };
            learned.model_tag = model.tag;
            self.set_learned(learned);
        }
        self.runs = match self.store.run_lengths(&model.store_key).await {
            Ok(runs) => runs,
            Err(error) => {
                self.report(&error, "load");
                RunLengths::default()
            }
        };
        self.model = Some(model);
    }

    /// This request's turn in its conversation's run: 1 after a pause of `lifetime` or more (the
    /// provider's cache has gone cold), the previous request's turn plus one otherwise.
    pub fn run_turn(&self, lifetime: Duration) -> u64 {
        match self.idle() {
            Some(idle) if idle < lifetime => self.conversation.run + 1,
            _ => 1,
        }
    }

    /// Turns the conversation will still run on a warm cache after this request, with
    /// probability `confidence`, by what the deployment measured of its model (and `assumed`
    /// runs, `[prune] assumed_runs`); 0 when nothing is known.
    pub fn later_turns(&self, lifetime: Duration, confidence: f64, assumed: &[u64]) -> u64 {
        let runs = if assumed.is_empty() { self.runs } else { self.runs.with_assumed(assumed) };
        runs.remaining(self.run_turn(lifetime), confidence)
    }

    /// Counts this request in its conversation's run, and the run in the model's histogram when
    /// it starts a bucket (written with the commit).
    pub fn count_turn(&mut self, lifetime: Duration) {
        let turn = self.run_turn(lifetime);
        self.pending.conversation.run = Some(turn);
        if let (Some(bucket), Some(model)) = (RunLengths::boundary(turn), &self.model) {
            self.pending.model_run = Some(ModelRun { store_key: model.store_key.clone(), bucket });
        }
    }

    /// The window the upstream states for the model ([`Learned::stated`]), for this request: not
    /// a change to commit, the process asks its servers itself.
    pub fn state_window(&mut self, window: u64) {
        self.session.counters.learned.stated = window;
    }

    /// What the session learned of its model's window and tokenizer.
    pub fn learned(&self) -> &Learned {
        &self.session.counters.learned
    }

    /// Takes `learned` as what the session knows of its model now; the commit merges it into
    /// what is stored field by field ([`Learned::merge`]), with the calibration the request
    /// started from, so what a parallel request learned meanwhile stands.
    fn set_learned(&mut self, learned: Learned) {
        if self.session.counters.learned == learned {
            return;
        }
        let started_from = match &self.pending.session.learned {
            Some(change) if change.known.model_tag == learned.model_tag => change.known.calibration_milli,
            _ => learned.calibration_milli,
        };
        let change = self.pending.session.learned.get_or_insert_with(LearnedChange::default);
        if change.known.model_tag != learned.model_tag {
            // Another model: what was measured of the previous one is not this one's.
            change.measured.clear();
        }
        change.known = Learned { calibration_milli: started_from, ..learned };
        self.session.counters.learned = learned;
    }

    /// Changes what the session learned of its model's window (its bounds; the calibration
    /// changes by measurements only, [`SessionCtx::measure`]).
    pub fn learn(&mut self, change: impl FnOnce(&mut Learned)) {
        let mut learned = self.session.counters.learned;
        change(&mut learned);
        learned.calibration_milli = self.session.counters.learned.calibration_milli;
        self.set_learned(learned);
    }

    /// Remembers the real context window an overflow error named, for the session's later
    /// estimates (every conversation of the session talks to the same model).
    pub fn learn_window(&mut self, window: u64) {
        if window > 0 {
            self.learn(|learned| learned.window = window);
        }
    }

    /// compactor's estimate of the body it sent (vendor factor applied, not calibrated): the
    /// provider's usage report for it is a measurement of the provider's tokenizer.
    pub fn note_forwarded(&mut self, estimate: u64) {
        self.forwarded_estimate = estimate;
    }

    /// The compaction generation applied to the body sent (0: none): its usage is stored with it.
    pub fn note_generation(&mut self, generation: u32) {
        self.forwarded_generation = generation;
    }

    /// The estimate of the body sent last ([`SessionCtx::note_forwarded`]).
    pub fn forwarded_estimate(&self) -> u64 {
        self.forwarded_estimate
    }

    /// One measurement of the provider's tokenizer: it counted `provider` tokens where compactor
    /// estimated `estimate`. Smoothed, bounded to [`CALIBRATION_MILLI`].
    pub fn measure(&mut self, provider: u64, estimate: u64) {
        if provider == 0 || estimate == 0 {
            return;
        }
        let (low, high) = CALIBRATION_MILLI;
        let observed = (provider.saturating_mul(1_000) / estimate).clamp(low, high);
        let mut learned = self.session.counters.learned;
        learned.calibration_milli = Learned::smooth(learned.calibration_milli, observed);
        let started_from = self.session.counters.learned.calibration_milli;
        let change = self.pending.session.learned.get_or_insert_with(|| LearnedChange {
            known: Learned { calibration_milli: started_from, ..learned },
            measured: Vec::new(),
        });
        if change.measured.len() == MAX_MEASURED {
            change.measured.remove(0);
        }
        change.measured.push(observed);
        self.session.counters.learned = learned;
    }

    /// The usage the upstream reported for this request (its cache reads and writes also add
    /// to the session's counters): also what it says of the model (the
    /// window holds at least prompt + output, the tokenizer counts prompt where compactor
    /// estimated what it forwarded, answers are about this long).
    pub fn set_usage(&mut self, mut usage: Usage) {
        usage.message_count = self.message_count;
        usage.generation = self.forwarded_generation;
        self.pending.conversation.usage = Some(usage);
        self.pending.session.usage = Some(usage);
        self.measure(usage.prompt_tokens, self.forwarded_estimate);
        let answered = usage.prompt_tokens.saturating_add(usage.output_tokens);
        self.learn(|learned| {
            learned.window_at_least = learned.window_at_least.max(answered);
            learned.output_peak = learned.output_peak.max(usage.output_tokens);
            if learned.window_below > 0 && learned.window_below <= answered {
                // An answer larger than an earlier unnamed overflow: that bound was too tight.
                learned.window_below = 0;
            }
        });
    }
}
