//! The agents bench (`scripts/bench-agents`, ignored in normal test runs): each real agent runs a
//! long scripted session (30 rounds of about 4,000 tokens by default) on a large window, straight
//! at the provider and through compactor at its defaults, and every upstream request is priced
//! under the provider's prefix caching: Anthropic prices for Claude Code (reads 0.1x, writes
//! 1.25x), Gemini's implicit caching for Gemini CLI and OpenAI prices for the others (reads 0.25x,
//! no write surcharge), with the same model of
//! the cache the sessions bench uses (`bill_by_prefix`, and `bill_by_breakpoints` for Claude Code),
//! and the tokens a local server (llama.cpp, vLLM, SGLang) would prefill again after each change.
//!
//! Settings (environment): `COMPACTOR_BENCH_AGENTS` (comma-separated: claude, codex, opencode,
//! qwen, gemini; default all), `COMPACTOR_BENCH_ROUNDS` (30), `COMPACTOR_BENCH_FILLER` (4000),
//! `COMPACTOR_BENCH_WINDOWS` (200000,1000000).

use std::time::Duration;

use crate::clis::Cli;
use crate::common::provider::{ANTHROPIC, Bill, GEMINI, OPENAI, Prices, Record, bill_by_breakpoints, bill_by_prefix};
use crate::common::script::Script;
use crate::scenario::{Played, Scenario, play};

fn setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

fn agents() -> Vec<Cli> {
    let chosen = std::env::var("COMPACTOR_BENCH_AGENTS").unwrap_or_default();
    Cli::ALL
        .into_iter()
        .filter(|cli| {
            let key = match cli {
                Cli::ClaudeCode => "claude",
                Cli::ClaudeCodeBedrock => "claude-bedrock",
                Cli::ClaudeCodeVertex => "claude-vertex",
                Cli::Codex => "codex",
                Cli::OpenCode => "opencode",
                Cli::QwenCode => "qwen",
                Cli::Gemini => "gemini",
            };
            chosen.is_empty() || chosen.split(',').any(|c| c.trim() == key)
        })
        .collect()
}

/// The provider's prices for the agent's dialect.
fn prices(cli: Cli) -> Prices {
    match cli {
        Cli::ClaudeCode | Cli::ClaudeCodeBedrock | Cli::ClaudeCodeVertex => ANTHROPIC,
        Cli::Gemini => GEMINI,
        Cli::Codex | Cli::OpenCode | Cli::QwenCode => OPENAI,
    }
}

/// The requests that belong to the agent's conversation and to compactor (helper calls such as
/// OpenCode's title request are another conversation).
fn billed(played: &Played) -> Vec<Record> {
    played.records.iter().filter(|r| !r.helper).cloned().collect()
}

/// One row of the table.
struct Row {
    cli: Cli,
    window: usize,
    direct: Bill,
    through: Bill,
    /// Anthropic at breakpoints only (Claude Code): direct and through compactor.
    breakpoints: Option<(f64, f64)>,
    facts_direct: usize,
    facts_through: usize,
    facts: usize,
    last_direct: usize,
    last_through: usize,
    overflows_through: usize,
}

/// The prompt tokens of the last answered turn of the agent.
fn last_prompt(played: &Played) -> usize {
    played
        .records
        .iter()
        .rev()
        .find(|r| r.outcome.is_answered() && r.model_call && !r.summary && !r.helper)
        .map_or(0, |r| r.tokens)
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "the agents bench: scripts/bench-agents"]
async fn bench_agents() {
    let rounds: usize = setting("COMPACTOR_BENCH_ROUNDS", 30);
    let filler: usize = setting("COMPACTOR_BENCH_FILLER", 4_000);
    let windows: Vec<usize> = std::env::var("COMPACTOR_BENCH_WINDOWS")
        .unwrap_or_else(|_| "200000,1000000".into())
        .split(',')
        .filter_map(|w| w.trim().parse().ok())
        .collect();
    let mut rows = Vec::new();
    for cli in agents() {
        let Some(exe) = cli.require() else { continue };
        for &window in &windows {
            let scenario = Scenario {
                script: Script::new(rounds, filler),
                window,
                config: String::new(),
                limit: Duration::from_secs(1_200),
                own_compaction: true,
            };
            let direct = play(cli, &exe, &scenario, false).await;
            eprintln!("{}", direct.describe().lines().take(2).collect::<Vec<_>>().join("\n"));
            let through = play(cli, &exe, &scenario, true).await;
            eprintln!("{}", through.describe().lines().take(2).collect::<Vec<_>>().join("\n"));
            let prices = prices(cli);
            let (direct_records, through_records) = (billed(&direct), billed(&through));
            let breakpoints = cli.is_claude_code().then(|| {
                (
                    bill_by_breakpoints(&direct_records, &prices).cost,
                    bill_by_breakpoints(&through_records, &prices).cost,
                )
            });
            rows.push(Row {
                cli,
                window,
                direct: bill_by_prefix(&direct_records, &prices),
                through: bill_by_prefix(&through_records, &prices),
                breakpoints,
                facts_direct: direct.facts_answered().len(),
                facts_through: through.facts_answered().len(),
                facts: through.facts.len(),
                last_direct: last_prompt(&direct),
                last_through: last_prompt(&through),
                overflows_through: through.overflows(),
            });
        }
    }
    println!(
        "\n{rounds} rounds of {filler} tokens, compactor at its defaults; cost in base input tokens, ratio = through compactor / direct\n"
    );
    println!(
        "| agent | window | prices | cost direct | cost via compactor | ratio | breaks | cache writes (direct -> via) | re-prefilled on a local server (direct -> via) | facts direct | facts via | summary calls | overflows via | prompt at last turn (direct -> via) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for row in &rows {
        let ratio = row.through.cost / row.direct.cost;
        let breakpoints = row
            .breakpoints
            .map(|(direct, through)| format!(" ({:.2}x at breakpoints)", through / direct))
            .unwrap_or_default();
        println!(
            "| {} | {}k | {} | {:.0} | {:.0} | **{ratio:.2}x**{breakpoints} | {} | {} -> {} | {} -> {} | {}/{} | {}/{} | {} | {} | {} -> {} |",
            row.cli.name(),
            row.window / 1000,
            prices(row.cli).name,
            row.direct.cost,
            row.through.cost,
            row.through.breaks,
            row.direct.cache_write,
            row.through.cache_write,
            row.direct.prefilled,
            row.through.prefilled,
            row.facts_direct,
            row.facts,
            row.facts_through,
            row.facts,
            row.through.summary_calls,
            row.overflows_through,
            row.last_direct,
            row.last_through,
        );
    }
}
