"""The loop of scripts/bench-local: starts llama_cpp.server (verbose, so it logs the tokens each
prompt evaluates) and compactor in front of it, runs the agent loop straight and through
compactor, and prints one Markdown table per window. Loopback only; every loop is bounded."""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tool_output(turn):
    # The same text as tests/local/agent_loop.rs.
    lines = [f"src/module_{turn}.rs:{i}: let value = compute(input, limit);" for i in range(24)]
    lines.insert(12, f"NOTE: the deploy key of module {turn} is LANTERN-{turn}")
    return f"Output of `cat src/module_{turn}.rs`:\n" + "\n".join(lines) + "\nWhat should I look at next? Answer in one sentence."


def post(url, body, headers=None, timeout=600):
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace"), {}


def wait_http(url, seconds=180):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except Exception:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not answer")


PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")


class Server:
    """llama-cpp-python's server (one request at a time), or llama.cpp's own `llama-server` when
    `binary` names one: `parallel` slots of `n_ctx` tokens each, serving requests at once."""

    def __init__(self, gguf, n_ctx, binary=None, parallel=1):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        if binary:
            command = [binary, "--model", gguf, "--ctx-size", str(n_ctx * parallel), "--parallel", str(parallel),
                       "--no-kv-unified", "--alias", "smollm2", "--host", "127.0.0.1", "--port", str(self.port),
                       "--threads", str(os.cpu_count() or 2)]
        else:
            command = [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--n_ctx", str(n_ctx),
                       "--model_alias", "smollm2", "--host", "127.0.0.1", "--port", str(self.port), "--verbose", "true"]
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        wait_http(f"http://127.0.0.1:{self.port}/v1/models")

    def prompt_evals(self):
        with open(self.log.name) as log:
            return [(float(ms), int(tokens)) for ms, tokens in PROMPT_EVAL.findall(log.read())]

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)
        os.unlink(self.log.name)


class Compactor:
    def __init__(self, binary, upstream, extra):
        self.dir = tempfile.TemporaryDirectory()
        config = os.path.join(self.dir.name, "compactor.toml")
        port = free_port()
        with open(config, "w") as f:
            # The shipped defaults: the loopback address makes the upstream `local`.
            f.write(f'listen = "127.0.0.1:{port}"\n[upstream]\nopenai = "{upstream}"\n{extra}\n')
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
        # compactor's log (a line per request, with its compaction and summary calls) is kept
        # when BENCH_LOCAL_LOG names a file.
        log = open(os.environ["BENCH_LOCAL_LOG"], "a") if os.environ.get("BENCH_LOCAL_LOG") else subprocess.DEVNULL
        self.process = subprocess.Popen([binary, "--config", config], stdout=log, stderr=log, env=env)
        self.url = f"http://127.0.0.1:{port}"
        wait_http(f"{self.url}/readyz")

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)
        self.dir.cleanup()


def run_loop(url, server, turns, session, think=0.0):
    messages = [{"role": "system", "content": "You are a coding agent. Be brief."}]
    rows = []
    for turn in range(turns):
        messages.append({"role": "user", "content": tool_output(turn)})
        before = len(server.prompt_evals())
        started = time.monotonic()
        status, body, headers = post(f"{url}/v1/chat/completions",
                                     {"model": "smollm2", "messages": messages, "max_tokens": 24, "temperature": 0},
                                     {"x-session-id": session})
        seconds = time.monotonic() - started
        evals = server.prompt_evals()[before:]
        prefill = sum(tokens for _, tokens in evals)
        if status != 200:
            rows.append({"seconds": seconds, "status": status, "prefill": prefill, "prompt": None, "compacted": None,
                         "error": str(body)[:120]})
            break
        text = body["choices"][0]["message"]["content"] or ""
        messages.append({"role": "assistant", "content": text})
        rows.append({"seconds": seconds, "status": status, "prefill": prefill, "prompt": body["usage"]["prompt_tokens"],
                     "compacted": headers.get("x-compactor-compacted"), "calls": len(evals)})
        # The agent's tool runs before the next turn (not counted in the turn's seconds); the
        # server's calls in that time (a summary prepared in the background) count for the
        # next turn, whose prefill they are read with.
        time.sleep(think)
    return rows


def table(n_ctx, turns, direct, via):
    print(f"\n### n_ctx {n_ctx}, {turns} turns\n")
    print("| turn | direct: s | direct: prefill tokens | via compactor: s | via: prefill tokens | via: prompt tokens | via: server calls | compacted |")
    print("|---|---|---|---|---|---|---|---|")
    for i in range(turns):
        d = direct[i] if i < len(direct) else None
        v = via[i] if i < len(via) else None
        dcell = ("%.2f" % d["seconds"], str(d["prefill"])) if d and d["status"] == 200 else (("error %s" % d["status"]) if d else "-", "-")
        vcell = ("%.2f" % v["seconds"], str(v["prefill"]), str(v["prompt"]), str(v.get("calls", "-")), v["compacted"] or "") if v and v["status"] == 200 else (("error %s" % v["status"]) if v else "-", "-", "-", "-", "-")
        print(f"| {i + 1} | {dcell[0]} | {dcell[1]} | " + " | ".join(vcell) + " |")
    ok = [v["seconds"] for v in via if v["status"] == 200]
    if len(ok) >= 3:
        worst = max(ok[i] / statistics.median(ok[max(0, i - 2):i] + ok[i + 1:i + 3]) for i in range(len(ok)))
        print(f"\nvia compactor: median {statistics.median(ok):.2f} s a turn, slowest turn {max(ok):.2f} s, "
              f"worst turn / median of its 4 neighbours {worst:.2f}x; turns answered {len(ok)} of {turns}")
        # The first overflow meets a window compactor does not know yet: its summary is on its
        # path (nothing could be ready). The turns after it are what background summaries are for.
        first = next((i for i, v in enumerate(via) if v.get("compacted")), None)
        if first is not None and len(ok) - first - 1 >= 3:
            rest = range(first + 1, len(ok))
            later = max(ok[i] / statistics.median([ok[j] for j in rest if j != i and abs(j - i) <= 2]) for i in rest)
            print(f"after the turn that learned the window (turn {first + 1}): slowest {max(ok[first + 1:]):.2f} s, "
                  f"worst turn / median of its neighbours {later:.2f}x")
    answered = sum(1 for d in direct if d["status"] == 200)
    print(f"direct: turns answered {answered} of {turns}" + (f" (then: {direct[-1].get('error', '')})" if answered < turns else ""))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--compactor", required=True)
    parser.add_argument("--runs", default="2048:12,8192:40")
    parser.add_argument("--extra", default="")
    parser.add_argument("--think", type=float, default=0.0,
                        help="seconds the agent's tool takes between turns, through compactor")
    parser.add_argument("--server-bin", default="", help="llama.cpp's llama-server instead of llama-cpp-python's")
    parser.add_argument("--parallel", type=int, default=1, help="llama-server's slots")
    args = parser.parse_args()
    print(f"server: {args.server_bin or 'llama_cpp.server'}" + (f", {args.parallel} slots" if args.server_bin else "")
          + f"; tool time {args.think} s; extra {args.extra!r}")
    for run in args.runs.split(","):
        n_ctx, turns = (int(x) for x in run.split(":"))
        server = Server(args.gguf, n_ctx, args.server_bin or None, args.parallel)
        try:
            direct = run_loop(f"http://127.0.0.1:{server.port}", server, turns, "direct")
            compactor = Compactor(args.compactor, f"http://127.0.0.1:{server.port}", args.extra)
            try:
                via = run_loop(compactor.url, server, turns, f"via-{n_ctx}", args.think)
            finally:
                compactor.stop()
        finally:
            server.stop()
        table(n_ctx, turns, direct, via)


if __name__ == "__main__":
    main()
