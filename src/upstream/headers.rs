//! Header hygiene at the proxy boundary: hop-by-hop headers never cross it, in either direction.

use http::header::{self, HeaderMap, HeaderName};

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1), plus the ones hyper
/// manages itself.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers, including any the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if headers.contains_key(header::CONNECTION) {
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    // Most requests carry none: one look at the few names they have, instead of a hashed
    // removal of every hop-by-hop name.
    if headers.keys().any(|name| HOP_BY_HOP.contains(name) || *name == PROXY_CONNECTION) {
        // A message with both framings is framed by its transfer coding (RFC 9112 §6.3); a proxy
        // drops the length, or the next hop would cut the body at a number that meant nothing.
        if headers.contains_key(header::TRANSFER_ENCODING) {
            headers.remove(header::CONTENT_LENGTH);
        }
        for name in &HOP_BY_HOP {
            headers.remove(name);
        }
        headers.remove(PROXY_CONNECTION);
    }
}

/// Not standard, still sent by some clients.
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn drops_hop_by_hop_and_connection_named_headers_but_keeps_auth() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-private"));
        headers.insert("x-private", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        headers.insert("anthropic-beta", HeaderValue::from_static("a,b"));
        strip_hop_by_hop(&mut headers);
        assert!(headers.get("x-private").is_none());
        assert!(headers.get("keep-alive").is_none());
        assert!(headers.get(header::CONNECTION).is_none());
        assert_eq!(headers.get(header::AUTHORIZATION).unwrap(), "Bearer k");
        assert_eq!(headers.get("anthropic-beta").unwrap(), "a,b");
    }

    #[test]
    fn a_length_beside_a_transfer_coding_is_dropped_and_a_length_alone_is_kept() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
        headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        strip_hop_by_hop(&mut headers);
        assert!(headers.is_empty(), "{headers:?}");
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.get(header::CONTENT_LENGTH).unwrap(), "10");
    }

    #[test]
    fn each_hop_by_hop_header_is_dropped_on_its_own_and_a_request_without_one_is_kept_whole() {
        for name in HOP_BY_HOP.iter().chain([&PROXY_CONNECTION]) {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
            headers.append(name.clone(), HeaderValue::from_static("x"));
            headers.append(name.clone(), HeaderValue::from_static("y"));
            strip_hop_by_hop(&mut headers);
            assert_eq!(headers.len(), 1, "{name}: {headers:?}");
            assert_eq!(headers.get(header::AUTHORIZATION).unwrap(), "Bearer k");
        }
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let before = headers.clone();
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers, before);
    }
}
