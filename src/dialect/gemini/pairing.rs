//! Which call each function response answers: by id when both have one, else by name and
//! order, and the ids compactor makes up for calls and responses that carry none.

use std::borrow::Cow;
use std::collections::HashMap;

use super::MADE_UP;
use crate::conversation::{Conversation, Item, Kind};

/// What names the calls of one content that carry no id, and what its responses need to be paired.
pub(super) struct Naming<'a> {
    /// How many model contents come before this one: a model content's calls are named by it.
    /// Not the content's index: repair drops contents that only answer no call, which would name
    /// the same call otherwise in the rewritten body (and a remembered pruned id another call).
    pub(super) turn: usize,
    /// Calls of each name without id seen so far in this content.
    pub(super) by_name: Vec<(String, usize)>,
    /// Code runs and their results seen so far in this content.
    pub(super) code_runs: (usize, usize),
    /// The function responses of this content, in order, paired once all are read.
    pub(super) responses: Vec<Response<'a>>,
}

/// A function response waiting for its call.
pub(super) struct Response<'a> {
    /// Its part's index in the content (each part is one item).
    pub(super) block: usize,
    pub(super) name: Cow<'a, str>,
}

impl Naming<'_> {
    /// The ordinal of the next call of `name` in this content, counted.
    pub(super) fn ordinal(&mut self, name: &str) -> usize {
        match self.by_name.iter_mut().find(|(n, _)| n == name) {
            Some((_, count)) => {
                *count += 1;
                *count - 1
            }
            None => {
                self.by_name.push((name.to_string(), 1));
                0
            }
        }
    }
}

/// The id standing for a call the model gave no id: its model turn, name and ordinal.
pub(super) fn made_up_id(model_turn: usize, name: &str, ordinal: usize) -> String {
    format!("{MADE_UP}{model_turn}:{ordinal}:{name}")
}

/// The id of a response without one that answers no call: its place, which no call's id is.
fn unanswered_id(message: usize, block: usize) -> String {
    format!("{MADE_UP}answers-none:{message}:{block}")
}

/// Calls of one name in a model turn, in order, and how far the pairing has taken them.
#[derive(Default)]
struct Queue {
    calls: Vec<usize>,
    next: usize,
}

impl Queue {
    /// The first call still unanswered, taken.
    fn take(&mut self, taken: &mut [bool]) -> Option<usize> {
        while let Some(&call) = self.calls.get(self.next) {
            self.next += 1;
            if !taken[call] {
                taken[call] = true;
                return Some(call);
            }
        }
        None
    }
}

/// Names the call each function response of content `message` answers, as the Gemini API pairs
/// them: a response whose id a call of the `calling` model turn has answers that call; every
/// other one, in order, answers the first unanswered call of its name there (a response with an
/// id of its own only a call without one, as two ids that differ never pair). A response left
/// over keeps its own id, which repair moves to its call elsewhere or removes, or without one an
/// id no call has. Each lookup goes through a map built once: linear in the turn's size.
pub(super) fn pair_responses(
    conversation: &mut Conversation,
    calling: Option<usize>,
    message: usize,
    first_item: usize,
    responses: &[Response],
) {
    let calls_range = calling.map_or(0..0, |calling| conversation.item_range(calling));
    let (before, here) = conversation.items.split_at_mut(first_item);
    // (name, id, whether the model gave the id) of each call the client answers.
    let calls: Vec<(&str, &Cow<str>, bool)> = before
        .get(calls_range)
        .unwrap_or_default()
        .iter()
        .filter(|item| item.repairable)
        .filter_map(|item| match &item.kind {
            Kind::ToolCall { id: Some(id), name, .. } => Some((name.as_ref(), id, !id.starts_with(MADE_UP))),
            _ => None,
        })
        .collect();
    let mut by_id: HashMap<&str, Queue> = HashMap::new();
    let mut by_name: HashMap<&str, Queue> = HashMap::new();
    let mut without_id_by_name: HashMap<&str, Queue> = HashMap::new();
    for (c, (name, id, own)) in calls.iter().enumerate() {
        by_name.entry(name).or_default().calls.push(c);
        match own {
            true => by_id.entry(id.as_ref()).or_default().calls.push(c),
            false => without_id_by_name.entry(name).or_default().calls.push(c),
        }
    }
    let mut taken = vec![false; calls.len()];
    let mut answers: Vec<Option<usize>> = vec![None; responses.len()];
    {
        // The id the response itself carries (none was made up for it yet).
        let read: &[Item] = here;
        let own_id = |response: &Response| read.get(response.block).and_then(Item::call_id);
        for (r, response) in responses.iter().enumerate() {
            if let Some(id) = own_id(response) {
                answers[r] = by_id.get_mut(id).and_then(|queue| queue.take(&mut taken));
            }
        }
        for (r, response) in responses.iter().enumerate() {
            if answers[r].is_some() {
                continue;
            }
            let queues = if own_id(response).is_some() { &mut without_id_by_name } else { &mut by_name };
            answers[r] = queues.get_mut(response.name.as_ref()).and_then(|queue| queue.take(&mut taken));
        }
    }
    for (response, answer) in responses.iter().zip(answers) {
        let Some(Kind::ToolResult { call_id, .. }) = here.get_mut(response.block).map(|item| &mut item.kind) else {
            continue;
        };
        match answer.and_then(|c| calls.get(c)) {
            Some((_, id, _)) => *call_id = Some(Cow::clone(id)),
            None if call_id.is_none() => *call_id = Some(Cow::Owned(unanswered_id(message, response.block))),
            None => {}
        }
    }
}
