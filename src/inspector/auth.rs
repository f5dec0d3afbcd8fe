//! Who may see the inspector: whoever holds the admin token, presented as `Authorization: Bearer`
//! or exchanged once, through the login form, for a cookie. The cookie never carries the token: it
//! is an expiry, a nonce of its own and a keyed hash of both under a key derived from the token,
//! so it is checked without a lookup and changing the token ends every login. "Log out" ends one
//! login: the store remembers it, by a keyed hash of the cookie, until the cookie would have
//! expired ([`Login`]), and every replica asks the store before taking a cookie. The CSRF token of
//! a form is a keyed hash of the cookie it goes with.

use std::hash::BuildHasher;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use http::HeaderMap;
use http::header;

use crate::config::Secret;

/// The login cookie's name.
pub const COOKIE: &str = "compactor_inspector";

/// How long a login lasts.
pub const LOGIN_SECS: u64 = 12 * 3600;

/// Where a login is good, and so where its logout is remembered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// On every replica under the same token, across restarts: the logouts live in the shared
    /// store (Redis).
    Shared,
    /// In this process only: its logouts live in its memory, which a restart forgets, so a
    /// restart ends its logins too (the in-process store's sessions go with it anyway).
    Process,
}

/// A secret drawn once per process, in the key of [`Scope::Process`] logins.
static PROCESS_SECRET: LazyLock<[u8; 32]> = LazyLock::new(|| {
    // std's RandomState is keyed from the OS's randomness: 128 random bits, stretched.
    let random = std::hash::RandomState::new();
    let mut seed = [0u8; 32];
    for (i, chunk) in seed.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&random.hash_one(i).to_le_bytes());
    }
    blake3::derive_key("compactor inspector process", &seed)
});

/// Logins made by this process: with a fresh RandomState each, every nonce differs.
static LOGINS: AtomicU64 = AtomicU64::new(0);

/// One login, as its cookie names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Login {
    /// A keyed hash of the cookie: what the store remembers of an ended login (never the cookie,
    /// which would let whoever reads the store present it).
    pub id: String,
    /// The Unix second the cookie stops being good by itself.
    pub expires: u64,
}

/// How a request is allowed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// No admin token is configured: the pages are off.
    Off,
    /// Neither a valid bearer token nor a valid login cookie.
    Denied,
    /// The bearer token: nothing ambient, so no CSRF check is needed.
    Bearer,
    /// A login cookie, not yet checked against the store's ended logins; its forms carry this
    /// CSRF token.
    Cookie { csrf: String, login: Login },
}

impl Access {
    /// The CSRF token to put in forms (none for a bearer caller, who needs none).
    pub fn csrf(&self) -> &str {
        match self {
            Access::Cookie { csrf, .. } => csrf,
            _ => "",
        }
    }

    /// The login of a cookie caller.
    pub fn login(&self) -> Option<&Login> {
        match self {
            Access::Cookie { login, .. } => Some(login),
            _ => None,
        }
    }

    /// Whether a state change with `presented` as its CSRF token may go ahead.
    pub fn allows_change(&self, presented: &str) -> bool {
        match self {
            Access::Bearer => true,
            Access::Cookie { csrf, .. } => constant_time_eq(csrf.as_bytes(), presented.as_bytes()),
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
    /// The keys of `token`'s logins, good in `scope`.
    pub fn new(token: &Secret, scope: Scope) -> Self {
        let mut hasher = blake3::Hasher::new_derive_key("compactor inspector login v2");
        hasher.update(token.expose().as_bytes());
        if scope == Scope::Process {
            hasher.update(b"\0");
            hasher.update(&*PROCESS_SECRET);
        }
        Self { token: token.clone(), mac: *hasher.finalize().as_bytes() }
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
        match cookie(headers, COOKIE).and_then(|value| Some((value, self.valid_login(value, now)?))) {
            Some((value, expires)) => {
                Access::Cookie { csrf: self.csrf(value), login: Login { id: self.tag("logout", value), expires } }
            }
            None => Access::Denied,
        }
    }

    /// Whether `presented` is the admin token (compared in constant time).
    pub fn is_token(&self, presented: &str) -> bool {
        constant_time_eq(presented.as_bytes(), self.token.expose().as_bytes())
    }

    /// A new login cookie's value, valid until `now + LOGIN_SECS`: `<expires>.<nonce>.<tag>`. The
    /// nonce makes every login its own, so ending one never ends another made in the same second.
    pub fn login(&self, now: u64) -> String {
        let expires = now + LOGIN_SECS;
        let nonce = std::hash::RandomState::new().hash_one(LOGINS.fetch_add(1, Ordering::Relaxed));
        let signed = format!("{expires}.{nonce:016x}");
        let tag = self.tag("login", &signed);
        format!("{signed}.{tag}")
    }

    /// The expiry of a login cookie made under these keys and good at `now`.
    fn valid_login(&self, value: &str, now: u64) -> Option<u64> {
        let (signed, tag) = value.rsplit_once('.')?;
        let (expires, nonce) = signed.split_once('.')?;
        let until = expires.parse::<u64>().ok()?;
        let well_formed = nonce.len() == 16 && nonce.bytes().all(|b| b.is_ascii_hexdigit());
        (well_formed && until > now && constant_time_eq(tag.as_bytes(), self.tag("login", signed).as_bytes()))
            .then_some(until)
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
        let keys = Keys::new(&Secret::new("admin-token"), Scope::Shared);
        let login = keys.login(1_000);
        assert!(!login.contains("admin-token"));
        assert!(matches!(keys.access(&with_cookie(&login), 1_000), Access::Cookie { .. }));
        assert_eq!(keys.access(&with_cookie(&login), 1_000 + LOGIN_SECS), Access::Denied);
        let forged = format!("{}.{}", 1_000 + 10 * LOGIN_SECS, login.split_once('.').unwrap().1);
        assert_eq!(keys.access(&with_cookie(&forged), 1_000), Access::Denied);
        let other = Keys::new(&Secret::new("rotated"), Scope::Shared);
        assert_eq!(other.access(&with_cookie(&login), 1_000), Access::Denied);
        let off = Keys::new(&Secret::default(), Scope::Shared);
        assert_eq!(off.access(&with_cookie(&login), 1_000), Access::Off);
        // The format before nonces (`<expires>.<tag>`) is no login.
        let (expires, rest) = login.split_once('.').unwrap();
        let old = format!("{expires}.{}", rest.split_once('.').unwrap().1);
        assert_eq!(keys.access(&with_cookie(&old), 1_000), Access::Denied);
        for bad in ["", ".", "..", "1.2.3", "x.0123456789abcdef.y", "99999999999999999999999.0123456789abcdef.00"] {
            assert_eq!(keys.access(&with_cookie(bad), 1_000), Access::Denied, "{bad}");
        }
    }

    #[test]
    fn two_logins_in_the_same_second_are_two_logins_with_their_own_ids_and_csrf_tokens() {
        let keys = Keys::new(&Secret::new("admin-token"), Scope::Shared);
        let (first, second) = (keys.login(1_000), keys.login(1_000));
        assert_ne!(first, second);
        let (a, b) = (keys.access(&with_cookie(&first), 1_001), keys.access(&with_cookie(&second), 1_001));
        assert_ne!(a.login().unwrap().id, b.login().unwrap().id, "ending one ends only it");
        assert_ne!(a.csrf(), b.csrf());
        assert_eq!(a.login().unwrap().expires, 1_000 + LOGIN_SECS);
        assert!(!a.login().unwrap().id.contains(&first), "the id is not the cookie");
    }

    #[test]
    fn a_process_login_is_good_in_this_process_only() {
        let token = Secret::new("admin-token");
        let process = Keys::new(&token, Scope::Process);
        let login = process.login(1_000);
        assert!(matches!(Keys::new(&token, Scope::Process).access(&with_cookie(&login), 1_000), Access::Cookie { .. }));
        assert_eq!(Keys::new(&token, Scope::Shared).access(&with_cookie(&login), 1_000), Access::Denied);
    }

    #[test]
    fn a_cookie_caller_changes_state_only_with_its_own_csrf_token() {
        let keys = Keys::new(&Secret::new("admin-token"), Scope::Shared);
        let access = keys.access(&with_cookie(&keys.login(0)), 1);
        let csrf = access.csrf().to_string();
        assert!(access.allows_change(&csrf));
        assert!(!access.allows_change(""));
        assert!(!access.allows_change(&keys.tag("csrf", "another login")));
        assert!(Access::Bearer.allows_change(""));
    }
}
