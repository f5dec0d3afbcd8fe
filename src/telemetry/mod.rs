//! Logs and metrics: tracing set up from `[log]`, a Prometheus recorder for `GET /metrics`, the
//! per-request log line, and a limit on repeated warnings.

pub mod metric;
pub mod trace;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{BuildError, PrometheusBuilder, PrometheusHandle};

use crate::config::{LogConfig, LogFormat, TraceConfig};

/// Installs the global tracing subscriber. Logs go to stdout; they never carry headers or bodies.
/// With `[trace]` on, compactor's spans (target [`trace::TARGET`]) also go to the OTLP exporter;
/// they never show in the logs. Returns the exporter's pipeline, to flush at shutdown.
pub fn init_logging(config: &LogConfig, trace_config: &TraceConfig) -> Option<trace::Tracing> {
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::{FilterExt, Targets, filter_fn};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let not_spans = filter_fn(|meta| meta.target() != trace::TARGET);
    let filter = config.level.env_filter().and(not_spans);
    // Colour only on a terminal: piped logs are read by machines.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let fmt = tracing_subscriber::fmt::layer().with_target(false).with_ansi(ansi);
    let fmt = match config.format {
        LogFormat::Text => fmt.with_filter(filter).boxed(),
        LogFormat::Json => fmt.json().flatten_event(true).with_filter(filter).boxed(),
    };
    let (otel, pipeline) = match trace::pipeline(trace_config) {
        Ok(Some((tracer, pipeline))) => {
            let spans = Targets::new().with_target(trace::TARGET, tracing::Level::TRACE);
            let layer = tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_location(false)
                .with_threads(false)
                .with_tracked_inactivity(false)
                .with_target(false);
            (Some(layer.with_filter(spans)), Some(pipeline))
        }
        Ok(None) => (None, None),
        Err(error) => {
            eprintln!("compactor: traces are off, the exporter could not start: {error}");
            (None, None)
        }
    };
    // A second init (tests, embedding) keeps the first subscriber.
    drop(tracing_subscriber::registry().with(fmt).with(otel).try_init());
    pipeline
}

/// Installs the global Prometheus recorder and describes every metric compactor emits.
pub fn init_metrics() -> Result<PrometheusHandle, BuildError> {
    let handle = PrometheusBuilder::new()
        .set_buckets(&metric::SECONDS_BUCKETS)?
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full("compactor_summary_calls_per_compaction".into()),
            &metric::CALLS_BUCKETS,
        )?
        .install_recorder()?;
    metric::describe();
    metric::present_at_start();
    Ok(handle)
}

/// Lets a warning through at most once per interval, so a down dependency cannot flood the logs.
pub struct RateLimited {
    interval_ms: u64,
    next_ms: AtomicU64,
    epoch: Instant,
}

impl RateLimited {
    pub fn new(interval: Duration) -> Self {
        Self { interval_ms: interval.as_millis() as u64, next_ms: AtomicU64::new(0), epoch: Instant::now() }
    }

    /// True when this warning may be written now.
    pub fn ready(&self) -> bool {
        let now = self.epoch.elapsed().as_millis() as u64;
        let next = self.next_ms.load(Ordering::Relaxed);
        now >= next
            && self.next_ms.compare_exchange(next, now + self.interval_ms, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }
}
