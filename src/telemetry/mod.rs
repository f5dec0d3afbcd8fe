//! Logs and metrics: tracing set up from `[log]`, a Prometheus recorder for `GET /metrics`.

pub mod metric;

use metrics_exporter_prometheus::{BuildError, PrometheusBuilder, PrometheusHandle};

use crate::config::{LogConfig, LogFormat};

/// Installs the global tracing subscriber. Logs go to stdout; they never carry headers or bodies.
pub fn init_logging(config: &LogConfig) {
    let filter = config.level.env_filter();
    // Colour only on a terminal: piped logs are read by machines.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false).with_ansi(ansi);
    let result = match config.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    // A second init (tests, embedding) keeps the first subscriber.
    drop(result);
}

/// Installs the global Prometheus recorder and describes every metric compactor emits.
pub fn init_metrics() -> Result<PrometheusHandle, BuildError> {
    let handle = PrometheusBuilder::new().set_buckets(&metric::SECONDS_BUCKETS)?.install_recorder()?;
    metric::describe();
    Ok(handle)
}
