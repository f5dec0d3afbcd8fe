//! The one path rule: dot segments resolved and repeated slashes collapsed before a path is
//! routed, so the path routed is the path sent.

/// The one path rule: compactor routes the path it sends upstream, and sends it normalized. Dot
/// segments are resolved (`.` and `..`, percent-encoded ones too: `%2e%2e`), repeated slashes
/// collapsed; a trailing slash stays. `/v1/messages/../chat/completions` is routed and sent as
/// `/v1/chat/completions`, so no request is rewritten as one API and sent to another's upstream.
/// `None` when the path is already normal (the common case: nothing is allocated).
pub fn normalize_path(path: &str) -> Option<String> {
    let is_dot = |segment: &str| segment == "." || segment.eq_ignore_ascii_case("%2e");
    let is_dot_dot = |segment: &str| dots(segment) == Some(2);
    let segments = path.split('/').skip(1);
    let needs = path.contains("//")
        || !path.starts_with('/')
        || segments.clone().any(|segment| is_dot(segment) || is_dot_dot(segment));
    if !needs {
        return None;
    }
    let mut kept: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        if segment.is_empty() || is_dot(segment) {
            continue;
        }
        if is_dot_dot(segment) {
            kept.pop();
        } else {
            kept.push(segment);
        }
    }
    let mut normal = format!("/{}", kept.join("/"));
    let last = path.rsplit('/').next().unwrap_or("");
    if (path.ends_with('/') || is_dot(last) || is_dot_dot(last)) && !normal.ends_with('/') {
        normal.push('/');
    }
    Some(normal)
}

/// How many dots a segment made only of `.` and `%2e` (any case) spells; `None` for any other.
/// Read without allocating: every request's path goes through here.
pub(super) fn dots(segment: &str) -> Option<usize> {
    let mut rest = segment.as_bytes();
    let mut dots = 0;
    while !rest.is_empty() {
        rest = match rest {
            [b'.', tail @ ..] => tail,
            [b'%', b'2', e, tail @ ..] if e.eq_ignore_ascii_case(&b'e') => tail,
            _ => return None,
        };
        dots += 1;
    }
    Some(dots)
}
