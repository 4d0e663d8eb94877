#!/usr/bin/env python3
"""What constrained decoding costs per generated token (docs/API.md,
Structured output): one `kvant serve` on the default model, streamed chat
requests alternating between free text and the same prompt under a
constraint, each `--tokens` long; the time per output token (first to last
streamed token over completion_tokens - 1) is compared, median over
`--rounds` pairs. Constraints: any JSON object (json_object), and a JSON
schema whose output is long (an array of strings). A fresh server per
run, so the first round pays for building the constraint's masks (the
compiled grammars are cached per schema afterwards, as in serving).

  .venv/bin/python bench/structured_overhead.py [--rounds 7] [--tokens 192]
JSON on stdout; progress on stderr.
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

import openai

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string"},
    "lines": {"type": "array", "items": {"type": "string"}, "minItems": 40}},
    "required": ["title", "lines"], "additionalProperties": False}


def start(args):
    cmd = [os.path.join(args.build, "kvant"), "serve", "-m", args.model, "--port", "0", "-t",
           str(args.threads), "--kv-memory", "256MiB"]
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in p.stderr:
        m = re.search(r"on http://[^:]+:(\d+)/v1", line)
        if m:
            return p, int(m.group(1))
    raise RuntimeError("kvant serve did not start")


def one(client, model, tokens, extra):
    t_first = t_last = None
    usage = None
    for ch in client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Write a long poem about the sea."}],
            max_tokens=tokens, temperature=0, stream=True, stream_options={"include_usage": True},
            **extra):
        now = time.perf_counter()
        if ch.usage:
            usage = ch.usage
        if ch.choices and (ch.choices[0].delta.content or "") != "":
            t_first = t_first or now
            t_last = now
    n = usage.completion_tokens
    return (t_last - t_first) / max(n - 1, 1) * 1000.0, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=192)
    args = ap.parse_args()
    p, port = start(args)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        model = client.models.list().data[0].id
        kinds = {
            "free": {"extra_body": {"ignore_eos": True}},
            "json_object": {"response_format": {"type": "json_object"}},
            "json_schema": {"response_format": {"type": "json_schema",
                                                "json_schema": {"name": "poem", "schema": SCHEMA}}},
        }
        ms = {k: [] for k in kinds}
        counts = {k: [] for k in kinds}
        for r in range(args.rounds):
            for k, extra in kinds.items():
                t, n = one(client, model, args.tokens, extra)
                ms[k].append(t)
                counts[k].append(n)
            print(f"round {r + 1}: " + ", ".join(f"{k} {ms[k][-1]:.2f} ms/token ({counts[k][-1]} tokens)"
                                                for k in kinds), file=sys.stderr)
    finally:
        p.terminate()
        p.wait()
    free = statistics.median(ms["free"])
    out = {
        "machine": platform.processor() or platform.machine(),
        "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), ""),
        "threads": args.threads, "rounds": args.rounds, "max_tokens": args.tokens,
        "ms_per_token": {k: statistics.median(v) for k, v in ms.items()},
        "first_round_ms_per_token": {k: v[0] for k, v in ms.items()},
        "tokens": {k: statistics.median(v) for k, v in counts.items()},
        "overhead_pct": {k: (statistics.median(v) - free) / free * 100.0 for k, v in ms.items() if k != "free"},
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
