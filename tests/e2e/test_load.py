"""Load: 256 concurrent streaming clients, 2,000 requests in all (short
prompts, a few tokens each). No request fails, every KV page is free at the
end, and the server's RSS is back to its level after warm-up."""
import asyncio
import json
import os
import random
import time

from kvant_server import MODEL_ID, Server, parse_response, sse_events

CLIENTS = int(os.environ.get("KVANT_LOAD_CLIENTS", "256"))
REQUESTS = int(os.environ.get("KVANT_LOAD_REQUESTS", "2000"))
WORDS = "apple river stone cloud music table light garden paper winter".split()


async def one_request(port, rng, chat):
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 10)))
    body = {"model": MODEL_ID, "max_tokens": rng.randint(2, 8), "stream": True,
            "temperature": 0.8, "seed": rng.randint(1, 1 << 30)}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = prompt
        path = "/v1/completions"
    data = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    raw = await reader.read()
    writer.close()
    status, _, payload = parse_response(raw)
    assert status == 200, raw[:300]
    events, done = sse_events(payload)
    assert done, payload[-300:]
    finishes = [e["choices"][0]["finish_reason"] for e in events
                if e["choices"] and e["choices"][0]["finish_reason"]]
    assert finishes in (["stop"], ["length"]), finishes


async def run_clients(port, clients, total, seed):
    counter = {"left": total}
    errors = []

    async def worker(i):
        rng = random.Random(seed * 1000 + i)
        while counter["left"] > 0:
            counter["left"] -= 1
            try:
                await one_request(port, rng, chat=(i % 2 == 0))
            except Exception as e:  # noqa: BLE001 - collected and reported below
                errors.append(repr(e))

    await asyncio.gather(*(worker(i) for i in range(clients)))
    return errors


def test_load():
    with Server(kv_memory="160MiB") as srv:
        # Warm-up: every client once, so the allocator and the engine's
        # scratch reach their working size.
        errors = asyncio.run(run_clients(srv.port, CLIENTS, CLIENTS, seed=1))
        assert not errors, errors[:5]
        m = srv.wait_pages_free()
        assert m["kvant_kv_pages_active"] == 0
        rss_warm = srv.rss_bytes()
        t0 = time.time()
        errors = asyncio.run(run_clients(srv.port, CLIENTS, REQUESTS - CLIENTS, seed=2))
        elapsed = time.time() - t0
        assert not errors, errors[:5]
        m = srv.wait_pages_free()
        rss_end = srv.rss_bytes()
        print(f"\n{REQUESTS} requests, {CLIENTS} clients: {elapsed:.1f} s after warm-up; "
              f"RSS {rss_warm / 2**20:.1f} MiB after warm-up, {rss_end / 2**20:.1f} MiB at the "
              f"end; peak pages {m['kvant_kv_pages_peak']:.0f} of {m['kvant_kv_pages_total']:.0f}; "
              f"preemptions {m['kvant_preemptions_total']:.0f}")
        assert m["kvant_kv_pages_active"] == 0
        assert m["kvant_requests_running"] == 0 and m["kvant_requests_waiting"] == 0
        # Pages left are only the prefix cache's, which a request can reclaim.
        assert m["kvant_kv_pages_used"] == m["kvant_kv_pages_cached"]
        finished = sum(m[f'kvant_requests_finished_total{{reason="{r}"}}']
                       for r in ("stop", "length", "abort", "error"))
        assert finished == REQUESTS
        assert m['kvant_requests_finished_total{reason="error"}'] == 0
        assert m['kvant_requests_finished_total{reason="abort"}'] == 0
        assert m["kvant_integrity_violations_total"] == 0
        assert rss_end <= rss_warm * 1.10 + 16 * 2**20, (rss_warm, rss_end)
        assert srv.request("GET", "/health")[0] == 200
