//! The cloud platforms' own ways in: who a request to Bedrock or Vertex AI says it is (a
//! client key of compactor's, or the client's own credential), and compactor's credentials for
//! the requests it authenticates itself: SigV4 for Amazon Bedrock ([`aws`]), Google's bearer for
//! Vertex AI ([`google`]). (Bedrock's stream framing is read by `crate::event_stream`.)

pub mod aws;
pub mod clients;
mod google;

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method, header};

pub use clients::{CLIENT_KEY_HEADER, Caller, ClientKeys, Credential};

use crate::config::Config;
use crate::error::ProxyError;
use crate::route::ApiFamily;

/// How a request is authenticated to its upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authentication {
    /// With what the client sent (its key, its bearer).
    AsSent,
    /// With the client's own SigV4 signature over this very body: its signed headers, `Host`
    /// included, go as they were signed.
    AsSigned,
    /// Signed by compactor with SigV4 (a client-key request, or a body compactor changed).
    AwsSigV4,
    /// With compactor's own Google access token (a client-key request).
    GoogleBearer,
}

/// What [`Cloud::admit`] decides before a request's body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// compactor may read and change it.
    Rewritable,
    /// A request signed by its client that compactor could not sign again: it goes as it came.
    AsItCame,
}

/// compactor's client keys and cloud credentials, for the process.
pub struct Cloud {
    clients: Arc<ClientKeys>,
    /// Only with `upstream.bedrock`.
    aws: Option<aws::AwsSigner>,
    google: google::GoogleTokens,
}

impl Cloud {
    pub fn new(config: &Config) -> Self {
        let upstream = &config.upstream;
        let aws = upstream
            .bedrock
            .as_ref()
            .map(|bedrock| aws::AwsSigner::new(&upstream.bedrock_region, Some(bedrock.authority())));
        Self { clients: Arc::new(ClientKeys::new(&config.clients)), aws, google: google::GoogleTokens::default() }
    }

    pub fn clients(&self) -> &Arc<ClientKeys> {
        &self.clients
    }

    /// Loads the AWS credentials ahead of the first request and keeps them fresh (see
    /// [`aws::AwsSigner::keep_fresh`]); returns at once without `upstream.bedrock`.
    pub async fn keep_fresh(&self) {
        if let Some(aws) = &self.aws {
            aws.keep_fresh().await;
        }
    }

    /// Phase 1's part: a Bedrock or Claude-on-Vertex request carries a credential (its own, or a
    /// client key that matches one configured), else it is refused before anything is read or
    /// signed; a client-signed Bedrock request compactor could not sign again goes as it came.
    pub fn admit(&self, family: ApiFamily, headers: &HeaderMap) -> Result<Admission, ProxyError> {
        let caller = self.clients.caller(headers);
        let platform = matches!(family, ApiFamily::Bedrock | ApiFamily::VertexAnthropic | ApiFamily::Vertex);
        match caller {
            Caller::BadKey if platform => Err(ProxyError::ClientKey { reason: "it matches no configured client key" }),
            Caller::Anonymous if family == ApiFamily::Bedrock || family == ApiFamily::VertexAnthropic => {
                Err(ProxyError::ClientKey { reason: "the request carries no credential" })
            }
            Caller::Own(Credential::SigV4)
                if family == ApiFamily::Bedrock
                    && !self.aws.as_ref().is_some_and(aws::AwsSigner::holds_credentials) =>
            {
                crate::telemetry::metric::forwarded_unsigned(family.label());
                Ok(Admission::AsItCame)
            }
            _ => Ok(Admission::Rewritable),
        }
    }

    /// How a request goes to its upstream, and its headers made ready for that: compactor's
    /// client key never leaves it, whatever the route. `sent`: the body that goes (`None`: the
    /// client's, streamed as it comes); `signed`: the body the client signed, for a
    /// client-signed request.
    pub fn authentication(
        &self,
        family: ApiFamily,
        headers: &mut HeaderMap,
        sent: Option<&Bytes>,
        signed: Option<&Bytes>,
    ) -> Authentication {
        let caller = self.clients.caller(headers);
        let client_key = matches!(caller, Caller::Client(_) | Caller::BadKey);
        if headers.contains_key(CLIENT_KEY_HEADER) {
            headers.remove(CLIENT_KEY_HEADER);
        } else if client_key {
            headers.remove(header::AUTHORIZATION);
        }
        match (family, caller) {
            (ApiFamily::Bedrock, Caller::Client(_)) => Authentication::AwsSigV4,
            (ApiFamily::Bedrock, Caller::Own(Credential::SigV4)) if sent.is_some() && sent != signed => {
                Authentication::AwsSigV4
            }
            (ApiFamily::Bedrock, Caller::Own(Credential::SigV4)) => Authentication::AsSigned,
            (ApiFamily::Vertex | ApiFamily::VertexAnthropic, Caller::Client(_)) => Authentication::GoogleBearer,
            _ => Authentication::AsSent,
        }
    }

    /// Whether a request's body must be read whole before it goes: compactor signs it.
    pub fn signs_whole_body(&self, family: ApiFamily, headers: &HeaderMap) -> bool {
        family == ApiFamily::Bedrock && matches!(self.clients.caller(headers), Caller::Client(_))
    }

    /// Authenticates a request as [`Self::authentication`] decided: `url` absolute, `body` the
    /// bytes that go.
    pub async fn authenticate(
        &self,
        how: Authentication,
        method: &Method,
        url: &str,
        headers: &mut HeaderMap,
        body: &[u8],
    ) -> Result<(), ProxyError> {
        match how {
            Authentication::AsSent | Authentication::AsSigned => Ok(()),
            Authentication::AwsSigV4 => match &self.aws {
                Some(aws) => aws.sign(method, url, headers, body).await,
                None => Err(ProxyError::NoCloudCredential { platform: "AWS", source: "no upstream.bedrock".into() }),
            },
            Authentication::GoogleBearer => {
                let bearer = self.google.bearer().await?;
                headers.insert(header::AUTHORIZATION, bearer);
                Ok(())
            }
        }
    }
}
