//! The official `openai` and `anthropic` Python SDKs, used as a user's code would, against the real
//! binary and the fake upstream: `tests/sdk/e2e.py` does the talking, this test sets the stage.
//!
//! Needs a Python with both SDKs: `COMPACTOR_SDK_PYTHON=$(scripts/sdk-venv | tail -1)`. Without it
//! the test is skipped, unless `COMPACTOR_REQUIRE_SDK_TESTS` is set (CI), which makes that a failure.

use std::path::Path;
use std::process::Command;

use crate::common::*;

/// The model name for which the fake upstream answers 429, in the route's dialect.
const RATE_LIMITED: &str = "rate-limited";

/// Environment variables that would send the SDKs' loopback requests elsewhere.
const PROXY_VARS: &[&str] =
    &["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy", "NO_PROXY", "no_proxy"];

fn rate_limited(received: &Received) -> Option<Reply> {
    let body: serde_json::Value = serde_json::from_slice(&received.body).ok()?;
    if body.get("model").and_then(|m| m.as_str()) != Some(RATE_LIMITED) {
        return None;
    }
    let path = received.path_and_query.split('?').next().unwrap_or("");
    let error = if path.starts_with("/v1/messages") {
        serde_json::json!({"type": "error", "error": {"type": "rate_limit_error", "message": "Number of request tokens has exceeded your per-minute rate limit."}})
    } else {
        serde_json::json!({"error": {"message": "Rate limit reached for requests.", "type": "requests", "param": null, "code": "rate_limit_exceeded"}})
    };
    Some(Reply::json(429, error).with_header("retry-after", "20"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_official_python_sdks_work_through_compactor() {
    let Some(python) = std::env::var_os("COMPACTOR_SDK_PYTHON").filter(|p| !p.is_empty()) else {
        assert!(
            std::env::var_os("COMPACTOR_REQUIRE_SDK_TESTS").is_none(),
            "COMPACTOR_REQUIRE_SDK_TESTS is set but COMPACTOR_SDK_PYTHON is not: \
             set it to a Python with the openai and anthropic SDKs, e.g. \
             COMPACTOR_SDK_PYTHON=$(scripts/sdk-venv | tail -1)"
        );
        println!(
            "skipped: COMPACTOR_SDK_PYTHON is not set (COMPACTOR_SDK_PYTHON=$(scripts/sdk-venv | tail -1) to run)"
        );
        return;
    };

    let fake = FakeUpstream::builder().respond_with(rate_limited).start().await;
    let proxy = ProxyProcess::start(&fake, "");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let dead = ProxyProcess::start_with(
        &format!("[upstream]\nopenai = \"http://{closed}\"\nanthropic = \"http://{closed}\"\n"),
        &[],
    );

    // Azure OpenAI: its own upstream (the same fake, which answers every dialect), and a compactor
    // with every upstream at its default, where an Azure path has nowhere to go.
    let azure = ProxyProcess::start_with(&format!("[upstream]\nazure = \"{}\"\n", fake.url()), &[]);
    let no_azure = ProxyProcess::start_with("", &[]);

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/e2e.py");
    let mut command = Command::new(&python);
    command
        .arg(&script)
        .arg("--openai-base-url")
        .arg(proxy.url("/v1"))
        .arg("--anthropic-base-url")
        .arg(proxy.url(""))
        .arg("--dead-openai-base-url")
        .arg(dead.url("/v1"))
        .arg("--dead-anthropic-base-url")
        .arg(dead.url(""))
        .arg("--azure-endpoint")
        .arg(azure.url(""))
        .arg("--azure-unset-endpoint")
        .arg(no_azure.url(""))
        .arg("--verbose")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1");
    for var in PROXY_VARS {
        command.env_remove(var);
    }
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("run {} {}: {e}", python.to_string_lossy(), script.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    if !stderr.is_empty() {
        eprintln!("{stderr}");
    }

    assert!(output.status.success(), "tests/sdk/e2e.py failed ({}):\n{stdout}\n{stderr}", output.status);
    assert!(stdout.contains(" 0 failed"), "tests/sdk/e2e.py reported failures:\n{stdout}");
    assert!(!stdout.contains("SKIP "), "tests/sdk/e2e.py skipped cases:\n{stdout}");
    assert!(
        fake.received().iter().any(|r| r.json()["model"] == RATE_LIMITED),
        "the rate-limited requests reached the fake upstream"
    );
    // The Azure requests reached the Azure upstream at the SDK's paths, with its query and its
    // `api-key`; none reached it from the compactor without one.
    let azure_paths: Vec<_> = fake
        .received()
        .into_iter()
        .filter(|r| r.path_and_query.starts_with("/openai/"))
        .map(|r| (r.path_and_query.clone(), r.headers.get("api-key").map(|v| v.to_str().unwrap_or("").to_string())))
        .collect();
    let chat = "/openai/deployments/team-gpt-4o/chat/completions?api-version=2024-10-21";
    assert_eq!(azure_paths.iter().filter(|(path, _)| path == chat).count(), 2, "{azure_paths:?}");
    assert!(azure_paths.iter().any(|(path, _)| path.starts_with("/openai/responses?api-version=")), "{azure_paths:?}");
    assert!(azure_paths.iter().all(|(_, key)| key.as_deref() == Some("sk-test")), "{azure_paths:?}");
}

/// Google's `google-genai` SDK (`tests/sdk/gemini_e2e.py`) against compactor in front of the
/// provider simulator's Gemini dialect: plain, streamed, function calls whose thought signatures
/// must come back byte for byte (the simulator refuses a Gemini 3 turn that lost one), token
/// counts, and compactor's own error in Google's shape.
#[tokio::test(flavor = "multi_thread")]
async fn the_google_genai_sdk_works_through_compactor() {
    use crate::common::provider::gemini::SIGNATURE;
    use crate::common::provider::{ProviderSim, ProviderSpec};

    let Some(python) = std::env::var_os("COMPACTOR_SDK_PYTHON").filter(|p| !p.is_empty()) else {
        assert!(
            std::env::var_os("COMPACTOR_REQUIRE_SDK_TESTS").is_none(),
            "COMPACTOR_REQUIRE_SDK_TESTS is set but COMPACTOR_SDK_PYTHON is not: \
             COMPACTOR_SDK_PYTHON=$(scripts/sdk-venv | tail -1)"
        );
        println!("skipped: COMPACTOR_SDK_PYTHON is not set");
        return;
    };
    let sim = ProviderSim::start(ProviderSpec::default()).await;
    let proxy = ProxyProcess::start_with(&sim.compactor_config(""), &[]);
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let dead = ProxyProcess::start_with(&format!("[upstream]\ngemini = \"http://{closed}\"\n"), &[]);

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/gemini_e2e.py");
    let mut command = Command::new(&python);
    command
        .arg(&script)
        .arg("--base-url")
        .arg(proxy.url(""))
        .arg("--dead-base-url")
        .arg(dead.url(""))
        .arg("--verbose")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1");
    for var in PROXY_VARS.iter().chain(&["GOOGLE_API_KEY", "GEMINI_API_KEY", "GOOGLE_GEMINI_BASE_URL"]) {
        command.env_remove(var);
    }
    let output = tokio::task::spawn_blocking(move || command.output()).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(output.status.success(), "tests/sdk/gemini_e2e.py failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains(" 0 failed") && !stdout.contains("SKIP "), "{stdout}");

    let records = sim.records();
    // Each function call went back with its signature in the call's own part: the same bytes (the
    // SDK decodes signatures and sends them again in URL-safe base64; compactor passes its bytes).
    let returned: Vec<String> = records
        .iter()
        .filter(|r| r.path.contains("gemini-3-pro-preview"))
        .filter_map(|r| {
            let body: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
            let call = body["contents"].as_array()?.iter().find(|c| c["role"] == "model")?;
            let part = &call["parts"][0];
            let standard = |s: &str| s.replace('-', "+").replace('_', "/");
            part["functionCall"].is_object().then(|| part["thoughtSignature"].as_str().map(standard))?
        })
        .collect();
    assert_eq!(returned, [SIGNATURE, SIGNATURE], "the signatures came back as the provider gave them");
    assert!(records.iter().all(|r| r.status == 200), "the simulator accepted every request");
    assert!(records.iter().any(|r| r.path.contains(":countTokens")));
    assert!(records.iter().any(|r| r.path.contains(":streamGenerateContent?alt=sse")));
    let logs = proxy.logs().join("\n") + &dead.logs().join("\n");
    assert!(!logs.contains("gemini-test-key"), "the API key is in the logs");
}
