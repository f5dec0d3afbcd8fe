//! A stateful chain read back from the provider, with the client's own credential: the items a
//! response was given (`GET …/responses/{id}/input_items`, oldest first, page by page), then what
//! it answered (`GET …/responses/{id}`'s `output`). Bounded: at most [`MAX_PAGES`] pages, each
//! read up to the request body limit.

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::ProxyError;
use crate::upstream::{RequestHead, Upstreams};

/// Items per page, the API's largest.
const PAGE: u32 = 100;

/// Pages read at most: ten thousand items, far past any window.
const MAX_PAGES: usize = 100;

/// Why a chain could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("reading the chain failed")]
    Upstream(#[from] ProxyError),
    #[error("the provider answered {0} to a read of the chain")]
    Status(u16),
    #[error("the provider's answer to a read of the chain is not a list of items")]
    Unreadable,
    #[error("the chain is longer than {MAX_PAGES} pages of items")]
    TooLong,
}

#[derive(Deserialize)]
struct Page<'a> {
    #[serde(borrow)]
    data: Vec<&'a RawValue>,
    #[serde(default)]
    has_more: bool,
    #[serde(default)]
    last_id: Option<String>,
}

#[derive(Deserialize)]
struct Answered<'a> {
    #[serde(borrow, default)]
    output: Vec<&'a RawValue>,
}

/// The items of the chain that ends with response `id`, oldest first, as JSON texts: what the
/// agent's next request continues from.
pub async fn read_chain(
    upstreams: &Upstreams,
    head: &RequestHead,
    id: &str,
    limit: usize,
) -> Result<Vec<String>, ChainError> {
    let mut items = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let mut query = format!("order=asc&limit={PAGE}");
        if let Some(after) = &after {
            query.push_str("&after=");
            query.push_str(&encode(after));
        }
        let body = get(upstreams, head, &format!("/{}/input_items", encode(id)), &query, limit).await?;
        let page: Page = serde_json::from_slice(&body).map_err(|_| ChainError::Unreadable)?;
        items.extend(page.data.iter().map(|item| item.get().to_string()));
        match (page.has_more, page.last_id) {
            (true, Some(last)) => after = Some(last),
            _ => {
                let body = get(upstreams, head, &format!("/{}", encode(id)), "", limit).await?;
                let answered: Answered = serde_json::from_slice(&body).map_err(|_| ChainError::Unreadable)?;
                items.extend(answered.output.iter().map(|item| item.get().to_string()));
                return Ok(items);
            }
        }
    }
    Err(ChainError::TooLong)
}

/// One read under the client's Responses path (`…/responses` + `suffix`), its query (an Azure
/// `api-version`) kept after `query`.
async fn get(
    upstreams: &Upstreams,
    head: &RequestHead,
    suffix: &str,
    query: &str,
    limit: usize,
) -> Result<Bytes, ChainError> {
    let mut uri = format!("{}{suffix}", head.uri.path());
    let queries: Vec<&str> = [query, head.uri.query().unwrap_or("")].into_iter().filter(|q| !q.is_empty()).collect();
    if !queries.is_empty() {
        uri.push('?');
        uri.push_str(&queries.join("&"));
    }
    let mut headers = head.headers.clone();
    headers.remove(http::header::CONTENT_TYPE);
    let read = RequestHead {
        route: head.route,
        method: http::Method::GET,
        uri: uri.parse().map_err(|_| ChainError::Unreadable)?,
        headers,
        signed_body: None,
    };
    let (status, body) = upstreams.call(&read, Bytes::new(), limit).await?;
    if !status.is_success() {
        return Err(ChainError::Status(status.as_u16()));
    }
    Ok(body)
}

/// An id as a path segment or query value: the provider's ids are `[A-Za-z0-9_-]`; anything else
/// (a dot included: `..` is a path of its own) is percent-encoded, so an id never reaches another
/// path.
fn encode(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for byte in id.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::encode;

    #[test]
    fn an_id_never_leaves_its_path_segment() {
        assert_eq!(encode("resp_68af-1"), "resp_68af-1");
        assert_eq!(encode(".."), "%2E%2E");
        assert_eq!(encode("../../v1/files?x=1"), "%2E%2E%2F%2E%2E%2Fv1%2Ffiles%3Fx%3D1");
    }
}
