//! Google's access tokens for Vertex AI, for a client that sends none of its own: the gcp_auth
//! crate finds the credential as Google's libraries do (`GOOGLE_APPLICATION_CREDENTIALS`'s
//! service account, gcloud's application-default credentials, the metadata server on GKE and
//! GCE) and keeps each token until it expires.

use std::sync::Arc;

use gcp_auth::TokenProvider;
use http::HeaderValue;
use tokio::sync::OnceCell;

use crate::error::ProxyError;

const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// compactor's own Google credential, found at the first request that needs it.
#[derive(Default)]
pub struct GoogleTokens {
    provider: OnceCell<Option<Arc<dyn TokenProvider>>>,
}

impl GoogleTokens {
    /// `Bearer {token}`, marked sensitive (never printed by hyper or in a log).
    pub async fn bearer(&self) -> Result<HeaderValue, ProxyError> {
        let unavailable = |source| ProxyError::NoCloudCredential { platform: "Google Cloud", source };
        let provider = self
            .provider
            .get_or_init(|| async {
                match gcp_auth::provider().await {
                    Ok(provider) => Some(provider),
                    Err(error) => {
                        tracing::warn!(%error, "compactor found no Google credential for Vertex AI");
                        None
                    }
                }
            })
            .await;
        let Some(provider) = provider else {
            return Err(unavailable(
                "no Google credential was found (GOOGLE_APPLICATION_CREDENTIALS, gcloud, the metadata server)".into(),
            ));
        };
        let token = provider.token(&[SCOPE]).await.map_err(|error| unavailable(Box::new(error)))?;
        let mut value = HeaderValue::from_str(&format!("Bearer {}", token.as_str()))
            .map_err(|error| unavailable(Box::new(error)))?;
        value.set_sensitive(true);
        Ok(value)
    }
}
