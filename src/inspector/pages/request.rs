//! `/ui/sessions/{key}/c/{id}/r/{request}`: one request in full, with the content its changes
//! replaced when `inspector.keep_content` kept it.

use std::fmt::Write;

use http::StatusCode;

use super::{change_text, costs_text, not_found, parse, pricing, store_down};
use crate::config::Config;
use crate::inspector::cost;
use crate::inspector::html::{esc, num, page, respond, time};
use crate::proxy::ResponseBody;
use crate::proxy::record::RequestRecord;
use crate::session::Store;

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
