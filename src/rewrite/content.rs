//! What the inspector keeps of a request's content when an operator turns it on
//! (`inspector.keep_content`): for each item a policy replaced or removed, the head of the text
//! the client sent and of what went upstream instead, within a byte bound per request. Sensitive:
//! whatever an agent sends (code, secrets in tool outputs) sits in the session store with it.
//! Only message content is read here, never a header, so no credential can end up in it.

use serde::{Deserialize, Serialize};

use crate::conversation::{Conversation, Edit, Kind};

/// The fewest bytes one changed item gets while the bound lasts: enough to recognize it.
const MIN_SHARE: usize = 256;

/// One changed item: where it was, what the client sent, what was forwarded instead.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContentChange {
    /// The message it belongs to (0-based, in the request as sent).
    pub message: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The original text's head, and its whole size in bytes.
    pub was: String,
    pub was_bytes: u32,
    /// What replaced it (its head); `None`: the item was left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub now: Option<String>,
}

/// What was kept of a request's changed content, and how many changed items the bound left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kept {
    pub changes: Vec<ContentChange>,
    pub omitted: u32,
}

/// The changed items of `conversation` as it will be forwarded, newest first (the ones just
/// changed; older ones repeat what earlier requests kept), their texts within `bytes`: each gets
/// an even share (at least [`MIN_SHARE`]), so one long output does not hide the others.
pub fn kept(conversation: &Conversation, bytes: usize) -> Kept {
    let mut kept = Kept::default();
    if bytes == 0 {
        return kept;
    }
    let changed = conversation.items.iter().rev().filter(|item| item.edit != Edit::Keep);
    let share = (bytes / changed.clone().count().max(1)).max(MIN_SHARE.min(bytes));
    let mut left = bytes;
    for item in changed {
        if left == 0 {
            kept.omitted += 1;
            continue;
        }
        let room = share.min(left);
        // The replacement is short (a placeholder, a head and a tail): at most half of the room.
        let now = match &item.edit {
            Edit::Replace(text) => Some(head(text, room / 2).to_string()),
            _ => None,
        };
        let was = original(&item.kind);
        let was_head = head(was, room - now.as_ref().map_or(0, String::len));
        left -= now.as_ref().map_or(0, String::len) + was_head.len();
        kept.changes.push(ContentChange {
            message: item.message as u32,
            call_id: item.call_id().map(str::to_string),
            was: was_head.to_string(),
            was_bytes: was.len() as u32,
            now,
        });
    }
    kept
}

/// The text an item carried as the client sent it.
fn original<'a>(kind: &'a Kind) -> &'a str {
    match kind {
        Kind::System { text } | Kind::Text { text, .. } | Kind::Thinking { text } => text,
        Kind::ToolResult { text, .. } => text,
        Kind::ToolCall { arguments, .. } => arguments,
        Kind::Attachment => "",
        Kind::Other { raw } => raw,
    }
}

/// At most `bytes` of the start of `text`, on a character boundary.
fn head(text: &str, bytes: usize) -> &str {
    if text.len() <= bytes {
        return text;
    }
    let mut end = bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::{Item, Role};
    use std::borrow::Cow;

    fn result(message: usize, id: &str, text: &str, edit: Edit) -> Item<'static> {
        let mut item = Item::new(
            message,
            None,
            Kind::ToolResult { call_id: Some(Cow::Owned(id.into())), text: Cow::Owned(text.into()), attachments: 0 },
        );
        item.edit = edit;
        item
    }

    #[test]
    fn keeps_the_newest_changes_within_the_bound_and_counts_the_rest() {
        let conversation = Conversation {
            items: vec![
                result(1, "call_oldest", &"o".repeat(400), Edit::Replace("[pruned]".into())),
                result(3, "call_old", &"p".repeat(400), Edit::Remove),
                Item::new(4, None, Kind::Text { role: Role::User, text: Cow::Borrowed("kept as sent") }),
                result(5, "call_new", &"é".repeat(300), Edit::Replace("[pruned]".into())),
            ],
            ..Conversation::default()
        };
        let kept = kept(&conversation, 500);
        assert_eq!((kept.changes.len(), kept.omitted), (2, 1), "the bound is spent on the newest");
        assert_eq!(kept.changes[0].call_id.as_deref(), Some("call_new"));
        assert_eq!(kept.changes[0].was.len(), 248, "cut on a character boundary");
        assert_eq!(kept.changes[0].was_bytes, 600);
        assert_eq!((kept.changes[1].now.as_deref(), kept.changes[1].was.len()), (None, 244), "left out");
        let used: usize = kept.changes.iter().map(|c| c.was.len() + c.now.as_ref().map_or(0, String::len)).sum();
        assert_eq!(used, 500);
        assert_eq!(super::kept(&conversation, 0), Kept::default(), "off keeps nothing");
        assert_eq!(super::kept(&conversation, 100_000).changes.len(), 3, "each whole within a large bound");
    }
}
