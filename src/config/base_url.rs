//! An upstream's base URL, checked once at start: no credentials, no query, and whether it
//! is on this machine or a private network.

use http::Uri;
use serde::Serialize;

/// An upstream base URL: scheme and authority, with an optional path prefix and no trailing slash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    pub(super) text: String,
    pub(super) authority: String,
}

impl BaseUrl {
    pub fn parse(raw: &str) -> Result<Self, String> {
        let uri: Uri = raw.parse().map_err(|e| format!("not a URL: {e}"))?;
        match uri.scheme_str() {
            Some("http") | Some("https") => {}
            _ => return Err("must start with http:// or https://".into()),
        }
        let authority = uri.authority().ok_or("has no host")?.to_string();
        if authority.contains('@') {
            // They would show in error messages and logs and go upstream inside the Host header;
            // compactor passes each client's own credential instead.
            return Err("must not carry credentials (`user:password@`): compactor forwards each client's own \
                        `Authorization` / `x-api-key` header; give the credential to the clients instead"
                .into());
        }
        if uri.query().is_some() {
            return Err("must not carry a query string".into());
        }
        Ok(Self { text: raw.trim_end_matches('/').to_string(), authority })
    }

    /// The URL text without a trailing slash, ready to have a request path appended.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// `host[:port]`, the value of the Host header sent upstream.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// The host is this machine or a private network: `localhost`, or a loopback, private
    /// (RFC 1918, IPv6 unique-local) or link-local address. Such an upstream is a local inference
    /// server far more often than a provider's API; a name that resolves there is not looked up.
    pub fn is_local(&self) -> bool {
        let host = match self.authority.strip_prefix('[') {
            Some(bracketed) => bracketed.split(']').next().unwrap_or(""),
            None => self.authority.rsplit_once(':').map_or(self.authority.as_str(), |(host, _)| host),
        };
        if host.eq_ignore_ascii_case("localhost") || host.to_ascii_lowercase().ends_with(".localhost") {
            return true;
        }
        match host.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(ip)) => ip.is_loopback() || ip.is_private() || ip.is_link_local(),
            Ok(std::net::IpAddr::V6(ip)) => {
                ip.is_loopback()
                    || ip.is_unique_local()
                    || ip.is_unicast_link_local()
                    || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback() || v4.is_private())
            }
            Err(_) => false,
        }
    }
}

/// The URL, for logs and error messages (it never carries credentials: parsing refuses them).
impl std::fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for BaseUrl {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::BaseUrl;

    fn local(url: &str) -> bool {
        BaseUrl::parse(url).unwrap().is_local()
    }

    #[test]
    fn this_machine_and_private_networks_are_local_a_provider_is_not() {
        for url in [
            "http://localhost:8080",
            "http://127.0.0.1:8080",
            "http://10.1.2.3:8000",
            "http://172.16.0.9",
            "http://192.168.1.20:11434/v1",
            "http://[::1]:8080",
            "http://[fd00::5]:8000",
            "http://169.254.10.1",
        ] {
            assert!(local(url), "{url}");
        }
        for url in ["https://api.openai.com", "http://172.32.0.1", "http://8.8.8.8", "https://vllm.internal.example"] {
            assert!(!local(url), "{url}");
        }
    }
}
