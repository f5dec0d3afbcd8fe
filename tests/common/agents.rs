//! Agent-shaped sessions: the requests Claude Code, Codex CLI, OpenCode and Qwen Code send (see
//! `shared/CLIENTS.md`), growing by one agent turn per request, with facts planted in user messages
//! and tool outputs; a driver that sends a session turn by turn; and what reached the model.
//!
//! Everything is deterministic: the same [`SessionSpec`] always yields the same bytes, so a session
//! sent straight to the provider and the same session sent through compactor can be compared.

use std::ops::Range;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};

use super::provider::{Dialect, ProviderSim, Record};

/// The agents whose request shapes are simulated; `Plain` is a small SDK-script shape (short
/// system prompt, five tools, `max_tokens` 4096) for one dialect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Agent {
    ClaudeCode,
    Codex,
    OpenCode,
    QwenCode,
    Plain(Dialect),
}

impl Agent {
    /// The four real agents, in the order the tables list them.
    pub const REAL: [Agent; 4] = [Agent::ClaudeCode, Agent::Codex, Agent::OpenCode, Agent::QwenCode];

    pub fn dialect(self) -> Dialect {
        match self {
            Agent::ClaudeCode => Dialect::Messages,
            Agent::Codex => Dialect::Responses,
            Agent::OpenCode | Agent::QwenCode => Dialect::Chat,
            Agent::Plain(dialect) => dialect,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "Claude Code",
            Agent::Codex => "Codex CLI",
            Agent::OpenCode => "OpenCode",
            Agent::QwenCode => "Qwen Code",
            Agent::Plain(Dialect::Chat) => "plain chat",
            Agent::Plain(Dialect::Messages) => "plain messages",
            Agent::Plain(Dialect::Responses) => "plain responses",
        }
    }

    /// The `max_tokens` the agent asks for on every request.
    pub fn max_tokens(self) -> u64 {
        match self {
            Agent::ClaudeCode | Agent::OpenCode | Agent::QwenCode => 32_000,
            Agent::Codex => 0,
            Agent::Plain(_) => 4_096,
        }
    }
}

/// Tool-output sizes (in o200k tokens): mostly small command outputs and reads, one 16,000-token
/// file late in every twenty calls; 200 to 16,000 tokens, about 1,600 on average (what issue 17's
/// input ratios at 60 and 150 turns imply under the default prune thresholds).
pub const MIXED_OUTPUTS: [usize; 20] =
    [800, 300, 1_500, 200, 2_500, 600, 1_200, 400, 3_000, 900, 500, 300, 700, 200, 1_000, 400, 600, 16_000, 1_100, 500];

/// How a session grows.
#[derive(Clone, Debug)]
pub struct SessionSpec {
    pub agent: Agent,
    pub model: String,
    /// Tool-output sizes in o200k tokens, used in call order and cycled.
    pub output_tokens: Vec<usize>,
    /// Every `n`th call re-reads a file read earlier, getting the same output again (0: never).
    pub reread_every: usize,
    /// Every `n`th turn ends with a new user message carrying a fact (0: never); the first user
    /// message always carries one.
    pub user_fact_every: usize,
    /// Every `n`th tool output carries a fact, starting with the first (0: never).
    pub output_fact_every: usize,
    /// Varies ids, paths and text between sessions of the same shape.
    pub seed: u64,
    /// `Some(n)`: the agent's `n`th subagent (Claude Code's Task tool) inside the session of
    /// `seed`: the same session id, its own system prompt, task, tool calls and facts.
    pub subagent: Option<u64>,
    /// Where facts are planted.
    pub placement: Placement,
}

/// Where a fact goes in the text that carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Near the start: a line at the top of an output, a short user message. A summarizer that
    /// reads outputs cut to head and tail keeps these.
    Edge,
    /// A sentence in the middle: of a user message of `user_tokens` tokens of prose, and of a tool
    /// output, every other one of which is a single long line. Only a summarizer that reads every
    /// output whole keeps these.
    Middle { user_tokens: usize },
}

impl SessionSpec {
    /// Mixed outputs, one re-read in six calls, a user fact every fifth turn, a fact in every
    /// third tool output.
    pub fn new(agent: Agent, model: &str) -> Self {
        Self {
            agent,
            model: model.to_string(),
            output_tokens: MIXED_OUTPUTS.to_vec(),
            reread_every: 6,
            user_fact_every: 5,
            output_fact_every: 3,
            seed: 1,
            subagent: None,
            placement: Placement::Edge,
        }
    }

    /// Facts planted in the middle of what carries them (see [`Placement::Middle`]), with a user
    /// message of `user_tokens` carrying a fact every `user_fact_every` turns.
    pub fn facts_in_middle(mut self, user_tokens: usize, user_fact_every: usize) -> Self {
        self.placement = Placement::Middle { user_tokens };
        self.user_fact_every = user_fact_every;
        self
    }

    /// The `n`th subagent of this spec's session instead of its main loop.
    pub fn subagent(mut self, n: u64) -> Self {
        self.subagent = Some(n);
        self
    }

    pub fn outputs(mut self, tokens: &[usize]) -> Self {
        self.output_tokens = tokens.to_vec();
        self
    }

    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
}

/// A fact planted in the session: a marker word (`ZEPHYR-LANTERN-12`) the model must keep seeing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fact {
    pub marker: String,
    /// The turn (request index) that first carried it.
    pub turn: usize,
    /// Planted in a tool output (else in a user message).
    pub in_tool_output: bool,
}

/// One request of the session, ready to send.
#[derive(Clone, Debug)]
pub struct Turn {
    pub index: usize,
    pub path: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
    /// Facts this request carries for the first time.
    pub planted: Vec<Fact>,
}

/// One tool call the agent made, remembered so a re-read can repeat its output byte for byte.
#[derive(Clone, Debug)]
struct Call {
    id: String,
    kind: CallKind,
    target: String,
    output: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CallKind {
    Read,
    Shell,
    Patch,
}

/// A growing agent session.
pub struct AgentSession {
    spec: SessionSpec,
    session_id: String,
    /// Seeds what the conversation says (the session id comes from the spec's seed).
    content_seed: u64,
    /// Facts of a subagent are numbered apart from its parent's.
    fact_base: usize,
    system: Vec<String>,
    tools: Value,
    history: Vec<Value>,
    calls: Vec<Call>,
    facts: Vec<Fact>,
    turn: usize,
}

impl AgentSession {
    pub fn new(spec: SessionSpec) -> Self {
        let session_id = match spec.agent {
            Agent::OpenCode => format!("ses_{}", &uuid(spec.seed, 1).replace('-', "")[..26]),
            _ => uuid(spec.seed, 1),
        };
        let (content_seed, fact_base, system) = match spec.subagent {
            None => (spec.seed, 0, system_prompts(spec.agent, spec.seed)),
            Some(n) => {
                let seed = mix(spec.seed ^ (0x5ab0 + n));
                (seed, 1_000 * (n as usize + 1), subagent_prompts(spec.agent, seed))
            }
        };
        let tools = tool_definitions(spec.agent, spec.seed);
        Self {
            spec,
            session_id,
            content_seed,
            fact_base,
            system,
            tools,
            history: Vec::new(),
            calls: Vec::new(),
            facts: Vec::new(),
            turn: 0,
        }
    }

    pub fn spec(&self) -> &SessionSpec {
        &self.spec
    }

    /// The id the agent sends (None for Qwen Code and the plain shapes, which send none).
    pub fn session_id(&self) -> Option<&str> {
        match self.spec.agent {
            Agent::QwenCode | Agent::Plain(_) => None,
            _ => Some(&self.session_id),
        }
    }

    /// Every fact planted so far.
    pub fn facts(&self) -> &[Fact] {
        &self.facts
    }

    /// The next request: the first carries the system prompt and the user's task; each later one
    /// adds the assistant's tool call and its output (and, every few turns, a new user message).
    pub fn next_turn(&mut self) -> Turn {
        let index = self.turn;
        let before = self.facts.len();
        if index == 0 {
            self.open();
        } else {
            self.add_call(index);
            let every = self.spec.user_fact_every;
            if every > 0 && index.is_multiple_of(every) {
                self.add_user_fact(index);
            }
        }
        self.turn += 1;
        let agent = self.spec.agent;
        Turn {
            index,
            path: path(agent),
            headers: self.headers(),
            body: self.body(index),
            planted: self.facts[before..].to_vec(),
        }
    }

    fn plant(&mut self, turn: usize, in_tool_output: bool) -> String {
        let marker = marker(self.fact_base + self.facts.len());
        self.facts.push(Fact { marker: marker.clone(), turn, in_tool_output });
        marker
    }

    fn open(&mut self) {
        let marker = self.plant(0, false);
        let task = match self.spec.subagent {
            None => format!(
                "Add streaming support to the session exporter and keep the public API unchanged. The release codename is {marker}; mention it in the changelog."
            ),
            Some(_) => format!(
                "Find every caller of the session exporter and report each call site with its file and line. Tag the report {marker}."
            ),
        };
        let message = match self.spec.agent {
            // The parent's Task tool hands its subagent the prompt alone.
            Agent::ClaudeCode if self.spec.subagent.is_some() => {
                json!({"role": "user", "content": [{"type": "text", "text": task}]})
            }
            Agent::ClaudeCode => json!({"role": "user", "content": [
                {"type": "text", "text": format!("<system-reminder>\n{}\n</system-reminder>", prose(self.content_seed ^ 0x51, 900))},
                {"type": "text", "text": task}]}),
            Agent::Codex => {
                self.history.push(json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>\n  <cwd>/repo</cwd>\n  <approval_policy>on-request</approval_policy>\n  <sandbox_mode>workspace-write</sandbox_mode>\n  <network_access>restricted</network_access>\n  <shell>bash</shell>\n</environment_context>"}]}));
                json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": task}]})
            }
            Agent::QwenCode => json!({"role": "user", "content": [
                {"type": "text", "text": format!("<system-reminder>{}</system-reminder>", prose(self.content_seed ^ 0x52, 700))},
                {"type": "text", "text": "Today's date is Tuesday, November 3, 2026. My operating system is: linux"},
                {"type": "text", "text": task}]}),
            Agent::Plain(Dialect::Responses) => {
                json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": task}]})
            }
            Agent::Plain(Dialect::Messages) => json!({"role": "user", "content": [{"type": "text", "text": task}]}),
            Agent::OpenCode | Agent::Plain(Dialect::Chat) => json!({"role": "user", "content": task}),
        };
        self.history.push(message);
    }

    fn add_user_fact(&mut self, turn: usize) {
        let marker = self.plant(turn, false);
        let done = format!("Done with step {turn}; the tests pass.");
        let mut ask = format!("Good. Next, also note that the staging database is called {marker}; keep it in mind.");
        if let Placement::Middle { user_tokens } = self.spec.placement {
            let seed = self.content_seed ^ (0x0a5c + turn as u64);
            let half = chars_for(user_tokens / 2, Text::Prose);
            ask = format!(
                "Good. Before you go on, read my notes.\n{}\nAlso note that the staging database is called {marker}, so keep it in mind.\n{}\nThat is all for now.",
                prose(seed, half),
                prose(seed ^ 0xff, half)
            );
        }
        let (assistant, user) = match self.spec.agent.dialect() {
            Dialect::Messages => (
                json!({"role": "assistant", "content": [{"type": "text", "text": done}]}),
                json!({"role": "user", "content": [{"type": "text", "text": ask}]}),
            ),
            Dialect::Responses => (
                json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": done, "annotations": []}]}),
                json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": ask}]}),
            ),
            Dialect::Chat if self.spec.agent == Agent::QwenCode => (
                json!({"role": "assistant", "content": done}),
                json!({"role": "user", "content": [{"type": "text", "text": ask}]}),
            ),
            Dialect::Chat => (json!({"role": "assistant", "content": done}), json!({"role": "user", "content": ask})),
        };
        self.history.push(assistant);
        self.history.push(user);
    }

    /// Call `index - 1`: a file read, a shell command, a patch (Codex), or a re-read.
    fn add_call(&mut self, turn: usize) {
        let number = turn - 1;
        let seed = self.content_seed.wrapping_mul(1_000_003).wrapping_add(number as u64);
        let reads: Vec<usize> = (0..self.calls.len()).filter(|&i| self.calls[i].kind == CallKind::Read).collect();
        let every = self.spec.reread_every;
        let id = call_id(self.spec.agent, seed);
        let call = if every > 0 && (number + 1).is_multiple_of(every) && !reads.is_empty() {
            let earlier = &self.calls[reads[(mix(seed) % reads.len() as u64) as usize]];
            Call { id, kind: CallKind::Read, target: earlier.target.clone(), output: earlier.output.clone() }
        } else {
            let sizes = &self.spec.output_tokens;
            let tokens = if sizes.is_empty() { 1_000 } else { sizes[number % sizes.len()] };
            let kind = if self.spec.agent == Agent::Codex && number % 5 == 4 {
                CallKind::Patch
            } else if tokens > 7_000 || number.is_multiple_of(2) {
                CallKind::Read
            } else {
                CallKind::Shell
            };
            let every = self.spec.output_fact_every;
            let fact = (every > 0 && number.is_multiple_of(every)).then(|| self.plant(turn, true));
            let target = match kind {
                CallKind::Read | CallKind::Patch => {
                    format!("src/{}/{}_{number}.rs", pick(seed, NOUNS), pick(seed >> 7, VERBS))
                }
                CallKind::Shell => {
                    format!("cargo test -p {}-{} -- --nocapture", pick(seed, NOUNS), pick(seed >> 9, NOUNS))
                }
            };
            let output = match (kind, self.spec.placement, fact.as_deref()) {
                (CallKind::Read | CallKind::Shell, Placement::Middle { .. }, Some(marker)) => {
                    let single_line = self.facts.iter().filter(|f| f.in_tool_output).count().is_multiple_of(2);
                    self.output_with_fact_inside(kind, seed, tokens, marker, single_line)
                }
                (CallKind::Read, ..) => self.file_output(seed, tokens, fact.as_deref()),
                (CallKind::Shell, ..) => self.shell_output(&target, seed, tokens, fact.as_deref()),
                (CallKind::Patch, ..) => {
                    let note = fact.map(|m| format!("\nNote: the patch is tracked as {m}.")).unwrap_or_default();
                    format!("Success. Updated the following files:\nM {target}{note}\n")
                }
            };
            Call { id, kind, target, output }
        };
        self.push_call(&call, seed);
        self.calls.push(call);
    }

    /// A file or a command's log with `marker` in a sentence in its middle line (`single_line`:
    /// the whole output one line, the sentence in its middle), far from both ends.
    fn output_with_fact_inside(
        &self,
        kind: CallKind,
        seed: u64,
        tokens: usize,
        marker: &str,
        single_line: bool,
    ) -> String {
        let (text, sentence) = match kind {
            CallKind::Read => (
                code(seed, chars_for(tokens, Text::Code)),
                format!("    // Note that the release key of this module is {marker}, so leave it as it is."),
            ),
            _ => (
                log(seed, chars_for(tokens, Text::Log)),
                format!("the staging cluster reported release key {marker} while the tests ran"),
            ),
        };
        let mut lines: Vec<&str> = text.lines().collect();
        let middle = lines.len() / 2;
        lines.insert(middle, &sentence);
        lines.join(if single_line { " " } else { "\n" })
    }

    /// A file's content as the agent's read tool shows it; the same path always reads the same.
    fn file_output(&self, seed: u64, tokens: usize, fact: Option<&str>) -> String {
        let mut lines: Vec<String> = code(seed, chars_for(tokens, Text::Code)).lines().map(str::to_string).collect();
        if let Some(marker) = fact {
            lines.insert(2.min(lines.len()), format!("// deployment key: {marker} (do not rotate)"));
        }
        match self.spec.agent {
            Agent::ClaudeCode => {
                lines.iter().enumerate().map(|(i, l)| format!("{:>6}\u{2192}{l}\n", i + 1)).collect::<String>()
            }
            Agent::OpenCode => {
                let body: String = lines.iter().enumerate().map(|(i, l)| format!("{:05}| {l}\n", i + 1)).collect();
                format!("<file>\n{body}\n(End of file - total {} lines)\n</file>", lines.len())
            }
            Agent::Codex => format!("Exit code: 0\nWall time: 0.1 seconds\nOutput:\n{}\n", lines.join("\n")),
            _ => lines.join("\n"),
        }
    }

    fn shell_output(&self, command: &str, seed: u64, tokens: usize, fact: Option<&str>) -> String {
        let mut text = log(seed, chars_for(tokens, Text::Log));
        if let Some(marker) = fact {
            text = format!("build id {marker}\n{text}");
        }
        match self.spec.agent {
            Agent::QwenCode => format!("Command: {command}\nOutput: {text}\nExit Code: 0"),
            Agent::Codex => format!("Exit code: 0\nWall time: 2.4 seconds\nOutput:\n{text}\n"),
            _ => text,
        }
    }

    fn push_call(&mut self, call: &Call, seed: u64) {
        let agent = self.spec.agent;
        let (name, arguments): (&str, Value) = match (agent, call.kind) {
            (Agent::ClaudeCode, CallKind::Read) => ("Read", json!({"file_path": format!("/repo/{}", call.target)})),
            (Agent::ClaudeCode, _) => ("Bash", json!({"command": call.target, "description": "Run the tests"})),
            (Agent::Codex, CallKind::Read) => {
                ("exec_command", json!({"cmd": format!("sed -n '1,400p' {}", call.target), "workdir": "/repo"}))
            }
            (Agent::Codex, _) => ("exec_command", json!({"cmd": call.target, "workdir": "/repo"})),
            (Agent::OpenCode, CallKind::Read) => ("read", json!({"filePath": format!("/repo/{}", call.target)})),
            (Agent::OpenCode, _) => (
                "bash",
                json!({"command": call.target, "timeout": 120000, "workdir": "/repo", "description": "Runs the tests"}),
            ),
            (Agent::QwenCode, CallKind::Read) => {
                ("read_file", json!({"absolute_path": format!("/repo/{}", call.target)}))
            }
            (Agent::QwenCode, _) => ("run_shell_command", json!({"command": call.target, "is_background": false})),
            (Agent::Plain(_), CallKind::Read) => ("read_file", json!({"path": call.target})),
            (Agent::Plain(_), _) => ("run", json!({"command": call.target})),
        };
        let say = format!("Let me look at {}.", call.target);
        match agent.dialect() {
            Dialect::Messages => {
                self.history.push(json!({"role": "assistant", "content": [
                    {"type": "text", "text": say},
                    {"type": "tool_use", "id": call.id, "name": name, "input": arguments}]}));
                self.history.push(json!({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": call.output}]}));
            }
            Dialect::Responses => {
                if agent == Agent::Codex {
                    self.history.push(json!({"type": "reasoning", "summary": [], "content": null, "encrypted_content": encrypted(seed)}));
                }
                if call.kind == CallKind::Patch {
                    let patch = format!(
                        "*** Begin Patch\n*** Update File: {}\n@@\n-    let value = compute(index);\n+    let value = compute(index).await?;\n*** End Patch\n",
                        call.target
                    );
                    self.history.push(json!({"type": "custom_tool_call", "status": "completed", "call_id": call.id, "name": "apply_patch", "input": patch}));
                    self.history
                        .push(json!({"type": "custom_tool_call_output", "call_id": call.id, "output": call.output}));
                } else {
                    self.history.push(json!({"type": "function_call", "name": name, "arguments": arguments.to_string(), "call_id": call.id}));
                    self.history
                        .push(json!({"type": "function_call_output", "call_id": call.id, "output": call.output}));
                }
            }
            Dialect::Chat => {
                let tool_call = json!({"id": call.id, "type": "function", "function": {"name": name, "arguments": arguments.to_string()}});
                let (content, result) = match agent {
                    Agent::OpenCode => (json!(""), json!(call.output)),
                    Agent::QwenCode => (Value::Null, json!([{"type": "text", "text": call.output}])),
                    _ => (Value::Null, json!(call.output)),
                };
                self.history.push(json!({"role": "assistant", "content": content, "tool_calls": [tool_call]}));
                self.history.push(json!({"role": "tool", "tool_call_id": call.id, "content": result}));
            }
        }
    }

    fn headers(&self) -> Vec<(&'static str, String)> {
        let id = self.session_id.clone();
        let mut headers = vec![("content-type", "application/json".to_string())];
        match self.spec.agent {
            Agent::ClaudeCode => headers.extend([
                ("anthropic-version", "2023-06-01".to_string()),
                (
                    "anthropic-beta",
                    "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14"
                        .to_string(),
                ),
                ("x-api-key", "sk-ant-sim".to_string()),
                ("x-app", "cli".to_string()),
                ("user-agent", "claude-cli/2.1.197 (external, cli)".to_string()),
                ("x-claude-code-session-id", id),
            ]),
            Agent::Codex => headers.extend([
                ("authorization", "Bearer sk-sim".to_string()),
                ("originator", "codex_cli_rs".to_string()),
                ("version", "0.169.0".to_string()),
                ("accept", "text/event-stream".to_string()),
                ("session_id", id),
            ]),
            Agent::OpenCode => headers.extend([
                ("authorization", "Bearer sk-sim".to_string()),
                ("user-agent", "opencode/1.18.0 ai-sdk/openai-compatible".to_string()),
                ("x-session-affinity", id.clone()),
                ("x-session-id", id),
            ]),
            Agent::QwenCode => headers.extend([
                ("authorization", "Bearer sk-sim".to_string()),
                ("user-agent", "QwenCode/0.24.0 (linux; x64)".to_string()),
                ("x-stainless-lang", "js".to_string()),
            ]),
            Agent::Plain(Dialect::Messages) => headers
                .extend([("anthropic-version", "2023-06-01".to_string()), ("x-api-key", "sk-ant-sim".to_string())]),
            Agent::Plain(_) => headers.push(("authorization", "Bearer sk-sim".to_string())),
        }
        headers
    }

    fn body(&self, index: usize) -> Vec<u8> {
        let agent = self.spec.agent;
        let model = self.spec.model.as_str();
        let body = match agent {
            Agent::ClaudeCode | Agent::Plain(Dialect::Messages) => {
                let mut messages = self.history.clone();
                // The newest message is marked for caching every turn; the marker moves.
                if let Some(last) =
                    messages.last_mut().and_then(|m| m["content"].as_array_mut()).and_then(|c| c.last_mut())
                {
                    last["cache_control"] = json!({"type": "ephemeral"});
                }
                let mut system: Vec<Value> = Vec::new();
                if agent == Agent::ClaudeCode {
                    let cch = format!("{:05x}", mix(self.spec.seed ^ (index as u64 + 1)) & 0xfffff);
                    system.push(json!({"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1.197.e4f; cc_entrypoint=cli; cch={cch};")}));
                }
                for text in &self.system {
                    system.push(json!({"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}));
                }
                let mut body = json!({"model": model, "messages": messages, "system": system, "tools": self.tools});
                if agent == Agent::ClaudeCode {
                    body["metadata"] = json!({"user_id": format!("user_{:016x}{:016x}_account_{}_session_{}", mix(self.spec.seed), mix(self.spec.seed + 1), uuid(self.spec.seed, 2), self.session_id)});
                }
                body["max_tokens"] = json!(agent.max_tokens());
                body["stream"] = json!(true);
                body
            }
            Agent::Codex => {
                let mut input = vec![
                    json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": self.system[0]}]}),
                ];
                input.extend(self.history.iter().cloned());
                json!({"model": model, "input": input, "tools": self.tools, "tool_choice": "auto",
                    "parallel_tool_calls": false, "reasoning": {"effort": "medium", "summary": "auto"}, "store": false,
                    "stream": true, "include": ["reasoning.encrypted_content"], "prompt_cache_key": self.session_id})
            }
            Agent::Plain(Dialect::Responses) => {
                json!({"model": model, "instructions": self.system[0], "input": self.history,
                "tools": self.tools, "max_output_tokens": agent.max_tokens(), "store": false, "stream": true})
            }
            Agent::OpenCode | Agent::QwenCode | Agent::Plain(Dialect::Chat) => {
                let mut messages = vec![json!({"role": "system", "content": self.system[0]})];
                messages.extend(self.history.iter().cloned());
                let mut body = json!({"model": model, "max_tokens": agent.max_tokens(), "messages": messages, "tools": self.tools});
                if agent == Agent::OpenCode {
                    body["tool_choice"] = json!("auto");
                }
                body["stream"] = json!(true);
                body["stream_options"] = json!({"include_usage": true});
                body
            }
        };
        serde_json::to_vec(&body).unwrap_or_default()
    }
}

fn path(agent: Agent) -> &'static str {
    match agent {
        Agent::ClaudeCode => "/v1/messages?beta=true",
        other => other.dialect().path(),
    }
}

/// System prompt blocks: Claude Code sends two (identity line, the prompt), the others one.
fn system_prompts(agent: Agent, seed: u64) -> Vec<String> {
    match agent {
        Agent::ClaudeCode => {
            vec!["You are Claude Code, Anthropic's official CLI for Claude.".to_string(), prose(seed ^ 0xc1, 14_000)]
        }
        Agent::Codex => vec![prose(seed ^ 0xc2, 11_000)],
        Agent::OpenCode => vec![prose(seed ^ 0xc3, 9_600)],
        Agent::QwenCode => vec![prose(seed ^ 0xc4, 27_000)],
        Agent::Plain(_) => vec![prose(seed ^ 0xc5, 1_200)],
    }
}

/// A subagent's system prompt: Claude Code's identity line and its agent prompt (the others: the
/// agent prompt alone), shorter than the main loop's.
fn subagent_prompts(agent: Agent, seed: u64) -> Vec<String> {
    let prompt = format!(
        "You are an agent for Claude Code, Anthropic's official CLI for Claude. Given the user's message, you should use the tools available to complete the task. Do what has been asked; nothing more, nothing less.\n\n{}",
        prose(seed ^ 0xa9, 3_000)
    );
    match agent {
        Agent::ClaudeCode => vec!["You are Claude Code, Anthropic's official CLI for Claude.".to_string(), prompt],
        _ => vec![prompt],
    }
}

/// The agent's tools, each with a description of about the real one's size.
fn tool_definitions(agent: Agent, seed: u64) -> Value {
    let specs: &[(&str, usize)] = match agent {
        Agent::ClaudeCode => &[
            ("Task", 3_800),
            ("Bash", 9_000),
            ("Glob", 600),
            ("Grep", 2_000),
            ("ExitPlanMode", 700),
            ("Read", 1_900),
            ("Edit", 1_200),
            ("MultiEdit", 2_300),
            ("Write", 700),
            ("NotebookEdit", 600),
            ("WebFetch", 1_300),
            ("TodoWrite", 8_500),
            ("WebSearch", 800),
            ("BashOutput", 500),
            ("KillShell", 300),
            ("SlashCommand", 1_100),
        ],
        Agent::Codex => &[
            ("exec_command", 900),
            ("write_stdin", 400),
            ("update_plan", 700),
            ("apply_patch", 2_800),
            ("view_image", 300),
        ],
        Agent::OpenCode => &[
            ("bash", 6_800),
            ("edit", 1_100),
            ("webfetch", 900),
            ("glob", 600),
            ("grep", 800),
            ("list", 400),
            ("read", 1_000),
            ("write", 700),
            ("todowrite", 3_400),
        ],
        Agent::QwenCode => &[
            ("list_directory", 700),
            ("read_file", 1_200),
            ("search_file_content", 1_000),
            ("glob", 900),
            ("replace", 2_600),
            ("write_file", 900),
            ("web_fetch", 800),
            ("read_many_files", 2_200),
            ("run_shell_command", 3_600),
            ("save_memory", 900),
            ("todo_write", 4_200),
            ("task", 1_800),
            ("exit_plan_mode", 600),
            ("web_search", 500),
        ],
        Agent::Plain(_) => &[("read_file", 300), ("run", 300), ("write_file", 300), ("search", 300), ("list", 300)],
    };
    let dialect = agent.dialect();
    let tools: Vec<Value> = specs
        .iter()
        .enumerate()
        .map(|(i, (name, chars))| {
            let description = prose(seed ^ (0x700 + i as u64), *chars);
            let parameters = json!({"type": "object", "properties": {
                "path": {"type": "string", "description": "Path of the file or directory, relative to the workspace root."},
                "command": {"type": "string", "description": "The command line to run."}},
                "required": [], "additionalProperties": false});
            match dialect {
                Dialect::Messages => json!({"name": name, "description": description, "input_schema": parameters}),
                Dialect::Responses if *name == "apply_patch" => json!({"type": "custom", "name": name, "description": description,
                    "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch hunk+ end_patch\nbegin_patch: \"*** Begin Patch\" LF\nend_patch: \"*** End Patch\" LF?"}}),
                Dialect::Responses => json!({"type": "function", "name": name, "description": description, "strict": false, "parameters": parameters}),
                Dialect::Chat => json!({"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}),
            }
        })
        .collect();
    Value::Array(tools)
}

fn call_id(agent: Agent, seed: u64) -> String {
    match agent.dialect() {
        Dialect::Messages => format!("toolu_01{:016x}{:06x}", mix(seed), mix(seed + 7) & 0xffffff),
        Dialect::Responses => format!("call_{:016x}{:08x}", mix(seed), mix(seed + 3) & 0xffff_ffff),
        Dialect::Chat => format!("call_{:012x}", mix(seed) & 0xffff_ffff_ffff),
    }
}

/// A marker the simulator's summaries echo and the fact checks look for: WORD-WORD-NUMBER.
pub fn marker(index: usize) -> String {
    const FIRST: [&str; 12] = [
        "ZEPHYR",
        "QUASAR",
        "COBALT",
        "AMBER",
        "CITRINE",
        "NEBULA",
        "TUNDRA",
        "SAFFRON",
        "OBSIDIAN",
        "VERMILION",
        "HALCYON",
        "JUNIPER",
    ];
    const SECOND: [&str; 12] = [
        "LANTERN", "MAPLE", "HERON", "FALCON", "ORCHID", "GLACIER", "BEACON", "THISTLE", "COMPASS", "EMBER", "WILLOW",
        "HARBOR",
    ];
    format!("{}-{}-{}", FIRST[index % 12], SECOND[(index * 7 + 3) % 12], 10 + index)
}

/// A version-4-looking UUID derived from `seed`.
fn uuid(seed: u64, salt: u64) -> String {
    let a = mix(seed.wrapping_mul(31).wrapping_add(salt));
    let b = mix(a ^ 0x9e37_79b9);
    format!(
        "{:08x}-{:04x}-4{:03x}-a{:03x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        b >> 52,
        b & 0xffff_ffff_ffff
    )
}

/// Opaque reasoning, as the provider's `encrypted_content` (standard base64 alphabet).
fn encrypted(seed: u64) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut state = seed ^ 0xe4c;
    let mut out = String::from("gAAAAABp");
    while out.len() < 600 {
        state = mix(state);
        out.push(ALPHABET[(state % 64) as usize] as char);
    }
    out.push_str("==");
    out
}

/// splitmix64: a fixed, fast mixer, so every generated text is reproducible.
pub fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn pick(seed: u64, list: &'static [&'static str]) -> &'static str {
    list[(mix(seed) % list.len() as u64) as usize]
}

const VERBS: &[&str] = &[
    "parse", "load", "store", "render", "check", "merge", "split", "flush", "encode", "decode", "resolve", "compute",
    "update", "fetch", "build", "scan", "index", "apply", "emit", "collect",
];
const NOUNS: &[&str] = &[
    "token", "frame", "buffer", "session", "header", "record", "cursor", "segment", "payload", "schema", "config",
    "router", "window", "budget", "channel", "entry", "summary", "batch", "span", "module",
];
const TYPES: &[&str] =
    &["Token", "Frame", "Buffer", "Session", "Header", "Record", "Cursor", "Segment", "Payload", "Schema"];
const ADVERBS: &[&str] = &["Always", "Never", "Carefully", "First", "Then", "Only", "Usually", "Quickly"];

/// Kinds of generated text, each with its own o200k density.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Text {
    Code,
    Log,
    Prose,
}

/// Generated text of about `chars` characters.
pub fn text(kind: Text, seed: u64, chars: usize) -> String {
    match kind {
        Text::Code => code(seed, chars),
        Text::Log => log(seed, chars),
        Text::Prose => prose(seed, chars),
    }
}

fn lines(seed: u64, chars: usize, line: impl Fn(&mut u64, usize) -> String) -> String {
    let mut out = String::with_capacity(chars + 120);
    let mut state = seed;
    let mut number = 1;
    while out.len() < chars {
        out.push_str(&line(&mut state, number));
        out.push('\n');
        number += 1;
    }
    let mut end = chars.min(out.len());
    while !out.is_char_boundary(end) {
        end -= 1;
    }
    out.truncate(end);
    out
}

fn code(seed: u64, chars: usize) -> String {
    lines(seed, chars, |state, n| {
        *state = mix(*state);
        let s = *state;
        let (v, w, t) = (pick(s, VERBS), pick(s >> 8, NOUNS), pick(s >> 16, TYPES));
        match s % 7 {
            0 => format!("pub fn {v}_{w}(input: &{t}, limit: usize) -> Result<{t}, Error> {{"),
            1 => format!("    let {w}_{n} = self.{v}_{w}(&{}, {})?;", pick(s >> 24, NOUNS), s % 97),
            2 => format!("    // {v} the {w} before the {} is {}ed", pick(s >> 24, NOUNS), pick(s >> 32, VERBS)),
            3 => format!("    if {w}.len() > {} {{ return Err(Error::{t}); }}", s % 4096),
            4 => "}".to_string(),
            5 => format!("    {w}s.push({t}::new({n}, \"{v}\"));"),
            _ => format!("    match {w} {{ Some(x) => x.{v}(), None => {t}::default() }}"),
        }
    })
}

fn log(seed: u64, chars: usize) -> String {
    lines(seed, chars, |state, n| {
        *state = mix(*state);
        let s = *state;
        let (v, w) = (pick(s, VERBS), pick(s >> 8, NOUNS));
        match s % 5 {
            0 => format!("test {w}::tests::{v}_{}_{n} ... ok", pick(s >> 16, NOUNS)),
            1 => format!("   Compiling {w}-{} v0.{}.{} (/repo/crates/{w})", pick(s >> 16, NOUNS), s % 20, s % 9),
            2 => {
                format!("warning: the {w} returned by {v} is never read after the {} is updated", pick(s >> 16, NOUNS))
            }
            3 => format!("info: {v} {w} for the {} module finished in {} ms", pick(s >> 16, NOUNS), s % 700),
            _ => format!("    Finished `test` profile [unoptimized + debuginfo] target(s) in {}.{}s", s % 60, s % 10),
        }
    })
}

fn prose(seed: u64, chars: usize) -> String {
    lines(seed, chars, |state, n| {
        *state = mix(*state);
        let s = *state;
        let (v, w) = (pick(s >> 8, VERBS), pick(s >> 16, NOUNS));
        match s % 3 {
            0 => format!(
                "{} {v} the {w} before you {} the {}, and {} every {} the user names.",
                pick(s, ADVERBS),
                pick(s >> 24, VERBS),
                pick(s >> 32, NOUNS),
                pick(s >> 40, VERBS),
                pick(s >> 48, NOUNS)
            ),
            1 => format!(
                "- Use `{v}_{w}()` from src/{w}/{v}.rs when the {} is {}ed ({n}).",
                pick(s >> 24, NOUNS),
                pick(s >> 32, VERBS)
            ),
            _ => format!(
                "- {} run `{} {w}/{v}` to {} the {}.",
                pick(s, ADVERBS),
                pick(s >> 24, VERBS),
                pick(s >> 32, VERBS),
                pick(s >> 40, NOUNS)
            ),
        }
    })
}

/// Characters of `kind` text per o200k token, measured once on a sample.
pub fn chars_per_token(kind: Text) -> f64 {
    static MEASURED: OnceLock<[f64; 3]> = OnceLock::new();
    let measured = MEASURED.get_or_init(|| {
        let bpe = tiktoken_rs::o200k_base_singleton();
        [Text::Code, Text::Log, Text::Prose].map(|kind| {
            let sample = text(kind, 7, 60_000);
            sample.chars().count() as f64 / bpe.encode_ordinary(&sample).len().max(1) as f64
        })
    });
    measured[kind as usize]
}

/// Characters of `kind` text that o200k counts as about `tokens`.
pub fn chars_for(tokens: usize, kind: Text) -> usize {
    (tokens as f64 * chars_per_token(kind)).round() as usize
}

/// Characters per o200k token of what an agent session mostly consists of (tool outputs: file
/// contents and command logs, with the agent's prose): what "density 1.0" means for the simulator.
pub fn session_chars_per_token() -> f64 {
    (chars_per_token(Text::Code) * 2.0 + chars_per_token(Text::Log) + chars_per_token(Text::Prose)) / 4.0
}

/// One turn as the agent saw it.
#[derive(Clone, Debug)]
pub struct TurnResult {
    pub index: usize,
    /// HTTP status the agent got (0 when the request failed outright).
    pub status: u16,
    /// A 200 without an error event in it.
    pub ok: bool,
    /// The provider's records made while this turn was in flight (indices into [`Run::records`]).
    pub records: Range<usize>,
    /// compactor's `x-compactor-*` headers, when it answered.
    pub compactor: Vec<(String, String)>,
    pub body: String,
}

/// A session sent turn by turn, with everything the provider saw.
pub struct Run {
    pub agent: Agent,
    pub turns: Vec<TurnResult>,
    pub facts: Vec<Fact>,
    pub records: Vec<Record>,
}

/// The admin token [`ProviderSim::compactor_config`] configures, so [`drive`] can see when
/// compactor has recorded a turn.
pub const ADMIN_TOKEN: &str = "sim-admin";

/// Sends `turns` turns of `session` to `base` (the provider itself, or compactor in front of it)
/// one after the other, each after the previous answer, as an agent does. The provider must serve
/// only this session while it runs, so every record it makes belongs to it.
///
/// compactor records a session's state after the response has ended, off the request's path; a
/// real agent spends at least a tool call before its next request, the driver none. So through
/// compactor (with the admin API on, as `compactor_config` sets it) it waits for that write
/// before the next turn, which makes every run of a session the same.
pub async fn drive(base: &str, provider: &ProviderSim, session: &mut AgentSession, turns: usize) -> Run {
    let client = super::client();
    let first = provider.len();
    let mut results = Vec::new();
    let mut recorded = 0;
    for _ in 0..turns {
        let turn = session.next_turn();
        let start = provider.len() - first;
        let headers: Vec<(&str, &str)> = turn.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let request = super::request("POST", &format!("{base}{}", turn.path), &headers, turn.body);
        let answer = match tokio::time::timeout(Duration::from_secs(900), client.request(request)).await {
            Ok(Ok(response)) => Some(super::collect(response).await),
            _ => None,
        };
        let end = provider.len() - first;
        let result = match answer {
            Some(answer) => {
                let body = answer.text();
                let compactor: Vec<(String, String)> = answer
                    .headers
                    .iter()
                    .filter(|(name, _)| name.as_str().starts_with("x-compactor-"))
                    .map(|(name, value)| (name.to_string(), value.to_str().unwrap_or("").to_string()))
                    .collect();
                if let Some((_, key)) = compactor.iter().find(|(name, _)| name == "x-compactor-session") {
                    recorded = recorded_requests(&client, base, key, recorded).await;
                }
                TurnResult {
                    index: turn.index,
                    status: answer.status.as_u16(),
                    ok: answer.status == 200 && !is_error_stream(&body),
                    records: start..end,
                    compactor,
                    body,
                }
            }
            None => TurnResult {
                index: turn.index,
                status: 0,
                ok: false,
                records: start..end,
                compactor: Vec::new(),
                body: String::new(),
            },
        };
        results.push(result);
    }
    let records = provider.records_from(first);
    Run { agent: session.spec().agent, turns: results, facts: session.facts().to_vec(), records }
}

/// Waits (up to two seconds) until compactor's stored state for session `key` counts more than
/// `before` requests, and returns the count; returns `before` when the admin API is off.
async fn recorded_requests(client: &super::HttpClient, base: &str, key: &str, before: u64) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    while tokio::time::Instant::now() < deadline {
        let request = super::request("GET", &format!("{base}/admin/sessions/{key}"), &[("authorization", &bearer)], "");
        let Ok(response) = client.request(request).await else { return before };
        let answer = super::collect(response).await;
        if answer.status != 200 {
            return before;
        }
        let requests = serde_json::from_slice::<Value>(&answer.body)
            .ok()
            .and_then(|v| v["state"]["counters"]["requests"].as_u64());
        match requests {
            Some(count) if count > before => return count,
            Some(_) => tokio::time::sleep(Duration::from_millis(2)).await,
            None => return before,
        }
    }
    before
}

/// A 200 stream that carries an error instead of an answer (Responses' `response.failed`).
fn is_error_stream(body: &str) -> bool {
    body.contains("\"type\":\"response.failed\"") || body.starts_with("error:") || body.contains("\nevent: error\n")
}

/// What one session cost in upstream calls and what reached the model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    pub turns: usize,
    /// Turns the agent got an error for.
    pub client_errors: usize,
    /// Every request the provider received.
    pub upstream_calls: usize,
    /// Overflow errors the provider sent for the agent's requests.
    pub overflows: usize,
    pub summary_calls: usize,
    /// Summary calls the provider did not answer with a summary (overflowed or rejected).
    pub failed_summaries: usize,
    /// Requests rejected for broken tool pairing or bad JSON.
    pub rejected: usize,
    /// Prompt tokens (by the provider's count) of the requests the model answered, summed.
    pub tokens_answered: usize,
    pub facts_planted: usize,
    /// Facts that reached the model on every answered turn from the one that planted them.
    pub facts_retained: usize,
}

impl Stats {
    pub fn facts_retained_percent(&self) -> f64 {
        if self.facts_planted == 0 { 100.0 } else { 100.0 * self.facts_retained as f64 / self.facts_planted as f64 }
    }

    pub fn calls_per_turn(&self) -> f64 {
        self.upstream_calls as f64 / self.turns.max(1) as f64
    }

    pub fn tokens_per_turn(&self) -> f64 {
        self.tokens_answered as f64 / (self.turns - self.client_errors).max(1) as f64
    }
}

impl Run {
    /// The request the model answered for turn `index` (the last one, after any retries).
    pub fn answered(&self, index: usize) -> Option<&Record> {
        let turn = self.turns.get(index)?;
        if !turn.ok {
            return None;
        }
        self.records[turn.records.clone()].iter().rev().find(|r| !r.summary && r.outcome.is_answered())
    }

    /// Facts that did not reach the model on some answered turn from the one that planted them
    /// (or never reached it, when no later turn was answered), with the first such turn.
    pub fn lost_facts(&self) -> Vec<(String, usize)> {
        let mut lost = Vec::new();
        for fact in &self.facts {
            let answered: Vec<(usize, &Record)> =
                (fact.turn..self.turns.len()).filter_map(|t| self.answered(t).map(|r| (t, r))).collect();
            let missing = match answered.first() {
                None => Some(fact.turn),
                Some(_) => answered.iter().find(|(_, r)| !r.markers.contains(&fact.marker)).map(|(t, _)| *t),
            };
            if let Some(turn) = missing {
                lost.push((fact.marker.clone(), turn));
            }
        }
        lost
    }

    pub fn stats(&self) -> Stats {
        let summaries = self.records.iter().filter(|r| r.summary);
        let tokens_answered = (0..self.turns.len()).filter_map(|t| self.answered(t)).map(|r| r.tokens).sum();
        Stats {
            turns: self.turns.len(),
            client_errors: self.turns.iter().filter(|t| !t.ok).count(),
            upstream_calls: self.records.len(),
            overflows: self
                .records
                .iter()
                .filter(|r| !r.summary && r.outcome == super::provider::Outcome::Overflow)
                .count(),
            summary_calls: summaries.clone().count(),
            failed_summaries: summaries.filter(|r| !r.outcome.is_answered()).count(),
            rejected: self.records.iter().filter(|r| r.outcome == super::provider::Outcome::Rejected).count(),
            tokens_answered,
            facts_planted: self.facts.len(),
            facts_retained: self.facts.len() - self.lost_facts().len(),
        }
    }

    /// The agent's requests the model answered, in order (no summary calls, no rejected ones).
    pub fn answered_requests(&self) -> Vec<&Record> {
        self.records.iter().filter(|r| !r.summary && r.outcome.is_answered()).collect()
    }
}
