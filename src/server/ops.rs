//! compactor's own endpoints: liveness, readiness and Prometheus metrics. They never reach upstream.

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};

use super::AppState;
use crate::proxy::ResponseBody;

/// Answers `/healthz`, `/readyz` and `/metrics`; `None` for every other request.
pub fn answer<B>(state: &AppState, request: &Request<B>) -> Option<Response<ResponseBody>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return None;
    }
    match request.uri().path() {
        "/healthz" => Some(json(StatusCode::OK, r#"{"status":"ok"}"#.to_string())),
        "/readyz" => Some(if state.is_ready() {
            json(StatusCode::OK, r#"{"status":"ready"}"#.to_string())
        } else {
            json(StatusCode::SERVICE_UNAVAILABLE, r#"{"status":"shutting_down"}"#.to_string())
        }),
        "/metrics" => {
            let text = match &state.metrics {
                Some(handle) => handle.render(),
                None => String::new(),
            };
            let mut response = Response::new(ResponseBody::full(text));
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
            Some(response)
        }
        _ => None,
    }
}

fn json(status: StatusCode, body: String) -> Response<ResponseBody> {
    let mut response = Response::new(ResponseBody::full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
