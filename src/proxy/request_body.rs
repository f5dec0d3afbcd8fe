//! The client's request body. Rewritable routes need it whole (bounded by `limits.max_body_bytes`);
//! every other route streams it to the upstream as it arrives, with no cap of compactor's own. Both
//! give up on a client that stalls mid-body for `limits.client_body_timeout_ms`, and a client that
//! breaks off mid-body breaks off the upstream request with it.

use std::time::Duration;

use bytes::Bytes;
use http::header;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use crate::error::ProxyError;
pub use crate::upstream::client_body::{ClientBody, Progress};
use crate::work::{self, Stopped};

/// Reads and drops a body compactor refuses before reading it (up to `limit` bytes, giving up on a
/// client that stalls for `idle`), so the client, still sending, gets the answer rather than a
/// broken pipe; nothing of it is kept.
pub async fn discard(body: Incoming, limit: u64, idle: Duration) {
    let mut body = ClientBody::new(body, idle);
    let mut read = 0u64;
    while read <= limit {
        match body.frame().await {
            Some(Ok(frame)) => read += frame.data_ref().map_or(0, |data| data.len() as u64),
            Some(Err(_)) | None => return,
        }
    }
}

/// The body length the request declares (`content-length`), if it does.
pub fn declared_length(headers: &http::HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok())
}

/// Reads the whole request body, refusing more than `limit` bytes (by Content-Length up front)
/// and a client that stalls for `idle`.
pub async fn read_whole(
    headers: &http::HeaderMap,
    body: Incoming,
    limit: u64,
    idle: Duration,
) -> Result<Bytes, ProxyError> {
    let declared = declared_length(headers);
    if declared.is_some_and(|length| length > limit) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let body = ClientBody::new(body, idle);
    let progress = body.progress();
    let limit_usize = usize::try_from(limit).unwrap_or(usize::MAX);
    match Limited::new(body, limit_usize).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(ProxyError::BodyTooLarge { limit }),
        Err(_) if progress.stalled() => Err(ProxyError::ClientBodyTimeout { timeout: idle }),
        Err(error) => Err(ProxyError::ClientBody(error)),
    }
}

/// The error for a request framed with a transfer coding other than `chunked` (`gzip, chunked`):
/// hyper removes the chunking, but the coding under it would reach the upstream as bytes with no
/// header naming it (transfer codings are hop-by-hop), so it is refused with 501 (RFC 9112 §6.1).
pub fn unsupported_transfer_coding(headers: &http::HeaderMap) -> Option<ProxyError> {
    let mut codings = headers.get_all(header::TRANSFER_ENCODING).iter().flat_map(|line| {
        line.to_str()
            .map_or_else(|_| vec!["?".to_string()], |text| text.split(',').map(|c| c.trim().to_string()).collect())
    });
    codings
        .find(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case("chunked"))
        .map(|coding| ProxyError::UnsupportedTransferCoding { coding: coding.chars().take(40).collect() })
}

/// A compressed request body as the client sent it, kept so that a body compactor did not change
/// goes upstream as the original bytes with their `content-encoding`.
#[derive(Debug, Clone)]
pub struct Encoded {
    pub original: Bytes,
    pub content_encoding: http::HeaderValue,
}

/// The codings compactor decodes (`content-encoding` names them, the last applied last).
#[derive(Debug, Clone, Copy)]
enum Coding {
    Gzip,
    Deflate,
    Brotli,
    Zstd,
}

impl Coding {
    fn of(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "gzip" | "x-gzip" => Some(Self::Gzip),
            "deflate" => Some(Self::Deflate),
            "br" => Some(Self::Brotli),
            "zstd" => Some(Self::Zstd),
            _ => None,
        }
    }

    /// Decodes `input`, reading at most `limit + 1` bytes of output so that a small compressed
    /// body cannot make a large one, and asking `go_on` between pieces of output whether to.
    fn decode(self, input: &[u8], limit: u64, go_on: &dyn Fn() -> Result<(), Stopped>) -> Result<Vec<u8>, DecodeError> {
        use std::io::Read;
        let reader: Box<dyn Read + '_> = match self {
            Self::Gzip => Box::new(flate2::read::MultiGzDecoder::new(input)),
            // HTTP's "deflate" is the zlib format; some clients send raw deflate, tried second.
            Self::Deflate if input.first().is_some_and(|b| b & 0x0f == 8) => {
                Box::new(flate2::read::ZlibDecoder::new(input))
            }
            Self::Deflate => Box::new(flate2::read::DeflateDecoder::new(input)),
            Self::Brotli => Box::new(brotli_decompressor::Decompressor::new(input, 16 * 1024)),
            Self::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(input)?),
        };
        let mut reader = reader.take(limit.saturating_add(1));
        let mut out = Vec::new();
        loop {
            go_on()?;
            let before = out.len();
            (&mut reader).take(DECODE_PIECE).read_to_end(&mut out)?;
            if out.len() == before {
                return Ok(out);
            }
        }
    }
}

/// Output decoded between two looks at the request's budget and client.
const DECODE_PIECE: u64 = 256 * 1024;

/// The most content codings compactor decodes on one body: real clients apply one (a proxy on the
/// way may add a second); each layer costs a pass over the whole body, so a long list (12,000
/// stored `deflate` layers) is CPU for nothing.
pub const MAX_CODINGS: usize = 4;

/// Why a decoding did not finish.
#[derive(Debug, thiserror::Error)]
enum DecodeError {
    #[error(transparent)]
    Corrupt(#[from] std::io::Error),
    #[error(transparent)]
    Stopped(#[from] Stopped),
}

/// The request's `content-encoding` as one list, every header line in order (RFC 9110 §5.3: lines
/// of a list field are one list), `identity` left out; `None` when a line is not text.
fn content_codings(headers: &http::HeaderMap) -> Option<Vec<String>> {
    let mut names = Vec::new();
    for line in headers.get_all(header::CONTENT_ENCODING) {
        let names_on_line = line.to_str().ok()?.split(',').map(str::trim);
        names.extend(names_on_line.filter(|n| !n.is_empty() && !n.eq_ignore_ascii_case("identity")).map(String::from));
    }
    Some(names)
}

/// Decodes a compressed request body for rewriting: the decoded body, within `limit` bytes, and
/// the original with its coding; `content-encoding` is removed from `headers` (what compactor
/// sends is identity unless it sends the original). A body in a coding compactor does not know is
/// given back as it came, to be forwarded untouched; so is one whose decoding the request's budget
/// (`limits.rewrite_budget_ms`) ran out on, or whose client left. More than [`MAX_CODINGS`] is an
/// error.
pub async fn decode(
    headers: &mut http::HeaderMap,
    body: Bytes,
    limit: u64,
) -> Result<(Bytes, Option<Encoded>), ProxyError> {
    if !headers.contains_key(header::CONTENT_ENCODING) {
        return Ok((body, None));
    }
    let Some(names) = content_codings(headers) else { return Ok((body, None)) };
    if names.len() > MAX_CODINGS {
        return Err(ProxyError::TooManyCodings { count: names.len(), max: MAX_CODINGS });
    }
    let Some(codings) = names.iter().map(|name| Coding::of(name)).collect::<Option<Vec<Coding>>>() else {
        return Ok((body, None));
    };
    if codings.is_empty() {
        return Ok((body, None));
    }
    let content_encoding = names.join(", ");
    let budget = work::current();
    let original = body.clone();
    let started = std::time::Instant::now();
    let decoding = tokio::task::spawn_blocking(move || {
        let go_on = || budget.as_ref().map_or(Ok(()), |budget| budget.check(Some(started)));
        let mut data = body.to_vec();
        for (coding, name) in codings.iter().zip(&names).rev() {
            data = match coding.decode(&data, limit, &go_on) {
                Ok(data) => data,
                Err(DecodeError::Stopped(stopped)) => return Ok(Err(stopped)),
                Err(DecodeError::Corrupt(source)) => {
                    return Err(ProxyError::BadContentEncoding { encoding: name.clone(), source: Box::new(source) });
                }
            };
            if data.len() as u64 > limit {
                return Err(ProxyError::BodyTooLarge { limit });
            }
        }
        Ok(Ok(Bytes::from(data)))
    });
    let decoded = decoding.await;
    work::charge(started.elapsed());
    let decoded = match decoded {
        Ok(Ok(Ok(decoded))) => decoded,
        // Out of budget, or the client left: the body goes on as it came (the rewrite that
        // follows finds the budget spent and leaves it alone).
        Ok(Ok(Err(_stopped))) => return Ok((original, None)),
        Ok(Err(error)) => return Err(error),
        Err(join) => return Err(ProxyError::ClientBody(Box::new(join))),
    };
    headers.remove(header::CONTENT_ENCODING);
    let content_encoding = http::HeaderValue::from_str(&content_encoding)
        .map_err(|error| ProxyError::BadContentEncoding { encoding: content_encoding, source: Box::new(error) })?;
    Ok((decoded, Some(Encoded { original, content_encoding })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::work::Budget;
    use std::io::Write;

    fn gzip(data: &[u8]) -> Bytes {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(data).unwrap();
        Bytes::from(encoder.finish().unwrap())
    }

    fn gzip_headers(lines: &[&str]) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        for line in lines {
            headers.append(header::CONTENT_ENCODING, http::HeaderValue::from_str(line).unwrap());
        }
        headers
    }

    #[tokio::test]
    async fn decoding_is_charged_to_the_request_and_stops_when_its_client_left() {
        let plain = vec![b'a'; 4 << 20];
        let body = gzip(&gzip(&plain));
        let budget = Budget::new(Duration::from_secs(60), body.len());
        let mut headers = gzip_headers(&["gzip", "gzip"]);
        let (decoded, encoded) = budget.scope(decode(&mut headers, body.clone(), 8 << 20)).await.unwrap();
        assert_eq!(decoded.len(), plain.len());
        assert_eq!(encoded.unwrap().content_encoding, "gzip, gzip", "both lines, in order");
        assert!(budget.spent() > Duration::ZERO, "the decoding counted against the budget");

        let left = Budget::new(Duration::from_secs(60), body.len());
        drop(left.stop_on_drop());
        let mut headers = gzip_headers(&["gzip", "gzip"]);
        let (kept, encoded) = left.scope(decode(&mut headers, body.clone(), 8 << 20)).await.unwrap();
        assert_eq!((kept, encoded.is_none()), (body, true), "the body as it came, not decoded");
        assert!(headers.contains_key(header::CONTENT_ENCODING));
    }

    #[tokio::test]
    async fn a_spent_budget_leaves_the_body_as_it_came() {
        let body = gzip(&vec![b'a'; 1 << 20]);
        let budget = Budget::new(Duration::from_nanos(1), body.len());
        std::thread::sleep(Duration::from_millis(1));
        budget.scope(async { crate::work::charge(Duration::from_millis(1)) }).await;
        let mut headers = gzip_headers(&["gzip"]);
        let (kept, encoded) = budget.scope(decode(&mut headers, body.clone(), 8 << 20)).await.unwrap();
        assert_eq!((kept, encoded.is_none()), (body, true));
    }
}
