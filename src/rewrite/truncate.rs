//! Cuts huge tool outputs to head + tail, half the budget each, at line boundaries where possible.

use std::sync::Arc;

use super::placeholder::{Calls, Template};
use crate::conversation::{Conversation, Edit, FRAMING_TOKENS, Kind};

/// Tokens reserved for the marker and the line-count header.
const MARKER_BUDGET: u32 = 24;

pub use crate::conversation::Cut;

/// Truncates every text-only tool output over `max_tokens` that may be shortened, in a counted
/// conversation (each item's `tokens` is its text's count plus framing); returns the cuts, in
/// item order. `earlier(item)` is the cut an earlier turn made of the same text with the same
/// settings, taken instead of cutting it again. A stand-in compactor wrote on an earlier turn (a
/// placeholder of `placeholder`, a duplicate's pointer) is never cut: the policies that wrote it
/// run after this one, so cutting it on the next turn would change bytes a turn already sent.
pub fn apply(
    conversation: &mut Conversation,
    max_tokens: u32,
    placeholder: &Template,
    count: &dyn Fn(&str) -> u32,
    earlier: &dyn Fn(usize) -> Option<Cut>,
) -> Vec<Cut> {
    if max_tokens == 0 {
        return Vec::new();
    }
    let over: Vec<usize> = {
        let calls = Calls::of(conversation);
        let items = conversation.items.iter().enumerate();
        items
            .filter(|(_, item)| {
                let Kind::ToolResult { call_id, text, attachments: 0 } = &item.kind else { return false };
                // The item's count is its text's (no attachments), framing aside: no need to count again.
                item.edit == Edit::Keep
                    && item.shortenable
                    && item.tokens.saturating_sub(FRAMING_TOKENS) > max_tokens
                    && !placeholder.stands_in(&calls, call_id.as_deref(), text)
            })
            .map(|(index, _)| index)
            .collect()
    };
    let mut cuts = Vec::with_capacity(over.len());
    for index in over {
        let item = &mut conversation.items[index];
        let Kind::ToolResult { text, .. } = &item.kind else { continue };
        let cut = earlier(index).unwrap_or_else(|| {
            let text: Arc<str> = head_and_tail(text, max_tokens, count).into();
            Cut { item: index, tokens: count(&text), text }
        });
        item.edit = Edit::Replace(String::from(&*cut.text));
        cuts.push(cut);
    }
    cuts
}

/// `text` cut to about `max_tokens`: its head, a marker saying how much was removed, its tail.
pub fn head_and_tail(text: &str, max_tokens: u32, count: &dyn Fn(&str) -> u32) -> String {
    let total = count(text).max(1);
    let lines = line_count(text);
    let budget = max_tokens.saturating_sub(MARKER_BUDGET).max(2);
    let bytes_per_token = text.len() as f64 / f64::from(total);
    let mut keep_bytes = (f64::from(budget / 2) * bytes_per_token) as usize;
    loop {
        let head = cut_head(text, keep_bytes);
        let tail = cut_tail(text, keep_bytes);
        // Estimated by bytes, so the pieces need no tokenizing of their own: only the result is
        // counted, once, to check it fits.
        let removed_bytes = text.len().saturating_sub(head.len() + tail.len());
        let removed = (f64::from(total) * removed_bytes as f64 / text.len().max(1) as f64).round() as u32;
        let result = if lines > 1 {
            format!("Total output lines: {lines}\n\n{head}\n…{removed} tokens truncated…\n{tail}")
        } else {
            format!("{head}…{removed} tokens truncated…{tail}")
        };
        if count(&result) <= max_tokens || keep_bytes == 0 {
            return result;
        }
        keep_bytes = keep_bytes * 4 / 5;
    }
}

/// `text.lines().count()`, counted as line breaks (tool outputs run to megabytes) plus an
/// unterminated last line.
fn line_count(text: &str) -> usize {
    // Per chunk of at most 255 bytes the count fits a byte: the compiler adds the compares
    // sixteen or thirty-two at a time.
    let breaks: usize = text
        .as_bytes()
        .chunks(255)
        .map(|chunk| usize::from(chunk.iter().fold(0u8, |n, b| n.wrapping_add(u8::from(*b == b'\n')))))
        .sum();
    breaks + usize::from(!text.is_empty() && !text.ends_with('\n'))
}

/// At most `bytes` from the start, ending at a line break when one is near the end.
fn cut_head(text: &str, bytes: usize) -> &str {
    let end = text.floor_char_boundary(bytes.min(text.len()));
    let head = &text[..end];
    match head.rfind('\n') {
        Some(at) if at >= end * 3 / 4 => &head[..at],
        _ => head,
    }
}

/// At most `bytes` from the end, starting after a line break when one is near the start.
fn cut_tail(text: &str, bytes: usize) -> &str {
    let start = text.ceil_char_boundary(text.len().saturating_sub(bytes));
    let tail = &text[start..];
    match tail.find('\n') {
        Some(at) if at <= tail.len() / 4 => &tail[at + 1..],
        _ => tail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::{Encoding, tokenize_len};

    fn count(text: &str) -> u32 {
        tokenize_len(Encoding::O200kBase, text)
    }

    #[test]
    fn keeps_head_and_tail_of_a_long_log_and_says_what_was_cut() {
        let log: String = (0..5000).map(|i| format!("line {i}: compiling crate number {i}\n")).collect();
        let cut = head_and_tail(&log, 1000, &count);
        assert!(count(&cut) <= 1000, "{} tokens", count(&cut));
        assert!(cut.starts_with("Total output lines: 5000\n\nline 0: compiling"));
        assert!(cut.trim_end().ends_with("line 4999: compiling crate number 4999"));
        assert!(cut.contains("tokens truncated…"));
        // Cut at line boundaries: every kept line is whole.
        for line in cut.lines().skip(2).filter(|l| l.starts_with("line ")) {
            assert!(line.ends_with(&format!("number {}", line[5..].split(':').next().unwrap())), "{line}");
        }
    }

    #[test]
    fn lines_are_counted_as_str_lines_counts_them() {
        let long = "line\n".repeat(300) + "end";
        for text in [
            "",
            "\n",
            "a",
            "a\n",
            "a\nb",
            "a\r\nb\r\n",
            "\n\n",
            "é\n€\n😀",
            "a\n\nb\n\n",
            &long,
            &long[..long.len() - 3],
        ] {
            assert_eq!(line_count(text), text.lines().count(), "{text:?}");
        }
    }

    #[test]
    fn never_cuts_inside_a_utf8_character() {
        let text = "é€😀".repeat(20_000);
        let cut = head_and_tail(&text, 500, &count);
        assert!(count(&cut) <= 500);
        assert!(cut.contains("tokens truncated…"));
    }
}
