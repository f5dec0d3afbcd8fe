//! The store held to its bounds and to its races: evictions between a lookup and a lock, panics
//! under a lock, concurrent reweighing.

use super::*;
use crate::session::state::ConversationUpdate;

fn request(messages: u64) -> Update {
    let conversation = ConversationUpdate { request_messages: Some(messages), ..ConversationUpdate::default() };
    Update { conversation, ..Update::default() }
}

#[test]
fn a_session_keeps_its_most_recently_used_conversations() {
    let store = MemoryStore::new(10, 1 << 20, 2, Duration::from_secs(60));
    store.update("s", "a", &request(1));
    store.update("s", "b", &request(2));
    store.update("s", "a", &request(3));
    store.update("s", "c", &request(4));
    let ids: Vec<String> = store.view("s").conversations.into_iter().map(|c| c.id).collect();
    assert_eq!(ids, ["c", "a"], "b was the least recently used");
    assert_eq!(store.load("s", "a").1.messages, 3);
    assert!(store.load("s", "b").1.is_empty());
}

fn pruning(ids: &[&str]) -> Update {
    let conversation = ConversationUpdate {
        pruned: ids.iter().map(|id| (*id).to_string()).collect(),
        request_messages: Some(1),
        ..ConversationUpdate::default()
    };
    Update { conversation, ..Update::default() }
}

#[test]
fn a_sessions_weight_grows_with_what_it_keeps_and_is_kept_up_to_date_without_walking_it() {
    // A count bound that charges every session at least 1 byte: the weights are the estimates.
    let store = MemoryStore::new(1 << 20, 1 << 20, 4, Duration::from_secs(60));
    store.update("t.s", "a", &request(1));
    let empty = store.size().bytes;
    let long_id = "x".repeat(1_000);
    store.update("t.s", "a", &pruning(&["call_1", &long_id]));
    store.update("t.s", "a", &pruning(&["call_1", "call_2"]));
    store.update("t.s", "b", &pruning(&["call_3"]));
    let grown = store.size().bytes;
    assert!(grown > empty + 1_000, "{empty} -> {grown}");
    // The estimate kept by updates equals the one walked from scratch.
    let entry = store.sessions.get("t.s").unwrap();
    let session = entry.session.lock().unwrap();
    for (id, kept) in &session.conversations {
        let walked: usize = kept.state.pruned.iter().map(|id| pruned_id_bytes(id)).sum();
        assert_eq!(kept.bytes, conversation_bytes(id, &kept.state, walked), "{id}");
    }
    assert_eq!(u64::from(session.estimated_bytes("t.s")), grown);
}

#[test]
fn max_sessions_still_caps_the_count_and_the_least_recently_used_go_first() {
    let store = MemoryStore::new(2, 1 << 20, 4, Duration::from_secs(60));
    store.update("t.a", "x", &request(1));
    store.update("t.b", "x", &request(1));
    store.load("t.a", "x");
    store.update("t.c", "x", &request(1));
    assert_eq!(store.size().entries, 2);
    assert!(store.load("t.b", "x").1.is_empty(), "b was the least recently used");
    assert!(!store.load("t.a", "x").1.is_empty() && !store.load("t.c", "x").1.is_empty());
    assert!(store.find("b").is_empty() && store.find("a") == ["t.a"], "the index follows");
}

#[test]
fn a_session_bigger_than_the_whole_store_is_not_kept() {
    let store = MemoryStore::new(1 << 20, 8 * 1024, 4, Duration::from_secs(60));
    store.update("t.small", "x", &request(1));
    let ids: Vec<String> = (0..200).map(|i| format!("call_{i}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    store.update("t.huge", "x", &pruning(&ids));
    let size = store.size();
    assert!(size.bytes <= 8 * 1024, "{size:?}");
    assert!(store.load("t.huge", "x").1.is_empty(), "the huge one starts afresh every time");
    assert!(!store.load("t.small", "x").1.is_empty(), "and pushes nobody out: {size:?}");
}

#[test]
fn concurrent_updates_leave_each_session_weighed_at_its_last_size() {
    // Four threads update the same sessions in the same order, each adding ids of its own
    // length: a weight taken before another thread's change and stored after it would leave
    // a session weighed below its size.
    let store = MemoryStore::new(1 << 20, 1 << 30, 4, Duration::from_secs(60));
    let keys: Vec<String> = (0..2_000).map(|i| format!("t.s{i}")).collect();
    let start = Arc::new(std::sync::Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|thread| {
            let (store, keys, start) = (store.clone(), keys.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for key in &keys {
                    let id = format!("call_{thread}_{}", "x".repeat(thread * 40));
                    store.update(key, "a", &pruning(&[&id]));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    for key in &keys {
        let entry = store.sessions.get(key).unwrap();
        let estimated = entry.session.lock().unwrap().estimated_bytes(key);
        assert_eq!(store.load(key, "a").1.pruned.len(), 4, "{key}: every update applied");
        assert_eq!(entry.bytes.load(Ordering::Relaxed), estimated, "{key}: weighed at a stale size");
    }
}

#[test]
fn an_update_to_a_session_evicted_between_its_lookup_and_its_lock_is_not_lost() {
    let store = MemoryStore::new(10, 1 << 20, 4, Duration::from_secs(60));
    store.update("t.s", "a", &pruning(&["call_1"]));
    let entry = store.sessions.get("t.s").unwrap();
    let locked = entry.session.lock().unwrap();
    let updater = {
        let store = store.clone();
        std::thread::spawn(move || store.update("t.s", "a", &pruning(&["call_2"])))
    };
    // The updater has looked the entry up (the cache, this test and it hold it) and waits for
    // its lock; meanwhile the entry leaves the cache.
    while Arc::strong_count(&entry) < 3 {
        std::thread::yield_now();
    }
    store.sessions.invalidate("t.s");
    drop(locked);
    updater.join().unwrap();
    assert!(store.load("t.s", "a").1.pruned.contains("call_2"), "the update reached the session the store holds");
}

fn compact_requested() -> SessionUpdate {
    SessionUpdate { compact_requested: Some(true), ..SessionUpdate::default() }
}

/// Runs `mark` (the admin API's "compact next") on another thread while this one holds the
/// lock of the entry under `t.s`; once the marker has looked the entry up and waits for its
/// lock, `meanwhile` changes the store; then the lock is let go. What `mark` returned.
fn mark_racing(store: &MemoryStore, meanwhile: impl FnOnce(&MemoryStore)) -> bool {
    let entry = store.sessions.get("t.s").unwrap();
    let locked = entry.session.lock().unwrap();
    let marker = {
        let store = store.clone();
        std::thread::spawn(move || store.update_existing_session("t.s", &compact_requested()))
    };
    // The cache, this test and the marker hold the entry: the marker looked it up.
    while Arc::strong_count(&entry) < 3 {
        std::thread::yield_now();
    }
    meanwhile(store);
    drop(locked);
    marker.join().unwrap()
}

#[test]
fn an_admin_mark_on_a_session_evicted_between_its_lookup_and_its_lock_is_not_reported_as_made() {
    let store = MemoryStore::new(10, 1 << 20, 4, Duration::from_secs(60));
    store.update("t.s", "a", &request(1));
    let marked = mark_racing(&store, |store| store.sessions.invalidate("t.s"));
    assert!(!marked, "the session is gone: the mark landed nowhere and must not say it did");
    assert!(store.sessions.get("t.s").is_none(), "and the session is not made again");
}

#[test]
fn an_admin_mark_on_a_session_replaced_between_its_lookup_and_its_lock_lands_on_the_new_one() {
    let store = MemoryStore::new(10, 1 << 20, 4, Duration::from_secs(60));
    store.update("t.s", "a", &request(1));
    let marked = mark_racing(&store, |store| {
        store.sessions.invalidate("t.s");
        // The session's next request starts it afresh while the mark waits.
        store.update("t.s", "a", &request(2));
    });
    assert!(marked);
    assert_eq!(store.view("t.s").session.counters.compact_requested, 1, "the mark is on the session the store holds");
}

#[test]
fn admin_writes_racing_requests_that_reweigh_the_session_are_each_applied_once() {
    // Four admin writers and one request thread start together; the requests grow the session,
    // so it is weighed and inserted again under them: every write lands on the entry held.
    let store = MemoryStore::new(1 << 20, 1 << 30, 4, Duration::from_secs(60));
    store.update("t.s", "a", &request(1));
    let start = Arc::new(std::sync::Barrier::new(5));
    let saved_one = SessionUpdate { tokens_saved: 1, ..SessionUpdate::default() };
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let (store, start, update) = (store.clone(), start.clone(), saved_one.clone());
            std::thread::spawn(move || {
                start.wait();
                (0..500).filter(|_| store.update_existing_session("t.s", &update)).count()
            })
        })
        .collect();
    let requests = {
        let (store, start) = (store.clone(), start.clone());
        std::thread::spawn(move || {
            start.wait();
            for i in 0..500 {
                store.update("t.s", "a", &pruning(&[&format!("call_{i}")]));
            }
        })
    };
    let applied: usize = writers.into_iter().map(|writer| writer.join().unwrap()).sum();
    requests.join().unwrap();
    assert_eq!(applied, 2_000, "the session existed throughout");
    assert_eq!(store.view("t.s").session.counters.tokens_saved, 2_000, "no write was lost");
}

/// A store holding `t.s` (conversation `a` pruned `call_1`), whose lock a panic poisoned.
#[allow(clippy::panic)] // the panic is what the tests are about
fn poisoned_store() -> MemoryStore {
    let store = MemoryStore::new(10, 1 << 20, 4, Duration::from_secs(60));
    store.update("t.s", "a", &pruning(&["call_1"]));
    let entry = store.sessions.get("t.s").unwrap();
    let poisoner = std::thread::spawn(move || {
        let _locked = entry.session.lock().unwrap();
        panic!("a panic while the session is locked");
    });
    assert!(poisoner.join().is_err());
    store
}

#[test]
fn an_admin_mark_on_a_session_whose_lock_a_panic_poisoned_drops_it_loudly() {
    let store = poisoned_store();
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let marked = metrics::with_local_recorder(&recorder, || store.update_existing_session("t.s", &compact_requested()));
    assert!(!marked, "the session in doubt is gone: no mark was made");
    assert!(store.sessions.get("t.s").is_none(), "dropped at once, not left for a later request to find");
    let rendered = handle.render();
    assert!(rendered.contains("compactor_session_store_corrupt_total 1"), "counted: {rendered}");
}

#[test]
fn a_panic_under_a_sessions_lock_drops_its_state_loudly_and_the_next_update_still_lands() {
    let store = poisoned_store();
    store.update("t.s", "a", &pruning(&["call_2"]));
    let (_, kept) = store.load("t.s", "a");
    assert!(kept.pruned.contains("call_2"), "{kept:?}");
    assert!(!kept.pruned.contains("call_1"), "the state in doubt is not served");
}

#[test]
fn a_conversations_request_log_keeps_the_newest_up_to_its_bound_and_weighs_in() {
    let logged = |n: usize| {
        let mut update = request(1);
        update.conversation.record = Some(format!("{{\"n\":{n},\"pad\":\"{}\"}}", "x".repeat(3_000)));
        update
    };
    let store = MemoryStore::new(1 << 20, 1 << 24, 4, Duration::from_secs(60)).with_request_log(3);
    store.update("t.s", "a", &request(1));
    let empty = store.size().bytes;
    for n in 0..5 {
        store.update("t.s", "a", &logged(n));
    }
    let kept: Vec<u64> = store
        .requests("t.s", "a")
        .iter()
        .map(|json| serde_json::from_str::<serde_json::Value>(json).unwrap()["n"].as_u64().unwrap())
        .collect();
    assert_eq!(kept, [2, 3, 4], "the newest three, oldest first");
    assert!(store.size().bytes >= empty + 9_000, "the log counts in the session's weight");
    assert_eq!(store.recent(10).into_iter().map(|(key, _)| key).collect::<Vec<_>>(), ["t.s"]);
    let off = MemoryStore::new(1 << 20, 1 << 24, 4, Duration::from_secs(60));
    off.update("t.s", "a", &logged(0));
    assert!(off.requests("t.s", "a").is_empty(), "no bound, no log");
}

#[test]
fn locks_are_per_conversation() {
    let store = MemoryStore::new(10, 1 << 20, 2, Duration::from_secs(60));
    let hold = Duration::from_secs(5);
    assert!(store.try_lock("s", "a", "one", hold));
    assert!(store.locked("s", "a"));
    assert!(!store.try_lock("s", "a", "two", hold));
    assert!(store.try_lock("s", "b", "two", hold), "another conversation has its own lock");
    assert!(!store.unlock("s", "a", "two"));
    assert!(store.unlock("s", "a", "one"));
    assert!(!store.locked("s", "a"));
}
