//! The session inspector (`/ui/`) against the real binary over loopback HTTP: what requests leave
//! in the store (memory and Redis alike, bounded), who may see the pages (token, login cookie,
//! nothing when no token is configured), that a change needs its CSRF token, and that what came
//! from a client is escaped.

use crate::common::redis_server::RedisServer;
use crate::common::window::{Api, WindowSpec, conversation, window_upstream};
use crate::common::*;
use serde_json::{Value, json};

pub const ADMIN_TOKEN: &str = "inspector-admin-token-5f3a";

/// A small window (overflows and a compaction), a summarizer with a large one, pruning that pays
/// back at once (the OpenAI upstream is priced as having no cache), and the inspector keeping
/// `requests` summaries per conversation.
pub fn config(requests: u32) -> String {
    format!(
        "[models.big-summarizer]\ncontext_window = 200000\nmax_output_tokens = 8192\n[models.test-model]\ncontext_window = 4000\nmax_output_tokens = 500\n[admin]\ntoken = \"{ADMIN_TOKEN}\"\n[inspector]\nrequests_per_conversation = {requests}\n[prune]\nprotect_tokens = 1000\nminimum_tokens = 200\n[truncate]\nenabled = false\n[compaction]\nkeep_recent_tokens = 600\nuser_message_max_tokens = 300\nemergency_protect_tokens = 1000000\nlock_wait_ms = 20000\nmodel = \"big-summarizer\"\n"
    )
}

/// A compactor in front of `fake` with `extra` TOML; `no_cache`: the OpenAI upstream is priced as
/// having no prompt cache, so a prune always pays back.
pub fn start(fake: &FakeUpstream, extra: &str, no_cache: bool) -> ProxyProcess {
    let cache = if no_cache { "openai_cache = \"none\"\n" } else { "" };
    ProxyProcess::start_with(
        &format!("[upstream]\nopenai = \"{0}\"\nanthropic = \"{0}\"\n{cache}{extra}", fake.url()),
        &[],
    )
}

/// An agent's session: its conversation grows turn by turn until it overflows the window, is
/// summarized, and goes on on the summary. Returns the session key.
pub async fn agent_session(proxy: &ProxyProcess, agent_id: &str) -> String {
    let mut key = String::new();
    for turns in [2, 6, 12, 30] {
        let answer = chat(proxy, agent_id, &conversation(Api::Chat, turns, false)).await;
        assert_eq!(answer.status, 200, "{turns} turns: {}", answer.text());
        key = answer.header("x-compactor-session").unwrap().to_string();
    }
    let mut body = conversation(Api::Chat, 30, false);
    let messages = body["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": "Done."}));
    messages.push(json!({"role": "user", "content": "Next."}));
    assert_eq!(chat(proxy, agent_id, &body).await.status, 200);
    // Each request's state (its summary with it) is committed once its response is done.
    let committed = async || {
        let view = proxy.get_with_token(&format!("/admin/sessions/{key}"), ADMIN_TOKEN).await;
        view.status == 200 && view.json()["state"]["counters"]["requests"] == 5
    };
    assert!(eventually(committed).await, "the five requests are committed");
    key
}

/// The session key of a two-turn Chat conversation sent under `agent_id`.
async fn two_turns(proxy: &ProxyProcess, agent_id: &str) -> String {
    let answer = chat(proxy, agent_id, &conversation(Api::Chat, 2, false)).await;
    answer.header("x-compactor-session").unwrap().to_string()
}

pub async fn chat(proxy: &ProxyProcess, agent_id: &str, body: &Value) -> Answer {
    proxy
        .post(
            Api::Chat.path(),
            &[("authorization", "Bearer sk-client-credential-9z"), ("x-session-id", agent_id)],
            body,
        )
        .await
}

/// A page, with these headers.
pub async fn page(proxy: &ProxyProcess, path: &str, headers: &[(&str, &str)]) -> Answer {
    send(request("GET", &proxy.url(path), headers, "")).await
}

fn bearer() -> (&'static str, String) {
    ("authorization", format!("Bearer {ADMIN_TOKEN}"))
}

async fn as_admin(proxy: &ProxyProcess, path: &str) -> Answer {
    let (name, value) = bearer();
    page(proxy, path, &[(name, &value)]).await
}

/// Logs in through the form; the cookie to send back.
async fn log_in(proxy: &ProxyProcess) -> String {
    let form = format!("token={ADMIN_TOKEN}&next=%2Fui%2Fsessions");
    let answer =
        send(request("POST", &proxy.url("/ui/login"), &[("content-type", "application/x-www-form-urlencoded")], form))
            .await;
    assert_eq!(answer.status, 303, "{}", answer.text());
    assert_eq!(answer.header("location"), Some("/ui/sessions"));
    let cookie = answer.header("set-cookie").unwrap().to_string();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    assert!(!cookie.contains(ADMIN_TOKEN), "the cookie never carries the token: {cookie}");
    cookie.split(';').next().unwrap().to_string()
}

/// The hidden CSRF field's value on a page.
fn csrf_of(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").expect("a form with a CSRF token") + "name=\"csrf\" value=\"".len();
    html[at..].split('"').next().unwrap().to_string()
}

/// The link to the first conversation on a session page.
fn first_conversation(html: &str) -> String {
    let at =
        html.find("class=\"conversation\" href=\"").expect("a conversation") + "class=\"conversation\" href=\"".len();
    html[at..].split('"').next().unwrap().to_string()
}

/// The stores the pages are tested on: memory, then a private Redis (required in CI).
fn stores() -> impl Iterator<Item = (&'static str, Option<RedisServer>)> {
    [("memory", None)].into_iter().chain(RedisServer::start().map(|redis| ("redis", Some(redis))))
}

/// Timeline rows on a conversation page.
fn rows(html: &str) -> usize {
    html.matches("<tr class=\"request").count()
}

#[tokio::test]
async fn an_agent_session_is_recorded_and_shown_with_its_changes_compaction_and_plots() {
    for (store, redis) in stores() {
        let (fake, summaries) = window_upstream(WindowSpec::window(4_000)).await;
        let extra = redis.as_ref().map(|r| r.config()).unwrap_or_default();
        let proxy = start(&fake, &format!("{}{extra}", config(50)), true);
        let key = agent_session(&proxy, "agent-session-7").await;
        assert!(summaries.count() >= 1, "{store}: the session was compacted");

        // Found by the agent's own session id, and in the list of recent sessions.
        let found = as_admin(&proxy, "/ui/sessions?id=agent-session-7").await;
        assert_eq!(found.status, 200);
        assert!(found.text().contains(&format!("/ui/sessions/{key}")), "{store}: {}", found.text());
        let listed = as_admin(&proxy, "/ui/sessions?compacted=1&pruned=1&overflow=1").await.text();
        assert!(listed.contains(&key), "{store}: the filters keep it: {listed}");
        assert!(!as_admin(&proxy, "/ui/sessions?tenant=0000").await.text().contains(&key));

        let session = as_admin(&proxy, &format!("/ui/sessions/{key}")).await.text();
        let conversation = first_conversation(&session);
        let html = as_admin(&proxy, &conversation).await.text();
        assert_eq!(rows(&html), 5, "{store}: every request of the conversation");
        assert!(html.contains("pruned"), "{store}: pruned outputs are shown");
        assert!(html.contains("because: no_cache"), "{store}: with the reason");
        // Generation 1, or 2 when a summary prepared in the background (on by default) was
        // stored before the jump to 30 turns, which then summarized further on top of it.
        assert!(html.contains("summarized (generation "), "{store}");
        assert!(html.contains("ZEPHYR-LANTERN-42"), "{store}: the summary text is shown");
        assert!(html.contains("overflow"), "{store}: the overflow and its rungs");
        for plot in ["plot-tokens", "plot-cost", "plot-cache"] {
            assert!(html.contains(&format!("id=\"{plot}\"")), "{store}: {plot}");
        }
        let points = html.split("id=\"plot-tokens\"").nth(1).unwrap().split("points=\"").nth(1).unwrap();
        assert_eq!(points.split('"').next().unwrap().split(' ').count(), 5, "{store}: a point per request");
        assert!(!html.contains("sk-client-credential-9z") && !html.contains(ADMIN_TOKEN), "no credential shows");

        // A request's own page.
        let at = html.find("/r/").unwrap();
        let link = &html[html[..at].rfind('"').unwrap() + 1..at + html[at..].find('"').unwrap()];
        let request = as_admin(&proxy, link).await;
        assert_eq!(request.status, 200);
        assert!(request.text().contains("tokens sent → forwarded"));

        // The live update: nothing after the newest, every row after none.
        let newest = html.split("data-seen=\"").nth(1).unwrap().split('"').next().unwrap().to_string();
        let rows_path = format!("{conversation}/rows");
        assert_eq!(as_admin(&proxy, &format!("{rows_path}?seen={newest}")).await.text(), "");
        assert_eq!(rows(&as_admin(&proxy, &format!("{rows_path}?seen=")).await.text()), 5);
        let mut next = crate::common::window::conversation(Api::Chat, 30, false);
        let messages = next["messages"].as_array_mut().unwrap();
        messages.push(json!({"role": "assistant", "content": "Done."}));
        messages.push(json!({"role": "user", "content": "And the tests."}));
        assert_eq!(chat(&proxy, "agent-session-7", &next).await.status, 200);
        let fresh = async || rows(&as_admin(&proxy, &format!("{rows_path}?seen={newest}")).await.text()) == 1;
        assert!(eventually(fresh).await, "{store}: the new request shows up live");
    }
}

#[tokio::test]
async fn the_request_log_keeps_the_newest_summaries_up_to_its_bound() {
    for (store, redis) in stores() {
        let (fake, _) = window_upstream(WindowSpec::window(400_000)).await;
        let extra = redis.as_ref().map(|r| r.config()).unwrap_or_default();
        let proxy = start(&fake, &format!("{}{extra}", config(3)), false);
        let mut conversation_page = String::new();
        for turns in 1..=5 {
            let answer = chat(&proxy, "bounded", &conversation(Api::Chat, turns, false)).await;
            let key = answer.header("x-compactor-session").unwrap().to_string();
            // A request's summary is written once its response is done, and a request is numbered
            // from what its conversation had stored when it began: as an agent that waits for its
            // turn to be recorded, wait for this one before the next (parallel requests may share
            // a number, as the record says).
            let recorded = async || {
                let session = as_admin(&proxy, &format!("/ui/sessions/{key}")).await.text();
                if !session.contains("class=\"conversation\" href=\"") {
                    return false;
                }
                let page = as_admin(&proxy, &first_conversation(&session)).await.text();
                page.contains(&format!(">{turns}</a>"))
            };
            assert!(eventually(recorded).await, "{store}: request {turns} is recorded");
            if conversation_page.is_empty() {
                conversation_page = first_conversation(&as_admin(&proxy, &format!("/ui/sessions/{key}")).await.text());
            }
        }
        let conversation = conversation_page;
        let html = async || as_admin(&proxy, &conversation).await.text();
        // The last request's summary is written once its response is done: wait for it.
        let settled = async || {
            let page = html().await;
            rows(&page) == 3 && page.contains(">5</a>")
        };
        assert!(eventually(settled).await, "{store}: {}", html().await);
        let page = html().await;
        assert!(
            page.contains(">5</a>") && page.contains(">3</a>") && !page.contains(">2</a>"),
            "{store}: the newest three"
        );
        if let Some(redis) = &redis {
            let mut connection = redis.connection();
            let keys: Vec<String> = redis.keys().into_iter().filter(|k| k.ends_with(":requests")).collect();
            assert_eq!(keys.len(), 1, "{keys:?}");
            let ttl: i64 = redis::cmd("TTL").arg(&keys[0]).query(&mut connection).unwrap();
            assert!(ttl > 0, "the log carries the sessions' TTL");
            let kept: Vec<String> = redis::cmd("LRANGE").arg(&keys[0]).arg(0).arg(-1).query(&mut connection).unwrap();
            assert!(kept.iter().all(|record| record.len() < 600), "a few hundred bytes each: {kept:?}");
        }
    }
}

#[tokio::test]
async fn recording_off_keeps_nothing_and_the_pages_say_so() {
    let (fake, _) = window_upstream(WindowSpec::window(400_000)).await;
    let proxy = start(&fake, &config(0), false);
    let key = two_turns(&proxy, "unrecorded").await;
    let session = as_admin(&proxy, &format!("/ui/sessions/{key}")).await.text();
    let html = as_admin(&proxy, &first_conversation(&session)).await.text();
    assert_eq!(rows(&html), 0);
    assert!(html.contains("No requests recorded"));
}

#[tokio::test]
async fn the_pages_want_the_admin_token_and_are_off_without_one() {
    let (fake, proxy) = ProxyProcess::with_fake("").await;
    assert_eq!(page(&proxy, "/ui/sessions", &[]).await.status, 404, "no admin token: no pages");
    drop((fake, proxy));

    let (fake, _) = window_upstream(WindowSpec::window(400_000)).await;
    let proxy = start(&fake, &config(10), false);
    let key = two_turns(&proxy, "guarded").await;
    for path in ["/ui/sessions", &format!("/ui/sessions/{key}")] {
        let anonymous = page(&proxy, path, &[]).await;
        assert_eq!(anonymous.status, 401, "{path}");
        assert!(anonymous.text().contains("name=\"token\""), "the login form: {}", anonymous.text());
        assert!(!anonymous.text().contains(&key) || path != "/ui/sessions", "nothing of the sessions shows");
        let wrong = page(&proxy, path, &[("authorization", "Bearer not-the-token")]).await;
        assert_eq!(wrong.status, 401);
        let forged =
            page(&proxy, path, &[("cookie", "compactor_inspector=9999999999.00000000000000000000000000000000")]).await;
        assert_eq!(forged.status, 401);
    }
    assert_eq!(as_admin(&proxy, "/ui/sessions").await.status, 200);

    let refused = send(request(
        "POST",
        &proxy.url("/ui/login"),
        &[("content-type", "application/x-www-form-urlencoded")],
        "token=guess&next=%2Fui%2Fsessions",
    ))
    .await;
    assert_eq!(refused.status, 401);
    assert!(refused.header("set-cookie").is_none());
    let cookie = log_in(&proxy).await;
    let listed = page(&proxy, "/ui/sessions", &[("cookie", &cookie)]).await;
    assert_eq!(listed.status, 200);
    assert!(listed.text().contains(&key));
    assert_eq!(listed.header("cache-control"), Some("no-store"));
    assert!(listed.header("content-security-policy").unwrap().contains("script-src 'self'"));

    // After logging in, only the inspector's own addresses are followed.
    let elsewhere = send(request(
        "POST",
        &proxy.url("/ui/login"),
        &[("content-type", "application/x-www-form-urlencoded")],
        format!("token={ADMIN_TOKEN}&next=https%3A%2F%2Fevil.example%2F"),
    ))
    .await;
    assert_eq!(elsewhere.header("location"), Some("/ui/sessions"));
}

#[tokio::test]
async fn a_change_needs_the_pages_csrf_token() {
    let (fake, _) = window_upstream(WindowSpec::window(400_000)).await;
    let proxy = start(&fake, &config(10), false);
    let key = two_turns(&proxy, "to-forget").await;
    let cookie = log_in(&proxy).await;
    let session = page(&proxy, &format!("/ui/sessions/{key}"), &[("cookie", &cookie)]).await.text();
    let csrf = csrf_of(&session);
    let forget = async |form: &str, headers: &[(&str, &str)]| {
        let mut all = vec![("content-type", "application/x-www-form-urlencoded")];
        all.extend_from_slice(headers);
        send(request("POST", &proxy.url(&format!("/ui/sessions/{key}/forget")), &all, form.to_string())).await
    };
    let admin_view = async || proxy.get_with_token(&format!("/admin/sessions/{key}"), ADMIN_TOKEN).await.status;
    assert_eq!(forget("", &[("cookie", &cookie)]).await.status, 403, "no token");
    assert_eq!(
        forget("csrf=0123456789abcdef0123456789abcdef", &[("cookie", &cookie)]).await.status,
        403,
        "a wrong one"
    );
    assert_eq!(forget(&format!("csrf={csrf}"), &[]).await.status, 403, "the token without the login");
    assert_eq!(admin_view().await, 200, "still there");
    // A GET changes nothing.
    assert_eq!(page(&proxy, &format!("/ui/sessions/{key}/forget"), &[("cookie", &cookie)]).await.status, 404);

    let compact = send(request(
        "POST",
        &proxy.url(&format!("/ui/sessions/{key}/compact")),
        &[("content-type", "application/x-www-form-urlencoded"), ("cookie", &cookie)],
        format!("csrf={csrf}"),
    ))
    .await;
    assert_eq!(compact.status, 303);
    let state = proxy.get_with_token(&format!("/admin/sessions/{key}"), ADMIN_TOKEN).await.json();
    assert_eq!(state["state"]["counters"]["compact_requested"], 1);

    let done = forget(&format!("csrf={csrf}"), &[("cookie", &cookie)]).await;
    assert_eq!(done.status, 303);
    assert_eq!(admin_view().await, 404, "forgotten");
}

/// A form POST with a login cookie.
async fn post_form(proxy: &ProxyProcess, path: &str, cookie: &str, form: String) -> Answer {
    let headers = [("content-type", "application/x-www-form-urlencoded"), ("cookie", cookie)];
    send(request("POST", &proxy.url(path), &headers, form)).await
}

/// Logs out with `cookie` and its `csrf` token; the answer.
async fn log_out(proxy: &ProxyProcess, cookie: &str, csrf: &str) -> Answer {
    post_form(proxy, "/ui/logout", cookie, format!("csrf={csrf}")).await
}

/// Whether a compaction has been asked for the session (the admin API's view).
async fn compact_requested(proxy: &ProxyProcess, key: &str) -> bool {
    let view = proxy.get_with_token(&format!("/admin/sessions/{key}"), ADMIN_TOKEN).await.json();
    view["state"]["counters"]["compact_requested"] == 1
}

#[tokio::test]
async fn logging_out_ends_the_login_its_cookie_and_csrf_token_are_refused_after() {
    for (store, redis) in stores() {
        let (fake, _) = window_upstream(WindowSpec::window(400_000)).await;
        let extra = redis.as_ref().map(|r| r.config()).unwrap_or_default();
        let proxy = start(&fake, &format!("{}{extra}", config(10)), false);
        let key = two_turns(&proxy, "logs-out").await;
        let cookie = log_in(&proxy).await;
        let session = page(&proxy, &format!("/ui/sessions/{key}"), &[("cookie", &cookie)]).await;
        assert_eq!(session.status, 200, "{store}");
        let csrf = csrf_of(&session.text());

        let out = log_out(&proxy, &cookie, &csrf).await;
        assert_eq!(out.status, 303, "{store}: {}", out.text());
        assert_eq!(out.header("location"), Some("/ui/login"));
        assert!(out.header("set-cookie").is_some_and(|c| c.contains("Max-Age=0")), "{store}: the browser forgets it");

        // The same cookie, sent again by whoever kept it: the login form, nothing of the sessions.
        for path in ["/ui/sessions", &format!("/ui/sessions/{key}")] {
            let after = page(&proxy, path, &[("cookie", &cookie)]).await;
            assert_eq!(after.status, 401, "{store}: {path} after logout: {}", after.text());
            assert!(after.text().contains("name=\"token\""), "{store}: the login form");
            assert!(!after.text().contains(&csrf), "{store}: no form carries the old CSRF token");
        }
        // Its CSRF token no longer changes anything.
        let compact = post_form(&proxy, &format!("/ui/sessions/{key}/compact"), &cookie, format!("csrf={csrf}")).await;
        assert_eq!(compact.status, 403, "{store}: {}", compact.text());
        assert!(!compact_requested(&proxy, &key).await, "{store}: no compaction was asked for");
        let forget = post_form(&proxy, &format!("/ui/sessions/{key}/forget"), &cookie, format!("csrf={csrf}")).await;
        assert_eq!(forget.status, 403, "{store}");
        assert_eq!(proxy.get_with_token(&format!("/admin/sessions/{key}"), ADMIN_TOKEN).await.status, 200);

        // A new login, even in the same second, is a new cookie and works.
        let again = log_in(&proxy).await;
        assert_ne!(again, cookie, "{store}: a new login is not the ended one");
        assert_eq!(page(&proxy, "/ui/sessions", &[("cookie", &again)]).await.status, 200, "{store}");
        drop(redis);
    }
}

#[tokio::test]
async fn a_logout_on_one_replica_is_honored_by_every_other() {
    let Some(redis) = RedisServer::start() else { return };
    let (fake, _) = window_upstream(WindowSpec::window(400_000)).await;
    let settings = format!("{}{}", config(10), redis.config());
    let (a, b) = (start(&fake, &settings, false), start(&fake, &settings, false));
    let key = two_turns(&a, "two-replicas").await;
    let cookie = log_in(&a).await;
    let on_b = page(&b, &format!("/ui/sessions/{key}"), &[("cookie", &cookie)]).await;
    assert_eq!(on_b.status, 200, "a login made on A is good on B");
    let csrf = csrf_of(&on_b.text());

    assert_eq!(log_out(&a, &cookie, &csrf).await.status, 303);
    let after = page(&b, "/ui/sessions", &[("cookie", &cookie)]).await;
    assert_eq!(after.status, 401, "B honors A's logout: {}", after.text());
    let compact = post_form(&b, &format!("/ui/sessions/{key}/compact"), &cookie, format!("csrf={csrf}")).await;
    assert_eq!(compact.status, 403, "B refuses the ended login's CSRF token");
    assert!(!compact_requested(&b, &key).await);
    let ttl = {
        let mut connection = redis.connection();
        let logouts: Vec<String> = redis.keys().into_iter().filter(|k| k.contains(":ui-logout:")).collect();
        assert_eq!(logouts.len(), 1, "one revocation, under the store's prefix: {logouts:?}");
        assert!(!logouts[0].contains(cookie.split_once('=').unwrap().1), "the cookie itself is not stored");
        redis::cmd("TTL").arg(&logouts[0]).query::<i64>(&mut connection).unwrap()
    };
    assert!(ttl > 0 && ttl <= 12 * 3600, "the revocation lasts as long as the cookie would have: {ttl}");
}

#[tokio::test]
async fn with_the_store_unreachable_a_login_cookie_is_refused_and_the_admin_token_still_serves() {
    let Some(mut redis) = RedisServer::restartable() else { return };
    let (fake, _) = window_upstream(WindowSpec::window(400_000)).await;
    let proxy = start(&fake, &format!("{}{}", config(10), redis.config()), false);
    let cookie = log_in(&proxy).await;
    assert_eq!(page(&proxy, "/ui", &[("cookie", &cookie)]).await.status, 303, "logged in");
    let csrf = csrf_of(&page(&proxy, "/ui/sessions", &[("cookie", &cookie)]).await.text());
    redis.stop();

    // Whether the login was ended cannot be known: the cookie is not taken (fail closed).
    let refused = page(&proxy, "/ui", &[("cookie", &cookie)]).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(refused.text().contains("login"), "the page says why: {}", refused.text());
    // A logout that cannot be recorded says so and keeps the cookie, to try again.
    let out = log_out(&proxy, &cookie, &csrf).await;
    assert_eq!(out.status, 503, "{}", out.text());
    assert!(out.header("set-cookie").is_none(), "the cookie stays for another try");
    // The admin token needs no store.
    let (name, value) = bearer();
    assert_eq!(page(&proxy, "/ui", &[(name, &value)]).await.status, 303);

    redis.restart();
    assert!(
        eventually(async || page(&proxy, "/ui", &[("cookie", &cookie)]).await.status == 303).await,
        "the login serves again once the store answers"
    );
}

#[tokio::test]
async fn what_a_client_sent_is_escaped_on_every_page() {
    let (fake, _) = window_upstream(WindowSpec::window(400_000)).await;
    let proxy = start(&fake, &config(10), true);
    let markup = "<script>alert('x')</script>";
    let mut body = conversation(Api::Chat, 8, false);
    body["model"] = json!(format!("test-model\"><img src=x onerror=alert(1)>{markup}"));
    // Tool call ids a client chose, pruned and named on the request's page.
    let text = body.to_string().replace("\"call_", "\"call_<b>x</b>");
    let body: Value = serde_json::from_str(&text).unwrap();
    let answer = chat(&proxy, &format!("id {markup}"), &body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let key = answer.header("x-compactor-session").unwrap().to_string();
    let lookup =
        as_admin(&proxy, &format!("/ui/sessions?id=id%20{}", "%3Cscript%3Ealert('x')%3C%2Fscript%3E")).await.text();
    let session = as_admin(&proxy, &format!("/ui/sessions/{key}")).await.text();
    let conversation = first_conversation(&session);
    let html = as_admin(&proxy, &conversation).await.text();
    let at = html.find("/r/").unwrap();
    let link = html[html[..at].rfind('"').unwrap() + 1..at + html[at..].find('"').unwrap()].to_string();
    let request = as_admin(&proxy, &link).await.text();
    assert!(request.contains("call_&lt;b&gt;x&lt;/b&gt;"), "the pruned ids are shown, escaped: {request}");
    for shown in [&lookup, &html, &request] {
        assert!(
            !shown.contains("<script>alert") && !shown.contains("<img src=x") && !shown.contains("<b>x</b>"),
            "{shown}"
        );
    }
    assert!(html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"), "{html}");
    assert!(lookup.contains("value=\"id &lt;script&gt;"), "the search box echoes it escaped: {lookup}");
}

/// A secret-looking text planted in the oldest tool output, which the prune replaces.
const PLANTED: &str = "AKIA-PLANTED-SECRET-7Q4e";

/// Deletes every session key under the test's Redis prefix.
fn flush(redis: &RedisServer) {
    let mut connection = redis.connection();
    for key in redis.keys() {
        let _: () = redis::cmd("DEL").arg(&key).query(&mut connection).unwrap();
    }
}

/// Every value under the test's Redis prefix, as text (strings, lists, hashes, sorted sets).
fn redis_values(redis: &RedisServer) -> String {
    let mut connection = redis.connection();
    let mut all = String::new();
    for key in redis.keys() {
        let kind: String = redis::cmd("TYPE").arg(&key).query(&mut connection).unwrap();
        let values: Vec<Vec<u8>> = match kind.as_str() {
            "string" => vec![redis::cmd("GET").arg(&key).query(&mut connection).unwrap()],
            "list" => redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).query(&mut connection).unwrap(),
            "hash" => redis::cmd("HGETALL").arg(&key).query(&mut connection).unwrap(),
            "zset" => redis::cmd("ZRANGE").arg(&key).arg(0).arg(-1).query(&mut connection).unwrap(),
            "set" => redis::cmd("SMEMBERS").arg(&key).query(&mut connection).unwrap(),
            other => panic!("{key}: {other}"),
        };
        for value in values {
            all.push_str(&String::from_utf8_lossy(&value));
            all.push('\n');
        }
    }
    all
}

/// One request whose oldest tool output (carrying [`PLANTED`]) is pruned, through a compactor with
/// `inspector` settings added; the request's page once its summary is committed.
async fn pruned_request_page(fake: &FakeUpstream, store: &str, inspector: &str) -> (ProxyProcess, String) {
    let proxy = start(
        fake,
        &format!("{}{store}", config(10).replace("[inspector]\n", &format!("[inspector]\n{inspector}"))),
        true,
    );
    let text = conversation(Api::Chat, 8, false).to_string().replace("QUASAR-MAPLE-7", PLANTED);
    let answer = chat(&proxy, "content", &serde_json::from_str(&text).unwrap()).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(answer.header("x-compactor-pruned").unwrap().parse::<u32>().unwrap() > 0, "the output was pruned");
    let key = answer.header("x-compactor-session").unwrap().to_string();
    // The request's state (its summary with it) is committed once its response is done.
    let session = async || as_admin(&proxy, &format!("/ui/sessions/{key}")).await.text();
    let committed = async || session().await.contains("class=\"conversation\"");
    assert!(eventually(committed).await, "the request is committed");
    let conversation = first_conversation(&session().await);
    let recorded = async || rows(&as_admin(&proxy, &conversation).await.text()) == 1;
    assert!(eventually(recorded).await, "the request's summary is committed");
    let html = as_admin(&proxy, &conversation).await.text();
    let at = html.find("/r/").unwrap();
    let link = html[html[..at].rfind('"').unwrap() + 1..at + html[at..].find('"').unwrap()].to_string();
    let request = as_admin(&proxy, &link).await;
    assert_eq!(request.status, 200);
    (proxy, request.text())
}

#[tokio::test]
async fn message_content_is_kept_only_when_turned_on_and_within_its_bound() {
    for (store, redis) in stores() {
        let extra = redis.as_ref().map(|r| r.config()).unwrap_or_default();
        let (fake, _) = window_upstream(WindowSpec::window(400_000)).await;

        // Off by default: the pruned output's text is nowhere, neither in the store nor on the page.
        let (proxy, page) = pruned_request_page(&fake, &extra, "").await;
        assert!(page.contains("call_0"), "{store}: the pruned call is named: {page}");
        assert!(!page.contains(PLANTED) && !page.contains("Content changed"), "{store}: {page}");
        if let Some(redis) = &redis {
            let values = redis_values(redis);
            assert!(values.contains("\"pruned_ids\""), "{store}: the summary is there");
            assert!(!values.contains(PLANTED), "{store}: no content in Redis: {values}");
            flush(redis);
        }
        drop(proxy);

        // On: the request's page shows the pruned output as sent and its placeholder, escaped.
        let (proxy, page) = pruned_request_page(&fake, &extra, "keep_content = true\n").await;
        assert!(page.contains("Content changed"), "{store}: {page}");
        assert!(page.contains(&format!("{PLANTED} ")), "{store}: the pruned output's text: {page}");
        assert!(!page.contains("sk-client-credential-9z") && !page.contains(ADMIN_TOKEN), "never a credential");
        if let Some(redis) = &redis {
            let values = redis_values(redis);
            assert!(values.contains(PLANTED), "{store}: kept by the request's own commit");
            assert!(!values.contains("sk-client-credential-9z"), "{store}: never a credential");
            flush(redis);
        }
        drop(proxy);

        // The byte bound holds: the newest changes fit in it, the rest are only counted.
        let bound = 300;
        let (proxy, page) =
            pruned_request_page(&fake, &extra, &format!("keep_content = true\ncontent_bytes = {bound}\n")).await;
        assert!(page.contains("more changed items past the bound"), "{store}: {page}");
        if let Some(redis) = &redis {
            let mut connection = redis.connection();
            let key = redis.keys().into_iter().find(|k| k.ends_with(":requests")).unwrap();
            let kept: Vec<String> = redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).query(&mut connection).unwrap();
            let record: Value = serde_json::from_str(&kept[0]).unwrap();
            let content = record["content"].as_array().unwrap();
            let bytes: usize =
                content.iter().map(|c| c["was"].as_str().unwrap().len() + c["now"].as_str().map_or(0, str::len)).sum();
            assert!(!content.is_empty() && bytes <= bound, "{store}: {bytes} bytes: {record}");
            assert!(record["content_omitted"].as_u64().unwrap() > 0, "{store}: {record}");
            assert!(content.iter().any(|c| c["was_bytes"].as_u64().unwrap() > c["was"].as_str().unwrap().len() as u64));
        }
        drop(proxy);
    }
}

#[tokio::test]
async fn a_conversation_of_a_thousand_requests_is_shown_whole_and_fast() {
    const REQUESTS: usize = 1_000;
    let (fake, _) = window_upstream(WindowSpec::window(400_000)).await;
    let proxy = start(&fake, &config(REQUESTS as u32), false);
    let body = conversation(Api::Chat, 2, false);
    let started = std::time::Instant::now();
    let mut key = String::new();
    // Eight agents' worth of requests in flight at once, all in the one conversation.
    for batch in 0..REQUESTS / 8 {
        let answers = futures_util::future::join_all((0..8).map(|_| chat(&proxy, "long-session", &body))).await;
        for answer in answers {
            assert_eq!(answer.status, 200, "batch {batch}: {}", answer.text());
            key = answer.header("x-compactor-session").unwrap().to_string();
        }
    }
    let driven = started.elapsed();
    let session = as_admin(&proxy, &format!("/ui/sessions/{key}")).await.text();
    let conversation = first_conversation(&session);
    let complete = async || rows(&as_admin(&proxy, &conversation).await.text()) == REQUESTS;
    assert!(eventually(complete).await, "every request is recorded");

    let timed = async |path: &str| {
        let started = std::time::Instant::now();
        let answer = as_admin(&proxy, path).await;
        (started.elapsed(), answer)
    };
    let (conversation_time, page) = timed(&conversation).await;
    assert_eq!(page.status, 200);
    let html = page.text();
    assert_eq!(rows(&html), REQUESTS, "the whole timeline");
    let points = html.split("id=\"plot-tokens\"").nth(1).unwrap().split("points=\"").nth(1).unwrap();
    assert!(!points.split('"').next().unwrap().is_empty(), "the plots are drawn");
    let (sessions_time, sessions) = timed("/ui/sessions").await;
    assert_eq!(sessions.status, 200);
    assert!(sessions.text().contains(&key));
    let (session_time, _) = timed(&format!("/ui/sessions/{key}")).await;
    eprintln!(
        "{REQUESTS} requests driven in {driven:?}; conversation page {conversation_time:?} ({} bytes), sessions page {sessions_time:?}, session page {session_time:?}",
        html.len()
    );
    // Ten times and more what a debug build takes here: a bound against a regression, not a benchmark.
    assert!(conversation_time < std::time::Duration::from_secs(5), "{conversation_time:?}");
    assert!(sessions_time < std::time::Duration::from_secs(2), "{sessions_time:?}");
}

/// A figure's value on a conversation page (`1,234` read as 1234).
fn figure(html: &str, name: &str) -> u64 {
    let after = html.split(&format!("<dt>{name}</dt><dd>")).nth(1).unwrap_or_else(|| panic!("no figure {name}"));
    after.split('<').next().unwrap().replace(',', "").parse().unwrap()
}

/// A compaction's block on a conversation page.
fn generation(html: &str, generation: u32) -> &str {
    let start = html.find(&format!("id=\"generation-{generation}\"")).expect("the generation is shown");
    let block = &html[start..];
    &block[..block.find("</article>").unwrap()]
}

#[tokio::test(flavor = "multi_thread")]
async fn background_summaries_show_who_started_and_applied_them_and_their_calls_count_in_the_cost() {
    use crate::background::{CONFIG, fake_with_slow_summaries, turn, until_a_background_summary_is_ready};
    let (fake, log) = fake_with_slow_summaries().await;
    let proxy = ProxyProcess::start(&fake, &format!("{CONFIG}[admin]\ntoken = \"{ADMIN_TOKEN}\"\n"));
    // Generation 1 is prepared in the background, then an operator's compaction (generation 2)
    // replaces it before any request needed it.
    let (turns, first) = until_a_background_summary_is_ready(&proxy, &log, 1).await;
    let key = first.header("x-compactor-session").unwrap().to_string();
    let id = first.header("x-compactor-conversation").unwrap().to_string();
    let marked = proxy.call_with_token("POST", &format!("/admin/sessions/{key}/compact"), ADMIN_TOKEN).await;
    assert_eq!(marked.status, 202);
    let (_, answer) = turn(&proxy, turns).await;
    assert_eq!(answer.header("x-compactor-compacted"), Some("2"), "{:?}", log.events());
    // Generation 3 is prepared in the background and applied by the request that needs it.
    let (started, third) = until_a_background_summary_is_ready(&proxy, &log, turns + 1).await;
    let mut applied = None;
    for next in started + 1..started + 6 {
        let (_, answer) = turn(&proxy, next).await;
        if answer.header("x-compactor-compacted") == Some("3") {
            applied = Some(answer);
            break;
        }
    }
    let applied = applied.expect("a request applied generation 3");
    assert_eq!(log.summary_calls().len(), 3, "{:?}", log.events());
    let request_id = |answer: &Answer| answer.header("x-compactor-request-id").unwrap().to_string();
    let applied_id = request_id(&applied);
    let page_path = format!("/ui/sessions/{key}/c/{id}");
    let committed = async || as_admin(&proxy, &page_path).await.text().contains(&format!("data-id=\"{applied_id}\""));
    assert!(eventually(committed).await, "the request that applied it is recorded");
    let html = as_admin(&proxy, &page_path).await.text();

    let replaced = generation(&html, 1);
    assert!(replaced.contains("· background ·"), "{replaced}");
    assert!(replaced.contains("started by request <a"), "{replaced}");
    assert!(replaced.contains(&request_id(&first)), "the request that started it: {replaced}");
    assert!(replaced.contains("never needed: replaced by generation 2 (admin)"), "{replaced}");
    assert!(!replaced.contains("applied by request"), "{replaced}");
    let used = generation(&html, 3);
    assert!(used.contains(&request_id(&third)), "the request that started it: {used}");
    assert!(used.contains("applied by request") && used.contains(&applied_id), "{used}");
    assert!(!generation(&html, 2).contains("Prepared in the background"), "the operator's is not");
    for g in 1..=3 {
        // The fake's usage: 20 tokens of answer per summary call.
        assert!(generation(&html, g).contains("Summary calls cost"), "generation {g}");
        assert!(generation(&html, g).contains("; 20 output tokens."), "generation {g}: {}", generation(&html, g));
        // Each took the fake's 3 s for its 20 tokens: 150 ms a token, and a little more.
        let pace = generation(&html, g)
            .split("They took ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next()?.parse::<f64>().ok());
        assert!(pace.is_some_and(|ms| (150.0..200.0).contains(&ms)), "generation {g}: {pace:?}");
    }
    // The cost with compactor is the requests' costs (each row's first figure) and the three
    // summary calls' (no cache read reported: each its whole prompt).
    let summaries = figure(&html, "of it, summary calls");
    assert!(summaries > 3 * 1_000, "{summaries}");
    assert_eq!(figure(&html, "summary output tokens"), 60);
    let timeline = html.split("id=\"timeline\"").nth(1).unwrap();
    let requests: u64 = timeline
        .split("<tr class=\"request")
        .skip(1)
        .map(|row| {
            let cost = row.rsplit("<td class=\"n\">").next().unwrap();
            cost.split(' ').next().unwrap().replace(',', "").parse::<u64>().unwrap_or(0)
        })
        .sum();
    let with = figure(&html, "cost with compactor");
    let rows = rows(&html) as u64;
    assert!(with.abs_diff(requests + summaries) <= rows, "{with} = {requests} + {summaries}");
}

/// The "window · compaction threshold" row of a request's page, as shown.
fn window_row(html: &str) -> String {
    let at = html.find("window · compaction threshold").expect("the window row");
    let cell = html[at..].split("<td>").nth(1).unwrap();
    cell.split("</td>").next().unwrap().to_string()
}

#[tokio::test]
async fn the_window_is_shown_in_the_same_tokens_as_the_sizes_beside_it_when_the_tokenizer_counts_twice_as_many() {
    // A provider that counts about twice compactor's estimate: the session calibrates to ~2, and
    // the sizes the inspector shows (sent, forwarded) are in the provider's tokens.
    let fake = FakeUpstream::builder()
        .respond_with(|received| {
            let prompt = received.body.len() / 2;
            Some(Reply::json(
                200,
                json!({"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}}),
            ))
        })
        .start()
        .await;
    let toml = format!(
        "[models.window-model]\ncontext_window = 100000\nmax_output_tokens = 1000\n[admin]\ntoken = \"{ADMIN_TOKEN}\"\n[inspector]\nrequests_per_conversation = 10\n"
    );
    let proxy = start(&fake, &toml, false);
    let mut body = conversation(Api::Chat, 2, false);
    body["model"] = json!("window-model");
    for _ in 0..4 {
        assert_eq!(chat(&proxy, "units-agent", &body).await.status, 200);
    }
    let key = two_turns_key(&proxy, &body).await;
    let committed = async || {
        let view = proxy.get_with_token(&format!("/admin/sessions/{key}"), ADMIN_TOKEN).await;
        view.status == 200 && view.json()["state"]["counters"]["requests"] == 5
    };
    assert!(eventually(committed).await);
    let session = as_admin(&proxy, &format!("/ui/sessions/{key}")).await.text();
    let html = as_admin(&proxy, &first_conversation(&session)).await.text();
    // The newest request (rows are newest first): its session measured the calibration.
    let at = html.find("/r/").unwrap();
    let link = &html[html[..at].rfind('"').unwrap() + 1..at + html[at..].find('"').unwrap()];
    let request = as_admin(&proxy, link).await.text();
    // The model's window is 100,000 of the provider's tokens, and the threshold most of it: the
    // same tokens as the sizes plotted beside them (not the window over the calibration).
    let row = window_row(&request);
    let (window, threshold) = row.split_once(" · ").unwrap();
    assert_eq!(window, "100,000", "{request}");
    let threshold: u64 = threshold.replace(',', "").parse().unwrap();
    assert!((70_000..100_000).contains(&threshold), "{row}");
}

async fn two_turns_key(proxy: &ProxyProcess, body: &Value) -> String {
    let answer = chat(proxy, "units-agent", body).await;
    answer.header("x-compactor-session").unwrap().to_string()
}

/// A figure of a request page's row `name`: its first number, or its `nth` after a `·`.
fn row_figure(html: &str, name: &str, nth: usize) -> u64 {
    let cell = html.split(&format!("<th>{name}</th><td>")).nth(1).unwrap_or_else(|| panic!("no row {name}: {html}"));
    let cell = cell.split("</td>").next().unwrap();
    let part = cell.split(['·', '→']).nth(nth).unwrap();
    part.split('(').next().unwrap().chars().filter(char::is_ascii_digit).collect::<String>().parse().unwrap()
}

/// The window and the compaction threshold a request's record shows are in the units of the sizes
/// beside them: the provider's tokens, as calibrated. Against a provider that counts 1.6 tokens
/// where compactor estimates one, compactor calibrates from the usage it reads; the window shown
/// is then the model's window (no overflow taught another), not that window divided by 1.6, and
/// the sizes sent are about what the provider counted.
#[tokio::test]
async fn the_window_is_shown_in_the_units_of_the_sizes_beside_it_when_the_calibration_is_not_one() {
    use crate::common::agents::{self, Agent, AgentSession, SessionSpec, drive};
    use crate::common::provider::{ProviderSim, ProviderSpec};
    let provider = ProviderSim::start(ProviderSpec::with_density(1.6)).await;
    let window = provider.spec().window;
    let models = format!("[models.sim-model]\ncontext_window = {window}\nmax_output_tokens = 8000\n");
    let proxy = ProxyProcess::start_with(&provider.compactor_config(&models), &[]);
    let mut session = AgentSession::new(SessionSpec::new(Agent::OpenCode, "sim-model").outputs(&[1_500]));
    let run = drive(&proxy.url(""), &provider, &mut session, 6).await;
    let last = run.turns.last().expect("a turn");
    let key = last.compactor.iter().find(|(name, _)| name == "x-compactor-session").expect("a session").1.clone();
    let token = format!("Bearer {}", agents::ADMIN_TOKEN);
    let admin = async |path: &str| page(&proxy, path, &[("authorization", &token)]).await.text();
    let conversation = first_conversation(&admin(&format!("/ui/sessions/{key}")).await);
    let html = admin(&conversation).await;
    // The newest request's page: the rows come newest first.
    let at = html.find("/r/").unwrap();
    let link = &html[html[..at].rfind('"').unwrap() + 1..at + html[at..].find('"').unwrap()];
    let request = admin(link).await;
    let (shown_window, threshold) = (
        row_figure(&request, "window · compaction threshold", 0),
        row_figure(&request, "window · compaction threshold", 1),
    );
    let sent = row_figure(&request, "tokens sent → forwarded", 0) as f64;
    let counted = run.answered(last.index).expect("answered").tokens as f64;
    assert!((0.85..=1.2).contains(&(counted / sent)), "calibrated: sent {sent}, the provider counted {counted}");
    assert_eq!(shown_window, window as u64, "the window in the provider's tokens, as `sent` is: {request}");
    assert!(threshold < shown_window && threshold > shown_window / 2, "threshold {threshold} of {shown_window}");
}
