"""Scoring prompts over HTTP: /v1/completions with echo and logprobs (max_tokens
0), kvant's prompt_logprobs_from and vLLM's return_tokens_as_token_ids, /tokenize,
and `kvant eval --url` giving the in-process run's log-likelihoods."""
import json
import math
import os
import subprocess
import tempfile

import openai
import pytest

from kvant_server import MODEL_ID, Server, kvant_bin, model_path


@pytest.fixture(scope="module")
def server():
    with Server("--max-logprobs", "64", threads=1) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)


PROMPT = "The capital of France is Paris, and the capital of Italy is Rome."


def test_tokenize(server):
    status, _, body = server.request("POST", "/tokenize", {"prompt": PROMPT})
    assert status == 200
    j = json.loads(body)
    assert j["count"] == len(j["tokens"]) > 5
    assert j["max_model_len"] > 0
    status, _, body = server.request("POST", "/tokenize", {"prompt": PROMPT, "model": "nope"})
    assert status == 404
    status, _, body = server.request("GET", "/tokenize")
    assert status == 405


def test_echo_scores_the_prompt(client, server):
    _, _, body = server.request("POST", "/tokenize", {"prompt": PROMPT})
    ids = json.loads(body)["tokens"]
    r = client.completions.create(model=MODEL_ID, prompt=PROMPT, echo=True, logprobs=3,
                                  max_tokens=0)
    c = r.choices[0]
    assert c.text == PROMPT
    assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
    lp = c.logprobs
    assert len(lp.tokens) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    assert all(len(t) == 3 for t in lp.top_logprobs[1:])
    # The chosen token's logprob is at most the best alternative's.
    assert all(v <= max(t.values()) + 1e-5 for v, t in zip(lp.token_logprobs[1:], lp.top_logprobs[1:]))

    # Token ids in, ids out, from position 8 on: the same numbers, the earlier
    # positions null, and the prefix cache may serve them.
    r2 = client.completions.create(model=MODEL_ID, prompt=ids, echo=True, logprobs=64,
                                   max_tokens=0,
                                   extra_body={"prompt_logprobs_from": 8,
                                               "return_tokens_as_token_ids": True})
    lp2 = r2.choices[0].logprobs
    assert lp2.tokens == [f"token_id:{t}" for t in ids]
    assert all(x is None for x in lp2.token_logprobs[:8])
    for a, b in zip(lp.token_logprobs[8:], lp2.token_logprobs[8:]):
        assert math.isclose(a, b, abs_tol=2e-3)
    assert all(len(t) == 64 for t in lp2.top_logprobs[8:])

    # Echo with generation: the prompt, then the completion.
    r3 = client.completions.create(model=MODEL_ID, prompt=PROMPT, echo=True, logprobs=1,
                                   max_tokens=3, temperature=0)
    c3 = r3.choices[0]
    assert c3.text.startswith(PROMPT) and len(c3.logprobs.tokens) == len(ids) + 3

    # Over 20 alternatives only for prompt tokens.
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_ID, prompt=PROMPT, echo=True, logprobs=30, max_tokens=2)


def run_eval(args, out, tasks="arc_challenge,mmlu,wikitext"):
    cmd = [kvant_bin(), "eval", "-q", "--out", out, "--tasks", tasks,
           "--limit", "arc_challenge=3,mmlu=3,wikitext=2", "--arc-shots", "0", "--mmlu-shots", "1",
           "--window", "128", "--stride", "128", "--score", "64", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    with open(out) as f:
        return json.load(f)


def test_eval_over_the_server_matches_in_process(server):
    with tempfile.TemporaryDirectory() as d:
        base = os.path.join(d, "base.kvkl")
        local = run_eval(["-m", model_path(), "-t", "1", "--kl-save", base], os.path.join(d, "l.json"))
        remote = run_eval(["--url", f"http://127.0.0.1:{server.port}", "--concurrency", "2"],
                          os.path.join(d, "r.json"))
        for task in ("arc_challenge", "mmlu"):
            li, ri = local["tasks"][task]["items"], remote["tasks"][task]["items"]
            assert [x["id"] for x in li] == [x["id"] for x in ri]
            for a, b in zip(li, ri):
                assert a["pred"] == b["pred"]
                for x, y in zip(a["ll"], b["ll"]):
                    assert math.isclose(x, y, abs_tol=5e-3), (task, a["id"], x, y)
        lp = local["tasks"]["wikitext"]["metrics"]["ppl"]["value"]
        rp = remote["tasks"]["wikitext"]["metrics"]["ppl"]["value"]
        assert math.isclose(lp, rp, rel_tol=1e-3)
        # KL of the server against the in-process baseline: the same model, so ~0.
        kl = run_eval(["--url", f"http://127.0.0.1:{server.port}", "--kl-baseline", base],
                      os.path.join(d, "k.json"), tasks="kl")
        m = kl["tasks"]["kl"]["metrics"]
        assert m["mean_kl"]["value"] < 1e-4
        assert m["same_top1"]["value"] > 0.99
