//! Each agent through compactor past the provider's window: every fact in its final answer, at
//! most one overflow reaching compactor (two where the error names no window), at most three
//! summary calls in eight rounds, and the agent's own compaction left alone. The same scenario
//! played straight at the provider fails: without compactor the agent runs out of room.

use std::time::Duration;

use crate::clis::Cli;
use crate::common::cloud::Verdict;
use crate::common::provider::{ErrorStyle, Errors};
use crate::common::script::Script;
use crate::scenario::{Scenario, play};

/// Eight rounds of 2,000 tokens on a window 10,000 tokens above the agent's opening request:
/// the agent overflows by its sixth round.
fn scenario() -> Scenario {
    Scenario {
        script: Script::new(8, 2_000).room(10_000),
        window: 1_000_000,
        config: String::new(),
        limit: Duration::from_secs(240),
        own_compaction: false,
    }
}

/// Overflows compactor may see: one when the error names the window, two when it does not.
fn allowed_overflows(cli: Cli) -> usize {
    let dialect = match cli {
        Cli::ClaudeCode | Cli::ClaudeCodeBedrock | Cli::ClaudeCodeVertex => crate::common::provider::Dialect::Messages,
        Cli::Codex => crate::common::provider::Dialect::Responses,
        Cli::OpenCode | Cli::QwenCode => crate::common::provider::Dialect::Chat,
        // The Gemini API's 400 names the window: "The input token count (N) exceeds the maximum
        // number of tokens allowed (M)."
        Cli::Gemini => return 1,
    };
    let style: ErrorStyle = Errors::Real.style(dialect);
    if style.names_window() { 1 } else { 2 }
}

async fn through_compactor(cli: Cli) {
    let Some(exe) = cli.require() else { return };
    let played = play(cli, &exe, &scenario(), true).await;
    let account = played.describe();
    eprintln!("{account}");
    assert!(played.finished(), "the model never gave its final answer: {account}");
    assert_eq!(played.facts_answered(), played.facts, "facts lost: {account}");
    assert!(played.overflows() <= allowed_overflows(cli), "too many overflows reached compactor: {account}");
    assert!(played.summary_calls() <= 3, "more than three summary calls in eight rounds: {account}");
    // The agent's own compaction is off (or never needed): compactor must not have set it off,
    // and any the agent sent must have reached the provider as the agent sent it, answered.
    for record in played.agent_summaries() {
        assert!(record.outcome.is_answered(), "the agent's own summary request failed: {account}");
    }
    assert_eq!(played.outcome.code, Some(0), "the agent failed: {account}");
    // On a cloud platform every request reached the fake authenticated by compactor: signed (its
    // SigV4 signature recomputed by the fake) or with its service account's token.
    for request in &played.front {
        assert_eq!(request.verdict, Verdict::Verified, "{} {}: {account}", request.method, request.path);
    }
    if cli == Cli::ClaudeCodeBedrock || cli == Cli::ClaudeCodeVertex {
        assert!(played.front.len() >= played.facts.len(), "the agent's requests went through the fake: {account}");
    }
}

/// The scenario needs compactor: straight at the provider, the agent fails (or, Qwen Code, gets
/// through only by overflowing again and compacting on its own).
async fn direct_fails(cli: Cli) {
    let Some(exe) = cli.require() else { return };
    let played = play(cli, &exe, &scenario(), false).await;
    let account = played.describe();
    eprintln!("{account}");
    assert!(played.overflows() >= 1, "the scenario never overflowed the window: {account}");
    // Straight at a fake platform, the agent authenticated itself (its AWS SDK's signatures, its
    // bearer) and the fake let it through: the overflow, not the credential, is what stopped it.
    if !played.front.is_empty() {
        let verified = played.front.iter().filter(|r| r.verdict == Verdict::Verified).count();
        assert!(verified >= 2, "the fake refused the agent's own credential: {account}");
    }
    // What the suite asks through compactor; Qwen Code, whose own compaction cannot be turned
    // off, can finish with every fact on its own, but only after more overflows and its own
    // summary requests.
    let passed = played.outcome.code == Some(0)
        && played.facts_answered() == played.facts
        && played.overflows() <= allowed_overflows(cli)
        && played.agent_summaries().is_empty();
    assert!(!passed, "the agent got through without compactor, so the scenario proves nothing: {account}");
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_through_compactor() {
    through_compactor(Cli::ClaudeCode).await;
}

/// Claude Code on Bedrock with `CLAUDE_CODE_SKIP_BEDROCK_AUTH=1` and a client key: compactor
/// signs every request, and the fake Bedrock checks each signature.
#[tokio::test(flavor = "multi_thread")]
async fn claude_code_on_bedrock_through_compactor() {
    through_compactor(Cli::ClaudeCodeBedrock).await;
}

/// Claude Code on Vertex AI with `CLAUDE_CODE_SKIP_VERTEX_AUTH=1` and a client key: compactor
/// adds its service account's token, and the fake Vertex AI checks each.
#[tokio::test(flavor = "multi_thread")]
async fn claude_code_on_vertex_through_compactor() {
    through_compactor(Cli::ClaudeCodeVertex).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn codex_through_compactor() {
    through_compactor(Cli::Codex).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn opencode_through_compactor() {
    through_compactor(Cli::OpenCode).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn qwen_code_through_compactor() {
    through_compactor(Cli::QwenCode).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn gemini_cli_through_compactor() {
    through_compactor(Cli::Gemini).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_direct_fails() {
    direct_fails(Cli::ClaudeCode).await;
}

/// Straight at the fake Bedrock, Claude Code signing with its own AWS credentials (the AWS SDK's
/// signatures, checked by the fake): the overflow ends the run.
#[tokio::test(flavor = "multi_thread")]
async fn claude_code_on_bedrock_direct_fails() {
    direct_fails(Cli::ClaudeCodeBedrock).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_on_vertex_direct_fails() {
    direct_fails(Cli::ClaudeCodeVertex).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn codex_direct_fails() {
    direct_fails(Cli::Codex).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn opencode_direct_fails() {
    direct_fails(Cli::OpenCode).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn qwen_code_direct_fails() {
    direct_fails(Cli::QwenCode).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn gemini_cli_direct_fails() {
    direct_fails(Cli::Gemini).await;
}

/// The scripted command keeps its fact token out of the call: only running it shows the token,
/// so a fact can reach the final answer only through the output (or a summary of it).
#[test]
fn the_fact_token_is_in_the_output_only() {
    use crate::common::script::{command, fact};
    use crate::common::window::markers;
    let chars_per_token = 4.0;
    let command = command(3, 8, 2_000, chars_per_token);
    assert!(markers(&command).is_empty(), "the call shows a fact token: {command}");
    let output = std::process::Command::new("bash").args(["-c", &command]).output().expect("bash runs");
    let output = String::from_utf8_lossy(&output.stdout);
    assert_eq!(markers(&output), vec![fact(3)]);
    assert!(output.starts_with("step 3 of 8\n"), "progress is the first line: {}", &output[..40]);
    let tokens = output.len() as f64 / chars_per_token;
    assert!((2_000.0..2_200.0).contains(&tokens), "the output is {tokens} tokens, not about 2,000");
}
