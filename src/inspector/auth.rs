//! Who may see the inspector: whoever holds the admin token, presented as `Authorization: Bearer`
//! or exchanged once, through the login form, for a cookie. The cookie never carries the token: it
//! is an expiry and a keyed hash of it under a key derived from the token, so it is checked
//! without any state (any replica, after a restart) and changing the token ends every login. The
//! CSRF token of a form is a keyed hash of the cookie it goes with.

use http::HeaderMap;
use http::header;

use crate::config::Secret;

/// The login cookie's name.
pub const COOKIE: &str = "compactor_inspector";

/// How long a login lasts.
pub const LOGIN_SECS: u64 = 12 * 3600;

/// How a request is allowed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// No admin token is configured: the pages are off.
    Off,
    /// Neither a valid bearer token nor a valid login cookie.
    Denied,
    /// The bearer token: nothing ambient, so no CSRF check is needed.
    Bearer,
    /// A login cookie; its forms carry this CSRF token.
    Cookie { csrf: String },
}

impl Access {
    /// The CSRF token to put in forms (none for a bearer caller, who needs none).
    pub fn csrf(&self) -> &str {
        match self {
            Access::Cookie { csrf } => csrf,
            _ => "",
        }
    }

    /// Whether a state change with `presented` as its CSRF token may go ahead.
    pub fn allows_change(&self, presented: &str) -> bool {
        match self {
            Access::Bearer => true,
            Access::Cookie { csrf } => constant_time_eq(csrf.as_bytes(), presented.as_bytes()),
            Access::Off | Access::Denied => false,
        }
    }
}

/// The keys of one admin token.
pub struct Keys {
    token: Secret,
    mac: [u8; 32],
}

impl Keys {
    pub fn new(token: &Secret) -> Self {
        let mac = blake3::derive_key("compactor inspector login v1", token.expose().as_bytes());
        Self { token: token.clone(), mac }
    }

    /// How the request is allowed in, at Unix time `now`.
    pub fn access(&self, headers: &HeaderMap, now: u64) -> Access {
        if self.token.is_empty() {
            return Access::Off;
        }
        let bearer =
            headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        if bearer.is_some_and(|presented| self.is_token(presented)) {
            return Access::Bearer;
        }
        match cookie(headers, COOKIE).filter(|value| self.valid_login(value, now)) {
            Some(value) => Access::Cookie { csrf: self.csrf(value) },
            None => Access::Denied,
        }
    }

    /// Whether `presented` is the admin token (compared in constant time).
    pub fn is_token(&self, presented: &str) -> bool {
        constant_time_eq(presented.as_bytes(), self.token.expose().as_bytes())
    }

    /// A login cookie's value, valid until `now + LOGIN_SECS`.
    pub fn login(&self, now: u64) -> String {
        let expires = now + LOGIN_SECS;
        format!("{expires}.{}", self.tag("login", &expires.to_string()))
    }

    fn valid_login(&self, value: &str, now: u64) -> bool {
        let Some((expires, tag)) = value.split_once('.') else { return false };
        let Ok(until) = expires.parse::<u64>() else { return false };
        until > now && constant_time_eq(tag.as_bytes(), self.tag("login", expires).as_bytes())
    }

    fn csrf(&self, login: &str) -> String {
        self.tag("csrf", login)
    }

    fn tag(&self, purpose: &str, text: &str) -> String {
        let mut hasher = blake3::Hasher::new_keyed(&self.mac);
        hasher.update(purpose.as_bytes());
        hasher.update(b"\0");
        hasher.update(text.as_bytes());
        hasher.finalize().to_hex()[..32].to_string()
    }
}

/// The `Set-Cookie` value of a login: HttpOnly, SameSite=Strict, the whole `/ui/` path.
pub fn set_cookie(value: &str, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{COOKIE}={value}; Path=/ui; Max-Age={LOGIN_SECS}; HttpOnly; SameSite=Strict{secure}")
}

/// The `Set-Cookie` value that ends a login.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/ui; Max-Age=0; HttpOnly; SameSite=Strict")
}

/// A cookie's value from the request's `Cookie` headers.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// Compares without an early exit, so a token cannot be guessed byte by byte from timing.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_cookie(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, format!("other=1; {COOKIE}={value}").parse().unwrap());
        headers
    }

    #[test]
    fn a_login_cookie_is_valid_until_it_expires_and_only_under_the_token_that_made_it() {
        let keys = Keys::new(&Secret::new("admin-token"));
        let login = keys.login(1_000);
        assert!(!login.contains("admin-token"));
        assert!(matches!(keys.access(&with_cookie(&login), 1_000), Access::Cookie { .. }));
        assert_eq!(keys.access(&with_cookie(&login), 1_000 + LOGIN_SECS), Access::Denied);
        let forged = format!("{}.{}", 1_000 + 10 * LOGIN_SECS, login.split_once('.').unwrap().1);
        assert_eq!(keys.access(&with_cookie(&forged), 1_000), Access::Denied);
        let other = Keys::new(&Secret::new("rotated"));
        assert_eq!(other.access(&with_cookie(&login), 1_000), Access::Denied);
        assert_eq!(Keys::new(&Secret::default()).access(&with_cookie(&login), 1_000), Access::Off);
    }

    #[test]
    fn a_cookie_caller_changes_state_only_with_its_own_csrf_token() {
        let keys = Keys::new(&Secret::new("admin-token"));
        let access = keys.access(&with_cookie(&keys.login(0)), 1);
        let csrf = access.csrf().to_string();
        assert!(access.allows_change(&csrf));
        assert!(!access.allows_change(""));
        assert!(!access.allows_change(&keys.tag("csrf", "another login")));
        assert!(Access::Bearer.allows_change(""));
    }
}
