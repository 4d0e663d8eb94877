"""Disaggregated prefill and decode end to end on the default model: a
prefill server (BF16 weights), a decode server (INT4 weights) and
`kvant router` in front, on loopback.

- Greedy and seeded output through the router equals the colocated server's
  with `--prefill-weights bf16 --decode-weights int4`, for BF16 and FP8 KV,
  through the official client (chat, completions, streaming).
- Faults: a byte flipped in transit (a debug flag on the prefill server)
  fails that request alone with the integrity error, and the counters rise;
  a prefill server killed mid-transfer gives the client an error, not a
  hang, and leaves no decode page held; a client that gives up mid-transfer
  leaves nothing held and later answers are still exact; a decode server
  too small for all requests at once makes them wait, and all finish; a
  prefill and a decode server with different KV layouts refuse each other
  at start.
"""
import json
import os
import re
import signal
import subprocess
import threading
import time

import openai
import pytest

from kvant_server import MODEL_ID, Proc, Server, Stack, health, kvant_bin, model_path, serve

PROMPTS = ["The capital of France is", "Write a haiku about the sea.",
           "List three prime numbers:", "def fibonacci(n):"]


def client(srv, timeout=120):
    return openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=timeout)


def answers(srv):
    """Greedy and seeded answers to the same requests, as comparable values."""
    c = client(srv)
    out = []
    for p in PROMPTS:
        r = c.completions.create(model=MODEL_ID, prompt=p, max_tokens=20, temperature=0)
        out.append(("greedy", p, r.choices[0].text, r.usage.completion_tokens))
        r = c.completions.create(model=MODEL_ID, prompt=p, max_tokens=12, temperature=0.9, seed=7,
                                 logprobs=2)
        lp = r.choices[0].logprobs
        out.append(("seeded", p, r.choices[0].text, lp.tokens, [round(x, 3) for x in lp.token_logprobs]))
    r = c.chat.completions.create(model=MODEL_ID, temperature=0, max_tokens=24,
                                  messages=[{"role": "user", "content": "What is the capital of France?"}])
    out.append(("chat", r.choices[0].message.content, r.choices[0].finish_reason))
    text = "".join(ch.choices[0].text for ch in c.completions.create(
        model=MODEL_ID, prompt=PROMPTS[0], max_tokens=16, temperature=0, stream=True)
        if ch.choices)
    out.append(("stream", text))
    return out


@pytest.mark.parametrize("kv", [[], ["--kv-dtype", "fp8_e4m3"]], ids=["bf16", "fp8"])
def test_router_answers_equal_the_colocated_split(kv):
    with serve("--prefill-weights", "bf16", "--decode-weights", "int4", "--int4-group", "32",
               *kv) as colo:
        want = answers(colo)
    with Stack(common=kv) as st:
        got = answers(st.r)
        m = st.d.metrics()
        # Every request went through a pull (the first token's logprobs travel too).
        assert m["kvant_kv_pulls_total"] >= 2 * len(PROMPTS) + 2, m
        assert m["kvant_kv_transfer_refused_total"] == 0
        pm = st.p.metrics()
        assert pm["kvant_kv_handoffs_acked_total"] == m["kvant_kv_pulls_total"], pm
        assert pm["kvant_kv_handoffs_held"] == 0
        status, h = health(st.r)
        assert status == 200 and h["status"] == "ok" and len(h["servers"]) == 2, h
    assert got == want


def completion(srv, prompt, max_tokens=16, timeout=60):
    return srv.request("POST", "/v1/completions", {"model": MODEL_ID, "prompt": prompt,
                                                   "max_tokens": max_tokens, "temperature": 0},
                       timeout=timeout)


def test_flipped_byte_fails_that_request_alone():
    with Stack(prefill=["--debug-kv-flip-handoff", "2"]) as st:
        first = completion(st.r, PROMPTS[0])
        bad = completion(st.r, PROMPTS[1])
        third = completion(st.r, PROMPTS[0])
        assert first[0] == 200 and third[0] == 200
        assert json.loads(first[2]) ["choices"][0]["text"] == json.loads(third[2])["choices"][0]["text"]
        assert bad[0] == 502, bad
        err = json.loads(bad[2])["error"]
        assert err["code"] == "kv_integrity_error" and "checksum" in err["message"], err
        m = st.d.wait_pages_free()
        assert m["kvant_kv_transfer_refused_total"] == 1, m
        assert m["kvant_kv_pages_active"] == 0
        pm = st.p.metrics()
        assert pm["kvant_kv_handoffs_rejected_total"] == 1 and pm["kvant_kv_handoffs_acked_total"] == 2, pm


def test_prefill_killed_mid_transfer_fails_the_client_and_frees_the_decode_side():
    with Stack(prefill=["--debug-kv-send-pause", "30"]) as st:
        result = {}

        def ask():
            t0 = time.time()
            result["r"] = completion(st.r, PROMPTS[0], timeout=60)
            result["s"] = time.time() - t0

        th = threading.Thread(target=ask)
        th.start()
        deadline = time.time() + 20
        while time.time() < deadline and st.p.metrics().get("kvant_kv_handoffs_held", 0) < 1:
            time.sleep(0.05)
        assert st.p.metrics()["kvant_kv_handoffs_held"] == 1  # paused halfway through its bytes
        st.p.proc.send_signal(signal.SIGKILL)
        th.join(30)
        assert not th.is_alive(), "the client hangs"
        status, _, body = result["r"]
        assert status == 502, (status, body)
        assert json.loads(body)["error"]["code"] == "kv_transfer_failed", body
        m = st.d.wait_pages_free()
        assert m["kvant_kv_pages_active"] == 0 and m["kvant_kv_pages_reserved"] == 0, m
        assert m["kvant_kv_pulls_failed_total"] == 1, m


def test_client_gone_mid_transfer_holds_nothing_and_later_answers_are_exact():
    with Stack(prefill=["--debug-kv-send-pause", "1.5"]) as st:
        want = completion(st.r, PROMPTS[2], timeout=60)
        assert want[0] == 200
        with pytest.raises(Exception):
            completion(st.r, PROMPTS[0], timeout=0.5)  # gives up during the pause
        time.sleep(2.5)
        m = st.d.wait_pages_free()
        assert m["kvant_kv_pages_active"] == 0 and m["kvant_kv_pages_reserved"] == 0, m
        again = completion(st.r, PROMPTS[2], timeout=60)
        assert again[0] == 200 and json.loads(again[2])["choices"] == json.loads(want[2])["choices"]
        pm = st.p.metrics()
        assert pm["kvant_kv_handoffs_held"] == 0, pm


def test_full_decode_server_pushes_back_and_every_request_finishes():
    # 24 pages of 16 tokens on the decode side; each request needs about 8
    # (a 90-token prompt and 32 generated): at most 3 fit at once.
    prompt = " ".join(["one two three four five six seven eight nine ten"] * 9)
    with Stack(decode_kv_memory=f"{24 * 368640}") as st:
        out = [None] * 8
        peak = [0]

        def ask(i):
            out[i] = st.r.request("POST", "/v1/completions",
                                  {"model": MODEL_ID, "prompt": prompt, "max_tokens": 32,
                                   "temperature": 0, "ignore_eos": True}, timeout=120)

        ths = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
        for t in ths:
            t.start()
        while any(t.is_alive() for t in ths):
            peak[0] = max(peak[0], st.d.metrics().get("kvant_kv_pulls_waiting", 0))
            time.sleep(0.05)
        texts = set()
        for s, _, body in out:
            assert s == 200, body
            texts.add(json.loads(body)["choices"][0]["text"])
        assert len(texts) == 1  # the same greedy answer for the same prompt
        assert peak[0] >= 1, "no pull ever waited for pages"
        m = st.d.wait_pages_free()
        assert m["kvant_kv_pulls_total"] == 8 and m["kvant_kv_pages_active"] == 0, m


def test_different_layouts_refuse_each_other_at_start():
    with serve("--role", "prefill", "--kv-port", "0", "--page-tokens", "32") as p:
        port = health(p)[1]["kv_port"]
        r = subprocess.run([kvant_bin(), "serve", "-m", model_path(), "--port", "0", "-t", "1",
                            "--kv-memory", "64MiB", "--role", "decode",
                            "--prefill-peer", f"127.0.0.1:{port}"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0
        assert "layout differs" in r.stderr and "32-token pages" in r.stderr and \
            "16-token pages" in r.stderr, r.stderr
        time.sleep(0.5)
        assert any("refused a decode server" in line and "layout differs" in line
                   for line in p.log), p.log
        assert p.metrics()["kvant_kv_peers_refused_total"] == 1


def test_router_refuses_wrong_roles_and_answers_its_own_health():
    with Stack() as st:
        # A decode server given as a prefill server: refused at start.
        r = subprocess.run([kvant_bin(), "router", "--port", "0", "--startup-wait", "5",
                            "--prefill", f"http://127.0.0.1:{st.d.port}",
                            "--decode", f"http://127.0.0.1:{st.d.port}"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "is not a prefill server" in r.stderr, r.stderr
        t0 = time.time()
        status, h = health(st.r)  # Connection: close is honoured (no wait for a timeout)
        assert status == 200 and time.time() - t0 < 5
        assert [s["role"] for s in h["servers"]] == ["prefill", "decode"], h
        assert completion(st.r, PROMPTS[0])[0] == 200
        m = st.r.metrics()
        assert m[f'kvant_router_requests_total{{server="http://127.0.0.1:{st.d.port}",role="decode"}}'] == 1, m
        assert m['kvant_router_http_responses_total{code="200"}'] >= 1, m


def test_decode_server_dying_mid_answer_ends_the_client_and_the_router_marks_it_down():
    with Stack() as st:
        body = {"model": MODEL_ID, "prompt": PROMPTS[1], "max_tokens": 400, "temperature": 0,
                "ignore_eos": True, "stream": True}
        import socket
        s = socket.create_connection(("127.0.0.1", st.r.port), timeout=30)
        data = json.dumps(body).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        got = s.recv(65536)
        assert b"200 OK" in got, got
        st.d.proc.send_signal(signal.SIGKILL)
        t0 = time.time()
        while True:  # the stream ends (the router closes), it does not hang
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        assert time.time() - t0 < 20
        assert b"data: [DONE]" not in got
        s.close()
        deadline = time.time() + 10
        while time.time() < deadline and health(st.r)[0] == 200:
            time.sleep(0.2)
        status, h = health(st.r)
        assert status == 503 and not h["servers"][1]["up"], h
        s2, _, b2 = completion(st.r, PROMPTS[0], timeout=30)
        assert s2 == 503 and json.loads(b2)["error"]["code"] == "no_server", b2


def test_prefill_side_prefix_cache_and_retry_on_another_prefill_server():
    prompt = " ".join(["alpha beta gamma delta"] * 20)  # 80+ tokens: several full pages
    with Stack(prefill=["--debug-kv-send-pause", "20"]) as st, \
            serve("--role", "prefill", "--kv-port", "0", "--prefill-weights", "bf16",
                  "--decode-weights", "bf16") as p2:
        # A second decode server that may pull from both prefill servers, and
        # a router over the two prefill servers and it.
        kv2 = health(p2)[1]["kv_port"]
        with serve("--role", "decode", "--prefill-peer", f"127.0.0.1:{st.kv_port},127.0.0.1:{kv2}",
                   "--prefill-weights", "int4", "--decode-weights", "int4", "--int4-group", "32") as d, \
                Proc("router", "--port", "0", "--prefill", f"http://127.0.0.1:{st.p.port}",
                     "--prefill", f"http://127.0.0.1:{p2.port}",
                     "--decode", f"http://127.0.0.1:{d.port}") as r:
            result = {}
            th = threading.Thread(target=lambda: result.update(r=completion(r, prompt, timeout=90)))
            th.start()  # round-robin: the first request goes to the paused prefill server
            deadline = time.time() + 20
            while time.time() < deadline and st.p.metrics().get("kvant_kv_handoffs_held", 0) < 1:
                time.sleep(0.05)
            st.p.proc.send_signal(signal.SIGKILL)
            th.join(60)
            status, _, body = result["r"]
            assert status == 200, body  # retried on the other prefill server
            rm = r.metrics()
            assert rm["kvant_router_retries_total"] == 1, rm
            # The prefill side's prefix cache: the same prompt again hits it.
            for _ in range(2):
                assert completion(r, prompt)[0] == 200
            pm = p2.metrics()
            assert pm["kvant_prefix_cache_hit_tokens_total"] >= 64, pm
            # Until its next /health poll the router may pick the dead one
            # again: each such pull fails and is retried, none reaches a client.
            dm = d.wait_pages_free()
            assert dm["kvant_kv_pages_active"] == 0, dm
            assert dm["kvant_kv_pulls_failed_total"] == r.metrics()["kvant_router_retries_total"], dm
