//! The real agent CLIs (installed by `scripts/agents-install` into `tests/agents/node_modules`),
//! each run headless against a base URL with a throw-away home, its own configuration for a
//! custom provider, and every update check, telemetry and own context management turned off.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The prompt every agent gets: the scripted model decides what happens next.
pub const PROMPT: &str = "Run the scripted steps with your shell tool, then report every fact token you saw.";

/// When set to 1, a missing CLI fails the suite instead of skipping it (CI sets it).
pub const REQUIRE: &str = "COMPACTOR_REQUIRE_AGENT_TESTS";

/// The agent CLIs the suite drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cli {
    ClaudeCode,
    /// Claude Code with `CLAUDE_CODE_USE_BEDROCK=1`, in front of the fake Bedrock (`platforms`).
    ClaudeCodeBedrock,
    /// Claude Code with `CLAUDE_CODE_USE_VERTEX=1`, in front of the fake Vertex AI.
    ClaudeCodeVertex,
    Codex,
    OpenCode,
    QwenCode,
    Gemini,
}

impl Cli {
    pub const ALL: [Cli; 7] = [
        Cli::ClaudeCode,
        Cli::ClaudeCodeBedrock,
        Cli::ClaudeCodeVertex,
        Cli::Codex,
        Cli::OpenCode,
        Cli::QwenCode,
        Cli::Gemini,
    ];

    /// Whether it is Claude Code, on whichever platform.
    pub fn is_claude_code(self) -> bool {
        matches!(self, Cli::ClaudeCode | Cli::ClaudeCodeBedrock | Cli::ClaudeCodeVertex)
    }

    pub fn name(self) -> &'static str {
        match self {
            Cli::ClaudeCode => "Claude Code",
            Cli::ClaudeCodeBedrock => "Claude Code on Bedrock",
            Cli::ClaudeCodeVertex => "Claude Code on Vertex AI",
            Cli::Codex => "Codex CLI",
            Cli::OpenCode => "OpenCode",
            Cli::QwenCode => "Qwen Code",
            Cli::Gemini => "Gemini CLI",
        }
    }

    fn bin(self) -> &'static str {
        match self {
            Cli::ClaudeCode | Cli::ClaudeCodeBedrock | Cli::ClaudeCodeVertex => "claude",
            Cli::Codex => "codex",
            Cli::OpenCode => "opencode",
            Cli::QwenCode => "qwen",
            Cli::Gemini => "gemini",
        }
    }

    /// The installed executable, if `scripts/agents-install` ran.
    pub fn path(self) -> Option<PathBuf> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents/node_modules/.bin").join(self.bin());
        path.exists().then_some(path)
    }

    /// The CLI, or `None` to skip; panics when it is missing and the suite is required.
    pub fn require(self) -> Option<PathBuf> {
        let path = self.path();
        if path.is_none() {
            assert!(
                std::env::var(REQUIRE).as_deref() != Ok("1"),
                "{} is not installed (run scripts/agents-install) and {REQUIRE}=1",
                self.name()
            );
            eprintln!("skipping {}: not installed (run scripts/agents-install)", self.name());
        }
        path
    }

    /// The model name it asks for.
    pub fn model(self) -> &'static str {
        match self {
            Cli::ClaudeCode => "claude-sonnet-4-5",
            // The ids the platforms give Claude Sonnet 4.5 (an inference profile's on Bedrock).
            Cli::ClaudeCodeBedrock => "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
            Cli::ClaudeCodeVertex => "claude-sonnet-4-5@20250929",
            Cli::Codex => "gpt-5",
            Cli::OpenCode | Cli::QwenCode => "sim-model",
            // A Gemini 3 model: the simulator then refuses a current turn whose calls lost their
            // thought signatures, as the Gemini API does.
            Cli::Gemini => "gemini-3.1-pro-preview",
        }
    }
}

/// What one run of an agent gave.
#[derive(Debug)]
pub struct Outcome {
    /// Exit code (`None`: killed by a signal or the time limit).
    pub code: Option<i32>,
    pub timed_out: bool,
    /// The agent's final answer as it reported it (not its tool outputs).
    pub answer: String,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    /// A short account for assertion messages.
    pub fn describe(&self) -> String {
        let tail = |s: &str| s.chars().rev().take(1500).collect::<Vec<_>>().into_iter().rev().collect::<String>();
        format!(
            "exit {:?}{}; answer {:?}\nstdout tail: {}\nstderr tail: {}",
            self.code,
            if self.timed_out { " (timed out)" } else { "" },
            self.answer,
            tail(&self.stdout),
            tail(&self.stderr)
        )
    }
}

/// Runs `cli` once with [`PROMPT`] against `base` (scheme, host and port: the provider or
/// compactor), in a fresh temporary home and working directory. `own_compaction`: leave the
/// agent's own context management on, as its users run it (else off where it can be turned off).
/// `env`: what else the agent is given (a cloud platform's switches and credentials).
pub fn run(
    cli: Cli,
    exe: &Path,
    base: &str,
    limit: Duration,
    own_compaction: bool,
    env: &[(String, String)],
) -> Outcome {
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path().join("home");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let mut command = Command::new(exe);
    command.env_clear().env("PATH", std::env::var("PATH").unwrap_or_default()).env("HOME", &home);
    command.env("TMPDIR", dir.path()).current_dir(&work);
    let final_file = dir.path().join("final.txt");
    match cli {
        Cli::ClaudeCode | Cli::ClaudeCodeBedrock | Cli::ClaudeCodeVertex => {
            command
                .args(["-p", PROMPT, "--model", cli.model(), "--output-format", "json"])
                .arg("--dangerously-skip-permissions")
                .env("IS_SANDBOX", "1");
            match cli {
                Cli::ClaudeCodeBedrock => {
                    command.env("CLAUDE_CODE_USE_BEDROCK", "1").env("ANTHROPIC_BEDROCK_BASE_URL", base)
                }
                Cli::ClaudeCodeVertex => {
                    command.env("CLAUDE_CODE_USE_VERTEX", "1").env("ANTHROPIC_VERTEX_BASE_URL", format!("{base}/v1"))
                }
                _ => command.env("ANTHROPIC_BASE_URL", base).env("ANTHROPIC_API_KEY", "sk-ant-test"),
            };
            command
                .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
                .env("DISABLE_TELEMETRY", "1")
                .env("DISABLE_ERROR_REPORTING", "1")
                .env("DISABLE_AUTOUPDATER", "1");
            if !own_compaction {
                command.env("DISABLE_COMPACT", "1").env("DISABLE_AUTO_COMPACT", "1");
            }
        }
        Cli::Codex => {
            let codex_home = home.join(".codex");
            std::fs::create_dir_all(&codex_home).unwrap();
            let config = format!(
                "model = \"{}\"\nmodel_provider = \"sim\"\napproval_policy = \"never\"\nsandbox_mode = \"danger-full-access\"\n\
                 [model_providers.sim]\nname = \"sim\"\nbase_url = \"{base}/v1\"\nwire_api = \"responses\"\nenv_key = \"SIM_API_KEY\"\n\
                 request_max_retries = 0\nstream_max_retries = 0\n",
                cli.model()
            );
            std::fs::write(codex_home.join("config.toml"), config).unwrap();
            command
                .args(["exec", "--skip-git-repo-check", "-C"])
                .arg(&work)
                .arg("--json")
                .arg("-o")
                .arg(&final_file)
                .arg(PROMPT)
                .env("CODEX_HOME", &codex_home)
                .env("SIM_API_KEY", "sk-test");
        }
        Cli::OpenCode => {
            // The window it is told is large: its own overflow handling stays out of the way.
            let config = serde_json::json!({
                "$schema": "https://opencode.ai/config.json",
                "provider": {"sim": {"npm": "@ai-sdk/openai-compatible", "name": "sim",
                    "options": {"baseURL": format!("{base}/v1"), "apiKey": "sk-test"},
                    "models": {"sim-model": {"name": "sim-model", "limit": {"context": 1_000_000, "output": 4096}}}}},
                "autoupdate": false, "share": "disabled", "compaction": {"auto": own_compaction, "prune": own_compaction}
            });
            std::fs::write(work.join("opencode.json"), config.to_string()).unwrap();
            command
                .args(["run", "--format", "json", "--model", &format!("sim/{}", cli.model()), PROMPT])
                .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
                .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
                .env("OPENCODE_DISABLE_LSP_DOWNLOAD", "1")
                .env("OPENCODE_DISABLE_SHARE", "1");
            if !own_compaction {
                command.env("OPENCODE_DISABLE_AUTOCOMPACT", "1").env("OPENCODE_DISABLE_PRUNE", "1");
            }
        }
        Cli::QwenCode => {
            command
                .args(["--yolo", "--auth-type", "openai", "-m", cli.model(), "-o", "text", PROMPT])
                .env("OPENAI_BASE_URL", format!("{base}/v1"))
                .env("OPENAI_API_KEY", "sk-test")
                .env("OPENAI_MODEL", cli.model())
                .env("QWEN_CODE_SUPPRESS_YOLO_WARNING", "1");
        }
        Cli::Gemini => {
            // The API key auth type (with the base URL alone 0.61 refuses "Invalid auth method
            // selected."), and nothing that reaches the network besides the base URL: no usage
            // statistics, telemetry, update check or ripgrep. Its own compression starts at half
            // its model's window (1,048,576 tokens for Gemini 3), which no run here reaches.
            let settings = serde_json::json!({
                "security": {"auth": {"selectedType": "gemini-api-key"}},
                "general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false},
                "privacy": {"usageStatisticsEnabled": false},
                "telemetry": {"enabled": false},
                "tools": {"useRipgrep": false}
            });
            let gemini_home = home.join(".gemini");
            std::fs::create_dir_all(&gemini_home).unwrap();
            std::fs::write(gemini_home.join("settings.json"), settings.to_string()).unwrap();
            command
                .args(["-p", PROMPT, "--yolo", "-m", cli.model(), "-o", "json"])
                .env("GOOGLE_GEMINI_BASE_URL", base)
                .env("GEMINI_API_KEY", "AIzaSy-sim-test-key")
                .env("GEMINI_CLI_TRUST_WORKSPACE", "true");
        }
    }
    command.envs(env.iter().map(|(name, value)| (name, value)));
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // Its own process group, so a time-out ends the agent and every command it started.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command.spawn().expect("start the agent CLI");
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let read = |mut stream: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stream, &mut text);
            text
        })
    };
    let out = read(Box::new(stdout));
    let err = read(Box::new(stderr));
    let started = Instant::now();
    let mut timed_out = false;
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait for the agent") {
            break status.code();
        }
        if started.elapsed() > limit {
            timed_out = true;
            // The process group this function created: the agent and every command it started.
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", child.id())]).status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    let answer = match cli {
        Cli::ClaudeCode | Cli::ClaudeCodeBedrock | Cli::ClaudeCodeVertex => {
            last_json(&stdout).and_then(|v| v["result"].as_str().map(String::from)).unwrap_or_default()
        }
        Cli::Codex => std::fs::read_to_string(&final_file).unwrap_or_default(),
        Cli::OpenCode => stdout
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|event| event["type"] == "text")
            .filter_map(|event| event["part"]["text"].as_str().map(String::from))
            .collect::<Vec<_>>()
            .join("\n"),
        Cli::QwenCode => stdout.clone(),
        Cli::Gemini => last_json(&stdout).and_then(|v| v["response"].as_str().map(String::from)).unwrap_or_default(),
    };
    Outcome { code, timed_out, answer, stdout, stderr }
}

/// The last line of `text` that parses as JSON (Claude Code prints one object).
fn last_json(text: &str) -> Option<Value> {
    serde_json::from_str(text.trim()).ok().or_else(|| text.lines().rev().find_map(|l| serde_json::from_str(l).ok()))
}
