//! SigV4 as Bedrock checks it: the signature is computed again, with `aws-sigv4` itself, from what
//! was received (method, `http://{Host}{path and query as sent}`, the headers SignedHeaders names,
//! the body bytes, the time of `x-amz-date`) and compared with the one sent.
//!
//! The crate's default `SigningSettings` reproduce what a client signed with the same defaults
//! (the AWS SDKs' settings for every service but S3), whether the model id in the path is raw
//! (`…-v1:0`, as Claude Code sends it) or percent-encoded (`…-v1%3A0`, as the AWS SDKs send it):
//! both sides take the path as it travels, normalize it the same way and encode it once more
//! (`PercentEncodingMode::Double`: `:` becomes `%3A`, `%3A` becomes `%253A`), which is also what
//! AWS does with a path it receives. Only the headers SignedHeaders names are given to the
//! signer, so what a proxy adds on the way (user-agent, accept-encoding) does not matter.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningInstructions, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_types::DateTime;
use aws_smithy_types::date_time::Format;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, Uri};
use http_body_util::Full;

use super::super::client::request;

pub const AWS_ACCESS_KEY_ID: &str = "AKIDCOMPACTORTEST";
pub const AWS_SECRET_ACCESS_KEY: &str = "compactor-test-secret-key";
pub const AWS_REGION: &str = "us-east-1";
/// The signing name of Bedrock's runtime (its endpoint is `bedrock-runtime.…`, its scope `bedrock`).
const SERVICE: &str = "bedrock";
const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// Why a request's signature was not accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization` header at all.
    Missing,
    /// A signature that does not check out, and why.
    Invalid(String),
}

impl Refusal {
    pub fn reason(&self) -> String {
        match self {
            Refusal::Missing => "no Authorization header".into(),
            Refusal::Invalid(why) => why.clone(),
        }
    }
}

/// The parts of `Authorization: AWS4-HMAC-SHA256 Credential=…, SignedHeaders=…, Signature=…`.
struct Authorization<'a> {
    access_key: &'a str,
    date: &'a str,
    region: &'a str,
    service: &'a str,
    signed_headers: Vec<&'a str>,
    signature: &'a str,
}

fn parse_authorization(value: &str) -> Result<Authorization<'_>, String> {
    let rest = value.strip_prefix(ALGORITHM).ok_or_else(|| format!("not {ALGORITHM}: {value}"))?.trim_start();
    let (mut credential, mut signed_headers, mut signature) = (None, None, None);
    for part in rest.split(',').map(str::trim) {
        match part.split_once('=') {
            Some(("Credential", v)) => credential = Some(v),
            Some(("SignedHeaders", v)) => signed_headers = Some(v),
            Some(("Signature", v)) => signature = Some(v),
            _ => return Err(format!("unexpected part {part:?} in Authorization")),
        }
    }
    let credential = credential.ok_or("no Credential in Authorization")?;
    let scope: Vec<&str> = credential.split('/').collect();
    let [access_key, date, region, service, "aws4_request"] = scope[..] else {
        return Err(format!("malformed credential scope {credential:?}"));
    };
    Ok(Authorization {
        access_key,
        date,
        region,
        service,
        signed_headers: signed_headers.ok_or("no SignedHeaders in Authorization")?.split(';').collect(),
        signature: signature.ok_or("no Signature in Authorization")?,
    })
}

/// `20250929T120000Z` (SigV4's basic ISO 8601) as a time.
fn parse_amz_date(value: &str) -> Option<SystemTime> {
    let b = value.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let extended = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &value[0..4],
        &value[4..6],
        &value[6..8],
        &value[9..11],
        &value[11..13],
        &value[13..15]
    );
    SystemTime::try_from(DateTime::from_str(&extended, Format::DateTime).ok()?).ok()
}

/// Signs `signable` as `credentials` at `time`, with the crate's default settings.
fn sign_as(
    credentials: Credentials,
    time: SystemTime,
    signable: SignableRequest<'_>,
) -> Result<(SigningInstructions, String), String> {
    let identity = credentials.into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(AWS_REGION)
        .name(SERVICE)
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| e.to_string())?
        .into();
    Ok(sign(signable, &params).map_err(|e| e.to_string())?.into_parts())
}

/// Checks a received request's signature against the test credentials.
pub fn verify_sigv4(method: &Method, uri: &Uri, headers: &HeaderMap, body: &[u8]) -> Result<(), Refusal> {
    let invalid = |why: String| Refusal::Invalid(why);
    let Some(value) = headers.get("authorization") else {
        return Err(Refusal::Missing);
    };
    let value = value.to_str().map_err(|_| invalid("Authorization is not ASCII".into()))?;
    let auth = parse_authorization(value).map_err(invalid)?;
    if auth.access_key != AWS_ACCESS_KEY_ID {
        return Err(invalid(format!("unknown access key id {}", auth.access_key)));
    }
    if auth.region != AWS_REGION {
        return Err(invalid(format!("credential scoped to region {}, not {AWS_REGION}", auth.region)));
    }
    if auth.service != SERVICE {
        return Err(invalid(format!("credential scoped to service {}, not {SERVICE}", auth.service)));
    }
    let amz_date =
        headers.get("x-amz-date").and_then(|v| v.to_str().ok()).ok_or_else(|| invalid("no x-amz-date".into()))?;
    let time = parse_amz_date(amz_date).ok_or_else(|| invalid(format!("bad x-amz-date {amz_date:?}")))?;
    if !amz_date.starts_with(auth.date) {
        return Err(invalid(format!("credential date {} is not the day of x-amz-date {amz_date}", auth.date)));
    }
    for required in ["host", "x-amz-date"] {
        if !auth.signed_headers.contains(&required) {
            return Err(invalid(format!("{required} is not among the signed headers")));
        }
    }
    // HTTP/2 carries the host in the URI's authority, not in a Host header.
    let host = headers
        .get("host")
        .and_then(|v| v.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()))
        .ok_or_else(|| invalid("no host".into()))?;
    let mut signed = Vec::new();
    for &name in &auth.signed_headers {
        if name == "host" {
            signed.push((name, host.to_string()));
            continue;
        }
        let values: Vec<_> = headers.get_all(name).iter().collect();
        if values.is_empty() {
            return Err(invalid(format!("signed header {name} is not in the request")));
        }
        for value in values {
            let value = value.to_str().map_err(|_| invalid(format!("header {name} is not ASCII")))?;
            signed.push((name, value.to_string()));
        }
    }
    let token = headers.get("x-amz-security-token").and_then(|v| v.to_str().ok()).map(str::to_string);
    let credentials = Credentials::new(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, token, None, "compactor-test");
    let path_and_query = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let url = format!("http://{host}{path_and_query}");
    let signable = SignableRequest::new(
        method.as_str(),
        url,
        signed.iter().map(|(name, value)| (*name, value.as_str())),
        SignableBody::Bytes(body),
    )
    .map_err(|e| invalid(format!("cannot sign the request again: {e}")))?;
    let (instructions, signature) =
        sign_as(credentials, time, signable).map_err(|e| invalid(format!("cannot sign the request again: {e}")))?;
    if signature == auth.signature {
        return Ok(());
    }
    let resigned = instructions.headers().find(|(n, _)| *n == "authorization").map(|(_, v)| v.to_string());
    Err(invalid(format!("signature mismatch: sent {value}, computed {}", resigned.unwrap_or_default())))
}

/// A request signed with the test credentials the way an AWS SDK signs one (aws-sigv4, default
/// settings, service `bedrock`, the time now, the body's hash, every header given plus host).
pub fn sign_bedrock(method: &str, url: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    sign_bedrock_at(method, url, headers, body, SystemTime::now())
}

/// [`sign_bedrock`] at a given time.
pub fn sign_bedrock_at(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
    time: SystemTime,
) -> Request<Full<Bytes>> {
    let body = body.into();
    let credentials = Credentials::new(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, None, None, "compactor-test");
    let signable = SignableRequest::new(method, url, headers.iter().copied(), SignableBody::Bytes(&body)).unwrap();
    let (instructions, _) = sign_as(credentials, time, signable).unwrap();
    let mut signed = request(method, url, headers, body.clone());
    instructions.apply_to_request_http1x(&mut signed);
    signed
}
