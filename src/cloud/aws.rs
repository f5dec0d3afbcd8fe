//! SigV4 for Amazon Bedrock: credentials found as the AWS SDKs find them (aws-config's default
//! chain: the environment, the shared profile, web identity for EKS/IRSA, the container's and
//! the instance's metadata), kept until shortly before they expire, and each request signed with
//! the aws-sigv4 crate, the SDKs' own signer.

use std::time::{Duration, SystemTime};

use aws_config::BehaviorVersion;
use aws_credential_types::Credentials;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use http::{HeaderMap, HeaderValue, Method, header};
use tokio::sync::{Mutex, OnceCell};

use crate::error::{Cause, ProxyError};

/// Bedrock's signing name (the runtime's endpoints are `bedrock-runtime.…`, its name `bedrock`).
const SERVICE: &str = "bedrock";

/// Credentials that expire within this are fetched again before a request is signed with them.
const REFRESH_BEFORE: Duration = Duration::from_secs(300);

/// The headers compactor signs besides its own (`x-amz-date`, `x-amz-security-token`): what the
/// request's meaning rests on. Every other header may change on the way without breaking the
/// signature, as with the SDKs.
const SIGNED: [header::HeaderName; 2] = [header::HOST, header::CONTENT_TYPE];

/// Headers of a client's own signature, dropped when compactor signs instead.
const CLIENT_SIGNATURE: [&str; 4] = ["x-amz-date", "x-amz-security-token", "x-amz-content-sha256", "authorization"];

/// Signs Bedrock requests with the credentials compactor holds.
pub struct AwsSigner {
    /// The configured region, or the one `upstream.bedrock`'s host names; else the SDKs'.
    region: Option<String>,
    chain: OnceCell<Option<(SharedCredentialsProvider, String)>>,
    cached: Mutex<Option<Credentials>>,
}

impl AwsSigner {
    pub fn new(configured: &str, upstream_host: Option<&str>) -> Self {
        let region = (!configured.is_empty())
            .then(|| configured.to_string())
            .or_else(|| upstream_host.and_then(region_of_host).map(str::to_string));
        Self { region, chain: OnceCell::new(), cached: Mutex::new(None) }
    }

    /// The default chain and the region, found once.
    async fn chain(&self) -> Option<&(SharedCredentialsProvider, String)> {
        self.chain
            .get_or_init(|| async {
                use aws_smithy_http_client::tls;
                let client = aws_smithy_http_client::Builder::new()
                    .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
                    .build_https();
                let mut loader = aws_config::defaults(BehaviorVersion::latest()).http_client(client);
                if let Some(region) = &self.region {
                    loader = loader.region(aws_config::Region::new(region.clone()));
                }
                let config = loader.load().await;
                let region = config.region().map(|r| r.to_string()).or_else(|| self.region.clone());
                match (config.credentials_provider(), region) {
                    (Some(provider), Some(region)) => Some((provider, region)),
                    (_, None) => {
                        tracing::warn!("no AWS region for Bedrock: set upstream.bedrock_region or AWS_REGION");
                        None
                    }
                    (None, _) => None,
                }
            })
            .await
            .as_ref()
    }

    /// Credentials valid for a while yet, fetched again when they are about to expire.
    async fn credentials(&self) -> Result<(Credentials, &str), ProxyError> {
        let unavailable = |source: Cause| ProxyError::NoCloudCredential { platform: "AWS", source };
        let Some((provider, region)) = self.chain().await else {
            return Err(unavailable("no AWS credentials or region were found".into()));
        };
        let mut cached = self.cached.lock().await;
        let fresh = |c: &Credentials| c.expiry().is_none_or(|at| at > SystemTime::now() + REFRESH_BEFORE);
        if let Some(credentials) = cached.as_ref().filter(|c| fresh(c)) {
            return Ok((credentials.clone(), region));
        }
        let credentials = provider.provide_credentials().await.map_err(|error| unavailable(Box::new(error)))?;
        *cached = Some(credentials.clone());
        Ok((credentials, region))
    }

    /// Whether a request signed now would carry credentials: loaded and not about to expire.
    pub fn holds_credentials(&self) -> bool {
        self.cached.try_lock().is_ok_and(|cached| {
            cached.as_ref().is_some_and(|c| c.expiry().is_none_or(|at| at > SystemTime::now() + REFRESH_BEFORE))
        })
    }

    /// Loads the credentials at start and keeps them fresh from then on (before they expire;
    /// every minute while none are found), so a client-signed request knows at once whether
    /// compactor could sign a changed body, whether or not anything else was signed lately.
    pub async fn keep_fresh(&self) {
        loop {
            let wait = match self.credentials().await {
                Ok((credentials, _)) => credentials
                    .expiry()
                    .and_then(|at| at.duration_since(SystemTime::now() + REFRESH_BEFORE).ok())
                    .map_or(Duration::from_secs(900), |left| {
                        left.clamp(Duration::from_secs(10), Duration::from_secs(900))
                    }),
                Err(error) => {
                    tracing::warn!(error = %crate::error::Chain(&error), "compactor holds no AWS credentials: Bedrock requests it would change are forwarded as they came");
                    Duration::from_secs(60)
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// Signs a request to `url` (absolute) with `body`: the client's own signature headers
    /// replaced by compactor's.
    pub async fn sign(
        &self,
        method: &Method,
        url: &str,
        headers: &mut HeaderMap,
        body: &[u8],
    ) -> Result<(), ProxyError> {
        let (credentials, region) = self.credentials().await?;
        for name in CLIENT_SIGNATURE {
            headers.remove(name);
        }
        let signing = |error: Cause| ProxyError::Signing(error);
        let identity = credentials.into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(region)
            .name(SERVICE)
            .time(SystemTime::now())
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| signing(Box::new(e)))?
            .into();
        let signed: Vec<(&str, &str)> =
            SIGNED.iter().filter_map(|name| Some((name.as_str(), headers.get(name)?.to_str().ok()?))).collect();
        let request = SignableRequest::new(method.as_str(), url, signed.into_iter(), SignableBody::Bytes(body))
            .map_err(|e| signing(Box::new(e)))?;
        let (instructions, _) = sign(request, &params).map_err(|e| signing(Box::new(e)))?.into_parts();
        let (added, _) = instructions.into_parts();
        for header in added {
            let value = HeaderValue::from_str(header.value()).map_err(|e| signing(Box::new(e)))?;
            let name = header::HeaderName::from_bytes(header.name().as_bytes()).map_err(|e| signing(Box::new(e)))?;
            headers.insert(name, value);
        }
        Ok(())
    }
}

/// The region of a Bedrock runtime host: `bedrock-runtime.{region}.amazonaws.com` (and its
/// `-fips` form).
fn region_of_host(host: &str) -> Option<&str> {
    let host = host.split(':').next()?;
    let rest = host.strip_prefix("bedrock-runtime.").or_else(|| host.strip_prefix("bedrock-runtime-fips."))?;
    let (region, _) = rest.split_once('.')?;
    (!region.is_empty()).then_some(region)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_region_is_read_from_a_runtime_host() {
        assert_eq!(region_of_host("bedrock-runtime.eu-west-3.amazonaws.com"), Some("eu-west-3"));
        assert_eq!(region_of_host("bedrock-runtime-fips.us-east-1.amazonaws.com:443"), Some("us-east-1"));
        assert_eq!(region_of_host("127.0.0.1:9000"), None);
        assert_eq!(
            AwsSigner::new("ap-south-1", Some("bedrock-runtime.us-east-1.amazonaws.com")).region.as_deref(),
            Some("ap-south-1")
        );
        assert_eq!(
            AwsSigner::new("", Some("bedrock-runtime.us-east-1.amazonaws.com")).region.as_deref(),
            Some("us-east-1")
        );
    }
}
