use super::*;
use crate::conversation::Edit;

fn rewriter() -> Rewriter {
    let mut settings = crate::config::Config::default().rewrite_settings();
    settings.prune.protect_tokens = 50;
    settings.prune.minimum_tokens = 10;
    settings.blocking_tokenize_bytes = usize::MAX;
    Rewriter::new(settings, TokenCounter::new(1 << 20), ModelTable::default())
}

/// A Responses conversation: a code interpreter run whose two logs compactor cannot write
/// back (so the parse does not let a policy shorten it), then a function call and its output.
fn responses_body() -> String {
    let logs = "building crate number 12 of 80\n".repeat(40);
    let output = "line of a long file listing\n".repeat(40);
    serde_json::json!({
        "model": "gpt-5",
        "input": [
            {"type": "message", "role": "user", "content": "run the build and list the files"},
            {"type": "code_interpreter_call", "id": "ci_1", "code": "build()", "outputs": [
                {"type": "logs", "logs": logs}, {"type": "logs", "logs": "done"}]},
            {"type": "function_call", "call_id": "f1", "name": "list", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "f1", "output": output},
            {"type": "message", "role": "user", "content": "thanks"},
        ],
    })
    .to_string()
}

/// Rewrites `body` after `tamper` changed the parse: what a parser and a renderer that
/// disagree about an item would leave.
fn rewrite_tampered(body: &str, tamper: impl FnOnce(&mut ParsedRequest)) -> (Rewritten, RewriteReport) {
    let rewriter = rewriter();
    let untouched = rewriter.rewrite_body(Dialect::Responses, body.as_bytes(), &BTreeSet::new()).unwrap();
    let mut parsed = ParsedRequest::parse(Dialect::Responses, body.as_bytes()).unwrap();
    let model = rewriter.models.lookup("gpt-5");
    rewriter.count_items(&mut parsed, model.encoding);
    tamper(&mut parsed);
    let pruned = BTreeSet::new();
    (rewriter.apply(&mut parsed, model, &History::eager(&pruned), &rewriter.settings), untouched.report)
}

#[test]
fn a_result_the_render_cannot_replace_is_neither_counted_as_saved_nor_recorded_as_pruned() {
    let body = responses_body();
    // The code interpreter's result marked shortenable: prune picks it, the render cannot
    // write its replacement and sends the original.
    let (rewritten, untouched) = rewrite_tampered(&body, |parsed| {
        for item in &mut parsed.conversation.items {
            if matches!(&item.kind, Kind::ToolResult { call_id: Some(id), .. } if id == "ci_1") {
                item.shortenable = true;
            }
        }
    });
    let report = &rewritten.report;
    assert!(!report.pruned_call_ids.iter().any(|id| id == "ci_1"), "{:?}", report.pruned_call_ids);
    assert_eq!(report.tokens_after, untouched.tokens_after, "the same bytes went as without the tampering");
    assert_eq!(report.saved_by_prune, untouched.saved_by_prune);
    let sent = rewritten.body.as_deref().unwrap_or(body.as_bytes());
    let sent = std::str::from_utf8(sent).unwrap();
    assert!(sent.contains("building crate number 12 of 80"), "the logs went as they came");
}

#[test]
fn a_replaced_message_that_goes_as_it_came_saves_nothing() {
    let body = responses_body();
    let (rewritten, untouched) = rewrite_tampered(&body, |parsed| {
        let first = parsed.conversation.items.iter_mut().find(|i| matches!(i.kind, Kind::Text { .. })).unwrap();
        first.edit = Edit::Replace("[cleared]".into());
    });
    let report = &rewritten.report;
    assert_eq!(report.tokens_after, untouched.tokens_after);
    assert_eq!(
        (report.saved_by_truncate, report.saved_by_prune, report.saved_by_dedupe),
        (untouched.saved_by_truncate, untouched.saved_by_prune, untouched.saved_by_dedupe)
    );
    assert_eq!(
        report.tokens_before.saturating_sub(report.tokens_after),
        untouched.tokens_before - untouched.tokens_after
    );
}
