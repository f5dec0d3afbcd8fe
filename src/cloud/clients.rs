//! compactor's own client keys: what a client that sends no provider credential (Claude Code with
//! `CLAUDE_CODE_SKIP_BEDROCK_AUTH` or `CLAUDE_CODE_SKIP_VERTEX_AUTH`) shows instead, so compactor
//! knows whose request it signs. Configured as SHA-256 digests under the tenant each key names
//! (`[clients.TENANT]`); the key itself is never kept, logged or forwarded.

use std::collections::{BTreeMap, HashMap};

use http::{HeaderMap, HeaderName, header};
use sha2::{Digest, Sha256};

use crate::config::ClientKeyHashes;

/// The header a client may carry its key in instead of `Authorization: Bearer` (Claude Code:
/// `ANTHROPIC_CUSTOM_HEADERS="x-compactor-key: …"`).
pub const CLIENT_KEY_HEADER: HeaderName = HeaderName::from_static("x-compactor-key");

/// What the tenant hash of a client-key request is derived from: the tenant's name under a prefix
/// no provider credential starts with, so every key of a tenant shares its state.
const TENANT_PREFIX: &str = "compactor-client-tenant:";

/// Who a request to a cloud platform says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller<'k> {
    /// One of compactor's client keys: the tenant it names. compactor authenticates the request
    /// to the platform with its own credential.
    Client(&'k str),
    /// The client's own credential for the provider (a SigV4 signature, a Bedrock API key, a
    /// Google access token, an API key): it goes on as the client sent it.
    Own(Credential),
    /// An `x-compactor-key` that no configured key matches.
    BadKey,
    /// No credential at all.
    Anonymous,
}

/// The kind of a client's own credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// `Authorization: AWS4-HMAC-SHA256 …`: signed by the client, valid for the body it signed.
    SigV4,
    /// Any other credential (a bearer token, an API key header): valid for any body.
    Bearer,
}

/// The configured client keys, by digest.
#[derive(Debug, Default)]
pub struct ClientKeys {
    /// Key digest → the tenant's credential text (`compactor-client-tenant:NAME`).
    by_digest: HashMap<[u8; 32], Box<str>>,
}

impl ClientKeys {
    pub fn new(clients: &BTreeMap<String, ClientKeyHashes>) -> Self {
        let by_digest = clients
            .iter()
            .flat_map(|(tenant, hashes)| {
                let credential: Box<str> = format!("{TENANT_PREFIX}{tenant}").into();
                hashes.key_sha256.iter().map(move |digest| (*digest, credential.clone()))
            })
            .collect();
        Self { by_digest }
    }

    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    /// Who `headers` say the caller is. `x-compactor-key` first (it must match), then a bearer
    /// that is one of the keys; any other credential is the client's own.
    pub fn caller(&self, headers: &HeaderMap) -> Caller<'_> {
        if let Some(key) = headers.get(CLIENT_KEY_HEADER) {
            return self.tenant_of(key.as_bytes()).map_or(Caller::BadKey, Caller::Client);
        }
        let Some(authorization) = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes()) else {
            let keyed = ["x-api-key", "api-key", "x-goog-api-key"].iter().any(|name| headers.contains_key(*name));
            return if keyed { Caller::Own(Credential::Bearer) } else { Caller::Anonymous };
        };
        if authorization.starts_with(b"AWS4-HMAC-SHA256 ") {
            return Caller::Own(Credential::SigV4);
        }
        match bearer(authorization).and_then(|token| self.tenant_of(token)) {
            Some(tenant) => Caller::Client(tenant),
            None => Caller::Own(Credential::Bearer),
        }
    }

    /// The text a client-key request's tenant hash is derived from; `None` for any other request.
    pub fn tenant_credential(&self, headers: &HeaderMap) -> Option<&[u8]> {
        let key = match headers.get(CLIENT_KEY_HEADER) {
            Some(key) => key.as_bytes(),
            None => bearer(headers.get(header::AUTHORIZATION)?.as_bytes())?,
        };
        self.credential_of(key).map(str::as_bytes)
    }

    /// The tenant a key names.
    fn tenant_of(&self, key: &[u8]) -> Option<&str> {
        self.credential_of(key).and_then(|credential| credential.strip_prefix(TENANT_PREFIX))
    }

    fn credential_of(&self, key: &[u8]) -> Option<&str> {
        if self.by_digest.is_empty() || key.is_empty() {
            return None;
        }
        let digest: [u8; 32] = Sha256::digest(key).into();
        self.by_digest.get(&digest).map(|credential| &**credential)
    }
}

/// The token of `Bearer TOKEN` (either case of the scheme).
fn bearer(authorization: &[u8]) -> Option<&[u8]> {
    authorization.strip_prefix(b"Bearer ").or_else(|| authorization.strip_prefix(b"bearer "))
}

/// The access key id a SigV4 `Authorization` names (`Credential=AKID/date/region/service/…`):
/// the part of a signed request that is the same on every request of one identity.
pub fn sigv4_access_key(authorization: &[u8]) -> Option<&[u8]> {
    let rest = authorization.strip_prefix(b"AWS4-HMAC-SHA256 ")?;
    let at = memchr::memmem::find(rest, b"Credential=")? + b"Credential=".len();
    let credential = &rest[at..];
    let end = credential.iter().position(|&b| b == b'/' || b == b',' || b == b' ').unwrap_or(credential.len());
    (end > 0).then(|| &credential[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn keys() -> ClientKeys {
        let digest = |key: &str| -> [u8; 32] { Sha256::digest(key.as_bytes()).into() };
        let mut clients = BTreeMap::new();
        clients
            .insert("team-a".to_string(), ClientKeyHashes { key_sha256: vec![digest("ck-a-old"), digest("ck-a-new")] });
        clients.insert("team-b".to_string(), ClientKeyHashes { key_sha256: vec![digest("ck-b")] });
        ClientKeys::new(&clients)
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs.iter().map(|(name, value)| (HeaderName::from_static(name), HeaderValue::from_static(value))).collect()
    }

    #[test]
    fn a_client_key_names_its_tenant_in_either_header_and_every_other_credential_is_the_clients_own() {
        let keys = keys();
        assert_eq!(keys.caller(&headers(&[("authorization", "Bearer ck-a-new")])), Caller::Client("team-a"));
        assert_eq!(keys.caller(&headers(&[("x-compactor-key", "ck-a-old")])), Caller::Client("team-a"));
        assert_eq!(keys.caller(&headers(&[("x-compactor-key", "ck-b")])), Caller::Client("team-b"));
        assert_eq!(keys.caller(&headers(&[("x-compactor-key", "ck-wrong")])), Caller::BadKey);
        // The key header decides even beside a bearer that is a key.
        assert_eq!(
            keys.caller(&headers(&[("x-compactor-key", "nope"), ("authorization", "Bearer ck-b")])),
            Caller::BadKey
        );
        assert_eq!(keys.caller(&headers(&[("authorization", "Bearer ya29.google")])), Caller::Own(Credential::Bearer));
        assert_eq!(
            keys.caller(&headers(&[("authorization", "AWS4-HMAC-SHA256 Credential=AKID/20261202/us-east-1/bedrock/aws4_request, SignedHeaders=host, Signature=00")])),
            Caller::Own(Credential::SigV4)
        );
        assert_eq!(keys.caller(&headers(&[("x-api-key", "sk-ant")])), Caller::Own(Credential::Bearer));
        assert_eq!(keys.caller(&HeaderMap::new()), Caller::Anonymous);
    }

    #[test]
    fn both_keys_of_a_tenant_give_one_tenant_credential_and_other_tenants_another() {
        let keys = keys();
        let old = keys.tenant_credential(&headers(&[("authorization", "Bearer ck-a-old")])).map(<[u8]>::to_vec);
        let new = keys.tenant_credential(&headers(&[("x-compactor-key", "ck-a-new")])).map(<[u8]>::to_vec);
        let other = keys.tenant_credential(&headers(&[("x-compactor-key", "ck-b")])).map(<[u8]>::to_vec);
        assert_eq!(old.as_deref(), Some(&b"compactor-client-tenant:team-a"[..]));
        assert_eq!(old, new);
        assert_ne!(old, other);
        assert_eq!(keys.tenant_credential(&headers(&[("authorization", "Bearer sk-1")])), None);
        assert_eq!(
            ClientKeys::default().caller(&headers(&[("authorization", "Bearer ck-b")])),
            Caller::Own(Credential::Bearer)
        );
    }

    #[test]
    fn a_sigv4_authorization_names_its_access_key() {
        let signed = b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261202/us-east-1/bedrock/aws4_request, SignedHeaders=host;x-amz-date, Signature=abc";
        assert_eq!(sigv4_access_key(signed), Some(&b"AKIDEXAMPLE"[..]));
        assert_eq!(sigv4_access_key(b"AWS4-HMAC-SHA256 Credential=/x"), None);
        assert_eq!(sigv4_access_key(b"Bearer x"), None);
    }
}
