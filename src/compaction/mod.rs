//! Compaction: keep each conversation inside its model's window. [`Compactor`] is what the proxy
//! asks, at the two moments it has: before forwarding ([`Compactor::prepare`]: identify the
//! session and the conversation inside it, load their state, re-apply a stored summary, run the
//! rewrite policies, compact before the overflow) and after an overflow ([`Compactor::recover`]:
//! the next rung of the ladder). It is given the request's head and bytes and gives bytes back; it
//! knows nothing of HTTP bodies or of the proxy.
//!
//! Inside: `prepare` (the steps before forwarding), `before_overflow` (a compaction at the
//! threshold or an operator's request), `background` (the next summary prepared off the request's
//! path, and the prefill of a prepared one), `recover` (the rungs after an overflow), `request`
//! (one request's state) and `ladder` (its rungs), `window` and `budget` (window, threshold and
//! breaker arithmetic), `engine` (the body a request goes as, and one compaction) with `lock` (one
//! compaction per conversation, across replicas) and `summarizer` (the summary call), `plan`
//! (where to cut and the rebuilt conversation; pure), `agent` (the agents' own compaction
//! requests, which compactor leaves alone), `decision` (the decisions, as the metrics name them).

pub mod agent;
mod background;
mod before_overflow;
mod budget;
pub mod decision;
mod engine;
pub mod ladder;
mod lock;
pub mod plan;
mod prefill;
mod prepare;
mod quiet;
mod recover;
pub mod request;
mod stateful;
pub mod summarizer;
mod window;
pub mod window_probe;

use std::sync::Arc;

use bytes::Bytes;

use crate::config::Config;
use crate::dialect::Dialect;
use crate::dialect::prefix::PrefixCache;
use crate::inflight::InflightBodies;
use crate::rewrite::{CachePricing, Reason, RewriteReport, RewriteSettings, Rewriter};
use crate::route::ApiFamily;
use crate::session::{ConversationId, SessionKey};
use crate::session::{Identifier, SessionCtx, Store};
use crate::telemetry::metric;
use crate::tokens::TokenCounter;
use crate::upstream::Upstreams;
use crate::work;

pub use crate::config::compaction::CompactionSettings;
pub use crate::rewrite::{Estimated, ProviderTokens};
pub use budget::Pressure;
use decision::{BackgroundOutcome, Untouched};
use engine::Engine;
pub use engine::NoCompaction;
pub use ladder::Recovery;
pub use request::RequestState;
pub use summarizer::{Summarizer, SummaryError};

/// The request's compaction state under the name the proxy knows it by.
pub type Ladder = RequestState;

/// What compaction needs, built once at start and shared by every request.
pub struct Compactor {
    /// Shared with the summaries prepared in the background.
    settings: Arc<CompactionSettings>,
    /// `settings.agent_markers`, compiled once.
    agent_markers: agent::AgentMarkers,
    rewriter: Arc<Rewriter>,
    identifier: Identifier,
    /// Each conversation's last parse, so the next turn parses only what it added.
    prefixes: PrefixCache,
    store: Store,
    summarizer: Arc<Summarizer>,
    /// Requests of each conversation whose summaries are prefilled ahead, as they arrive.
    arrivals: prefill::Arrivals,
    /// What tells a request with nothing to decide, learned from the windows sessions work with.
    quiet: quiet::Quiet,
    /// The request body bytes held at once (`limits.max_inflight_body_bytes`): by requests, and
    /// by the summaries prepared in the background, which outlive theirs.
    inflight: InflightBodies,
    /// Places for summaries prepared in the background (`compaction.background_max_inflight`).
    background_slots: Arc<tokio::sync::Semaphore>,
    /// Where a stateful chain is read back from (`stateful`).
    upstreams: Arc<Upstreams>,
    /// The stateful rungs of the `openai` and `azure` upstreams (`upstream.*_stateful`).
    stateful: StatefulOrders,
    /// The most bytes one page of a chain read back may take (`limits.max_body_bytes`).
    chain_limit: usize,
    /// Whether a local server is asked for its window (`upstream.ask_local_window`), and what
    /// the servers stated.
    ask_local_window: bool,
    stated_windows: window_probe::StatedWindows,
}

/// The stateful rungs of each upstream that serves Responses.
struct StatefulOrders {
    openai: Vec<crate::config::stateful::StatefulRung>,
    azure: Vec<crate::config::stateful::StatefulRung>,
}

/// A request as compactor sends it.
pub struct Prepared {
    pub body: Bytes,
    /// The session the request belongs to, when compactor identified one.
    pub session: Option<SessionKey>,
    /// The conversation inside the session, when compactor keeps state for it.
    pub conversation: Option<ConversationId>,
    /// The rewrite of `body`, in compactor's estimates.
    pub report: Option<RewriteReport>,
    /// The same rewrite's sizes in the provider's tokens: what the headers, the log and the
    /// inspector show.
    pub sizes: Option<ProviderSizes>,
    /// The compaction generation applied to `body`.
    pub compacted: Option<u32>,
    /// The session's state for this request, when it was loaded; to commit once the response is done.
    /// Boxed, as is the request's state: a `Prepared` passes through the request's scopes by value, and
    /// each move copied both (2.3 KB, several times a request) where a box moves as a pointer.
    pub ctx: Option<Box<SessionCtx>>,
    /// The request's compaction state, to recover from an overflow with; `None` when compactor
    /// must not retry this request.
    pub ladder: Option<Box<RequestState>>,
    /// Held until the request is answered: a summary this request starts in the background waits
    /// for it to be dropped (see [`AnsweredGate`]).
    pub answered: Option<AnsweredGate>,
}

/// A rewrite's sizes in the provider's tokens (compactor's estimates calibrated by what the session
/// measured of the provider's tokenizer): the request as the client sent it and as it goes, and
/// what each kind of change took off, so the inspector's changes add up to the difference.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProviderSizes {
    pub before: u32,
    pub after: u32,
    pub saved_by_prune: u32,
    pub saved_by_truncate: u32,
    pub saved_by_dedupe: u32,
}

impl ProviderSizes {
    /// `report`'s sizes under `pressure`'s calibration.
    pub fn of(pressure: &Pressure, report: &RewriteReport) -> Self {
        let calibrated = |tokens: u32| pressure.calibrated(crate::rewrite::Estimated::from(tokens)).as_u32();
        Self {
            before: calibrated(report.tokens_before),
            after: calibrated(report.tokens_after),
            saved_by_prune: calibrated(report.saved_by_prune),
            saved_by_truncate: calibrated(report.saved_by_truncate),
            saved_by_dedupe: calibrated(report.saved_by_dedupe),
        }
    }
}

/// Dropped when the request that started a background summary has been answered: the summary's
/// call waits for it, so a server that answers one request at a time (a local llama.cpp) writes
/// the summary while the agent runs its tool, not in front of the answer the agent waits for.
pub struct AnsweredGate(#[allow(dead_code)] tokio::sync::oneshot::Sender<()>);

#[cfg(test)]
impl AnsweredGate {
    /// A gate whose drop closes `sender`'s receiver.
    pub fn of(sender: tokio::sync::oneshot::Sender<()>) -> Self {
        Self(sender)
    }
}

impl Prepared {
    pub(crate) fn untouched(body: Bytes) -> Self {
        Self {
            body,
            session: None,
            conversation: None,
            report: None,
            sizes: None,
            compacted: None,
            ctx: None,
            ladder: None,
            answered: None,
        }
    }
}

/// What to do after an overflow.
#[derive(Debug)]
pub enum Next {
    /// Send this body instead (`report`: its rewrite, when the policies produced it).
    Retry { body: Bytes, report: Option<RewriteReport> },
    /// Nothing more to try: the client gets the upstream's first error, unchanged.
    GiveUp,
}

/// A request whose rewrite ran out of budget (or whose client left): it goes as it came.
fn over_budget(route: &'static str, stopped: work::Stopped, body: Bytes) -> Prepared {
    if stopped == work::Stopped::OverBudget {
        metric::rewrite_skipped(route, Untouched::OverBudget.label());
        tracing::warn!(route, bytes = body.len(), "rewrite budget spent: forwarding the request as it came");
    }
    Prepared::untouched(body)
}

/// A body rebuilt around a new summary: the provider's cached prefix ends at the summary.
fn with_summary_break((body, mut report): (Bytes, RewriteReport)) -> (Bytes, RewriteReport) {
    report.prefix_break = Some(Reason::Summary);
    (body, report)
}

/// A summary prepared in the background applied by the request that needed it: counted, with
/// what its calls cost.
fn count_used(record: &crate::session::CompactionRecord) {
    let used = BackgroundOutcome::Used.label();
    metric::background_summary(used);
    metric::background_summary_tokens(used, record.cost.input, record.cost.output);
}

impl Compactor {
    pub fn new(config: &Config, store: Store, upstreams: Arc<Upstreams>) -> Self {
        let rewriter = Arc::new(Rewriter::new(
            config.rewrite_settings(),
            TokenCounter::new(config.tokens.cache_bytes),
            config.model_table(),
        ));
        Self {
            settings: Arc::new(config.compaction.clone()),
            agent_markers: agent::AgentMarkers::new(&config.compaction.agent_markers),
            quiet: quiet::Quiet::new(&rewriter.models),
            rewriter,
            identifier: Identifier::new(&config.session.header, config.session.tenant_secret.expose())
                .with_clients(upstreams.cloud().clients().clone()),
            prefixes: PrefixCache::new(config.limits.prefix_cache_bytes)
                .for_bodies_from(usize::try_from(config.limits.prefix_min_bytes).unwrap_or(usize::MAX)),
            store,
            summarizer: Arc::new(Summarizer::new(&config.compaction, upstreams.clone())),
            upstreams,
            stateful: StatefulOrders {
                openai: config.upstream.openai_stateful.clone(),
                azure: config.upstream.azure_stateful.clone(),
            },
            chain_limit: usize::try_from(config.limits.max_body_bytes).unwrap_or(usize::MAX),
            ask_local_window: config.upstream.ask_local_window,
            stated_windows: window_probe::StatedWindows::default(),
            arrivals: prefill::Arrivals::new(),
            inflight: InflightBodies::new(config.limits.max_inflight_body_bytes),
            background_slots: Arc::new(tokio::sync::Semaphore::new(
                usize::try_from(config.compaction.background_max_inflight).unwrap_or(usize::MAX),
            )),
        }
    }

    pub fn settings(&self) -> &CompactionSettings {
        &self.settings
    }

    /// The budget of request body bytes held at once, shared with the background summaries.
    pub fn inflight(&self) -> &InflightBodies {
        &self.inflight
    }

    /// The in-process caches' estimated sizes, by their gauge label ([`metric::CACHES`]).
    pub fn cache_sizes(&self) -> Vec<(&'static str, crate::tokens::CacheSize)> {
        let mut sizes = vec![
            ("tokens", self.rewriter.counter.size()),
            ("tenants", self.identifier.tenant_cache_size()),
            ("prefixes", self.prefixes.size()),
        ];
        if let Some(size) = self.store.memory_size() {
            sizes.push(("sessions", size));
        }
        sizes
    }

    /// The keyed tenant hash of the request's credential (what token counts are cached under).
    pub fn tenant(&self, headers: &http::HeaderMap) -> String {
        self.identifier.tenant(headers)
    }

    /// Whether `body` can go upstream before [`Compactor::prepare`] has run: a request compactor
    /// has no reason to touch, told from its bytes (see [`quiet`]). `prepare` still runs, and its
    /// body is what counts.
    pub fn nothing_to_decide(&self, endpoint: crate::route::Endpoint, body: &[u8]) -> bool {
        Dialect::of(endpoint)
            .is_some_and(|dialect| self.quiet.nothing_to_decide(dialect, body, &self.rewriter.models, &self.settings))
    }

    /// The prompt-cache prices of the upstream a request of `family` goes to.
    fn cache_pricing(&self, family: ApiFamily) -> CachePricing {
        *self.rewriter.settings.cache.get(family)
    }

    /// The rewrite settings of the prune-harder rung.
    fn hard_settings(&self) -> RewriteSettings {
        budget::hard_settings(&self.rewriter.settings, &self.settings)
    }

    /// The rewrite settings of a rebuilt conversation: the harder pruning only when pruning is on.
    fn settings_for_rebuild(&self) -> RewriteSettings {
        if self.rewriter.settings.prune_enabled { self.hard_settings() } else { self.rewriter.settings.clone() }
    }

    /// The engine's parts, borrowed for one derivation or compaction on the request's path.
    fn engine(&self) -> Engine<'_> {
        Engine { settings: &self.settings, rewriter: &self.rewriter, summarizer: &self.summarizer }
    }
}
