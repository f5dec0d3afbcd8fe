//! HTML for the inspector's pages: escaping (everything that came from a client or a provider
//! goes through [`esc`]), the page frame, and the responses with the headers every page carries.

use std::fmt::Write;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

use crate::proxy::ResponseBody;

/// The stylesheet and the live-update script, inside the binary.
pub const STYLE: &str = include_str!("assets/style.css");
pub const LIVE: &str = include_str!("assets/live.js");

/// Escapes text for HTML element content and quoted attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes a query value.
pub fn url(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// A number with thousands separated (`181,000`).
pub fn num(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A Unix time in ms as UTC `2026-11-26 21:58:19`.
pub fn time(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}", rest / 3600, rest % 3600 / 60, rest % 60)
}

/// A whole page: the frame around `body`. `csrf`: the logged-in caller's token for the log-out
/// form (empty: no form, as for a bearer caller or the login page).
pub fn page(title: &str, csrf: Option<&str>, body: &str) -> String {
    let mut out = String::with_capacity(body.len() + 1024);
    out.push_str("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">");
    let _ = write!(out, "<title>{} · compactor inspector</title>", esc(title));
    out.push_str("<link rel=\"stylesheet\" href=\"/ui/assets/style.css\">");
    out.push_str("<script src=\"/ui/assets/live.js\" defer></script></head><body>");
    out.push_str("<header><a class=\"brand\" href=\"/ui/sessions\">compactor inspector</a>");
    if let Some(csrf) = csrf.filter(|csrf| !csrf.is_empty()) {
        let _ = write!(
            out,
            "<form method=\"post\" action=\"/ui/logout\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><button>Log out</button></form>",
            esc(csrf)
        );
    }
    out.push_str("</header><main>");
    out.push_str(body);
    out.push_str("</main></body></html>");
    out
}

/// An HTML response with the headers every page carries: no caching, no framing, no referrer
/// (keys are in the addresses), and a policy that runs only compactor's own script and style.
pub fn respond(status: StatusCode, html: String) -> Response<ResponseBody> {
    let mut response = Response::new(ResponseBody::full(html));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    secure_headers(headers);
    response
}

fn secure_headers(headers: &mut http::HeaderMap) {
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
}

/// A `303 See Other` to `location` (after a form), with an optional `Set-Cookie`.
pub fn redirect(location: &str, cookie: Option<String>) -> Response<ResponseBody> {
    let mut response = Response::new(ResponseBody::full(Bytes::new()));
    *response.status_mut() = StatusCode::SEE_OTHER;
    let headers = response.headers_mut();
    if let Ok(location) = HeaderValue::from_str(location) {
        headers.insert(header::LOCATION, location);
    }
    if let Some(cookie) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        headers.insert(header::SET_COOKIE, cookie);
    }
    secure_headers(headers);
    response
}

/// A static asset, cached for an hour.
pub fn asset(content_type: &'static str, text: &'static str) -> Response<ResponseBody> {
    let mut response = Response::new(ResponseBody::full(text));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("max-age=3600"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

/// A plain message page (not found, forbidden, store down).
pub fn message(status: StatusCode, csrf: Option<&str>, title: &str, text: &str) -> Response<ResponseBody> {
    let body = format!("<h1>{}</h1><p>{}</p><p><a href=\"/ui/sessions\">Sessions</a></p>", esc(title), esc(text));
    respond(status, page(title, csrf, &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_and_quotes_are_escaped() {
        assert_eq!(
            esc(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
        assert_eq!(url("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
    }

    #[test]
    fn numbers_and_times_read_as_people_write_them() {
        assert_eq!(
            (num(0), num(999), num(1_000), num(181_000_000)),
            ("0".into(), "999".into(), "1,000".into(), "181,000,000".into())
        );
        assert_eq!(time(0), "1970-01-01 00:00:00");
        assert_eq!(time(1_764_194_299_000), "2025-11-26 21:58:19");
    }
}
