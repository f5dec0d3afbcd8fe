//! Configuration: built-in defaults < TOML file < `COMPACTOR_` environment, read into one immutable
//! [`Config`] after every key has been checked.

mod reader;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use figment::value::Dict;
use http::Uri;
use serde::Serialize;
use std::collections::BTreeMap;

use crate::compaction::CompactionSettings;
use crate::tokens::{Encoding, ModelInfo, ModelTable};

pub use reader::Reader;

/// The default file, read when no `--config` or `COMPACTOR_CONFIG` names another.
pub const DEFAULT_CONFIG_PATH: &str = "config/compactor.toml";

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("invalid configuration:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
}

/// The validated runtime configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Address the proxy listens on.
    pub listen: SocketAddr,
    pub upstream: UpstreamConfig,
    pub limits: LimitsConfig,
    pub shutdown: ShutdownConfig,
    pub log: LogConfig,
    pub tokens: TokensConfig,
    pub prune: PruneConfig,
    pub truncate: TruncateConfig,
    pub repair: RepairConfig,
    pub session: SessionConfig,
    pub admin: AdminConfig,
    pub compaction: CompactionSettings,
    /// `[models.NAME]` entries over the built-in table.
    pub models: BTreeMap<String, ModelInfo>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TokensConfig {
    /// Token counts remembered by content hash.
    pub cache_entries: u64,
    /// Fixed estimate for one image or document.
    pub image_tokens: u32,
    /// Uncached text above this many bytes is tokenized on a blocking thread.
    pub blocking_tokenize_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PruneConfig {
    pub enabled: bool,
    pub protect_tokens: u32,
    pub minimum_tokens: u32,
    pub placeholder: String,
    pub protected_tools: Vec<String>,
    pub dedupe: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct TruncateConfig {
    pub enabled: bool,
    pub tool_output_max_tokens: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct RepairConfig {
    pub enabled: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Memory,
    Redis,
}

#[derive(Debug, Clone, Serialize)]
pub struct SessionConfig {
    pub store: StoreKind,
    pub header: String,
    pub redis_url: String,
    pub redis_cluster: bool,
    pub key_prefix: String,
    pub ttl_secs: u64,
    pub max_sessions: u64,
    pub redis_timeout_ms: u64,
    pub tenant_secret: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct AdminConfig {
    pub token: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct UpstreamConfig {
    /// Base URL for every path that is not Anthropic's.
    pub openai: BaseUrl,
    /// Base URL for `/v1/messages` and below.
    pub anthropic: BaseUrl,
    pub connect_timeout_ms: u64,
    pub first_byte_timeout_ms: u64,
    pub idle_timeout_ms: u64,
    /// Negotiate HTTP/2 with upstreams (off: long SSE streams queue on one h2 connection).
    pub http2: bool,
    /// Trust the operating system's root certificates in addition to the built-in webpki roots.
    pub native_roots: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct LimitsConfig {
    pub max_body_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ShutdownConfig {
    pub drain_timeout_ms: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LogConfig {
    pub format: LogFormat,
    pub level: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// An upstream base URL: scheme and authority, with an optional path prefix and no trailing slash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    text: String,
    authority: String,
}

impl BaseUrl {
    pub fn parse(raw: &str) -> Result<Self, String> {
        let uri: Uri = raw.parse().map_err(|e| format!("not a URL: {e}"))?;
        match uri.scheme_str() {
            Some("http") | Some("https") => {}
            _ => return Err("must start with http:// or https://".into()),
        }
        let authority = uri.authority().ok_or("has no host")?.to_string();
        if uri.query().is_some() {
            return Err("must not carry a query string".into());
        }
        Ok(Self { text: raw.trim_end_matches('/').to_string(), authority })
    }

    /// The URL text without a trailing slash, ready to have a request path appended.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// `host[:port]`, the value of the Host header sent upstream.
    pub fn authority(&self) -> &str {
        &self.authority
    }
}

/// The URL without any user:password it may carry, for logs and error messages.
impl std::fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.authority.rsplit_once('@') {
            Some((_, host)) => write!(f, "{}", self.text.replacen(&self.authority, host, 1)),
            None => f.write_str(&self.text),
        }
    }
}

impl Serialize for BaseUrl {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl UpstreamConfig {
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
    pub fn first_byte_timeout(&self) -> Duration {
        Duration::from_millis(self.first_byte_timeout_ms)
    }
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8787)),
            upstream: UpstreamConfig {
                openai: BaseUrl { text: "https://api.openai.com".into(), authority: "api.openai.com".into() },
                anthropic: BaseUrl { text: "https://api.anthropic.com".into(), authority: "api.anthropic.com".into() },
                connect_timeout_ms: 10_000,
                first_byte_timeout_ms: 600_000,
                idle_timeout_ms: 300_000,
                http2: false,
                native_roots: false,
            },
            limits: LimitsConfig { max_body_bytes: 32 * 1024 * 1024 },
            shutdown: ShutdownConfig { drain_timeout_ms: 30_000 },
            log: LogConfig { format: LogFormat::Text, level: "info".into() },
            tokens: TokensConfig { cache_entries: 200_000, image_tokens: 1_000, blocking_tokenize_bytes: 65_536 },
            prune: PruneConfig {
                enabled: true,
                protect_tokens: 40_000,
                minimum_tokens: 20_000,
                placeholder: "[Old tool result content cleared]".into(),
                protected_tools: vec!["skill".into()],
                dedupe: true,
            },
            truncate: TruncateConfig { enabled: true, tool_output_max_tokens: 10_000 },
            repair: RepairConfig { enabled: true },
            session: SessionConfig {
                store: StoreKind::Memory,
                header: "x-session-id".into(),
                redis_url: "redis://127.0.0.1:6379".into(),
                redis_cluster: false,
                key_prefix: "compactor".into(),
                ttl_secs: 7 * 24 * 3600,
                max_sessions: 100_000,
                redis_timeout_ms: 250,
                tenant_secret: String::new(),
            },
            admin: AdminConfig { token: String::new() },
            compaction: CompactionSettings::default(),
            models: BTreeMap::new(),
        }
    }
}

/// Which file to read: the explicit one (it must exist), else the default one if present.
pub fn config_path(explicit: Option<&Path>) -> Option<(PathBuf, bool)> {
    match explicit {
        Some(path) => Some((path.to_path_buf(), true)),
        None => {
            let default = PathBuf::from(DEFAULT_CONFIG_PATH);
            default.exists().then_some((default, false))
        }
    }
}

impl Config {
    /// Loads defaults < file < environment and validates every key.
    pub fn load(explicit: Option<&Path>) -> Result<Self, ConfigError> {
        let mut figment = Figment::new();
        if let Some((path, must_exist)) = config_path(explicit) {
            figment = if must_exist { figment.merge(Toml::file_exact(path)) } else { figment.merge(Toml::file(path)) };
        }
        figment = figment.merge(Env::prefixed("COMPACTOR_").split("__").ignore(&["config"]));
        Self::from_figment(&figment)
    }

    /// Validates an already layered figment; used by `load` and by tests.
    pub fn from_figment(figment: &Figment) -> Result<Self, ConfigError> {
        let root: Dict = figment.extract().map_err(Box::new)?;
        let mut r = Reader::new(figment, root);
        let d = Config::default();
        let config = Config {
            listen: r.parse("listen", d.listen, |s: String| {
                s.parse::<SocketAddr>().map_err(|e| format!("not a socket address ({e}), e.g. 127.0.0.1:8787"))
            }),
            upstream: UpstreamConfig {
                openai: r.parse("upstream.openai", d.upstream.openai, |s: String| BaseUrl::parse(&s)),
                anthropic: r.parse("upstream.anthropic", d.upstream.anthropic, |s: String| BaseUrl::parse(&s)),
                connect_timeout_ms: r.parse("upstream.connect_timeout_ms", d.upstream.connect_timeout_ms, positive),
                first_byte_timeout_ms: r.parse(
                    "upstream.first_byte_timeout_ms",
                    d.upstream.first_byte_timeout_ms,
                    positive,
                ),
                idle_timeout_ms: r.parse("upstream.idle_timeout_ms", d.upstream.idle_timeout_ms, positive),
                http2: r.get("upstream.http2", d.upstream.http2),
                native_roots: r.get("upstream.native_roots", d.upstream.native_roots),
            },
            limits: LimitsConfig {
                max_body_bytes: r.parse("limits.max_body_bytes", d.limits.max_body_bytes, positive),
            },
            shutdown: ShutdownConfig {
                drain_timeout_ms: r.get("shutdown.drain_timeout_ms", d.shutdown.drain_timeout_ms),
            },
            log: LogConfig {
                format: r.parse("log.format", d.log.format, |s: String| match s.as_str() {
                    "text" => Ok(LogFormat::Text),
                    "json" => Ok(LogFormat::Json),
                    _ => Err(format!("`{s}` is not one of \"text\", \"json\"")),
                }),
                level: r.parse("log.level", d.log.level, |s: String| {
                    tracing_subscriber::EnvFilter::try_new(&s)
                        .map(|_| s.clone())
                        .map_err(|e| format!("not a log filter ({e}), e.g. \"info\" or \"compactor=debug\""))
                }),
            },
            tokens: TokensConfig {
                cache_entries: r.parse("tokens.cache_entries", d.tokens.cache_entries, positive),
                image_tokens: r.get("tokens.image_tokens", d.tokens.image_tokens),
                blocking_tokenize_bytes: r.get("tokens.blocking_tokenize_bytes", d.tokens.blocking_tokenize_bytes),
            },
            prune: PruneConfig {
                enabled: r.get("prune.enabled", d.prune.enabled),
                protect_tokens: r.get("prune.protect_tokens", d.prune.protect_tokens),
                minimum_tokens: r.get("prune.minimum_tokens", d.prune.minimum_tokens),
                placeholder: r.parse("prune.placeholder", d.prune.placeholder, |s: String| {
                    if s.trim().is_empty() { Err("must not be empty".into()) } else { Ok(s) }
                }),
                protected_tools: r.get("prune.protected_tools", d.prune.protected_tools),
                dedupe: r.get("prune.dedupe", d.prune.dedupe),
            },
            truncate: TruncateConfig {
                enabled: r.get("truncate.enabled", d.truncate.enabled),
                tool_output_max_tokens: r.get("truncate.tool_output_max_tokens", d.truncate.tool_output_max_tokens),
            },
            repair: RepairConfig { enabled: r.get("repair.enabled", d.repair.enabled) },
            session: SessionConfig {
                store: r.parse("session.store", d.session.store, |s: String| match s.as_str() {
                    "memory" => Ok(StoreKind::Memory),
                    "redis" => Ok(StoreKind::Redis),
                    _ => Err(format!("`{s}` is not one of \"memory\", \"redis\"")),
                }),
                header: r.parse("session.header", d.session.header, |s: String| {
                    http::HeaderName::from_bytes(s.as_bytes())
                        .map(|_| s.to_ascii_lowercase())
                        .map_err(|_| format!("`{s}` is not a valid header name"))
                }),
                redis_url: r.parse("session.redis_url", d.session.redis_url, |s: String| {
                    if s.split(',').all(|url| redis::parse_redis_url(url.trim()).is_some()) {
                        Ok(s)
                    } else {
                        Err("not a redis:// URL (or a comma-separated list of them for a cluster)".to_string())
                    }
                }),
                redis_cluster: r.get("session.redis_cluster", d.session.redis_cluster),
                key_prefix: r.get("session.key_prefix", d.session.key_prefix),
                ttl_secs: r.parse("session.ttl_secs", d.session.ttl_secs, positive),
                max_sessions: r.parse("session.max_sessions", d.session.max_sessions, positive),
                redis_timeout_ms: r.parse("session.redis_timeout_ms", d.session.redis_timeout_ms, positive),
                tenant_secret: r.get("session.tenant_secret", d.session.tenant_secret),
            },
            admin: AdminConfig { token: r.get("admin.token", d.admin.token) },
            compaction: compaction_settings(&mut r, d.compaction),
            models: BTreeMap::new(),
        };
        let mut config = config;
        for (name, value) in r.table("models") {
            let key = |field: &str| format!("models.{name}.{field}");
            let Some(table) = value.into_dict() else {
                r.problem(&format!("models.{name}"), "expected a table");
                continue;
            };
            let base = ModelTable::default().lookup(&name);
            let mut sub = Reader::new(figment, table);
            let info = ModelInfo {
                context_window: sub.parse("context_window", base.context_window, positive_u32),
                max_output_tokens: sub.parse("max_output_tokens", base.max_output_tokens, positive_u32),
                token_factor: sub.parse("token_factor", base.token_factor, |f: f32| {
                    if f > 0.0 && f < 10.0 { Ok(f) } else { Err("must be between 0 and 10".into()) }
                }),
                encoding: sub.parse("encoding", base.encoding, |s: String| match s.as_str() {
                    "o200k_base" => Ok(Encoding::O200kBase),
                    "cl100k_base" => Ok(Encoding::Cl100kBase),
                    _ => Err(format!("`{s}` is not one of \"o200k_base\", \"cl100k_base\"")),
                }),
            };
            for problem in sub.finish_relative() {
                r.problem(&key(&problem.0), &problem.1);
            }
            config.models.insert(name, info);
        }
        let problems = r.finish();
        if problems.is_empty() { Ok(config) } else { Err(ConfigError::Invalid(problems)) }
    }

    /// The model table: built-ins overridden by `[models.NAME]`.
    pub fn model_table(&self) -> ModelTable {
        ModelTable::new(self.models.iter().map(|(k, v)| (k.clone(), *v)).collect())
    }

    /// The effective configuration as TOML, for `--check-config`.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render configuration: {e}\n"))
    }
}

fn compaction_settings(r: &mut Reader, d: CompactionSettings) -> CompactionSettings {
    let non_empty = |s: String| if s.trim().is_empty() { Err("must not be empty".to_string()) } else { Ok(s) };
    CompactionSettings {
        auto: r.get("compaction.auto", d.auto),
        threshold: r.parse("compaction.threshold", d.threshold, |t: f64| {
            if t > 0.0 && t <= 1.0 { Ok(t) } else { Err("must be in (0, 1]".into()) }
        }),
        max_retries: r.get("compaction.max_retries", d.max_retries),
        model: r.get("compaction.model", d.model),
        summary_max_tokens: r.parse("compaction.summary_max_tokens", d.summary_max_tokens, positive_u32),
        keep_recent_tokens: r.parse("compaction.keep_recent_tokens", d.keep_recent_tokens, positive_u32),
        user_message_max_tokens: r.get("compaction.user_message_max_tokens", d.user_message_max_tokens),
        summary_prefix: r.get("compaction.summary_prefix", d.summary_prefix),
        system_prompt: r.parse("compaction.system_prompt", d.system_prompt, non_empty),
        instruction: r.parse("compaction.instruction", d.instruction, non_empty),
        emergency_protect_tokens: r.get("compaction.emergency_protect_tokens", d.emergency_protect_tokens),
        min_output_tokens: r.parse("compaction.min_output_tokens", d.min_output_tokens, positive_u32),
        transcript_output_tokens: r.parse(
            "compaction.transcript_output_tokens",
            d.transcript_output_tokens,
            positive_u32,
        ),
        summary_timeout_ms: r.parse("compaction.summary_timeout_ms", d.summary_timeout_ms, positive),
        lock_wait_ms: r.get("compaction.lock_wait_ms", d.lock_wait_ms),
        max_failures: r.parse("compaction.max_failures", d.max_failures, positive_u32),
        agent_markers: r
            .get::<Vec<String>>("compaction.agent_markers", d.agent_markers)
            .into_iter()
            .map(|m| m.to_lowercase())
            .collect(),
        extra_overflow_patterns: r.parse(
            "compaction.extra_overflow_patterns",
            d.extra_overflow_patterns,
            |p: Vec<String>| {
                crate::overflow::OverflowDetector::new(&p)
                    .map(|_| p.clone())
                    .map_err(|e| format!("not a valid pattern: {e}"))
            },
        ),
    }
}

fn positive_u32(value: u32) -> Result<u32, String> {
    if value == 0 { Err("must be greater than 0".into()) } else { Ok(value) }
}

fn positive(value: u64) -> Result<u64, String> {
    if value == 0 { Err("must be greater than 0".into()) } else { Ok(value) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use figment::providers::Serialized;

    fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Config::from_figment(&Figment::new().merge(Toml::string(text)))
    }

    #[test]
    fn empty_configuration_gives_the_documented_defaults() {
        let config = from_toml("").unwrap();
        assert_eq!(config.listen.to_string(), "127.0.0.1:8787");
        assert_eq!(config.upstream.openai.as_str(), "https://api.openai.com");
        assert_eq!(config.limits.max_body_bytes, 32 * 1024 * 1024);
    }

    #[test]
    fn every_bad_key_is_named_at_once() {
        let err = from_toml(
            "listen = \"nowhere\"\nbogus = 1\n[upstream]\nconnect_timeout_ms = \"soon\"\nopenai = \"ftp://x\"\n[log]\nformat = \"xml\"\n",
        )
        .unwrap_err();
        let text = err.to_string();
        for key in ["`listen`", "`bogus`", "`upstream.connect_timeout_ms`", "`upstream.openai`", "`log.format`"] {
            assert!(text.contains(key), "{key} missing from: {text}");
        }
    }

    #[test]
    fn base_url_keeps_its_path_prefix_without_trailing_slash() {
        let config = from_toml("[upstream]\nopenai = \"https://openrouter.ai/api/\"\n").unwrap();
        assert_eq!(config.upstream.openai.as_str(), "https://openrouter.ai/api");
        assert_eq!(config.upstream.openai.authority(), "openrouter.ai");
    }

    #[test]
    fn model_entries_override_the_built_in_table_and_bad_ones_are_named() {
        let config =
            from_toml("[models.\"my-model\"]\ncontext_window = 32768\n[models.default]\nmax_output_tokens = 2048\n")
                .unwrap();
        let table = config.model_table();
        assert_eq!(table.lookup("my-model-q4").context_window, 32_768);
        assert_eq!(table.lookup("unknown").max_output_tokens, 2_048);
        let err = from_toml("[models.\"gpt-4.1\"]\ncontext_window = 0\nwindow = 5\n").unwrap_err().to_string();
        assert!(err.contains("`models.gpt-4.1.context_window`"), "{err}");
        assert!(err.contains("`models.gpt-4.1.window`"), "{err}");
    }

    #[test]
    fn a_base_url_never_shows_its_credentials() {
        let config = from_toml("[upstream]\nopenai = \"https://user:pw-secret@gateway.example/v1\"\n").unwrap();
        assert_eq!(config.upstream.openai.to_string(), "https://gateway.example/v1");
    }

    #[test]
    fn later_layers_override_earlier_ones() {
        let figment = Figment::new()
            .merge(Toml::string("[upstream]\nopenai = \"http://127.0.0.1:1\"\nidle_timeout_ms = 5\n"))
            .merge(Serialized::default("upstream.openai", "http://127.0.0.1:2"));
        let config = Config::from_figment(&figment).unwrap();
        assert_eq!(config.upstream.openai.as_str(), "http://127.0.0.1:2");
        assert_eq!(config.upstream.idle_timeout_ms, 5);
    }
}
