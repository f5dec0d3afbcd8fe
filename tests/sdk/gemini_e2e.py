#!/usr/bin/env python3
"""End-to-end checks of compactor driven by Google's official `google-genai` Python SDK.

Each case uses the SDK as a user's code would, pointed at compactor (`http_options.base_url`), and
asserts what the user sees. Run by tests/e2e/sdk_e2e.rs against a compactor in front of the test
suite's provider simulator (tests/common/provider/gemini.rs), which calls the first tool, with a
thought signature, when the last user text holds "[call-tool]". By hand:

    .venv-sdk/bin/python tests/sdk/gemini_e2e.py --base-url http://127.0.0.1:8787

Prints `PASS name` or `FAIL name: reason` per case, then `sdk: N passed, M failed`; exits 1 when
any case failed. The `unreachable` case needs `--dead-base-url` (a compactor whose Gemini upstream
is down); without it the case is skipped (`SKIP name: reason`).
"""

import argparse
import sys
import traceback

from google import genai
from google.genai import errors, types

API_KEY = "gemini-test-key"
MODEL = "gemini-2.5-flash"
# Gemini 3 refuses a current turn whose function call lost its thought signature.
SIGNED_MODEL = "gemini-3-pro-preview"
CALL_TOOL = "[call-tool]"

WEATHER = types.Tool(
    function_declarations=[
        types.FunctionDeclaration(
            name="get_weather",
            description="Current weather for a city.",
            parameters_json_schema={
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        )
    ]
)


class Skip(Exception):
    """The case cannot run with the arguments given."""


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def client(base_url):
    # Keep the client itself while calling: the SDK closes its connections when it is collected.
    options = types.HttpOptions(base_url=base_url, timeout=10_000)
    return genai.Client(api_key=API_KEY, http_options=options)


def plain(args):
    gemini = client(args.base_url)
    answer = gemini.models.generate_content(model=MODEL, contents="Say hello.")
    check(answer.text, f"no text: {answer}")
    usage = answer.usage_metadata
    check(usage is not None and usage.prompt_token_count > 0, f"no usage: {usage}")


def streaming(args):
    gemini = client(args.base_url)
    chunks = list(
        gemini.models.generate_content_stream(
            model=MODEL,
            contents="Tell me a story.",
            config=types.GenerateContentConfig(system_instruction="You tell stories."),
        )
    )
    check(len(chunks) > 1, f"one chunk only: {chunks}")
    text = "".join(chunk.text or "" for chunk in chunks)
    check(len(text) > 20, f"short text: {text!r}")
    check(chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP, "no finish reason")
    check(chunks[-1].usage_metadata.prompt_token_count > 0, "no usage in the last chunk")


def function_calling(args):
    gemini = client(args.base_url)
    config = types.GenerateContentConfig(
        tools=[WEATHER],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    history = [types.Content(role="user", parts=[types.Part(text=f"{CALL_TOOL} What is the weather in Paris?")])]
    first = gemini.models.generate_content(model=SIGNED_MODEL, contents=history, config=config)
    calls = first.function_calls or []
    check(len(calls) == 1 and calls[0].name == "get_weather", f"no call: {first}")
    turn = first.candidates[0].content
    check(turn.parts[0].thought_signature, "the call came without its thought signature")
    history.append(turn)
    history.append(
        types.Content(
            role="user",
            parts=[types.Part.from_function_response(name="get_weather", response={"output": "sunny, 24 C"})],
        )
    )
    second = gemini.models.generate_content(model=SIGNED_MODEL, contents=history, config=config)
    check(second.text, f"the answer to the function response has no text: {second}")


def streaming_function_calling(args):
    gemini = client(args.base_url)
    config = types.GenerateContentConfig(tools=[WEATHER])
    history = [types.Content(role="user", parts=[types.Part(text=f"{CALL_TOOL} Weather in Oslo?")])]
    chunks = list(gemini.models.generate_content_stream(model=SIGNED_MODEL, contents=history, config=config))
    parts = [part for chunk in chunks for part in (chunk.candidates[0].content.parts or [])]
    call = [part for part in parts if part.function_call]
    check(len(call) == 1 and call[0].thought_signature, f"no signed call in the stream: {parts}")
    history.append(types.Content(role="model", parts=call))
    history.append(
        types.Content(role="user", parts=[types.Part.from_function_response(name="get_weather", response={"output": "rain"})])
    )
    text = "".join(c.text or "" for c in gemini.models.generate_content_stream(model=SIGNED_MODEL, contents=history, config=config))
    check(text, "no text after the function response")


def count_tokens(args):
    gemini = client(args.base_url)
    counted = gemini.models.count_tokens(model=MODEL, contents="How many tokens is this?")
    check(counted.total_tokens and counted.total_tokens > 0, f"no count: {counted}")


def unreachable(args):
    if not args.dead_base_url:
        raise Skip("needs --dead-base-url")
    gemini = client(args.dead_base_url)
    try:
        gemini.models.generate_content(model=MODEL, contents="hello")
    except errors.APIError as error:
        check(error.code == 502, f"code {error.code}")
        check(error.status == "UNAVAILABLE", f"status {error.status}")
        check("could not be reached" in (error.message or ""), f"message {error.message!r}")
        check(API_KEY not in str(error), "the key is in the error")
        return
    raise AssertionError("no error raised")


CASES = [plain, streaming, function_calling, streaming_function_calling, count_tokens, unreachable]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--dead-base-url")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    passed = failed = 0
    for case in CASES:
        try:
            case(args)
        except Skip as skip:
            print(f"SKIP {case.__name__}: {skip}")
            continue
        except Exception as error:  # noqa: BLE001 - every failure is reported the same way
            failed += 1
            print(f"FAIL {case.__name__}: {error!r}")
            if args.verbose:
                traceback.print_exc()
            continue
        passed += 1
        print(f"PASS {case.__name__}")
    print(f"sdk: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
