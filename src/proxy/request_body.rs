//! The client's request body. Rewritable routes need it whole (bounded by `limits.max_body_bytes`);
//! every other route streams it to the upstream as it arrives, with no cap of compactor's own. Both
//! give up on a client that stalls mid-body for `limits.client_body_timeout_ms`, and a client that
//! breaks off mid-body breaks off the upstream request with it.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use crate::error::{Cause, ProxyError};

/// What happened to a client body on its way: bytes received, and how it failed if it did.
#[derive(Debug, Default)]
pub struct Progress {
    bytes: AtomicU64,
    stalled: AtomicBool,
    broken: AtomicBool,
}

impl Progress {
    /// Bytes received from the client so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The client's side of a failure that surfaced elsewhere (in the upstream request that was
    /// streaming the body), if the body is what failed.
    pub fn client_error(&self, timeout: Duration) -> Option<ProxyError> {
        if self.stalled.load(Ordering::Relaxed) {
            Some(ProxyError::ClientBodyTimeout { timeout })
        } else if self.broken.load(Ordering::Relaxed) {
            Some(ProxyError::ClientBody(Box::new(BrokenOff)))
        } else {
            None
        }
    }
}

/// The client broke off the body it was sending (the upstream request went with it).
#[derive(Debug, thiserror::Error)]
#[error("the client broke off the request body")]
struct BrokenOff;

/// The body stalled: nothing arrived within the timeout.
#[derive(Debug, thiserror::Error)]
#[error("no request body data for {} ms", .0.as_millis())]
struct Stalled(Duration);

pin_project_lite::pin_project! {
    /// The client's body passed on frame by frame, counted, and cut with an error when the client
    /// stalls between two frames for longer than `idle`.
    pub struct ClientBody {
        #[pin]
        inner: Incoming,
        idle: Duration,
        deadline: Pin<Box<Sleep>>,
        progress: Arc<Progress>,
    }
}

impl ClientBody {
    pub fn new(inner: Incoming, idle: Duration) -> Self {
        let deadline = Box::pin(tokio::time::sleep(idle));
        Self { inner, idle, deadline, progress: Arc::default() }
    }

    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = Cause;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Cause>>> {
        let this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.progress.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                }
                this.deadline.as_mut().reset(Instant::now() + *this.idle);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => {
                this.progress.broken.store(true, Ordering::Relaxed);
                Poll::Ready(Some(Err(Box::new(error))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.progress.stalled.store(true, Ordering::Relaxed);
                    Poll::Ready(Some(Err(Box::new(Stalled(*this.idle)))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Reads the whole request body, refusing more than `limit` bytes (by Content-Length up front)
/// and a client that stalls for `idle`.
pub async fn read_whole(
    headers: &http::HeaderMap,
    body: Incoming,
    limit: u64,
    idle: Duration,
) -> Result<Bytes, ProxyError> {
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let body = ClientBody::new(body, idle);
    let progress = body.progress();
    let limit_usize = usize::try_from(limit).unwrap_or(usize::MAX);
    match Limited::new(body, limit_usize).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(ProxyError::BodyTooLarge { limit }),
        Err(_) if progress.stalled.load(Ordering::Relaxed) => Err(ProxyError::ClientBodyTimeout { timeout: idle }),
        Err(error) => Err(ProxyError::ClientBody(error)),
    }
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
    /// body cannot make a large one.
    fn decode(self, input: &[u8], limit: u64) -> Result<Vec<u8>, std::io::Error> {
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
        let mut out = Vec::new();
        reader.take(limit.saturating_add(1)).read_to_end(&mut out)?;
        Ok(out)
    }
}

/// Decodes a compressed request body for rewriting: the decoded body, within `limit` bytes, and
/// the original with its coding; `content-encoding` is removed from `headers` (what compactor
/// sends is identity unless it sends the original). A body in a coding compactor does not know is
/// given back as it came, to be forwarded untouched.
pub async fn decode(
    headers: &mut http::HeaderMap,
    body: Bytes,
    limit: u64,
) -> Result<(Bytes, Option<Encoded>), ProxyError> {
    let Some(value) = headers.get(header::CONTENT_ENCODING).cloned() else { return Ok((body, None)) };
    let Ok(text) = value.to_str() else { return Ok((body, None)) };
    let names: Vec<String> = text
        .split(',')
        .map(|name| name.trim().to_string())
        .filter(|name| !name.eq_ignore_ascii_case("identity"))
        .collect();
    let Some(codings) = names.iter().map(|name| Coding::of(name)).collect::<Option<Vec<Coding>>>() else {
        return Ok((body, None));
    };
    if codings.is_empty() {
        return Ok((body, None));
    }
    let original = body.clone();
    let decoding = tokio::task::spawn_blocking(move || {
        let mut data = body.to_vec();
        for (coding, name) in codings.iter().zip(&names).rev() {
            data = coding.decode(&data, limit).map_err(|source| ProxyError::BadContentEncoding {
                encoding: name.clone(),
                source: Box::new(source),
            })?;
            if data.len() as u64 > limit {
                return Err(ProxyError::BodyTooLarge { limit });
            }
        }
        Ok(Bytes::from(data))
    });
    let decoded = match decoding.await {
        Ok(result) => result?,
        Err(join) => return Err(ProxyError::ClientBody(Box::new(join))),
    };
    headers.remove(header::CONTENT_ENCODING);
    Ok((decoded, Some(Encoded { original, content_encoding: value })))
}
