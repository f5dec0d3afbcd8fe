//! The configuration as the file and the environment spell it: one raw struct per section, one
//! field per key (each key's only spelling in the code), read by serde with unknown keys refused,
//! then validated section by section into the runtime [`Config`] (durations, bounds, parsed
//! names, compiled patterns). What each key means is documented on the runtime struct and in
//! `config/compactor.toml`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use figment::value::Value;
use serde::Deserialize;

use super::check::{
    Field, Section, key, ms, non_empty, positive, positive_ms, positive_u32, secret, section, share, table,
};
use super::compaction::RawCompaction;
use super::*;
use crate::tokens::{Encoding, ModelInfo, ModelTable, TOKEN_ENTRY_BYTES};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawConfig {
    listen: Field<String>,
    #[serde(deserialize_with = "table")]
    upstream: RawUpstream,
    #[serde(deserialize_with = "table")]
    limits: RawLimits,
    #[serde(deserialize_with = "table")]
    shutdown: RawShutdown,
    #[serde(deserialize_with = "table")]
    log: RawLog,
    #[serde(deserialize_with = "table")]
    trace: RawTrace,
    #[serde(deserialize_with = "table")]
    tokens: RawTokens,
    #[serde(deserialize_with = "table")]
    prune: RawPrune,
    #[serde(deserialize_with = "table")]
    truncate: RawTruncate,
    #[serde(deserialize_with = "table")]
    repair: RawRepair,
    #[serde(deserialize_with = "table")]
    session: RawSession,
    #[serde(deserialize_with = "table")]
    admin: RawAdmin,
    #[serde(deserialize_with = "table")]
    inspector: RawInspector,
    #[serde(deserialize_with = "table")]
    bypass: RawBypass,
    #[serde(deserialize_with = "table")]
    compaction: RawCompaction,
    /// `[models.NAME]` entries, each a [`RawModel`].
    models: Field<Value>,
    /// `[clients.TENANT]` entries, each a [`RawClient`].
    clients: Field<Value>,
}

impl RawConfig {
    pub fn validate(self, s: &mut Section, d: Config) -> Config {
        Config {
            listen: key!(s, self.listen, d.listen, |s: String| {
                s.parse::<SocketAddr>().map_err(|e| format!("not a socket address ({e}), e.g. 127.0.0.1:8787"))
            }),
            upstream: section!(s, self.upstream, d.upstream),
            limits: section!(s, self.limits, d.limits),
            shutdown: section!(s, self.shutdown, d.shutdown),
            log: section!(s, self.log, d.log),
            trace: section!(s, self.trace, d.trace),
            tokens: section!(s, self.tokens, d.tokens),
            prune: section!(s, self.prune, d.prune),
            truncate: section!(s, self.truncate, d.truncate),
            repair: section!(s, self.repair, d.repair),
            session: section!(s, self.session, d.session),
            admin: section!(s, self.admin, d.admin),
            inspector: section!(s, self.inspector, d.inspector),
            bypass: section!(s, self.bypass, d.bypass),
            compaction: section!(s, self.compaction, d.compaction),
            models: model_entries(&mut s.section(stringify!(models)), self.models),
            clients: client_entries(&mut s.section(stringify!(clients)), self.clients),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawUpstream {
    openai: Field<String>,
    anthropic: Field<String>,
    gemini: Field<String>,
    vertex: Field<String>,
    azure: Field<String>,
    bedrock: Field<String>,
    bedrock_region: Field<String>,
    connect_timeout_ms: Field<u64>,
    first_byte_timeout_ms: Field<u64>,
    idle_timeout_ms: Field<u64>,
    http2: Field<bool>,
    native_roots: Field<bool>,
    openai_cache: Field<String>,
    anthropic_cache: Field<String>,
    gemini_cache: Field<String>,
    vertex_cache: Field<String>,
    azure_cache: Field<String>,
    bedrock_cache: Field<String>,
    vertex_anthropic_cache: Field<String>,
    openai_stateful: Field<Vec<String>>,
    azure_stateful: Field<Vec<String>>,
    ask_local_window: Field<bool>,
}

impl RawUpstream {
    fn validate(self, s: &mut Section, d: UpstreamConfig) -> UpstreamConfig {
        let url = |s: String| BaseUrl::parse(&s);
        let cache = |s: String| CachePricing::parse(&s);
        let optional = |s: String| if s.is_empty() { Ok(None) } else { BaseUrl::parse(&s).map(Some) };
        let openai = key!(s, self.openai, d.openai, url);
        // An operator who pointed `openai` at something other than OpenAI (an Azure resource, a
        // gateway) before `azure` existed keeps Azure's paths going there.
        let azure = key!(s, self.azure, d.azure, optional)
            .or_else(|| (openai.authority != "api.openai.com").then(|| openai.clone()));
        let openai_stateful =
            key!(s, self.openai_stateful, super::stateful::default_order(&openai.authority), super::stateful::rungs);
        // An upstream on this machine or a private network is priced as a local server unless its
        // key says otherwise; which ones were is said at start and on /readyz.
        let mut local_presets = Vec::new();
        let mut local = |name: &'static str, url: Option<&BaseUrl>, given: bool, cloud: CachePricing| {
            if !given && url.is_some_and(BaseUrl::is_local) {
                local_presets.push(name);
                CachePricing::LOCAL
            } else {
                cloud
            }
        };
        let openai_default = local("openai_cache", Some(&openai), self.openai_cache.is_given(), d.openai_cache);
        let azure_default = local("azure_cache", azure.as_ref(), self.azure_cache.is_given(), d.azure_cache);
        let anthropic = key!(s, self.anthropic, d.anthropic, url);
        let anthropic_default =
            local("anthropic_cache", Some(&anthropic), self.anthropic_cache.is_given(), d.anthropic_cache);
        let gemini = key!(s, self.gemini, d.gemini, url);
        let gemini_default = local("gemini_cache", Some(&gemini), self.gemini_cache.is_given(), d.gemini_cache);
        UpstreamConfig {
            openai,
            azure,
            openai_stateful,
            azure_stateful: key!(s, self.azure_stateful, d.azure_stateful, super::stateful::rungs),
            anthropic,
            gemini,
            vertex: key!(s, self.vertex, d.vertex, optional),
            bedrock: key!(s, self.bedrock, d.bedrock, optional),
            bedrock_region: key!(s, self.bedrock_region, d.bedrock_region, |s: String| {
                if s.is_empty() || s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
                    Ok(s)
                } else {
                    Err(format!("`{s}` is not an AWS region name, e.g. us-east-1"))
                }
            }),
            connect_timeout: key!(s, self.connect_timeout_ms, d.connect_timeout, positive_ms),
            first_byte_timeout: key!(s, self.first_byte_timeout_ms, d.first_byte_timeout, positive_ms),
            idle_timeout: key!(s, self.idle_timeout_ms, d.idle_timeout, positive_ms),
            http2: key!(s, self.http2, d.http2),
            native_roots: key!(s, self.native_roots, d.native_roots),
            openai_cache: key!(s, self.openai_cache, openai_default, cache),
            anthropic_cache: key!(s, self.anthropic_cache, anthropic_default, cache),
            gemini_cache: key!(s, self.gemini_cache, gemini_default, cache),
            vertex_cache: key!(s, self.vertex_cache, d.vertex_cache, cache),
            azure_cache: key!(s, self.azure_cache, azure_default, cache),
            bedrock_cache: key!(s, self.bedrock_cache, d.bedrock_cache, cache),
            vertex_anthropic_cache: key!(s, self.vertex_anthropic_cache, d.vertex_anthropic_cache, cache),
            local_presets,
            ask_local_window: key!(s, self.ask_local_window, d.ask_local_window),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawLimits {
    max_body_bytes: Field<u64>,
    rewrite_budget_ms: Field<u64>,
    client_idle_timeout_ms: Field<u64>,
    header_read_timeout_ms: Field<u64>,
    max_connections: Field<u64>,
    client_body_timeout_ms: Field<u64>,
    prefix_cache_bytes: Field<u64>,
    prefix_min_bytes: Field<u64>,
    max_inflight_body_bytes: Field<u64>,
    allocator_purge_delay_ms: Field<u64>,
    parse_memory_per_body_byte: Field<u64>,
    parse_memory_floor_bytes: Field<u64>,
}

impl RawLimits {
    fn validate(self, s: &mut Section, d: LimitsConfig) -> LimitsConfig {
        LimitsConfig {
            max_body_bytes: key!(s, self.max_body_bytes, d.max_body_bytes, positive),
            rewrite_budget: key!(s, self.rewrite_budget_ms, d.rewrite_budget, positive_ms),
            client_idle_timeout: key!(s, self.client_idle_timeout_ms, d.client_idle_timeout, positive_ms),
            header_read_timeout: key!(s, self.header_read_timeout_ms, d.header_read_timeout, positive_ms),
            max_connections: key!(s, self.max_connections, d.max_connections, positive),
            client_body_timeout: key!(s, self.client_body_timeout_ms, d.client_body_timeout, positive_ms),
            prefix_cache_bytes: key!(s, self.prefix_cache_bytes, d.prefix_cache_bytes),
            prefix_min_bytes: key!(s, self.prefix_min_bytes, d.prefix_min_bytes),
            max_inflight_body_bytes: key!(s, self.max_inflight_body_bytes, d.max_inflight_body_bytes),
            allocator_purge_delay: key!(s, self.allocator_purge_delay_ms, d.allocator_purge_delay, ms),
            parse_memory_per_body_byte: key!(s, self.parse_memory_per_body_byte, d.parse_memory_per_body_byte),
            parse_memory_floor_bytes: key!(s, self.parse_memory_floor_bytes, d.parse_memory_floor_bytes),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawShutdown {
    drain_timeout_ms: Field<u64>,
}

impl RawShutdown {
    fn validate(self, s: &mut Section, d: ShutdownConfig) -> ShutdownConfig {
        ShutdownConfig { drain_timeout: key!(s, self.drain_timeout_ms, d.drain_timeout, ms) }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawLog {
    format: Field<String>,
    level: Field<String>,
}

impl RawLog {
    fn validate(self, s: &mut Section, d: LogConfig) -> LogConfig {
        LogConfig {
            format: key!(s, self.format, d.format, |s: String| match s.as_str() {
                "text" => Ok(LogFormat::Text),
                "json" => Ok(LogFormat::Json),
                _ => Err(format!("`{s}` is not one of \"text\", \"json\"")),
            }),
            level: key!(s, self.level, d.level, |s: String| {
                LogFilter::parse(&s)
                    .map_err(|e| format!("not a log filter ({e}), e.g. \"info\" or \"compactor=debug\""))
            }),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawTrace {
    enabled: Field<bool>,
    endpoint: Field<Value>,
    headers: Field<Value>,
    sample_ratio: Field<f64>,
    service_name: Field<String>,
    export_timeout_ms: Field<u64>,
    queue_size: Field<u32>,
}

impl RawTrace {
    fn validate(self, s: &mut Section, d: TraceConfig) -> TraceConfig {
        let headers_key = s.path(stringify!(headers));
        TraceConfig {
            enabled: key!(s, self.enabled, d.enabled),
            endpoint: secret!(s, self.endpoint, d.endpoint, |s| trace_endpoint(s, &headers_key)),
            headers: secret!(s, self.headers, d.headers, |s: String| {
                super::headers::parse_headers(&s).map(|_| Secret::new(s))
            }),
            sample_ratio: key!(s, self.sample_ratio, d.sample_ratio, |p: f64| {
                if (0.0..=1.0).contains(&p) { Ok(p) } else { Err("must be in [0, 1]".into()) }
            }),
            service_name: key!(s, self.service_name, d.service_name, non_empty),
            export_timeout: key!(s, self.export_timeout_ms, d.export_timeout, positive_ms),
            queue_size: key!(s, self.queue_size, d.queue_size, positive_u32),
        }
    }
}

/// The OTLP endpoint: an http(s) URL without credentials. Like an upstream URL, one with
/// `user:password@` or a query string (where `?api_key=` would sit) is refused: the endpoint is
/// printed by `--check-config` and in logs, while `headers_key` is a secret that never prints.
fn trace_endpoint(s: String, headers_key: &str) -> Result<String, String> {
    let example = "e.g. \"http://127.0.0.1:4318/v1/traces\"";
    let Ok(uri) = s.parse::<http::Uri>() else { return Err(format!("not an http:// or https:// URL, {example}")) };
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
        return Err(format!("not an http:// or https:// URL, {example}"));
    }
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) || uri.query().is_some() {
        return Err(format!(
            "must not carry credentials (`user:password@`) or a query string (`?api_key=`): give the \
             collector's credential in `{headers_key}`, e.g. \"authorization=Bearer KEY\", which never prints"
        ));
    }
    Ok(s)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawTokens {
    cache_bytes: Field<u64>,
    /// Deprecated: `cache_bytes` in counts; still read, converted.
    cache_entries: Field<u64>,
    image_tokens: Field<u32>,
    blocking_tokenize_bytes: Field<u64>,
}

impl RawTokens {
    fn validate(self, s: &mut Section, d: TokensConfig) -> TokensConfig {
        let bytes_set = self.cache_bytes.is_given();
        let bytes = key!(s, self.cache_bytes, d.cache_bytes, positive);
        let entries: Option<u64> = key!(s, self.cache_entries, None, |n: u64| positive(n).map(Some));
        TokensConfig {
            cache_bytes: entries.map_or(bytes, |entries| cache_entries_as_bytes(s, entries, bytes_set, bytes)),
            image_tokens: key!(s, self.image_tokens, d.image_tokens),
            blocking_tokenize_bytes: key!(s, self.blocking_tokenize_bytes, d.blocking_tokenize_bytes),
        }
    }
}

/// The deprecated `cache_entries` converted to bytes (every count costs the same, so the
/// conversion keeps exactly the cache the operator had), unless `cache_bytes` is set too.
fn cache_entries_as_bytes(s: &mut Section, entries: u64, bytes_set: bool, bytes: u64) -> u64 {
    let (old, new) = (stringify!(cache_entries), s.path(stringify!(cache_bytes)));
    if bytes_set {
        s.warn(old, &format!("deprecated and ignored because `{new}` is set; remove it"));
        return bytes;
    }
    let converted = entries.saturating_mul(u64::from(TOKEN_ENTRY_BYTES));
    s.warn(
        old,
        &format!(
            "deprecated, read as `{new} = {converted}` ({entries} counts of {TOKEN_ENTRY_BYTES} bytes); set that key instead"
        ),
    );
    converted
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawPrune {
    enabled: Field<bool>,
    protect_tokens: Field<u32>,
    minimum_tokens: Field<u32>,
    protect_window_share: Field<f64>,
    minimum_window_share: Field<f64>,
    placeholder: Field<String>,
    protected_tools: Field<Vec<String>>,
    dedupe: Field<bool>,
    pressure: Field<f64>,
    payback_confidence: Field<f64>,
    assumed_runs: Field<Vec<u64>>,
}

impl RawPrune {
    fn validate(self, s: &mut Section, d: PruneConfig) -> PruneConfig {
        PruneConfig {
            enabled: key!(s, self.enabled, d.enabled),
            protect_tokens: key!(s, self.protect_tokens, d.protect_tokens),
            minimum_tokens: key!(s, self.minimum_tokens, d.minimum_tokens),
            protect_window_share: key!(s, self.protect_window_share, d.protect_window_share, share),
            minimum_window_share: key!(s, self.minimum_window_share, d.minimum_window_share, share),
            placeholder: key!(s, self.placeholder, d.placeholder, non_empty),
            protected_tools: key!(s, self.protected_tools, d.protected_tools),
            dedupe: key!(s, self.dedupe, d.dedupe),
            pressure: key!(s, self.pressure, d.pressure, share),
            payback_confidence: key!(s, self.payback_confidence, d.payback_confidence, share),
            assumed_runs: key!(s, self.assumed_runs, d.assumed_runs),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawTruncate {
    enabled: Field<bool>,
    tool_output_max_tokens: Field<u32>,
}

impl RawTruncate {
    fn validate(self, s: &mut Section, d: TruncateConfig) -> TruncateConfig {
        TruncateConfig {
            enabled: key!(s, self.enabled, d.enabled),
            tool_output_max_tokens: key!(s, self.tool_output_max_tokens, d.tool_output_max_tokens),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawRepair {
    enabled: Field<bool>,
}

impl RawRepair {
    fn validate(self, s: &mut Section, d: RepairConfig) -> RepairConfig {
        RepairConfig { enabled: key!(s, self.enabled, d.enabled) }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawSession {
    store: Field<String>,
    header: Field<String>,
    redis_url: Field<Value>,
    redis_cluster: Field<bool>,
    key_prefix: Field<String>,
    ttl_secs: Field<u64>,
    max_sessions: Field<u64>,
    memory_bytes: Field<u64>,
    max_conversations: Field<u32>,
    redis_timeout_ms: Field<u64>,
    tenant_secret: Field<Value>,
    breaker_failures: Field<u32>,
    breaker_backoff_ms: Field<u64>,
}

impl RawSession {
    fn validate(self, s: &mut Section, d: SessionConfig) -> SessionConfig {
        SessionConfig {
            store: key!(s, self.store, d.store, |s: String| match s.as_str() {
                "memory" => Ok(StoreKind::Memory),
                "redis" => Ok(StoreKind::Redis),
                _ => Err(format!("`{s}` is not one of \"memory\", \"redis\"")),
            }),
            header: key!(s, self.header, d.header, |s: String| {
                http::HeaderName::from_bytes(s.as_bytes())
                    .map(|_| s.to_ascii_lowercase())
                    .map_err(|_| format!("`{s}` is not a valid header name"))
            }),
            redis_url: secret!(s, self.redis_url, d.redis_url, |s: String| {
                if s.split(',').all(|url| redis::parse_redis_url(url.trim()).is_some()) {
                    Ok(RedisUrls::new(s))
                } else {
                    Err("not a redis:// URL (or a comma-separated list of them for a cluster)".to_string())
                }
            }),
            redis_cluster: key!(s, self.redis_cluster, d.redis_cluster),
            key_prefix: key!(s, self.key_prefix, d.key_prefix),
            ttl: key!(s, self.ttl_secs, d.ttl, |s: u64| positive(s).map(Duration::from_secs)),
            max_sessions: key!(s, self.max_sessions, d.max_sessions, positive),
            memory_bytes: key!(s, self.memory_bytes, d.memory_bytes, positive),
            max_conversations: key!(s, self.max_conversations, d.max_conversations, positive_u32),
            redis_timeout: key!(s, self.redis_timeout_ms, d.redis_timeout, positive_ms),
            tenant_secret: secret!(s, self.tenant_secret, d.tenant_secret, |s| Ok(Secret::new(s))),
            breaker_failures: key!(s, self.breaker_failures, d.breaker_failures, positive_u32),
            breaker_backoff: key!(s, self.breaker_backoff_ms, d.breaker_backoff, positive_ms),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawAdmin {
    token: Field<Value>,
}

impl RawAdmin {
    fn validate(self, s: &mut Section, d: AdminConfig) -> AdminConfig {
        AdminConfig { token: secret!(s, self.token, d.token, |s| Ok(Secret::new(s))) }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawBypass {
    header: Field<String>,
}

impl RawBypass {
    fn validate(self, s: &mut Section, d: BypassConfig) -> BypassConfig {
        BypassConfig {
            header: key!(s, self.header, d.header, |name: String| {
                let name = name.to_ascii_lowercase();
                if name.is_empty() || http::HeaderName::from_bytes(name.as_bytes()).is_ok() {
                    Ok(name)
                } else {
                    Err(format!("`{name}` is not a header name"))
                }
            }),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawInspector {
    requests_per_conversation: Field<u32>,
    keep_content: Field<bool>,
    content_bytes: Field<u32>,
}

impl RawInspector {
    fn validate(self, s: &mut Section, d: InspectorConfig) -> InspectorConfig {
        InspectorConfig {
            requests_per_conversation: key!(s, self.requests_per_conversation, d.requests_per_conversation, |n| {
                if n > 100_000 { Err("at most 100000".to_string()) } else { Ok(n) }
            }),
            keep_content: key!(s, self.keep_content, d.keep_content),
            content_bytes: key!(s, self.content_bytes, d.content_bytes, |n| {
                if n > 1_048_576 { Err("at most 1048576".to_string()) } else { Ok(n) }
            }),
        }
    }
}

/// One `[models.NAME]` entry, over the built-in table's entry for the name.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawModel {
    context_window: Field<u32>,
    max_output_tokens: Field<u32>,
    token_factor: Field<f32>,
    encoding: Field<String>,
}

impl RawModel {
    fn validate(self, s: &mut Section, base: ModelInfo) -> ModelInfo {
        ModelInfo {
            context_window: key!(s, self.context_window, base.context_window, positive_u32),
            max_output_tokens: key!(s, self.max_output_tokens, base.max_output_tokens, positive_u32),
            token_factor: key!(s, self.token_factor, base.token_factor, |f: f32| {
                if f > 0.0 && f < 10.0 { Ok(f) } else { Err("must be between 0 and 10".into()) }
            }),
            encoding: key!(s, self.encoding, base.encoding, |s: String| match s.as_str() {
                "o200k_base" => Ok(Encoding::O200kBase),
                "cl100k_base" => Ok(Encoding::Cl100kBase),
                _ => Err(format!("`{s}` is not one of \"o200k_base\", \"cl100k_base\"")),
            }),
        }
    }
}

/// `[models.NAME]` entries over the built-in table, each field checked like a top-level key.
fn model_entries(s: &mut Section, field: Field<Value>) -> BTreeMap<String, ModelInfo> {
    let mut models = BTreeMap::new();
    let Field::Given(Ok(value)) = field else { return models };
    let Some(entries) = value.into_dict() else {
        s.problem("", "expected a table");
        return models;
    };
    for (name, value) in entries {
        let Some(table) = value.into_dict() else {
            s.problem(&name, "expected a table");
            continue;
        };
        let mut entry = s.section(&name);
        let (raw, unknown) = entry.read_raw::<RawModel>(table);
        let info = raw.validate(&mut entry, ModelTable::default().lookup(&name));
        entry.unknown(unknown.into_iter().map(|path| (path, None)));
        models.insert(name, info);
    }
    models
}

/// `[clients.TENANT]`: `key_sha256`, the hex SHA-256 digest of one client key or a list of them.
fn client_entries(s: &mut Section, field: Field<Value>) -> BTreeMap<String, ClientKeyHashes> {
    let mut clients = BTreeMap::new();
    let Field::Given(Ok(value)) = field else { return clients };
    let Some(entries) = value.into_dict() else {
        s.problem("", "expected a table");
        return clients;
    };
    for (tenant, value) in entries {
        let Some(mut table) = value.into_dict() else {
            s.problem(&tenant, "expected a table with `key_sha256`");
            continue;
        };
        let digests = match table.remove("key_sha256") {
            Some(Value::String(_, one)) => vec![one],
            Some(Value::Array(_, many)) => many.into_iter().filter_map(|v| v.into_string()).collect(),
            _ => {
                s.problem(
                    &format!("{tenant}.key_sha256"),
                    "expected the hex SHA-256 digest of a client key, or a list",
                );
                continue;
            }
        };
        for unknown in table.keys() {
            s.problem(&format!("{tenant}.{unknown}"), "unknown key (a client has `key_sha256` only)");
        }
        let mut hashes = ClientKeyHashes::default();
        for digest in digests {
            match parse_digest(&digest) {
                Some(digest) => hashes.key_sha256.push(digest),
                None => s.problem(
                    &format!("{tenant}.key_sha256"),
                    // Never echoed: a key pasted where its digest belongs would land in the log.
                    "a value that is not 64 hex digits (give the key's digest, `printf %s KEY | sha256sum`)",
                ),
            }
        }
        clients.insert(tenant, hashes);
    }
    clients
}

/// 64 hex digits, either case.
fn parse_digest(text: &str) -> Option<[u8; 32]> {
    let text = text.trim();
    if text.len() != 64 {
        return None;
    }
    let mut digest = [0u8; 32];
    for (at, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(at * 2..at * 2 + 2)?, 16).ok()?;
    }
    Some(digest)
}
