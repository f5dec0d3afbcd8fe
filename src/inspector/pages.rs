//! The pages: the list of sessions, a session with its conversations, a conversation with its
//! plots, compactions and timeline of requests, one request. Server-rendered; every value that
//! came from a client or a provider is escaped.

use std::fmt::Write;

use http::StatusCode;

use super::cost::{self, Costs};
use super::html::{esc, num, page, respond, time, url};
use super::plot::{Series, chart};
use crate::config::Config;
use crate::proxy::ResponseBody;
use crate::proxy::record::{Change, RequestRecord};
use crate::rewrite::CachePricing;
use crate::session::identify::agent_session_hashes;
use crate::session::{CompactionRecord, ConversationView, SessionState, SessionView, Store};

/// Recent sessions the list looks through, and shows at most.
const LOOKED_AT: usize = 500;
const SHOWN: usize = 100;

/// What the list of sessions is narrowed to.
#[derive(Debug, Default)]
pub struct Filter {
    /// The agent's own session id.
    pub id: String,
    /// A tenant (the keyed hash of a credential), or the start of one.
    pub tenant: String,
    pub compacted: bool,
    pub overflow: bool,
    pub pruned: bool,
}

impl Filter {
    fn keeps(&self, key: &str, state: &SessionState) -> bool {
        let counters = &state.counters;
        (self.tenant.is_empty() || key.split_once('.').is_some_and(|(tenant, _)| tenant.starts_with(&self.tenant)))
            && (!self.compacted || counters.compacted_requests > 0)
            && (!self.overflow || counters.overflow_requests > 0)
            && (!self.pruned || counters.pruned_requests > 0)
    }
}

/// A failed store read, as a page.
fn store_down(csrf: &str, error: impl std::fmt::Display) -> http::Response<ResponseBody> {
    super::html::message(StatusCode::SERVICE_UNAVAILABLE, Some(csrf), "Session store unavailable", &error.to_string())
}

/// `/ui/sessions`: the most recently used sessions, or those of one agent session id.
pub async fn sessions(store: &Store, filter: &Filter, csrf: &str) -> http::Response<ResponseBody> {
    let candidates: Vec<(String, Option<u64>)> = if filter.id.trim().is_empty() {
        match store.recent(LOOKED_AT).await {
            Ok(recent) => recent.into_iter().map(|(key, at)| (key, Some(at))).collect(),
            Err(error) => return store_down(csrf, error),
        }
    } else {
        let mut keys = Vec::new();
        for (_, hash) in agent_session_hashes(filter.id.trim()) {
            match store.find(&hash).await {
                Ok(found) => keys.extend(found.into_iter().map(|key| (key, None))),
                Err(error) => return store_down(csrf, error),
            }
        }
        keys
    };
    let keys: Vec<String> = candidates.iter().map(|(key, _)| key.clone()).collect();
    let states = match store.sessions(&keys).await {
        Ok(states) => states,
        Err(error) => return store_down(csrf, error),
    };
    let mut rows = String::new();
    let mut shown = 0;
    for ((key, at), state) in candidates.iter().zip(&states) {
        if state.counters.requests == 0 || !filter.keeps(key, state) {
            continue; // expired, forgotten, or filtered out
        }
        shown += 1;
        if shown > SHOWN {
            break;
        }
        let c = &state.counters;
        let tenant = key.split_once('.').map_or("", |(tenant, _)| tenant);
        let ratio = (c.prompt_tokens > 0).then(|| c.cache_read_tokens as f64 / c.prompt_tokens as f64);
        let _ = write!(
            rows,
            "<tr><td><a class=\"session\" href=\"/ui/sessions/{k}\">{k}</a></td><td class=\"mono\">{t}</td><td>{last}</td><td class=\"n\">{req}</td><td class=\"n\">{saved}</td><td class=\"n\">{pr}</td><td class=\"n\">{co}</td><td class=\"n\">{ov}</td><td class=\"n\">{hit}</td></tr>",
            k = esc(key),
            t = esc(tenant),
            last = at.map(time).unwrap_or_default(),
            req = num(c.requests),
            saved = num(c.tokens_saved),
            pr = num(c.pruned_requests),
            co = num(c.compacted_requests),
            ov = num(c.overflow_requests),
            hit = ratio.map(|r| format!("{:.0} %", r * 100.0)).unwrap_or_else(|| "–".into()),
        );
    }
    let check = |on: bool| if on { " checked" } else { "" };
    let mut body = String::new();
    body.push_str("<h1>Sessions</h1>");
    let _ = write!(
        body,
        "<form class=\"filters\" method=\"get\" action=\"/ui/sessions\"><label>Agent session id <input name=\"id\" value=\"{}\" placeholder=\"the id your agent shows\"></label> <label>Tenant <input name=\"tenant\" value=\"{}\" size=\"18\"></label> <label><input type=\"checkbox\" name=\"compacted\" value=\"1\"{}> compacted</label> <label><input type=\"checkbox\" name=\"overflow\" value=\"1\"{}> recovered an overflow</label> <label><input type=\"checkbox\" name=\"pruned\" value=\"1\"{}> pruned</label> <button>Show</button></form>",
        esc(&filter.id),
        esc(&filter.tenant),
        check(filter.compacted),
        check(filter.overflow),
        check(filter.pruned)
    );
    if shown == 0 {
        body.push_str("<p class=\"empty\">No session matches.</p>");
    } else {
        body.push_str("<table class=\"list\"><thead><tr><th>Session</th><th>Tenant</th><th>Last request (UTC)</th><th>Requests</th><th>Tokens saved</th><th>Pruned</th><th>Compacted</th><th>Overflows</th><th>Cache hits</th></tr></thead><tbody>");
        body.push_str(&rows);
        body.push_str("</tbody></table>");
        if shown > SHOWN {
            let _ = write!(body, "<p class=\"note\">The first {SHOWN} are shown; narrow the filters for others.</p>");
        }
    }
    if filter.id.trim().is_empty() {
        let _ =
            write!(body, "<p class=\"note\">Most recently used first, of the {LOOKED_AT} most recent sessions.</p>");
    }
    respond(StatusCode::OK, page("Sessions", Some(csrf), &body))
}

/// `/ui/sessions/{key}`: the session's figures and its conversations.
pub async fn session(store: &Store, key: &str, csrf: &str) -> http::Response<ResponseBody> {
    let view = match store.view(key).await {
        Ok(view) if view.is_empty() => return not_found(csrf, "No such session (it may have expired)."),
        Ok(view) => view,
        Err(error) => return store_down(csrf, error),
    };
    let mut body = String::new();
    let _ = write!(body, "<p class=\"crumbs\"><a href=\"/ui/sessions\">Sessions</a> › {}</p>", esc(key));
    let _ = write!(body, "<h1>Session <span class=\"mono\">{}</span></h1>", esc(key));
    body.push_str(&session_figures(&view));
    let _ = write!(
        body,
        "<div class=\"actions\"><form method=\"post\" action=\"/ui/sessions/{k}/compact\"><input type=\"hidden\" name=\"csrf\" value=\"{c}\"><button>Compact on next request</button></form><form method=\"post\" action=\"/ui/sessions/{k}/forget\"><input type=\"hidden\" name=\"csrf\" value=\"{c}\"><button class=\"danger\">Forget session</button></form></div>",
        k = esc(key),
        c = esc(csrf)
    );
    body.push_str("<h2>Conversations</h2><table class=\"list\"><thead><tr><th>Conversation</th><th>Last used (UTC)</th><th>Requests</th><th>Messages</th><th>Pruned outputs</th><th>Compactions</th><th>Last prompt</th></tr></thead><tbody>");
    for conversation in &view.conversations {
        conversation_row(&mut body, key, conversation);
    }
    body.push_str("</tbody></table>");
    respond(StatusCode::OK, page(&format!("Session {key}"), Some(csrf), &body))
}

fn session_figures(view: &SessionView) -> String {
    let c = &view.session.counters;
    let mut out = String::from("<dl class=\"figures\">");
    let mut figure = |name: &str, value: String| {
        let _ = write!(out, "<div><dt>{}</dt><dd>{}</dd></div>", esc(name), esc(&value));
    };
    figure("requests", num(c.requests));
    figure("tokens saved", num(c.tokens_saved));
    figure("requests that pruned", num(c.pruned_requests));
    figure("on a compaction", num(c.compacted_requests));
    figure("overflows recovered", num(c.overflow_requests));
    figure(
        "cache hit ratio",
        view.cache_hit_ratio.map(|r| format!("{:.1} %", r * 100.0)).unwrap_or_else(|| "–".into()),
    );
    figure("learned window", if c.learned.window > 0 { num(c.learned.window) } else { "–".into() });
    figure("compaction requested", if c.compact_requested > 0 { "yes".into() } else { "no".into() });
    out.push_str("</dl>");
    out
}

fn conversation_row(out: &mut String, key: &str, conversation: &ConversationView) {
    let state = &conversation.state;
    let _ = write!(
        out,
        "<tr><td><a class=\"conversation\" href=\"/ui/sessions/{k}/c/{id}\">{id}</a></td><td>{last}</td><td class=\"n\">{req}</td><td class=\"n\">{msg}</td><td class=\"n\">{pr}</td><td class=\"n\">{co}</td><td class=\"n\">{usage}</td></tr>",
        k = esc(key),
        id = esc(&conversation.id),
        last = time(conversation.last_used_unix_ms),
        req = num(state.requests),
        msg = num(state.messages),
        pr = num(conversation.pruned_count as u64),
        co = num(state.compactions.len() as u64),
        usage = state.usage.map(|u| num(u.prompt_tokens)).unwrap_or_else(|| "–".into()),
    );
}

/// The records of a conversation that parse, oldest first.
fn parse(records: &[String]) -> Vec<RequestRecord> {
    records.iter().filter_map(|json| serde_json::from_str(json).ok()).collect()
}

/// The cache prices of an API family, as configured.
fn pricing(config: &Config) -> impl Fn(&str) -> CachePricing + '_ {
    move |family: &str| match family {
        "anthropic" => config.upstream.anthropic_cache,
        "gemini" => config.upstream.gemini_cache,
        _ => config.upstream.openai_cache,
    }
}

/// `/ui/sessions/{key}/c/{id}`: a conversation's plots, compactions and timeline.
pub async fn conversation(
    config: &Config,
    store: &Store,
    key: &str,
    id: &str,
    csrf: &str,
) -> http::Response<ResponseBody> {
    let (view, records) = match (store.view(key).await, store.requests(key, id).await) {
        (Ok(view), Ok(records)) => (view, parse(&records)),
        (Err(error), _) | (_, Err(error)) => return store_down(csrf, error),
    };
    let Some(conversation) = view.conversations.iter().find(|c| c.id == id) else {
        return not_found(csrf, "No such conversation in this session (it may have expired).");
    };
    let costs = cost::of(&records, pricing(config));
    let compaction_records = &conversation.state.compactions;
    let summary_costs = cost::summaries(&records, compaction_records, pricing(config));
    let mut body = String::new();
    let _ = write!(
        body,
        "<p class=\"crumbs\"><a href=\"/ui/sessions\">Sessions</a> › <a href=\"/ui/sessions/{k}\">{k}</a> › {id}</p><h1>Conversation <span class=\"mono\">{id}</span></h1>",
        k = esc(key),
        id = esc(id)
    );
    conversation_figures(&mut body, conversation, &records, &costs, &summary_costs);
    if records.is_empty() {
        body.push_str(
            "<p class=\"empty\">No requests recorded for this conversation (recording is off, or they expired).</p>",
        );
    } else {
        plots(&mut body, &records, &costs, &summary_costs);
    }
    compactions(&mut body, (key, id), compaction_records, &records, pricing(config));
    let _ = write!(
        body,
        "<h2>Requests</h2><p class=\"note\">Newest first; sizes are compactor's estimates, usage is the provider's. <span id=\"live-status\"></span></p><table class=\"list timeline\"><thead><tr><th>#</th><th>Time (UTC)</th><th>Route · model</th><th>Status</th><th>Sent</th><th>Forwarded</th><th>What changed</th><th>Cache read / written</th><th>Cost (unchanged)</th></tr></thead><tbody id=\"timeline\" data-live=\"/ui/sessions/{k}/c/{id}/rows\" data-seen=\"{seen}\">",
        k = esc(key),
        id = esc(id),
        seen = esc(records.last().map_or("", |r| r.id.as_str()))
    );
    body.push_str(&rows(key, id, &records, &costs, 0));
    body.push_str("</tbody></table>");
    respond(StatusCode::OK, page(&format!("Conversation {id}"), Some(csrf), &body))
}

/// The timeline rows, newest first, of the records from the `from`th on (numbered from 1).
pub fn rows(key: &str, id: &str, records: &[RequestRecord], costs: &[Costs], from: usize) -> String {
    let mut out = String::new();
    for (n, (record, cost)) in records.iter().zip(costs).enumerate().skip(from).rev() {
        let changes = describe(record);
        let _ = write!(
            out,
            "<tr class=\"request{cls}\" data-id=\"{rid}\"><td class=\"n\"><a href=\"/ui/sessions/{k}/c/{c}/r/{ridu}\">{n}</a></td><td>{at}</td><td>{route} · <span class=\"mono\">{model}</span></td><td>{status}</td><td class=\"n\">{sent}</td><td class=\"n\">{fwd}</td><td class=\"changes\">{changes}</td><td class=\"n\">{read} / {write}</td><td class=\"n\">{cost}</td></tr>",
            cls = if record.status >= 400 { " failed" } else { "" },
            rid = esc(&record.id),
            ridu = url(&record.id),
            k = esc(key),
            c = esc(id),
            n = if record.n > 0 { record.n } else { n as u64 + 1 },
            at = time(record.at),
            route = esc(&record.route),
            model = esc(&record.model),
            status = record.status,
            sent = num(u64::from(record.sent)),
            fwd = num(u64::from(record.forwarded)),
            read = num(record.cache_read),
            write = num(record.cache_write),
            cost = costs_text(cost),
        );
    }
    out
}

fn costs_text(cost: &Costs) -> String {
    match (cost.with, cost.without) {
        (Some(with), Some(without)) => format!("{} ({})", num(with.round() as u64), num(without.round() as u64)),
        _ => "–".into(),
    }
}

/// One change with its size: `16 pruned −4,992`, `summarized (generation 2) −5,646`.
fn change_text(change: &Change) -> String {
    let saved = if change.tokens > 0 { format!(" −{}", num(u64::from(change.tokens))) } else { String::new() };
    match change.kind.as_str() {
        "summarized" => format!("summarized (generation {}){saved}", change.items),
        kind => format!("{} {kind}{saved}", num(u64::from(change.items))),
    }
}

/// What changed in a request, in a line: each change with its size, the reason, the overflow.
fn describe(record: &RequestRecord) -> String {
    let mut parts: Vec<String> = record.changes.iter().map(|change| esc(&change_text(change))).collect();
    if let Some(reason) = &record.reason {
        parts.push(format!("<span class=\"reason\">because: {}</span>", esc(reason)));
    }
    if let Some(overflow) = &record.overflow {
        parts.push(format!(
            "<span class=\"overflow\">overflow {}: {}</span>",
            esc(overflow),
            esc(&record.rungs.join(" → "))
        ));
    }
    if record.held > 0 {
        parts.push(esc(&format!("{} held back", num(u64::from(record.held)))));
    }
    if parts.is_empty() { "–".into() } else { parts.join("; ") }
}

/// The conversation's figures; `summary_costs`: its summary calls' costs, by the request each
/// lands on ([`cost::summaries`]), part of the cost with compactor.
fn conversation_figures(
    out: &mut String,
    conversation: &ConversationView,
    records: &[RequestRecord],
    costs: &[Costs],
    summary_costs: &[f64],
) {
    let state = &conversation.state;
    let sent: u64 = records.iter().map(|r| u64::from(r.sent)).sum();
    let forwarded: u64 = records.iter().map(|r| u64::from(r.forwarded)).sum();
    let summaries: f64 = summary_costs.iter().sum();
    let summary_output: u64 = state.compactions.iter().map(|c| c.cost.output).sum();
    let with: f64 = costs.iter().filter_map(|c| c.with).sum::<f64>() + summaries;
    let without: f64 = costs.iter().filter_map(|c| c.without).sum();
    out.push_str("<dl class=\"figures\">");
    let mut figure = |name: &str, value: String| {
        let _ = write!(out, "<div><dt>{}</dt><dd>{}</dd></div>", esc(name), esc(&value));
    };
    figure("requests", num(state.requests));
    figure("recorded", num(records.len() as u64));
    figure("messages (newest request)", num(state.messages));
    figure("pruned outputs", num(conversation.pruned_count as u64));
    figure("compactions", num(state.compactions.len() as u64));
    figure("tokens sent / forwarded", format!("{} / {}", num(sent), num(forwarded)));
    figure("cost with compactor", num(with.round() as u64));
    figure("of it, summary calls", num(summaries.round() as u64));
    figure("summary output tokens", num(summary_output));
    figure("cost unchanged (estimate)", num(without.round() as u64));
    out.push_str("</dl>");
}

fn plots(out: &mut String, records: &[RequestRecord], costs: &[Costs], summary_costs: &[f64]) {
    let tokens = [
        Series {
            label: "sent",
            colour: "#c0392b",
            dashed: false,
            values: records.iter().map(|r| f64::from(r.sent)).collect(),
        },
        Series {
            label: "forwarded",
            colour: "#2471a3",
            dashed: false,
            values: records.iter().map(|r| f64::from(r.forwarded)).collect(),
        },
        Series {
            label: "window",
            colour: "#333333",
            dashed: true,
            values: records.iter().map(|r| r.window as f64).collect(),
        },
        Series {
            label: "compaction threshold",
            colour: "#b9770e",
            dashed: true,
            values: records.iter().map(|r| r.threshold as f64).collect(),
        },
    ];
    let whole = |v: f64| num(v.round() as u64);
    out.push_str("<section class=\"plots\">");
    out.push_str(&chart("plot-tokens", "Tokens per request: sent and forwarded", &tokens, 0.0, whole));
    let mut running = (0.0, 0.0);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for (cost, summaries) in costs.iter().zip(summary_costs) {
        running.0 += cost.with.unwrap_or(0.0) + summaries;
        running.1 += cost.without.unwrap_or(0.0);
        with.push(running.0);
        without.push(running.1);
    }
    let cumulative = [
        Series { label: "with compactor", colour: "#2471a3", dashed: false, values: with },
        Series { label: "unchanged (estimate)", colour: "#c0392b", dashed: false, values: without },
    ];
    out.push_str(&chart("plot-cost", "Cumulative cost (base-price input tokens)", &cumulative, 0.0, whole));
    let ratio: Vec<f64> = records
        .iter()
        .map(|r| if r.prompt > 0 { r.cache_read as f64 / r.prompt as f64 * 100.0 } else { 0.0 })
        .collect();
    let hits = [Series { label: "cache hit ratio", colour: "#1e8449", dashed: false, values: ratio }];
    out.push_str(&chart("plot-cache", "Cache hit ratio per request (%)", &hits, 100.0, |v| format!("{v:.0}")));
    out.push_str("</section>");
}

/// The conversation's compactions, newest first: what each replaced, its summary and what its
/// summary calls cost; for one prepared in the background, the request that started it, when it
/// was ready and the request that applied it, or that none did.
fn compactions(
    out: &mut String,
    (key, id): (&str, &str),
    records: &[CompactionRecord],
    requests: &[RequestRecord],
    pricing: impl Fn(&str) -> CachePricing,
) {
    out.push_str("<h2>Compactions</h2>");
    if records.is_empty() {
        out.push_str("<p class=\"empty\">None.</p>");
        return;
    }
    let link = |request_id: &str| match requests.iter().position(|r| r.id == request_id) {
        Some(at) => format!(
            "<a class=\"request\" href=\"/ui/sessions/{k}/c/{c}/r/{ridu}\">#{n} <span class=\"mono\">{rid}</span></a>",
            k = esc(key),
            c = esc(id),
            ridu = url(request_id),
            n = if requests[at].n > 0 { requests[at].n } else { at as u64 + 1 },
            rid = esc(request_id),
        ),
        None => format!("<span class=\"mono\">{}</span>", esc(request_id)),
    };
    for record in records.iter().rev() {
        // The first request to carry its generation: the one that made it or applied it.
        let carried_by = requests.iter().find(|r| r.compacted == Some(record.generation));
        let calls = match (record.cost.calls, carried_by) {
            (0, Some(request)) => request.summary_calls.to_string(),
            (0, None) => "–".to_string(),
            (calls, _) => calls.to_string(),
        };
        let _ = write!(
            out,
            "<article class=\"compaction\" id=\"generation-{g}\"><h3>Generation {g} · {trigger} · {at}</h3><p>Replaced messages 1–{covered} ({before} → {after} tokens); kept from message {kept}; summarized by <span class=\"mono\">{model}</span>; summary calls: {calls}.</p>",
            g = record.generation,
            trigger = esc(&record.trigger),
            at = time(record.at_unix_ms),
            covered = num(record.covered_messages),
            before = num(record.tokens_before),
            after = num(record.tokens_after),
            kept = num(record.first_kept + 1),
            model = esc(&record.model),
            calls = esc(&calls),
        );
        if !record.cost.is_empty() {
            let family = requests
                .iter()
                .find(|r| r.id == record.started_by)
                .or(requests.last())
                .map_or("openai", |r| r.family.as_str());
            let c = &record.cost;
            let _ = write!(
                out,
                "<p class=\"summary-cost\">Summary calls cost {cost} base-price input tokens: {input} input tokens, {read} of them read from the cache; {output} output tokens{estimated}.{pace}</p>",
                cost = num(cost::summary(c, &pricing(family)).round() as u64),
                input = num(c.input),
                read = num(c.cache_read),
                output = num(c.output),
                estimated =
                    if c.estimated { " (in part compactor's estimate: an answer reported no usage)" } else { "" },
                pace = match record.us_per_token {
                    0 => String::new(),
                    us => format!(" They took {:.1} ms per output token.", us as f64 / 1_000.0),
                },
            );
        }
        let background = record.due_tokens > 0 || record.trigger == "background";
        if background {
            out.push_str("<p class=\"background\">Prepared in the background: ");
            if !record.started_by.is_empty() {
                let _ = write!(out, "started by request {}, ", link(&record.started_by));
            }
            let _ = write!(out, "ready at {}; ", time(record.at_unix_ms));
            let replaced_by = records.iter().find(|r| r.generation > record.generation);
            // Whether the recorded requests reach back to it (the log is bounded).
            let seen = requests.first().is_some_and(|r| r.at <= record.at_unix_ms);
            let built_upon = records.iter().find(|r| r.built_on == record.generation);
            match (carried_by, replaced_by) {
                (Some(request), _) => {
                    let _ = write!(out, "applied by request {} at {}.", link(&request.id), time(request.at));
                }
                // Applied by a request that at once summarized further on top of it.
                (None, _) if built_upon.is_some_and(|later| !later.started_by.is_empty()) => {
                    let later = built_upon.map_or(0, |r| r.generation);
                    let by = built_upon.map_or("", |r| r.started_by.as_str());
                    let _ = write!(
                        out,
                        "applied by request {}, which summarized further on top of it (generation {later}).",
                        link(by)
                    );
                }
                (None, Some(later)) if seen => {
                    let _ = write!(
                        out,
                        "never needed: replaced by generation {} ({}) before any request applied it, its summary calls spent for nothing.",
                        later.generation,
                        esc(&later.trigger)
                    );
                }
                (None, Some(_)) => out.push_str("no recorded request applied it."),
                (None, None) => {
                    let _ = write!(
                        out,
                        "not needed yet: foreseen for when the conversation passes about {} tokens, it waits for the request that needs a compaction (a conversation that ends first never needs it).",
                        num(record.due_tokens)
                    );
                }
            }
            out.push_str("</p>");
        } else if !record.started_by.is_empty() {
            let _ = write!(out, "<p class=\"made-by\">Made by request {}.</p>", link(&record.started_by));
        }
        let _ = write!(out, "<pre class=\"summary\">{}</pre></article>", esc(&record.summary));
    }
}

/// `/ui/sessions/{key}/c/{id}/r/{request}`: one request in full.
pub async fn request(
    config: &Config,
    store: &Store,
    key: &str,
    id: &str,
    request_id: &str,
    csrf: &str,
) -> http::Response<ResponseBody> {
    let records = match store.requests(key, id).await {
        Ok(records) => parse(&records),
        Err(error) => return store_down(csrf, error),
    };
    let costs = cost::of(&records, pricing(config));
    let Some(at) = records.iter().position(|r| r.id == request_id) else {
        return not_found(csrf, "No such request recorded in this conversation.");
    };
    let (record, cost) = (&records[at], costs[at]);
    let mut body = String::new();
    let _ = write!(
        body,
        "<p class=\"crumbs\"><a href=\"/ui/sessions\">Sessions</a> › <a href=\"/ui/sessions/{k}\">{k}</a> › <a href=\"/ui/sessions/{k}/c/{c}\">{c}</a> › {r}</p><h1>Request <span class=\"mono\">{r}</span></h1><table class=\"detail\">",
        k = esc(key),
        c = esc(id),
        r = esc(request_id)
    );
    let mut row = |name: &str, value: String| {
        let _ = write!(body, "<tr><th>{}</th><td>{}</td></tr>", esc(name), value);
    };
    row("time (UTC)", time(record.at));
    row("route · model", format!("{} · {} ({})", esc(&record.route), esc(&record.model), esc(&record.family)));
    row(
        "status",
        format!(
            "{} ({}){}",
            record.status,
            esc(&record.outcome),
            record.error.as_deref().map(|e| format!(", compactor: {}", esc(e))).unwrap_or_default()
        ),
    );
    row("upstream time", format!("{} ms", num(record.upstream_ms)));
    row(
        "tokens sent → forwarded",
        format!(
            "{} → {} (−{})",
            num(u64::from(record.sent)),
            num(u64::from(record.forwarded)),
            num(u64::from(record.saved()))
        ),
    );
    row("window · compaction threshold", format!("{} · {}", num(record.window), num(record.threshold)));
    let changes: String = record.changes.iter().map(|c| format!("<li>{} tokens</li>", esc(&change_text(c)))).collect();
    row("what changed", if changes.is_empty() { "nothing".into() } else { format!("<ul>{changes}</ul>") });
    row("reason", record.reason.as_deref().map(esc).unwrap_or_else(|| "–".into()));
    let ids: Vec<String> = record.pruned_ids.iter().map(|id| format!("<code>{}</code>", esc(id))).collect();
    row("pruned call ids (first)", if ids.is_empty() { "–".into() } else { ids.join(" ") });
    row("held back", num(u64::from(record.held)));
    row("compaction applied", record.compacted.map(|g| format!("generation {g}")).unwrap_or_else(|| "–".into()));
    row("overflow", record.overflow.as_deref().map(esc).unwrap_or_else(|| "–".into()));
    row("rungs", if record.rungs.is_empty() { "–".into() } else { esc(&record.rungs.join(" → ")) });
    row(
        "background summary",
        match record.background_skipped.as_deref() {
            Some("capacity") => "not prepared: compaction.background_max_inflight reached".into(),
            Some(other) => format!("not prepared: {}", esc(other)),
            None => "–".into(),
        },
    );
    row("retries", record.retries.to_string());
    row("summary calls", format!("{} ({} ms)", record.summary_calls, num(record.summary_ms)));
    row("provider prompt tokens", num(record.prompt));
    row("cache read / written", format!("{} / {}", num(record.cache_read), num(record.cache_write)));
    row("output tokens", num(record.output));
    row("cost (base-price input tokens)", costs_text(&cost));
    body.push_str("</table><p class=\"note\">Cost: the provider's usage under the upstream's cache prices; in brackets, the same request forwarded unchanged (an estimate).</p>");
    content(&mut body, record);
    respond(StatusCode::OK, page(&format!("Request {request_id}"), Some(csrf), &body))
}

/// The rows recorded after `seen` (a request id), newest first: the live update's poll. Empty
/// when nothing is new.
pub async fn new_rows(
    config: &Config,
    store: &Store,
    key: &str,
    id: &str,
    seen: &str,
) -> Result<(String, String), String> {
    let records = store.requests(key, id).await.map_err(|e| e.to_string())?;
    let records = parse(&records);
    let costs = cost::of(&records, pricing(config));
    let from = records.iter().position(|r| r.id == seen).map_or(0, |at| at + 1);
    let newest = records.last().map(|r| r.id.clone()).unwrap_or_default();
    Ok((rows(key, id, &records, &costs, from), newest))
}

fn not_found(csrf: &str, text: &str) -> http::Response<ResponseBody> {
    super::html::message(StatusCode::NOT_FOUND, Some(csrf), "Not found", text)
}

/// The content a request's changes replaced, when `inspector.keep_content` kept it.
fn content(body: &mut String, record: &RequestRecord) {
    if record.content.is_empty() && record.content_omitted == 0 {
        return;
    }
    body.push_str("<h2>Content changed</h2><p class=\"note\">Kept because <code>inspector.keep_content</code> is on: the start of each replaced or removed item as sent, newest first, within <code>inspector.content_bytes</code>.</p><table class=\"detail content\">");
    for change in &record.content {
        let now = match &change.now {
            Some(now) => format!("<pre>{}</pre>", esc(now)),
            None => "left out".into(),
        };
        let _ = write!(
            body,
            "<tr><th>message {}{}</th><td>sent ({} bytes):<pre>{}</pre>forwarded:{}</td></tr>",
            change.message,
            change.call_id.as_deref().map(|id| format!(" · <code>{}</code>", esc(id))).unwrap_or_default(),
            num(u64::from(change.was_bytes)),
            esc(&change.was),
            now
        );
    }
    body.push_str("</table>");
    if record.content_omitted > 0 {
        let _ = write!(body, "<p class=\"note\">{} more changed items past the bound.</p>", record.content_omitted);
    }
}
