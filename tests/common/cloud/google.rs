//! A fake of Google's OAuth token endpoint as a service account calls it (the JWT-bearer grant:
//! an RS256 JWT signed with the account's key, exchanged for an access token), and the
//! service-account file (Google's JSON format) that makes `gcp_auth` call it.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
use ring::signature::{KeyPair, RSA_PKCS1_2048_8192_SHA256, RsaKeyPair, UnparsedPublicKey};
use serde_json::{Value, json};

use super::form_fields;

/// A throw-away key (tests/fixtures/README.md): it signs nothing but these tests' JWTs.
const PRIVATE_KEY_PEM: &str = include_str!("../../fixtures/google-service-account.pem");
pub const SERVICE_ACCOUNT_EMAIL: &str = "compactor-test@proj-test.iam.gserviceaccount.com";
pub const SERVICE_ACCOUNT_PROJECT: &str = "proj-test";
/// The scope Vertex AI needs.
pub const CLOUD_PLATFORM_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// Writes a service-account key file whose token endpoint is `token_uri`; returns its path.
pub fn service_account_file(dir: &Path, token_uri: &str) -> PathBuf {
    let key = json!({
        "type": "service_account",
        "project_id": SERVICE_ACCOUNT_PROJECT,
        "private_key_id": "0123456789abcdef0123456789abcdef01234567",
        "private_key": PRIVATE_KEY_PEM,
        "client_email": SERVICE_ACCOUNT_EMAIL,
        "client_id": "100000000000000000001",
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": token_uri,
        "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
        "client_x509_cert_url": "https://www.googleapis.com/robot/v1/metadata/x509/compactor-test%40proj-test.iam.gserviceaccount.com",
        "universe_domain": "googleapis.com"
    });
    let path = dir.join("google-service-account.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&key).unwrap()).unwrap();
    path
}

/// The fixture key's public half (PKCS#1 `RSAPublicKey` DER, as ring verifies with it).
pub(super) fn public_key() -> Vec<u8> {
    let base64: String = PRIVATE_KEY_PEM.lines().filter(|line| !line.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD.decode(base64).expect("the fixture key is PEM");
    let pair = RsaKeyPair::from_pkcs8(&der).expect("the fixture key is a PKCS#8 RSA key");
    pair.public_key().as_ref().to_vec()
}

/// Base64url, padded (as `gcp_auth` writes it) or not (as Google's own libraries do).
fn base64url(part: &str) -> Option<Vec<u8>> {
    URL_SAFE.decode(part).or_else(|_| URL_SAFE_NO_PAD.decode(part)).ok()
}

/// Checks a token request's JWT-bearer grant; `Err` says what is wrong with it.
pub(super) fn check_grant(body: &[u8], token_uri: &str, public_key: &[u8]) -> Result<(), String> {
    let fields = form_fields(body);
    let field = |name: &str| fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
    if field("grant_type") != Some(JWT_BEARER) {
        return Err(format!("grant_type {:?} is not {JWT_BEARER}", field("grant_type")));
    }
    let assertion = field("assertion").ok_or("no assertion")?;
    let [header, claims, signature] = assertion.split('.').collect::<Vec<_>>()[..] else {
        return Err("the assertion is not header.claims.signature".into());
    };
    let json = |part: &str| base64url(part).and_then(|b| serde_json::from_slice::<Value>(&b).ok());
    let header = json(header).ok_or("the JWT header is not base64url JSON")?;
    if header["alg"] != "RS256" {
        return Err(format!("JWT alg {} is not RS256", header["alg"]));
    }
    let signed = &assertion[..assertion.rfind('.').unwrap_or(0)];
    let signature = base64url(signature).ok_or("the JWT signature is not base64url")?;
    UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, public_key)
        .verify(signed.as_bytes(), &signature)
        .map_err(|_| "the JWT signature does not verify with the service account's key")?;
    let claims = json(claims).ok_or("the JWT claims are not base64url JSON")?;
    if claims["iss"] != SERVICE_ACCOUNT_EMAIL {
        return Err(format!("iss {} is not {SERVICE_ACCOUNT_EMAIL}", claims["iss"]));
    }
    if claims["aud"] != token_uri {
        return Err(format!("aud {} is not {token_uri}", claims["aud"]));
    }
    let scopes = claims["scope"].as_str().unwrap_or("");
    if !scopes.split(' ').any(|s| s == CLOUD_PLATFORM_SCOPE) {
        return Err(format!("scope {scopes:?} lacks {CLOUD_PLATFORM_SCOPE}"));
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    match claims["exp"].as_i64() {
        Some(exp) if exp > now => Ok(()),
        exp => Err(format!("the JWT has expired (exp {exp:?}, now {now})")),
    }
}
