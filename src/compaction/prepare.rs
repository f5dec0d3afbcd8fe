//! Before forwarding ([`Compactor::prepare`]): parse the body (reusing the conversation's last
//! parse), leave alone what compactor must not touch, identify the session and the conversation
//! and load their state, derive the body (the stored record re-applied, the rewrite policies
//! run), compact before the overflow when the window needs it, prepare the next summary in the
//! background, and note what goes for the commit. A token count ([`Compactor::count`]) runs the
//! same derivation, read-only.

use bytes::Bytes;
use tracing::Instrument;

use super::ProviderSizes;
use super::decision::Untouched;
use super::request::RequestState;
use super::{AnsweredGate, Compactor, Prepared, agent, budget, count_used, over_budget, plan, prefill};
use crate::boxed::boxed;
use crate::dialect::prefix::{self, Reuse};
use crate::dialect::{Dialect, ParsedRequest};
use crate::rewrite::{Reason, RewriteReport};
use crate::session::{ModelKey, SessionCtx, SessionKey};
use crate::telemetry::{metric, trace};
use crate::upstream::RequestHead;
use crate::work;

/// A body and its rewrite, as they would go upstream.
pub(super) type Derived = (Bytes, RewriteReport);

impl Compactor {
    /// Before forwarding: identifies the session and rewrites the body when the endpoint is one
    /// compactor understands; anything it cannot parse, and requests whose history it cannot see
    /// or that summarize themselves, go as they came. `request_id`: the request's own id, which
    /// the compaction records it makes carry.
    pub async fn prepare(&self, head: &RequestHead, body: Bytes, request_id: &str) -> Prepared {
        let route = head.route.label();
        let Some(dialect) = Dialect::of(head.route.endpoint) else { return Prepared::untouched(body) };
        let earlier = prefix::Earlier::default();
        let key = || self.identifier.prefix_key(dialect, &head.headers, head.uri.query());
        let step = work::step(|| self.prefixes.parse(key, dialect, &body, &earlier)).await;
        let parsed = match Self::parsed(head, &body, step) {
            Ok(parsed) => parsed,
            Err(Some(stopped)) => return over_budget(route, stopped, body),
            Err(None) => return Prepared::untouched(body),
        };
        trace::describe_request(parsed.model.as_deref());
        if let Some(reason) = self.left_alone(&parsed) {
            metric::rewrite_skipped(route, reason.label());
            if reason == Untouched::Stateful {
                return Box::pin(self.prepare_stateful(head, body.clone(), &parsed, request_id)).await;
            }
            return self.leave_alone(head, &parsed, reason, body.clone());
        }
        let (session, conversation) = self.identifier.identify_conversation(&head.headers, head.uri.query(), &parsed);
        // Counted before the state is read: a prefill of a prepared summary that has not yet said
        // so in the state sees this request and gives up.
        let arrival = prefill::applies(&self.settings, dialect, self.cache_pricing(head.route.family).preset)
            .then(|| self.arrivals.arrived(&session, &conversation));
        // The context and the request's state come boxed from where they are made: they go out
        // in `Prepared`, and held inline they made this future 2.3 KB larger (a copy of it is made
        // once a request).
        let mut ctx = boxed(|| SessionCtx::load(self.store.clone(), session, conversation)).await;
        let model = model_key(ctx.key(), head, &parsed);
        boxed(|| ctx.use_model(model)).await;
        self.ask_window(head, &parsed, &mut ctx).await;
        // The rewrite's span: the derivations and a compaction before the overflow (with its
        // summary call).
        let rewrite = trace::stage("compactor.rewrite", ctx.key().as_str());
        let mut state = self.request_state(head, dialect, &body, &parsed, &ctx);
        state.request_id = request_id.to_string();
        let last_generation = ctx.conversation().usage.map_or(0, |usage| usage.generation);
        // Boxed where it runs: the derivations' state is most of this future's size (see `crate::boxed`).
        let derived = boxed(|| self.first_derivation(&mut state, &ctx, parsed)).instrument(rewrite.clone()).await;
        let Some(mut derived) = derived else { return underived(route, body.clone()) };
        note_background_record_applied(&state, &mut derived.1, last_generation);
        let tokens_saved = u64::from(derived.1.tokens_before.saturating_sub(derived.1.tokens_after));
        let mut answered = None;
        if self.settings.auto && !budget::breaker_open(&self.settings, &ctx.conversation().breaker, state.message_count)
        {
            // Most requests are not due: told without entering the compaction's future.
            let requested = match self.due(&state, &ctx, &derived) {
                Err(requested) => requested,
                Ok(due) => self.compact_if_due(head, &mut state, &mut ctx, &mut derived, &rewrite, due).await,
            };
            answered = self.prepare_next(head, &mut state, &ctx, &derived, arrival, requested);
        }
        note_for_commit(&mut ctx, &state, &derived.1, tokens_saved);
        count_rewrite(route, &derived, &body);
        self.prepared(state, ctx, derived, answered)
    }

    /// The body parsed (the conversation's last parse reused where it can be), the model its path
    /// names filled in, from the parse step's result. `Err`: it goes as it came, with why when its
    /// budget stopped the parse (a body compactor cannot parse is counted here). Not a future of
    /// its own: the parse, hundreds of bytes, would be copied out of it.
    fn parsed<'b>(
        head: &RequestHead,
        body: &Bytes,
        step: Result<(Option<ParsedRequest<'b>>, Reuse), work::Stopped>,
    ) -> Result<ParsedRequest<'b>, Option<work::Stopped>> {
        let route = head.route.label();
        let parsed = match step {
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
                let reason = if refused { Untouched::OverParseMemory } else { Untouched::Unparsed };
                metric::rewrite_skipped(route, reason.label());
                return Err(None);
            }
            Err(stopped) => return Err(Some(stopped)),
        };
        if let Some(budget) = work::current() {
            budget.left_to_do(body.len() - parsed.memo.reused_bytes().min(body.len()));
        }
        Ok(parsed)
    }

    /// In front of a local server, the window it states for the request's model
    /// ([`super::window_probe`]), as the model's table window.
    async fn ask_window(&self, head: &RequestHead, parsed: &ParsedRequest<'_>, ctx: &mut SessionCtx) {
        if !self.ask_local_window || !self.rewriter.settings.cache.get(head.route.family).is_local() {
            return;
        }
        let model = parsed.model.as_deref().unwrap_or("");
        if let Some(window) = self.stated_windows.window(&self.upstreams, head, model).await {
            ctx.state_window(window);
        }
    }

    /// A request left alone ([`Compactor::left_alone`]): as it came, with its session when its
    /// history is the client's (an agent's own compaction), none when it lives upstream.
    fn leave_alone(&self, head: &RequestHead, parsed: &ParsedRequest, reason: Untouched, body: Bytes) -> Prepared {
        if reason == Untouched::Stateful {
            return Prepared::untouched(body);
        }
        let session = self.identifier.identify_in(&head.headers, head.uri.query(), Some(parsed));
        Prepared { session: Some(session), ..Prepared::untouched(body) }
    }

    /// The request as it goes: its sizes in the provider's tokens, as calibrated, for the headers
    /// and the log; its state kept for an overflow's recovery.
    fn prepared(
        &self,
        mut state: Box<RequestState>,
        ctx: Box<SessionCtx>,
        (sent, report): Derived,
        answered: Option<AnsweredGate>,
    ) -> Prepared {
        state.sent = Some(report.clone());
        // What the headers, the log and the inspector say is in the provider's tokens.
        let pressure = self.pressure(&ctx, &report);
        let sizes = ProviderSizes::of(&pressure, &report);
        Prepared {
            body: sent,
            session: Some(ctx.key().clone()),
            conversation: Some(ctx.conversation_id().clone()),
            report: Some(report),
            sizes: Some(sizes),
            compacted: state.compacted(),
            ctx: Some(ctx),
            ladder: self.settings.auto.then_some(state),
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
        self.ask_window(head, &parsed, &mut ctx).await;
        let mut state = self.request_state(head, dialect, &body, &parsed, &ctx);
        let Some((sent, _)) = self.first_derivation(&mut state, &ctx, parsed).await else {
            return Prepared::untouched(body.clone());
        };
        // `ctx` is dropped here, never committed.
        Prepared {
            body: sent,
            session: Some(ctx.key().clone()),
            conversation: Some(ctx.conversation_id().clone()),
            report: None,
            sizes: None,
            compacted: state.compacted(),
            ctx: None,
            ladder: None,
            answered: None,
        }
    }

    /// Why a parsed request goes as it came, whatever its session holds: its history lives at the
    /// provider (`previous_response_id`, `conversation`), where compactor cannot see it; or the
    /// agent is summarizing its own history: stay out of its way.
    fn left_alone(&self, parsed: &ParsedRequest) -> Option<Untouched> {
        if is_stateful(parsed) {
            return Some(Untouched::Stateful);
        }
        let summarizing = agent::is_agent_compaction(parsed, &self.agent_markers) || provider_compacts(parsed);
        summarizing.then_some(Untouched::AgentCompaction)
    }

    /// The request's session and conversation, with their stored state.
    async fn load(&self, head: &RequestHead, parsed: &ParsedRequest<'_>) -> Box<SessionCtx> {
        let (session, conversation) = self.identifier.identify_conversation(&head.headers, head.uri.query(), parsed);
        SessionCtx::load(self.store.clone(), session, conversation).await
    }

    /// The state of the request: its body, the compaction stored for its conversation (when one
    /// matches), the cache's pricing and the model its path names. Boxed where it is made, and
    /// filled in the box: it is large, and it goes out in `Prepared`.
    pub(super) fn request_state(
        &self,
        head: &RequestHead,
        dialect: Dialect,
        body: &Bytes,
        parsed: &ParsedRequest,
        ctx: &SessionCtx,
    ) -> Box<RequestState> {
        let record = plan::matching_record(parsed, &ctx.conversation().compactions).cloned();
        let mut state =
            Box::new(RequestState::new(dialect, body.clone(), parsed.messages.len(), record, &self.settings.ladder));
        state.lead = parsed.lead();
        state.cache = self.cache_pricing(head.route.family);
        state.path_model = head.path_model().map(|model| (model.name.to_string(), model.rules));
        state
    }

    /// The body the client's request goes as before any compaction: the rewrite with the
    /// session's history (the client's parse handed on rather than repeated), and when the window
    /// needs the room, the batch that rewrite held back goes too, whatever the cache. A record
    /// prepared in the background (`due_tokens`) waits for the request that needs it: until then
    /// the record before it applies and `state.ready` holds it for the commit.
    pub(super) async fn first_derivation(
        &self,
        state: &mut RequestState,
        ctx: &SessionCtx,
        parsed: ParsedRequest<'_>,
    ) -> Option<Derived> {
        let records = &ctx.conversation().compactions;
        let before_ready = state.record.as_ref().filter(|r| r.due_tokens > 0).and_then(|ready| {
            let at = records.iter().rposition(|r| r.generation == ready.generation)?;
            plan::matching_record(&parsed, &records[..at]).cloned()
        });
        let last_generation = ctx.conversation().usage.map_or(0, |usage| usage.generation);
        let mut derived = self.engine().derive_from(state, ctx, &self.rewriter.settings, Some(parsed), false).await?;
        if let Some(ready) = state.record.clone().filter(|r| r.due_tokens > 0)
            && ready.generation != last_generation
        {
            // Not applied yet: the conversation goes on as before, the record waits for the
            // request that needs a compaction (past the threshold when a compaction there is
            // worth its call, else past the limit, or an overflow), which applies it where a
            // compaction before the overflow would happen. Applied as soon as the history reached
            // `due_tokens` (the projection's crossing), it came a turn early whenever the
            // request there would not have been compacted (a compaction that leaves no room for
            // the next turns waits for the limit), and the next summary a turn earlier too.
            let waiting = std::mem::replace(&mut state.record, before_ready);
            match self.engine().derive(state, ctx, &self.rewriter.settings, false).await {
                Some(held) => {
                    derived = held;
                    state.ready = waiting;
                }
                None => state.record = waiting,
            }
        }
        if self.presses(ctx, state, &derived.1)
            && let Some(pressed) = self.engine().derive(state, ctx, &self.rewriter.settings, true).await
        {
            // The window needs the room: the held-back batch goes now, whatever the cache.
            return Some(pressed);
        }
        Some(derived)
    }

    /// Whether a prune batch the rewrite held back must go now: the window needs the room,
    /// whatever the cache.
    fn presses(&self, ctx: &SessionCtx, state: &RequestState, report: &RewriteReport) -> bool {
        report.held_tokens > 0
            && budget::window_pressure(
                self.rewriter.settings.prune.pressure,
                &self.pressure(ctx, report),
                ctx.conversation(),
                state.message_count,
                report,
            )
    }
}

/// What the session's commit notes of the request that goes.
fn note_for_commit(ctx: &mut SessionCtx, state: &RequestState, report: &RewriteReport, tokens_saved: u64) {
    ctx.record_request(&report.pruned_call_ids, tokens_saved, report.message_count);
    ctx.count_turn(state.cache.lifetime);
    ctx.note_forwarded(u64::from(report.tokens_after));
    ctx.note_generation(state.compacted().unwrap_or(0));
}

/// The request's rewrite in the metrics (`changed`: the body that goes is not the client's).
fn count_rewrite(route: &'static str, (sent, report): &Derived, body: &Bytes) {
    metric::rewrite_done(route, report, sent != body);
    if let Some(reason) = report.prefix_break {
        metric::prefix_break(reason.label());
    }
}

/// A request whose derivation gave no body: as it came (counted when its budget ran out).
fn underived(route: &'static str, body: Bytes) -> Prepared {
    match work::current().and_then(|budget| budget.check(None).err()) {
        Some(stopped) => over_budget(route, stopped, body),
        None => Prepared::untouched(body),
    }
}

/// The first request a summary prepared in the background applies to (it was ready, nobody
/// waited for it): counted, and the provider's cached prefix ends at the summary.
fn note_background_record_applied(state: &RequestState, report: &mut RewriteReport, last_generation: u32) {
    if state.ready.is_none()
        && let Some(ready) =
            state.record.as_ref().filter(|ready| ready.due_tokens > 0 && ready.generation != last_generation)
    {
        count_used(ready);
        report.prefix_break = Some(Reason::Summary);
    }
}

/// The (tenant, upstream family, model) a request talks to, what the session learns of: the
/// tenant of its session key, so that what one tenant teaches stays with that tenant.
pub(super) fn model_key(session: &SessionKey, head: &RequestHead, parsed: &ParsedRequest) -> ModelKey {
    ModelKey::new(session.tenant(), head.route.family.label(), parsed.model.as_deref().unwrap_or(""))
}

/// A Responses request whose history is stored upstream.
fn is_stateful(parsed: &ParsedRequest) -> bool {
    ["previous_response_id", "conversation"].iter().any(|key| parsed.top.get(key).is_some_and(|v| v != "null"))
}

/// A Responses request whose client compacts with the provider: Codex's `compaction_trigger` (it
/// expects one `compaction` item back), `context_management` (the provider compacts past its
/// threshold), or a `compaction` item in its input (what the provider compacted, opaque to
/// compactor: a summary of compactor's over it would lose what it holds). Never compacted twice.
fn provider_compacts(parsed: &ParsedRequest) -> bool {
    parsed.dialect == Dialect::Responses
        && (parsed.top.get("context_management").is_some_and(|v| v != "null")
            || parsed
                .messages
                .iter()
                .any(|m| matches!(m.object.str("type").as_deref(), Some("compaction_trigger" | "compaction"))))
}
