//! A stateful request's chain as its recovery goes: which history the provider keeps, the rungs
//! left, what the client sent. Apart from the recovery itself, so the request's state can hold
//! one without depending on the rungs that use it.

use bytes::Bytes;

use crate::config::stateful::StatefulRung;

/// Which history the provider keeps for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ChainKind {
    /// `previous_response_id`: a chain of responses.
    Previous,
    /// `conversation`: a conversation object, which only the provider can change.
    Conversation,
}

/// A stateful request's recovery: its chain, the rungs left, and what the client sent.
#[derive(Debug)]
pub struct ChainState {
    pub(super) kind: ChainKind,
    /// The id the agent named.
    pub(super) id: String,
    /// Where what recovered it is kept: the tenant, `:`, the id.
    pub(super) key: String,
    pub(super) rungs: Vec<StatefulRung>,
    pub(super) next: usize,
    /// The body as the client sent it.
    pub(super) original: Bytes,
    /// The client's own input items: the end of a rebuilt chain's body.
    pub(super) client_items: Vec<String>,
    /// The chain was rebuilt: the request goes statelessly now, recovered by the engine's rungs,
    /// and each body it goes as is what the chain maps to.
    pub(in crate::compaction) rebuilt: bool,
}
