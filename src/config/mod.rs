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
        Ok(Self {
            text: raw.trim_end_matches('/').to_string(),
            authority,
        })
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
                openai: BaseUrl {
                    text: "https://api.openai.com".into(),
                    authority: "api.openai.com".into(),
                },
                anthropic: BaseUrl {
                    text: "https://api.anthropic.com".into(),
                    authority: "api.anthropic.com".into(),
                },
                connect_timeout_ms: 10_000,
                first_byte_timeout_ms: 600_000,
                idle_timeout_ms: 300_000,
                http2: false,
                native_roots: false,
            },
            limits: LimitsConfig {
                max_body_bytes: 32 * 1024 * 1024,
            },
            shutdown: ShutdownConfig {
                drain_timeout_ms: 30_000,
            },
            log: LogConfig {
                format: LogFormat::Text,
                level: "info".into(),
            },
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
            figment = if must_exist {
                figment.merge(Toml::file_exact(path))
            } else {
                figment.merge(Toml::file(path))
            };
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
                s.parse::<SocketAddr>()
                    .map_err(|e| format!("not a socket address ({e}), e.g. 127.0.0.1:8787"))
            }),
            upstream: UpstreamConfig {
                openai: r.parse("upstream.openai", d.upstream.openai, |s: String| {
                    BaseUrl::parse(&s)
                }),
                anthropic: r.parse("upstream.anthropic", d.upstream.anthropic, |s: String| {
                    BaseUrl::parse(&s)
                }),
                connect_timeout_ms: r.parse(
                    "upstream.connect_timeout_ms",
                    d.upstream.connect_timeout_ms,
                    positive,
                ),
                first_byte_timeout_ms: r.parse(
                    "upstream.first_byte_timeout_ms",
                    d.upstream.first_byte_timeout_ms,
                    positive,
                ),
                idle_timeout_ms: r.parse(
                    "upstream.idle_timeout_ms",
                    d.upstream.idle_timeout_ms,
                    positive,
                ),
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
                        .map_err(|e| {
                            format!("not a log filter ({e}), e.g. \"info\" or \"compactor=debug\"")
                        })
                }),
            },
        };
        let problems = r.finish();
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }

    /// The effective configuration as TOML, for `--check-config`.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self)
            .unwrap_or_else(|e| format!("# cannot render configuration: {e}\n"))
    }
}

fn positive(value: u64) -> Result<u64, String> {
    if value == 0 {
        Err("must be greater than 0".into())
    } else {
        Ok(value)
    }
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
        for key in [
            "`listen`",
            "`bogus`",
            "`upstream.connect_timeout_ms`",
            "`upstream.openai`",
            "`log.format`",
        ] {
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
    fn later_layers_override_earlier_ones() {
        let figment = Figment::new()
            .merge(Toml::string(
                "[upstream]\nopenai = \"http://127.0.0.1:1\"\nidle_timeout_ms = 5\n",
            ))
            .merge(Serialized::default("upstream.openai", "http://127.0.0.1:2"));
        let config = Config::from_figment(&figment).unwrap();
        assert_eq!(config.upstream.openai.as_str(), "http://127.0.0.1:2");
        assert_eq!(config.upstream.idle_timeout_ms, 5);
    }
}
