//! `/ui/sessions/{key}/c/{id}`: a conversation's figures, plots and timeline of requests, and the
//! rows its live update polls for.

use std::fmt::Write;

use http::StatusCode;

use super::compactions::compactions;
use super::{change_text, costs_text, not_found, parse, pricing, store_down};
use crate::config::Config;
use crate::inspector::cost::{self, Costs};
use crate::inspector::html::{esc, num, page, respond, time, url};
use crate::inspector::plot::{Series, chart};
use crate::proxy::ResponseBody;
use crate::proxy::record::RequestRecord;
use crate::session::{ConversationView, Store};

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
    } else if !record.rungs.is_empty() {
        // A request of a chain recovered before (`rebuild:mapped`): it went the recovered way.
        parts.push(format!("<span class=\"overflow\">as recovered before: {}</span>", esc(&record.rungs.join(" → "))));
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
