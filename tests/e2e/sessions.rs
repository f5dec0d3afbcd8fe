//! Sessions, against both stores: decisions outlive a request and a process, tenants never share
//! state, Redis trouble never stops the proxy, and the admin API shows what was decided.

use std::time::{Duration, Instant};

use crate::common::redis_server::RedisServer;
use crate::common::*;
use serde_json::{Value, json};

/// Whether a message's content is the placeholder of a pruned output of the `run` calls here.
fn pruned(content: &Value) -> bool {
    content.as_str().is_some_and(|text| cleared(text, "run", "{}"))
}
const WINDOWS: &str = "[prune]\nprotect_tokens = 300\nminimum_tokens = 100\n[admin]\ntoken = \"admin-secret\"\n";

/// The inspector records nothing.
const UNRECORDED: &str = "[inspector]\nrequests_per_conversation = 0\n";

fn history(calls: usize) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "Fix the build."})];
    for i in 0..calls {
        let id = format!("call_{i}");
        let size = if i == calls - 1 { 400 } else { 200 };
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "run", "arguments": "{}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": tool_output(&id, size)}));
    }
    json!({"model": "gpt-4o", "messages": messages})
}

/// The first two calls only, as an agent that rewound would send: not prunable on its own.
fn rewound() -> Value {
    let full = history(3);
    json!({"model": "gpt-4o", "messages": full["messages"].as_array().unwrap()[..5]})
}

/// A chat request of session `session` under credential `key`.
async fn post(proxy: &ProxyProcess, key: &str, session: &str, body: &Value) -> Answer {
    let bearer = format!("Bearer {key}");
    proxy.post("/v1/chat/completions", &[("authorization", &bearer), ("x-session-id", session)], body).await
}

/// Waits until the pruned-ness of the rewound history through `proxy` is `expected`.
async fn rewound_is_pruned(fake: &FakeUpstream, proxy: &ProxyProcess, key: &str, session: &str) -> bool {
    post(proxy, key, session, &rewound()).await;
    pruned(&fake.last().json()["messages"][2]["content"])
}

/// Runs `test` against the memory store and, when Redis is available, the Redis store (without
/// one, the Redis half is skipped with a note, or fails under `COMPACTOR_REQUIRE_REDIS_TESTS=1`:
/// [`RedisServer::start`]).
async fn with_each_store(test: impl AsyncFn(&str, Option<&RedisServer>)) {
    test("", None).await;
    if let Some(redis) = RedisServer::start() {
        test(&redis.config(), Some(&redis)).await;
    }
}

#[tokio::test]
async fn a_session_remembers_what_was_pruned_and_tenants_never_share_it() {
    with_each_store(async |store, _| {
        let (fake, proxy) = ProxyProcess::with_fake(&format!("{WINDOWS}{store}")).await;
        let answer = post(&proxy, "key-a", "shared-id", &history(3)).await;
        assert_eq!(answer.header("x-compactor-pruned"), Some("2"));
        let session = answer.header("x-compactor-session").unwrap().to_string();
        assert!(!session.contains("key-a"));
        assert!(eventually(async || rewound_is_pruned(&fake, &proxy, "key-a", "shared-id").await).await);
        // Same session id under another credential: another tenant, nothing shared.
        assert!(!rewound_is_pruned(&fake, &proxy, "key-b", "shared-id").await);
        let other = post(&proxy, "key-b", "shared-id", &rewound()).await;
        assert_ne!(other.header("x-compactor-session").unwrap(), session);
    })
    .await;
}

#[tokio::test]
async fn the_admin_api_shows_and_forgets_a_session_and_never_reaches_upstream() {
    with_each_store(async |store, redis| {
        let (fake, proxy) = ProxyProcess::with_fake(&format!("{WINDOWS}{store}")).await;
        let mut streamed = history(3);
        streamed["stream"] = json!(true);
        let answer = post(&proxy, "key-a", "s1", &streamed).await;
        let session = answer.header("x-compactor-session").unwrap().to_string();
        let conversation = answer.header("x-compactor-conversation").unwrap().to_string();
        let admin = |method: &str, token: &str| {
            request(method, &proxy.url(&format!("/admin/sessions/{session}")), &[("authorization", token)], "")
        };
        let upstream_requests = fake.received().len();

        assert_eq!(send(admin("GET", "Bearer wrong")).await.status, 401);
        assert_eq!(send(request("GET", &proxy.url(&format!("/admin/sessions/{session}")), &[], "")).await.status, 401);
        let mut state = Value::Null;
        assert!(
            eventually(async || {
                state = send(admin("GET", "Bearer admin-secret")).await.json();
                state["state"]["conversations"][0]["usage"]["prompt_tokens"] == 12
            })
            .await,
            "{state}"
        );
        let only = &state["state"]["conversations"][0];
        assert_eq!(state["state"]["conversations"].as_array().unwrap().len(), 1);
        assert_eq!(only["id"], conversation.as_str());
        assert_eq!(only["pruned"], json!(["call_0", "call_1"]));
        assert_eq!(only["pruned_count"], 2);
        assert_eq!((only["requests"].as_u64(), only["messages"].as_u64()), (Some(1), Some(7)));
        assert!(only["last_used_unix_ms"].as_u64().unwrap() > 1_600_000_000_000, "{only}");
        assert_eq!(only["usage"]["output_tokens"], 2, "usage read from the stream's final chunk");
        assert_eq!(state["state"]["counters"]["requests"], 1);
        assert!(state["state"]["counters"]["tokens_saved"].as_u64().unwrap() > 0);

        let forgotten = send(admin("DELETE", "Bearer admin-secret")).await;
        assert_eq!(forgotten.json()["forgotten"], true);
        assert_eq!(send(admin("GET", "Bearer admin-secret")).await.status, 404);
        if let Some(redis) = redis {
            assert_eq!(redis.keys(), Vec::<String>::new(), "every key of the session is gone");
        }
        assert_eq!(fake.received().len(), upstream_requests, "admin requests must not reach the upstream");
    })
    .await;
}

#[tokio::test]
async fn without_an_admin_token_the_admin_api_does_not_exist() {
    let (fake, proxy) = ProxyProcess::with_fake("").await;
    let answer = send(request("GET", &proxy.url("/admin/sessions/x"), &[("authorization", "Bearer ")], "")).await;
    assert_eq!(answer.status, 404);
    assert!(fake.received().is_empty());
}

#[tokio::test]
async fn usage_capture_does_not_delay_stream_chunks() {
    with_each_store(async |store, _| {
        let fake = FakeUpstream::builder().pacing(Pacing::Gated).start().await;
        let proxy = ProxyProcess::start(&fake, store);
        let body = messages_body(true);
        let response = client()
            .request(request("POST", &proxy.url("/v1/messages"), &[("x-api-key", "k"), ("x-session-id", "s")], body))
            .await
            .unwrap();
        let mut body = response.into_body();
        let first = next_chunk(&mut body, Duration::from_secs(5)).await.unwrap();
        assert_eq!(first, fake::anthropic_stream(&["Hel", "lo"])[0].as_bytes());
        for _ in 0..10 {
            fake.release();
        }
        while next_chunk(&mut body, Duration::from_secs(5)).await.is_some() {}
    })
    .await;
}

#[tokio::test]
async fn two_replicas_sharing_redis_apply_each_others_decisions() {
    let Some(redis) = RedisServer::start() else { return };
    let fake = FakeUpstream::start().await;
    let config = format!("{WINDOWS}{}", redis.config());
    let (one, two) = ProxyProcess::replicas(&fake, &config);
    assert!(!rewound_is_pruned(&fake, &two, "key", "s").await, "nothing decided yet");
    post(&one, "key", "s", &history(3)).await;
    assert!(eventually(async || rewound_is_pruned(&fake, &two, "key", "s").await).await);
}

#[tokio::test]
async fn every_key_has_a_ttl_and_one_session_shares_one_hash_tag() {
    let Some(redis) = RedisServer::start() else { return };
    let (_fake, proxy) = ProxyProcess::with_fake(&format!("{WINDOWS}{}\nttl_secs = 3600\n", redis.config())).await;
    let answer = post(&proxy, "key", "s", &history(3)).await;
    let session = answer.header("x-compactor-session").unwrap().to_string();
    assert!(eventually(async || redis.keys().len() >= 2).await, "{:?}", redis.keys());
    let mut connection = redis.connection();
    for key in redis.keys() {
        let ttl: i64 = redis::cmd("TTL").arg(&key).query(&mut connection).unwrap();
        assert!(ttl > 0 && ttl <= 3600, "{key} has TTL {ttl}");
        // The index by agent session id is shared by a session's tenants, the inspector's list of
        // recent sessions by all: their own slots.
        if key.contains(":by-session:") || key.ends_with(":recent") {
            continue;
        }
        assert!(key.contains(&format!("{{{session}}}")), "{key} lacks the session's hash tag");
    }
}

#[tokio::test]
async fn redis_going_away_never_stops_the_proxy_and_state_returns_with_it() {
    let Some(mut redis) = RedisServer::restartable() else { return };
    let (_fake, proxy) = ProxyProcess::with_fake(&format!("{WINDOWS}{}", redis.config())).await;
    assert_eq!(post(&proxy, "key", "s", &history(3)).await.status, 200);

    redis.stop();
    for _ in 0..5 {
        let started = Instant::now();
        let answer = post(&proxy, "key", "s", &history(3)).await;
        assert_eq!(answer.status, 200);
        assert!(started.elapsed() < Duration::from_secs(2), "a request waited on Redis");
        // Without stored state the policies still prune what they can on their own.
        assert_eq!(answer.header("x-compactor-pruned"), Some("2"));
    }
    let ready = send(request("GET", &proxy.url("/readyz"), &[], "")).await;
    assert_eq!(ready.status, 200);
    assert_eq!(ready.json()["status"], "degraded");
    let metrics = send(request("GET", &proxy.url("/metrics"), &[], "")).await.text();
    assert!(metrics.contains("compactor_session_store_errors_total"), "{metrics}");

    redis.restart();
    assert!(redis.keys().is_empty());
    assert!(
        eventually(async || {
            post(&proxy, "key", "s", &history(3)).await;
            redis.keys().iter().any(|k| k.ends_with(":pruned"))
        })
        .await,
        "state is written again once Redis is back"
    );
    assert_eq!(send(request("GET", &proxy.url("/readyz"), &[], "")).await.json()["status"], "ready");
}

#[tokio::test]
async fn a_conversations_lock_has_one_owner_at_a_time_and_other_conversations_have_their_own() {
    use compactor::config::{Config, StoreKind};
    use compactor::session::Store;
    let Some(redis) = RedisServer::start() else { return };
    let mut config = Config::default().session;
    config.store = StoreKind::Redis;
    config.redis_url = compactor::config::RedisUrls::new(redis.url.clone());
    config.key_prefix = redis.prefix.clone();
    let memory = Store::from_config(&Config::default().session);
    let shared = Store::from_config(&config);
    let (main, subagent) = ("00000000000000aa", "00000000000000bb");
    for store in [memory, shared] {
        assert!(eventually(async || store.health().await.is_ok()).await);
        let hold = Duration::from_millis(300);
        assert!(store.try_lock("s", main, "replica-a", hold).await.unwrap());
        assert!(!store.try_lock("s", main, "replica-b", hold).await.unwrap(), "{}", store.kind());
        assert!(store.try_lock("s", subagent, "replica-b", hold).await.unwrap(), "{}: its own lock", store.kind());
        assert!(!store.unlock("s", main, "replica-b").await.unwrap(), "only the owner releases");
        assert!(store.unlock("s", main, "replica-a").await.unwrap());
        assert!(store.try_lock("s", main, "replica-b", hold).await.unwrap());
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(store.try_lock("s", main, "replica-a", hold).await.unwrap(), "an abandoned lock expires");
    }
}

#[tokio::test]
async fn a_redis_cluster_keeps_each_session_on_one_shard_and_shares_state() {
    use crate::common::redis_server::RedisCluster;
    let Some(cluster) = RedisCluster::start() else { return };
    let fake = FakeUpstream::start().await;
    let config = format!("{WINDOWS}{}", cluster.config());
    let (one, two) = ProxyProcess::replicas(&fake, &config);
    for session in ["s1", "s2", "s3", "s4"] {
        post(&one, "key", session, &history(3)).await;
    }
    // Each request's state is written after its answer: wait for the four sessions' own keys.
    let tags = || {
        let keys = cluster.keys();
        let state = keys.iter().filter(|(_, key)| !key.contains(":by-session:") && key.contains('{'));
        state
            .filter_map(|(_, key)| key.split('{').nth(1)?.split('}').next().map(str::to_string))
            .collect::<std::collections::HashSet<_>>()
            .len()
    };
    assert!(eventually(async || tags() >= 4).await, "{:?}", cluster.keys());
    // Every key of one session sits on the same node; sessions spread over nodes.
    let keys = cluster.keys();
    let mut by_session: std::collections::HashMap<String, std::collections::HashSet<usize>> = Default::default();
    for (node, key) in keys.iter().filter(|(_, key)| !key.contains(":by-session:") && !key.ends_with(":recent")) {
        let tag = key.split('{').nth(1).and_then(|k| k.split('}').next()).unwrap().to_string();
        by_session.entry(tag).or_default().insert(*node);
    }
    assert_eq!(by_session.len(), 4);
    assert!(by_session.values().all(|nodes| nodes.len() == 1), "{by_session:?}");
    // The other replica applies the decisions through the cluster.
    assert!(eventually(async || rewound_is_pruned(&fake, &two, "key", "s1").await).await);
    // The index by agent session id, in its own slot, is written too.
    let indexed = async || cluster.keys().iter().filter(|(_, key)| key.contains(":by-session:")).count() == 4;
    assert!(eventually(indexed).await, "{:?}", cluster.keys());
}

#[tokio::test]
async fn admin_errors_speak_the_proxy_error_envelope() {
    let fake = FakeUpstream::start().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let proxy = ProxyProcess::start(
        &fake,
        &format!("{WINDOWS}[session]\nstore = \"redis\"\nredis_url = \"redis://{closed}\"\n"),
    );
    let admin = |method: &str| {
        request(method, &proxy.url("/admin/sessions/abc.def"), &[("authorization", "Bearer admin-secret")], "")
    };
    let down = send(admin("GET")).await;
    assert_eq!(down.status, 503);
    assert_eq!(down.json()["error"]["code"], "store_unavailable");
    assert!(down.json()["error"]["message"].as_str().unwrap().contains("not connected to redis"), "{}", down.text());
    let wrong = send(admin("PUT")).await;
    assert_eq!(wrong.status, 405);
    assert_eq!(wrong.header("allow"), Some("GET, DELETE"));
    assert_eq!(wrong.json()["error"]["code"], "method_not_allowed");
}

#[tokio::test]
async fn shutdown_waits_until_the_state_of_a_request_in_flight_is_stored() {
    let Some(redis) = RedisServer::start() else { return };
    let fake = FakeUpstream::builder().pacing(Pacing::Gated).start().await;
    let config = format!("{WINDOWS}{}[shutdown]\ndrain_timeout_ms = 10000\n", redis.config());
    let mut proxy = ProxyProcess::start(&fake, &config);
    let mut streamed = history(3);
    streamed["stream"] = json!(true);
    let headers = [("authorization", "Bearer key"), ("x-session-id", "s")];
    let body = serde_json::to_vec(&streamed).unwrap();
    let response = client().request(request("POST", &proxy.url("/v1/chat/completions"), &headers, body)).await.unwrap();
    let mut body = response.into_body();
    assert!(next_chunk(&mut body, Duration::from_secs(5)).await.is_some());
    assert!(redis.keys().is_empty(), "nothing is stored before the response is done");

    proxy.terminate();
    proxy.wait_for_log("shutting down").await;
    for _ in 0..10 {
        fake.release();
    }
    while next_chunk(&mut body, Duration::from_secs(5)).await.is_some() {}
    assert_eq!(proxy.wait_exit(Duration::from_secs(10)), Some(0));
    let keys = redis.keys();
    assert!(keys.iter().any(|k| k.ends_with(":pruned")), "{keys:?}");
    let conversation = keys.iter().find(|k| k.rsplit(':').next().is_some_and(|last| last.len() == 16)).unwrap();
    let usage: bool = redis::cmd("HEXISTS").arg(conversation).arg("usage").query(&mut redis.connection()).unwrap();
    assert!(usage, "the usage of the stream that ended during shutdown is stored: {keys:?}");
}

#[tokio::test]
async fn usage_is_recorded_from_plain_replies_that_declare_their_length() {
    // Providers answer plain JSON with a Content-Length: the body ends with its last frame, and the
    // usage in it must still reach the session, in every dialect.
    let (fake, proxy) = ProxyProcess::with_fake("[admin]\ntoken = \"admin-secret\"\n").await;
    let bodies = [
        ("/v1/chat/completions", json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})),
        (
            "/v1/messages",
            json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "gpt-5-codex", "input": [{"type": "message", "role": "user", "content": "hi"}]}),
        ),
    ];
    for (path, body) in bodies {
        let answer = proxy.post(path, &[("x-session-id", path), ("authorization", "Bearer k")], &body).await;
        assert_eq!(answer.status, 200, "{path}");
        assert!(answer.header("content-length").is_some(), "{path}: the reply declares its length");
        let session = answer.header("x-compactor-session").unwrap().to_string();
        let mut state = Value::Null;
        assert!(
            eventually(async || {
                state = proxy.get_with_token(&format!("/admin/sessions/{session}"), "admin-secret").await.json();
                state["state"]["conversations"][0]["usage"]["prompt_tokens"] == 12
            })
            .await,
            "{path}: {state}"
        );
        assert_eq!(state["state"]["conversations"][0]["usage"]["output_tokens"], 1, "{path}");
    }
    let complete = proxy.logs().iter().filter(|l| l.contains("outcome=complete") && l.contains("status=200")).count();
    assert!(complete >= 3, "every request logged as complete: {:?}", proxy.logs());
    assert_eq!(fake.received().len(), 3);
}

#[tokio::test]
async fn an_operator_finds_an_agents_sessions_by_its_session_id_across_tenants() {
    with_each_store(async |store, _| {
        let (_fake, proxy) = ProxyProcess::with_fake(&format!("{WINDOWS}{store}")).await;
        let agent_id = "8f14e45f-ceea-467f-a0c6-7d1ad2d0a1b3";
        let a = post(&proxy, "sk-tenant-a-secret", agent_id, &history(3)).await;
        let b = post(&proxy, "sk-tenant-b-secret", agent_id, &history(3)).await;
        post(&proxy, "sk-tenant-a-secret", "another-session", &history(3)).await;
        let mut expected = [a.header("x-compactor-session").unwrap(), b.header("x-compactor-session").unwrap()]
            .map(str::to_string)
            .to_vec();
        expected.sort();

        let path = format!("/admin/sessions?id={agent_id}");
        let mut found = Value::Null;
        let listed = eventually(async || {
            found = proxy.get_with_token(&path, "admin-secret").await.json();
            found["sessions"].as_array().is_some_and(|s| s.len() == 2)
        })
        .await;
        assert!(listed, "{found}");
        let mut keys: Vec<String> =
            found["sessions"].as_array().unwrap().iter().map(|s| s["session"].as_str().unwrap().to_string()).collect();
        keys.sort();
        assert_eq!(keys, expected, "both tenants' sessions, and only this id's");
        let text = found.to_string();
        assert!(!text.contains("sk-tenant"), "no credential shows: {text}");
        for session in found["sessions"].as_array().unwrap() {
            assert_eq!(session["source"], "header");
            let href = session["href"].as_str().unwrap();
            let state = proxy.get_with_token(href, "admin-secret").await;
            assert_eq!(state.status, 200, "{href}");
            assert_eq!(state.json()["session"], session["session"]);
        }

        // Forgotten sessions are no longer listed; an unknown id lists nothing; the token guards it.
        let forget = proxy.call_with_token("DELETE", &format!("/admin/sessions/{}", expected[0]), "admin-secret").await;
        assert_eq!(forget.status, 200);
        let after = proxy.get_with_token(&path, "admin-secret").await.json();
        assert_eq!(after["sessions"].as_array().unwrap().len(), 1, "{after}");
        let unknown = proxy.get_with_token("/admin/sessions?id=nobody", "admin-secret").await.json();
        assert_eq!(unknown["sessions"], json!([]));
        assert_eq!(proxy.get_with_token(&path, "wrong").await.status, 401);
    })
    .await;
}

/// A history of `calls` tool calls whose ids are `id_len` characters long: once pruned, the ids
/// are what the session keeps, so they make it weigh.
fn history_with_long_ids(calls: usize, id_len: usize) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "Fix the build."})];
    for i in 0..calls {
        let id = format!("call_{i}_{}", "x".repeat(id_len));
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "run", "arguments": "{}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": tool_output(&format!("call {i}"), 200)}));
    }
    json!({"model": "gpt-4o", "messages": messages})
}

/// The in-memory store's size gauge, once two scrapes in a row agree (the request's state is
/// stored after its answer) and it holds `sessions` sessions.
async fn stored_bytes(proxy: &ProxyProcess, sessions: u64) -> u64 {
    let gauge = async |name: &str| -> u64 {
        let metrics = send(request("GET", &proxy.url("/metrics"), &[], "")).await.text();
        let prefix = format!("{name}{{cache=\"sessions\"}} ");
        let line = metrics.lines().find_map(|line| line.strip_prefix(prefix.as_str()).map(str::to_string));
        line.unwrap_or_else(|| panic!("no {prefix}in:\n{metrics}")).parse::<f64>().unwrap() as u64
    };
    let mut last = 0;
    let settled = eventually(async || {
        let (bytes, entries) = (gauge("compactor_cache_bytes").await, gauge("compactor_cache_entries").await);
        let settled = entries == sessions && bytes == last && bytes > 0;
        last = bytes;
        settled
    })
    .await;
    let entries = gauge("compactor_cache_entries").await;
    assert!(settled, "{sessions} sessions never settled (last {last} bytes, {entries} entries)");
    last
}

/// Whether the admin API knows the session an agent calls `id`.
async fn known(proxy: &ProxyProcess, id: &str) -> bool {
    let found = proxy.get_with_token(&format!("/admin/sessions?id={id}"), "admin-secret").await.json();
    !found["sessions"].as_array().unwrap().is_empty()
}

#[tokio::test]
async fn a_small_memory_store_drops_the_least_recently_used_sessions_for_a_big_one_and_they_start_afresh() {
    // What a small session and the big one weigh, on a store with room for all (and whose count
    // bound charges next to nothing: 10 bytes a session). The store also keeps what was learned of
    // the model, under a key of its own (one entry more).
    // Without the inspector's request log, whose summaries would weigh in as well.
    let (_probe_fake, probe) =
        ProxyProcess::with_fake(&format!("{WINDOWS}{UNRECORDED}[session]\nmemory_bytes = 1000000\n")).await;
    post(&probe, "key", "small", &history(3)).await;
    let first = stored_bytes(&probe, 2).await;
    let answer = post(&probe, "key", "big", &history_with_long_ids(30, 300)).await;
    assert!(answer.header("x-compactor-pruned").is_some_and(|n| n.parse::<u32>().unwrap() > 20));
    let with_big = stored_bytes(&probe, 3).await;
    post(&probe, "key", "small-2", &history(3)).await;
    let small = stored_bytes(&probe, 4).await - with_big;
    let (big, model) = (with_big - first, first - small);
    assert!(big > 4 * small, "the pruned ids weigh: {big} vs {small}");

    // Room for the model's entry, the big session and two small ones, not three.
    let bound = model + big + 2 * small + small / 2;
    let config = format!("{WINDOWS}{UNRECORDED}[session]\nmemory_bytes = {bound}\n");
    let (fake, proxy) = ProxyProcess::with_fake(&config).await;
    for (id, sessions) in [("a", 1), ("b", 2), ("c", 3)] {
        post(&proxy, "key", id, &history(3)).await;
        assert_eq!(stored_bytes(&proxy, sessions + 1).await, model + sessions * small);
    }
    post(&proxy, "key", "a", &history(3)).await; // b is now the least recently used
    post(&proxy, "key", "big", &history_with_long_ids(30, 300)).await;
    assert!(eventually(async || known(&proxy, "big").await).await);
    let held = stored_bytes(&proxy, 4).await;
    assert!(held <= bound, "{held} over the bound {bound}");
    assert!(!known(&proxy, "b").await, "the least recently used session went first");
    for id in ["a", "c", "big"] {
        assert!(known(&proxy, id).await, "{id} is kept");
    }

    // The dropped session starts afresh: its earlier decisions are gone, new ones are kept.
    assert!(rewound_is_pruned(&fake, &proxy, "key", "a").await, "a kept session remembers");
    assert!(!rewound_is_pruned(&fake, &proxy, "key", "b").await, "b remembers nothing");
    let again = post(&proxy, "key", "b", &history(3)).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.header("x-compactor-pruned"), Some("2"));
    assert!(eventually(async || known(&proxy, "b").await).await, "b is stored again");
}

#[tokio::test]
async fn how_long_a_models_conversations_run_is_measured_in_redis_and_read_by_every_replica() {
    use compactor::config::{Config, StoreKind};
    use compactor::session::{ConversationId, ModelKey, SessionCtx, SessionKey, SessionSource, Store};
    let Some(redis) = RedisServer::start() else { return };
    let mut config = Config::default().session;
    config.store = StoreKind::Redis;
    config.redis_url = compactor::config::RedisUrls::new(redis.url.clone());
    config.key_prefix = redis.prefix.clone();
    let (writer, reader) = (Store::from_config(&config), Store::from_config(&config));
    assert!(eventually(async || writer.health().await.is_ok() && reader.health().await.is_ok()).await);
    let lifetime = Duration::from_secs(300);
    let request = async |store: &Store, session: &str| {
        let key = SessionKey { key: format!("tenant.{session}"), source: SessionSource::Header };
        let mut ctx = SessionCtx::load(store.clone(), key, ConversationId::parse("00000000000000aa").unwrap()).await;
        ctx.use_model(ModelKey::new("tenant", "anthropic", "claude-sonnet-4-5")).await;
        ctx
    };
    assert_eq!(request(&writer, "fresh").await.later_turns(lifetime, 0.9, &[]), 0, "nothing measured yet");
    // Ten conversations of 40 turns on one replica.
    for session in 0..10 {
        for _ in 0..40 {
            let mut ctx = request(&writer, &format!("long-{session}")).await;
            ctx.record_request(&[], 0, 3);
            ctx.count_turn(lifetime);
            ctx.note_status(200);
            assert!(ctx.commit().await);
        }
    }
    // Another replica, which never read the histogram, plans with it: every run reached 32 turns.
    let ctx = request(&reader, "fresh").await;
    assert_eq!(ctx.later_turns(lifetime, 0.9, &[]), 32 - 1);
    // The histogram lives under the model's key, with a TTL, and only bucket starts were written.
    let mut connection = redis.connection();
    let all: Vec<String> = redis::cmd("KEYS").arg(format!("{}:*", redis.prefix)).query(&mut connection).unwrap();
    let model_keys: Vec<String> =
        all.into_iter().filter(|k| k.contains("{model.") && k.ends_with(":session")).collect();
    assert_eq!(model_keys.len(), 1, "{model_keys:?}");
    let runs: std::collections::HashMap<String, u64> =
        redis::cmd("HGETALL").arg(&model_keys[0]).query(&mut connection).unwrap();
    assert_eq!(runs.get("run_0"), Some(&10));
    assert_eq!(runs.get("run_9"), Some(&10), "turn 32 reached by all ten");
    assert_eq!(runs.get("run_10"), None, "turn 48 by none");
    let ttl: i64 = redis::cmd("TTL").arg(&model_keys[0]).query(&mut connection).unwrap();
    assert!(ttl > 0);
}
