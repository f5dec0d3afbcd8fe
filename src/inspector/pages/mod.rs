//! The pages: the list of sessions, a session with its conversations, a conversation with its
//! plots, compactions and timeline of requests, one request. Server-rendered; every value that
//! came from a client or a provider is escaped.
//!
//! One module per page: the list of sessions and a session (`sessions`), a conversation and its
//! live timeline (`conversation`), its compactions (`compactions`), one request (`request`); what
//! they share is here.

mod compactions;
mod conversation;
mod request;
mod sessions;

use crate::rewrite::ChangeKind;
use crate::route::ApiFamily;
use http::StatusCode;

pub use conversation::{conversation, new_rows, rows};
pub use request::request;
pub use sessions::{Filter, session, sessions};

use super::cost::Costs;
use super::html::num;
use crate::config::Config;
use crate::proxy::ResponseBody;
use crate::proxy::record::{Change, RequestRecord};
use crate::rewrite::CachePricing;

/// A failed store read, as a page.
pub(super) fn store_down(csrf: &str, error: impl std::fmt::Display) -> http::Response<ResponseBody> {
    super::html::message(StatusCode::SERVICE_UNAVAILABLE, Some(csrf), "Session store unavailable", &error.to_string())
}

/// The records of a conversation that parse, oldest first.
pub(super) fn parse(records: &[String]) -> Vec<RequestRecord> {
    records.iter().filter_map(|json| serde_json::from_str(json).ok()).collect()
}

/// The cache prices of an API family (by its name in a record), as configured; a name no family
/// has is priced as `openai`, the upstream of every other path.
pub(super) fn pricing(config: &Config) -> impl Fn(&str) -> CachePricing + '_ {
    let cache = config.upstream.cache_pricing();
    move |family: &str| *cache.get(ApiFamily::of_label(family).unwrap_or(ApiFamily::OpenAi))
}

pub(super) fn costs_text(cost: &Costs) -> String {
    match (cost.with, cost.without) {
        (Some(with), Some(without)) => format!("{} ({})", num(with.round() as u64), num(without.round() as u64)),
        _ => "–".into(),
    }
}

/// One change with its size: `16 pruned −4,992`, `summarized (generation 2) −5,646`.
pub(super) fn change_text(change: &Change) -> String {
    let saved = if change.tokens > 0 { format!(" −{}", num(u64::from(change.tokens))) } else { String::new() };
    match change.kind {
        ChangeKind::Summarized => format!("summarized (generation {}){saved}", change.items),
        kind => format!("{} {}{saved}", num(u64::from(change.items)), kind.label()),
    }
}

pub(super) fn not_found(csrf: &str, text: &str) -> http::Response<ResponseBody> {
    super::html::message(StatusCode::NOT_FOUND, Some(csrf), "Not found", text)
}
