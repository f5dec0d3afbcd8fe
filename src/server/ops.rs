//! compactor's own endpoints: liveness, readiness, Prometheus metrics and the admin API. They never
//! reach the upstream.

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};

use super::AppState;
use crate::error::{Chain, ProxyError};
use crate::proxy::ResponseBody;
use crate::route::ApiFamily;
use crate::route::query_value;
use crate::session::Store;
use crate::session::identify::agent_session_hashes;

/// Answers compactor's own paths; `None` for every request meant for the upstream.
pub async fn answer<B>(state: &AppState, request: &Request<B>) -> Option<Response<ResponseBody>> {
    let path = request.uri().path();
    if let Some(rest) = path.strip_prefix("/admin/") {
        // Boxed, as below: every request's future holds this one's room otherwise, and is moved.
        return Some(Box::pin(admin(state, request, rest)).await);
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return None;
    }
    match path {
        "/healthz" => Some(json(StatusCode::OK, serde_json::json!({"status": "ok"}))),
        "/readyz" => Some(Box::pin(readiness(state)).await),
        "/metrics" => {
            state.proxy.record_cache_sizes();
            let text = state.metrics.as_ref().map(|handle| handle.render()).unwrap_or_default();
            let mut response = Response::new(ResponseBody::full(text));
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
            Some(response)
        }
        _ => None,
    }
}

/// Ready once started (the tokenizer tables loaded) and unless shutting down; a session store
/// that is down makes it degraded, not failing, because requests are still served without
/// stored state.
async fn readiness(state: &AppState) -> Response<ResponseBody> {
    if !state.is_ready() {
        return json(StatusCode::SERVICE_UNAVAILABLE, serde_json::json!({"status": "shutting_down"}));
    }
    if !state.is_started() {
        return json(StatusCode::SERVICE_UNAVAILABLE, serde_json::json!({"status": "starting"}));
    }
    let store = &state.store;
    let mut body = match store.health().await {
        Ok(()) => serde_json::json!({"status": "ready", "session_store": store.kind(), "store_status": "up"}),
        Err(error) => serde_json::json!({
            "status": "degraded",
            "session_store": store.kind(),
            "store_status": "down",
            "breaker": if store.breaker_open() { "open" } else { "closed" },
            "error": Chain(&ProxyError::from(error)).to_string()
        }),
    };
    // The upstreams priced as a local server because of their address, not their key.
    let local = &state.config.upstream.local_presets;
    if !local.is_empty() {
        body["local_presets"] =
            serde_json::json!(local.iter().map(|key| format!("upstream.{key}")).collect::<Vec<_>>());
    }
    json(StatusCode::OK, body)
}

/// `GET|DELETE /admin/sessions/{key}`: a session's stored state with its conversations, or
/// forgetting all of it; `POST /admin/sessions/{key}/compact`: compact on the session's next
/// request whose conversation has something to summarize.
async fn admin<B>(state: &AppState, request: &Request<B>, rest: &str) -> Response<ResponseBody> {
    let token = &state.config.admin.token;
    if token.is_empty() {
        return ProxyError::NotFound.into_response(ApiFamily::OpenAi);
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if !presented.is_some_and(|p| constant_time_eq(p.as_bytes(), token.expose().as_bytes())) {
        return ProxyError::Unauthorized.into_response(ApiFamily::OpenAi);
    }
    let store: &Store = &state.store;
    if rest == "sessions" {
        if request.method() != Method::GET {
            return ProxyError::MethodNotAllowed { allow: "GET" }.into_response(ApiFamily::OpenAi);
        }
        let id = request.uri().query().and_then(|query| query_value(query, "id")).filter(|id| !id.trim().is_empty());
        let Some(id) = id else { return ProxyError::NotFound.into_response(ApiFamily::OpenAi) };
        return sessions_by_agent_id(store, &id).await;
    }
    if let Some(key) = rest.strip_prefix("sessions/").and_then(|k| k.strip_suffix("/compact")).filter(|k| valid_key(k))
    {
        if request.method() != Method::POST {
            return ProxyError::NotFound.into_response(ApiFamily::OpenAi);
        }
        return match store.request_compaction(key).await {
            Ok(false) => ProxyError::NotFound.into_response(ApiFamily::OpenAi),
            Ok(true) => {
                json(StatusCode::ACCEPTED, serde_json::json!({"session": key, "compact_on_next_request": true}))
            }
            Err(error) => ProxyError::from(error).into_response(ApiFamily::OpenAi),
        };
    }
    let Some(key) = rest.strip_prefix("sessions/").filter(|k| valid_key(k)) else {
        return ProxyError::NotFound.into_response(ApiFamily::OpenAi);
    };
    match *request.method() {
        Method::GET => match store.view(key).await {
            Ok(session) if session.is_empty() => ProxyError::NotFound.into_response(ApiFamily::OpenAi),
            Ok(session) => {
                json(StatusCode::OK, serde_json::json!({"session": key, "store": store.kind(), "state": session}))
            }
            Err(error) => ProxyError::from(error).into_response(ApiFamily::OpenAi),
        },
        Method::DELETE => match store.forget(key).await {
            Ok(existed) => json(StatusCode::OK, serde_json::json!({"session": key, "forgotten": existed})),
            Err(error) => ProxyError::from(error).into_response(ApiFamily::OpenAi),
        },
        _ => ProxyError::MethodNotAllowed { allow: "GET, DELETE" }.into_response(ApiFamily::OpenAi),
    }
}

/// `GET /admin/sessions?id=<agent session id>`: the sessions, in every tenant, of the id an agent
/// shows (sent as a session header, a `prompt_cache_key` or in `metadata.user_id`). Each entry
/// names its key (the tenant part is a keyed hash: no credential shows) and links to its state.
async fn sessions_by_agent_id(store: &Store, id: &str) -> Response<ResponseBody> {
    let mut sessions = Vec::new();
    for (source, hash) in agent_session_hashes(id) {
        let keys = match store.find(&hash).await {
            Ok(keys) => keys,
            Err(error) => return ProxyError::from(error).into_response(ApiFamily::OpenAi),
        };
        for key in keys {
            let view = match store.view(&key).await {
                Ok(view) => view,
                Err(error) => return ProxyError::from(error).into_response(ApiFamily::OpenAi),
            };
            if view.is_empty() {
                continue; // expired or forgotten since it was indexed
            }
            let tenant = key.split_once('.').map_or("", |(tenant, _)| tenant).to_string();
            sessions.push(serde_json::json!({
                "session": key,
                "tenant": tenant,
                "source": source.as_str(),
                "conversations": view.conversations.len(),
                "href": format!("/admin/sessions/{key}"),
            }));
        }
    }
    json(StatusCode::OK, serde_json::json!({"id": id, "store": store.kind(), "sessions": sessions}))
}

fn valid_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= 128 && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.')
}

/// Compares without an early exit, so the token cannot be guessed byte by byte from timing.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn json(status: StatusCode, body: serde_json::Value) -> Response<ResponseBody> {
    let mut response = Response::new(ResponseBody::full(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
