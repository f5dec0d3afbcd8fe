//! The session inspector: server-rendered pages under `/ui/`, on the proxy's own listener, that
//! show what compactor did to each conversation (what it changed, why, what it kept, what it cost
//! or saved), from the bounded log of request summaries each request's commit appends
//! ([`record`]). Off unless `admin.token` is set; every page wants that token (as a bearer, or
//! through the login form's cookie, good until its logout), and every change is a POST with a CSRF
//! token.

pub mod auth;
pub mod cost;
pub mod html;
pub mod pages;
pub mod plot;

use std::fmt::Write;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;

pub use crate::proxy::record::{RequestRecord, Rewrite};

use self::auth::{Access, Keys, Scope};
use self::html::{esc, page, respond};
use crate::config::Config;
use crate::proxy::ResponseBody;
use crate::route::query_value;
use crate::session::Store;

/// The largest form body read (a token, a CSRF token, an address).
const FORM_BYTES: usize = 8 * 1024;

/// Why a form's body was not read.
#[derive(Debug, thiserror::Error)]
enum FormError {
    #[error("The form could not be read.")]
    Unreadable,
    #[error("The form did not arrive within {} ms.", .0.as_millis())]
    TimedOut(Duration),
}

impl FormError {
    fn status(&self) -> StatusCode {
        match self {
            Self::Unreadable => StatusCode::BAD_REQUEST,
            Self::TimedOut(_) => StatusCode::REQUEST_TIMEOUT,
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Self::Unreadable => "Bad request",
            Self::TimedOut(_) => "Request timeout",
        }
    }
}

/// Whether `path` is the inspector's.
pub fn owns(path: &str) -> bool {
    path == "/ui" || path.starts_with("/ui/")
}

/// Answers a request under `/ui/`.
pub async fn answer<B>(config: &Config, store: &Store, request: Request<B>) -> Response<ResponseBody>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let path = request.uri().path().to_string();
    match path.as_str() {
        "/ui/assets/style.css" => return html::asset("text/css; charset=utf-8", html::STYLE),
        "/ui/assets/live.js" => return html::asset("text/javascript; charset=utf-8", html::LIVE),
        _ => {}
    }
    let scope = if store.is_in_process() { Scope::Process } else { Scope::Shared };
    let keys = Keys::new(&config.admin.token, scope);
    let now = crate::session::unix_ms() / 1000;
    let mut access = keys.access(request.headers(), now);
    let method = request.method().clone();
    if access == Access::Off {
        return html::message(
            StatusCode::NOT_FOUND,
            None,
            "Not found",
            "The inspector is off: no admin token is configured.",
        );
    }
    if path == "/ui/login" {
        return match method {
            Method::POST => login(&keys, request, now, config.limits.client_body_timeout).await,
            _ => {
                let next = request.uri().query().and_then(|q| query_value(q, "next")).unwrap_or_default();
                login_page(StatusCode::OK, &next, "")
            }
        };
    }
    if let Some(unavailable) = deny_ended_login(store, &mut access, now).await {
        return unavailable;
    }
    if access == Access::Denied {
        if method != Method::GET && method != Method::HEAD {
            return html::message(StatusCode::FORBIDDEN, None, "Forbidden", "Log in first.");
        }
        let here = request.uri().path_and_query().map_or(path.clone(), |p| p.to_string());
        return login_page(StatusCode::UNAUTHORIZED, &here, "");
    }
    let csrf = access.csrf().to_string();
    if method == Method::POST {
        let form = match read_form(request, config.limits.client_body_timeout).await {
            Ok(form) => form,
            Err(error) => return html::message(error.status(), Some(&csrf), error.title(), &error.to_string()),
        };
        let presented = query_value(&form, "csrf").unwrap_or_default();
        if !access.allows_change(&presented) {
            return html::message(
                StatusCode::FORBIDDEN,
                Some(&csrf),
                "Forbidden",
                "The form's CSRF token is missing or wrong; reload the page and try again.",
            );
        }
        return change(store, &path, &access, now).await;
    }
    if method != Method::GET && method != Method::HEAD {
        return html::message(
            StatusCode::METHOD_NOT_ALLOWED,
            Some(&csrf),
            "Method not allowed",
            "GET, or POST for a change.",
        );
    }
    let query = request.uri().query().unwrap_or("").to_string();
    show(config, store, &path, &query, &csrf).await
}

/// Denies `access` by a login cookie that was logged out; the answer to give instead when the
/// store cannot say whether it was.
async fn deny_ended_login(store: &Store, access: &mut Access, now: u64) -> Option<Response<ResponseBody>> {
    let login = access.login()?;
    match store.login_ended(&login.id, login.expires, now).await {
        Ok(false) => None,
        Ok(true) => {
            *access = Access::Denied;
            None
        }
        // Fail closed: the pages are an admin tool, and a cookie whose logout cannot be
        // checked may be one that was stolen and logged out. The bearer token still serves.
        Err(error) => Some(html::message(
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            "Session store unavailable",
            &format!(
                "Whether this login was ended cannot be checked ({error}), so it is not taken. Try again, or use the admin token as a bearer."
            ),
        )),
    }
}

/// The page a GET asks for at `path` (with `query`), for a reader whose form token is `csrf`.
async fn show(config: &Config, store: &Store, path: &str, query: &str, csrf: &str) -> Response<ResponseBody> {
    let value = |name: &str| query_value(query, name).unwrap_or_default();
    if path == "/ui" || path == "/ui/" {
        return html::redirect("/ui/sessions", None);
    }
    if path == "/ui/sessions" {
        let filter = pages::Filter {
            id: value("id"),
            tenant: value("tenant"),
            compacted: !value("compacted").is_empty(),
            overflow: !value("overflow").is_empty(),
            pruned: !value("pruned").is_empty(),
        };
        return pages::sessions(store, &filter, csrf).await;
    }
    let Some(rest) = path.strip_prefix("/ui/sessions/") else { return not_found(csrf) };
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        [key] if valid_key(key) => pages::session(store, key, csrf).await,
        [key, "c", id] if valid_key(key) && valid_id(id) => pages::conversation(config, store, key, id, csrf).await,
        [key, "c", id, "rows"] if valid_key(key) && valid_id(id) => {
            match pages::new_rows(config, store, key, id, &value("seen")).await {
                Ok((rows, newest)) => {
                    let mut response = respond(StatusCode::OK, rows);
                    if let Ok(newest) = http::HeaderValue::from_str(&newest) {
                        response.headers_mut().insert("x-newest", newest);
                    }
                    response
                }
                Err(error) => {
                    html::message(StatusCode::SERVICE_UNAVAILABLE, Some(csrf), "Session store unavailable", &error)
                }
            }
        }
        [key, "c", id, "r", request_id] if valid_key(key) && valid_id(id) && valid_request(request_id) => {
            pages::request(config, store, key, id, request_id, csrf).await
        }
        _ => not_found(csrf),
    }
}

/// A POST that changes state (its CSRF token already checked), by `access` at Unix second `now`.
async fn change(store: &Store, path: &str, access: &Access, now: u64) -> Response<ResponseBody> {
    if path == "/ui/logout" {
        // The login ends in the store, for every replica; the browser forgetting it is not enough.
        if let Some(login) = access.login()
            && let Err(error) = store.end_login(&login.id, login.expires, now).await
        {
            // The cookie stays, so the logout can be tried again.
            return html::message(
                StatusCode::SERVICE_UNAVAILABLE,
                Some(access.csrf()),
                "Session store unavailable",
                &format!("The login could not be ended ({error}): it stays good until it expires. Try again."),
            );
        }
        return html::redirect("/ui/login", Some(auth::clear_cookie()));
    }
    let Some(rest) = path.strip_prefix("/ui/sessions/") else { return not_found("") };
    match rest.split_once('/') {
        Some((key, "forget")) if valid_key(key) => match store.forget(key).await {
            Ok(_) => html::redirect("/ui/sessions", None),
            Err(error) => {
                html::message(StatusCode::SERVICE_UNAVAILABLE, None, "Session store unavailable", &error.to_string())
            }
        },
        Some((key, "compact")) if valid_key(key) => match store.request_compaction(key).await {
            Ok(true) => html::redirect(&format!("/ui/sessions/{key}"), None),
            Ok(false) => not_found(""),
            Err(error) => {
                html::message(StatusCode::SERVICE_UNAVAILABLE, None, "Session store unavailable", &error.to_string())
            }
        },
        _ => not_found(""),
    }
}

/// The login form's POST: the admin token in exchange for a cookie, then back where the caller
/// was going (an address under `/ui/` only, never another site).
async fn login<B>(keys: &Keys, request: Request<B>, now: u64, body_timeout: Duration) -> Response<ResponseBody>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let secure = request.headers().get("x-forwarded-proto").is_some_and(|v| v.as_bytes() == b"https");
    let form = match read_form(request, body_timeout).await {
        Ok(form) => form,
        Err(error) => return login_page(error.status(), "", &error.to_string()),
    };
    let next = query_value(&form, "next").unwrap_or_default();
    let token = query_value(&form, "token").unwrap_or_default();
    if !keys.is_token(&token) {
        return login_page(StatusCode::UNAUTHORIZED, &next, "That is not the admin token.");
    }
    let next = if safe_next(&next) { next } else { "/ui/sessions".to_string() };
    html::redirect(&next, Some(auth::set_cookie(&keys.login(now), secure)))
}

/// Only an address of the inspector's own: no scheme, no other host, no `//`.
fn safe_next(next: &str) -> bool {
    (next == "/ui" || next.starts_with("/ui/"))
        && !next.contains("//")
        && !next.contains('\\')
        && next.is_ascii()
        && !next.chars().any(|c| c.is_ascii_control())
}

fn login_page(status: StatusCode, next: &str, error: &str) -> Response<ResponseBody> {
    let mut body = String::from("<h1>Log in</h1>");
    if !error.is_empty() {
        let _ = write!(body, "<p class=\"error\">{}</p>", esc(error));
    }
    let _ = write!(
        body,
        "<form class=\"login\" method=\"post\" action=\"/ui/login\"><input type=\"hidden\" name=\"next\" value=\"{}\"><label>Admin token <input type=\"password\" name=\"token\" id=\"token\" autocomplete=\"current-password\" required autofocus></label> <button id=\"login\">Log in</button></form><p class=\"note\">The inspector wants compactor's <code>admin.token</code>. It sets a cookie for this site only (HttpOnly, SameSite=Strict) that lasts {} hours.</p>",
        esc(next),
        auth::LOGIN_SECS / 3600
    );
    respond(status, page("Log in", None, &body))
}

fn not_found(csrf: &str) -> Response<ResponseBody> {
    html::message(StatusCode::NOT_FOUND, Some(csrf), "Not found", "No such page.")
}

/// An `application/x-www-form-urlencoded` body, bounded in size and in time: the whole form
/// within `limits.client_body_timeout_ms` (the longest pause a chat body may take), since a form
/// of a few hundred bytes has no reason to come in pieces, and one sent a byte at a time would
/// hold its connection for hours under a timeout between pieces.
async fn read_form<B>(request: Request<B>, timeout: Duration) -> Result<String, FormError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let limited = http_body_util::Limited::new(request.into_body(), FORM_BYTES);
    let collected = tokio::time::timeout(timeout, limited.collect()).await.map_err(|_| FormError::TimedOut(timeout))?;
    let bytes = collected.map_err(|_| FormError::Unreadable)?.to_bytes();
    String::from_utf8(bytes.to_vec()).map_err(|_| FormError::Unreadable)
}

/// A session key: `<tenant hash>.<session hash>` (letters, digits and dots).
fn valid_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= 128 && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.')
}

/// A conversation id: hex.
fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A request id as compactor makes them.
fn valid_request(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_inspectors_own_addresses_are_followed_after_login() {
        for good in ["/ui/sessions", "/ui/sessions?id=a%20b", "/ui"] {
            assert!(safe_next(good), "{good}");
        }
        for bad in ["https://evil.example/ui/", "//evil.example", "/ui//evil", "/admin/sessions", "/ui/\\evil", ""] {
            assert!(!safe_next(bad), "{bad}");
        }
    }
}
