//! Which session a request belongs to, and whose: a session id from the headers agents already
//! send, else from the body, else a fingerprint of the conversation's opening; scoped by a keyed
//! hash of the caller's credential so tenants never share state. And which conversation inside
//! the session: a hash of the same opening ([`ConversationId`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};

use http::{HeaderMap, HeaderName};
use xxhash_rust::xxh3::{Xxh3, xxh3_128_with_seed};

use crate::dialect::prefix::PrefixKey;
use crate::dialect::{Dialect, ParsedRequest};
use crate::json::RawObject;

/// Session headers agents send, after the configured one: Claude Code, Codex CLI (two spellings,
/// plus `conversation_id` in some versions), OpenCode.
/// Names, not texts: a lookup by text parses the name first, on every request.
static AGENT_HEADERS: [HeaderName; 6] = [
    HeaderName::from_static("x-claude-code-session-id"),
    HeaderName::from_static("session_id"),
    HeaderName::from_static("session-id"),
    HeaderName::from_static("conversation_id"),
    HeaderName::from_static("x-session-affinity"),
    HeaderName::from_static("x-session-id"),
];

/// Credentials a request can carry; only their keyed hash is ever kept.
static CREDENTIAL_HEADERS: [HeaderName; 4] = [
    http::header::AUTHORIZATION,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("api-key"),
    HeaderName::from_static("x-goog-api-key"),
];

/// Where the session id came from (a log field, and part of the hashed key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionSource {
    Header,
    PromptCacheKey,
    MetadataUserId,
    Fingerprint,
}

impl SessionSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Header => "header",
            Self::PromptCacheKey => "prompt_cache_key",
            Self::MetadataUserId => "metadata_user_id",
            Self::Fingerprint => "fingerprint",
        }
    }
}

/// A tenant-scoped session key, safe to show: it reveals nothing of the credential.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey {
    /// `<tenant hash>.<session hash>`, also the Redis hash tag.
    pub key: String,
    pub source: SessionSource,
}

impl SessionKey {
    pub fn as_str(&self) -> &str {
        &self.key
    }

    /// The tenant part of the key: the keyed hash of the request's credential (or `anonymous`).
    pub fn tenant(&self) -> &str {
        self.key.split_once('.').map_or(self.key.as_str(), |(tenant, _)| tenant)
    }
}

/// Identifies sessions; holds the secret that keys tenant hashes.
#[derive(Clone)]
pub struct Identifier {
    /// The configured session header (none when the name is not a valid header name).
    header: Option<HeaderName>,
    secret: [u8; 32],
    /// Tenant hashes by a seeded fast hash of the credential (see [`Identifier::tenant_of`]).
    tenants: Arc<Mutex<HashMap<u128, TenantHash, foldhash::fast::RandomState>>>,
    cache_seed: u64,
    /// compactor's client keys: a key's request is its tenant's, every key of a tenant alike.
    clients: Arc<crate::cloud::ClientKeys>,
}

impl Identifier {
    pub fn new(header: &str, tenant_secret: &str) -> Self {
        // An empty secret still yields stable keys across replicas; operators should set one.
        let secret = blake3::derive_key("compactor tenant hash v1", tenant_secret.as_bytes());
        let seed = blake3::derive_key("compactor tenant cache v1", &secret);
        let cache_seed = u64::from_le_bytes(seed[..8].try_into().unwrap_or_default());
        let header = HeaderName::from_bytes(header.to_ascii_lowercase().as_bytes()).ok();
        Self { header, secret, tenants: Arc::default(), cache_seed, clients: Arc::default() }
    }

    /// The same, with compactor's client keys known (see [`crate::cloud::ClientKeys`]).
    pub fn with_clients(mut self, clients: Arc<crate::cloud::ClientKeys>) -> Self {
        self.clients = clients;
        self
    }

    /// The session of a request.
    pub fn identify(&self, headers: &HeaderMap, parsed: Option<&ParsedRequest>) -> SessionKey {
        self.identify_in(headers, None, parsed)
    }

    /// The session of a request whose query may carry its credential (Gemini's `?key=`).
    pub fn identify_in(&self, headers: &HeaderMap, query: Option<&str>, parsed: Option<&ParsedRequest>) -> SessionKey {
        self.key_of(headers, query, self.session_id(headers, parsed, fingerprint))
    }

    /// The session of a parsed request and its conversation inside it: the conversation's opening
    /// ([`opening`]) is hashed once, for the conversation id and, when the request names no
    /// session, for the fingerprint that stands for one.
    pub fn identify_conversation(
        &self,
        headers: &HeaderMap,
        query: Option<&str>,
        parsed: &ParsedRequest,
    ) -> (SessionKey, ConversationId) {
        let opening = opening(parsed);
        let conversation = ConversationId::from_opening(&opening);
        let session = self.key_of(headers, query, self.session_id(headers, Some(parsed), |_| fingerprint_of(&opening)));
        (session, conversation)
    }

    /// The key of the session `(source, id)` in the tenant of the request's credential.
    fn key_of(
        &self,
        headers: &HeaderMap,
        query: Option<&str>,
        (source, id): (SessionSource, Cow<'_, str>),
    ) -> SessionKey {
        let session = session_digest(source, &id);
        let mut key = String::with_capacity(TENANT_LEN + 1 + 32);
        match self.credential(headers).or_else(|| query_key(query)) {
            None => key.push_str("anonymous"),
            Some(credential) => key.push_str(&self.tenant_of(credential)),
        }
        let _ = write!(key, ".{session:032x}");
        SessionKey { key, source }
    }

    /// Keyed hash of the credential: the same key always maps to the same tenant, and nothing
    /// about the key can be learned from it.
    pub fn tenant(&self, headers: &HeaderMap) -> String {
        match self.credential(headers) {
            None => "anonymous".to_string(),
            Some(credential) => self.tenant_of(credential).to_string(),
        }
    }

    /// The key a conversation's last parse is kept under ([`PrefixKey`]): the credential and the
    /// session header, both known before the body is read and the same on every turn.
    pub fn prefix_key(&self, dialect: Dialect, headers: &HeaderMap, query: Option<&str>) -> PrefixKey {
        let session = self.session_headers().find_map(|name| headers.get(name));
        let credential = self.credential(headers).or_else(|| query_key(query)).unwrap_or_default();
        PrefixKey::new(dialect, [credential, session.map_or(&[][..], |v| v.as_bytes())])
    }

    /// The configured session header, then the agents' own.
    fn session_headers(&self) -> impl Iterator<Item = &HeaderName> {
        self.header.iter().chain(AGENT_HEADERS.iter())
    }

    /// What the tenant is derived from: a client key's tenant, else the credential the request
    /// carries, of which a SigV4 signature (new on every request) is its access key alone.
    fn credential<'h>(&'h self, headers: &'h HeaderMap) -> Option<&'h [u8]> {
        if let Some(tenant) = self.clients.tenant_credential(headers) {
            return Some(tenant);
        }
        CREDENTIAL_HEADERS.iter().find_map(|name| headers.get(name)).map(|v| {
            let value = v.as_bytes();
            if let Some(access_key) = crate::cloud::clients::sigv4_access_key(value) {
                return access_key;
            }
            value.strip_prefix(b"Bearer ").or_else(|| value.strip_prefix(b"bearer ")).unwrap_or(value)
        })
    }

    /// The tenant hash of a credential, from the cache when this process has seen it (a client
    /// sends the same key on every request). The cache is keyed by a seeded 128-bit hash of the
    /// credential (the seed derived from the tenant secret), never by the credential itself.
    fn tenant_of(&self, credential: &[u8]) -> TenantHash {
        let seen = xxh3_128_with_seed(credential, self.cache_seed);
        if let Ok(cache) = self.tenants.lock()
            && let Some(tenant) = cache.get(&seen)
        {
            return *tenant;
        }
        let hash = blake3::keyed_hash(&self.secret, credential);
        let tenant = TenantHash(hash.to_hex()[..TENANT_LEN].as_bytes().try_into().unwrap_or([b'0'; TENANT_LEN]));
        if let Ok(mut cache) = self.tenants.lock() {
            if cache.len() >= MAX_CACHED_TENANTS {
                cache.clear();
            }
            cache.insert(seen, tenant);
        }
        tenant
    }

    /// The tenant-hash cache's size: its table's capacity, each slot a fixed-size pair.
    pub fn tenant_cache_size(&self) -> crate::tokens::CacheSize {
        let Ok(cache) = self.tenants.lock() else { return crate::tokens::CacheSize::default() };
        let slot = std::mem::size_of::<(u128, TenantHash)>() + 1;
        crate::tokens::CacheSize { bytes: (cache.capacity() * slot) as u64, entries: cache.len() as u64 }
    }

    /// Where the session id comes from and the id; `fingerprint` makes the id of a request that
    /// names no session.
    fn session_id<'p>(
        &self,
        headers: &'p HeaderMap,
        parsed: Option<&'p ParsedRequest>,
        fingerprint: impl FnOnce(&ParsedRequest) -> String,
    ) -> (SessionSource, Cow<'p, str>) {
        let header = self
            .session_headers()
            .find_map(|name| headers.get(name).and_then(|v| v.to_str().ok()).filter(|v| !v.trim().is_empty()));
        if let Some(id) = header {
            return (SessionSource::Header, Cow::Borrowed(id.trim()));
        }
        let Some(parsed) = parsed else { return (SessionSource::Fingerprint, Cow::Borrowed("")) };
        if let Some(key) = parsed.top.str("prompt_cache_key").filter(|k| !k.is_empty()) {
            return (SessionSource::PromptCacheKey, key);
        }
        let user_id = parsed.top.get("metadata").and_then(RawObject::parse).and_then(|m| m.str("user_id"));
        if let Some(session) = user_id.as_deref().and_then(session_from_user_id) {
            return (SessionSource::MetadataUserId, Cow::Owned(session));
        }
        (SessionSource::Fingerprint, Cow::Owned(fingerprint(parsed)))
    }
}

/// The API key a Gemini request may carry in its query (`?key=…`), as sent (never decoded: only
/// its keyed hash is kept, and the same key is always sent the same way).
fn query_key(query: Option<&str>) -> Option<&[u8]> {
    query?.split('&').find_map(|pair| pair.strip_prefix("key=")).filter(|key| !key.is_empty()).map(str::as_bytes)
}

/// The session part of a key: a hash of where the id came from and the id, the same in every
/// tenant. The admin API finds an agent's sessions from it, so no store keeps the raw id.
pub fn session_hash(source: SessionSource, id: &str) -> String {
    crate::hex::u128(session_digest(source, id))
}

/// The hash of `source\0id`, streamed: equal to the one-shot hash of the joined text, without
/// building it.
fn session_digest(source: SessionSource, id: &str) -> u128 {
    let mut hasher = Xxh3::new();
    hasher.update(source.as_str().as_bytes());
    hasher.update(b"\0");
    hasher.update(id.as_bytes());
    hasher.digest128()
}

/// The session hashes an id an agent shows (Claude Code's or Codex's session id) may have: as a
/// session header, a `prompt_cache_key`, or the session in `metadata.user_id`.
pub fn agent_session_hashes(id: &str) -> Vec<(SessionSource, String)> {
    let id = id.trim();
    [SessionSource::Header, SessionSource::PromptCacheKey, SessionSource::MetadataUserId]
        .into_iter()
        .map(|source| (source, session_hash(source, id)))
        .collect()
}

/// Hex digits of a tenant hash.
const TENANT_LEN: usize = 24;

/// Credentials whose tenant hash is remembered; past this the cache starts again (a proxy in
/// front of a few agents' keys never gets there).
const MAX_CACHED_TENANTS: usize = 4096;

/// A tenant hash: 24 lower-case hex digits.
#[derive(Clone, Copy)]
struct TenantHash([u8; TENANT_LEN]);

impl std::ops::Deref for TenantHash {
    type Target = str;

    fn deref(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or("000000000000000000000000")
    }
}

/// Claude Code's `metadata.user_id`: legacy `user_<hash>_account_<uuid>_session_<uuid>`, or a JSON
/// string `{"device_id":…,"account_uuid":…,"session_id":…}`.
pub fn session_from_user_id(user_id: &str) -> Option<String> {
    if user_id.trim_start().starts_with('{') {
        let value: serde_json::Value = serde_json::from_str(user_id).ok()?;
        return value.get("session_id")?.as_str().filter(|s| !s.is_empty()).map(str::to_string);
    }
    let (_, session) = user_id.rsplit_once("_session_")?;
    (!session.is_empty()).then(|| session.to_string())
}

/// A fingerprint of the conversation's opening, the session id of requests that carry none.
pub fn fingerprint(parsed: &ParsedRequest) -> String {
    fingerprint_of(&opening(parsed))
}

fn fingerprint_of(opening: &Xxh3) -> String {
    crate::hex::u128(opening.digest128())
}

/// The line Claude Code adds to its system prompt, different on every request.
const BILLING_LINE: &str = "x-anthropic-billing-header:";

/// How Gemini CLI's first user turn opens its per-turn part: today's date, the OS and a listing of
/// the workspace, which changes as files appear. Not part of the conversation's opening.
pub const SESSION_CONTEXT: &str = "<session_context>";

/// What a conversation shares from its first request to its last: the system prompt that comes
/// before the first user message, and that message's text. Lines and parts that change on every
/// request (Claude Code's billing header, Gemini CLI's `<session_context>`) are left out; so are `cache_control` markers, attachments and
/// everything later in the history, which grows.
fn opening(parsed: &ParsedRequest) -> Xxh3 {
    use crate::conversation::{Kind, Role};
    // Hashed as it is read (the streaming hash equals the hash of the whole text): a system
    // prompt of tens of kilobytes is never copied.
    let mut opening = Xxh3::new();
    let system = |opening: &mut Xxh3, text: &str| {
        for line in text.lines().filter(|line| !line.trim_start().starts_with(BILLING_LINE)) {
            opening.update(line.as_bytes());
            opening.update(b"\n");
        }
    };
    parsed.top_system.iter().for_each(|text| system(&mut opening, text));
    let items = &parsed.conversation.items;
    let first_user = parsed.messages.iter().position(|m| m.role == Role::User);
    for item in items.iter().filter(|item| first_user.is_none_or(|first| item.message < first)) {
        if let Kind::System { text } = &item.kind {
            system(&mut opening, text);
        }
    }
    opening.update(b"\0");
    for item in items.iter().filter(|item| Some(item.message) == first_user) {
        if let Kind::Text { role: Role::User, text } = &item.kind
            && !text.trim_start().starts_with(SESSION_CONTEXT)
        {
            opening.update(text.as_bytes());
            opening.update(b"\n");
        }
    }
    opening
}

/// One conversation inside a session: a short hash of its opening (see [`opening`]). An agent's
/// main loop, each of its subagents and each side request (a title, a summary) open differently,
/// so each gets its own compaction lock, records and breaker.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConversationId(String);

impl ConversationId {
    pub fn of(parsed: &ParsedRequest) -> Self {
        Self::from_opening(&opening(parsed))
    }

    fn from_opening(opening: &Xxh3) -> Self {
        Self(crate::hex::u64(opening.digest()))
    }

    /// An id as the admin API or the store gives it back; `None` when it is not one.
    pub fn parse(text: &str) -> Option<Self> {
        (text.len() == 16 && text.bytes().all(|b| b.is_ascii_hexdigit())).then(|| Self(text.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ConversationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::{Dialect, ParsedRequest};
    use http::HeaderValue;
    use xxhash_rust::xxh3::xxh3_128;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn the_admin_lookup_hashes_an_agent_id_as_a_request_carrying_it_is_keyed() {
        let identifier = Identifier::new("x-session-id", "secret");
        let key = identifier.identify(&headers(&[("x-session-id", "abc-123"), ("x-api-key", "k")]), None);
        let hashes = agent_session_hashes(" abc-123 ");
        assert_eq!(hashes[0].0, SessionSource::Header);
        assert_eq!(key.key.split_once('.').unwrap().1, hashes[0].1);
    }

    #[test]
    fn claude_code_user_id_yields_its_session_in_both_forms() {
        assert_eq!(
            session_from_user_id("user_abc123_account_11111111-2222_session_33333333-4444").as_deref(),
            Some("33333333-4444")
        );
        assert_eq!(
            session_from_user_id(r#"{"device_id":"d","account_uuid":"a","session_id":"s-1"}"#).as_deref(),
            Some("s-1")
        );
        assert_eq!(session_from_user_id("user_only"), None);
    }

    #[test]
    fn the_same_session_id_under_two_keys_is_two_sessions() {
        let id = Identifier::new("x-session-id", "secret");
        let a = id.identify(&headers(&[("x-session-id", "s1"), ("authorization", "Bearer key-a")]), None);
        let b = id.identify(&headers(&[("x-session-id", "s1"), ("x-api-key", "key-b")]), None);
        let a2 = id.identify(&headers(&[("x-session-id", "s1"), ("authorization", "Bearer key-a")]), None);
        assert_ne!(a, b);
        assert_eq!(a, a2);
        assert!(!a.key.contains("key-a"));
    }

    #[test]
    fn agent_headers_are_recognized_after_the_configured_one() {
        let id = Identifier::new("x-my-session", "");
        let mine = id.identify(&headers(&[("x-my-session", "m"), ("session_id", "c")]), None);
        let codex = id.identify(&headers(&[("session_id", "c")]), None);
        let codex_dash = id.identify(&headers(&[("session-id", "c")]), None);
        assert_ne!(mine, codex);
        assert_eq!(codex, codex_dash);
        assert_eq!(codex.source, SessionSource::Header);
    }

    #[test]
    fn the_fingerprint_ignores_the_per_request_billing_header() {
        let body = |cch: &str| {
            format!(
                r#"{{"model":"claude-sonnet-4-5","system":[{{"type":"text","text":"x-anthropic-billing-header: cc_version=2.0.14; cc_entrypoint=cli; cch={cch}"}},{{"type":"text","text":"You are Claude Code."}}],"messages":[{{"role":"user","content":"fix the bug"}}]}}"#
            )
        };
        let id = Identifier::new("x-session-id", "");
        let (one, two) = (body("aaaaa"), body("bbbbb"));
        let first = ParsedRequest::parse(Dialect::AnthropicMessages, one.as_bytes()).unwrap();
        let second = ParsedRequest::parse(Dialect::AnthropicMessages, two.as_bytes()).unwrap();
        let a = id.identify(&HeaderMap::new(), Some(&first));
        assert_eq!(a, id.identify(&HeaderMap::new(), Some(&second)));
        assert_eq!(a.source, SessionSource::Fingerprint);
    }

    /// A Claude Code request: the billing line, `system` blocks, and `messages` with the newest
    /// block marked for caching, as Claude Code sends them.
    fn claude_code(cch: &str, system: &str, messages: serde_json::Value) -> String {
        let mut messages = messages;
        if let Some(block) = messages
            .as_array_mut()
            .and_then(|m| m.last_mut())
            .and_then(|m| m["content"].as_array_mut())
            .and_then(|c| c.last_mut())
        {
            block["cache_control"] = serde_json::json!({"type": "ephemeral"});
        }
        serde_json::json!({
            "model": "claude-sonnet-4-5",
            "metadata": {"user_id": "user_abc_account_11111111_session_22222222"},
            "system": [
                {"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1.197.e4f; cc_entrypoint=cli; cch={cch};")},
                {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
                {"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}
            ],
            "messages": messages
        })
        .to_string()
    }

    fn ids(body: &str) -> (SessionKey, ConversationId) {
        let parsed = ParsedRequest::parse(Dialect::AnthropicMessages, body.as_bytes()).unwrap();
        let headers = headers(&[("x-claude-code-session-id", "22222222"), ("x-api-key", "k")]);
        (Identifier::new("x-session-id", "").identify(&headers, Some(&parsed)), ConversationId::of(&parsed))
    }

    fn user(blocks: &[&str]) -> serde_json::Value {
        let content: Vec<serde_json::Value> =
            blocks.iter().map(|text| serde_json::json!({"type": "text", "text": text})).collect();
        serde_json::json!({"role": "user", "content": content})
    }

    const MAIN_PROMPT: &str = "You are an interactive CLI tool that helps users with software engineering tasks.";
    const REMINDER: &str = "<system-reminder>\nAs you answer the user's questions, you can use the following context: CLAUDE.md says run cargo test.\n</system-reminder>";

    #[test]
    fn a_conversation_keeps_its_id_as_it_grows_whatever_the_billing_line_and_cache_markers_say() {
        let first = serde_json::json!([user(&[REMINDER, "Add streaming to the exporter."])]);
        let grown = serde_json::json!([
            user(&[REMINDER, "Add streaming to the exporter."]),
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "fn main() {}"}]},
            {"role": "system", "content": "A system entry later in the history."},
            user(&["Good, now the tests."])
        ]);
        let (session, opened) = ids(&claude_code("aaaaa", MAIN_PROMPT, first));
        let (same_session, later) = ids(&claude_code("bbbbb", MAIN_PROMPT, grown));
        assert_eq!(session, same_session);
        assert_eq!(opened, later, "the billing line, the moved cache marker and the newer turns change nothing");
        assert_eq!(opened.as_str().len(), 16);
        assert_eq!(ConversationId::parse(opened.as_str()), Some(opened.clone()));
        assert_eq!(ConversationId::parse("not-an-id"), None);
    }

    #[test]
    fn a_claude_code_task_subagent_is_another_conversation_of_the_same_session() {
        let subagent_prompt = "You are an agent for Claude Code, Anthropic's official CLI for Claude. Given the user's message, you should use the tools available to complete the task.";
        let (session, parent) = ids(&claude_code(
            "aaaaa",
            MAIN_PROMPT,
            serde_json::json!([user(&[REMINDER, "Add streaming to the exporter."])]),
        ));
        let (sub_session, search) = ids(&claude_code(
            "ccccc",
            subagent_prompt,
            serde_json::json!([user(&["Find every caller of export_session."])]),
        ));
        let (_, review) = ids(&claude_code(
            "ddddd",
            subagent_prompt,
            serde_json::json!([user(&["Review the diff of the exporter."])]),
        ));
        assert_eq!(session, sub_session, "a subagent runs under its parent's session id");
        assert_ne!(parent, search);
        assert_ne!(search, review, "two subagents of one kind differ by their task");
        // First messages that open with the same reminder block differ by the rest.
        let (_, other_task) =
            ids(&claude_code("eeeee", MAIN_PROMPT, serde_json::json!([user(&[REMINDER, "Fix the flaky test."])])));
        assert_ne!(parent, other_task);
    }

    #[test]
    fn session_keys_are_the_keyed_tenant_hash_and_the_hash_of_source_and_id_as_before() {
        let id = Identifier::new("x-session-id", "secret");
        let sent = headers(&[("x-session-id", " abc "), ("authorization", "Bearer sk-1")]);
        let secret = blake3::derive_key("compactor tenant hash v1", b"secret");
        let tenant = blake3::keyed_hash(&secret, b"sk-1").to_hex()[..24].to_string();
        let session = xxh3_128(b"header\0abc");
        let expected = format!("{tenant}.{session:032x}");
        assert_eq!(id.identify(&sent, None).key, expected);
        assert_eq!(id.identify(&sent, None).key, expected, "the cached tenant hash is the same");
        let other = headers(&[("x-session-id", "abc"), ("authorization", "Bearer sk-2")]);
        assert_ne!(id.identify(&other, None).key, expected, "another credential, another tenant");
        assert!(id.identify(&headers(&[("x-session-id", "abc")]), None).key.starts_with("anonymous."));
    }

    #[test]
    fn the_session_and_conversation_from_one_hash_of_the_opening_are_those_of_two() {
        let id = Identifier::new("x-session-id", "");
        let body =
            r#"{"model":"gpt-4o","messages":[{"role":"system","content":"be terse"},{"role":"user","content":"hi"}]}"#;
        let parsed = ParsedRequest::parse(Dialect::ChatCompletions, body.as_bytes()).unwrap();
        for sent in [headers(&[("authorization", "Bearer k")]), headers(&[("x-session-id", "s1")])] {
            let (session, conversation) = id.identify_conversation(&sent, None, &parsed);
            assert_eq!(session, id.identify(&sent, Some(&parsed)));
            assert_eq!(conversation, ConversationId::of(&parsed));
        }
    }

    #[test]
    fn prompt_cache_key_and_metadata_identify_sessions_without_headers() {
        let id = Identifier::new("x-session-id", "");
        let body = r#"{"model":"gpt-4o","prompt_cache_key":"conv-9","messages":[{"role":"user","content":"hi"}]}"#;
        let parsed = ParsedRequest::parse(Dialect::ChatCompletions, body.as_bytes()).unwrap();
        assert_eq!(id.identify(&HeaderMap::new(), Some(&parsed)).source, SessionSource::PromptCacheKey);
        let body = r#"{"model":"claude","metadata":{"user_id":"user_x_account_y_session_z"},"messages":[{"role":"user","content":"hi"}]}"#;
        let parsed = ParsedRequest::parse(Dialect::AnthropicMessages, body.as_bytes()).unwrap();
        assert_eq!(id.identify(&HeaderMap::new(), Some(&parsed)).source, SessionSource::MetadataUserId);
    }

    #[test]
    fn the_opening_hashes_are_those_of_the_system_lines_then_the_first_user_text() {
        // Keys already stored (Redis) were made from these exact bytes: they must not move.
        let body = r#"{"model":"claude-sonnet-4-5","system":"You are terse.\nx-anthropic-billing-header: cch=1\nBe kind.","messages":[{"role":"user","content":"fix the bug"},{"role":"assistant","content":"ok"}]}"#;
        let parsed = ParsedRequest::parse(Dialect::AnthropicMessages, body.as_bytes()).unwrap();
        let opening = "You are terse.\nBe kind.\n\0fix the bug\n";
        assert_eq!(
            ConversationId::of(&parsed).as_str(),
            format!("{:016x}", xxhash_rust::xxh3::xxh3_64(opening.as_bytes()))
        );
        assert_eq!(fingerprint(&parsed), format!("{:032x}", xxh3_128(opening.as_bytes())));
    }
}
