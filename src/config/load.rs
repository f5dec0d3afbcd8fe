//! Loading: built-in defaults < TOML file < `COMPACTOR_` environment, read by serde into the raw
//! structs ([`super::raw`]) and validated into the runtime [`Config`], so that every bad or unknown
//! key is reported at once, naming where it came from.

use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Format, Toml};
use figment::value::Dict;

use super::check::Problems;
use super::env;
use super::raw::RawConfig;
use super::*;

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
        let mut problems = Problems::new(figment);
        let mut root_section = problems.root();
        let (raw, unknown) = root_section.read_raw::<RawConfig>(root);
        let config = raw.validate(&mut root_section, Config::default());
        // Unknown keys are named after the bad values, each with the key it most likely misspells.
        let known = env::KnownKeys::of(&Config::default());
        root_section.unknown(unknown.into_iter().map(|path| {
            let near = known.misspelt(&path).map(str::to_string);
            (path, near)
        }));
        let (problems, warnings) = problems.finish();
        if problems.is_empty() { Ok((config, warnings)) } else { Err(ConfigError::Invalid(problems)) }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::tokens::TOKEN_ENTRY_BYTES;
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
    fn azure_paths_have_an_upstream_only_where_an_operator_named_one() {
        // Both at their defaults: nowhere (an Azure key never goes to api.openai.com).
        assert_eq!(from_toml("").unwrap().upstream.azure, None);
        // `openai` pointed at an Azure resource before `azure` existed: it keeps serving them.
        let legacy = from_toml("[upstream]\nopenai = \"https://acme.openai.azure.com\"\n").unwrap();
        assert_eq!(
            legacy.upstream.azure.map(|url| url.as_str().to_string()).as_deref(),
            Some("https://acme.openai.azure.com")
        );
        // `azure` named: that, whatever `openai` says.
        let both =
            from_toml("[upstream]\nopenai = \"https://gw.example\"\nazure = \"https://acme.openai.azure.com/\"\n")
                .unwrap();
        assert_eq!(
            both.upstream.azure.map(|url| url.as_str().to_string()).as_deref(),
            Some("https://acme.openai.azure.com")
        );
        assert!(from_toml("[upstream]\nazure = \"ftp://x\"\n").unwrap_err().to_string().contains("`upstream.azure`"));
    }

    #[test]
    fn client_keys_are_digests_by_tenant_and_a_bad_digest_is_named() {
        let one = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let two = "60303AE22B998861BCE3B28F33EEC1BE758A213C86C93C076DBE9F558C11C752";
        let config = from_toml(&format!(
            "[clients.team-a]\nkey_sha256 = \"{one}\"\n[clients.team-b]\nkey_sha256 = [\"{one}\", \"{two}\"]\n"
        ))
        .unwrap();
        assert_eq!(config.clients["team-a"].key_sha256.len(), 1);
        assert_eq!(config.clients["team-b"].key_sha256[1][0], 0x60);
        let bad = from_toml("[clients.team-a]\nkey_sha256 = \"sk-the-key-itself\"\n").unwrap_err().to_string();
        assert!(bad.contains("clients.team-a.key_sha256") && bad.contains("64 hex digits"), "{bad}");
        assert!(!bad.contains("sk-the-key-itself"), "the key itself is never echoed: {bad}");
        let unknown = from_toml("[clients.team-a]\nkey = \"x\"\n").unwrap_err().to_string();
        assert!(unknown.contains("clients.team-a"), "{unknown}");
        let bedrock = from_toml("[upstream]\nbedrock = \"https://bedrock-runtime.eu-west-1.amazonaws.com\"\n").unwrap();
        assert_eq!(
            bedrock.upstream.bedrock.map(|url| url.authority().to_string()).as_deref(),
            Some("bedrock-runtime.eu-west-1.amazonaws.com")
        );
        assert!(from_toml("[upstream]\nbedrock_region = \"US East\"\n").is_err());
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

    #[test]
    fn the_effective_configuration_reads_back_as_itself() {
        let rendered = Config::default().to_toml();
        assert_eq!(from_toml(&rendered).unwrap().to_toml(), rendered);
    }

    #[test]
    fn bad_values_come_in_key_order_then_unknown_keys_each_naming_its_source() {
        let err = from_toml(
            "zzz = 1\n[upstream]\nqqq = 1\nconnect_timeout_ms = \"soon\"\nopenai = \"ftp://x\"\n[compaction]\nthreshold = 5\nbogus = 1\ntreshold = 0.5\n",
        )
        .unwrap_err()
        .to_string();
        let source = "(in TOML source string)";
        let expected = [
            "invalid configuration:".to_string(),
            format!("`upstream.openai` {source}: must start with http:// or https://"),
            format!("`upstream.connect_timeout_ms` {source}: invalid type: found string \"soon\", expected u64"),
            format!("`compaction.threshold` {source}: must be in (0, 1]"),
            format!("`compaction.bogus` {source}: unknown key"),
            format!("`compaction.treshold` {source}: unknown key (did you mean `compaction.threshold`?)"),
            format!("`upstream.qqq` {source}: unknown key"),
            format!("`zzz` {source}: unknown key"),
        ];
        assert_eq!(err, expected.join("\n  "));
    }

    #[test]
    fn a_section_given_anything_but_a_table_is_an_unknown_key_never_read_field_by_field() {
        let err =
            from_toml("upstream = [\"http://a:1\", \"http://b:2\"]\nlimits = 5\n[bogus]\n").unwrap_err().to_string();
        assert!(err.contains("`upstream` (in TOML source string): unknown key"), "{err}");
        assert!(err.contains("`limits` (in TOML source string): unknown key"), "{err}");
        assert!(!err.contains("upstream.openai") && !err.contains("bogus"), "an empty unknown table is no key: {err}");
    }
}
