//! A configured secret (the admin token, the tenant secret): a value that never prints. `Debug`,
//! `Display` and `Serialize` show `[redacted]` when it is set and `""` when it is not, so
//! `--check-config` and any `{:?}` of the configuration tell whether a secret is set, never what
//! it is.

use std::fmt;

/// What every rendering of a set secret shows.
pub const REDACTED: &str = "[redacted]";

/// A string that only [`Secret::expose`] reveals.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that uses it (a comparison, a key derivation).
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn shown(&self) -> &'static str {
        if self.0.is_empty() { "" } else { REDACTED }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.shown())
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.shown())
    }
}

impl serde::Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.shown())
    }
}

impl<'de> serde::Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Secret)
    }
}

/// The session store's Redis URL (or comma-separated cluster URLs): a password in it prints as
/// `[redacted]` in `--check-config`, `Debug` and logs; [`RedisUrls::expose`] gives it to the client.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrls(String);

impl RedisUrls {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    fn shown(&self) -> String {
        self.0.split(',').map(without_password).collect::<Vec<_>>().join(",")
    }
}

/// Every place redis-rs reads a password from, redacted: `scheme://user:password@host/db` →
/// `scheme://user:[redacted]@host/db`, and the query's `pass=` (the form `redis+unix://` and
/// `unix://` URLs use) and `password=` values; anything else as it is.
fn without_password(url: &str) -> String {
    let (url, query) = match url.split_once('?') {
        Some((url, query)) => (url, Some(query)),
        None => (url, None),
    };
    let mut shown = without_userinfo_password(url);
    if let Some(query) = query {
        shown.push('?');
        let pairs = query.split('&').map(|pair| match pair.split_once('=') {
            Some((key, value)) if is_password_key(key) && !value.is_empty() => format!("{key}={REDACTED}"),
            _ => pair.to_string(),
        });
        shown.push_str(&pairs.collect::<Vec<_>>().join("&"));
    }
    shown
}

/// A query key that carries a password (any spelling of `pass` or `password`, percent-encoded
/// or not): when unsure, redact.
fn is_password_key(key: &str) -> bool {
    key.to_ascii_lowercase().contains("pass") || key.contains('%')
}

fn without_userinfo_password(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else { return url.to_string() };
    let authority_end = url[start..].find(['/', '#']).map_or(url.len(), |i| start + i);
    let Some(at) = url[start..authority_end].rfind('@').map(|i| start + i) else { return url.to_string() };
    match url[start..at].find(':') {
        Some(colon) => format!("{}:{REDACTED}{}", &url[..start + colon], &url[at..]),
        None => url.to_string(),
    }
}

impl fmt::Debug for RedisUrls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.shown())
    }
}

impl serde::Serialize for RedisUrls {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.shown())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redis_password_prints_as_redacted_and_the_rest_of_the_url_stays() {
        let urls = RedisUrls::new("redis://app:s3cr3t@10.0.0.1:6379/2, rediss://:only-pw@h:1,redis://127.0.0.1:6379");
        let shown = format!("{urls:?}");
        assert!(!shown.contains("s3cr3t") && !shown.contains("only-pw"), "{shown}");
        assert_eq!(
            serde_json::to_string(&urls).unwrap(),
            "\"redis://app:[redacted]@10.0.0.1:6379/2, rediss://:[redacted]@h:1,redis://127.0.0.1:6379\""
        );
        assert!(urls.expose().contains("s3cr3t"));
    }

    #[test]
    fn a_password_in_the_query_prints_as_redacted_in_every_form_redis_reads() {
        let urls = RedisUrls::new(
            "redis+unix:///run/redis.sock?pass=pw1&db=2,unix:///s?user=app&password=pw2,redis://h:1/0?PASS=pw3&db=1",
        );
        assert_eq!(
            format!("{urls:?}"),
            "\"redis+unix:///run/redis.sock?pass=[redacted]&db=2,unix:///s?user=app&password=[redacted],\
             redis://h:1/0?PASS=[redacted]&db=1\""
        );
    }

    #[test]
    fn a_set_secret_prints_as_redacted_everywhere_and_an_unset_one_as_empty() {
        let secret = Secret::new("hunter2-token");
        assert_eq!(format!("{secret}"), REDACTED);
        assert_eq!(format!("{secret:?}"), "\"[redacted]\"");
        assert_eq!(serde_json::to_string(&secret).unwrap(), "\"[redacted]\"");
        assert_eq!(secret.expose(), "hunter2-token");
        let unset = Secret::default();
        assert_eq!((format!("{unset}"), format!("{unset:?}")), (String::new(), "\"\"".to_string()));
        assert!(unset.is_empty());
    }
}
