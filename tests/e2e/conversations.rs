//! Conversations inside a session, against both stores: an agent's subagents and side requests
//! share its session id, yet each conversation compacts on its own lock and its own records, never
//! waits for another's summary, and a session keeps a bounded number of them.

use std::time::{Duration, Instant};

use crate::common::agents::{ADMIN_TOKEN, Agent, AgentSession, SessionSpec, Turn};
use crate::common::provider::{Errors, ProviderSim, ProviderSpec};
use crate::common::redis_server::RedisServer;
use crate::common::window::{Api, WindowSpec, conversation, conversation_opening, window_upstream};
use crate::common::*;
use serde_json::{Value, json};

/// A summarizer with a large window (`compaction.model`): one summary call per compaction.
const CONFIG: &str = "[models.big-summarizer]\ncontext_window = 200000\nmax_output_tokens = 8192\n[admin]\ntoken = \"admin\"\n[prune]\nenabled = false\n[truncate]\nenabled = false\n[compaction]\nkeep_recent_tokens = 600\nuser_message_max_tokens = 300\nemergency_protect_tokens = 1000000\nlock_wait_ms = 20000\nmodel = \"big-summarizer\"\n";
const WINDOW: usize = 4_000;
/// How long the slow summarizer takes to answer.
const SUMMARY: Duration = Duration::from_secs(2);
/// A subagent's task: the opening that makes it another conversation of the session.
const SUBAGENT_TASK: &str = "Find every caller of the parser and list them. The ticket is NEBULA-FINCH-9.";

/// Runs `test` against the memory store and, when Redis is available, the Redis store (without
/// one, the Redis half is skipped with a note, or fails under `COMPACTOR_REQUIRE_REDIS_TESTS=1`:
/// [`RedisServer::start`]); `store`
/// is TOML that ends inside the `[session]` table.
async fn with_each_store(test: impl AsyncFn(&str, Option<&RedisServer>)) {
    test("[session]\n", None).await;
    if let Some(redis) = RedisServer::start() {
        test(&redis.config(), Some(&redis)).await;
    }
}

/// A turn of session `session`.
async fn post(proxy: &ProxyProcess, api: Api, session: &str, body: &Value) -> Answer {
    proxy.post(api.path(), &[("authorization", "Bearer k"), ("x-api-key", "k"), ("x-session-id", session)], body).await
}

/// The answer and how long it took from when it was sent, `after` a pause.
async fn timed(proxy: &ProxyProcess, session: &str, body: &Value, after: Duration) -> (Answer, Duration) {
    tokio::time::sleep(after).await;
    let started = Instant::now();
    let answer = post(proxy, Api::Anthropic, session, body).await;
    (answer, started.elapsed())
}

/// Sends `bodies` once, in sessions of their own, so the timed requests find their token counts
/// cached: a debug build counts a cold 30 KB conversation in seconds on a busy machine, which is
/// not what these tests time.
async fn warm(proxy: &ProxyProcess, bodies: &[&Value]) {
    let sessions: Vec<String> = (0..bodies.len()).map(|i| format!("warm-up-{i}")).collect();
    let requests = bodies.iter().zip(&sessions).map(|(body, session)| post(proxy, Api::Anthropic, session, body));
    for answer in futures_util::future::join_all(requests).await {
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
}

async fn admin(proxy: &ProxyProcess, token: &str, session: &str) -> Value {
    proxy.get_with_token(&format!("/admin/sessions/{session}"), token).await.json()
}

/// Waits until the admin view of `session` satisfies `check`, and returns it.
async fn view_until(proxy: &ProxyProcess, token: &str, session: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let view = admin(proxy, token, session).await;
        if check(&view) {
            return view;
        }
        assert!(Instant::now() < deadline, "the session never looked as expected: {view}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The conversation `id` in an admin view, if the session keeps it.
fn conversation_in<'v>(view: &'v Value, id: &str) -> Option<&'v Value> {
    view["state"]["conversations"].as_array()?.iter().find(|c| c["id"] == id)
}

fn listed(view: &Value) -> Vec<String> {
    let conversations = view["state"]["conversations"].as_array().cloned().unwrap_or_default();
    conversations.iter().map(|c| c["id"].as_str().unwrap().to_string()).collect()
}

fn header(answer: &Answer, name: &str) -> String {
    answer.header(name).unwrap_or_else(|| panic!("no {name}: {}", answer.text())).to_string()
}

#[tokio::test]
async fn two_conversations_of_one_session_compact_side_by_side_and_one_conversation_once() {
    with_each_store(async |store, _| {
        let spec = WindowSpec { window: WINDOW, summary_delay: SUMMARY, ..WindowSpec::default() };
        let (_fake, summaries) = window_upstream(spec).await;
        let proxy = ProxyProcess::start(&_fake, &format!("{CONFIG}{store}"));
        let main = conversation(Api::Anthropic, 12, false);
        let subagent = conversation_opening(Api::Anthropic, SUBAGENT_TASK, 12, false);
        warm(&proxy, &[&main, &subagent]).await;
        let warmed = summaries.count();
        // The main loop, a retry of the same request, and a subagent 0.3 s later, all over the
        // window, all in one session.
        let ((first, first_took), (retry, retry_took), (other, other_took)) = tokio::join!(
            timed(&proxy, "agent-1", &main, Duration::ZERO),
            timed(&proxy, "agent-1", &main, Duration::ZERO),
            timed(&proxy, "agent-1", &subagent, Duration::from_millis(300)),
        );
        for answer in [&first, &retry, &other] {
            assert_eq!(answer.status, 200, "{}", answer.text());
            assert_eq!(answer.header("x-compactor-compacted"), Some("1"), "each conversation's first record");
        }
        assert_eq!(summaries.count() - warmed, 2, "one summary per conversation: the retry reused the main loop's");
        assert_eq!(header(&first, "x-compactor-session"), header(&other, "x-compactor-session"));
        assert_eq!(header(&first, "x-compactor-conversation"), header(&retry, "x-compactor-conversation"));
        assert_ne!(header(&first, "x-compactor-conversation"), header(&other, "x-compactor-conversation"));
        // Each waited for one summary, none for two: the subagent never queued behind the parent.
        let one_summary = SUMMARY + SUMMARY / 2;
        for (name, took) in [("main", first_took), ("retry", retry_took), ("subagent", other_took)] {
            assert!(
                took >= SUMMARY && took < one_summary,
                "{name} answered after {took:?}\n{}",
                proxy.logs().join("\n")
            );
        }
        let inputs = [summaries.input(warmed), summaries.input(warmed + 1)];
        assert_eq!(inputs.iter().filter(|input| input.contains("NEBULA-FINCH-9")).count(), 1);
        assert_eq!(inputs.iter().filter(|input| input.contains("ZEPHYR-LANTERN-42")).count(), 1);
    })
    .await;
}

#[tokio::test]
async fn replicas_share_each_conversations_lock_and_never_a_session_wide_one() {
    let Some(redis) = RedisServer::start() else { return };
    let spec = WindowSpec { window: WINDOW, summary_delay: SUMMARY, ..WindowSpec::default() };
    let (fake, summaries) = window_upstream(spec).await;
    let (one, two) = ProxyProcess::replicas(&fake, &format!("{CONFIG}{}", redis.config()));
    let main = conversation(Api::Anthropic, 12, false);
    let subagent = conversation_opening(Api::Anthropic, SUBAGENT_TASK, 12, false);
    let bodies = [&main, &subagent];
    tokio::join!(warm(&one, &bodies), warm(&two, &bodies));
    let warmed = summaries.count();
    let answers = tokio::join!(
        timed(&one, "agent-2", &main, Duration::ZERO),
        timed(&two, "agent-2", &main, Duration::from_millis(100)),
        timed(&two, "agent-2", &subagent, Duration::from_millis(300)),
        timed(&one, "agent-2", &subagent, Duration::from_millis(400)),
    );
    let answers = [answers.0, answers.1, answers.2, answers.3];
    for (answer, took) in &answers {
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert!(*took < SUMMARY + SUMMARY / 2, "answered after {took:?}");
    }
    assert_eq!(summaries.count() - warmed, 2, "one summary per conversation across both replicas");
}

/// Sends one agent turn to compactor and waits until compactor has stored it.
async fn send_turn(proxy: &ProxyProcess, turn: &Turn) -> Answer {
    let headers: Vec<(&str, &str)> = turn.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let answer = send(request("POST", &proxy.url(turn.path), &headers, turn.body.clone())).await;
    assert_eq!(answer.status, 200, "turn {}: {}", turn.index, answer.text());
    let (session, id) = (header(&answer, "x-compactor-session"), header(&answer, "x-compactor-conversation"));
    let stored = |view: &Value| {
        conversation_in(view, &id).and_then(|c| c["requests"].as_u64()).is_some_and(|n| n > turn.index as u64)
    };
    view_until(proxy, ADMIN_TOKEN, &session, stored).await;
    answer
}

#[tokio::test]
async fn a_subagent_inside_a_long_session_is_left_alone_while_small_and_compacted_on_its_own_record() {
    // Errors that name no window: compactor compacts when the provider refuses, on each
    // conversation's own history.
    let provider =
        ProviderSim::start(ProviderSpec { window: 30_000, errors: Errors::Unnamed, ..ProviderSpec::default() }).await;
    let config = "[compaction]\nkeep_recent_tokens = 4000\nemergency_protect_tokens = 1000000\n";
    let proxy = ProxyProcess::start_with(&provider.compactor_config(config), &[]);
    let spec = SessionSpec::new(Agent::ClaudeCode, "sim-model").outputs(&[1_500]);
    let mut parent = AgentSession::new(spec.clone());
    let mut last = None;
    for _ in 0..14 {
        last = Some(send_turn(&proxy, &parent.next_turn()).await);
    }
    let last = last.unwrap();
    assert_eq!(provider.summary_calls(), 1, "the main loop outgrew the window once");
    assert_eq!(last.header("x-compactor-compacted"), Some("1"));
    let session = header(&last, "x-compactor-session");
    let parent_id = header(&last, "x-compactor-conversation");

    let mut subagent = AgentSession::new(spec.subagent(0));
    let mut compacted_at = None;
    let parent_calls = provider.summary_calls();
    let mut subagent_id = String::new();
    for index in 0..20 {
        let turn = subagent.next_turn();
        let before = provider.summary_calls();
        let answer = send_turn(&proxy, &turn).await;
        assert_eq!(header(&answer, "x-compactor-session"), session, "a subagent runs in its parent's session");
        assert_ne!(header(&answer, "x-compactor-conversation"), parent_id);
        if index < 3 {
            assert_eq!(provider.last().body, turn.body, "turn {index}: a small subagent is forwarded byte for byte");
            assert_eq!(answer.header("x-compactor-compacted"), None, "not even the parent's record applies");
        }
        if answer.header("x-compactor-compacted").is_some() {
            assert_eq!(
                answer.header("x-compactor-compacted"),
                Some("1"),
                "its own first record, not the parent's second"
            );
            // One summary call for the subagent, prepared in the background (on by default) by
            // a turn before this one, which applied it with no call of its own: the same call a
            // turn or two earlier.
            assert_eq!(provider.summary_calls(), parent_calls + 1, "turn {index}");
            assert_eq!(provider.summary_calls(), before, "turn {index}: applied, not summarized");
            compacted_at = Some(index);
            subagent_id = header(&answer, "x-compactor-conversation");
            break;
        }
        assert!(provider.summary_calls() <= parent_calls + 1, "turn {index}: at most the one prepared ahead");
    }
    let compacted_at = compacted_at.expect("the subagent outgrew the window and was compacted");
    assert!(compacted_at >= 3);
    let summary = provider.records().into_iter().rfind(|r| r.summary).unwrap();
    let own: Vec<&String> =
        summary.markers.iter().filter(|m| subagent.facts().iter().any(|f| &&f.marker == m)).collect();
    assert!(!own.is_empty(), "the subagent's summary read the subagent's facts: {:?}", summary.markers);
    assert!(
        parent.facts().iter().all(|f| !summary.markers.contains(&f.marker)),
        "and nothing of its parent's: {:?}",
        summary.markers
    );

    // The parent goes on with its own record. Its growth may start its own next summary in the
    // background (its next compaction, a turn or two ahead): about its own history only.
    let calls = provider.summary_calls();
    let answer = send_turn(&proxy, &parent.next_turn()).await;
    assert_eq!(answer.header("x-compactor-compacted"), Some("1"));
    let prepared: Vec<_> = provider.records().into_iter().filter(|r| r.summary).skip(calls).collect();
    assert!(prepared.len() <= 1, "{} summary calls for one turn", prepared.len());
    for summary in &prepared {
        assert!(
            subagent.facts().iter().all(|f| !summary.markers.contains(&f.marker)),
            "the parent's summary reads nothing of the subagent's: {:?}",
            summary.markers
        );
    }
    let view = admin(&proxy, ADMIN_TOKEN, &session).await;
    assert_eq!(listed(&view).len(), 2, "{view}");
    let records = |id: &str| conversation_in(&view, id).unwrap()["compactions"].as_array().unwrap().clone();
    assert_eq!(records(&subagent_id).len(), 1, "the subagent holds its own record");
    let parent_records = records(&parent_id);
    assert_eq!(parent_records[0]["generation"], 1, "and the parent its own: {parent_records:?}");
    assert!(parent_records.len() <= 2, "its own, and the one prepared for later: {parent_records:?}");
}

/// A small request opening with `task`: a conversation of its own with nothing to summarize.
fn small(task: &str) -> Value {
    json!({"model": "gpt-4o", "messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": task}]})
}

#[tokio::test]
async fn a_session_keeps_its_most_recently_used_conversations_up_to_the_bound() {
    with_each_store(async |store, redis| {
        let (_fake, proxy) = ProxyProcess::with_fake(&format!(
            "[admin]\ntoken = \"admin\"\n{store}max_conversations = 3\nttl_secs = 3600\n"
        ))
        .await;
        let mut ids = std::collections::HashMap::new();
        let mut session = String::new();
        // a, b, c; a again; then d: b is the least recently used.
        for (step, name) in ["a", "b", "c", "a", "d"].into_iter().enumerate() {
            let answer = post(&proxy, Api::Chat, "many", &small(&format!("Title for task {name}"))).await;
            assert_eq!(answer.status, 200);
            session = header(&answer, "x-compactor-session");
            let id = header(&answer, "x-compactor-conversation");
            ids.insert(name, id.clone());
            view_until(&proxy, "admin", &session, |view| view["state"]["counters"]["requests"] == step as u64 + 1)
                .await;
        }
        let view = admin(&proxy, "admin", &session).await;
        assert_eq!(listed(&view), [&ids["d"], &ids["a"], &ids["c"]].map(String::clone), "most recent first: {view}");
        assert_eq!(conversation_in(&view, &ids["a"]).unwrap()["requests"], 2);
        assert_eq!(view["state"]["counters"]["requests"], 5, "the session's counters count every conversation");
        if let Some(redis) = redis {
            let keys = redis.keys();
            assert!(keys.iter().all(|k| !k.contains(&ids["b"])), "the dropped conversation's keys are gone: {keys:?}");
            assert!(keys.iter().any(|k| k.contains(&ids["c"])), "{keys:?}");
            let mut connection = redis.connection();
            for key in &keys {
                let ttl: i64 = redis::cmd("TTL").arg(key).query(&mut connection).unwrap();
                assert!(ttl > 0 && ttl <= 3600, "{key} has TTL {ttl}");
                // The index by agent session id is shared by a session's tenants, the inspector's
                // list of recent sessions by all: their own slots.
                let indexed = key.contains(":by-session:") || key.ends_with(":recent");
                assert!(indexed || key.contains(&format!("{{{session}}}")), "{key} lacks the session's hash tag");
            }
            let kept: u64 = redis::cmd("ZCARD")
                .arg(format!("{}:{{{session}}}:conversations", redis.prefix))
                .query(&mut connection)
                .unwrap();
            assert_eq!(kept, 3);
        }
        // Forgetting the session forgets every conversation.
        let forgotten = proxy.call_with_token("DELETE", &format!("/admin/sessions/{session}"), "admin").await;
        assert_eq!(forgotten.json()["forgotten"], true);
        assert_eq!(proxy.get_with_token(&format!("/admin/sessions/{session}"), "admin").await.status, 404);
        if let Some(redis) = redis {
            assert_eq!(redis.keys(), Vec::<String>::new());
        }
    })
    .await;
}

#[tokio::test]
async fn the_admin_request_to_compact_waits_for_a_conversation_with_something_to_summarize() {
    with_each_store(async |store, _| {
        let (_fake, summaries) = window_upstream(WindowSpec::window(1_000_000)).await;
        let proxy = ProxyProcess::start(&_fake, &format!("{CONFIG}{store}"));
        let main = conversation(Api::Chat, 12, false);
        let session = header(&post(&proxy, Api::Chat, "asked", &main).await, "x-compactor-session");
        // The request's state is written after its answer; only a session the store holds is marked.
        view_until(&proxy, "admin", &session, |view| view["state"]["counters"]["requests"] == 1).await;
        let marked = proxy.call_with_token("POST", &format!("/admin/sessions/{session}/compact"), "admin").await;
        assert_eq!(marked.status, 202);
        view_until(&proxy, "admin", &session, |view| view["state"]["counters"]["compact_requested"] == 1).await;

        // A title request beside the main loop: nothing to summarize, the request stands.
        let title = post(&proxy, Api::Chat, "asked", &small("Write a title for this session")).await;
        assert_eq!(title.header("x-compactor-compacted"), None);
        let view = view_until(&proxy, "admin", &session, |view| view["state"]["counters"]["requests"] == 2).await;
        assert_eq!(view["state"]["counters"]["compact_requested"], 1, "{view}");
        assert_eq!(summaries.count(), 0);

        let answer = post(&proxy, Api::Chat, "asked", &main).await;
        assert_eq!(answer.header("x-compactor-compacted"), Some("1"));
        assert_eq!(summaries.count(), 1);
        let view = view_until(&proxy, "admin", &session, |view| view["state"]["counters"]["requests"] == 3).await;
        assert_eq!(view["state"]["counters"]["compact_requested"], 0);
        let main_id = header(&answer, "x-compactor-conversation");
        assert_eq!(conversation_in(&view, &main_id).unwrap()["compactions"][0]["trigger"], "admin");
    })
    .await;
}

#[tokio::test]
async fn keys_of_the_previous_layout_are_ignored_and_forgotten_with_the_session() {
    let Some(redis) = RedisServer::start() else { return };
    let (fake, summaries) = window_upstream(WindowSpec::window(WINDOW)).await;
    let proxy = ProxyProcess::start(&fake, &format!("{CONFIG}{}", redis.config()));
    let small_answer = post(&proxy, Api::Anthropic, "upgraded", &conversation(Api::Anthropic, 1, false)).await;
    let session = header(&small_answer, "x-compactor-session");
    // What the previous version wrote for this session, including a lock it never released.
    let old = |part: &str| format!("{}:{{{session}}}:{part}", redis.prefix);
    let mut connection = redis.connection();
    let _: () = redis::pipe()
        .hset_multiple(old("counters"), &[("requests", 40), ("compaction_failures", 99), ("failures_at_messages", 28)])
        .set(
            old("usage"),
            "{\"v\":1,\"prompt_tokens\":999999,\"cached_tokens\":0,\"output_tokens\":1,\"message_count\":2}",
        )
        .rpush(old("compactions"), "not json")
        .sadd(old("pruned"), "call_0")
        .set_ex(old("lock"), "old-owner", 3600)
        .query(&mut connection)
        .unwrap();

    let answer = post(&proxy, Api::Anthropic, "upgraded", &conversation(Api::Anthropic, 12, false)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("x-compactor-compacted"), Some("1"), "the old lock and breaker stop nothing");
    assert_eq!(summaries.count(), 1);
    let view = view_until(&proxy, "admin", &session, |view| view["state"]["counters"]["requests"] == 2).await;
    assert_eq!(listed(&view), [header(&answer, "x-compactor-conversation")], "{view}");
    assert_eq!(view["state"]["conversations"][0]["requests"], 2, "the small request was the same conversation");

    let forgotten = proxy.call_with_token("DELETE", &format!("/admin/sessions/{session}"), "admin").await;
    assert_eq!(forgotten.json()["forgotten"], true);
    assert_eq!(redis.keys(), Vec::<String>::new(), "the previous layout's keys went too");
}
