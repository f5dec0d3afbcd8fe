//! The inspector in a real browser: Debian's Chromium driven through chromedriver's WebDriver
//! protocol (plain JSON over HTTP, with the test suite's own client). An agent-shaped session goes
//! through pruning, an overflow and a compaction; then the browser logs in through the form, finds
//! the session by the agent's id, opens the conversation and sees the summary, the pruned outputs
//! and the plots; a browser without the login gets the login page.
//!
//! Needs `/usr/bin/chromium` and `/usr/bin/chromedriver` (`apt-get install -y chromium
//! chromium-driver`); skipped with a message without them, unless
//! `COMPACTOR_REQUIRE_BROWSER_TESTS=1` (CI), which makes their absence a failure. With
//! `COMPACTOR_SCREENSHOTS=<dir>` the main pages are saved there as PNGs (docs/img/ holds them).

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::inspector::{ADMIN_TOKEN, agent_session, config, start};
use crate::common::window::{WindowSpec, window_upstream};
use crate::common::*;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// The W3C name of an element reference in WebDriver answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Whether the browser tests must run (CI sets `COMPACTOR_REQUIRE_BROWSER_TESTS=1`).
fn required() -> bool {
    std::env::var("COMPACTOR_REQUIRE_BROWSER_TESTS").is_ok_and(|v| v == "1")
}

/// A chromedriver on a free port, stopped with the test.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start() -> Option<Self> {
        if !Path::new(CHROMIUM).exists() || !Path::new(CHROMEDRIVER).exists() {
            assert!(!required(), "browser tests are required here but {CHROMIUM} or {CHROMEDRIVER} is missing");
            eprintln!("skipped: no {CHROMIUM} and {CHROMEDRIVER} (apt-get install -y chromium chromium-driver)");
            return None;
        }
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        Some(Self { child, url: format!("http://127.0.0.1:{port}") })
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let headers: &[(&str, &str)] = if method == "GET" { &[] } else { &[("content-type", "application/json")] };
        let answer = send(request(method, &format!("{}{path}", self.url), headers, body)).await;
        let value: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        assert!(answer.status.is_success(), "{method} {path}: {} {value}", answer.status);
        value["value"].clone()
    }

    /// Waits for chromedriver to answer, then opens a headless Chromium with a fresh profile.
    async fn browser(&self) -> Browser<'_> {
        let profile = tempfile::tempdir().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let status = tokio::time::timeout(
                Duration::from_secs(2),
                client().request(request("GET", &format!("{}/status", self.url), &[], "")),
            )
            .await;
            if matches!(status, Ok(Ok(ref response)) if response.status().is_success()) {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-dev-shm-usage",
            "--window-size=1400,1000",
        ]
        .iter()
        .map(|a| a.to_string())
        .chain([format!("--user-data-dir={}", profile.path().display())])
        .collect::<Vec<_>>();
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args}
        }}});
        let session = self.call("POST", "/session", Some(capabilities)).await;
        let id = session["sessionId"].as_str().expect("a WebDriver session").to_string();
        Browser { driver: self, id, _profile: profile }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One WebDriver session.
struct Browser<'d> {
    driver: &'d Driver,
    id: String,
    _profile: tempfile::TempDir,
}

impl Browser<'_> {
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.driver.call(method, &format!("/session/{}{path}", self.id), body).await
    }

    async fn open(&self, url: &str) {
        self.call("POST", "/url", Some(json!({"url": url}))).await;
    }

    async fn find(&self, css: &str) -> String {
        let found = self.call("POST", "/element", Some(json!({"using": "css selector", "value": css}))).await;
        found[ELEMENT].as_str().unwrap_or_else(|| panic!("no {css}: {found}")).to_string()
    }

    async fn count(&self, css: &str) -> usize {
        let found = self.call("POST", "/elements", Some(json!({"using": "css selector", "value": css}))).await;
        found.as_array().map_or(0, Vec::len)
    }

    async fn text(&self, css: &str) -> String {
        let element = self.find(css).await;
        self.call("GET", &format!("/element/{element}/text"), None).await.as_str().unwrap_or_default().to_string()
    }

    async fn type_into(&self, css: &str, text: &str) {
        let element = self.find(css).await;
        self.call("POST", &format!("/element/{element}/value"), Some(json!({"text": text}))).await;
    }

    async fn click(&self, css: &str) {
        let element = self.find(css).await;
        self.call("POST", &format!("/element/{element}/click"), Some(json!({}))).await;
    }

    async fn url(&self) -> String {
        self.call("GET", "/url", None).await.as_str().unwrap_or_default().to_string()
    }

    async fn title(&self) -> String {
        self.call("GET", "/title", None).await.as_str().unwrap_or_default().to_string()
    }

    /// Saves the whole page as `name.png` under `COMPACTOR_SCREENSHOTS`, when it is set.
    async fn screenshot(&self, name: &str) {
        let Ok(dir) = std::env::var("COMPACTOR_SCREENSHOTS") else { return };
        // As tall as the page, so the picture shows all of it.
        let height = self
            .call(
                "POST",
                "/execute/sync",
                Some(json!({"script": "return document.documentElement.scrollHeight", "args": []})),
            )
            .await;
        let height = height.as_u64().unwrap_or(1000).clamp(600, 4000);
        self.call("POST", "/window/rect", Some(json!({"width": 1400, "height": height + 120}))).await;
        let png = self.call("GET", "/screenshot", None).await;
        let bytes = base64_decode(png.as_str().expect("a screenshot"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(Path::new(&dir).join(format!("{name}.png")), bytes).unwrap();
        self.call("POST", "/window/rect", Some(json!({"width": 1400, "height": 1000}))).await;
    }

    async fn close(self) {
        self.driver.call("DELETE", &format!("/session/{}", self.id), None).await;
    }
}

/// Standard base64 (WebDriver's screenshots).
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let clean: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=').collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= u32::from(value(*c)) << (18 - 6 * i);
        }
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

#[tokio::test]
async fn a_browser_logs_in_finds_the_agents_session_and_sees_what_compactor_did() {
    let Some(driver) = Driver::start() else { return };
    let (fake, summaries) = window_upstream(WindowSpec::window(4_000)).await;
    let proxy = start(&fake, &config(50), true);
    let key = agent_session(&proxy, "claude-session-2f9c").await;
    assert!(summaries.count() >= 1);

    let browser = driver.browser().await;
    // Without the login, any page is the login form.
    browser.open(&proxy.url("/ui/sessions?id=claude-session-2f9c")).await;
    assert_eq!(browser.count("input[name=token]").await, 1, "the login page");
    assert_eq!(browser.count("a.session").await, 0);
    browser.screenshot("inspector-login").await;

    browser.type_into("#token", ADMIN_TOKEN).await;
    browser.click("#login").await;
    // Back where it was going: the lookup by the agent's own session id.
    let deadline = Instant::now() + Duration::from_secs(10);
    while browser.count("a.session").await == 0 {
        assert!(Instant::now() < deadline, "no session listed at {}", browser.url().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(browser.url().await.ends_with("/ui/sessions?id=claude-session-2f9c"));
    assert_eq!(browser.text("a.session").await, key);
    browser.open(&proxy.url("/ui/sessions")).await;
    browser.screenshot("inspector-sessions").await;
    browser.open(&proxy.url("/ui/sessions?id=claude-session-2f9c")).await;

    browser.click("a.session").await;
    assert!(browser.title().await.starts_with("Session "), "{}", browser.title().await);
    browser.screenshot("inspector-session").await;
    browser.click("a.conversation").await;
    assert!(browser.title().await.starts_with("Conversation "));
    let summary = browser.text("pre.summary").await;
    assert!(summary.contains("ZEPHYR-LANTERN-42"), "the summary text: {summary}");
    let timeline = browser.text("#timeline").await;
    assert!(timeline.contains("pruned"), "the pruned outputs: {timeline}");
    assert_eq!(browser.count("#timeline tr").await, 5);
    for plot in ["#plot-tokens", "#plot-cost", "#plot-cache"] {
        assert!(browser.count(&format!("{plot} polyline")).await >= 1, "{plot} has lines");
    }
    // The live update runs: a new request appears without a reload.
    let mut next = crate::common::window::conversation(crate::common::window::Api::Chat, 30, false);
    let messages = next["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": "Done."}));
    messages.push(json!({"role": "user", "content": "Now the docs."}));
    assert_eq!(super::inspector::chat(&proxy, "claude-session-2f9c", &next).await.status, 200);
    let deadline = Instant::now() + Duration::from_secs(15);
    while browser.count("#timeline tr").await < 6 {
        assert!(Instant::now() < deadline, "the new request did not show up live");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    browser.screenshot("inspector-conversation").await;
    browser.click("#timeline tr a").await;
    assert!(browser.title().await.starts_with("Request "));
    browser.screenshot("inspector-request").await;
    browser.close().await;

    // Another browser, never logged in, gets the login page for the conversation too.
    let stranger = driver.browser().await;
    stranger.open(&proxy.url(&format!("/ui/sessions/{key}"))).await;
    assert_eq!(stranger.count("input[name=token]").await, 1);
    assert_eq!(stranger.count("a.conversation").await, 0);
    stranger.close().await;
}
