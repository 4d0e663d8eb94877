"""Clients that drop mid-request have it cancelled and every KV page comes
back; the waiting-queue limit answers 429 with Retry-After; SIGTERM finishes
what is in flight and exits 0."""
import json
import signal
import socket
import threading
import time

from kvant_server import MODEL_ID, Server, sse_events


def open_stream(port, max_tokens=400, stream=True, prompt="Write a long story about a cat."):
    body = json.dumps({"model": MODEL_ID, "prompt": prompt, "max_tokens": max_tokens,
                       "stream": stream, "ignore_eos": True, "temperature": 0.7}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return s


def read_some(s, n_bytes):
    got = b""
    while len(got) < n_bytes:
        chunk = s.recv(4096)
        assert chunk, "the server closed early"
        got += chunk
    return got


def test_disconnect_frees_pages():
    with Server("--no-prefix-cache") as srv:
        before = srv.metrics()
        # One client that stays, so the engine keeps stepping while the others go.
        keeper = open_stream(srv.port, max_tokens=300)
        drops = [open_stream(srv.port) for _ in range(6)]
        quiet = [open_stream(srv.port, stream=False) for _ in range(2)]
        for s in drops:
            read_some(s, 600)  # a few chunks in
        m = srv.metrics()
        assert m["kvant_requests_running"] >= 1
        assert m["kvant_kv_pages_active"] > 0
        steps0 = m["kvant_engine_steps_total"]
        for s in drops + quiet:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()  # RST: the client is gone mid-stream
        deadline = time.time() + 10
        while True:
            m = srv.metrics()
            aborted = m['kvant_requests_finished_total{reason="abort"}'] - \
                before['kvant_requests_finished_total{reason="abort"}']
            # The engine snapshot trails the finish events by up to a step.
            if (aborted == 8 and m["kvant_requests_running"] == 1) or time.time() > deadline:
                break
            time.sleep(0.01)
        assert aborted == 8
        # The keeper still runs: only its pages are in use.
        assert m["kvant_requests_running"] == 1
        steps = m["kvant_engine_steps_total"] - steps0
        print(f"aborted within {steps:.0f} steps of the disconnect")
        assert steps <= 5
        keeper.close()
        m = srv.wait_pages_free()
        assert m["kvant_kv_pages_used"] == 0
        assert m["kvant_kv_pages_active"] == 0
        # Still serving.
        status, _, body = srv.request("POST", "/v1/completions",
                                      {"model": MODEL_ID, "prompt": "Hi", "max_tokens": 3})
        assert status == 200, body


def test_queue_limit_429():
    with Server("--max-waiting", "0") as srv:
        status, hdrs, body = srv.request("POST", "/v1/completions",
                                         {"model": MODEL_ID, "prompt": "Hi", "max_tokens": 3})
        assert status == 429
        assert hdrs["retry-after"] == "1"
        assert json.loads(body)["error"]["type"] == "rate_limit_error"
        assert srv.request("GET", "/health")[0] == 200


def test_sigterm_finishes_in_flight():
    with Server() as srv:
        s = open_stream(srv.port, max_tokens=40)
        read_some(s, 200)
        srv.proc.send_signal(signal.SIGTERM)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
        body = data.split(b"\r\n\r\n", 1)[-1] if data.startswith(b"HTTP/") else data
        assert b"data: [DONE]" in body
        assert b'"finish_reason":"length"' in body
        assert srv.proc.wait(timeout=30) == 0
        try:
            socket.create_connection(("127.0.0.1", srv.port), timeout=2).close()
            refused = False
        except OSError:
            refused = True
        assert refused


def test_sigterm_cancels_after_grace():
    with Server("--shutdown-grace", "0.5") as srv:
        s = open_stream(srv.port, max_tokens=2000)
        read_some(s, 200)
        t0 = time.time()
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(timeout=30) == 0
        assert time.time() - t0 < 15
        s.close()
