//! `/ui/sessions` and `/ui/sessions/{key}`: the sessions used last (or those of one agent session
//! id, filtered), and one session's figures and conversations.

use std::fmt::Write;

use http::StatusCode;

use super::{not_found, store_down};
use crate::inspector::html::{esc, num, page, respond, time};
use crate::proxy::ResponseBody;
use crate::session::identify::agent_session_hashes;
use crate::session::{ConversationView, SessionState, SessionView, Store};

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
