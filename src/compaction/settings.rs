//! `[compaction]`: when to compact, how the summary is asked for, and what counts as an overflow.

use std::time::Duration;

use serde::Serialize;

use super::agent;
use super::ladder::{DEFAULT_ORDER, Rung};
use super::summarizer::Transcript;
use crate::overflow::OverflowDetector;

/// `[compaction]` settings.
#[derive(Debug, Clone, Serialize)]
pub struct CompactionSettings {
    pub auto: bool,
    pub threshold: f64,
    pub max_retries: u32,
    pub model: String,
    pub summary_max_tokens: u32,
    pub keep_recent_tokens: u32,
    pub user_message_max_tokens: u32,
    pub summary_prefix: String,
    pub system_prompt: String,
    pub instruction: String,
    pub emergency_protect_tokens: u32,
    pub min_output_tokens: u32,
    /// The most the window budget keeps free for an answer, whatever `max_tokens` asks.
    pub output_reserve_tokens: u32,
    /// What the summarizer reads of each message: every message whole, in as many pieces as
    /// its window needs (`whole`), or tool outputs cut to head and tail first (`head_tail`).
    pub transcript: Transcript,
    pub transcript_output_tokens: u32,
    /// How long a summary call may take.
    #[serde(rename = "summary_timeout_ms", serialize_with = "crate::config::millis")]
    pub summary_timeout: Duration,
    /// How long a request waits for another replica's compaction of the same session.
    #[serde(rename = "lock_wait_ms", serialize_with = "crate::config::millis")]
    pub lock_wait: Duration,
    /// How long a compaction's lock lives without its holder renewing it; the holder renews it
    /// every third of this while it summarizes, so a holder that died frees it after at most this.
    #[serde(rename = "lock_lease_ms", serialize_with = "crate::config::millis")]
    pub lock_lease: Duration,
    pub max_failures: u32,
    /// Summaries prepared in the background when a conversation will soon pass the threshold.
    pub background: bool,
    /// How many turns ahead, at the newest turn's growth, a crossing starts a background summary.
    pub background_turns_ahead: u32,
    /// On an upstream priced with the `local` cache preset: the prompt rebuilt around a prepared
    /// summary is sent ahead (a one-token call) once it is ready and the agent's last request
    /// answered, so the server prefills it while the agent's tool runs; the next request applies it.
    pub prefill_ahead: bool,
    /// The rungs after lowering `max_tokens`, in the order they are tried.
    pub ladder: Vec<Rung>,
    /// Lower-cased, so a request is matched without lower-casing the list each time.
    pub agent_markers: Vec<String>,
    /// Built-in overflow detection plus the configured extra patterns, compiled once.
    #[serde(rename = "extra_overflow_patterns")]
    pub overflow: OverflowDetector,
}

pub const DEFAULT_SYSTEM_PROMPT: &str = "You are a context-compaction assistant. You receive the transcript of an AI agent's work \
session (the user's requests, the assistant's replies, tool calls and tool outputs) and write a handoff summary that lets \
another model continue the work seamlessly. You do not call tools and you do not continue the task: you only write the summary.";

pub const DEFAULT_INSTRUCTION: &str = "Write a detailed handoff summary of the conversation above, in this order:\n\
1. The user's goal, and every constraint, preference and instruction the user stated (quote them when wording matters).\n\
2. Facts the agent found, verbatim: every value, identifier, name, path, command, URL, version, number, error message and \
test result that appeared in a message or a tool output, wherever it appeared in that output (the middle of a file, one \
line of a log), with where it came from. Copy them exactly; never paraphrase or round them.\n\
3. What has been done so far, step by step, with outcomes.\n\
4. Decisions made and why; approaches that failed and why.\n\
5. What was pending at the end of the transcript: the task in progress, open questions, and the next steps.\n\
When the transcript starts with a summary of the earlier conversation, keep every fact of that summary too. Be specific and \
complete; do not invent anything that is not in the transcript.";

pub const DEFAULT_SUMMARY_PREFIX: &str = "Another language model started to solve this task and produced a summary of its work \
so far, because the conversation grew too long for its context window. Use this handoff summary to continue the task \
without redoing finished work; the most recent messages follow it verbatim.\n\n";

impl CompactionSettings {
    /// Whether the prune-harder rung comes before the first summary (then compaction ahead of
    /// time prunes harder first too).
    pub fn prunes_before_summarizing(&self) -> bool {
        let at = |rung: Rung| self.ladder.iter().position(|r| *r == rung);
        match (at(Rung::PruneHard), at(Rung::Summarize)) {
            (Some(prune), Some(summarize)) => prune < summarize,
            (Some(_), None) => true,
            _ => false,
        }
    }
}

impl Default for CompactionSettings {
    fn default() -> Self {
        Self {
            auto: true,
            threshold: 0.8,
            max_retries: 3,
            model: String::new(),
            summary_max_tokens: 8_192,
            keep_recent_tokens: 20_000,
            user_message_max_tokens: 20_000,
            summary_prefix: DEFAULT_SUMMARY_PREFIX.into(),
            system_prompt: DEFAULT_SYSTEM_PROMPT.into(),
            instruction: DEFAULT_INSTRUCTION.into(),
            emergency_protect_tokens: 4_000,
            min_output_tokens: 1_024,
            output_reserve_tokens: 4_096,
            transcript: Transcript::Whole,
            transcript_output_tokens: 2_000,
            summary_timeout: Duration::from_millis(300_000),
            lock_wait: Duration::from_millis(120_000),
            lock_lease: Duration::from_millis(30_000),
            max_failures: 3,
            background: true,
            background_turns_ahead: 2,
            prefill_ahead: true,
            ladder: DEFAULT_ORDER.to_vec(),
            agent_markers: agent::DEFAULT_MARKERS.iter().map(|m| m.to_string()).collect(),
            overflow: OverflowDetector::default(),
        }
    }
}
