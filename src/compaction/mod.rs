//! Compaction: keep each conversation inside its model's window. [`Compactor`] is what the proxy
//! asks, at the two moments it has: before forwarding ([`Compactor::prepare`]: identify the
//! session and the conversation inside it, load their state, re-apply a stored summary, run the
//! rewrite policies, compact ahead of time) and after an overflow ([`Compactor::recover`]: the
//! next rung of the ladder). It is given the request's head and bytes and gives bytes back; it
//! knows nothing of HTTP bodies or of the proxy.
//!
//! Inside: `budget` (window, threshold and breaker arithmetic), `ladder` (one request's rungs),
//! `compact` and `lock` (one compaction per conversation, across replicas), `summarizer` (the
//! summary call), `plan` (where to cut and the rebuilt conversation; pure), `agent` (the agents'
//! own compaction requests, which compactor leaves alone).

pub mod agent;
mod budget;
mod compact;
mod derive;
pub mod ladder;
mod lock;
pub mod plan;
mod prefill;
mod quiet;
pub mod summarizer;

use std::sync::Arc;

use bytes::Bytes;

use crate::boxed::boxed;
use crate::config::Config;
use crate::dialect::prefix::{self, PrefixCache, Reuse};
use crate::dialect::{Dialect, ParsedRequest};
use crate::error::Chain;
use crate::inflight::{Held, InflightBodies};
use crate::overflow::Overflow;
use crate::rewrite::{CachePricing, Reason, RewriteReport, RewriteSettings, Rewriter};
use crate::route::ApiFamily;
use crate::session::{ConversationId, ConversationState, Identifier, ModelKey, SessionCtx, SessionKey, Store};
use crate::telemetry::{metric, trace};
use crate::tokens::TokenCounter;
use crate::upstream::{RequestHead, Upstreams};
use crate::work;
use tracing::Instrument;

pub use crate::config::compaction::CompactionSettings;
pub use budget::Pressure;
pub use compact::CompactError;
use compact::{Compacted, Compaction, Sizing};
use ladder::{BackgroundSkip, Rung};
pub use ladder::{Ladder, Recovery};
pub use summarizer::{Summarizer, SummaryError};

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
}

/// How long a background summary waits for the answer of the request that started it.
const ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// A request as compactor sends it.
pub struct Prepared {
    pub body: Bytes,
    /// The session the request belongs to, when compactor identified one.
    pub session: Option<SessionKey>,
    /// The conversation inside the session, when compactor keeps state for it.
    pub conversation: Option<ConversationId>,
    pub report: Option<RewriteReport>,
    /// The compaction generation applied to `body`.
    pub compacted: Option<u32>,
    /// The session's state for this request, when it was loaded; to commit once the response is done.
    /// Boxed, as is the ladder: a `Prepared` passes through the request's scopes by value, and
    /// each move copied both (2.3 KB, several times a request) where a box moves as a pointer.
    pub ctx: Option<Box<SessionCtx>>,
    /// How to recover from an overflow; `None` when compactor must not retry this request.
    pub ladder: Option<Box<Ladder>>,
    /// Held until the request is answered: a summary this request starts in the background waits
    /// for it to be dropped (see [`AnsweredGate`]).
    pub answered: Option<AnsweredGate>,
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
    fn untouched(body: Bytes) -> Self {
        Self {
            body,
            session: None,
            conversation: None,
            report: None,
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
        metric::rewrite_skipped(route, "over_budget");
        tracing::warn!(route, bytes = body.len(), "rewrite budget spent: forwarding the request as it came");
    }
    Prepared::untouched(body)
}

/// A body rebuilt around a new summary: the provider's cached prefix ends at the summary.
fn summarized((body, mut report): (Bytes, RewriteReport)) -> (Bytes, RewriteReport) {
    report.prefix_break = Some(Reason::Summary);
    (body, report)
}

/// A summary prepared in the background applied by the request that needed it: counted, with
/// what its calls cost.
fn count_used(record: &crate::session::CompactionRecord) {
    metric::background_summary("used");
    metric::background_summary_tokens("used", record.cost.input, record.cost.output);
}

/// The (tenant, upstream family, model) a request talks to, what the session learns of: the
/// tenant of its session key, so that what one tenant teaches stays with that tenant.
fn model_key(session: &SessionKey, head: &RequestHead, parsed: &ParsedRequest) -> ModelKey {
    ModelKey::new(session.tenant(), head.route.family.label(), parsed.model.as_deref().unwrap_or(""))
}

/// A Responses request whose history is stored upstream.
fn is_stateful(parsed: &ParsedRequest) -> bool {
    ["previous_response_id", "conversation"].iter().any(|key| parsed.top.get(key).is_some_and(|v| v != "null"))
}

/// Codex's newest compaction: a `compaction_trigger` item that expects one `compaction` item back.
fn asks_for_compaction_item(parsed: &ParsedRequest) -> bool {
    parsed.dialect == Dialect::Responses
        && parsed.messages.iter().any(|m| m.object.str("type").as_deref() == Some("compaction_trigger"))
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
            identifier: Identifier::new(&config.session.header, config.session.tenant_secret.expose()),
            prefixes: PrefixCache::new(config.limits.prefix_cache_bytes)
                .for_bodies_from(usize::try_from(config.limits.prefix_min_bytes).unwrap_or(usize::MAX)),
            store,
            summarizer: Arc::new(Summarizer::new(&config.compaction, upstreams)),
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

    /// Before forwarding: identifies the session and rewrites the body when the endpoint is one
    /// compactor understands; anything it cannot parse, and requests whose history it cannot see
    /// or that summarize themselves, go as they came.
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

    /// `request_id`: the request's own id, which the compaction records it makes carry.
    pub async fn prepare(&self, head: &RequestHead, body: Bytes, request_id: &str) -> Prepared {
        let route = head.route.label();
        let Some(dialect) = Dialect::of(head.route.endpoint) else { return Prepared::untouched(body) };
        let key = || self.identifier.prefix_key(dialect, &head.headers, head.uri.query());
        let earlier = prefix::Earlier::default();
        let parsed = match work::step(|| self.prefixes.parse(key, dialect, &body, &earlier)).await {
            Ok((Some(parsed), reuse)) => {
                if reuse != Reuse::Off {
                    metric::prefix_reuse(route, reuse.label());
                }
                parsed.with_model(head.path_model())
            }
            Ok((None, _)) => {
                let refused = work::current().is_some_and(|budget| budget.parse_refused());
                if refused {
                    tracing::warn!(
                        body_bytes = body.len(),
                        "too many messages or parts for the parse's memory bound (limits.parse_memory_*): forwarded as it came"
                    );
                }
                metric::rewrite_skipped(route, if refused { "over_parse_memory" } else { "unparsed" });
                return Prepared::untouched(body);
            }
            Err(stopped) => return over_budget(route, stopped, body),
        };
        if let Some(budget) = work::current() {
            budget.left_to_do(body.len() - parsed.memo.reused_bytes().min(body.len()));
        }
        trace::describe_request(parsed.model.as_deref());
        match self.left_alone(&parsed) {
            Some(reason @ "stateful") => {
                metric::rewrite_skipped(route, reason);
                return Prepared::untouched(body.clone());
            }
            Some(reason) => {
                metric::rewrite_skipped(route, reason);
                let session = self.identifier.identify_in(&head.headers, head.uri.query(), Some(&parsed));
                return Prepared { session: Some(session), ..Prepared::untouched(body.clone()) };
            }
            None => {}
        }
        let (session, conversation) = self.identifier.identify_conversation(&head.headers, head.uri.query(), &parsed);
        // Counted before the state is read: a prefill ahead that has not yet said so in the state
        // sees this request and gives up.
        let arrival = prefill::applies(&self.settings, dialect, self.cache_pricing(head.route.family).preset)
            .then(|| self.arrivals.arrived(&session, &conversation));
        // The context and the ladder come boxed from where they are made: they go out in
        // `Prepared`, and held inline they made this future 2.3 KB larger (a copy of it is made
        // once a request).
        let mut ctx = boxed(|| SessionCtx::load(self.store.clone(), session, conversation)).await;
        let model = model_key(ctx.key(), head, &parsed);
        boxed(|| ctx.use_model(model)).await;
        // The rewrite's span: the derivations and a compaction ahead (with its summary call).
        let rewrite = trace::stage("compactor.rewrite", ctx.key().as_str());
        let mut ladder = self.ladder(head, dialect, &body, &parsed, &ctx);
        ladder.request_id = request_id.to_string();
        let last_generation = ctx.conversation().usage.map_or(0, |usage| usage.generation);
        // Boxed where it runs: the derivations' state is most of this future's size (see `crate::boxed`).
        let derived = boxed(|| self.first_derivation(&mut ladder, &ctx, parsed)).instrument(rewrite.clone()).await;
        let Some((mut sent, mut report)) = derived else {
            if let Some(stopped) = work::current().and_then(|budget| budget.check(None).err()) {
                return over_budget(route, stopped, body.clone());
            }
            return Prepared::untouched(body.clone());
        };
        if ladder.ready.is_none()
            && let Some(ready) =
                ladder.record.as_ref().filter(|ready| ready.due_tokens > 0 && ready.generation != last_generation)
        {
            // The first request a summary prepared in the background applies to: it was ready,
            // nobody waited for it.
            count_used(ready);
            report.prefix_break = Some(Reason::Summary);
        }
        let tokens_saved = u64::from(report.tokens_before.saturating_sub(report.tokens_after));
        let mut answered = None;
        if self.settings.auto
            && !budget::breaker_open(&self.settings, &ctx.conversation().breaker, ladder.message_count)
        {
            // The admin API's request belongs to the session: the first of its conversations
            // with something to summarize answers it (compact_ahead leaves it standing otherwise).
            let requested = ctx.session().counters.compact_requested > 0;
            // The server's cache holds the prompt rebuilt around the ready record (a prefill
            // ahead): applying it now extends that prefix, not applying it re-prefills the lot.
            let prefilled = ladder.ready.as_ref().is_some_and(|ready| ready.generation == ctx.conversation().prefilled);
            let pressure = self.pressure(&ctx, &report);
            let prompt = budget::prompt_tokens(&pressure, ctx.conversation(), ladder.message_count, &report, true);
            if requested || prefilled || prompt > pressure.budget() {
                let trigger = if requested { "admin" } else { "threshold" };
                // A compaction is worth its summary call only when what it leaves, and two more
                // turns, land under the budget; when they cannot (the fixed part leaves room for a
                // turn or two), only a request that would overflow is compacted: the rebuild is
                // the same, a turn or more later, so the session pays fewer summary calls.
                let worth = requested
                    || prefilled
                    || prompt > pressure.limit()
                    || self.frees_room(&ladder, &pressure, &report, ctx.conversation());
                if !worth {
                    metric::futile_compaction_avoided();
                    tracing::debug!(
                        session = %ctx.key().as_str(),
                        prompt,
                        budget = pressure.budget(),
                        "compaction ahead of time skipped: it would not leave room for the next turns under the budget"
                    );
                } else if !requested
                    && let Some(applied) =
                        boxed(|| self.apply_ready(&mut ladder, &ctx)).instrument(rewrite.clone()).await
                {
                    (sent, report) = applied;
                    if !self.fits(&ctx, &report)
                        && let Some(compacted) =
                            boxed(|| self.compact_ahead(head, &mut ladder, &mut ctx, trigger, &report))
                                .instrument(rewrite.clone())
                                .await
                    {
                        // A conversation that jumped past what the ready record was prepared
                        // for: summarized further on top of it now, not after an overflow.
                        (sent, report) = compacted;
                    }
                } else if let Some(compacted) =
                    boxed(|| self.compact_ahead(head, &mut ladder, &mut ctx, trigger, &report))
                        .instrument(rewrite.clone())
                        .await
                {
                    (sent, report) = compacted;
                }
            }
            // The next crossing is prepared from what goes now: also right after a request that
            // compacted or applied a prepared summary, where a window that holds few turns is
            // passed again within a turn or two (a summary started only at the next request would
            // be on that request's path).
            if self.settings.background && ladder.ready.is_none() && !requested {
                answered = self.prepare_in_background(head, &mut ladder, &ctx, &report, &sent, arrival);
            } else if let Some(arrival) = arrival
                && let Some(ready) = ladder.ready.clone()
            {
                // A record held back that was not prefilled yet (its job found the conversation
                // moved on): its rebuilt prompt goes ahead once this request is answered, and the
                // next request applies it.
                answered = Some(self.prefill_ahead(head, ladder.for_background(Some(ready)), &ctx, arrival));
            }
        }
        ctx.record_request(&report.pruned_call_ids, tokens_saved, report.message_count);
        ctx.count_turn(ladder.cache.lifetime);
        ctx.note_forwarded(u64::from(report.tokens_after));
        ctx.note_generation(ladder.compacted().unwrap_or(0));
        metric::rewrite_done(route, &report, sent != body);
        if let Some(reason) = report.prefix_break {
            metric::prefix_break(reason.label());
        }
        ladder.sent = Some(report.clone());
        // What the headers and the log say is in the provider's tokens, as calibrated.
        let pressure = self.pressure(&ctx, &report);
        let calibrated = |tokens: u32| u32::try_from(pressure.calibrated(u64::from(tokens))).unwrap_or(u32::MAX);
        (report.tokens_before, report.tokens_after) =
            (calibrated(report.tokens_before), calibrated(report.tokens_after));
        Prepared {
            body: sent,
            session: Some(ctx.key().clone()),
            conversation: Some(ctx.conversation_id().clone()),
            report: Some(report),
            compacted: ladder.compacted(),
            ctx: Some(ctx),
            ladder: self.settings.auto.then_some(ladder),
            answered,
        }
    }

    /// A token-count request (`/v1/messages/count_tokens`, `/v1/responses/input_tokens`) of a
    /// known conversation: the body the conversation's next request would be sent as (its stored
    /// summary re-applied, the same rewrite with the same history), so an agent that counts sees
    /// what the provider will. Read-only: no summary call, no lock, nothing written to the session
    /// (a count never changes what the next request sees). A conversation compactor has no state
    /// for (a count of a tool list, of a file, of a session it never saw), and anything it cannot
    /// parse or rewrite, is counted as sent.
    pub async fn count(&self, head: &RequestHead, dialect: Dialect, body: Bytes) -> Prepared {
        // Parsed whole, and not kept: a client's counts of tool lists and files would take the
        // places of its conversations in the prefix cache.
        let Ok(Some(parsed)) = work::step(|| ParsedRequest::parse(dialect, &body)).await else {
            return Prepared::untouched(body);
        };
        let parsed = parsed.with_model(head.path_model());
        if self.left_alone(&parsed).is_some() {
            return Prepared::untouched(body.clone());
        }
        let mut ctx = self.load(head, &parsed).await;
        if ctx.conversation().is_empty() {
            return Prepared::untouched(body.clone());
        }
        // What the session learned of its model decides the window pressure, as for the next request.
        let model = model_key(ctx.key(), head, &parsed);
        ctx.use_model(model).await;
        let mut ladder = self.ladder(head, dialect, &body, &parsed, &ctx);
        let Some((sent, _)) = self.first_derivation(&mut ladder, &ctx, parsed).await else {
            return Prepared::untouched(body.clone());
        };
        // `ctx` is dropped here, never committed.
        Prepared {
            body: sent,
            session: Some(ctx.key().clone()),
            conversation: Some(ctx.conversation_id().clone()),
            report: None,
            compacted: ladder.compacted(),
            ctx: None,
            ladder: None,
            answered: None,
        }
    }

    /// Why a parsed request goes as it came, whatever its session holds (a metric's label):
    /// its history lives at the provider (`previous_response_id`, `conversation`), where
    /// compactor cannot see it; or the agent is summarizing its own history: stay out of its way.
    fn left_alone(&self, parsed: &ParsedRequest) -> Option<&'static str> {
        if is_stateful(parsed) {
            return Some("stateful");
        }
        let summarizing = agent::is_agent_compaction(parsed, &self.agent_markers) || asks_for_compaction_item(parsed);
        summarizing.then_some("agent_compaction")
    }

    /// The request's session and conversation, with their stored state.
    async fn load(&self, head: &RequestHead, parsed: &ParsedRequest<'_>) -> Box<SessionCtx> {
        let (session, conversation) = self.identifier.identify_conversation(&head.headers, head.uri.query(), parsed);
        SessionCtx::load(self.store.clone(), session, conversation).await
    }

    /// The ladder the request climbs: its body, the compaction stored for its conversation (when
    /// one matches), the cache's pricing and the model its path names. Boxed where it is made, and
    /// filled in the box: it is large, and a request's ladder goes out in `Prepared`.
    fn ladder(
        &self,
        head: &RequestHead,
        dialect: Dialect,
        body: &Bytes,
        parsed: &ParsedRequest,
        ctx: &SessionCtx,
    ) -> Box<Ladder> {
        let record = plan::matching_record(parsed, &ctx.conversation().compactions).cloned();
        let mut ladder =
            Box::new(Ladder::new(dialect, body.clone(), parsed.messages.len(), record, &self.settings.ladder));
        ladder.lead = parsed.lead();
        ladder.cache = self.cache_pricing(head.route.family);
        ladder.path_model = head.path_model().map(str::to_string);
        ladder
    }

    /// The body the client's request goes as before any compaction: the rewrite with the
    /// session's history (the client's parse handed on rather than repeated), and when the window
    /// needs the room, the batch that rewrite held back goes too, whatever the cache.
    /// A request's first derivation, then the window's press when it needs the room. A record
    /// prepared in the background (`due_tokens`) waits for the request that needs it: until then
    /// the record before it applies and `ladder.ready` holds it for the commit.
    async fn first_derivation(
        &self,
        ladder: &mut Ladder,
        ctx: &SessionCtx,
        parsed: ParsedRequest<'_>,
    ) -> Option<(Bytes, RewriteReport)> {
        let records = &ctx.conversation().compactions;
        let before_ready = ladder.record.as_ref().filter(|r| r.due_tokens > 0).and_then(|ready| {
            let at = records.iter().rposition(|r| r.generation == ready.generation)?;
            plan::matching_record(&parsed, &records[..at]).cloned()
        });
        let last_generation = ctx.conversation().usage.map_or(0, |usage| usage.generation);
        let mut derived =
            self.compaction().derive_from(ladder, ctx, &self.rewriter.settings, Some(parsed), false).await?;
        if let Some(ready) = ladder.record.clone().filter(|r| r.due_tokens > 0)
            && ready.generation != last_generation
        {
            // Not applied yet: the conversation goes on as before, the record waits for the
            // request that needs a compaction (past the threshold when a compaction there is
            // worth its call, else past the limit, or an overflow), which applies it where a
            // compaction ahead of time would happen. Applied as soon as the history reached
            // `due_tokens` (the projection's crossing), it came a turn early whenever the
            // request there would not have been compacted (a compaction that leaves no room for
            // the next turns waits for the limit), and the next summary a turn earlier too.
            let waiting = std::mem::replace(&mut ladder.record, before_ready);
            match self.compaction().derive(ladder, ctx, &self.rewriter.settings, false).await {
                Some(held) => {
                    derived = held;
                    ladder.ready = waiting;
                }
                None => ladder.record = waiting,
            }
        }
        if self.presses(ctx, ladder, &derived.1)
            && let Some(pressed) = self.compaction().derive(ladder, ctx, &self.rewriter.settings, true).await
        {
            // The window needs the room: the held-back batch goes now, whatever the cache.
            return Some(pressed);
        }
        Some(derived)
    }

    /// Whether a prune batch the rewrite held back must go now: the window needs the room,
    /// whatever the cache.
    fn presses(&self, ctx: &SessionCtx, ladder: &Ladder, report: &RewriteReport) -> bool {
        report.held_tokens > 0
            && budget::window_pressure(
                self.rewriter.settings.prune.pressure,
                &self.pressure(ctx, report),
                ctx.conversation(),
                ladder.message_count,
                report,
            )
    }

    /// The window pressure of a request of this session whose rewrite is `report`: the window,
    /// the calibration and the output reserve every size decision uses (see [`Pressure`]).
    pub fn pressure(&self, ctx: &SessionCtx, report: &RewriteReport) -> Pressure {
        let pressure = Pressure::of(&self.settings, ctx.learned(), report);
        self.quiet.note_window(pressure.window, u64::from(report.model.context_window));
        pressure
    }

    /// The part of `report`'s prompt no compaction shrinks (tools, lead system messages, the
    /// summary the body carries), in the provider's tokens.
    fn fixed_tokens(&self, ladder: &Ladder, pressure: &Pressure, report: &RewriteReport) -> u64 {
        let from = ladder.lead + usize::from(ladder.record.is_some());
        let history = report.message_tokens.iter().skip(from).fold(0, |sum: u32, t| sum.saturating_add(*t));
        let history = Rewriter::scaled(history, report.model);
        pressure.calibrated(u64::from(report.tokens_after.saturating_sub(history)))
    }

    /// Whether a compaction of `report`'s conversation would land under the budget with margin,
    /// with room left for the next turns (see [`budget::compaction_frees_room`]).
    fn frees_room(
        &self,
        ladder: &Ladder,
        pressure: &Pressure,
        report: &RewriteReport,
        conversation: &ConversationState,
    ) -> bool {
        let fixed = self.fixed_tokens(ladder, pressure, report);
        let (keep, _) = budget::kept_sizes(&self.settings, pressure, fixed, false);
        let summary = ladder.record.as_ref().map_or(u64::from(keep), |r| (r.summary.len() / 4) as u64);
        let growth = budget::turn_growth(conversation, ladder.message_count, report);
        budget::compaction_frees_room(pressure, fixed, u64::from(keep), summary, growth)
    }

    fn sizing(&self, ladder: &Ladder, ctx: &SessionCtx, report: &RewriteReport) -> Sizing {
        let pressure = self.pressure(ctx, report);
        Sizing { pressure, fixed: self.fixed_tokens(ladder, &pressure, report), due_in: 0 }
    }

    /// After an overflow of the body `sent`: the next rung's body, skipping rungs that change
    /// nothing, or give up when the retries, the breaker or the rungs are spent.
    pub async fn recover(
        &self,
        head: &RequestHead,
        ladder: &mut Ladder,
        ctx: &mut SessionCtx,
        overflow: &Overflow,
        sent: &Bytes,
    ) -> Next {
        self.learn_from_overflow(head, ladder, ctx, overflow);
        let next = self.next_body(head, ladder, ctx, overflow, sent).await;
        let Some((body, report)) = next else {
            metric::recovery("gave_up");
            let trace = ladder.recovery();
            tracing::warn!(
                session = %ctx.key().as_str(),
                conversation = %ctx.conversation_id(),
                overflow = %trace.overflow.as_deref().unwrap_or("-"),
                rungs = %trace.rungs(),
                retries = ladder.retries(),
                "overflow recovery gave up: the client gets the provider's error"
            );
            return Next::GiveUp;
        };
        ladder.count_retry();
        if let Some(report) = &report {
            ctx.remember_pruned(&report.pruned_call_ids);
            ctx.note_forwarded(u64::from(report.tokens_after));
            ctx.note_generation(ladder.compacted().unwrap_or(0));
            let pressure = self.pressure(ctx, report);
            ladder.trace.tokens_after =
                Some(u32::try_from(pressure.calibrated(u64::from(report.tokens_after))).unwrap_or(u32::MAX));
            ladder.trace.pruned = report.pruned;
            ladder.sent = Some(report.clone());
        }
        Next::Retry { body, report }
    }

    /// What an overflow teaches: the window it names, else that the window is below what was
    /// sent; the prompt size it reports measures the provider's tokenizer.
    fn learn_from_overflow(&self, head: &RequestHead, ladder: &mut Ladder, ctx: &mut SessionCtx, overflow: &Overflow) {
        let named = budget::window_named(overflow);
        if ladder.trace.overflow.is_none() {
            let style = if named.is_some() { "named" } else { "unnamed" };
            ladder.trace.overflow = Some(format!("{}:{style}", head.route.family.label()));
        }
        let estimate = ctx.forwarded_estimate();
        if let Some(prompt) = overflow.prompt_tokens {
            ctx.measure(prompt, estimate);
        }
        match named {
            Some(window) => ctx.learn_window(window),
            None => {
                let sent = match (&ladder.sent, overflow.prompt_tokens) {
                    (_, Some(prompt)) => prompt,
                    (Some(report), None) => self.pressure(ctx, report).calibrated(estimate),
                    (None, None) => 0,
                };
                if sent > 0 {
                    ctx.learn(|learned| {
                        if learned.window_below == 0 || sent < learned.window_below {
                            learned.window_below = sent;
                        }
                    });
                }
            }
        }
    }

    /// The next body after an overflow, `None` to give up.
    async fn next_body(
        &self,
        head: &RequestHead,
        ladder: &mut Ladder,
        ctx: &mut SessionCtx,
        overflow: &Overflow,
        sent: &Bytes,
    ) -> Option<(Bytes, Option<RewriteReport>)> {
        if ladder.retries() >= self.settings.max_retries
            || budget::breaker_open(&self.settings, &ctx.conversation().breaker, ladder.message_count)
        {
            return None;
        }
        if let Some(body) = ladder.lower_max_tokens(sent, overflow, self.settings.min_output_tokens) {
            ladder.note("lower_max_tokens", "retry");
            return Some((body, None));
        }
        self.climb(head, ladder, ctx, sent).await.map(|(body, report)| (body, Some(report)))
    }

    /// Whether `report`'s body fits the window as the session now knows it.
    fn fits(&self, ctx: &SessionCtx, report: &RewriteReport) -> bool {
        let pressure = self.pressure(ctx, report);
        pressure.calibrated(u64::from(report.tokens_after)) <= pressure.hard_limit()
    }

    /// The next rung that yields a new body that fits: a rung whose body compactor already
    /// estimates will overflow is passed over, never sent. With `prune.enabled = false` no
    /// output is replaced by the placeholder: the prune-harder rung is skipped.
    async fn climb(
        &self,
        head: &RequestHead,
        ladder: &mut Ladder,
        ctx: &mut SessionCtx,
        sent: &Bytes,
    ) -> Option<(Bytes, RewriteReport)> {
        while let Some(rung) = ladder.next_rung() {
            let name = rung.name();
            match rung {
                Rung::PruneHard if !self.rewriter.settings.prune_enabled => ladder.note(name, "skipped"),
                Rung::PruneHard => match self.compaction().derive(ladder, ctx, &self.hard_settings(), true).await {
                    Some((body, report)) if body != *sent && self.fits(ctx, &report) => {
                        ladder.note(name, "retry");
                        if let Some(reason) = report.prefix_break {
                            metric::prefix_break(reason.label());
                        }
                        return Some((body, report));
                    }
                    Some((body, _)) if body != *sent => ladder.note(name, "too_big"),
                    _ => ladder.note(name, "nothing"),
                },
                Rung::Summarize if ladder.ready.is_some() => {
                    // A summary prepared in the background: no summary call to wait for.
                    if let Some((body, report)) = self.apply_ready(ladder, ctx).await
                        && self.fits(ctx, &report)
                    {
                        ladder.note(name, "retry");
                        metric::prefix_break(Reason::Summary.label());
                        return Some((body, report));
                    }
                    ladder.note(name, "too_big");
                }
                Rung::Summarize | Rung::SummarizeHarder => {
                    let harder = rung == Rung::SummarizeHarder;
                    let Some(sizing) = ladder.sent.as_ref().map(|report| self.sizing(ladder, ctx, report)) else {
                        ladder.note(name, "nothing");
                        continue;
                    };
                    // Boxed: a compaction's future (its summary calls) is large and rarely runs; held inline
                    // it made every request's future that much larger to move.
                    match Box::pin(self.compaction().run(head, ladder, ctx, harder, "overflow", sizing, 0)).await {
                        Ok(Compacted { record, summary_time, summary_calls }) => {
                            ladder.trace.summary += summary_time;
                            ladder.trace.summary_calls += summary_calls;
                            ladder.record = Some(record);
                            match self.compaction().derive(ladder, ctx, &self.settings_for_rebuild(), true).await {
                                Some((body, report)) if self.fits(ctx, &report) => {
                                    ladder.note(name, "retry");
                                    metric::prefix_break(Reason::Summary.label());
                                    return Some(summarized((body, report)));
                                }
                                Some(_) => ladder.note(name, "too_big"),
                                None => ladder.note(name, "nothing"),
                            }
                        }
                        Err(error) => {
                            ladder.note(name, "failed");
                            tracing::warn!(
                                error = %Chain(&error),
                                session = %ctx.key().as_str(),
                                conversation = %ctx.conversation_id(),
                                "compaction failed"
                            )
                        }
                    }
                }
                Rung::Exhausted => {}
            }
        }
        None
    }

    /// The rewrite settings of a rebuilt conversation: the harder pruning only when pruning is on.
    fn settings_for_rebuild(&self) -> RewriteSettings {
        if self.rewriter.settings.prune_enabled { self.hard_settings() } else { self.rewriter.settings.clone() }
    }

    /// Compacts before forwarding (threshold or admin request): prune harder first, summarize when
    /// that is not enough. `None` when nothing better than `report`'s body came of it.
    async fn compact_ahead(
        &self,
        head: &RequestHead,
        ladder: &mut Ladder,
        ctx: &mut SessionCtx,
        trigger: &'static str,
        report: &RewriteReport,
    ) -> Option<(Bytes, RewriteReport)> {
        let mut best = None;
        if trigger == "threshold"
            && self.rewriter.settings.prune_enabled
            && self.settings.prunes_before_summarizing()
            && let Some((body, hard)) = self.compaction().derive(ladder, ctx, &self.hard_settings(), true).await
        {
            let pressure = self.pressure(ctx, &hard);
            if !budget::over_threshold(&pressure, ctx.conversation(), ladder.message_count, &hard, false) {
                metric::compaction(trigger, "pruned");
                return Some((body, hard));
            }
            best = Some((body, hard));
        }
        let sizing = self.sizing(ladder, ctx, report);
        for harder in [false, true] {
            // Boxed: see the overflow rung above.
            match Box::pin(self.compaction().run(head, ladder, ctx, harder, trigger, sizing, 0)).await {
                Ok(Compacted { record, summary_time, summary_calls }) => {
                    ladder.trace.summary += summary_time;
                    ladder.trace.summary_calls += summary_calls;
                    ladder.record = Some(record);
                    // Everything after the summary is new to the provider: prune as under pressure.
                    let derived =
                        self.compaction().derive(ladder, ctx, &self.rewriter.settings, true).await.map(summarized);
                    let Some(derived) = derived else { break };
                    // A rebuild already estimated to overflow is not what goes out: summarize
                    // harder (a quarter of the tail kept) once.
                    let fits = self.fits(ctx, &derived.1);
                    best = Some(derived);
                    if fits {
                        break;
                    }
                }
                // A conversation with nothing to summarize (a title request, a young subagent)
                // leaves the admin API's request for the next one that has.
                Err(CompactError::NothingToSummarize) => break,
                Err(error) => {
                    tracing::warn!(
                        error = %Chain(&error),
                        session = %ctx.key().as_str(),
                        conversation = %ctx.conversation_id(),
                        tokens = report.tokens_after,
                        "compaction ahead of time failed"
                    );
                    break;
                }
            }
        }
        best
    }

    /// Applies the summary prepared in the background that this request held back (its
    /// `ladder.ready`): the body rebuilt around it, as after a compaction, with no summary call.
    /// `None` (and nothing changed) when there is none or the rebuild fails.
    async fn apply_ready(&self, ladder: &mut Ladder, ctx: &SessionCtx) -> Option<(Bytes, RewriteReport)> {
        let ready = ladder.ready.take()?;
        let before = ladder.record.replace(ready);
        // Everything after the summary is new to the provider: prune as under pressure.
        match self.compaction().derive(ladder, ctx, &self.rewriter.settings, true).await {
            Some(derived) => {
                if let Some(ready) = &ladder.record {
                    count_used(ready);
                }
                metric::prefix_break(Reason::Summary.label());
                Some(summarized(derived))
            }
            None => {
                ladder.ready = std::mem::replace(&mut ladder.record, before);
                None
            }
        }
    }

    /// A summary due to be prepared in the background that is not started (see
    /// [`BackgroundSkip`]): counted, and said in the request's record. The request that passes
    /// the threshold summarizes on its path instead, as with `compaction.background = false`.
    fn skip_background(&self, ladder: &mut Ladder, ctx: &SessionCtx, skip: BackgroundSkip) -> Option<AnsweredGate> {
        metric::background_summary_skipped(skip.label());
        tracing::debug!(session = %ctx.key().as_str(), reason = skip.label(), "background summary not started");
        ladder.trace.background_skipped = Some(skip);
        None
    }

    /// Starts the conversation's next summary off the request path when its growth says it will
    /// pass the threshold within `compaction.background_turns_ahead` turns: at the newest turn's
    /// growth, the prompt crosses the size where a compaction ahead of time would happen (the
    /// budget, or the limit when a compaction there would not leave room for two more turns).
    /// The job takes the conversation's compaction lock (it never waits for it: a compaction
    /// under way makes it give up) and stores its record with `due_tokens`, the size of the
    /// client's history at which it applies, so the request that needs it applies it at once, on
    /// any replica.
    fn prepare_in_background(
        &self,
        head: &RequestHead,
        ladder: &mut Ladder,
        ctx: &SessionCtx,
        report: &RewriteReport,
        sent: &Bytes,
        arrival: Option<u64>,
    ) -> Option<AnsweredGate> {
        let pressure = self.pressure(ctx, report);
        let conversation = ctx.conversation();
        let growth = budget::newest_turn_tokens(conversation, ladder.message_count, report);
        if growth == 0 {
            return None;
        }
        let prompt = budget::prompt_tokens(&pressure, conversation, ladder.message_count, report, true);
        let target =
            if self.frees_room(ladder, &pressure, report, conversation) { pressure.budget() } else { pressure.limit() };
        let ahead = pressure.calibrated(growth.saturating_mul(u64::from(self.settings.background_turns_ahead)));
        if prompt > target || prompt.saturating_add(ahead) <= target {
            return None;
        }
        // Bounded: each job holds its conversation's body and the summary call built from it
        // until the summary is ready, past the request that started it.
        let Ok(slot) = self.background_slots.clone().try_acquire_owned() else {
            return self.skip_background(ladder, ctx, BackgroundSkip::Capacity);
        };
        let mut held = Held::default();
        if self.inflight.hold(&mut held, (sent.len() as u64).saturating_mul(2)).is_err() {
            return self.skip_background(ladder, ctx, BackgroundSkip::BodyBudget);
        }
        let due_in = pressure.uncalibrated(target - prompt) + 1;
        let due_tokens = u64::from(report.tokens_before) + due_in;
        // The record applies at the first request past `due_tokens`: whole turns later, at the
        // newest turn's growth, and the history grows that much before it applies.
        let sizing = Sizing { due_in: due_in.div_ceil(growth) * growth, ..self.sizing(ladder, ctx, report) };
        let mut job = ladder.for_background(ladder.record.clone());
        job.sent_body = Some(sent.clone());
        // In front of a local server the rebuilt prompt goes ahead as soon as the record is ready
        // (the request that started it answered by then), and the next request applies it: the
        // server prefills it in the agent's tool time, whichever turn the projection named.
        let prefill = arrival.map(|arrival| self.prefill(head, ctx, arrival));
        let head = head.clone();
        let (settings, rewriter, summarizer) = (self.settings.clone(), self.rewriter.clone(), self.summarizer.clone());
        let (store, key, conversation_id) = (self.store.clone(), ctx.key().clone(), ctx.conversation_id().clone());
        let tenant = self.identifier.tenant(&head.headers);
        metric::background_summary("started");
        tracing::debug!(session = %key.as_str(), conversation = %conversation_id, prompt, target, due_tokens, "background summary started");
        let (gate, answered) = tokio::sync::oneshot::channel::<()>();
        let work = async move {
            // The summary's call waits for this request's answer (its gate dropped), at most
            // ANSWER_WAIT: on a server that answers one request at a time it would otherwise go
            // in front of, or queue behind, the answer the agent is waiting for.
            let _ = tokio::time::timeout(ANSWER_WAIT, answered).await;
            let mut ctx = SessionCtx::load(store, key, conversation_id).await;
            let compaction = Compaction { settings: &settings, rewriter: &rewriter, summarizer: &summarizer };
            let outcome = match compaction.run(&head, &job, &mut ctx, false, "background", sizing, due_tokens).await {
                Ok(Compacted { record, summary_calls, .. }) => {
                    if summary_calls > 0 {
                        metric::background_summary_tokens("ready", record.cost.input, record.cost.output);
                    }
                    if let Some(prefill) = prefill {
                        prefill.run(job.for_background(Some(record))).await;
                    }
                    "ready"
                }
                Err(CompactError::Busy) => {
                    // Another request's job prepares (or prepared) this crossing's record: the
                    // prefill this request's growth calls for is of that record, from this body.
                    if let Some(prefill) = prefill
                        && let Some(record) = lock::prepared_record(&job, &mut ctx, settings.lock_wait).await
                    {
                        prefill.run(job.for_background(Some(record))).await;
                    }
                    "busy"
                }
                Err(CompactError::NothingToSummarize) => "nothing",
                Err(error) => {
                    tracing::warn!(
                        error = %Chain(&error),
                        session = %ctx.key().as_str(),
                        conversation = %ctx.conversation_id(),
                        "background summary failed"
                    );
                    "failed"
                }
            };
            metric::background_summary(outcome);
            drop((slot, held));
        };
        tokio::spawn(async move { crate::tokens::scoped(&tenant, work).await });
        Some(AnsweredGate(gate))
    }

    /// A prefill ahead for this request's conversation (run with the ladder rebuilt around the
    /// record it prefills).
    fn prefill(&self, head: &RequestHead, ctx: &SessionCtx, arrival: u64) -> prefill::Prefill {
        prefill::Prefill {
            head: head.clone(),
            store: self.store.clone(),
            key: ctx.key().clone(),
            conversation: ctx.conversation_id().clone(),
            settings: self.settings.clone(),
            rewriter: self.rewriter.clone(),
            summarizer: self.summarizer.clone(),
            arrivals: self.arrivals.clone(),
            arrival,
        }
    }

    /// Sends the prompt rebuilt around `ladder`'s record ahead, once this request is answered.
    fn prefill_ahead(&self, head: &RequestHead, ladder: Ladder, ctx: &SessionCtx, arrival: u64) -> AnsweredGate {
        let prefill = self.prefill(head, ctx, arrival);
        let tenant = self.identifier.tenant(&head.headers);
        let (gate, answered) = tokio::sync::oneshot::channel::<()>();
        let work = async move {
            let _ = tokio::time::timeout(ANSWER_WAIT, answered).await;
            prefill.run(ladder).await;
        };
        tokio::spawn(async move { crate::tokens::scoped(&tenant, work).await });
        AnsweredGate(gate)
    }

    /// The prompt-cache prices of the upstream a request of `family` goes to.
    fn cache_pricing(&self, family: ApiFamily) -> CachePricing {
        match family {
            ApiFamily::OpenAi => self.rewriter.settings.openai_cache,
            ApiFamily::Anthropic => self.rewriter.settings.anthropic_cache,
            ApiFamily::Gemini => self.rewriter.settings.gemini_cache,
            ApiFamily::Vertex => self.rewriter.settings.vertex_cache,
        }
    }

    fn hard_settings(&self) -> RewriteSettings {
        budget::hard_settings(&self.rewriter.settings, &self.settings)
    }

    fn compaction(&self) -> Compaction<'_> {
        Compaction { settings: &self.settings, rewriter: &self.rewriter, summarizer: &self.summarizer }
    }
}
