//! Configuration: built-in defaults < TOML file < `COMPACTOR_` environment, read into one immutable
//! [`Config`] after every key has been checked.

mod base_url;
mod check;
pub mod compaction;
mod env;
pub mod headers;
mod load;
mod raw;
mod secret;
pub mod stateful;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;

use crate::rewrite::{CachePricing, PruneSettings, RewriteSettings};
use crate::tokens::{ModelInfo, ModelTable};
pub use base_url::BaseUrl;
use compaction::CompactionSettings;

pub use load::config_path;
pub use secret::{REDACTED, RedisUrls, Secret};

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

/// The validated runtime configuration, in the form the hot path uses (durations, compiled
/// patterns, a checked log filter). `Serialize` renders it for `--check-config` with the same keys
/// the file uses; secrets render as `[redacted]`.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Address the proxy listens on.
    pub listen: SocketAddr,
    pub upstream: UpstreamConfig,
    pub limits: LimitsConfig,
    pub shutdown: ShutdownConfig,
    pub log: LogConfig,
    pub trace: TraceConfig,
    pub tokens: TokensConfig,
    pub prune: PruneConfig,
    pub truncate: TruncateConfig,
    pub repair: RepairConfig,
    pub session: SessionConfig,
    pub admin: AdminConfig,
    pub inspector: InspectorConfig,
    pub bypass: BypassConfig,
    pub compaction: CompactionSettings,
    /// `[models.NAME]` entries over the built-in table.
    pub models: BTreeMap<String, ModelInfo>,
    /// `[clients.TENANT]` entries: compactor's own client keys, by the tenant each names (see
    /// [`crate::cloud::ClientKeys`]).
    pub clients: BTreeMap<String, ClientKeyHashes>,
}

/// The SHA-256 digests of one tenant's client keys (`key_sha256`, one or a list: a key being
/// rotated and its successor). Only digests are configured: the file holds no key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ClientKeyHashes {
    #[serde(serialize_with = "hex_digests")]
    pub key_sha256: Vec<[u8; 32]>,
}

/// Digests as the file spells them, lowercase hex.
fn hex_digests<S: serde::Serializer>(digests: &[[u8; 32]], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(digests.iter().map(|d| d.iter().map(|b| format!("{b:02x}")).collect::<String>()))
}

#[derive(Debug, Clone, Serialize)]
pub struct TokensConfig {
    /// The most memory the token-count cache may hold, in bytes (each count costs
    /// [`crate::tokens::TOKEN_ENTRY_BYTES`]). Replaces `cache_entries`, still read: it converts.
    pub cache_bytes: u64,
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
    /// `protect_tokens` and `minimum_tokens` are at most these shares of the request's window,
    /// so a small window masks old outputs before it pays for a summary.
    pub protect_window_share: f64,
    pub minimum_window_share: f64,
    /// What a pruned output becomes: a template where `{tool}` is the call's tool name, `{args}`
    /// its arguments on one line (cut to 100 characters), `{tokens}` the output's size; a text
    /// without them is used as it is.
    pub placeholder: String,
    pub protected_tools: Vec<String>,
    pub dedupe: bool,
    /// Share of the window (less the output reserve) above which a ready prune batch goes whatever
    /// it costs the prompt cache: by default compaction's threshold, so old outputs are the first
    /// thing given up when the window runs out of room, and nothing the model read goes before.
    /// Below it a batch goes only when the cache is cold (the conversation idle past the
    /// upstream's cache lifetime) or when it pays back (see docs/payback.md).
    pub pressure: f64,
    /// Below pressure, on a warm cache, a prune batch goes only when it pays back over the turns
    /// the conversation runs with at least this probability, by how long the deployment has seen
    /// conversations of the model run.
    pub payback_confidence: f64,
    /// Run lengths (turns on a warm cache) counted as if measured, each as much as the estimate
    /// needs to use it; none by default: until the deployment has measured its own, no batch
    /// pays back.
    pub assumed_runs: Vec<u64>,
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
    pub redis_url: RedisUrls,
    pub redis_cluster: bool,
    pub key_prefix: String,
    #[serde(rename = "ttl_secs", serialize_with = "secs")]
    pub ttl: Duration,
    /// The most sessions the in-memory store keeps (with `memory_bytes`, whichever is reached
    /// first; the least recently used go first).
    pub max_sessions: u64,
    /// The most memory the in-memory store may hold, in bytes, by an estimate of each session's
    /// size (its conversations, pruned ids, compaction records and summaries).
    pub memory_bytes: u64,
    /// Conversations kept per session (an agent's main loop, its subagents, its side requests), in
    /// memory and in Redis; the least recently used go first, with their records.
    pub max_conversations: u32,
    #[serde(rename = "redis_timeout_ms", serialize_with = "millis")]
    pub redis_timeout: Duration,
    pub tenant_secret: Secret,
    /// Store failures in a row after which the store is skipped for `breaker_backoff`.
    pub breaker_failures: u32,
    /// How long the store is skipped before one request probes it again.
    #[serde(rename = "breaker_backoff_ms", serialize_with = "millis")]
    pub breaker_backoff: Duration,
}

/// `[bypass]`: the request header with which a client has one request forwarded untouched.
#[derive(Debug, Clone, Serialize)]
pub struct BypassConfig {
    /// Its name, lowercase (empty: no bypass). It is removed from every request, whatever its
    /// value, so it never reaches the provider; `1`, `true`, `yes` or `on` bypass.
    pub header: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct AdminConfig {
    pub token: Secret,
}

/// The session inspector (`/ui/`, on when `admin.token` is set).
#[derive(Debug, Clone, Serialize)]
pub struct InspectorConfig {
    /// Request summaries kept per conversation (numbers and what changed, never content), written
    /// with each request's commit; 0: none are kept.
    pub requests_per_conversation: u32,
    /// Whether each summary also keeps the head of every replaced or removed item's original text
    /// and what replaced it. Sensitive: message content then sits in the store for `ttl_secs`.
    pub keep_content: bool,
    /// Bytes of that content kept per request, at most.
    pub content_bytes: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct UpstreamConfig {
    /// Base URL for every path that is not Anthropic's.
    pub openai: BaseUrl,
    /// Base URL for `/v1/messages` and below.
    pub anthropic: BaseUrl,
    /// Base URL for Google's Gemini API: `/{v1|v1beta}/models/{model}:generateContent` and the
    /// other Gemini paths, and anything carrying `x-goog-api-key`.
    pub gemini: BaseUrl,
    /// Base URL for Vertex AI's Gemini models:
    /// `/{v1,v1beta1}/projects/{p}/locations/{l}/publishers/google/models/{model}:generateContent`
    /// and its siblings. `None` (the default, `""`): such a request is refused with a Gemini error.
    #[serde(serialize_with = "optional_url")]
    pub vertex: Option<BaseUrl>,
    /// Base URL for Azure OpenAI: `/openai/deployments/{d}/chat/completions`, `/openai/v1/…`
    /// and every other `/openai/` path. Empty (the default, `""`): where `openai` points, when that
    /// was set to something other than api.openai.com (a resource that already pointed it at
    /// Azure keeps working); else `None`, and such a request is refused in OpenAI's error shape.
    #[serde(serialize_with = "optional_url")]
    pub azure: Option<BaseUrl>,
    /// Base URL for Amazon Bedrock's runtime (`/model/{modelId}/invoke`,
    /// `/model/{modelId}/invoke-with-response-stream` and the other runtime operations), e.g.
    /// `https://bedrock-runtime.us-east-1.amazonaws.com`. `None` (the default, `""`): such a
    /// request is refused in AWS's error shape.
    #[serde(serialize_with = "optional_url")]
    pub bedrock: Option<BaseUrl>,
    /// The AWS region compactor signs Bedrock requests for. Empty (the default): the region in
    /// `bedrock`'s host (`bedrock-runtime.{region}.amazonaws.com`), else the AWS SDKs' own
    /// (`AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's).
    pub bedrock_region: String,
    #[serde(rename = "connect_timeout_ms", serialize_with = "millis")]
    pub connect_timeout: Duration,
    #[serde(rename = "first_byte_timeout_ms", serialize_with = "millis")]
    pub first_byte_timeout: Duration,
    #[serde(rename = "idle_timeout_ms", serialize_with = "millis")]
    pub idle_timeout: Duration,
    /// Negotiate HTTP/2 with upstreams (off: long SSE streams queue on one h2 connection).
    pub http2: bool,
    /// Trust the operating system's root certificates in addition to the built-in webpki roots.
    pub native_roots: bool,
    /// Prompt-cache prices and lifetime of the `openai` upstream, of the `anthropic` one, of the
    /// `gemini` one, of the `vertex` one and of the `azure` one.
    pub openai_cache: CachePricing,
    pub anthropic_cache: CachePricing,
    pub gemini_cache: CachePricing,
    pub vertex_cache: CachePricing,
    pub azure_cache: CachePricing,
    /// Of the `bedrock` one, and of Claude on the `vertex` one (Anthropic's prices by default).
    pub bedrock_cache: CachePricing,
    pub vertex_anthropic_cache: CachePricing,
    /// How a stateful Responses request (`previous_response_id`, `conversation`) to the `openai`
    /// upstream, and to the `azure` one, is recovered from its overflow, rungs in order
    /// ([`stateful::StatefulRung`]). By default the provider's compaction first where `openai` is
    /// OpenAI's own API, then the rebuilt chain, then `truncation: "auto"`; elsewhere the last two.
    pub openai_stateful: Vec<stateful::StatefulRung>,
    pub azure_stateful: Vec<stateful::StatefulRung>,
    /// The `*_cache` keys that were not set and became `local` because their upstream is on a
    /// loopback or private address ([`BaseUrl::is_local`]).
    #[serde(skip)]
    pub local_presets: Vec<&'static str>,
    /// Ask an upstream priced `local` for its window (llama.cpp's `/props`, vLLM's
    /// `/v1/models`, Ollama's `/api/ps` and `/api/show`), once per model.
    pub ask_local_window: bool,
}

impl UpstreamConfig {
    /// The prompt-cache prices of each family's upstream.
    pub fn cache_pricing(&self) -> crate::route::PerFamily<CachePricing> {
        crate::route::PerFamily {
            openai: self.openai_cache,
            anthropic: self.anthropic_cache,
            gemini: self.gemini_cache,
            vertex: self.vertex_cache,
            azure: self.azure_cache,
            bedrock: self.bedrock_cache,
            vertex_anthropic: self.vertex_anthropic_cache,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct LimitsConfig {
    pub max_body_bytes: u64,
    /// The most time compactor spends working on one request's content (parsing, counting,
    /// rewriting, rebuilding; waits on the store and summary calls excluded) before it gives up
    /// and forwards the request as it came.
    #[serde(rename = "rewrite_budget_ms", serialize_with = "millis")]
    pub rewrite_budget: Duration,
    /// How long a client connection may sit with no request in progress before it is closed:
    /// from accept until its first byte, and between requests on a kept-alive connection (an
    /// h2c connection with no stream open included). Clients reconnect; an idle slot is free again.
    #[serde(rename = "client_idle_timeout_ms", serialize_with = "millis")]
    pub client_idle_timeout: Duration,
    /// How long a client may take to send a request's headers.
    #[serde(rename = "header_read_timeout_ms", serialize_with = "millis")]
    pub header_read_timeout: Duration,
    /// Client connections served at once; one more is answered 503 and closed.
    pub max_connections: u64,
    /// The longest a client may pause while sending a request body: a rewritable route answers
    /// 408, a streamed one breaks off its upstream request. An inspector form must come whole
    /// within it (else 408).
    #[serde(rename = "client_body_timeout_ms", serialize_with = "millis")]
    pub client_body_timeout: Duration,
    /// Memory, in bytes, for the last parse of each conversation (its body included), so the next
    /// turn parses only the messages it added; kept in process memory only, never in the store.
    /// 0 turns the reuse off.
    pub prefix_cache_bytes: u64,
    /// Bodies smaller than this many bytes are parsed whole, never kept: they parse faster than a
    /// cache lookup and insert cost.
    pub prefix_min_bytes: u64,
    /// Request body bytes held at once across the requests compactor rewrites (their memory grows
    /// with their bodies); past it a request gets 503 in its API dialect with `retry-after`. A body
    /// larger than the whole budget goes when it is alone. 0 turns the bound off.
    pub max_inflight_body_bytes: u64,
    /// How long the allocator keeps freed memory before giving it back to the system: a large
    /// request's parse is freed on workers that may then sit idle, and with a delay its pages
    /// stayed resident until they allocated again. `MIMALLOC_PURGE_DELAY` in the environment wins.
    #[serde(rename = "allocator_purge_delay_ms", serialize_with = "millis")]
    pub allocator_purge_delay: Duration,
    /// Memory a request's parse may take, per byte of its body, above
    /// `parse_memory_floor_bytes`: a parse holds about 1 KiB per message and 320 bytes per further
    /// part or tool call whatever their size, so a body of many tiny messages (30 times its size
    /// for one-letter ones) is forwarded as it came instead. 0 with a floor of 0 parses nothing.
    pub parse_memory_per_body_byte: u64,
    /// Memory any request's parse may take, whatever its body's size (16 MiB: about 16,000
    /// messages of any size).
    pub parse_memory_floor_bytes: u64,
}

impl LimitsConfig {
    /// The memory the parse of a body of `body_bytes` may take.
    pub fn parse_memory(&self, body_bytes: usize) -> usize {
        let bytes = self.parse_memory_per_body_byte.saturating_mul(body_bytes as u64);
        usize::try_from(bytes.saturating_add(self.parse_memory_floor_bytes)).unwrap_or(usize::MAX)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ShutdownConfig {
    #[serde(rename = "drain_timeout_ms", serialize_with = "millis")]
    pub drain_timeout: Duration,
}

#[derive(Debug, Clone, Serialize)]
pub struct LogConfig {
    pub format: LogFormat,
    pub level: LogFilter,
}

/// A log filter (`info`, `compactor=debug,hyper=warn`) that is known to parse.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct LogFilter(String);

impl LogFilter {
    pub fn parse(text: &str) -> Result<Self, tracing_subscriber::filter::ParseError> {
        tracing_subscriber::EnvFilter::try_new(text).map(|_| Self(text.to_string()))
    }

    /// The filter for the subscriber; it parsed when it was checked, so it parses again.
    pub fn env_filter(&self) -> tracing_subscriber::EnvFilter {
        tracing_subscriber::EnvFilter::try_new(&self.0).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
    }
}

/// `[trace]`: OpenTelemetry traces exported over OTLP/HTTP (protobuf), off by default.
#[derive(Debug, Clone, Serialize)]
pub struct TraceConfig {
    pub enabled: bool,
    /// The collector's OTLP/HTTP traces URL (`.../v1/traces`). It prints in `--check-config` and
    /// logs, so one with credentials (`user:password@`, `?api_key=`) is refused: put the credential
    /// in `headers`.
    pub endpoint: String,
    /// Headers sent with every export, `name=value,name=value` (an API key, often): never printed.
    pub headers: Secret,
    /// Share of the requests that start a trace (a client's sampled `traceparent` is always followed).
    pub sample_ratio: f64,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// The longest one export may take before it is dropped.
    #[serde(rename = "export_timeout_ms", serialize_with = "millis")]
    pub export_timeout: Duration,
    /// Spans held for export; when the collector is slow or down, spans beyond it are dropped.
    pub queue_size: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// Renders an optional URL as its text, `""` when there is none (every key shows in
/// `--check-config`).
fn optional_url<S: serde::Serializer>(url: &Option<BaseUrl>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(url.as_ref().map_or("", BaseUrl::as_str))
}

/// Renders a duration as whole milliseconds (`*_ms` keys).
pub(crate) fn millis<S: serde::Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_u64(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

/// Renders a duration as whole seconds (`*_secs` keys).
fn secs<S: serde::Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_u64(duration.as_secs())
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            openai: BaseUrl { text: "https://api.openai.com".into(), authority: "api.openai.com".into() },
            anthropic: BaseUrl { text: "https://api.anthropic.com".into(), authority: "api.anthropic.com".into() },
            gemini: BaseUrl {
                text: "https://generativelanguage.googleapis.com".into(),
                authority: "generativelanguage.googleapis.com".into(),
            },
            vertex: None,
            azure: None,
            bedrock: None,
            bedrock_region: String::new(),
            connect_timeout: Duration::from_millis(10_000),
            first_byte_timeout: Duration::from_millis(600_000),
            idle_timeout: Duration::from_millis(300_000),
            http2: false,
            native_roots: false,
            openai_cache: CachePricing::OPENAI,
            anthropic_cache: CachePricing::ANTHROPIC,
            gemini_cache: CachePricing::GEMINI,
            vertex_cache: CachePricing::GEMINI,
            azure_cache: CachePricing::OPENAI,
            bedrock_cache: CachePricing::ANTHROPIC,
            vertex_anthropic_cache: CachePricing::ANTHROPIC,
            openai_stateful: stateful::OPENAI_ORDER.to_vec(),
            azure_stateful: stateful::OTHER_ORDER.to_vec(),
            local_presets: Vec::new(),
            ask_local_window: true,
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 32 * 1024 * 1024,
            max_inflight_body_bytes: 64 * 1024 * 1024,
            allocator_purge_delay: Duration::ZERO,
            parse_memory_per_body_byte: 2,
            parse_memory_floor_bytes: 16 * 1024 * 1024,
            rewrite_budget: Duration::from_millis(10_000),
            client_idle_timeout: Duration::from_millis(60_000),
            header_read_timeout: Duration::from_millis(60_000),
            max_connections: 4_096,
            client_body_timeout: Duration::from_millis(60_000),
            prefix_cache_bytes: 64 * 1024 * 1024,
            prefix_min_bytes: 16 * 1024,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8787)),
            upstream: UpstreamConfig::default(),
            limits: LimitsConfig::default(),
            shutdown: ShutdownConfig { drain_timeout: Duration::from_millis(30_000) },
            log: LogConfig { format: LogFormat::Text, level: LogFilter("info".into()) },
            trace: TraceConfig {
                enabled: false,
                endpoint: "http://127.0.0.1:4318/v1/traces".into(),
                headers: Secret::default(),
                sample_ratio: 1.0,
                service_name: "compactor".into(),
                export_timeout: Duration::from_millis(10_000),
                queue_size: 2_048,
            },
            tokens: TokensConfig {
                cache_bytes: 64 * 1024 * 1024,
                image_tokens: 1_000,
                blocking_tokenize_bytes: 65_536,
            },
            prune: PruneConfig {
                enabled: true,
                protect_tokens: 40_000,
                minimum_tokens: 20_000,
                protect_window_share: 0.33,
                minimum_window_share: 0.16,
                placeholder: crate::rewrite::placeholder::DEFAULT.into(),
                protected_tools: vec!["skill".into()],
                dedupe: true,
                pressure: 0.8,
                payback_confidence: 0.9,
                assumed_runs: Vec::new(),
            },
            truncate: TruncateConfig { enabled: true, tool_output_max_tokens: 10_000 },
            repair: RepairConfig { enabled: true },
            session: SessionConfig {
                store: StoreKind::Memory,
                header: "x-session-id".into(),
                redis_url: RedisUrls::new("redis://127.0.0.1:6379"),
                redis_cluster: false,
                key_prefix: "compactor".into(),
                ttl: Duration::from_secs(7 * 24 * 3600),
                max_sessions: 100_000,
                memory_bytes: 256 * 1024 * 1024,
                max_conversations: 32,
                redis_timeout: Duration::from_millis(250),
                tenant_secret: Secret::default(),
                breaker_failures: 5,
                breaker_backoff: Duration::from_millis(1_000),
            },
            admin: AdminConfig { token: Secret::default() },
            inspector: InspectorConfig { requests_per_conversation: 500, keep_content: false, content_bytes: 4_096 },
            bypass: BypassConfig { header: "x-compactor-bypass".into() },
            compaction: CompactionSettings::default(),
            models: BTreeMap::new(),
            clients: BTreeMap::new(),
        }
    }
}

impl Config {
    /// The model table: built-ins overridden by `[models.NAME]`.
    pub fn model_table(&self) -> ModelTable {
        ModelTable::new(self.models.iter().map(|(k, v)| (k.clone(), *v)).collect())
    }

    /// The rewrite policies' settings, from `[prune]`, `[truncate]`, `[repair]` and `[tokens]`.
    pub fn rewrite_settings(&self) -> RewriteSettings {
        RewriteSettings {
            prune_enabled: self.prune.enabled,
            dedupe: self.prune.dedupe,
            prune: PruneSettings {
                protect_tokens: self.prune.protect_tokens,
                minimum_tokens: self.prune.minimum_tokens,
                protect_window_share: self.prune.protect_window_share,
                minimum_window_share: self.prune.minimum_window_share,
                placeholder: crate::rewrite::placeholder::Template::new(&self.prune.placeholder),
                protected_tools: self.prune.protected_tools.clone(),
                pressure: self.prune.pressure,
                payback_confidence: self.prune.payback_confidence,
                assumed_runs: self.prune.assumed_runs.clone(),
            },
            cache: self.upstream.cache_pricing(),
            truncate_enabled: self.truncate.enabled,
            tool_output_max_tokens: self.truncate.tool_output_max_tokens,
            repair_enabled: self.repair.enabled,
            image_tokens: self.tokens.image_tokens,
            blocking_tokenize_bytes: usize::try_from(self.tokens.blocking_tokenize_bytes).unwrap_or(usize::MAX),
            keep_content_bytes: self.kept_content_bytes(),
        }
    }

    /// The content bytes the inspector keeps per request: none unless it is turned on and there
    /// are summaries to keep them in, readable by someone (`admin.token`).
    pub fn kept_content_bytes(&self) -> usize {
        let recorded = !self.admin.token.is_empty() && self.inspector.requests_per_conversation > 0;
        if self.inspector.keep_content && recorded { self.inspector.content_bytes as usize } else { 0 }
    }

    /// The effective configuration as TOML, for `--check-config`.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render configuration: {e}\n"))
    }
}
