//! A conversation's compactions: what each replaced, its summary, what its summary calls cost,
//! and for one prepared in the background the story of the requests that started and applied it.

use std::fmt::Write;

use crate::inspector::cost;
use crate::inspector::html::{esc, num, time, url};
use crate::proxy::record::RequestRecord;
use crate::rewrite::CachePricing;
use crate::session::CompactionRecord;

/// The conversation's compactions, newest first: what each replaced, its summary and what its
/// summary calls cost; for one prepared in the background, the request that started it, when it
/// was ready and the request that applied it, or that none did.
pub(super) fn compactions(
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
            summary_cost(out, record, requests, &pricing);
        }
        let background = record.due_tokens > 0 || record.trigger == "background";
        if background {
            background_story(out, record, records, requests, carried_by, &link);
        } else if !record.started_by.is_empty() {
            let _ = write!(out, "<p class=\"made-by\">Made by request {}.</p>", link(&record.started_by));
        }
        let _ = write!(out, "<pre class=\"summary\">{}</pre></article>", esc(&record.summary));
    }
}

/// What a compaction's summary calls cost, under the cache prices of the family that asked for it.
fn summary_cost(
    out: &mut String,
    record: &CompactionRecord,
    requests: &[RequestRecord],
    pricing: &impl Fn(&str) -> CachePricing,
) {
    let family =
        requests.iter().find(|r| r.id == record.started_by).or(requests.last()).map_or("openai", |r| r.family.as_str());
    let c = &record.cost;
    let _ = write!(
        out,
        "<p class=\"summary-cost\">Summary calls cost {cost} base-price input tokens: {input} input tokens, {read} of them read from the cache; {output} output tokens{estimated}.{pace}</p>",
        cost = num(cost::summary(c, &pricing(family)).round() as u64),
        input = num(c.input),
        read = num(c.cache_read),
        output = num(c.output),
        estimated = if c.estimated { " (in part compactor's estimate: an answer reported no usage)" } else { "" },
        pace = match record.us_per_token {
            0 => String::new(),
            us => format!(" They took {:.1} ms per output token.", us as f64 / 1_000.0),
        },
    );
}

/// The story of a compaction prepared in the background: the request that started it, when it
/// was ready, and the request that applied it, or why none did.
fn background_story(
    out: &mut String,
    record: &CompactionRecord,
    records: &[CompactionRecord],
    requests: &[RequestRecord],
    carried_by: Option<&RequestRecord>,
    link: &impl Fn(&str) -> String,
) {
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
}
