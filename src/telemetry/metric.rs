//! Every metric compactor emits is described here and, but for the per-request figures that
//! [`super::request`] records, emitted here. Labels are bounded: routes and status codes, never
//! session ids or raw model names.

use std::time::Duration;

use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

use crate::rewrite::RewriteReport;
use crate::tokens::CacheSize;

/// Histogram buckets in seconds, from sub-millisecond proxy overhead to minutes-long streams.
pub const SECONDS_BUCKETS: [f64; 18] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0, 120.0,
    600.0,
];

/// Histogram buckets of summary calls per compaction: one call, a few pieces, up to the cap.
pub const CALLS_BUCKETS: [f64; 9] = [1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0, 32.0, 64.0];

pub fn describe() {
    describe_rewrite();
    describe_counter!("compactor_requests_total", "Proxied requests by route and final status.");
    describe_counter!(
        "compactor_forwarded_as_signed_total",
        "Client-signed requests (Bedrock SigV4) forwarded as they came, unread, because compactor holds no credential to sign a changed body."
    );
    describe_histogram!(
        "compactor_upstream_duration_seconds",
        Unit::Seconds,
        "Upstream latency: from forwarding until the response body ended."
    );
    describe_histogram!(
        "compactor_upstream_ttfb_seconds",
        Unit::Seconds,
        "Upstream time to first byte: from forwarding until the response head arrived."
    );
    describe_histogram!(
        "compactor_overhead_seconds",
        Unit::Seconds,
        "Time spent in compactor itself before the request went upstream, and on the response head; a request sent ahead of its preparation counts what came before it went."
    );
    describe_counter!("compactor_recovery_rungs_total", "Overflow recovery rungs tried, by rung and outcome.");
    describe_counter!("compactor_recoveries_total", "Overflow recoveries, by outcome (recovered, gave_up).");
    describe_counter!(
        "compactor_futile_compactions_avoided_total",
        "Compactions ahead of time skipped because the fixed part alone left no room to free."
    );
    describe_counter!("compactor_summary_calls_total", "Summary calls (each piece of a rolling summary), by outcome.");
    describe_counter!("compactor_request_bytes_total", Unit::Bytes, "Request body bytes received from clients.");
    describe_counter!("compactor_response_bytes_total", Unit::Bytes, "Response body bytes sent to clients.");
    describe_gauge!("compactor_active_streams", "Streamed (SSE) responses in flight.");
    describe_counter!("compactor_errors_total", "Errors compactor answered itself, by route and code.");
    describe_gauge!("compactor_open_connections", "Client connections being served.");
    describe_gauge!(
        "compactor_cache_bytes",
        Unit::Bytes,
        "Estimated bytes held by each in-process cache (tokens, sessions, tenants): the weighted size its byte bound applies to."
    );
    describe_gauge!("compactor_cache_entries", "Entries held by each in-process cache (tokens, sessions, tenants).");
    describe_counter!(
        "compactor_connections_refused_total",
        "Client connections refused (503 overloaded) past limits.max_connections."
    );
}

/// Describes the rewrite metrics (called from [`describe`]).
fn describe_rewrite() {
    describe_counter!(
        "compactor_rewrites_total",
        "Rewritable requests by route and outcome (changed, unchanged, unparsed, over_parse_memory, stateful, agent_compaction, over_budget)."
    );
    describe_counter!(
        "compactor_sent_ahead_total",
        "Requests sent upstream before their preparation (ahead), and those whose preparation decided on another body (withdrawn)."
    );
    describe_counter!(
        "compactor_tokens_saved_total",
        "Estimated prompt tokens saved, by step (prune, truncate, dedupe)."
    );
    describe_counter!(
        "compactor_tool_outputs_total",
        "Tool outputs rewritten, by action (pruned, truncated, deduped, repaired)."
    );
    describe_counter!(
        "compactor_session_store_errors_total",
        "Session store reads or writes that failed or timed out."
    );
    describe_counter!(
        "compactor_session_store_skipped_total",
        "Session store operations skipped while the circuit breaker is open, by operation."
    );
    describe_gauge!("compactor_session_store_breaker_open", "1 while the session store's circuit breaker is open.");
    describe_counter!(
        "compactor_session_store_breaker_trips_total",
        "Times the session store's circuit breaker opened."
    );
    describe_counter!(
        "compactor_session_store_corrupt_total",
        "Unreadable session values (wrong type, bad JSON, other schema version) deleted."
    );
    describe_counter!(
        "compactor_prefix_breaks_total",
        "Requests whose rewrite changed content the provider had already cached, by reason (pressure, cold_cache, pays_back, no_cache, summary)."
    );
    describe_counter!(
        "compactor_cache_read_tokens_total",
        "Prompt tokens upstreams reported reading from their prompt cache, by route."
    );
    describe_counter!(
        "compactor_cache_write_tokens_total",
        "Prompt tokens upstreams reported writing to their prompt cache, by route (Anthropic's cache_creation_input_tokens)."
    );
    describe_counter!("compactor_overflows_total", "Context-overflow errors seen from upstreams, by route.");
    describe_counter!("compactor_retries_total", "Retries after an overflow, by route.");
    describe_counter!(
        "compactor_compactions_total",
        "Compactions by trigger (overflow, threshold, admin) and outcome."
    );
    describe_counter!(
        "compactor_background_summaries_total",
        "Summaries prepared in the background, by outcome (started, ready, busy, nothing, failed, used, unneeded)."
    );
    describe_counter!(
        "compactor_background_summary_tokens_total",
        "Tokens the summary calls of summaries prepared in the background cost (the provider's usage), by outcome (ready: spent; used; unneeded) and direction (input, output)."
    );
    describe_counter!(
        "compactor_prefills_ahead_total",
        "Prompts rebuilt around a prepared summary sent ahead to a local server (the local cache preset), by outcome (sent, failed, moved_on: another request of the conversation came first)."
    );
    describe_histogram!("compactor_summary_call_seconds", Unit::Seconds, "Latency of summary calls.");
    describe_histogram!(
        "compactor_summary_calls_per_compaction",
        "Summary calls each compaction made: the pieces of a rolling summary and the retries of overflows."
    );
    describe_counter!("compactor_summary_tokens_total", "Estimated tokens sent to and received from summary calls.");
}

pub fn rewrite_done(route: &'static str, report: &RewriteReport, changed: bool) {
    let outcome = if changed { "changed" } else { "unchanged" };
    let register = || counter!("compactor_rewrites_total", "route" => route, "outcome" => outcome);
    // Every rewritable request counts here: its handle is looked up once, not on every request.
    static REWRITES: [[std::sync::OnceLock<metrics::Counter>; 2]; REWRITABLE_ROUTES.len()] =
        [const { [const { std::sync::OnceLock::new() }; 2] }; REWRITABLE_ROUTES.len()];
    match REWRITABLE_ROUTES.iter().position(|known| *known == route) {
        Some(at) => REWRITES[at][usize::from(changed)].get_or_init(register).increment(1),
        None => register().increment(1),
    }
    for (step, saved) in
        [("prune", report.saved_by_prune), ("truncate", report.saved_by_truncate), ("dedupe", report.saved_by_dedupe)]
    {
        if saved > 0 {
            counter!("compactor_tokens_saved_total", "step" => step).increment(u64::from(saved));
        }
    }
    for (action, n) in [
        ("pruned", report.pruned),
        ("truncated", report.truncated),
        ("deduped", report.deduped),
        ("repaired", report.repaired),
    ] {
        if n > 0 {
            counter!("compactor_tool_outputs_total", "action" => action).increment(n as u64);
        }
    }
}

/// A request that changed content the provider had already cached, and why.
pub fn prefix_break(reason: &'static str) {
    counter!("compactor_prefix_breaks_total", "reason" => reason).increment(1);
}

/// The prompt-cache tokens an upstream reported for one request.
pub fn cache_usage(route: &'static str, read: u64, write: u64) {
    if read > 0 {
        counter!("compactor_cache_read_tokens_total", "route" => route).increment(read);
    }
    if write > 0 {
        counter!("compactor_cache_write_tokens_total", "route" => route).increment(write);
    }
}

pub fn rewrite_skipped(route: &'static str, reason: &'static str) {
    counter!("compactor_rewrites_total", "route" => route, "outcome" => reason).increment(1);
}

/// A request sent upstream before its preparation (`ahead`), and one whose preparation then
/// decided on another body (`withdrawn`: the request that went ahead was dropped, the prepared
/// body sent instead).
pub fn sent_ahead(outcome: &'static str) {
    counter!("compactor_sent_ahead_total", "outcome" => outcome).increment(1);
}

/// A request parse that re-made the last turn's messages (`hit`) or read the whole body (`miss`).
pub fn prefix_reuse(route: &'static str, outcome: &'static str) {
    counter!("compactor_prefix_reuse_total", "route" => route, "outcome" => outcome).increment(1);
}

/// A request signed by its client that compactor forwarded as it came because it could not sign
/// a changed body (it holds no AWS credentials): nothing of compactor's was done to it.
pub fn forwarded_unsigned(family: &'static str) {
    counter!("compactor_forwarded_as_signed_total", "family" => family).increment(1);
}

pub fn overflow_seen(route: &'static str) {
    counter!("compactor_overflows_total", "route" => route).increment(1);
}

pub fn retry(route: &'static str) {
    counter!("compactor_retries_total", "route" => route).increment(1);
}

pub fn compaction(trigger: &'static str, outcome: &'static str) {
    counter!("compactor_compactions_total", "trigger" => trigger, "outcome" => outcome).increment(1);
}

/// A summary prepared in the background: `started`, then `ready` (its record stored) or `busy`
/// (another compaction of the conversation held the lock) or `failed`; `used` when the request
/// that needed it applied it, `unneeded` when a later compaction replaced it before any request
/// used it.
pub fn background_summary(outcome: &'static str) {
    counter!("compactor_background_summaries_total", "outcome" => outcome).increment(1);
}

/// A summary due to be prepared in the background that was not started, by why (`capacity`:
/// `compaction.background_max_inflight` reached; `body_budget`: no room in
/// `limits.max_inflight_body_bytes`).
pub fn background_summary_skipped(reason: &'static str) {
    counter!("compactor_background_summaries_skipped_total", "reason" => reason).increment(1);
}

/// A prefill ahead of a prepared summary's rebuilt prompt, by outcome.
pub fn prefill_ahead(outcome: &'static str) {
    counter!("compactor_prefills_ahead_total", "outcome" => outcome).increment(1);
}

/// What a summary prepared in the background cost, counted when it is stored (`ready`: spent),
/// when a request applies it (`used`) and when a later compaction replaces it unapplied
/// (`unneeded`); `ready - used - unneeded` is what waits, or waited for a request that never came.
pub fn background_summary_tokens(outcome: &'static str, input: u64, output: u64) {
    counter!("compactor_background_summary_tokens_total", "outcome" => outcome, "direction" => "input")
        .increment(input);
    counter!("compactor_background_summary_tokens_total", "outcome" => outcome, "direction" => "output")
        .increment(output);
}

/// One rung of an overflow recovery and its outcome (`retry`, `nothing`, `failed`, `skipped`).
pub fn recovery_rung(rung: &'static str, outcome: &'static str) {
    counter!("compactor_recovery_rungs_total", "rung" => rung, "outcome" => outcome).increment(1);
}

/// An overflow recovery that ended: `recovered` (the retry was answered), `failed` (the retry
/// was answered with an error) or `gave_up`.
pub fn recovery(outcome: &'static str) {
    counter!("compactor_recoveries_total", "outcome" => outcome).increment(1);
}

/// A compaction ahead of time not made because it would not leave room for the next turns under
/// the budget.
pub fn futile_compaction_avoided() {
    counter!("compactor_futile_compactions_avoided_total").increment(1);
}

/// One summary call and its outcome (`ok`, `overflow`, `failed`).
pub fn summary_call(outcome: &'static str) {
    counter!("compactor_summary_calls_total", "outcome" => outcome).increment(1);
}

/// The summary calls one compaction made (its pieces and retries).
pub fn summary_calls_per_compaction(calls: u32) {
    histogram!("compactor_summary_calls_per_compaction").record(f64::from(calls));
}

pub fn summary_latency(elapsed: Duration) {
    histogram!("compactor_summary_call_seconds").record(elapsed.as_secs_f64());
}

pub fn summary_tokens(direction: &'static str, tokens: u64) {
    counter!("compactor_summary_tokens_total", "direction" => direction).increment(tokens);
}

/// A session store operation (`load`, `commit`, `publish`, `lock`, `unlock`) that failed.
pub fn store_error(operation: &'static str) {
    counter!("compactor_session_store_errors_total", "operation" => operation).increment(1);
}

pub fn stream_started() {
    gauge!("compactor_active_streams").increment(1.0);
}

pub fn stream_ended() {
    gauge!("compactor_active_streams").decrement(1.0);
}

pub fn connection_opened() {
    gauge!("compactor_open_connections").increment(1.0);
}

pub fn connection_closed() {
    gauge!("compactor_open_connections").decrement(1.0);
}

pub fn connection_refused() {
    counter!("compactor_connections_refused_total").increment(1);
}

/// A store operation skipped by the open circuit breaker.
pub fn store_skipped(operation: &'static str) {
    counter!("compactor_session_store_skipped_total", "operation" => operation).increment(1);
}

/// The store's circuit breaker opened (`true`) or closed.
pub fn store_breaker(open: bool) {
    gauge!("compactor_session_store_breaker_open").set(if open { 1.0 } else { 0.0 });
    if open {
        counter!("compactor_session_store_breaker_trips_total").increment(1);
    }
}

/// An unreadable session value was deleted.
pub fn store_corrupt() {
    counter!("compactor_session_store_corrupt_total").increment(1);
}

/// The in-process caches, by gauge label: token counts, the in-memory session store (empty with
/// Redis), tenant hashes by credential, each conversation's last parse.
pub const CACHES: [&str; 4] = ["tokens", "sessions", "tenants", "prefixes"];

/// One cache's size, set before each scrape.
pub fn cache_size(cache: &'static str, size: CacheSize) {
    gauge!("compactor_cache_bytes", "cache" => cache).set(size.bytes as f64);
    gauge!("compactor_cache_entries", "cache" => cache).set(size.entries as f64);
}

/// Every route label ([`crate::route::Route::label`]).
pub const ROUTES: [&str; 11] = [
    "chat_completions",
    "messages",
    "responses",
    "count_tokens",
    "input_tokens",
    "responses_compact",
    "embeddings",
    "models",
    "anthropic_models",
    "other",
    "anthropic_other",
];

/// The routes compactor rewrites.
const REWRITABLE_ROUTES: [&str; 3] = ["chat_completions", "messages", "responses"];

/// The rewritable routes' families at zero (see [`present_at_start`]).
fn rewritable_routes_at_zero() {
    for route in REWRITABLE_ROUTES {
        for outcome in
            ["changed", "unchanged", "unparsed", "over_parse_memory", "stateful", "agent_compaction", "over_budget"]
        {
            counter!("compactor_rewrites_total", "route" => route, "outcome" => outcome).absolute(0);
        }
        counter!("compactor_overflows_total", "route" => route).absolute(0);
        counter!("compactor_retries_total", "route" => route).absolute(0);
        for outcome in ["hit", "miss"] {
            counter!("compactor_prefix_reuse_total", "route" => route, "outcome" => outcome).absolute(0);
        }
        counter!("compactor_cache_read_tokens_total", "route" => route).absolute(0);
        counter!("compactor_cache_write_tokens_total", "route" => route).absolute(0);
    }
}

/// Registers every family with its known label values at zero, so that a scrape of a fresh or idle
/// replica already shows each family (`# HELP`, `# TYPE` and a sample) and rates start from zero
/// rather than from a missing series. Statuses and error codes that depend on traffic appear
/// when they first happen.
pub fn present_at_start() {
    for route in ROUTES {
        counter!("compactor_requests_total", "route" => route, "status" => "200").absolute(0);
        counter!("compactor_request_bytes_total", "route" => route).absolute(0);
        counter!("compactor_response_bytes_total", "route" => route).absolute(0);
        counter!("compactor_errors_total", "route" => route, "code" => "upstream_unreachable").absolute(0);
        let _registered = histogram!("compactor_overhead_seconds", "route" => route);
        let _registered = histogram!("compactor_upstream_ttfb_seconds", "route" => route);
        let _registered = histogram!("compactor_upstream_duration_seconds", "route" => route);
    }
    rewritable_routes_at_zero();
    for outcome in ["ahead", "withdrawn"] {
        counter!("compactor_sent_ahead_total", "outcome" => outcome).absolute(0);
    }
    counter!("compactor_forwarded_as_signed_total", "family" => "bedrock").absolute(0);
    for reason in ["pressure", "cold_cache", "pays_back", "no_cache", "summary"] {
        counter!("compactor_prefix_breaks_total", "reason" => reason).absolute(0);
    }
    for step in ["prune", "truncate", "dedupe"] {
        counter!("compactor_tokens_saved_total", "step" => step).absolute(0);
    }
    for action in ["pruned", "truncated", "deduped", "repaired"] {
        counter!("compactor_tool_outputs_total", "action" => action).absolute(0);
    }
    for operation in ["load", "commit", "publish", "lock", "unlock"] {
        counter!("compactor_session_store_errors_total", "operation" => operation).absolute(0);
        counter!("compactor_session_store_skipped_total", "operation" => operation).absolute(0);
    }
    gauge!("compactor_session_store_breaker_open").set(0.0);
    counter!("compactor_session_store_breaker_trips_total").absolute(0);
    counter!("compactor_session_store_corrupt_total").absolute(0);
    for trigger in ["overflow", "threshold", "admin", "background"] {
        for outcome in ["summarized", "pruned", "failed"] {
            counter!("compactor_compactions_total", "trigger" => trigger, "outcome" => outcome).absolute(0);
        }
    }
    for rung in [
        "lower_max_tokens",
        "prune_hard",
        "summarize",
        "summarize_harder",
        "provider_compaction",
        "rebuild",
        "truncation",
    ] {
        counter!("compactor_recovery_rungs_total", "rung" => rung, "outcome" => "retry").absolute(0);
    }
    for outcome in ["recovered", "failed", "gave_up"] {
        counter!("compactor_recoveries_total", "outcome" => outcome).absolute(0);
    }
    for outcome in ["ok", "overflow", "failed"] {
        counter!("compactor_summary_calls_total", "outcome" => outcome).absolute(0);
    }
    counter!("compactor_futile_compactions_avoided_total").absolute(0);
    for outcome in ["started", "ready", "busy", "nothing", "failed", "used", "unneeded"] {
        counter!("compactor_background_summaries_total", "outcome" => outcome).absolute(0);
    }
    for outcome in ["sent", "failed", "moved_on"] {
        counter!("compactor_prefills_ahead_total", "outcome" => outcome).absolute(0);
    }
    for outcome in ["ready", "used", "unneeded"] {
        for direction in ["input", "output"] {
            counter!("compactor_background_summary_tokens_total", "outcome" => outcome, "direction" => direction)
                .absolute(0);
        }
    }
    let _registered = histogram!("compactor_summary_call_seconds");
    let _registered = histogram!("compactor_summary_calls_per_compaction");
    for direction in ["input", "output"] {
        counter!("compactor_summary_tokens_total", "direction" => direction).absolute(0);
    }
    gauge!("compactor_active_streams").set(0.0);
    gauge!("compactor_open_connections").set(0.0);
    for cache in CACHES {
        cache_size(cache, CacheSize::default());
    }
    counter!("compactor_connections_refused_total").absolute(0);
}
