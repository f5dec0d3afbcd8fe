//! An agent's own compaction request goes through the real binary byte for byte, even when
//! compactor is configured to prune, truncate and compact as hard as it can: the agent is
//! summarizing its own history, and a rewrite would only get in its way.

use crate::common::*;

/// Prune everything but the newest token, cut every tool output to 20 tokens, and a window so small
/// that every request is over the compaction threshold.
const AGGRESSIVE: &str = "[prune]\nprotect_tokens = 1\nminimum_tokens = 1\n[truncate]\ntool_output_max_tokens = 20\n\
[models.default]\ncontext_window = 1000\nmax_output_tokens = 100\n";

/// `(file name, endpoint, body)` of every fixture in `tests/fixtures/agents/`, named
/// `<agent>-<request>.<chat|messages|responses>.json`.
fn agent_requests() -> Vec<(String, &'static str, Vec<u8>)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/agents");
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?.to_string();
            let endpoint = match name.strip_suffix(".json")?.rsplit('.').next()? {
                "chat" => "/v1/chat/completions",
                "messages" => "/v1/messages",
                "responses" => "/v1/responses",
                _ => return None,
            };
            Some((name, endpoint, std::fs::read(&path).unwrap()))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Sends each request in turn; returns, per request, whether the upstream got other bytes and how
/// many upstream calls it cost.
async fn forward_each(extra_config: &str) -> Vec<(String, bool, usize)> {
    let fake = FakeUpstream::start().await;
    let proxy = ProxyProcess::start(&fake, &format!("{AGGRESSIVE}{extra_config}"));
    let mut outcomes = Vec::new();
    for (name, endpoint, body) in agent_requests() {
        let before = fake.received().len();
        let answer = send(request(
            "POST",
            &proxy.url(endpoint),
            &[("content-type", "application/json"), ("x-session-id", &name), ("x-api-key", "sk-test")],
            body.clone(),
        ))
        .await;
        assert_eq!(answer.status, 200, "{name}: {}", answer.text());
        let calls = fake.received().len() - before;
        let forwarded = fake.received().into_iter().rev().find(|r| r.path_and_query.starts_with(endpoint)).unwrap();
        outcomes.push((name, forwarded.body != body, calls));
    }
    outcomes
}

#[tokio::test]
async fn each_agents_own_compaction_request_is_forwarded_byte_for_byte_under_aggressive_pruning() {
    let outcomes = forward_each("").await;
    assert!(outcomes.len() >= 11, "expected the agent fixtures, found {}", outcomes.len());
    let touched: Vec<_> = outcomes.iter().filter(|(_, changed, calls)| *changed || *calls != 1).collect();
    assert!(touched.is_empty(), "rewritten or summarized (name, changed, upstream calls): {touched:?}");
}

#[tokio::test]
async fn without_the_markers_the_same_requests_would_be_rewritten() {
    // The control: the configuration above really does rewrite these bodies when nothing says they
    // are the agent's own compaction, so the test above proves the markers, not a lenient setting.
    let outcomes = forward_each("[compaction]\nagent_markers = []\n").await;
    let rewritten = outcomes.iter().filter(|(_, changed, _)| *changed).count();
    assert!(rewritten >= 6, "only {rewritten} of {} rewritten: {outcomes:?}", outcomes.len());
}
