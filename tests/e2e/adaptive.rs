//! Compaction that adapts to the provider (issue 10) and pays for itself (issue 15): sessions that
//! grow one agent turn per request against the provider simulator, with a window compactor does
//! not know, errors that name it or not, a tokenizer that counts more than compactor's estimate,
//! and the agents' own request shapes on small windows.

use crate::common::agents::*;
use crate::common::provider::*;
use crate::common::*;

/// A model no table knows: compactor assumes 128k and o200k.
const UNKNOWN: &str = "sim-local-model";
/// Tool outputs of the windows benchmark.
const OUTPUTS: [usize; 6] = [300, 800, 1_500, 600, 1_200, 400];
/// The start of every placeholder, fixed or naming its call.
const PLACEHOLDER: &str = "[Old tool result content cleared";

async fn run(spec: ProviderSpec, session: SessionSpec, turns: usize, extra: &str) -> (Run, ProxyProcess) {
    let provider = ProviderSim::start(spec).await;
    let proxy = ProxyProcess::start_with(&provider.compactor_config(extra), &[]);
    let mut session = AgentSession::new(session);
    let run = drive(&proxy.url(""), &provider, &mut session, turns).await;
    (run, proxy)
}

fn allowed_overflows(errors: Errors) -> usize {
    if errors == Errors::Named { 1 } else { 2 }
}

fn header<'t>(turn: &'t TurnResult, name: &str) -> Option<&'t str> {
    turn.compactor.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn an_unknown_16k_model_keeps_every_fact_and_overflows_once_named_twice_unnamed() {
    for dialect in Dialect::ALL {
        for errors in [Errors::Named, Errors::Unnamed] {
            let spec = ProviderSpec { window: 16_384, errors, ..ProviderSpec::default() };
            let session = SessionSpec::new(Agent::Plain(dialect), UNKNOWN).outputs(&OUTPUTS).seed(16);
            let (run, _proxy) = run(spec, session, 24, "").await;
            let stats = run.stats();
            let case = format!("{dialect:?} {errors:?}: {stats:?}");
            assert_eq!(stats.client_errors, 0, "{case}");
            assert!(run.lost_facts().is_empty(), "{case}: lost {:?}", run.lost_facts());
            assert!(stats.overflows <= allowed_overflows(errors), "{case}");
            assert_eq!(stats.failed_summaries, 0, "{case}");
            assert!(stats.summary_calls > 0, "the session outgrew the window: {case}");
        }
    }
}

#[tokio::test]
async fn a_tokenizer_counting_1_6x_overflows_at_most_once_on_a_known_window() {
    let known = "[models.\"sim-known\"]\ncontext_window = 16384\nmax_output_tokens = 4096\n";
    for dialect in [Dialect::Chat, Dialect::Messages] {
        let spec = ProviderSpec { window: 16_384, ..ProviderSpec::with_density(1.6) };
        let session = SessionSpec::new(Agent::Plain(dialect), "sim-known").outputs(&OUTPUTS).seed(3);
        let (run, _proxy) = run(spec, session, 24, known).await;
        let stats = run.stats();
        assert_eq!(stats.client_errors, 0, "{dialect:?}: {stats:?}");
        assert!(stats.overflows <= 1, "{dialect:?}: {stats:?}");
        assert!(run.lost_facts().is_empty(), "{dialect:?}: lost {:?}", run.lost_facts());
        assert!(stats.tokens_answered / stats.turns > 4_000, "the session grew well past a few turns");
    }
}

#[tokio::test]
async fn a_4k_model_summarizing_its_own_history_fits_every_summary_call_and_drops_no_fact() {
    let spec = ProviderSpec { window: 4_096, ..ProviderSpec::default() };
    let session = SessionSpec::new(Agent::Plain(Dialect::Chat), UNKNOWN).outputs(&OUTPUTS).seed(4);
    let (run, _proxy) = run(spec, session, 16, "").await;
    let stats = run.stats();
    assert!(stats.summary_calls > 0, "{stats:?}");
    assert_eq!(stats.failed_summaries, 0, "every summary call fits the 4k window: {stats:?}");
    assert_eq!(stats.client_errors, 0, "{stats:?}");
    assert!(run.lost_facts().is_empty(), "lost {:?}", run.lost_facts());
    for summary in run.records.iter().filter(|r| r.summary) {
        assert!(summary.tokens + summary.max_tokens <= 4_096, "{} + {}", summary.tokens, summary.max_tokens);
        let body: serde_json::Value = serde_json::from_slice(&summary.body).unwrap();
        assert!(body["max_tokens"].as_u64().is_some_and(|m| m > 0), "a Chat summary call carries its output cap");
    }
}

#[tokio::test]
async fn a_new_session_of_the_same_model_starts_with_what_the_last_one_learned() {
    let spec = ProviderSpec { window: 16_384, errors: Errors::Unnamed, ..ProviderSpec::default() };
    let provider = ProviderSim::start(spec).await;
    let proxy = ProxyProcess::start_with(&provider.compactor_config(""), &[]);
    let agent = Agent::Plain(Dialect::Messages);
    let mut first = AgentSession::new(SessionSpec::new(agent, UNKNOWN).outputs(&OUTPUTS).seed(1));
    let learned = drive(&proxy.url(""), &provider, &mut first, 28).await;
    assert!(learned.stats().overflows >= 1, "the first session meets the window: {:?}", learned.stats());
    let mut second = AgentSession::new(SessionSpec::new(agent, UNKNOWN).outputs(&OUTPUTS).seed(2));
    let later = drive(&proxy.url(""), &provider, &mut second, 28).await;
    let stats = later.stats();
    assert_eq!(stats.overflows, 0, "the second session knows the window from the start: {stats:?}");
    assert!(later.lost_facts().is_empty(), "lost {:?}", later.lost_facts());
}

#[tokio::test]
async fn with_pruning_off_no_output_is_ever_replaced_and_recovery_summarizes() {
    let spec = ProviderSpec { window: 16_384, ..ProviderSpec::default() };
    let session = SessionSpec::new(Agent::Plain(Dialect::Chat), UNKNOWN).outputs(&OUTPUTS).seed(5);
    let (run, _proxy) = run(spec, session, 20, "[prune]\nenabled = false\n").await;
    let stats = run.stats();
    assert!(stats.overflows >= 1 && stats.summary_calls >= 1, "{stats:?}");
    assert_eq!(stats.client_errors, 0, "{stats:?}");
    for record in run.records.iter().filter(|r| !r.summary) {
        assert!(!String::from_utf8_lossy(&record.body).contains(PLACEHOLDER), "a placeholder went out");
    }
    assert!(run.lost_facts().is_empty(), "lost {:?}", run.lost_facts());
}

#[tokio::test]
async fn a_recovered_request_says_in_its_log_line_and_headers_what_recovery_did() {
    let spec = ProviderSpec { window: 16_384, ..ProviderSpec::default() };
    let session = SessionSpec::new(Agent::Plain(Dialect::Chat), UNKNOWN).outputs(&OUTPUTS).seed(16);
    // Today's old order, so the recovery prunes harder first.
    let order = "[compaction]\nladder = [\"prune_hard\", \"summarize\", \"summarize_harder\"]\n";
    let (run, proxy) = run(spec, session, 28, order).await;
    let recovered = run
        .turns
        .iter()
        .find(|t| header(t, "x-compactor-retries").is_some_and(|r| r != "0"))
        .expect("a turn recovered from the overflow");
    assert!(recovered.ok);
    let id = header(recovered, "x-compactor-request-id").unwrap();
    let line = proxy.wait_for_log(&format!("request_id={id}")).await;
    assert!(line.contains("overflow=openai:named"), "{line}");
    assert!(line.contains("retries=1"), "{line}");
    assert!(line.contains("rungs=prune_hard:"), "{line}");
    // The prune-harder rung's placeholders are counted in the header and the log line alike.
    let answered = run.answered(recovered.index).unwrap();
    let placeholders = String::from_utf8_lossy(&answered.body).matches(PLACEHOLDER).count();
    let pruned: usize = header(recovered, "x-compactor-pruned").unwrap().parse().unwrap();
    assert_eq!(pruned, placeholders, "{line}");
    assert!(line.contains(&format!("pruned={pruned}")), "{line}");
}

#[tokio::test]
async fn agent_shapes_on_small_windows_keep_every_fact_with_few_summary_calls() {
    // The windows issue 15 tried each agent on (Codex with OpenCode's), and its target: at most
    // three summary calls. OpenCode's 6.6k fixed part leaves room on 15k for about two turns of
    // 2k: one summary after the first overflow, then one when the room is used up, not one per
    // turn at the threshold (a rebuild with no room for the next turns is not worth a call).
    // These sessions are smaller than the real agents' were: eight turns never fill 28k or 26k, so
    // Claude Code and Qwen Code are also tried where their fixed part leaves room for about three
    // turns (22k, 20k), as OpenCode's does on 15k.
    let cases = [
        (Agent::ClaudeCode, 28_672),
        (Agent::ClaudeCode, 22_528),
        (Agent::QwenCode, 26_624),
        (Agent::QwenCode, 20_480),
        (Agent::OpenCode, 15_360),
        (Agent::Codex, 15_360),
    ];
    for (agent, window) in cases {
        for errors in [Errors::Named, Errors::Unnamed] {
            let spec = ProviderSpec { window, errors, ..ProviderSpec::default() };
            let session = SessionSpec::new(agent, UNKNOWN).outputs(&[2_000]).seed(window as u64);
            let (run, _proxy) = run(spec, session, 8, "").await;
            let stats = run.stats();
            let case = format!("{} {window} {errors:?}: {stats:?}", agent.name());
            assert_eq!(stats.client_errors, 0, "{case}");
            assert!(run.lost_facts().is_empty(), "{case}: lost {:?}", run.lost_facts());
            assert!(stats.overflows <= allowed_overflows(errors), "{case}");
            assert!(stats.summary_calls <= 3, "{case}");
            // Each summary frees room for more than the turn that applied it: no two turns in a
            // row apply a new compaction. (Counted by the generation each turn carried, not by
            // where summary calls fall: a summary prepared in the background is made by the turn
            // that foresees the compaction, a turn or two before the turn that applies it.)
            let generations: Vec<u32> = run
                .turns
                .iter()
                .map(|t| header(t, "x-compactor-compacted").map_or(0, |g| g.parse().unwrap()))
                .collect();
            let compacted: Vec<bool> =
                generations.iter().enumerate().map(|(i, g)| *g > if i == 0 { 0 } else { generations[i - 1] }).collect();
            assert!(!compacted.windows(2).any(|pair| pair[0] && pair[1]), "{case}: {generations:?}");
        }
    }
}
