//! compactor's defaults in front of a local server (issue 53), against the provider simulator on
//! loopback standing for one, its answers about itself recorded from each server kind
//! (`tests/fixtures/local-servers/`): the upstream is priced `local` because of its address (said
//! at start and on `/readyz`), the server is asked for its window so the agent never meets an
//! overflow, and old tool outputs are masked before a summary is paid for.

use crate::common::agents::{Agent, AgentSession, Run, SessionSpec, drive};
use crate::common::provider::Dialect;
use crate::common::provider::{Errors, ProviderSim, ProviderSpec};
use crate::common::*;

/// The server's window, as each recorded answer states it.
const WINDOW: usize = 4_096;
/// The model the recorded Ollama answers name (vLLM's is its only model).
const MODEL: &str = "qwen2.5-coder:7b";
/// Tool outputs of an agent reading files, in the server's tokens: the session passes the window
/// by its sixth turn.
const OUTPUTS: [usize; 4] = [500, 700, 400, 600];
const TURNS: usize = 16;

fn recorded(name: &str) -> String {
    let path = format!("{}/tests/fixtures/local-servers/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The session through compactor as it ships (no preset set), in front of a simulated server
/// that answers `stated`; `extra` TOML after the simulator's own.
async fn session(stated: Vec<(&'static str, String)>, extra: &str) -> (Run, ProxyProcess) {
    // Short answers, as an agent between tool calls gives: the history grows by tool output.
    let spec =
        ProviderSpec { window: WINDOW, errors: Errors::Real, stated, reply_tokens: 40, ..ProviderSpec::default() };
    let provider = ProviderSim::start(spec).await;
    let proxy = ProxyProcess::start_as_shipped(&provider.compactor_config(extra), &[]);
    let mut session =
        AgentSession::new(SessionSpec::new(Agent::Plain(Dialect::Chat), MODEL).outputs(&OUTPUTS).seed(53));
    let run = drive(&proxy.url(""), &provider, &mut session, TURNS).await;
    (run, proxy)
}

/// The facts planted in the newest two turns' tool outputs reached the model on the last turn.
fn newest_facts_kept(run: &Run) -> Result<(), String> {
    let last = run.answered(run.turns.len() - 1).ok_or("the last turn was not answered")?;
    let newest = run.facts.iter().filter(|f| f.in_tool_output && f.turn + 2 >= run.turns.len());
    let lost: Vec<&str> = newest.filter(|f| !last.markers.contains(&f.marker)).map(|f| f.marker.as_str()).collect();
    if lost.is_empty() { Ok(()) } else { Err(format!("lost {lost:?}")) }
}

#[tokio::test]
async fn each_server_kind_s_stated_window_spares_the_agent_its_first_overflow() {
    let kinds: [(&str, Vec<(&'static str, String)>); 4] = [
        ("llama.cpp", vec![("/props", recorded("llama_cpp_props.json"))]),
        ("vLLM", vec![("/v1/models", recorded("vllm_models.json"))]),
        ("Ollama, loaded", vec![("/api/ps", recorded("ollama_ps.json"))]),
        ("Ollama, Modelfile", vec![("/api/show", recorded("ollama_show.json"))]),
    ];
    for (kind, stated) in kinds {
        let (run, proxy) = session(stated, "").await;
        let stats = run.stats();
        assert_eq!(stats.client_errors, 0, "{kind}: every turn answered: {stats:?}");
        assert_eq!(stats.overflows, 0, "{kind}: the agent never met the window: {stats:?}");
        newest_facts_kept(&run).unwrap_or_else(|e| panic!("{kind}: {e}"));
        let logs = proxy.logs().join("\n");
        assert!(logs.contains("the local server states its window") && logs.contains("window=4096"), "{kind}: {logs}");
    }
}

/// A server that states nothing (llama-cpp-python's, as the real one in `tests/local` shows):
/// the window is learned from the first overflow, as before, and the agent still gets every
/// answer. And the address made the upstream `local`: said at start and on `/readyz`.
#[tokio::test]
async fn a_server_that_states_nothing_is_learned_from_its_first_overflow() {
    let (run, proxy) = session(Vec::new(), "").await;
    let stats = run.stats();
    assert_eq!(stats.client_errors, 0, "{stats:?}");
    assert!(stats.overflows >= 1, "nothing told compactor the window: {stats:?}");
    let logs = proxy.logs().join("\n");
    assert!(logs.contains("the local server states no window"), "{logs}");
    assert!(logs.contains("upstream.openai_cache") && logs.contains("priced as a local inference server"), "{logs}");
    let ready = proxy.get_with_token("/readyz", "").await.json();
    assert_eq!(ready["local_presets"][0], "upstream.openai_cache", "{ready}");
}

/// Summary calls compactor made (on the request path and in the background), as it counts them.
async fn summary_calls(proxy: &ProxyProcess) -> u64 {
    let metrics = proxy.get_with_token("/metrics", "").await.text();
    let prefix = "compactor_summary_calls_total{outcome=\"ok\"} ";
    metrics.lines().find_map(|l| l.strip_prefix(prefix)).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
}

/// On a small window, masking old outputs comes before a summary: fewer summary calls than with
/// the protection sized for a cloud window (40,000 tokens protected, 20,000 a batch), and the
/// newest outputs whole. A preset set in the file wins over the address.
#[tokio::test]
async fn a_small_window_masks_old_outputs_before_it_pays_for_a_summary() {
    let stated = || vec![("/props", recorded("llama_cpp_props.json"))];
    let (masked, masking) = session(stated(), "").await;
    let cloud_sized = "[prune]\nprotect_window_share = 1.0\nminimum_window_share = 1.0\n";
    let (summarized, summarizing) = session(stated(), cloud_sized).await;
    let (masked_stats, summarized_stats) = (masked.stats(), summarized.stats());
    assert_eq!(masked_stats.client_errors + summarized_stats.client_errors, 0, "{masked_stats:?} {summarized_stats:?}");
    let (masked_calls, summarized_calls) = (summary_calls(&masking).await, summary_calls(&summarizing).await);
    println!(
        "summary calls: {masked_calls} masking first, {summarized_calls} with protection sized for a cloud window"
    );
    assert!(
        masked_calls < summarized_calls,
        "masking first: {masked_calls} summary calls; protection sized for a cloud window: {summarized_calls}"
    );
    assert!(
        masked.records.iter().any(|r| String::from_utf8_lossy(&r.body).contains("Old tool result content cleared"))
    );
    newest_facts_kept(&masked).unwrap();
    // The operator's own preset wins over the address: only the keys left unset are local.
    let provider = ProviderSim::start(ProviderSpec { window: WINDOW, ..ProviderSpec::default() }).await;
    let config = provider.compactor_config("").replacen("[admin]", "openai_cache = \"openai\"\n[admin]", 1);
    let explicit = ProxyProcess::start_as_shipped(&config, &[]);
    let ready = explicit.get_with_token("/readyz", "").await.json();
    assert_eq!(
        ready["local_presets"],
        serde_json::json!(["upstream.azure_cache", "upstream.anthropic_cache", "upstream.gemini_cache"]),
        "{ready}"
    );
}

/// A client whose credential the server refuses cannot keep the window from the others: its
/// refused questions record nothing (else the server would not be asked again for 10 minutes),
/// and the next client's questions are answered.
#[tokio::test]
async fn a_refused_credential_decides_nothing_for_another_client() {
    let spec = ProviderSpec {
        window: WINDOW,
        errors: Errors::Real,
        stated: vec![("/props", recorded("llama_cpp_props.json"))],
        stated_key: Some("sk-sim"),
        reply_tokens: 40,
        ..ProviderSpec::default()
    };
    let provider = ProviderSim::start(spec).await;
    let proxy = ProxyProcess::start_as_shipped(&provider.compactor_config(""), &[]);
    let hello = serde_json::json!({"model": MODEL, "messages": [{"role": "user", "content": "hello"}]});
    let answer = proxy.post("/v1/chat/completions", &[("authorization", "Bearer sk-other-tenant")], &hello).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let asked = || provider.records().iter().filter(|r| r.path == "/api/show").count();
    assert!(eventually(async || asked() == 1).await, "the questions went with the refused credential");
    assert!(provider.records().iter().any(|r| r.path == "/props" && r.status == 401));
    let mut session =
        AgentSession::new(SessionSpec::new(Agent::Plain(Dialect::Chat), MODEL).outputs(&OUTPUTS).seed(53));
    let run = drive(&proxy.url(""), &provider, &mut session, TURNS).await;
    let stats = run.stats();
    assert_eq!((stats.client_errors, stats.overflows), (0, 0), "the agent's own credential was answered: {stats:?}");
    assert!(proxy.logs().join("\n").contains("window=4096"));
}
