#!/usr/bin/env python3
"""An agent chaining OpenAI Responses by `previous_response_id`, with the official `openai` SDK.

Each turn sends only the new item (a file the agent "read", with one planted fact in it) and the
previous response's id, as the SDK's chaining mode does; the provider keeps the history. Run by
tests/e2e/stateful.rs against compactor or straight at the provider simulator:

    python tests/sdk/chains.py --base-url http://127.0.0.1:8787/v1 --turns 12 [--stream]

Prints one JSON line per turn: {"turn", "id", "rungs"} (the `x-compactor-rungs` header) or
{"turn", "error"}; stops at the first error and exits 1 then, else 0.
"""

import argparse
import json
import sys

import openai

FILLER = "The module compiles cleanly and every test in this file passes on the first run. "


def fact(turn):
    words = ["AMBER", "BIRCH", "CEDAR", "DELTA", "EMBER", "FJORD", "GROVE", "HAVEN", "IVORY", "JUNIPER", "KESTREL", "LUMEN"]
    return f"{words[turn % len(words)]}-MARKER-{turn}"


def file_text(turn, chars):
    body = (FILLER * (chars // len(FILLER) + 1))[:chars]
    half = len(body) // 2
    return f"File src/part_{turn}.rs:\n{body[:half]}\nThe build id of this part is {fact(turn)}.\n{body[half:]}"


def turn_once(client, args, turn, previous):
    request = dict(model=args.model, input=[{"role": "user", "content": file_text(turn, args.chars)}])
    if previous:
        request["previous_response_id"] = previous
    raw = client.responses.with_raw_response.create(stream=args.stream, **request)
    rungs = raw.headers.get("x-compactor-rungs")
    if not args.stream:
        return raw.parse().id, rungs
    completed = None
    for event in raw.parse():
        if event.type == "response.completed":
            completed = event.response.id
        if event.type in ("response.failed", "error"):
            raise RuntimeError(f"stream failed: {event}")
    if completed is None:
        raise RuntimeError("the stream ended without response.completed")
    return completed, rungs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--chars", type=int, default=1600)
    parser.add_argument("--model", default="gpt-5-codex")
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="sk-chain-test", max_retries=0, timeout=60.0)
    previous = None
    for turn in range(args.turns):
        try:
            previous, rungs = turn_once(client, args, turn, previous)
        except Exception as error:  # the agent sees the error: the run dies here
            print(json.dumps({"turn": turn, "error": f"{type(error).__name__}: {error}"}), flush=True)
            return 1
        print(json.dumps({"turn": turn, "id": previous, "rungs": rungs}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
