//! The load generator: open loop at a fixed rate (no coordinated omission), closed loop at a
//! fixed concurrency, and a few requests one after the other.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::header::CONTENT_TYPE;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::runtime::Runtime;

use crate::scenario::{Outgoing, Scenario};

/// A request that has not completed after this long counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Where requests go (the stub itself, nginx or compactor), with a fresh connection pool.
#[derive(Clone)]
pub struct Target {
    client: HttpClient,
    addr: SocketAddr,
}

/// When the response of one request started and ended.
struct Timings {
    first_byte: Instant,
    done: Instant,
}

impl Target {
    pub fn new(addr: SocketAddr) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(90)).build(connector);
        Self { client, addr }
    }

    fn uri(&self, scenario: &Scenario) -> Uri {
        format!("http://{}{}", self.addr, scenario.path).parse().unwrap_or_default()
    }

    /// One request, to the last byte of the response body; `Err` for non-2xx, connection
    /// errors, a plain answer where a stream was asked for, and anything slower than
    /// `REQUEST_TIMEOUT`.
    async fn send(&self, uri: Uri, scenario: &Scenario, outgoing: Outgoing) -> Result<Timings, String> {
        let mut request = Request::post(uri).header(CONTENT_TYPE, "application/json");
        for (name, value) in &scenario.headers {
            request = request.header(name, value);
        }
        if let (Some(name), Some(value)) = (scenario.session_header(), outgoing.session) {
            request = request.header(name, value);
        }
        let request = request.body(Full::new(outgoing.body)).map_err(|e| e.to_string())?;
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| format!("request: {e:?}"))?;
            let status = response.status();
            let event_stream =
                response.headers().get(CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
            let mut body = response.into_body();
            let mut first_byte = None;
            let mut received = Vec::new();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| format!("body: {e}"))?;
                if let Ok(data) = frame.into_data() {
                    first_byte.get_or_insert_with(Instant::now);
                    if !status.is_success() && received.len() < 300 {
                        received.extend_from_slice(&data);
                    }
                }
            }
            let done = Instant::now();
            if !status.is_success() {
                return Err(status_error(status, &received));
            }
            if scenario.streams() && !event_stream {
                return Err("asked for a stream, got a plain response".into());
            }
            Ok(Timings { first_byte: first_byte.unwrap_or(done), done })
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Ok(result) => result,
            Err(_) => Err(format!("no complete response within {REQUEST_TIMEOUT:?}")),
        }
    }
}

fn status_error(status: StatusCode, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(300)]);
    format!("status {status}: {text}")
}

pub fn new_histogram() -> Histogram<u64> {
    // 1 µs .. 60 s, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap_or_else(|_| unreachable!("constant bounds are valid"))
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

pub struct OpenResult {
    /// Scheduled send to the last byte of the response.
    pub latency: Histogram<u64>,
    /// Scheduled send to the first byte of the response body.
    pub first_byte: Histogram<u64>,
    /// How late the generator dispatched each request (scheduled -> task running).
    pub lag: Histogram<u64>,
    pub completed: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub elapsed: Duration,
}

impl OpenResult {
    /// Adds another run of the same target (a later round): its requests, and its time.
    pub fn absorb(&mut self, other: OpenResult) {
        // The histograms share their bounds (`new_histogram`): adding cannot fail.
        let _ = self.latency.add(&other.latency);
        let _ = self.first_byte.add(&other.first_byte);
        let _ = self.lag.add(&other.lag);
        self.completed += other.completed;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.elapsed += other.elapsed;
    }

    pub fn throughput(&self) -> f64 {
        self.completed as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

struct Outcome {
    scheduled: Instant,
    dispatched: Instant,
    result: Result<Timings, String>,
}

/// Sends `count` requests, request `i` due at `start + i / rate`, each on its own task whatever
/// the others are doing. A pacer OS thread does the timing (the tokio timer has 1 ms granularity,
/// too coarse for 2 ms spacing), builds each body before its due time, and hands each request to
/// the runtime at its due time.
pub fn open_loop(
    runtime: &Runtime,
    target: &Target,
    scenario: &Arc<Scenario>,
    tag: &str,
    rate: f64,
    count: u64,
) -> OpenResult {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Outcome>();
    let handle = runtime.handle().clone();
    let start = Instant::now() + Duration::from_millis(20);
    let pacer = {
        let target = target.clone();
        let scenario = Arc::clone(scenario);
        let uri = target.uri(&scenario);
        let tag = tag.to_string();
        std::thread::spawn(move || {
            for i in 0..count {
                let outgoing = scenario.request(&tag, i);
                let scheduled = start + Duration::from_secs_f64(i as f64 / rate);
                let now = Instant::now();
                if scheduled > now {
                    std::thread::sleep(scheduled - now);
                }
                let (tx, target, scenario, uri) = (tx.clone(), target.clone(), Arc::clone(&scenario), uri.clone());
                handle.spawn(async move {
                    let dispatched = Instant::now();
                    let result = target.send(uri, &scenario, outgoing).await;
                    let _ = tx.send(Outcome { scheduled, dispatched, result });
                });
            }
        })
    };
    let mut result = OpenResult {
        latency: new_histogram(),
        first_byte: new_histogram(),
        lag: new_histogram(),
        completed: 0,
        errors: 0,
        first_error: None,
        elapsed: Duration::ZERO,
    };
    let mut last = start;
    runtime.block_on(async {
        // Ends when the pacer has finished and every request task has reported.
        while let Some(outcome) = rx.recv().await {
            let _ = result.lag.record(micros(outcome.dispatched.saturating_duration_since(outcome.scheduled)));
            match outcome.result {
                Ok(timings) => {
                    last = last.max(timings.done);
                    result.completed += 1;
                    result.latency.saturating_record(micros(timings.done.saturating_duration_since(outcome.scheduled)));
                    result
                        .first_byte
                        .saturating_record(micros(timings.first_byte.saturating_duration_since(outcome.scheduled)));
                }
                Err(error) => {
                    result.errors += 1;
                    result.first_error.get_or_insert(error);
                }
            }
        }
    });
    if pacer.join().is_err() {
        result.first_error.get_or_insert("the pacer thread panicked".into());
    }
    // The run covers `count` slots of 1/rate each, or longer if the last response came late.
    let slots = Duration::from_secs_f64(count as f64 / rate);
    result.elapsed = last.saturating_duration_since(start).max(slots);
    result
}

pub struct ClosedResult {
    pub latency: Histogram<u64>,
    pub completed: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub elapsed: Duration,
}

impl ClosedResult {
    pub fn throughput(&self) -> f64 {
        self.completed as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// `workers` tasks each send back to back until `duration` has passed.
pub fn closed_loop(
    runtime: &Runtime,
    target: &Target,
    scenario: &Arc<Scenario>,
    tag: &str,
    workers: usize,
    duration: Duration,
) -> ClosedResult {
    let uri = target.uri(scenario);
    runtime.block_on(async {
        let start = Instant::now();
        let deadline = start + duration;
        let tasks: Vec<_> = (0..workers)
            .map(|worker| {
                let (target, scenario, uri, tag) = (target.clone(), Arc::clone(scenario), uri.clone(), tag.to_string());
                tokio::spawn(async move {
                    let mut latency = new_histogram();
                    let (mut completed, mut errors, mut first_error) = (0u64, 0u64, None);
                    let mut i = worker as u64;
                    while Instant::now() < deadline {
                        let outgoing = scenario.request(&tag, i);
                        i += workers as u64;
                        let sent = Instant::now();
                        match target.send(uri.clone(), &scenario, outgoing).await {
                            Ok(timings) => {
                                completed += 1;
                                latency.saturating_record(micros(timings.done.saturating_duration_since(sent)));
                            }
                            Err(error) => {
                                errors += 1;
                                first_error.get_or_insert(error);
                                // Do not spin on a dead target.
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                    }
                    (latency, completed, errors, first_error)
                })
            })
            .collect();
        let mut result = ClosedResult {
            latency: new_histogram(),
            completed: 0,
            errors: 0,
            first_error: None,
            elapsed: Duration::ZERO,
        };
        for task in tasks {
            match task.await {
                Ok((latency, completed, errors, first_error)) => {
                    let _ = result.latency.add(&latency);
                    result.completed += completed;
                    result.errors += errors;
                    if let Some(error) = first_error {
                        result.first_error.get_or_insert(error);
                    }
                }
                Err(error) => {
                    result.first_error.get_or_insert(format!("worker task: {error}"));
                }
            }
        }
        result.elapsed = start.elapsed();
        result
    })
}

/// `count` requests one after the other on one connection; the latency of each (send to last
/// byte), or its error.
pub fn one_by_one(
    runtime: &Runtime,
    target: &Target,
    scenario: &Scenario,
    count: u64,
) -> Vec<Result<Duration, String>> {
    let uri = target.uri(scenario);
    runtime.block_on(async {
        let mut latencies = Vec::new();
        for i in 0..count {
            let outgoing = scenario.request("start", i);
            let sent = Instant::now();
            latencies.push(target.send(uri.clone(), scenario, outgoing).await.map(|t| t.done.duration_since(sent)));
        }
        latencies
    })
}
