#!/usr/bin/env python3
"""Speculative decoding by prompt lookup (docs/API.md, Speculative decoding):
output tokens/s with and without it, on one `kvant serve` of the default
model, for two prompt sets at each client count:

  - copy: rewriting a given text -- Python functions from this repository
    with a name changed, and WikiText-2 paragraphs with their spelling
    corrected -- where the answer repeats much of the prompt;
  - chat: open-ended questions, where little of the answer is in the prompt.

Each round sends the set's 8 requests (greedy, non-streamed) through
`clients` workers, once with `"speculative"` off and once on, the order
alternating between rounds; a warm-up round first fills the prefix cache so
that both modes prefill alike. Reported per (set, clients): median output
tokens/s of each mode, the speed-up, the draft acceptance rate (the
server's counters over the rounds with it on), and how many outputs were
byte-identical between the two modes.

  .venv/bin/python bench/speculative.py [--rounds 3] [--clients 1,8] [--tokens 192]
JSON on stdout; progress on stderr.

With --mtp-fixture DIR (a checkpoint from tools/fixtures/gen_mtp.py, e.g.
tests/fixtures/mtp/glm4_moe_trained) the server runs that model with --mtp
and the SmolLM2 tokenizer, requests draft with its multi-token-prediction
layer ({"method": "mtp"}), and the two sets are token-id prompts: "trained"
(the fixture's prompts, whose continuations the layer was trained on) and
"random" (random ids, where its drafts are mostly wrong). With --mtp the
server runs --model with --mtp on the text prompt sets (for a checkpoint
from `kvant synth --mtp`, whose random MTP layer drafts wrong: the cost of
drafting that does not pay).
"""
import argparse
import concurrent.futures as cf
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHAT = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "What are the main benefits of regular exercise? Explain in a few paragraphs.",
    "Give me five tips for learning to play the guitar, with a sentence on each.",
    "Describe a perfect autumn day in the countryside.",
    "Why do people enjoy travelling to new places?",
    "Write a poem about the city at night.",
    "Explain to a child how plants grow from seeds.",
    "What should I think about when adopting a dog?",
]


def python_functions(n):
    """n top-level functions of 15-45 lines from the repository's Python tools."""
    out = []
    for rel in ["tools/check_shape.py", "bench/summarize_kernels.py", "bench/plot_serve.py",
                "bench/structured_overhead.py", "tests/e2e/test_tools.py", "tests/e2e/conftest.py"]:
        path = os.path.join(ROOT, rel)
        if not os.path.exists(path):
            continue
        src = open(path).read()
        for m in re.finditer(r"^def (\w+)\(.*?(?=^\S)", src + "\nEOF", re.S | re.M):
            body = m.group(0).rstrip()
            if 15 <= body.count("\n") <= 45:
                out.append((m.group(1), body))
    return out[:n]


def wiki_paragraphs(n):
    text = open(os.path.join(ROOT, "data/eval/wikitext-2-raw/wiki.test.raw")).read()
    paras = [p.strip() for p in text.split("\n") if 400 <= len(p.strip()) <= 900
             and not p.strip().startswith("=")]
    out = []
    for p in paras[::7][:n]:
        p = p.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")
        p = re.sub(r" ([.,;:)])", r"\1", p).replace("( ", "(")
        out.append(p)
    return out


def copy_prompts():
    ps = []
    for name, body in python_functions(4):
        ps.append(f"Rewrite this Python function with `{name}` renamed to `{name}_v2`. "
                  f"Reply with the code only.\n\n```python\n{body}\n```")
    for p in wiki_paragraphs(4):
        ps.append("Correct any spelling or grammar mistakes in the following paragraph and "
                  "return the whole corrected paragraph.\n\n" + p)
    return ps


def fixture_sets(d):
    """The MTP fixture's prompt sets: its own prompts (twice), and 8 random ones."""
    trained = json.load(open(os.path.join(d, "ids.json")))["prompts"]
    vocab = json.load(open(os.path.join(d, "config.json")))["vocab_size"]
    rng = __import__("random").Random(7)
    rand = [[1] + [rng.randrange(3, vocab) for _ in range(len(trained[0]) - 1)] for _ in range(8)]
    return {"trained": (trained * 2)[:8], "random": rand}


def start(args):
    cmd = [os.path.join(args.build, "kvant"), "serve", "-m", args.model, "--port", "0", "-t",
           str(args.threads), "--kv-memory", "512MiB"]
    if args.mtp_fixture:
        cmd += ["--mtp", "--tokenizer", args.tokenizer]
    elif args.mtp:
        cmd += ["--mtp"]
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in p.stderr:
        m = re.search(r"model '([^']+)' on http://[^:]+:(\d+)/v1", line)
        if m:
            return p, m.group(1), int(m.group(2))
    raise RuntimeError("kvant serve did not start")


def post(port, body):
    path = "completions" if "prompt" in body else "chat/completions"
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/{path}",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=600).read())


def counters(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return {l.split()[0]: float(l.split()[1]) for l in text.splitlines()
            if l.startswith("kvant_spec_decode_")}


def run_round(port, model, prompts, clients, tokens, spec):
    def one(p):
        if isinstance(p, list):  # token ids
            body = {"model": model, "prompt": p, "max_tokens": tokens, "temperature": 0,
                    "ignore_eos": True}
        else:
            body = {"model": model, "messages": [{"role": "user", "content": p}],
                    "max_tokens": tokens, "temperature": 0}
        if spec:
            body["speculative"] = spec
        j = post(port, body)
        c = j["choices"][0]
        return c["text"] if "text" in c else c["message"]["content"], j["usage"]["completion_tokens"]
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(clients) as ex:
        res = list(ex.map(one, prompts))
    dt = time.perf_counter() - t0
    return sum(n for _, n in res) / dt, [t for t, _ in res]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", default="1,8")
    ap.add_argument("--tokens", type=int, default=192)
    ap.add_argument("--spec", default=None,
                    help="the requests' \"speculative\" value when on (JSON; default "
                         "{\"method\": \"ngram\"}, or mtp with --mtp-fixture)")
    ap.add_argument("--mtp-fixture", default=None,
                    help="an MTP fixture directory: its model with --mtp, token-id prompts")
    ap.add_argument("--mtp", action="store_true",
                    help="serve --model with --mtp and draft with its MTP layer (text prompts)")
    ap.add_argument("--tokenizer",
                    default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    args = ap.parse_args()
    if args.mtp_fixture:
        args.model = args.mtp_fixture
    spec = json.loads(args.spec or ('{"method": "mtp"}' if args.mtp_fixture or args.mtp
                                    else '{"method": "ngram"}'))
    sets = fixture_sets(args.mtp_fixture) if args.mtp_fixture else {"copy": copy_prompts(),
                                                                     "chat": CHAT}
    proc, model, port = start(args)
    results = []
    try:
        for name, prompts in sets.items():
            run_round(port, model, prompts, 8, args.tokens, None)  # warm-up: prefix cache
            for clients in [int(c) for c in args.clients.split(",")]:
                rates = {"off": [], "on": []}
                same = total = 0
                draft = accepted = 0.0
                for r in range(args.rounds):
                    outs = {}
                    for mode in (["off", "on"] if r % 2 == 0 else ["on", "off"]):
                        c0 = counters(port)
                        rate, texts = run_round(port, model, prompts, clients, args.tokens,
                                                spec if mode == "on" else None)
                        c1 = counters(port)
                        if mode == "on":
                            draft += c1["kvant_spec_decode_draft_tokens_total"] - \
                                c0["kvant_spec_decode_draft_tokens_total"]
                            accepted += c1["kvant_spec_decode_accepted_tokens_total"] - \
                                c0["kvant_spec_decode_accepted_tokens_total"]
                        rates[mode].append(rate)
                        outs[mode] = texts
                        print(f"{name} clients {clients} round {r} {mode}: {rate:.1f} tok/s",
                              file=sys.stderr)
                    same += sum(a == b for a, b in zip(outs["off"], outs["on"]))
                    total += len(prompts)
                off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
                results.append({"set": name, "clients": clients,
                                "tok_s_off": round(off, 2), "tok_s_on": round(on, 2),
                                "speedup": round(on / off, 3),
                                "acceptance": round(accepted / draft, 3) if draft else None,
                                "draft_tokens": int(draft), "accepted_tokens": int(accepted),
                                "identical_outputs": f"{same}/{total}",
                                "runs_off": [round(x, 2) for x in rates["off"]],
                                "runs_on": [round(x, 2) for x in rates["on"]]})
                print(json.dumps(results[-1]), file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait()
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                   if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(json.dumps({"bench": "speculative", "model": os.path.basename(args.model),
                      "threads": args.threads, "tokens": args.tokens, "rounds": args.rounds,
                      "speculative": spec, "cpu": cpu or platform.processor(),
                      "results": results}, indent=1))


if __name__ == "__main__":
    main()
