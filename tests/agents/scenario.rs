//! One scripted scenario played by a real agent CLI, straight at the provider simulator or through
//! compactor (the real binary, default settings), and what the provider saw.

use std::path::Path;
use std::time::Duration;

use crate::clis::{self, Cli, Outcome};
use crate::common::ProxyProcess;
use crate::common::cloud::FrontRequest;
use crate::common::provider::{Errors, Outcome as Handled, ProviderSim, ProviderSpec, Record};
use crate::common::script::{self, Script};
use crate::common::window::markers;
use crate::platforms::Platform;

/// How the scenario runs.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub script: Script,
    /// The provider's window when the script sets none from its room.
    pub window: usize,
    /// compactor's configuration besides its upstreams (empty: its defaults).
    pub config: String,
    /// How long the agent may take.
    pub limit: Duration,
    /// Leave the agent's own context management on (its users' defaults).
    pub own_compaction: bool,
}

/// What a played scenario gave.
pub struct Played {
    pub cli: Cli,
    pub through_compactor: bool,
    /// What the fake cloud platform received (Bedrock, Vertex AI), with its verdict on each.
    pub front: Vec<FrontRequest>,
    pub outcome: Outcome,
    pub records: Vec<Record>,
    /// The provider's window in force at the end.
    pub window: usize,
    /// Fact tokens the script printed, in order.
    pub facts: Vec<String>,
}

impl Played {
    /// The facts the agent's final answer carries.
    pub fn facts_answered(&self) -> Vec<String> {
        let found = markers(&self.outcome.answer);
        self.facts.iter().filter(|f| found.contains(f)).cloned().collect()
    }

    /// Overflow errors the provider sent (for anything: the agent's requests or summary calls).
    pub fn overflows(&self) -> usize {
        self.records.iter().filter(|r| r.outcome == Handled::Overflow).count()
    }

    /// compactor's summary calls.
    pub fn summary_calls(&self) -> usize {
        self.records.iter().filter(|r| r.summary).count()
    }

    /// The agent's own summary requests that reached the provider.
    pub fn agent_summaries(&self) -> Vec<&Record> {
        self.records.iter().filter(|r| r.agent_summary).collect()
    }

    /// Rounds the model called.
    pub fn rounds_called(&self) -> usize {
        self.records.iter().map(|r| r.round).max().unwrap_or(0)
    }

    /// Whether the model gave its final answer.
    pub fn finished(&self) -> bool {
        self.records.iter().any(|r| r.final_answer)
    }

    /// A short account for assertion messages and the bench's log.
    pub fn describe(&self) -> String {
        let trail: Vec<String> = self
            .records
            .iter()
            .filter(|r| r.model_call)
            .map(|r| {
                let kind = if r.summary {
                    "S"
                } else if r.agent_summary {
                    "A"
                } else if r.helper {
                    "h"
                } else {
                    "t"
                };
                format!("{kind}{}:{}:{}", r.round, r.tokens, r.status)
            })
            .collect();
        format!(
            "{} {}: window {}, facts answered {}/{}, rounds called {}, overflows {}, summary calls {}, agent summaries {}\nrequests (kind round:tokens:status): {}\n{}",
            self.cli.name(),
            if self.through_compactor { "through compactor" } else { "direct" },
            self.window,
            self.facts_answered().len(),
            self.facts.len(),
            self.rounds_called(),
            self.overflows(),
            self.summary_calls(),
            self.agent_summaries().len(),
            trail.join(" "),
            self.outcome.describe()
        )
    }
}

/// Plays `scenario` with `cli` (installed at `exe`), through compactor or straight at the
/// provider.
pub async fn play(cli: Cli, exe: &Path, scenario: &Scenario, through_compactor: bool) -> Played {
    let spec = ProviderSpec {
        window: scenario.window,
        errors: Errors::Real,
        script: Some(scenario.script.clone()),
        ..ProviderSpec::default()
    };
    let provider = ProviderSim::start(spec).await;
    let platform = Platform::start(cli, &provider).await;
    let proxy = through_compactor.then(|| match &platform {
        Some(platform) => {
            ProxyProcess::start_with(&platform.compactor_config(&provider, &scenario.config), &platform.compactor_env())
        }
        None => ProxyProcess::start_with(&provider.compactor_config(&scenario.config), &[]),
    });
    let base = match (&proxy, &platform) {
        (Some(proxy), _) => proxy.url(""),
        (None, Some(platform)) => platform.url(),
        (None, None) => provider.url(),
    };
    let env = platform.as_ref().map(|p| p.agent_env(through_compactor)).unwrap_or_default();
    let exe = exe.to_path_buf();
    let (limit, own) = (scenario.limit, scenario.own_compaction);
    let outcome =
        tokio::task::spawn_blocking(move || clis::run(cli, &exe, &base, limit, own, &env)).await.expect("agent run");
    let logs = proxy.as_ref().map(|p| p.logs()).unwrap_or_default();
    // For looking into a run: every request body the provider received, one file each.
    if let Ok(dir) = std::env::var("COMPACTOR_AGENTS_DUMP") {
        let dir = Path::new(&dir).join(format!("{:?}-{}", cli, if through_compactor { "compactor" } else { "direct" }));
        let _ = std::fs::create_dir_all(&dir);
        for (i, record) in provider.records().iter().enumerate() {
            let _ = std::fs::write(dir.join(format!("{i:03}.json")), &record.body);
        }
        let _ = std::fs::write(dir.join("compactor.log"), logs.join("\n"));
        let _ = std::fs::write(dir.join("stdout.txt"), &outcome.stdout);
        let _ = std::fs::write(dir.join("stderr.txt"), &outcome.stderr);
    }
    Played {
        cli,
        through_compactor,
        front: platform.as_ref().map(Platform::requests).unwrap_or_default(),
        outcome,
        records: provider.records(),
        window: provider.window(),
        facts: (1..=scenario.script.rounds).map(script::fact).collect(),
    }
}
