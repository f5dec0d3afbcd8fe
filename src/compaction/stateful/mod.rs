//! Stateful Responses requests: the history lives at the provider (`previous_response_id`, or a
//! `conversation`), so compactor cannot see what overflows. On the overflow it recovers with the
//! client's own credential, by the rungs `upstream.*_stateful` lists ([`StatefulRung`]):
//! - `provider_compaction`: the request again with `context_management`, so the provider
//!   compacts the chain itself and the next request continues from the response it answered;
//! - `rebuild`: the chain read back from the provider ([`fetch`]), sent statelessly and
//!   summarized as any conversation (the engine's own rungs);
//! - `truncation`: the request again with `truncation: "auto"`.
//!
//! What recovered a chain is kept in the session store under the tenant and the id the agent
//! named ([`crate::session::Store::map_chain`]): the same id sent again, to any replica, goes the
//! way it went (a rebuilt chain's items, or the field the rung set) without a second overflow.
//! A request that already carries `context_management` or `truncation: "auto"` manages its
//! window itself: those rungs pass it by (never compacted twice).

pub(super) mod chain;
mod edit;
mod fetch;

use chain::ChainKind;
use chain::ChainState;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::ladder::RungOutcome;
use super::request::RequestState;
use super::{Compactor, Prepared};
use crate::config::stateful::StatefulRung;
use crate::dialect::{Dialect, ParsedRequest};
use crate::error::Chain as ErrorChain;
use crate::overflow::Overflow;
use crate::rewrite::RewriteReport;
use crate::route::ApiFamily;
use crate::session::{ConversationId, SessionCtx};
use crate::upstream::RequestHead;

/// `context_management` as the provider-compaction rung sets it: the provider's own threshold
/// (it knows its window; compactor, behind an error that names none, does not).
const CONTEXT_MANAGEMENT: &str = r#"[{"type":"compaction"}]"#;

/// What a recovered chain maps to, as stored.
#[derive(Serialize, Deserialize)]
struct Mapping {
    rung: String,
    /// A rebuilt chain's items (summary and kept tail), before the client's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    items: Option<Vec<Box<RawValue>>>,
}

/// The chain a parsed stateful request names.
fn chain_of(parsed: &ParsedRequest) -> Option<(ChainKind, String)> {
    let named = |key| parsed.top.str(key).map(|id| id.into_owned()).filter(|id| !id.is_empty());
    if let Some(id) = named("previous_response_id") {
        return Some((ChainKind::Previous, id));
    }
    // A conversation is an id, or an object with one.
    let conversation = named("conversation").or_else(|| {
        let object = crate::json::RawObject::parse(parsed.top.get("conversation")?)?;
        object.str("id").map(|id| id.into_owned())
    })?;
    Some((ChainKind::Conversation, conversation))
}

impl Compactor {
    /// The stateful rungs of the upstream a request of `family` goes to.
    fn stateful_rungs(&self, family: ApiFamily) -> &[StatefulRung] {
        match family {
            ApiFamily::OpenAi => &self.stateful.openai,
            ApiFamily::Azure => &self.stateful.azure,
            _ => &[],
        }
    }

    /// A stateful request before forwarding: as it came, unless its chain was recovered before
    /// (then as it was recovered), with its session loaded and a ladder for its overflow.
    pub(super) async fn prepare_stateful(
        &self,
        head: &RequestHead,
        body: Bytes,
        parsed: &ParsedRequest<'_>,
        request_id: &str,
    ) -> Prepared {
        let rungs = self.stateful_rungs(head.route.family);
        let (Some((kind, id)), Some(client_items)) = (chain_of(parsed), edit::client_items(&body)) else {
            return Prepared::untouched(body);
        };
        if rungs.is_empty() || !self.settings.auto || parsed.dialect != Dialect::Responses {
            return Prepared::untouched(body);
        }
        let session = self.identifier.identify_in(&head.headers, head.uri.query(), Some(parsed));
        let key = format!("{}:{id}", session.tenant());
        let mut chain = ChainState {
            kind,
            id,
            key,
            rungs: rungs.to_vec(),
            next: 0,
            original: body.clone(),
            client_items,
            rebuilt: false,
        };
        let (sent, mapped) = match self.mapping(&chain.key).await {
            Some(Mapping { rung, items: Some(items) }) if rung == StatefulRung::Rebuild.name() => {
                let history: Vec<String> = items.iter().map(|item| item.get().to_string()).collect();
                if let Some(rebuilt) = edit::stateless(&body, &history) {
                    return self.prepare_rebuilt(head, rebuilt, chain, request_id).await;
                }
                (body, None)
            }
            Some(Mapping { rung, .. }) => match StatefulRung::parse(&rung).and_then(|rung| flagged(&body, rung)) {
                Some((sent, rung)) => (sent, Some(rung)),
                None => (body, None),
            },
            None => (body, None),
        };
        if let Some(rung) = mapped {
            // That rung is spent: it is what goes.
            chain.rungs.retain(|r| *r != rung);
        }
        let conversation = ConversationId::of(parsed);
        let mut ctx = SessionCtx::load(self.store.clone(), session, conversation).await;
        ctx.use_model(super::prepare::model_key(ctx.key(), head, parsed)).await;
        let mut state = self.request_state(head, Dialect::Responses, &sent, parsed, &ctx);
        state.request_id = request_id.to_string();
        if let Some(rung) = mapped {
            state.note(rung.name(), RungOutcome::Mapped);
        }
        state.stateful = Some(Box::new(chain));
        Prepared {
            body: sent,
            session: Some(ctx.key().clone()),
            conversation: Some(ctx.conversation_id().clone()),
            ctx: Some(ctx),
            ladder: Some(state),
            ..Prepared::untouched(Bytes::new())
        }
    }

    /// A chain rebuilt before: its stored items and the client's new ones, prepared as any
    /// stateless request; its retries keep the mapping up to date.
    async fn prepare_rebuilt(
        &self,
        head: &RequestHead,
        rebuilt: Bytes,
        mut chain: ChainState,
        request_id: &str,
    ) -> Prepared {
        chain.rebuilt = true;
        let mut prepared = Box::pin(self.prepare(head, rebuilt, request_id)).await;
        if let Some(state) = prepared.ladder.as_mut() {
            state.note(StatefulRung::Rebuild.name(), RungOutcome::Mapped);
            state.stateful = Some(Box::new(chain));
        }
        prepared
    }

    /// What the chain `key` was recovered by, if it was (a store that cannot say: not recovered).
    async fn mapping(&self, key: &str) -> Option<Mapping> {
        match self.store.chain(key).await {
            Ok(found) => found.and_then(|text| serde_json::from_str(&text).ok()),
            Err(error) => {
                tracing::debug!(error = %ErrorChain(&error), "recovered chains not readable: the request goes as it came");
                None
            }
        }
    }

    /// Keeps what recovered the chain, for every replica.
    async fn map(&self, key: &str, mapping: &Mapping) {
        let Ok(text) = serde_json::to_string(mapping) else { return };
        if let Err(error) = self.store.map_chain(key, &text).await {
            tracing::warn!(error = %ErrorChain(&error), "a recovered chain was not stored: its next request recovers again");
        }
    }

    /// After a stateless retry of a rebuilt chain: the chain maps to what went.
    pub(super) async fn remember_rebuilt(&self, state: &RequestState, sent: &[u8]) {
        let Some(chain) = state.stateful.as_deref().filter(|chain| chain.rebuilt) else { return };
        let Some(items) = edit::chain_part(sent, &chain.client_items) else { return };
        let items = items.into_iter().filter_map(|item| RawValue::from_string(item).ok()).collect();
        self.map(&chain.key, &Mapping { rung: StatefulRung::Rebuild.name().into(), items: Some(items) }).await;
    }

    /// The next stateful rung's body after an overflow, `None` to give up.
    pub(super) async fn next_stateful(
        &self,
        head: &RequestHead,
        state: &mut RequestState,
        ctx: &mut SessionCtx,
        overflow: &Overflow,
    ) -> Option<(Bytes, Option<RewriteReport>)> {
        if state.trace.overflow.is_none() {
            state.trace.overflow = Some(format!("{}:stateful", head.route.family.label()));
        }
        if state.retries() >= self.settings.max_retries {
            return None;
        }
        loop {
            let chain = state.stateful.as_mut()?;
            let rung = *chain.rungs.get(chain.next)?;
            chain.next += 1;
            let (next, outcome) = match rung {
                StatefulRung::Rebuild if chain.kind == ChainKind::Conversation => (None, RungOutcome::Nothing),
                StatefulRung::Rebuild => self.rebuild(head, state, ctx, overflow).await,
                rung => match flagged(&chain.original, rung) {
                    Some((body, _)) => {
                        let key = chain.key.clone();
                        self.map(&key, &Mapping { rung: rung.name().into(), items: None }).await;
                        (Some((body, None)), RungOutcome::Retry)
                    }
                    None => (None, RungOutcome::Nothing),
                },
            };
            state.note(rung.name(), outcome);
            if next.is_some() {
                return next;
            }
        }
    }

    /// The rebuild rung: the chain read back, the request made stateless with it, and summarized
    /// as any conversation that overflowed.
    async fn rebuild(
        &self,
        head: &RequestHead,
        state: &mut RequestState,
        ctx: &mut SessionCtx,
        overflow: &Overflow,
    ) -> (Option<(Bytes, Option<RewriteReport>)>, RungOutcome) {
        let Some(chain) = state.stateful.as_deref() else { return (None, RungOutcome::Nothing) };
        let history = match fetch::read_chain(&self.upstreams, head, &chain.id, self.chain_limit).await {
            Ok(history) => history,
            Err(error) => {
                tracing::warn!(error = %ErrorChain(&error), conversation = %ctx.conversation_id(), "the chain could not be read back");
                return (None, RungOutcome::Failed);
            }
        };
        let Some(rebuilt) = edit::stateless(&chain.original, &history) else { return (None, RungOutcome::Nothing) };
        let Some(parsed) = ParsedRequest::parse(Dialect::Responses, &rebuilt).map(|p| p.with_model(head.path_model()))
        else {
            return (None, RungOutcome::Nothing);
        };
        let chain = state.stateful.take();
        let mut fresh = self.request_state(head, Dialect::Responses, &rebuilt, &parsed, ctx);
        fresh.request_id = std::mem::take(&mut state.request_id);
        fresh.trace = std::mem::take(&mut state.trace);
        fresh.rungs.carry_retries(&state.rungs);
        *state = *fresh;
        let Some((_, report)) = self.first_derivation(state, ctx, parsed).await else {
            return (None, RungOutcome::Nothing);
        };
        // What overflowed is this body: the window is below it.
        ctx.note_forwarded(u64::from(report.tokens_after));
        state.sent = Some(report);
        self.learn_from_overflow(head, state, ctx, overflow);
        let (body, outcome) = self.summarize_rung(head, state, ctx, false).await;
        state.stateful = chain.map(|mut chain| {
            chain.rebuilt = true;
            chain
        });
        (body.map(|(body, report)| (body, Some(report))), outcome)
    }
}

/// The client's body with the field `rung` sets, `None` when the request has it already (it
/// manages its window itself) or the rung sets none.
fn flagged(body: &Bytes, rung: StatefulRung) -> Option<(Bytes, StatefulRung)> {
    let sent = match rung {
        StatefulRung::ProviderCompaction if !edit::has(body, "context_management") => {
            edit::with_field(body, "context_management", CONTEXT_MANAGEMENT)?
        }
        StatefulRung::Truncation if edit::string(body, "truncation").as_deref() != Some("auto") => {
            edit::with_field(body, "truncation", r#""auto""#)?
        }
        _ => return None,
    };
    Some((sent, rung))
}
