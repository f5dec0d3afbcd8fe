#!/usr/bin/env python3
"""Builds the fuzzers' seed corpus (fuzz/seeds/<target>/) from tests/fixtures: request bodies of
every dialect for `dialects`, the providers' error bodies for `overflow` (with the status byte
the target reads first), and SSE streams with usage for `sse_usage`."""
import json
import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
SEEDS = ROOT / "fuzz" / "seeds"
STATUSES = [400, 413, 422, 429, 500, 200]
# Bytes: the long recorded conversations would slow every mutation down (CI's unoptimized build
# takes a smaller bound).
MAX_SEED = int(os.environ.get("FUZZ_MAX_SEED", "200000"))


def write(target, name, data):
    folder = SEEDS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


def requests():
    for path in sorted(FIXTURES.rglob("*.json")):
        if "overflow" in path.parts or path.stat().st_size > MAX_SEED:
            continue
        write("dialects", f"{path.parent.name}-{path.name}", path.read_bytes())


def errors():
    for path in sorted((FIXTURES / "overflow").glob("*.json")):
        fixture = json.loads(path.read_text())
        body = fixture.get("body")
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        status = fixture.get("status", 400)
        index = STATUSES.index(status) if status in STATUSES else 0
        write("overflow", path.name, bytes([index]) + data)
        if fixture.get("content_type", "").startswith("text/event-stream"):
            write("sse_usage", path.name, bytes([7]) + data)


def streams():
    anthropic = (
        'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":10,'
        '"cache_read_input_tokens":90,"output_tokens":1}}}\n\n'
        'event: ping\ndata: {"type":"ping"}\n\n'
        'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":42}}\n\n'
    )
    chat = 'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\r\n\r\ndata: [DONE]\r\n\r\n'
    responses = (
        'event: response.completed\rdata: {"type":"response.completed","response":{"usage":'
        '{"input_tokens":300,"input_tokens_details":{"cached_tokens":200},"output_tokens":9}}}\r\r'
    )
    plain = '{"id":"x","usage":{"prompt_tokens":120,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":64}}}'
    for name, text, step in [("anthropic", anthropic, 3), ("chat", chat, 1), ("responses", responses, 17), ("plain", plain, 5)]:
        write("sse_usage", name, bytes([step]) + text.encode())


if __name__ == "__main__":
    requests()
    errors()
    streams()
