"""What the `local` cache preset's `read` price is measured from: llama-cpp-python's server
(SmolLM2-135M from .venv-local), three trials of a prefix of 4, 40 and 80 file lines (about 80,
760 and 1,520 tokens) prefilled whole, then extended by a 12-line turn (about 230 tokens) read
after it from the KV cache. Prints the server's own `prompt eval` seconds per prefilled token, and
per new token after each cached prefix: the growth of the second with the cached tokens is what a
cached token costs a turn. Usage (scripts/local-server-venv prints the python and the GGUF):
    .venv-local/bin/python scripts/measure_local_prefill.py GGUF [N_CTX]
"""
import json, os, re, socket, subprocess, sys, tempfile, time, urllib.request, statistics
gguf = sys.argv[1]; n_ctx = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]
port = free_port()
log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
p = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--n_ctx", str(n_ctx), "--model_alias", "smollm2",
                      "--host", "127.0.0.1", "--port", str(port), "--verbose", "true"], stdout=log, stderr=subprocess.STDOUT)
for _ in range(600):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2); break
    except Exception: time.sleep(0.2)
EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
def evals():
    return [(float(a), int(b)) for a, b in EVAL.findall(open(log.name).read())]
def ask(messages):
    before = len(evals())
    body = json.dumps({"model": "smollm2", "messages": messages, "max_tokens": 1, "temperature": 0}).encode()
    t = time.monotonic()
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body, headers={"content-type": "application/json"}), timeout=600).read()
    return time.monotonic() - t, evals()[before:]
def block(tag, n):
    return "\n".join(f"{tag} line {i}: let value = compute(input, limit);" for i in range(n))
rows = []
for trial in range(3):
    for prefix_lines in (4, 40, 80):
        base = [{"role": "system", "content": f"trial {trial} {prefix_lines}"}, {"role": "user", "content": block(f"p{trial}{prefix_lines}", prefix_lines)}]
        t_full, e_full = ask(base)                     # the prefix, prefilled whole
        ext = base + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": block(f"n{trial}{prefix_lines}", 12)}]
        t_ext, e_ext = ask(ext)                        # the prefix from the KV cache, the new turn prefilled
        rows.append((prefix_lines, e_full, t_full, e_ext, t_ext))
        print(prefix_lines, "full:", e_full, f"{t_full:.2f}s", "extend:", e_ext, f"{t_ext:.2f}s", flush=True)
p.terminate(); p.wait()
# seconds per prefilled token (whole prefixes), and the extra seconds per cached token of context
full = [(sum(ms for ms, _ in e) / 1000, sum(n for _, n in e)) for _, e, *_ in rows]
per_token = statistics.median(s / n for s, n in full if n)
ext = {}
for lines, _, _, e, _ in rows:
    ext.setdefault(lines, []).append(sum(ms for ms, _ in e) / 1000 / max(1, sum(n for _, n in e)))
cached = {lines: sum(n for _, n in e) for lines, e, *_ in rows}
print("seconds per prefilled token (median):", per_token)
for lines in sorted(ext):
    print("prefix lines", lines, "cached tokens", cached[lines], "new-token seconds (median)", statistics.median(ext[lines]))
