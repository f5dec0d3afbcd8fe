#!/usr/bin/env python3
"""End-to-end checks of compactor driven by the official `openai` and `anthropic` Python SDKs.

Each case uses the SDKs exactly as a user's code would, pointed at compactor, and asserts what the
user sees. Run by tests/sdk_e2e.rs against a compactor in front of the test suite's fake upstream;
it can also be pointed at any compactor by hand:

    .venv-sdk/bin/python tests/sdk/e2e.py \
        --openai-base-url http://127.0.0.1:8787/v1 --anthropic-base-url http://127.0.0.1:8787

Prints `PASS name` or `FAIL name: reason` per case, then `sdk: N passed, M failed`; exits 1 when
any case failed. The fake upstream answers 429 for the model named "rate-limited". The
`unreachable` cases need `--dead-openai-base-url` / `--dead-anthropic-base-url`: a compactor whose
upstreams are down; without them those cases are skipped (`SKIP name: reason`).
"""

import argparse
import sys
import traceback
import warnings

import anthropic
import openai

API_KEY = "sk-test"
TIMEOUT = 10.0
RATE_LIMITED = "rate-limited"
OPENAI_MODEL = "gpt-4o"
RESPONSES_MODEL = "gpt-5-codex"
ANTHROPIC_MODEL = "claude-sonnet-4-5"
# Azure OpenAI: the deployment the SDK puts in the path (`model=` names it), and an API version.
AZURE_DEPLOYMENT = "team-gpt-4o"
AZURE_API_VERSION = "2024-10-21"

# The fake upstream does not care which model; the anthropic SDK warns about retired model names.
warnings.filterwarnings("ignore", message=r"The model .* is deprecated")

WEATHER_TOOL_OPENAI = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

WEATHER_TOOL_ANTHROPIC = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


class Skip(Exception):
    """The case cannot run with the arguments given."""


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def openai_client(base_url):
    return openai.OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0, timeout=TIMEOUT)


def anthropic_client(base_url):
    return anthropic.Anthropic(base_url=base_url, api_key=API_KEY, max_retries=0, timeout=TIMEOUT)


def dead_url(args, which):
    url = getattr(args, f"dead_{which}_base_url")
    if not url:
        raise Skip(f"needs --dead-{which}-base-url")
    return url


# --- OpenAI Chat Completions -------------------------------------------------------------------


def openai_chat(args):
    completion = openai_client(args.openai_base_url).chat.completions.create(
        model=OPENAI_MODEL,
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello"},
        ],
    )
    content = completion.choices[0].message.content
    check(content == "Hello", f"message content {content!r}")
    check(completion.usage is not None and completion.usage.prompt_tokens == 12, f"usage {completion.usage!r}")


def openai_chat_stream(args):
    stream = openai_client(args.openai_base_url).chat.completions.create(
        model=OPENAI_MODEL,
        messages=[{"role": "user", "content": "Say hello"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text = ""
    usage = None
    with stream:
        for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
            if chunk.usage is not None:
                usage = chunk.usage
    check(text == "Hello", f"concatenated deltas {text!r}")
    check(usage is not None and usage.prompt_tokens == 12, f"usage chunk {usage!r}")


def openai_chat_tools(args):
    completion = openai_client(args.openai_base_url).chat.completions.create(
        model=OPENAI_MODEL,
        tools=[WEATHER_TOOL_OPENAI],
        messages=[
            {"role": "user", "content": "What's the weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"},
        ],
    )
    content = completion.choices[0].message.content
    check(content == "Hello", f"message content {content!r}")


# --- OpenAI Responses --------------------------------------------------------------------------


def openai_responses(args):
    response = openai_client(args.openai_base_url).responses.create(model=RESPONSES_MODEL, input="Say hello")
    check(response.output_text == "Hello", f"output_text {response.output_text!r}")
    check(response.usage is not None and response.usage.input_tokens == 12, f"usage {response.usage!r}")


def openai_responses_stream(args):
    client = openai_client(args.openai_base_url)
    deltas = []
    with client.responses.stream(model=RESPONSES_MODEL, input="Say hello") as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    text = "".join(deltas)
    check(text == "Hello", f"concatenated output_text deltas {text!r}")
    check(final.usage is not None and final.usage.input_tokens == 12, f"final usage {final.usage!r}")
    check(final.output_text == "Hello", f"final output_text {final.output_text!r}")

    # The raw event stream, without the helper's accumulation.
    events = client.responses.create(model=RESPONSES_MODEL, input="Say hello", stream=True)
    types = []
    with events:
        for event in events:
            types.append(event.type)
    check(types[-1:] == ["response.completed"], f"raw stream event types {types!r}")


# --- Azure OpenAI ------------------------------------------------------------------------------


def azure_client(endpoint):
    if not endpoint:
        raise Skip("needs --azure-endpoint")
    return openai.AzureOpenAI(
        azure_endpoint=endpoint, api_key=API_KEY, api_version=AZURE_API_VERSION, max_retries=0, timeout=TIMEOUT
    )


def azure_chat(args):
    completion = azure_client(args.azure_endpoint).chat.completions.create(
        model=AZURE_DEPLOYMENT,
        messages=[{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello"}],
    )
    content = completion.choices[0].message.content
    check(content == "Hello", f"message content {content!r}")
    check(completion.usage is not None and completion.usage.prompt_tokens == 12, f"usage {completion.usage!r}")


def azure_chat_stream(args):
    stream = azure_client(args.azure_endpoint).chat.completions.create(
        model=AZURE_DEPLOYMENT,
        messages=[{"role": "user", "content": "Say hello"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text = ""
    with stream:
        for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
    check(text == "Hello", f"concatenated deltas {text!r}")


def azure_responses(args):
    response = azure_client(args.azure_endpoint).responses.create(model=AZURE_DEPLOYMENT, input="Say hello")
    check(response.output_text == "Hello", f"output_text {response.output_text!r}")


def azure_no_upstream(args):
    """Without an Azure upstream, the SDK gets compactor's 404 in OpenAI's shape; nothing is sent."""
    if not args.azure_unset_endpoint:
        raise Skip("needs --azure-unset-endpoint")
    client = azure_client(args.azure_unset_endpoint)
    error = expect_raise(
        openai.NotFoundError,
        lambda: client.chat.completions.create(model=AZURE_DEPLOYMENT, messages=[{"role": "user", "content": "hi"}]),
    )
    check(error.code == "no_upstream", f"code {error.code!r}")
    check("upstream.azure" in error.message, f"message {error.message!r}")
    header = error.response.headers.get("x-compactor-error")
    check(header == "no_upstream", f"x-compactor-error {header!r}")


# --- Anthropic Messages ------------------------------------------------------------------------


def anthropic_messages(args):
    message = anthropic_client(args.anthropic_base_url).messages.create(
        model=ANTHROPIC_MODEL,
        max_tokens=1024,
        system="You are terse.",
        messages=[{"role": "user", "content": "Say hello"}],
    )
    check(message.content[0].type == "text", f"content[0] {message.content[0]!r}")
    check(message.content[0].text == "Hello", f"content[0].text {message.content[0].text!r}")
    check(message.usage.input_tokens == 12, f"usage {message.usage!r}")
    request_id = getattr(message, "_request_id", None)
    check(request_id == "req_1", f"_request_id {request_id!r} (upstream request-id header)")


def anthropic_messages_stream(args):
    client = anthropic_client(args.anthropic_base_url)
    with client.messages.stream(
        model=ANTHROPIC_MODEL,
        max_tokens=1024,
        messages=[{"role": "user", "content": "Say hello"}],
    ) as stream:
        deltas = list(stream.text_stream)
        text = stream.get_final_text()
        final = stream.get_final_message()
    check(text == "Hello", f"get_final_text() {text!r}")
    check("".join(deltas) == "Hello", f"text_stream {deltas!r}")
    check(final.stop_reason == "end_turn", f"stop_reason {final.stop_reason!r}")
    check(final.usage.output_tokens == 2, f"usage {final.usage!r}")


def anthropic_tools(args):
    message = anthropic_client(args.anthropic_base_url).messages.create(
        model=ANTHROPIC_MODEL,
        max_tokens=1024,
        tools=[WEATHER_TOOL_ANTHROPIC],
        messages=[
            {"role": "user", "content": "What's the weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C and sunny"}],
            },
        ],
    )
    check(message.content[0].text == "Hello", f"content[0].text {message.content[0].text!r}")


# --- Errors ------------------------------------------------------------------------------------


def expect_raise(error_class, call):
    try:
        result = call()
    except error_class as error:
        return error
    except Exception as error:  # noqa: BLE001 - report what was raised instead
        raise AssertionError(f"expected {error_class.__module__}.{error_class.__name__}, got {error!r}") from error
    raise AssertionError(f"expected {error_class.__module__}.{error_class.__name__}, got a result: {result!r}")


def openai_rate_limit(args):
    client = openai_client(args.openai_base_url)
    error = expect_raise(
        openai.RateLimitError,
        lambda: client.chat.completions.create(model=RATE_LIMITED, messages=[{"role": "user", "content": "hi"}]),
    )
    check(error.status_code == 429, f"status {error.status_code}")
    check(error.code == "rate_limit_exceeded", f"code {error.code!r}, body {error.body!r}")
    check(error.response.headers.get("retry-after") == "20", f"retry-after {error.response.headers.get('retry-after')!r}")
    check(error.response.headers.get("x-compactor-error") is None, "an upstream error marked as compactor's own")


def anthropic_rate_limit(args):
    client = anthropic_client(args.anthropic_base_url)
    error = expect_raise(
        anthropic.RateLimitError,
        lambda: client.messages.create(
            model=RATE_LIMITED, max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        ),
    )
    check(error.status_code == 429, f"status {error.status_code}")
    check(error_type(error.body) == "rate_limit_error", f"body {error.body!r}")
    check(error.response.headers.get("retry-after") == "20", f"retry-after {error.response.headers.get('retry-after')!r}")
    check(error.response.headers.get("x-compactor-error") is None, "an upstream error marked as compactor's own")


def error_type(body):
    """`error.type` of an Anthropic error body."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return body["error"].get("type")
    return None


def openai_unreachable(args):
    client = openai_client(dead_url(args, "openai"))
    error = expect_raise(
        openai.APIStatusError,
        lambda: client.chat.completions.create(model=OPENAI_MODEL, messages=[{"role": "user", "content": "hi"}]),
    )
    check(error.status_code == 502, f"status {error.status_code}")
    check("upstream_unreachable" in f"{error.body} {error.message}", f"body {error.body!r}, message {error.message!r}")
    check(error.code == "upstream_unreachable", f"code {error.code!r}")
    header = error.response.headers.get("x-compactor-error")
    check(header == "upstream_unreachable", f"x-compactor-error {header!r}")

    # The Responses API on the same route family says the same.
    error = expect_raise(openai.APIStatusError, lambda: client.responses.create(model=RESPONSES_MODEL, input="hi"))
    check(error.status_code == 502, f"responses status {error.status_code}")
    check(error.code == "upstream_unreachable", f"responses code {error.code!r}")


def anthropic_unreachable(args):
    client = anthropic_client(dead_url(args, "anthropic"))
    error = expect_raise(
        anthropic.APIStatusError,
        lambda: client.messages.create(model=ANTHROPIC_MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}]),
    )
    check(error.status_code == 502, f"status {error.status_code}")
    check(error_type(error.body) == "api_error", f"body {error.body!r}")
    check(error.body.get("type") == "error", f"body {error.body!r}")
    header = error.response.headers.get("x-compactor-error")
    check(header == "upstream_unreachable", f"x-compactor-error {header!r}")

    # A stream that cannot start raises the same, at the start.
    def stream():
        with client.messages.stream(
            model=ANTHROPIC_MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        ) as events:
            return events.get_final_text()

    error = expect_raise(anthropic.APIStatusError, stream)
    check(error.status_code == 502, f"stream status {error.status_code}")
    check(error_type(error.body) == "api_error", f"stream body {error.body!r}")


CASES = {
    "openai-chat": openai_chat,
    "openai-chat-stream": openai_chat_stream,
    "openai-chat-tools": openai_chat_tools,
    "openai-responses": openai_responses,
    "openai-responses-stream": openai_responses_stream,
    "azure-chat": azure_chat,
    "azure-chat-stream": azure_chat_stream,
    "azure-responses": azure_responses,
    "azure-no-upstream": azure_no_upstream,
    "anthropic-messages": anthropic_messages,
    "anthropic-messages-stream": anthropic_messages_stream,
    "anthropic-tools": anthropic_tools,
    "openai-rate-limit": openai_rate_limit,
    "anthropic-rate-limit": anthropic_rate_limit,
    "openai-unreachable": openai_unreachable,
    "anthropic-unreachable": anthropic_unreachable,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--openai-base-url", required=True, help="e.g. http://127.0.0.1:8787/v1")
    parser.add_argument("--anthropic-base-url", required=True, help="e.g. http://127.0.0.1:8787")
    parser.add_argument("--dead-openai-base-url", help="a compactor whose upstream is down, with /v1")
    parser.add_argument("--dead-anthropic-base-url", help="a compactor whose upstream is down")
    parser.add_argument("--azure-endpoint", help="compactor's root URL with an Azure upstream")
    parser.add_argument("--azure-unset-endpoint", help="compactor's root URL with no Azure upstream")
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="run only this case (repeatable)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print a traceback for each failure")
    args = parser.parse_args()

    print(f"openai {openai.__version__}, anthropic {anthropic.__version__}, python {sys.version.split()[0]}")
    passed = failed = 0
    for name in args.case or CASES:
        try:
            CASES[name](args)
        except Skip as skip:
            print(f"SKIP {name}: {skip}")
        except Exception as error:  # noqa: BLE001 - every failure is reported, none stops the run
            failed += 1
            reason = str(error) if isinstance(error, AssertionError) else f"{type(error).__name__}: {error}"
            print(f"FAIL {name}: {reason}")
            if args.verbose:
                traceback.print_exc()
        else:
            passed += 1
            print(f"PASS {name}")
        sys.stdout.flush()
    print(f"sdk: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
