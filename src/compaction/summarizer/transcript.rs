//! The summarizer's transcript: the covered part of the conversation as plain-text entries (each
//! tool output cut to head and tail, the lines that state something kept from its middle), and
//! the pieces a rolling summary reads them in.

use std::collections::VecDeque;

use crate::conversation::{Kind, Role};
use crate::dialect::ParsedRequest;
use crate::rewrite::truncate::head_and_tail;

/// The transcript of messages `from..cut`, one entry per item, each tool output cut to
/// `per_output` tokens (its head and tail); the user's own words are never cut.
pub fn transcript_entries(
    parsed: &ParsedRequest,
    from: usize,
    cut: usize,
    per_output: u32,
    count: &dyn Fn(&str) -> u32,
) -> Vec<String> {
    let cut_to = |text: &str, budget: u32| {
        if count(text) > budget { head_and_tail(text, budget.max(16), count) } else { text.to_string() }
    };
    let mut entries = Vec::new();
    for item in parsed.conversation.items.iter().filter(|i| i.message >= from && i.message < cut) {
        let line = match &item.kind {
            Kind::Text { role: Role::User, text } => format!("USER: {text}"),
            Kind::Text { text, .. } => format!("ASSISTANT: {text}"),
            Kind::System { text } => format!("SYSTEM: {text}"),
            Kind::ToolCall { id, name, arguments } => {
                format!(
                    "ASSISTANT CALLED TOOL {name} [{}]: {}",
                    id.as_deref().unwrap_or("-"),
                    cut_to(arguments, per_output / 4)
                )
            }
            Kind::ToolResult { call_id, text, attachments } => {
                let note =
                    if *attachments > 0 { format!(" (+{attachments} attachments omitted)") } else { String::new() };
                let text = cut_keeping_facts(text, per_output, count);
                format!("TOOL RESULT [{}]{note}: {text}", call_id.as_deref().unwrap_or("-"))
            }
            Kind::Attachment => "[attachment omitted]".to_string(),
            Kind::Thinking { .. } => continue,
            Kind::Other { .. } => "[unsupported content omitted]".to_string(),
        };
        entries.push(line);
    }
    entries
}

/// A tool output cut to `budget` tokens for the summarizer: its head and tail and, from the middle
/// the cut removes, the lines that state something (`key: value`, `key = value`, errors, warnings,
/// failures), in order, in up to a quarter of the budget. A fact the agent read in the middle of a
/// long output still reaches the summary.
fn cut_keeping_facts(text: &str, budget: u32, count: &dyn Fn(&str) -> u32) -> String {
    let total = count(text).max(1);
    let budget = budget.max(16);
    if total <= budget {
        return text.to_string();
    }
    let bytes_per_token = text.len() as f64 / f64::from(total);
    let fact_bytes = (f64::from(budget / 4) * bytes_per_token) as usize;
    // head_and_tail with the rest of the budget keeps about 3/8 of it at each end.
    let edge = (f64::from(budget * 3 / 8) * bytes_per_token) as usize;
    let (from, to) =
        (text.ceil_char_boundary(edge.min(text.len())), text.floor_char_boundary(text.len().saturating_sub(edge)));
    let mut facts = String::new();
    if from < to {
        let middle = &text[from..to];
        // Whole lines only: the first and last lines of the middle may be cut.
        let whole = match (middle.find('\n'), middle.rfind('\n')) {
            (Some(first), Some(last)) if first < last => &middle[first + 1..last],
            _ => "",
        };
        for line in whole.lines().map(str::trim).filter(|line| looks_like_fact(line)) {
            if facts.len() + line.len() + 1 > fact_bytes {
                break;
            }
            facts.push_str(line);
            facts.push('\n');
        }
    }
    if facts.is_empty() {
        return head_and_tail(text, budget, count);
    }
    let room = budget.saturating_sub(count(&facts) + 16).max(16);
    let mut out = head_and_tail(text, room, count);
    out.push_str("\nLines kept from the cut middle:\n");
    out.push_str(&facts);
    out
}

/// A short line that states something: `key: value`, `key = value`, or an error, warning or
/// failure.
fn looks_like_fact(line: &str) -> bool {
    if !(6..=240).contains(&line.len()) {
        return false;
    }
    let keyed = line.split_once([':', '=']).is_some_and(|(key, value)| {
        let key = key.trim();
        !key.is_empty()
            && key.len() <= 48
            && !value.trim().is_empty()
            && key.chars().all(|c| c.is_alphanumeric() || " _-./\"'".contains(c))
    });
    let alarming = ["error", "fail", "warn", "panic", "exception", "fatal"]
        .iter()
        .any(|word| line.as_bytes().windows(word.len()).any(|w| w.eq_ignore_ascii_case(word.as_bytes())));
    keyed || alarming
}

/// What one summary call reads: the summary so far, then the piece.
pub(super) fn render(summary: Option<&str>, piece: &str) -> String {
    let mut out = String::with_capacity(piece.len() + summary.map_or(0, str::len) + 64);
    if let Some(summary) = summary {
        out.push_str("SUMMARY OF THE EARLIER CONVERSATION:\n");
        out.push_str(summary);
        out.push_str("\n\n");
    }
    out.push_str(piece);
    out.push_str("\n\n");
    out
}

/// The next piece of a rolling summary: the oldest entries, in order, up to `room` tokens (at
/// least one entry, or the first part of one larger than `room`, split at a line or character
/// boundary, its rest left first in `entries`). Nothing is dropped. Linear in the piece's size.
pub fn next_piece(entries: &mut VecDeque<String>, room: u32, count: &dyn Fn(&str) -> u32) -> String {
    let mut piece = String::new();
    let mut used = 0u32;
    while let Some(entry) = entries.front() {
        let tokens = count(entry) + 2;
        if used + tokens <= room {
            used += tokens;
            if !piece.is_empty() {
                piece.push_str("\n\n");
            }
            piece.push_str(entry);
            entries.pop_front();
            continue;
        }
        if piece.is_empty() {
            // One entry larger than the room: cut in parts of about the room, in order; the first
            // goes now, the others stay first in line.
            let Some(entry) = entries.pop_front() else { break };
            let mut parts = split_text(&entry, room, tokens);
            let first = parts.remove(0);
            for part in parts.into_iter().rev() {
                entries.push_front(part);
            }
            piece = first;
        }
        break;
    }
    piece
}

/// `text` (`tokens` long) in consecutive parts of about `room` tokens: each ends at a line end
/// in its second half, else (inside an overlong line) after a space there, so a word (a value, a
/// path) stays whole, else at a character boundary. Nothing is dropped: the parts joined are the
/// text. Linear in the text.
fn split_text(text: &str, room: u32, tokens: u32) -> Vec<String> {
    let share = f64::from(room.max(1)) / f64::from(tokens.max(1));
    let step = ((text.len() as f64 * share * 0.9) as usize).max(1);
    let mut parts = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let mut end = text.ceil_char_boundary((start + step).min(text.len()));
        if end < text.len() {
            let part = &text[start..end];
            let at = |found: Option<usize>| found.filter(|&n| n >= step / 2).map(|n| start + n + 1);
            if let Some(cut) = at(part.rfind('\n')).or_else(|| at(part.rfind(' '))) {
                end = cut;
            }
        }
        parts.push(text[start..end].to_string());
        start = end;
    }
    if parts.is_empty() {
        parts.push(String::new());
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(text: &str) -> u32 {
        (text.len() / 4) as u32
    }

    #[test]
    fn a_long_output_keeps_head_tail_and_the_facts_from_its_middle_within_the_budget() {
        let mut lines: Vec<String> = (0..3_000).map(|i| format!("row {i} of the listing")).collect();
        lines[1_400] = "DEPLOY_KEY = ZEPHYR-LANTERN-42".to_string();
        lines[1_700] = "  error: disk full on /var/lib/build".to_string();
        let text = lines.join("\n");
        let cut = cut_keeping_facts(&text, 400, &count);
        assert!(count(&cut) <= 400, "{} tokens", count(&cut));
        assert!(cut.starts_with("Total output lines: 3000") && cut.contains("row 0 of") && cut.contains("row 2999 of"));
        assert!(cut.contains("DEPLOY_KEY = ZEPHYR-LANTERN-42\nerror: disk full on /var/lib/build\n"), "{cut}");
        assert!(!cut.contains("row 1500 of"), "the middle is cut");
    }

    #[test]
    fn an_output_without_facts_is_cut_to_head_and_tail_and_a_short_one_is_kept() {
        let text: String = (0..3_000).map(|i| format!("row {i} of the listing\n")).collect();
        assert_eq!(cut_keeping_facts(&text, 400, &count), head_and_tail(&text, 400, &count));
        assert_eq!(cut_keeping_facts("short: output", 400, &count), "short: output");
        assert!(!looks_like_fact("row 12 of the listing") && looks_like_fact("status: green"));
    }

    #[test]
    fn an_output_larger_than_a_piece_is_read_in_consecutive_parts_at_line_ends_and_nothing_is_lost() {
        let lines: Vec<String> = (0..400).map(|i| format!("line {i} of the build log, all green")).collect();
        let text = lines.join("\n");
        let mut entries: VecDeque<String> = [text.clone()].into();
        let mut parts = Vec::new();
        while !entries.is_empty() {
            let piece = next_piece(&mut entries, 500, &count);
            assert!(count(&piece) <= 500, "{} tokens", count(&piece));
            parts.push(piece);
        }
        assert!(parts.len() >= 4, "{} parts", parts.len());
        assert_eq!(parts.concat(), text, "the parts are the text, in order");
        assert!(parts[..parts.len() - 1].iter().all(|p| p.ends_with('\n')), "every cut at a line end");
    }

    #[test]
    fn a_single_long_line_is_cut_between_words_so_a_value_stays_whole() {
        let words: Vec<String> = (0..2_000).map(|i| format!("ZEPHYR-LANTERN-{i}")).collect();
        let text = words.join(" ");
        let parts = split_text(&text, 300, count(&text));
        assert!(parts.len() > 5);
        assert_eq!(parts.concat(), text);
        for part in &parts {
            assert!(part.split(' ').filter(|w| !w.is_empty()).all(|w| words.contains(&w.to_string())), "{part}");
        }
        // No line end and no space: cut at character boundaries, still nothing lost.
        let wide = "\u{00e9}".repeat(3_000);
        let parts = split_text(&wide, 100, count(&wide));
        assert_eq!(parts.concat(), wide);
    }
}
