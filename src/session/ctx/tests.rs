//! A request's session state held to "loaded once, changed in memory, committed once": what a
//! conversation keeps to itself, what the session and the model share, runs and parallel merges.

use super::*;
use crate::config::{Config, StoreKind};
use crate::session::SessionSource;
use crate::session::state::{Breaker, CompactionRecord, Learned, Usage};

#[test]
fn a_models_key_is_the_hash_of_its_tenant_upstream_and_name() {
    for (upstream, model) in [("openai", "gpt-4o"), ("anthropic", "claude-sonnet-4-5"), ("openai", "")] {
        let key = ModelKey::new("tenant", upstream, model);
        let tag = xxhash_rust::xxh3::xxh3_64(format!("tenant\0{upstream}\0{model}").as_bytes()).max(1);
        assert_eq!((key.tag, key.store_key.as_str()), (tag, format!("model.{tag:016x}").as_str()));
    }
}

fn key(name: &str) -> SessionKey {
    SessionKey { key: format!("tenant.{name}"), source: SessionSource::Header }
}

fn conversation(hex: &str) -> ConversationId {
    ConversationId::parse(hex).unwrap()
}

const MAIN: &str = "00000000000000aa";
const SUBAGENT: &str = "00000000000000bb";

fn record(generation: u32) -> CompactionRecord {
    CompactionRecord {
        summary: "summary".into(),
        covered_messages: 4,
        covered_hash: "h".into(),
        first_kept: 4,
        tokens_before: 100,
        tokens_after: 10,
        trigger: "overflow".into(),
        model: "m".into(),
        ..CompactionRecord::blank(generation)
    }
}

#[tokio::test]
async fn changes_stay_in_memory_until_the_one_commit() {
    let store = Store::from_config(&Config::default().session);
    let mut ctx = SessionCtx::load(store.clone(), key("a"), conversation(MAIN)).await;
    ctx.record_request(&["call_1".to_string()], 40, 7);
    ctx.learn_window(4_000);
    ctx.set_usage(Usage { prompt_tokens: 12, ..Usage::default() });
    assert_eq!(ctx.learned().window, 4_000, "the request sees its own change");
    assert_eq!(store.load("tenant.a", MAIN).await.unwrap(), Default::default(), "nothing written yet");
    assert!(ctx.commit().await);
    let (session, stored) = store.load("tenant.a", MAIN).await.unwrap();
    assert!(stored.pruned.contains("call_1"));
    assert_eq!((session.counters.requests, session.counters.tokens_saved), (1, 40));
    assert_eq!(session.counters.learned.window, 4_000);
    assert_eq!((stored.requests, stored.messages), (1, 7));
    assert_eq!(stored.usage.map(|u| (u.prompt_tokens, u.message_count)), Some((12, 7)));
}

#[tokio::test]
async fn what_a_conversation_decides_stays_with_it_and_what_the_session_learns_is_shared() {
    let store = Store::from_config(&Config::default().session);
    let mut main = SessionCtx::load(store.clone(), key("s"), conversation(MAIN)).await;
    main.record_request(&["call_1".to_string()], 10, 9);
    main.learn_window(8_000);
    assert!(main.publish_compaction(&record(1)).await);
    assert!(main.commit().await);
    let subagent = SessionCtx::load(store.clone(), key("s"), conversation(SUBAGENT)).await;
    assert!(subagent.conversation().is_empty(), "the subagent sees none of the main loop's decisions");
    assert_eq!(subagent.learned().window, 8_000, "but the same model's window");
    assert_eq!(subagent.session().counters.requests, 1);
}

#[tokio::test]
async fn a_published_compaction_is_visible_at_once_and_a_failure_counts_in_a_row() {
    let store = Store::from_config(&Config::default().session);
    let mut ctx = SessionCtx::load(store.clone(), key("b"), conversation(MAIN)).await;
    assert!(ctx.publish_failure(9).await);
    assert!(ctx.publish_failure(9).await);
    assert_eq!(store.load("tenant.b", MAIN).await.unwrap().1.breaker.failures, 2);
    assert!(ctx.publish_failure(11).await, "a grown conversation starts the count again");
    assert_eq!(ctx.conversation().breaker.failures, 1);
    assert!(ctx.publish_compaction(&record(1)).await);
    let (_, stored) = store.load("tenant.b", MAIN).await.unwrap();
    assert_eq!(stored.compactions, vec![record(1)]);
    assert_eq!(stored.breaker, Breaker::default());
    assert_eq!(ctx.conversation().compactions, vec![record(1)]);
}

/// A request of conversation `id` of session `name`, to one model.
async fn turn(store: &Store, name: &str, id: &str) -> Box<SessionCtx> {
    let mut ctx = SessionCtx::load(store.clone(), key(name), conversation(id)).await;
    ctx.use_model(ModelKey::new("tenant", "anthropic", "claude")).await;
    ctx
}

#[tokio::test]
async fn conversations_that_ran_long_make_a_young_one_expect_more_turns_and_a_pause_starts_a_new_run() {
    let store = Store::from_config(&Config::default().session);
    let lifetime = Duration::from_secs(300);
    let young = turn(&store, "new", MAIN).await;
    assert_eq!(young.later_turns(lifetime, 0.9, &[]), 0, "nothing measured: no turn assumed");
    // Ten sessions whose main conversation ran 20 turns on a warm cache.
    for session in 0..10 {
        for _ in 0..20 {
            let mut ctx = turn(&store, &format!("s{session}"), MAIN).await;
            ctx.record_request(&[], 0, 3);
            ctx.count_turn(lifetime);
            ctx.note_status(200);
            assert!(ctx.commit().await);
        }
    }
    let mut ctx = turn(&store, "new", MAIN).await;
    assert_eq!(ctx.run_turn(lifetime), 1);
    assert_eq!(ctx.later_turns(lifetime, 0.9, &[]), 16 - 1, "every run so far reached turn 16");
    ctx.record_request(&[], 0, 3);
    ctx.count_turn(lifetime);
    ctx.note_status(200);
    assert!(ctx.commit().await);
    let ctx = turn(&store, "new", MAIN).await;
    assert_eq!((ctx.run_turn(lifetime), ctx.later_turns(lifetime, 0.9, &[])), (2, 16 - 2));
    // The same conversation after a pause past the cache's lifetime: a new run, at its start.
    assert_eq!(ctx.run_turn(Duration::ZERO), 1);
    // Another model has measured nothing.
    let mut other = SessionCtx::load(store.clone(), key("new"), conversation(SUBAGENT)).await;
    other.use_model(ModelKey::new("tenant", "openai", "gpt")).await;
    assert_eq!(other.later_turns(lifetime, 0.9, &[]), 0);
}

#[tokio::test]
async fn refused_requests_count_toward_no_run_and_one_tenants_runs_are_not_anothers() {
    let store = Store::from_config(&Config::default().session);
    let lifetime = Duration::from_secs(300);
    // Ten sessions whose every request the upstream refused (401): no run, no horizon.
    for session in 0..10 {
        for _ in 0..20 {
            let mut ctx = turn(&store, &format!("refused{session}"), MAIN).await;
            ctx.record_request(&[], 0, 3);
            ctx.count_turn(lifetime);
            ctx.note_status(401);
            assert!(ctx.commit().await);
        }
    }
    let young = turn(&store, "young", MAIN).await;
    assert_eq!(young.later_turns(lifetime, 0.9, &[]), 0, "refused requests measured no run");
    let refused = turn(&store, "refused0", MAIN).await;
    assert_eq!(refused.run_turn(lifetime), 1, "nor a turn of their own conversation");
    // Ten sessions of another tenant that really ran 20 turns: this tenant still knows nothing.
    for session in 0..10 {
        for _ in 0..20 {
            let key = SessionKey { key: format!("other.s{session}"), source: SessionSource::Header };
            let mut ctx = SessionCtx::load(store.clone(), key, conversation(MAIN)).await;
            ctx.use_model(ModelKey::new("other", "anthropic", "claude")).await;
            ctx.record_request(&[], 0, 3);
            ctx.count_turn(lifetime);
            ctx.note_status(200);
            assert!(ctx.commit().await);
        }
    }
    let young = turn(&store, "young", MAIN).await;
    assert_eq!(young.later_turns(lifetime, 0.9, &[]), 0, "another tenant's runs are not this tenant's");
}

#[tokio::test]
async fn parallel_requests_merge_what_they_learned_and_a_stale_commit_erases_no_overflow() {
    let store = Store::from_config(&Config::default().session);
    let model = ModelKey::new("tenant", "openai", "gpt-4o");
    // Both requests load the same session before either commits.
    let mut overflowed = SessionCtx::load(store.clone(), key("p"), conversation(MAIN)).await;
    let mut measured = SessionCtx::load(store.clone(), key("p"), conversation(SUBAGENT)).await;
    overflowed.use_model(model.clone()).await;
    measured.use_model(model.clone()).await;
    overflowed.learn(|learned| learned.window_below = 7_000);
    overflowed.learn_window(6_000);
    measured.note_forwarded(1_000);
    measured.set_usage(Usage { prompt_tokens: 2_000, output_tokens: 300, ..Usage::default() });
    assert!(overflowed.commit().await);
    assert!(measured.commit().await, "commits what it saw before the overflow was learned");
    for stored_key in ["tenant.p", model.store_key.as_str()] {
        let (session, _) = store.load(stored_key, "-").await.unwrap();
        let learned = session.counters.learned;
        assert_eq!((learned.window, learned.window_below), (6_000, 7_000), "{stored_key}: {learned:?}");
        assert_eq!((learned.calibration_milli, learned.window_at_least), (2_000, 2_300), "{stored_key}");
    }
    // A later measurement is folded into the stored calibration, not laid over it.
    let mut later = SessionCtx::load(store.clone(), key("p"), conversation(MAIN)).await;
    let mut stale = SessionCtx::load(store.clone(), key("p"), conversation(SUBAGENT)).await;
    later.use_model(model.clone()).await;
    stale.use_model(model.clone()).await;
    later.measure(1_000, 1_000);
    stale.measure(1_000, 1_000);
    assert!(later.commit().await && stale.commit().await);
    let twice = Learned::smooth(Learned::smooth(2_000, 1_000), 1_000);
    assert_eq!(store.load("tenant.p", "-").await.unwrap().0.counters.learned.calibration_milli, twice);
}

#[tokio::test]
async fn an_answer_larger_than_an_unnamed_overflow_drops_that_bound_in_the_store_too() {
    let store = Store::from_config(&Config::default().session);
    let mut overflowed = SessionCtx::load(store.clone(), key("q"), conversation(MAIN)).await;
    let mut answered = SessionCtx::load(store.clone(), key("q"), conversation(SUBAGENT)).await;
    overflowed.learn(|learned| learned.window_below = 5_000);
    answered.set_usage(Usage { prompt_tokens: 6_000, output_tokens: 10, ..Usage::default() });
    assert!(overflowed.commit().await && answered.commit().await);
    let learned = store.load("tenant.q", "-").await.unwrap().0.counters.learned;
    assert_eq!((learned.window_below, learned.window_at_least), (0, 6_010), "{learned:?}");
}

#[tokio::test]
async fn a_failed_commit_is_reported_not_dropped() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut config = Config::default().session;
    config.store = StoreKind::Redis;
    config.redis_url = crate::config::RedisUrls::new(format!("redis://{closed}"));
    let mut ctx = SessionCtx::load(Store::from_config(&config), key("c"), conversation(MAIN)).await;
    ctx.record_request(&[], 0, 1);
    assert!(!ctx.commit().await);
}
