//! What a phase measured: each target's runs, all rounds together, and the medians of each round
//! that compactor's distance to nginx is judged by.

use std::time::Duration;

use crate::drive::{ClosedResult, OpenResult};
use crate::procfs::CpuShare;

/// A phase's run against one target.
pub struct Run {
    pub target: &'static str,
    pub outcome: Outcome,
    /// CPU time of the proxy's process tree over the measured window (none for direct), and
    /// whether it is precise (else from 10 ms ticks: a thread exited during the window).
    pub proxy_cpu: Option<(Duration, bool)>,
    pub share: Option<CpuShare>,
}

pub enum Outcome {
    Open(OpenResult),
    Closed(ClosedResult),
}

impl Run {
    /// Adds a later round's run of the same target: the histograms and counts together, the CPU
    /// summed, the shares of the machine averaged over the `earlier` rounds and this one.
    pub fn absorb(&mut self, other: Run, earlier: usize) {
        if let (Outcome::Open(all), Outcome::Open(more)) = (&mut self.outcome, other.outcome) {
            all.absorb(more);
        }
        self.proxy_cpu = match (self.proxy_cpu, other.proxy_cpu) {
            (Some((a, precise_a)), Some((b, precise_b))) => Some((a + b, precise_a && precise_b)),
            _ => None,
        };
        self.share = match (self.share.take(), other.share) {
            (Some(a), Some(b)) => {
                let n = earlier as f64;
                let mean = |x: f64, y: f64| (x * n + y) / (n + 1.0);
                Some(CpuShare {
                    bench: mean(a.bench, b.bench),
                    proxy: mean(a.proxy, b.proxy),
                    irq: mean(a.irq, b.irq),
                    other: mean(a.other, b.other),
                })
            }
            _ => None,
        };
    }

    pub fn completed(&self) -> u64 {
        match &self.outcome {
            Outcome::Open(r) => r.completed,
            Outcome::Closed(r) => r.completed,
        }
    }

    pub fn errors(&self) -> u64 {
        match &self.outcome {
            Outcome::Open(r) => r.errors,
            Outcome::Closed(r) => r.errors,
        }
    }

    pub fn first_error(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Open(r) => r.first_error.as_deref(),
            Outcome::Closed(r) => r.first_error.as_deref(),
        }
    }

    pub fn throughput(&self) -> f64 {
        match &self.outcome {
            Outcome::Open(r) => r.throughput(),
            Outcome::Closed(r) => r.throughput(),
        }
    }

    /// Latency to the last byte at quantile `q`, in ms.
    pub fn latency(&self, q: f64) -> f64 {
        let hist = match &self.outcome {
            Outcome::Open(r) => &r.latency,
            Outcome::Closed(r) => &r.latency,
        };
        ms(hist.value_at_quantile(q))
    }

    /// Time to the first body byte at quantile `q`, in ms (open loop only).
    pub fn first_byte(&self, q: f64) -> Option<f64> {
        match &self.outcome {
            Outcome::Open(r) => Some(ms(r.first_byte.value_at_quantile(q))),
            Outcome::Closed(_) => None,
        }
    }

    /// Proxy CPU time per completed request, in µs.
    pub fn cpu_per_request(&self) -> Option<f64> {
        let (cpu, _) = self.proxy_cpu?;
        (self.completed() > 0).then(|| cpu.as_secs_f64() * 1e6 / self.completed() as f64)
    }

    /// [`Self::cpu_per_request`] for people: `≈` when it comes from tick counters.
    pub fn cpu_per_request_text(&self) -> Option<String> {
        let precise = self.proxy_cpu?.1;
        let value = fmt_micros(self.cpu_per_request()?);
        Some(if precise { value } else { format!("≈{value}") })
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PhaseKind {
    Small,
    Stream,
    Closed,
    Warm,
    Cold,
}

pub struct Phase {
    pub kind: PhaseKind,
    pub title: String,
    /// For the 800 KB phases: which conversation.
    pub fixture: Option<&'static str>,
    /// Each target's runs, all rounds together.
    pub runs: Vec<Run>,
    /// The medians of each round, target by target (open-loop phases).
    pub rounds: Vec<Vec<RoundFigures>>,
}

/// One target's medians in one round of an open-loop phase, in ms.
pub struct RoundFigures {
    pub target: &'static str,
    pub p50: f64,
    pub first_byte_p50: Option<f64>,
}

impl RoundFigures {
    pub fn of(run: &Run) -> Self {
        Self { target: run.target, p50: run.latency(0.50), first_byte_p50: run.first_byte(0.50) }
    }
}

/// compactor's added latency less nginx's, round by round: each round measured both in the same
/// host state.
pub struct Paired {
    pub differences: Vec<f64>,
}

impl Paired {
    pub fn median(&self) -> f64 {
        let mut sorted = self.differences.clone();
        sorted.sort_by(f64::total_cmp);
        let mid = sorted.len() / 2;
        if sorted.len() % 2 == 1 { sorted[mid] } else { (sorted[mid - 1] + sorted[mid]) / 2.0 }
    }

    pub fn min(&self) -> f64 {
        self.differences.iter().copied().fold(f64::INFINITY, f64::min)
    }

    pub fn max(&self) -> f64 {
        self.differences.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    }
}

impl Phase {
    pub fn run(&self, target: &str) -> Option<&Run> {
        self.runs.iter().find(|r| r.target == target)
    }

    /// compactor's added `value` less nginx's, per round; none with fewer than two rounds.
    pub fn paired(&self, value: &dyn Fn(&RoundFigures) -> Option<f64>) -> Option<Paired> {
        if self.rounds.len() < 2 {
            return None;
        }
        let differences = self
            .rounds
            .iter()
            .map(|round| {
                let of = |name: &str| round.iter().find(|f| f.target == name).and_then(value);
                Some((of("compactor")? - of("direct")?) - (of("nginx")? - of("direct")?))
            })
            .collect::<Option<Vec<f64>>>()?;
        Some(Paired { differences })
    }
}

/// Microseconds as milliseconds.
pub fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

/// A duration in microseconds, printed in µs below a millisecond, else in ms.
pub fn fmt_micros(v: f64) -> String {
    if v < 1000.0 { format!("{v:.0} µs") } else { format!("{:.2} ms", v / 1000.0) }
}
