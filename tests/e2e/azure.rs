//! Azure OpenAI through compactor: its paths go to `upstream.azure` with their query and `api-key`,
//! and the deployment a path names is the model the window is read for, whatever the body says.
//! (The official SDK's `AzureOpenAI` client is driven in `sdk_e2e.rs`.)

use crate::common::window::{Api, WindowSpec, conversation, window_upstream};
use crate::common::*;

/// The summarizer has a large window, so a compaction is one summary call.
const CONFIG: &str = "[models.big-summarizer]\ncontext_window = 200000\nmax_output_tokens = 8192\n[prune]\nenabled = false\n[truncate]\nenabled = false\n[compaction]\nkeep_recent_tokens = 600\nuser_message_max_tokens = 300\nemergency_protect_tokens = 1000000\nmodel = \"big-summarizer\"\n";
/// A deployment the operator gave a small window; the body names a model of 128k.
const SMALL_DEPLOYMENT: &str = "[models.team-small]\ncontext_window = 4000\nmax_output_tokens = 500\n";
const API_VERSION: &str = "api-version=2024-10-21";

fn azure_path(deployment: &str) -> String {
    format!("/openai/deployments/{deployment}/chat/completions?{API_VERSION}")
}

#[tokio::test]
async fn an_azure_deployment_is_the_model_its_window_is_read_for() {
    // The provider's window is large: only the deployment's entry in the model table can call
    // for a compaction here.
    let (fake, summaries) = window_upstream(WindowSpec::window(1_000_000)).await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let toml =
        format!("[upstream]\nopenai = \"http://{closed}\"\nazure = \"{}\"\n{CONFIG}{SMALL_DEPLOYMENT}", fake.url());
    let proxy = ProxyProcess::start_with(&toml, &[]);
    let mut body = conversation(Api::Chat, 12, false);
    body["model"] = "gpt-4o".into();
    let headers = [("api-key", "azure-key-1"), ("x-session-id", "s")];

    // Another deployment, the same body: its window is the default's, and it goes as it came.
    let big = proxy.post(&azure_path("team-big"), &headers, &body).await;
    assert_eq!(big.status, 200, "{}", big.text());
    assert_eq!(summaries.count(), 0);
    let sent = fake.last();
    assert_eq!(sent.path_and_query, azure_path("team-big"));
    assert_eq!(sent.headers.get("api-key").unwrap(), "azure-key-1");
    assert_eq!(sent.body, serde_json::to_vec(&body).unwrap(), "forwarded byte for byte");

    // The small deployment: compacted before it goes, at the deployment's path, with its key.
    let small =
        proxy.post(&azure_path("team-small"), &[("api-key", "azure-key-1"), ("x-session-id", "t")], &body).await;
    assert_eq!(small.status, 200, "{}", small.text());
    assert_eq!(summaries.count(), 1, "the deployment's window called for one summary");
    assert_eq!(small.header("x-compactor-retries"), Some("0"), "no overflow was needed");
    let sent = fake.last();
    assert_eq!(sent.path_and_query, azure_path("team-small"));
    assert_eq!(sent.headers.get("api-key").unwrap(), "azure-key-1");
    assert!(sent.json()["messages"].to_string().contains("Handoff summary 1"), "{}", sent.json());
    assert!(fake.received().iter().all(|r| r.path_and_query.starts_with("/openai/deployments/")));
}

#[tokio::test]
async fn an_overflow_on_an_azure_deployment_is_recovered_as_the_deployment() {
    // No summarizing model of its own: the summary calls name the request's model, which on
    // Azure is the deployment, on the first attempt and in the recovery alike.
    let (fake, summaries) = window_upstream(WindowSpec::window(4_000)).await;
    let config = "[prune]\nenabled = false\n[truncate]\nenabled = false\n[compaction]\nkeep_recent_tokens = 600\nuser_message_max_tokens = 300\nemergency_protect_tokens = 1000000\n";
    let proxy = ProxyProcess::start_with(&format!("[upstream]\nazure = \"{}\"\n{config}", fake.url()), &[]);
    let mut body = conversation(Api::Chat, 12, false);
    body["model"] = "gpt-4o".into();
    let answer = proxy.post(&azure_path("team-x"), &[("api-key", "azure-key-1"), ("x-session-id", "s")], &body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("x-compactor-retries"), Some("1"), "the provider's overflow was recovered");
    assert!(summaries.count() >= 1);
    let summary_models: Vec<_> = fake
        .received()
        .iter()
        .filter(|r| String::from_utf8_lossy(&r.body).contains("context-compaction"))
        .map(|r| r.json()["model"].clone())
        .collect();
    assert!(!summary_models.is_empty());
    assert!(summary_models.iter().all(|model| model == "team-x"), "{summary_models:?}");
}
