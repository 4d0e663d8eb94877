"""Starts a real `kvant serve` for the end-to-end tests and talks raw HTTP.

KVANT_BIN names the binary and KVANT_MODEL the model (ctest sets both); the
server binds 127.0.0.1 on a free port (--port 0) and prints it on stderr.
"""
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

MODEL_ID = "SmolLM2-135M-Instruct.Q4_1"


def kvant_bin():
    return os.environ.get("KVANT_BIN", os.path.join(os.path.dirname(__file__), "../../build/kvant"))


def model_path():
    return os.environ.get(
        "KVANT_MODEL",
        os.path.join(os.path.dirname(__file__), "../../models/SmolLM2-135M-Instruct.Q4_1.gguf"))


class Server:
    def __init__(self, *extra, kv_memory="128MiB", threads=2, model=None, preexec_fn=None):
        self.preexec_fn = preexec_fn
        self.args = [kvant_bin(), "serve", "-m", model or model_path(), "--port", "0", "-t", str(threads),
                     "--kv-memory", kv_memory, *extra]
        self.proc = None
        self.port = None
        self.log = []

    def __enter__(self):
        self.proc = subprocess.Popen(self.args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     preexec_fn=self.preexec_fn,
                                     text=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("kvant serve exited: " + "".join(self.log))
            self.log.append(line)
            m = re.search(r"on http://[^:]+:(\d+)/v1", line)
            if m:
                self.port = int(m.group(1))
                break
        threading.Thread(target=self._drain, daemon=True).start()
        return self

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    @property
    def base_url(self):
        return f"http://127.0.0.1:{self.port}/v1"

    def rss_bytes(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def request(self, method, path, body=None, headers=None, raw=None, timeout=60):
        """One HTTP/1.1 request on a fresh connection; returns (status, headers, body bytes)."""
        hdrs = {"Host": "127.0.0.1", "Connection": "close"}
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        elif isinstance(body, str):
            body = body.encode()
            hdrs["Content-Type"] = "application/json"
        elif isinstance(body, bytes):
            hdrs["Content-Type"] = "application/json"
        if body is not None:
            hdrs["Content-Length"] = str(len(body))
        hdrs.update(headers or {})
        if raw is None:
            head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
            raw = head.encode() + b"\r\n" + (body or b"")
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(raw)
            data = b""
            while True:
                try:
                    chunk = s.recv(65536)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                data += chunk
        return parse_response(data)

    def metrics(self):
        status, _, body = self.request("GET", "/metrics")
        assert status == 200
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def wait_pages_free(self, timeout=10):
        """Waits until no request holds a KV page; returns the last metrics."""
        deadline = time.time() + timeout
        while True:
            m = self.metrics()
            if m["kvant_kv_pages_active"] == 0 and m["kvant_requests_in_flight"] == 0:
                return m
            if time.time() > deadline:
                return m
            time.sleep(0.05)


def parse_response(data):
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not lines or not lines[0].startswith("HTTP/"):
        return None, {}, data
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding") == "chunked":
        out = b""
        while body:
            size_line, _, rest = body.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            out += rest[:size]
            body = rest[size + 2:]
        body = out
    return status, headers, body


def sse_events(body):
    """The JSON payloads of an SSE body, and whether it ended with [DONE]."""
    events, done = [], False
    for line in body.decode().split("\n"):
        if line.startswith("data: "):
            payload = line[6:]
            if payload == "[DONE]":
                done = True
            else:
                events.append(json.loads(payload))
    return events, done


# Disaggregated serving: a prefill server, a decode server and the router.
class Proc(Server):
    """A kvant process given its whole argument list (serve or router)."""

    def __init__(self, *args):
        super().__init__()
        self.args = [kvant_bin(), *args]


def serve(*extra, kv_memory="64MiB"):
    return Proc("serve", "-m", model_path(), "--port", "0", "-t", "1", "--kv-memory", kv_memory,
                "--model-name", MODEL_ID, *extra)


def health(srv):
    status, _, body = srv.request("GET", "/health")
    return status, json.loads(body)


class Stack:
    """Prefill server, decode server and router, started in that order."""

    def __init__(self, common=(), prefill=(), decode=(), decode_kv_memory="64MiB"):
        """common: flags for both servers (the KV dtype, an API key)."""
        self.p = serve("--role", "prefill", "--kv-port", "0", "--prefill-weights", "bf16",
                       "--decode-weights", "bf16", *common, *prefill)
        self.common, self.decode, self.decode_kv_memory = common, decode, decode_kv_memory

    def __enter__(self):
        self.p.__enter__()
        self.kv_port = health(self.p)[1]["kv_port"]
        self.d = serve("--role", "decode", "--prefill-peer", f"127.0.0.1:{self.kv_port}",
                       "--prefill-weights", "int4", "--decode-weights", "int4", "--int4-group", "32",
                       *self.common, *self.decode, kv_memory=self.decode_kv_memory).__enter__()
        self.r = Proc("router", "--port", "0", "--prefill", f"http://127.0.0.1:{self.p.port}",
                      "--decode", f"http://127.0.0.1:{self.d.port}").__enter__()
        self.port = self.r.port  # clients talk to the router
        return self

    @property
    def base_url(self):
        return self.r.base_url

    def request(self, *args, **kwargs):
        return self.r.request(*args, **kwargs)

    def __exit__(self, *exc):
        for s in (self.r, self.d, self.p):
            try:
                s.__exit__(*exc)
            except Exception:
                pass
