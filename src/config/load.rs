//! Loading: built-in defaults < TOML file < `COMPACTOR_` environment, read key by key into the
//! runtime [`Config`] so that every bad or unknown key is reported at once, naming where it came from.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Format, Toml};
use figment::value::Dict;

use super::compaction::{Rung, Transcript};
use super::env;
use super::*;
use crate::overflow::OverflowDetector;
use crate::tokens::{Encoding, ModelInfo, ModelTable, TOKEN_ENTRY_BYTES};

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
    /// Loads defaults < file < environment and validates every key. Alongside the configuration
    /// come warnings about `COMPACTOR_` variables that look like misspelt keys (they are ignored,
    /// as are all variables that name no key); the caller logs them once.
    pub fn load(explicit: Option<&Path>) -> Result<(Self, Vec<String>), ConfigError> {
        let mut figment = Figment::new();
        if let Some((path, must_exist)) = config_path(explicit) {
            figment = if must_exist { figment.merge(Toml::file_exact(path)) } else { figment.merge(Toml::file(path)) };
        }
        let variables = std::env::vars_os().map(|(name, _)| name.to_string_lossy().into_owned());
        let (environment, warnings) = env::environment(env::KnownKeys::of(&Config::default()), variables);
        figment = figment.merge(environment);
        let (config, mut deprecated) = Self::read(&figment)?;
        deprecated.extend(warnings);
        Ok((config, deprecated))
    }

    /// Validates an already layered figment; used by `load` and by tests.
    pub fn from_figment(figment: &Figment) -> Result<Self, ConfigError> {
        Self::read(figment).map(|(config, _)| config)
    }

    /// Validates an already layered figment, with warnings about keys that still work but should
    /// be changed.
    pub fn read(figment: &Figment) -> Result<(Self, Vec<String>), ConfigError> {
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
                gemini: r.parse("upstream.gemini", d.upstream.gemini, |s: String| BaseUrl::parse(&s)),
                vertex: r.parse("upstream.vertex", d.upstream.vertex, |s: String| {
                    if s.is_empty() { Ok(None) } else { BaseUrl::parse(&s).map(Some) }
                }),
                connect_timeout: r.parse("upstream.connect_timeout_ms", d.upstream.connect_timeout, positive_ms),
                first_byte_timeout: r.parse(
                    "upstream.first_byte_timeout_ms",
                    d.upstream.first_byte_timeout,
                    positive_ms,
                ),
                idle_timeout: r.parse("upstream.idle_timeout_ms", d.upstream.idle_timeout, positive_ms),
                http2: r.get("upstream.http2", d.upstream.http2),
                native_roots: r.get("upstream.native_roots", d.upstream.native_roots),
                openai_cache: r
                    .parse("upstream.openai_cache", d.upstream.openai_cache, |s: String| CachePricing::parse(&s)),
                anthropic_cache: r
                    .parse("upstream.anthropic_cache", d.upstream.anthropic_cache, |s: String| CachePricing::parse(&s)),
                gemini_cache: r
                    .parse("upstream.gemini_cache", d.upstream.gemini_cache, |s: String| CachePricing::parse(&s)),
                vertex_cache: r
                    .parse("upstream.vertex_cache", d.upstream.vertex_cache, |s: String| CachePricing::parse(&s)),
            },
            limits: LimitsConfig {
                max_body_bytes: r.parse("limits.max_body_bytes", d.limits.max_body_bytes, positive),
                rewrite_budget: r.parse("limits.rewrite_budget_ms", d.limits.rewrite_budget, positive_ms),
                client_idle_timeout: r.parse(
                    "limits.client_idle_timeout_ms",
                    d.limits.client_idle_timeout,
                    positive_ms,
                ),
                header_read_timeout: r.parse(
                    "limits.header_read_timeout_ms",
                    d.limits.header_read_timeout,
                    positive_ms,
                ),
                max_connections: r.parse("limits.max_connections", d.limits.max_connections, positive),
                client_body_timeout: r.parse(
                    "limits.client_body_timeout_ms",
                    d.limits.client_body_timeout,
                    positive_ms,
                ),
                prefix_cache_bytes: r.get("limits.prefix_cache_bytes", d.limits.prefix_cache_bytes),
                prefix_min_bytes: r.get("limits.prefix_min_bytes", d.limits.prefix_min_bytes),
                max_inflight_body_bytes: r.get("limits.max_inflight_body_bytes", d.limits.max_inflight_body_bytes),
                allocator_purge_delay: r.parse("limits.allocator_purge_delay_ms", d.limits.allocator_purge_delay, ms),
                parse_memory_per_body_byte: r
                    .get("limits.parse_memory_per_body_byte", d.limits.parse_memory_per_body_byte),
                parse_memory_floor_bytes: r.get("limits.parse_memory_floor_bytes", d.limits.parse_memory_floor_bytes),
            },
            shutdown: ShutdownConfig {
                drain_timeout: r.parse("shutdown.drain_timeout_ms", d.shutdown.drain_timeout, ms),
            },
            log: LogConfig {
                format: r.parse("log.format", d.log.format, |s: String| match s.as_str() {
                    "text" => Ok(LogFormat::Text),
                    "json" => Ok(LogFormat::Json),
                    _ => Err(format!("`{s}` is not one of \"text\", \"json\"")),
                }),
                level: r.parse("log.level", d.log.level, |s: String| {
                    LogFilter::parse(&s)
                        .map_err(|e| format!("not a log filter ({e}), e.g. \"info\" or \"compactor=debug\""))
                }),
            },
            trace: TraceConfig {
                enabled: r.get("trace.enabled", d.trace.enabled),
                endpoint: r.secret("trace.endpoint", d.trace.endpoint, trace_endpoint),
                headers: r.secret("trace.headers", d.trace.headers, |s: String| {
                    super::headers::parse_headers(&s).map(|_| Secret::new(s))
                }),
                sample_ratio: r.parse("trace.sample_ratio", d.trace.sample_ratio, |p: f64| {
                    if (0.0..=1.0).contains(&p) { Ok(p) } else { Err("must be in [0, 1]".into()) }
                }),
                service_name: r.parse("trace.service_name", d.trace.service_name, |s: String| {
                    if s.trim().is_empty() { Err("must not be empty".into()) } else { Ok(s) }
                }),
                export_timeout: r.parse("trace.export_timeout_ms", d.trace.export_timeout, positive_ms),
                queue_size: r.parse("trace.queue_size", d.trace.queue_size, positive_u32),
            },
            tokens: TokensConfig {
                cache_bytes: token_cache_bytes(&mut r, d.tokens.cache_bytes),
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
                pressure: r.parse("prune.pressure", d.prune.pressure, |p: f64| {
                    if p > 0.0 && p <= 1.0 { Ok(p) } else { Err("must be in (0, 1]".into()) }
                }),
                payback_confidence: r.parse("prune.payback_confidence", d.prune.payback_confidence, |p: f64| {
                    if p > 0.0 && p <= 1.0 { Ok(p) } else { Err("must be in (0, 1]".into()) }
                }),
                assumed_runs: r.get("prune.assumed_runs", d.prune.assumed_runs),
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
                redis_url: r.secret("session.redis_url", d.session.redis_url, |s: String| {
                    if s.split(',').all(|url| redis::parse_redis_url(url.trim()).is_some()) {
                        Ok(RedisUrls::new(s))
                    } else {
                        Err("not a redis:// URL (or a comma-separated list of them for a cluster)".to_string())
                    }
                }),
                redis_cluster: r.get("session.redis_cluster", d.session.redis_cluster),
                key_prefix: r.get("session.key_prefix", d.session.key_prefix),
                ttl: r.parse("session.ttl_secs", d.session.ttl, |s: u64| positive(s).map(Duration::from_secs)),
                max_sessions: r.parse("session.max_sessions", d.session.max_sessions, positive),
                memory_bytes: r.parse("session.memory_bytes", d.session.memory_bytes, positive),
                max_conversations: r.parse("session.max_conversations", d.session.max_conversations, positive_u32),
                redis_timeout: r.parse("session.redis_timeout_ms", d.session.redis_timeout, positive_ms),
                tenant_secret: r.secret("session.tenant_secret", d.session.tenant_secret, |s| Ok(Secret::new(s))),
                breaker_failures: r.parse("session.breaker_failures", d.session.breaker_failures, positive_u32),
                breaker_backoff: r.parse("session.breaker_backoff_ms", d.session.breaker_backoff, positive_ms),
            },
            admin: AdminConfig { token: r.secret("admin.token", d.admin.token, |s| Ok(Secret::new(s))) },
            inspector: InspectorConfig {
                requests_per_conversation: r.parse(
                    "inspector.requests_per_conversation",
                    d.inspector.requests_per_conversation,
                    |n: u32| if n > 100_000 { Err("at most 100000".to_string()) } else { Ok(n) },
                ),
                keep_content: r.get("inspector.keep_content", d.inspector.keep_content),
                content_bytes: r.parse("inspector.content_bytes", d.inspector.content_bytes, |n: u32| {
                    if n > 1_048_576 { Err("at most 1048576".to_string()) } else { Ok(n) }
                }),
            },
            compaction: compaction_settings(&mut r, d.compaction),
            models: model_entries(&mut r, figment),
        };
        let warnings = r.warnings();
        let problems = r.finish();
        if problems.is_empty() { Ok((config, warnings)) } else { Err(ConfigError::Invalid(problems)) }
    }
}

/// The OTLP endpoint: an http(s) URL without credentials. Like an upstream URL, one with
/// `user:password@` or a query string (where `?api_key=` would sit) is refused: the endpoint is
/// printed by `--check-config` and in logs, while `trace.headers` is a secret that never prints.
fn trace_endpoint(s: String) -> Result<String, String> {
    let example = "e.g. \"http://127.0.0.1:4318/v1/traces\"";
    let Ok(uri) = s.parse::<http::Uri>() else { return Err(format!("not an http:// or https:// URL, {example}")) };
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
        return Err(format!("not an http:// or https:// URL, {example}"));
    }
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) || uri.query().is_some() {
        return Err("must not carry credentials (`user:password@`) or a query string (`?api_key=`): give the \
                    collector's credential in `trace.headers`, e.g. \"authorization=Bearer KEY\", which never prints"
            .into());
    }
    Ok(s)
}

/// Keys that are still read but replaced by others; environment variables may name them too.
pub const DEPRECATED_KEYS: [&str; 1] = ["tokens.cache_entries"];

/// `tokens.cache_bytes`, or the deprecated `tokens.cache_entries` converted to bytes (every count
/// costs the same, so the conversion keeps exactly the cache the operator had).
fn token_cache_bytes(r: &mut Reader, default: u64) -> u64 {
    let bytes_set = r.is_set("tokens.cache_bytes");
    let bytes = r.parse("tokens.cache_bytes", default, positive);
    let entries: Option<u64> = r.parse("tokens.cache_entries", None, |n: u64| positive(n).map(Some));
    let Some(entries) = entries else { return bytes };
    if bytes_set {
        r.warn("tokens.cache_entries", "deprecated and ignored because `tokens.cache_bytes` is set; remove it");
        return bytes;
    }
    let converted = entries.saturating_mul(u64::from(TOKEN_ENTRY_BYTES));
    r.warn(
        "tokens.cache_entries",
        &format!(
            "deprecated, read as `tokens.cache_bytes = {converted}` ({entries} counts of {TOKEN_ENTRY_BYTES} bytes); set that key instead"
        ),
    );
    converted
}

/// `[models.NAME]` entries over the built-in table, each field checked like a top-level key.
fn model_entries(r: &mut Reader, figment: &Figment) -> BTreeMap<String, ModelInfo> {
    let mut models = BTreeMap::new();
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
        models.insert(name, info);
    }
    models
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
        local_summary_window_share: r.parse(
            "compaction.local_summary_window_share",
            d.local_summary_window_share,
            summary_window_share,
        ),
        local_summary_min_window_share: r.parse(
            "compaction.local_summary_min_window_share",
            d.local_summary_min_window_share,
            summary_window_share,
        ),
        keep_recent_tokens: r.parse("compaction.keep_recent_tokens", d.keep_recent_tokens, positive_u32),
        user_message_max_tokens: r.get("compaction.user_message_max_tokens", d.user_message_max_tokens),
        summary_prefix: r.get("compaction.summary_prefix", d.summary_prefix),
        system_prompt: r.parse("compaction.system_prompt", d.system_prompt, non_empty),
        instruction: r.parse("compaction.instruction", d.instruction, non_empty),
        emergency_protect_tokens: r.get("compaction.emergency_protect_tokens", d.emergency_protect_tokens),
        min_output_tokens: r.parse("compaction.min_output_tokens", d.min_output_tokens, positive_u32),
        output_reserve_tokens: r.parse("compaction.output_reserve_tokens", d.output_reserve_tokens, positive_u32),
        transcript: r.parse("compaction.transcript", d.transcript, |name: String| {
            Transcript::parse(&name).ok_or_else(|| format!("`{name}` is not one of \"whole\", \"head_tail\""))
        }),
        transcript_output_tokens: r.parse(
            "compaction.transcript_output_tokens",
            d.transcript_output_tokens,
            positive_u32,
        ),
        summary_timeout: r.parse("compaction.summary_timeout_ms", d.summary_timeout, positive_ms),
        lock_wait: r.parse("compaction.lock_wait_ms", d.lock_wait, ms),
        lock_lease: r.parse("compaction.lock_lease_ms", d.lock_lease, positive_ms),
        max_failures: r.parse("compaction.max_failures", d.max_failures, positive_u32),
        background: r.get("compaction.background", d.background),
        background_turns_ahead: r.parse("compaction.background_turns_ahead", d.background_turns_ahead, positive_u32),
        background_max_inflight: r.parse("compaction.background_max_inflight", d.background_max_inflight, positive_u32),
        prefill_ahead: r.get("compaction.prefill_ahead", d.prefill_ahead),
        ladder: r.parse("compaction.ladder", d.ladder, |names: Vec<String>| {
            let mut rungs = Vec::new();
            for name in &names {
                let rung = Rung::parse(name).ok_or_else(|| {
                    format!("`{name}` is not one of \"summarize\", \"summarize_harder\", \"prune_hard\"")
                })?;
                if rungs.contains(&rung) {
                    return Err(format!("`{name}` is listed twice"));
                }
                rungs.push(rung);
            }
            Ok(rungs)
        }),
        agent_markers: r
            .get::<Vec<String>>("compaction.agent_markers", d.agent_markers)
            .into_iter()
            .map(|m| m.to_lowercase())
            .collect(),
        overflow: r.parse("compaction.extra_overflow_patterns", d.overflow, |p: Vec<String>| {
            OverflowDetector::new(&p).map_err(|e| format!("not a valid pattern: {e}"))
        }),
    }
}

/// A share of the window a summary may take: at most the eighth a provider gets.
fn summary_window_share(share: f64) -> Result<f64, String> {
    if share > 0.0 && share <= 0.125 { Ok(share) } else { Err("must be in (0, 0.125]".into()) }
}

fn positive_u32(value: u32) -> Result<u32, String> {
    if value == 0 { Err("must be greater than 0".into()) } else { Ok(value) }
}

fn positive(value: u64) -> Result<u64, String> {
    if value == 0 { Err("must be greater than 0".into()) } else { Ok(value) }
}

fn ms(value: u64) -> Result<Duration, String> {
    Ok(Duration::from_millis(value))
}

fn positive_ms(value: u64) -> Result<Duration, String> {
    positive(value).map(Duration::from_millis)
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
    fn a_base_url_with_credentials_is_refused_naming_the_key_never_the_password() {
        let err = from_toml("[upstream]\nanthropic = \"https://user:pw-secret@gateway.example/v1\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("`upstream.anthropic`") && err.contains("credentials"), "{err}");
        assert!(!err.contains("pw-secret"), "{err}");
    }

    #[test]
    fn secrets_never_print_in_check_config_or_debug() {
        let config =
            from_toml("[admin]\ntoken = \"tok-1234-secret\"\n[session]\ntenant_secret = \"tenant-5678-secret\"\n[trace]\nheaders = \"authorization=Bearer otlp-9012-secret\"\n")
                .unwrap();
        assert_eq!(config.admin.token.expose(), "tok-1234-secret");
        assert_eq!(config.trace.headers.expose(), "authorization=Bearer otlp-9012-secret");
        for shown in [config.to_toml(), format!("{config:?}"), format!("{config:#?}")] {
            assert!(
                !shown.contains("tok-1234") && !shown.contains("tenant-5678") && !shown.contains("otlp-9012"),
                "{shown}"
            );
            assert!(shown.contains(REDACTED), "{shown}");
        }
        assert!(config.to_toml().contains("token = \"[redacted]\""));
        assert!(Config::default().to_toml().contains("token = \"\""));
    }

    #[test]
    fn durations_and_patterns_print_in_the_units_and_form_they_were_given() {
        let config = from_toml(
            "[upstream]\nidle_timeout_ms = 1500\n[compaction]\nextra_overflow_patterns = [\"way too big\"]\n",
        )
        .unwrap();
        let toml = config.to_toml();
        assert!(toml.contains("idle_timeout_ms = 1500"), "{toml}");
        assert!(toml.contains("ttl_secs = 604800"), "{toml}");
        assert!(toml.contains("extra_overflow_patterns = [\"way too big\"]"), "{toml}");
        assert!(config.compaction.overflow.detect(400, br#"{"error":{"message":"way too big"}}"#).is_some());
        assert!(from_toml("[compaction]\nextra_overflow_patterns = [\"(\"]\n").is_err());
    }

    #[test]
    fn the_deprecated_token_cache_entries_key_converts_to_bytes_with_a_warning() {
        let read = |text: &str| Config::read(&Figment::new().merge(Toml::string(text))).unwrap();
        let (config, warnings) = read("[tokens]\ncache_entries = 1000\n");
        assert_eq!(config.tokens.cache_bytes, 1000 * u64::from(TOKEN_ENTRY_BYTES));
        assert!(warnings.len() == 1 && warnings[0].contains("`tokens.cache_bytes = 384000`"), "{warnings:?}");
        let (config, warnings) = read("[tokens]\ncache_entries = 1000\ncache_bytes = 4096\n");
        assert_eq!(config.tokens.cache_bytes, 4096, "the new key wins");
        assert!(warnings[0].contains("ignored"), "{warnings:?}");
        let (config, warnings) = read("");
        assert_eq!(config.tokens.cache_bytes, 64 * 1024 * 1024);
        assert_eq!(config.session.memory_bytes, 256 * 1024 * 1024);
        assert!(warnings.is_empty());
        assert!(!config.to_toml().contains("cache_entries"), "the effective configuration shows the new key");
        assert!(from_toml("[tokens]\ncache_entries = 0\n").unwrap_err().to_string().contains("`tokens.cache_entries`"));
    }

    #[test]
    fn later_layers_override_earlier_ones() {
        let figment = Figment::new()
            .merge(Toml::string("[upstream]\nopenai = \"http://127.0.0.1:1\"\nidle_timeout_ms = 5\n"))
            .merge(Serialized::default("upstream.openai", "http://127.0.0.1:2"));
        let config = Config::from_figment(&figment).unwrap();
        assert_eq!(config.upstream.openai.as_str(), "http://127.0.0.1:2");
        assert_eq!(config.upstream.idle_timeout, Duration::from_millis(5));
    }
}
