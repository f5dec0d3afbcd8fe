//! The scripted model the provider simulator plays for real agent CLIs: it makes the agent run
//! its own shell tool round after round, each command printing one fact token and some filler,
//! then answers with the facts it can still see.
//!
//! Everything is read from the request itself, never from what earlier requests said: a compacting
//! proxy removes old tool outputs and replaces history with summaries, and the model must behave
//! like a real one that only knows its prompt. Progress is the highest `step K of N` the request
//! still shows (in a call, an output or a summary), facts are the fact tokens it still shows.

use serde_json::{Value, json};

use super::agents;
use super::provider::Dialect;
use super::window::markers;

/// How a scripted session runs.
#[derive(Clone, Debug)]
pub struct Script {
    /// Shell calls before the final answer.
    pub rounds: usize,
    /// Tokens of filler each command prints (by the simulator's count).
    pub filler_tokens: usize,
    /// `Some(room)`: the window is the first scripted request's prompt plus `room` tokens, so the
    /// same scenario overflows at the same round whatever the agent's own system prompt and tools
    /// weigh. `None`: the spec's window.
    pub room: Option<usize>,
}

impl Script {
    pub fn new(rounds: usize, filler_tokens: usize) -> Self {
        Self { rounds, filler_tokens, room: None }
    }

    pub fn room(mut self, room: usize) -> Self {
        self.room = Some(room);
        self
    }
}

/// The fact token round `k` (1-based) prints.
pub fn fact(round: usize) -> String {
    agents::marker(round - 1)
}

/// What kind of request the agent sent, from its prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A turn of the agent's loop, with its shell tool.
    Turn,
    /// The agent's own compaction: a summary request in its own words.
    AgentSummary,
    /// Another helper call of the agent (OpenCode's title, a quota probe): answered briefly.
    Helper,
}

/// Phrases of the agents' own summary prompts (see `shared/CLIENTS.md`).
const AGENT_SUMMARY_MARKERS: [&str; 6] = [
    // Claude Code
    "tasked with summarizing conversations",
    // Codex CLI
    "CONTEXT CHECKPOINT COMPACTION",
    // OpenCode
    "context summarization agent",
    // Qwen Code (the tool-keeping first call, then the tool-less one)
    "tool execution is disabled for this request",
    "summarizes a conversation when its context window",
    // Gemini CLI
    "distilling chat history into a structured XML",
];

/// Whether the request is one of the agents' own summary requests.
pub fn is_agent_summary(body: &str) -> bool {
    AGENT_SUMMARY_MARKERS.iter().any(|m| body.contains(m))
}

/// The names agents give their shell tool.
const SHELL_TOOLS: [&str; 5] = ["Bash", "exec_command", "bash", "run_shell_command", "shell"];

/// The wire format of a request, as far as the script cares: where it declares its tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    /// One of the simulator's three OpenAI and Anthropic dialects.
    Dialect(Dialect),
    /// Gemini's `generateContent`: `tools[].functionDeclarations[]`, schemas in
    /// `parametersJsonSchema` (Gemini CLI) or `parameters`.
    Gemini,
}

impl From<Dialect> for Wire {
    fn from(dialect: Dialect) -> Self {
        Wire::Dialect(dialect)
    }
}

/// The agent's shell tool: its name and its parameters' JSON schema.
pub fn shell_tool(wire: Wire, body: &Value) -> Option<(String, Value)> {
    let tools = body["tools"].as_array()?;
    let shell = |name: &str, schema: &Value| SHELL_TOOLS.contains(&name).then(|| (name.to_string(), schema.clone()));
    match wire {
        Wire::Gemini => tools
            .iter()
            .flat_map(|tool| tool["functionDeclarations"].as_array().into_iter().flatten())
            .find_map(|declaration| {
                let schema = declaration.get("parametersJsonSchema").or_else(|| declaration.get("parameters"))?;
                shell(declaration["name"].as_str()?, schema)
            }),
        Wire::Dialect(dialect) => tools.iter().find_map(|tool| {
            let (name, schema) = match dialect {
                Dialect::Messages => (tool["name"].as_str()?, &tool["input_schema"]),
                Dialect::Chat => (tool["function"]["name"].as_str()?, &tool["function"]["parameters"]),
                Dialect::Responses => (tool["name"].as_str()?, &tool["parameters"]),
            };
            shell(name, schema)
        }),
    }
}

pub fn kind(wire: Wire, body: &Value, text: &str) -> Kind {
    if is_agent_summary(text) {
        Kind::AgentSummary
    } else if shell_tool(wire, body).is_some() {
        Kind::Turn
    } else {
        Kind::Helper
    }
}

/// The highest round the text shows (`step K of N`) and its N; `(0, 0)` when none.
pub fn progress(text: &str) -> (usize, usize) {
    let re = regex::Regex::new(r"step (\d+) of (\d+)").unwrap();
    re.captures_iter(text)
        .filter_map(|c| Some((c[1].parse::<usize>().ok()?, c[2].parse::<usize>().ok()?)))
        .max()
        .unwrap_or((0, 0))
}

/// A tool call the model makes.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub id: String,
    pub name: String,
    /// The arguments as a JSON object.
    pub arguments: Value,
}

/// What the model answers to a turn.
#[derive(Clone, Debug, PartialEq)]
pub enum Move {
    Call(Call),
    Text(String),
}

/// The shell command of round `k`: it prints the step, the fact token (assembled by the shell,
/// so the token itself is never in the call) and `filler_tokens` of filler lines.
pub fn command(round: usize, rounds: usize, filler_tokens: usize, chars_per_token: f64) -> String {
    let token = fact(round);
    let (head, number) = token.rsplit_once('-').unwrap_or((&token, ""));
    let line = format!("filler {round}: the build log repeats this line so the step takes room in the window");
    let lines = ((filler_tokens as f64 * chars_per_token) / (line.len() + 1) as f64).ceil() as usize;
    // Qwen Code's one-shot shell can return before it read the child's output: a short sleep at
    // the end lets every output arrive.
    format!(
        "echo 'step {round} of {rounds}'; printf 'fact: %s-%s\\n' {head} {number}; yes '{line}' | head -n {lines}; sleep 0.3"
    )
}

/// The next move for a turn request: round `k + 1` when the request shows round `k`, the final
/// answer once it shows the last round.
pub fn next_move(script: &Script, wire: Wire, body: &Value, text: &str, chars_per_token: f64) -> Move {
    let (done, _) = progress(text);
    let Some((name, schema)) = shell_tool(wire, body) else {
        return Move::Text("No shell tool was offered.".into());
    };
    if done >= script.rounds {
        let facts = markers(text);
        return Move::Text(format!("All {done} steps ran. Facts seen: {}.", facts.join(" ")));
    }
    let round = done + 1;
    let command = command(round, script.rounds, script.filler_tokens, chars_per_token);
    let properties = &schema["properties"];
    let key = if properties.get("cmd").is_some() && properties.get("command").is_none() { "cmd" } else { "command" };
    let mut arguments = json!({ key: command });
    if properties.get("description").is_some() {
        arguments["description"] = json!(format!("Run step {round}"));
    }
    // Codex CLI cuts an output above its default token budget in the middle; ask for all of it.
    if properties.get("max_output_tokens").is_some() {
        arguments["max_output_tokens"] = json!(script.filler_tokens * 4);
    }
    let id = match wire {
        Wire::Dialect(Dialect::Messages) => {
            format!("toolu_01script{round:04}{:08x}", agents::mix(text.len() as u64) & 0xffff_ffff)
        }
        // The Gemini API gives its calls no id (the agent makes one up); this one is not sent.
        Wire::Dialect(Dialect::Chat | Dialect::Responses) | Wire::Gemini => {
            format!("call_script{round:04}{:08x}", agents::mix(text.len() as u64) & 0xffff_ffff)
        }
    };
    Move::Call(Call { id, name, arguments })
}

/// The answer to a summary request (the agent's or compactor's): the facts and the progress it
/// was shown, nothing it was not.
pub fn summary(number: usize, text: &str, padding: &str) -> String {
    let facts = markers(text);
    let (done, total) = progress(text);
    let steps = if done > 0 { format!(" Progress: step {done} of {total} done.") } else { String::new() };
    format!("Handoff summary {number}. Facts carried over: {}.{steps}\n\n{padding}", facts.join(" "))
}
