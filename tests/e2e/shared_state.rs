//! State shared by parallel requests and replicas: what one request learned of its model is never
//! undone by another's commit, a compaction holds its lock for as long as it works and no holder
//! whose lease lapsed commits over the winner, and a session another schema version wrote is left
//! alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::redis_server::RedisServer;
use crate::common::*;
use serde_json::{Value, json};

const ADMIN: &str = "[admin]\ntoken = \"admin-secret\"\n";

/// A chat request of session `session`; `task` makes it a conversation of its own.
async fn post(proxy: &ProxyProcess, session: &str, task: &str) -> Answer {
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": task}]});
    proxy.post("/v1/chat/completions", &[("authorization", "Bearer k"), ("x-session-id", session)], &body).await
}

fn chat_answer(usage: Option<Value>) -> Reply {
    let mut answer = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "gpt-4o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Done."}, "finish_reason": "stop"}]});
    if let Some(usage) = usage {
        answer["usage"] = usage;
    }
    Reply::json(200, answer)
}

fn mentions(received: &Received, marker: &str) -> bool {
    String::from_utf8_lossy(&received.body).contains(marker)
}

/// A Redis hash as field/value pairs.
type Hash = Vec<(String, String)>;

/// The session's hash and the model's, as stored.
fn stored_learned(redis: &RedisServer, session: &str) -> (Hash, Hash) {
    let mut connection = redis.connection();
    let session_hash: Hash =
        redis::cmd("HGETALL").arg(format!("{}:{{{session}}}:session", redis.prefix)).query(&mut connection).unwrap();
    let models: Vec<String> =
        redis::cmd("KEYS").arg(format!("{}:{{model.*}}:session", redis.prefix)).query(&mut connection).unwrap();
    assert_eq!(models.len(), 1, "one model: {models:?}");
    let model_hash: Hash = redis::cmd("HGETALL").arg(&models[0]).query(&mut connection).unwrap();
    (session_hash, model_hash)
}

fn field(hash: &[(String, String)], name: &str) -> u64 {
    hash.iter().find(|(f, _)| f == name).map_or(0, |(_, v)| v.parse().unwrap())
}

/// Request A (replica one) measures the tokenizer: its answer reports far more prompt tokens than
/// compactor estimated, a calibration at the upper bound. Request B (replica two) of the same
/// session and model was sent before A and learns, after A's commit, from an overflow that names
/// the window; it loaded the session before A's calibration existed. Both must be stored, in the
/// session and in the model's profile.
#[tokio::test]
async fn parallel_requests_on_two_replicas_lose_neither_an_overflow_nor_a_calibration() {
    let Some(redis) = RedisServer::start() else { return };
    let overflows = Arc::new(AtomicUsize::new(0));
    let seen = overflows.clone();
    let fake = FakeUpstream::builder()
        .respond_with(move |received| {
            if mentions(received, "SLOW-OVERFLOW") {
                // The first attempt overflows a second later; a retry is answered without usage, so
                // this request measures nothing itself.
                if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                    let error = json!({"error": {"message": "This model's maximum context length is 9000 tokens.", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}});
                    return Some(Reply::json(400, error).after(Duration::from_secs(1)));
                }
                return Some(chat_answer(None));
            }
            if mentions(received, "FAST-MEASURE") {
                return Some(chat_answer(Some(json!({"prompt_tokens": 5000, "completion_tokens": 10, "total_tokens": 5010}))));
            }
            None
        })
        .start()
        .await;
    let (one, two) = ProxyProcess::replicas(&fake, &format!("{ADMIN}{}", redis.config()));
    let slow = post(&two, "agent", "SLOW-OVERFLOW: rename the parser module.");
    let fast = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        post(&one, "agent", "FAST-MEASURE: list the failing tests.").await
    };
    let (slow, fast) = tokio::join!(slow, fast);
    assert_eq!(fast.status, 200, "{}", fast.text());
    assert!(overflows.load(Ordering::SeqCst) >= 1, "the overflow was sent");
    let session = fast.header("x-compactor-session").unwrap().to_string();
    assert_eq!(slow.header("x-compactor-session"), Some(session.as_str()), "one session");
    // The slow request's commit follows its answer; wait until it is in.
    let (session_hash, model_hash) = {
        let mut waited = Duration::ZERO;
        loop {
            let stored = stored_learned(&redis, &session);
            if field(&stored.0, "learned_window") > 0 || waited > Duration::from_secs(5) {
                break stored;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            waited += Duration::from_millis(50);
        }
    };
    for (what, hash) in [("session", &session_hash), ("model", &model_hash)] {
        assert_eq!(field(hash, "learned_window"), 9000, "{what}: the overflow's window is kept: {hash:?}");
        // 5000 provider tokens for a prompt compactor estimates at a few dozen: the upper bound.
        assert_eq!(field(hash, "calibration_milli"), 3000, "{what}: the measurement is kept: {hash:?}");
        assert!(field(hash, "window_at_least") >= 5010, "{what}: the answer's size is kept: {hash:?}");
    }
}

/// Every key of the test's prefix (the sessions' and the models') with its value as Redis dumps it.
fn snapshot(redis: &RedisServer) -> Vec<(String, Vec<u8>)> {
    let mut connection = redis.connection();
    let mut keys: Vec<String> = redis::cmd("KEYS").arg(format!("{}:*", redis.prefix)).query(&mut connection).unwrap();
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let dumped: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut connection).unwrap();
            (key, dumped)
        })
        .collect()
}

/// A replica of the next release (schema version 2) wrote the session while this one (version 1)
/// still serves it, as in a rolling deploy: this replica answers without the session's state and
/// leaves every key of it as it is, neither deleted nor written.
#[tokio::test]
async fn a_session_written_by_the_next_schema_version_is_served_without_state_and_left_alone() {
    let Some(redis) = RedisServer::start() else { return };
    let (_fake, proxy) = ProxyProcess::with_fake(&format!("{ADMIN}{}", redis.config())).await;
    let task = "Port the scheduler to the new queue.";
    let first = post(&proxy, "rolling", task).await;
    assert_eq!(first.status, 200);
    let session = first.header("x-compactor-session").unwrap().to_string();
    let conversation = first.header("x-compactor-conversation").unwrap().to_string();
    let base = format!("{}:{{{session}}}:", redis.prefix);
    let mut connection = redis.connection();
    let stored = |connection: &mut redis::Connection| -> u64 {
        redis::cmd("HGET")
            .arg(format!("{base}session"))
            .arg("requests")
            .query::<Option<u64>>(connection)
            .unwrap()
            .unwrap_or(0)
    };
    let mut waited = 0;
    while stored(&mut connection) == 0 && waited < 100 {
        std::thread::sleep(Duration::from_millis(20));
        waited += 1;
    }
    // What the next version wrote over it.
    let () = redis::cmd("HSET")
        .arg(format!("{base}session"))
        .arg(&["schema", "2", "requests", "7", "next_version_field", "kept"])
        .query(&mut connection)
        .unwrap();
    let () = redis::cmd("HSET")
        .arg(format!("{base}c:{conversation}"))
        .arg(&["usage", r#"{"v":2,"prompt":{"tokens":900}}"#])
        .query(&mut connection)
        .unwrap();
    let _: u64 = redis::cmd("RPUSH")
        .arg(format!("{base}c:{conversation}:compactions"))
        .arg(r#"{"v":2,"summary":{"text":"a summary of the next version"}}"#)
        .query(&mut connection)
        .unwrap();
    let _: u64 = redis::cmd("EXPIRE")
        .arg(format!("{base}c:{conversation}:compactions"))
        .arg(3600)
        .query(&mut connection)
        .unwrap();
    let before = snapshot(&redis);
    assert!(before.iter().any(|(key, _)| key.ends_with(":compactions")), "{before:?}");

    let again = post(&proxy, "rolling", task).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.header("x-compactor-session"), Some(session.as_str()));
    // A commit follows the answer: give it the time it takes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = snapshot(&redis);
    let keys = |snapshot: &[(String, Vec<u8>)]| snapshot.iter().map(|(key, _)| key.clone()).collect::<Vec<_>>();
    assert_eq!(keys(&after), keys(&before), "no key deleted or added");
    for ((key, was), (_, is)) in before.iter().zip(&after) {
        assert!(was == is, "{key} was written");
    }
    for (key, _) in &after {
        let ttl: i64 = redis::cmd("TTL").arg(key).query(&mut connection).unwrap();
        assert!(ttl > 0, "{key} still expires: {ttl}");
    }
}

/// A summarizer with a large window and a short lock lease, so a summary outlasts several leases.
const LEASED: &str = "[models.big-summarizer]\ncontext_window = 200000\nmax_output_tokens = 8192\n[admin]\ntoken = \"admin-secret\"\n[prune]\nenabled = false\n[truncate]\nenabled = false\n[compaction]\nkeep_recent_tokens = 600\nuser_message_max_tokens = 300\nemergency_protect_tokens = 1000000\nlock_wait_ms = 20000\nlock_lease_ms = 300\nmodel = \"big-summarizer\"\n";

/// A turn of session `session` in the Anthropic dialect.
async fn post_turn(proxy: &ProxyProcess, session: &str, body: &Value) -> Answer {
    let headers = [("x-api-key", "k"), ("x-session-id", session)];
    proxy.post(crate::common::window::Api::Anthropic.path(), &headers, body).await
}

/// The compaction records' generations the store keeps for `session`'s conversations.
async fn generations(proxy: &ProxyProcess, session: &str) -> Vec<u64> {
    let view = proxy.get_with_token(&format!("/admin/sessions/{session}"), "admin-secret").await.json();
    let conversations = view["state"]["conversations"].as_array().cloned().unwrap_or_default();
    conversations
        .iter()
        .flat_map(|c| c["compactions"].as_array().cloned().unwrap_or_default())
        .map(|record| record["generation"].as_u64().unwrap())
        .collect()
}

/// A summary takes 2 s, the lock's lease is 0.3 s: the holder renews it while it summarizes, so
/// a second request of the same conversation (on the same replica, or on another one sharing
/// Redis) arriving meanwhile waits for the record instead of taking the lapsed lock and
/// summarizing again. One summary call, one generation.
#[tokio::test]
async fn a_compaction_slower_than_its_locks_lease_is_made_once() {
    use crate::common::window::{Api, WindowSpec, conversation, window_upstream};
    let redis = RedisServer::start();
    let mut stores = vec![String::new()];
    stores.extend(redis.as_ref().map(RedisServer::config));
    for store in stores {
        let spec = WindowSpec { window: 4_000, summary_delay: Duration::from_secs(2), ..WindowSpec::default() };
        let (fake, summaries) = window_upstream(spec).await;
        let (one, two) = ProxyProcess::replicas(&fake, &format!("{LEASED}{store}"));
        // The second replica shares nothing without Redis: then both requests go to the first.
        let other = if store.is_empty() { &one } else { &two };
        let body = conversation(Api::Anthropic, 12, false);
        let before = summaries.count();
        let (first, second) = tokio::join!(post_turn(&one, "leased", &body), async {
            tokio::time::sleep(Duration::from_millis(700)).await;
            post_turn(other, "leased", &body).await
        });
        for answer in [&first, &second] {
            assert_eq!(answer.status, 200, "{}", answer.text());
            assert_eq!(answer.header("x-compactor-compacted"), Some("1"), "{store}");
        }
        assert_eq!(summaries.count() - before, 1, "one summary call ({store:?})\n{}", one.logs().join("\n"));
        let session = first.header("x-compactor-session").unwrap();
        assert_eq!(generations(&one, session).await, [1], "one generation ({store:?})");
    }
}

/// The holder's lock is lost while it summarizes (deleted here, as a lease lapses when its holder
/// is cut off from Redis for a whole lease): a second replica takes the lock and summarizes the
/// same history too. Both records are generation 1; the store keeps the first published, and the
/// second holder answers with the winner's record rather than laying its own beside it.
#[tokio::test]
async fn a_holder_whose_lock_lapsed_cannot_store_a_second_record_of_its_generation() {
    use crate::common::window::{Api, WindowSpec, conversation, window_upstream};
    let Some(redis) = RedisServer::start() else { return };
    let spec = WindowSpec { window: 4_000, summary_delay: Duration::from_secs(2), ..WindowSpec::default() };
    let (fake, summaries) = window_upstream(spec).await;
    let (one, two) = ProxyProcess::replicas(&fake, &format!("{LEASED}{}", redis.config()));
    let body = conversation(Api::Anthropic, 12, false);
    let before = summaries.count();
    let lock_pattern = format!("{}:*:lock", redis.prefix);
    let (first, second) = tokio::join!(post_turn(&one, "lapsed", &body), async {
        let mut connection = redis.connection();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let locks: Vec<String> = redis::cmd("KEYS").arg(&lock_pattern).query(&mut connection).unwrap();
            if let Some(lock) = locks.first() {
                let _: u64 = redis::cmd("DEL").arg(lock).query(&mut connection).unwrap();
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the first request never took the lock");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        post_turn(&two, "lapsed", &body).await
    });
    for answer in [&first, &second] {
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("x-compactor-compacted"), Some("1"));
    }
    assert_eq!(summaries.count() - before, 2, "the lapsed lock let the second replica summarize too");
    let session = first.header("x-compactor-session").unwrap();
    assert_eq!(generations(&one, session).await, [1], "one record of generation 1");
    two.wait_for_log("compaction record fenced").await;
}
