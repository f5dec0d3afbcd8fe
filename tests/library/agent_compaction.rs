//! Every agent's own compaction request (and OpenCode's title request), with the prompt text of the
//! agent's published package, is recognized by the default markers; no ordinary agent request is.

use compactor::compaction::agent::{AgentMarkers, DEFAULT_MARKERS, is_agent_compaction};
use compactor::dialect::{Dialect, ParsedRequest};

fn markers() -> AgentMarkers {
    AgentMarkers::new(&DEFAULT_MARKERS)
}

/// `(file name, dialect, body)` of every `.json` file in a fixture folder whose dialect `dialect_of`
/// can tell from its name.
fn bodies(folder: &str, dialect_of: fn(&str) -> Option<Dialect>) -> Vec<(String, Dialect, Vec<u8>)> {
    let dir = format!("{}/tests/fixtures/{folder}", env!("CARGO_MANIFEST_DIR"));
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?.to_string();
            let dialect = dialect_of(&name)?;
            Some((name, dialect, std::fs::read(&path).unwrap()))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Agent fixtures are named `<agent>-<request>.<chat|messages|responses>.json`.
fn agent_dialect(name: &str) -> Option<Dialect> {
    match name.strip_suffix(".json")?.rsplit('.').next()? {
        "chat" => Some(Dialect::ChatCompletions),
        "messages" => Some(Dialect::AnthropicMessages),
        "responses" => Some(Dialect::Responses),
        _ => None,
    }
}

/// Conversation fixtures are named after their API: `openai_…`, `anthropic_…`, `responses_…`.
fn conversation_dialect(name: &str) -> Option<Dialect> {
    if !name.ends_with(".json") {
        return None;
    }
    match name.split('_').next()? {
        "openai" => Some(Dialect::ChatCompletions),
        "anthropic" => Some(Dialect::AnthropicMessages),
        "responses" => Some(Dialect::Responses),
        _ => None,
    }
}

#[test]
fn every_agents_own_compaction_request_is_recognized() {
    let fixtures = bodies("agents", agent_dialect);
    assert!(fixtures.len() >= 11, "expected the agent fixtures, found {}", fixtures.len());
    let markers = markers();
    let missed: Vec<&str> = fixtures
        .iter()
        .filter(|(name, dialect, body)| {
            let parsed = ParsedRequest::parse(*dialect, body).unwrap_or_else(|| panic!("{name} does not parse"));
            !is_agent_compaction(&parsed, &markers)
        })
        .map(|(name, _, _)| name.as_str())
        .collect();
    assert!(missed.is_empty(), "not recognized as the agent's own compaction: {missed:?}");
}

#[test]
fn every_marker_recognizes_a_fixture_on_its_own_unless_its_agent_is_not_on_npm() {
    // A marker no real request needs is dead weight, or one that matches by luck. The exceptions
    // come from agents not published on npm (aider, the Cline/Roo Code VS Code extensions) and
    // from Claude Code's older /compact request.
    let without_fixture = [
        "provide a detailed prompt for continuing our conversation above",
        "briefly summarize this partial conversation about programming",
        "condense the conversation",
        "summarize the conversation so far in a way that",
    ];
    let fixtures = bodies("agents", agent_dialect);
    let unused: Vec<&str> = DEFAULT_MARKERS
        .iter()
        .copied()
        .filter(|marker| !without_fixture.contains(marker))
        .filter(|marker| {
            !fixtures.iter().any(|(_, dialect, body)| {
                let parsed = ParsedRequest::parse(*dialect, body).unwrap();
                is_agent_compaction(&parsed, &AgentMarkers::new(&[marker]))
            })
        })
        .collect();
    assert!(unused.is_empty(), "markers no fixture needs: {unused:?}");
}

#[test]
fn ordinary_agent_requests_are_not_taken_for_compaction() {
    let conversations = bodies("conversations", conversation_dialect);
    assert!(conversations.len() >= 8, "expected the conversation fixtures, found {}", conversations.len());
    let markers = markers();
    let mut parsed_any = 0;
    for (name, dialect, body) in &conversations {
        let Some(parsed) = ParsedRequest::parse(*dialect, body) else { continue };
        parsed_any += 1;
        assert!(!is_agent_compaction(&parsed, &markers), "{name} was taken for an agent's own compaction");
    }
    assert!(parsed_any >= 8, "only {parsed_any} conversation fixtures parsed");
}
