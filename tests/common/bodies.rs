//! Request bodies and texts the tests send.

/// A small chat completions body.
pub fn chat_body(stream: bool) -> String {
    format!(
        r#"{{"model":"gpt-4o","messages":[{{"role":"system","content":"You are terse."}},{{"role":"user","content":"Say hello"}}],"temperature":0.10000000000000001,"stream":{stream}}}"#
    )
}

/// A small Anthropic messages body.
pub fn messages_body(stream: bool) -> String {
    format!(
        r#"{{"model":"claude-sonnet-4-5","max_tokens":32000,"system":[{{"type":"text","text":"You are terse.","cache_control":{{"type":"ephemeral"}}}}],"messages":[{{"role":"user","content":"Say hello"}}],"stream":{stream}}}"#
    )
}

/// About `tokens` tokens of distinct text, for a tool output.
pub fn tool_output(tag: &str, tokens: usize) -> String {
    (0..tokens / 6).map(|i| format!("{tag} line {i} ok\n")).collect()
}

/// Lines from `line(0)`, `line(1)`, ... until the text has at least `chars` characters.
pub fn lines_until(chars: usize, line: impl Fn(usize) -> String) -> String {
    let mut out = String::new();
    let mut i = 0;
    while out.len() < chars {
        out.push_str(&line(i));
        i += 1;
    }
    out
}

/// A chat request whose many tool outputs (distinct text, `bytes` in all) take compactor a long
/// time to count in a debug build.
pub fn chat_with_many_outputs(bytes: usize) -> String {
    let mut messages = vec![serde_json::json!({"role": "user", "content": "Run every test."})];
    let mut i = 0;
    let mut size = 0;
    while size < bytes {
        let id = format!("call_{i}");
        let output = tool_output(&format!("suite {i} test"), 3_000);
        size += output.len();
        messages.push(serde_json::json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "run", "arguments": "{}"}}]}));
        messages.push(serde_json::json!({"role": "tool", "tool_call_id": id, "content": output}));
        i += 1;
    }
    serde_json::json!({"model": "gpt-4o", "messages": messages}).to_string()
}

/// Whether `text` is the default placeholder of a pruned output of tool `tool` called with
/// `args` (as compactor shows them: on one line, cut to 100 characters).
pub fn cleared(text: &str, tool: &str, args: &str) -> bool {
    text.starts_with(&format!("[Old tool result content cleared: {tool} {args} ("))
        && text.ends_with(" tokens). Call the tool again to see its current output.]")
}
