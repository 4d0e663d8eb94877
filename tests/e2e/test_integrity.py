"""The KV integrity pass end to end: a server started with the debug fault
injector (every few steps one running request's page is freed behind its
back) must finish exactly the faulted requests with finish_reason "error"
and an integrity message, finish the others normally, count the violations
in /metrics, give every page back and keep serving."""
import concurrent.futures as cf

import openai

from kvant_server import MODEL_ID, Server


def test_faulted_requests_fail_alone_with_an_integrity_error():
    with Server("--no-prefix-cache", "--debug-inject-faults", "9") as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=300)

        def one(i):
            if i % 2:
                r = client.completions.create(model=MODEL_ID, prompt=f"Story number {i}:", max_tokens=24,
                                              temperature=0, extra_body={"ignore_eos": True})
                c = r.choices[0]
                return c.finish_reason, (c.model_extra or {}).get("error"), len(c.text)
            finish, err, n = None, None, 0
            stream = client.completions.create(model=MODEL_ID, prompt=f"Story number {i}:", max_tokens=24,
                                               temperature=0, stream=True, extra_body={"ignore_eos": True})
            for chunk in stream:
                c = chunk.choices[0]
                n += len(c.text)
                if c.finish_reason:
                    finish, err = c.finish_reason, (c.model_extra or {}).get("error")
            return finish, err, n

        with cf.ThreadPoolExecutor(8) as ex:
            results = list(ex.map(one, range(24)))
        reasons = [r[0] for r in results]
        errors = [r for r in results if r[0] == "error"]
        assert errors, f"no request was faulted: {reasons}"
        assert set(reasons) <= {"error", "length"}, reasons
        for _, err, _ in errors:
            # The client gets a stable code; the page and generation numbers
            # stay in the server's log.
            assert err and err["code"] == "kv_integrity_error" and "integrity" in err["message"], err
            assert "generation" not in err["message"], err
        assert any("integrity check failed" in l and "generation" in l for l in srv.log), srv.log[-5:]
        m = srv.wait_pages_free()
        assert m["kvant_integrity_violations_total"] >= len(errors)
        assert m["kvant_kv_pages_active"] == 0
        # Still serving, and with no fault due in the next few steps a short
        # request completes.
        r = client.completions.create(model=MODEL_ID, prompt="Hello", max_tokens=2, temperature=0)
        assert r.choices[0].finish_reason in ("length", "stop", "error")
        print(f"integrity e2e: {len(errors)} of {len(results)} requests faulted and aborted, "
              f"{int(m['kvant_integrity_violations_total'])} violations counted")
