"""`kvant serve` over two processes under Open MPI's mpirun (--tp 2): rank 0
serves HTTP, rank 1 follows. Greedy completions equal one process's
`kvant generate`; a rank that dies (SIGKILL) or hangs (SIGSTOP) mid-stream
ends the job and closes the client's connection within a bound, never a hang;
ranks started with different flags are refused at start-up.

Every job is started in a session of its own; each test ends by killing
whatever is left in that session (mpirun and its ranks, which Open MPI puts
in process groups of their own), continuing stopped ones first."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

from kvant_server import MODEL_ID, Server, kvant_bin, model_path, sse_events


MPIRUN_BIN = os.environ.get("KVANT_MPIRUN", "mpirun")  # ctest passes CMake's MPIEXEC_EXECUTABLE


def _open_mpi():
    if not shutil.which(MPIRUN_BIN):
        return f"no {MPIRUN_BIN} on PATH"
    try:
        v = subprocess.run([MPIRUN_BIN, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"mpirun --version failed: {e}"
    # mpirun names itself "(Open MPI)", mpiexec "(OpenRTE)": both Open MPI's.
    if "Open MPI" not in v.stdout + v.stderr and "OpenRTE" not in v.stdout + v.stderr:
        return "mpirun is not Open MPI's (these tests use its flags and MPMD syntax)"
    return None


_why_not = _open_mpi()
pytestmark = pytest.mark.skipif(_why_not is not None, reason=f"distributed serve tests: {_why_not}")

# As tests/CMakeLists.txt runs the dist_* tests: as root too, more ranks than
# cores, unbound, over TCP on the loopback only.
MPIRUN = [MPIRUN_BIN, "--oversubscribe", "--allow-run-as-root", "--bind-to", "none",
          "--mca", "pml", "ob1", "--mca", "btl", "self,tcp",
          "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]
START_S = 60  # model load on both ranks, until rank 0 listens


def serve_args(*extra, dist_timeout=30):
    return [kvant_bin(), "serve", "-m", model_path(), "-t", "1", "--tp", "2", "--port", "0",
            "--kv-memory", "64MiB", "--dist-timeout", str(dist_timeout), *extra]


def _stat_fields(pid):
    """(state, ppid, pgrp, session) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rindex(")") + 2:].split()
    return rest[0], int(rest[1]), int(rest[2]), int(rest[3])


def session_pids(sid):
    """Live (not zombie) processes of session `sid`."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat_fields(int(name))
            if st and st[3] == sid and st[0] != "Z":
                out.append(int(name))
    return out


def wait_session_empty(sid, timeout):
    """Waits for the session's processes to end; those still there, with
    their state and command line."""
    deadline = time.time() + timeout
    while True:
        left = session_pids(sid)
        if not left or time.time() > deadline:
            break
        time.sleep(0.05)
    out = []
    for pid in left:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:80]
        except OSError:
            cmd = "?"
        st = _stat_fields(pid)
        out.append(f"{pid} state {st[0] if st else 'gone'}: {cmd}")
    return out


def kill_session(sid):
    """Everything left in the session: stopped ones continued, then SIGKILL;
    what is still there after 10 s (nothing, unless a process cannot die)."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        for pid in session_pids(sid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    return wait_session_empty(sid, 10)


class DistServer(Server):
    """`mpirun -np 2 kvant serve --tp 2` in a session of its own; request(),
    metrics() and the port come from Server."""

    def __init__(self, *extra, dist_timeout=30):
        super().__init__()
        self.args = [*MPIRUN, "-np", "2", *serve_args(*extra, dist_timeout=dist_timeout)]
        self.drain = None

    def __enter__(self):
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()
        try:
            deadline = time.time() + START_S
            while self.port is None:
                m = re.search(r"on http://[^:]+:(\d+)/v1", "".join(self.log))
                if m:
                    self.port = int(m.group(1))
                elif self.proc.poll() is not None:
                    raise RuntimeError(f"mpirun exited {self.proc.returncode}: " + self.text())
                elif time.time() > deadline:
                    raise RuntimeError(f"rank 0 did not listen within {START_S} s: " + self.text())
                else:
                    time.sleep(0.05)
        except BaseException:
            self.__exit__()
            raise
        return self

    def text(self):
        return "".join(self.log)

    def rank_pid(self, rank):
        """The pid of a rank: a child of mpirun with OMPI_COMM_WORLD_RANK=rank."""
        want = f"OMPI_COMM_WORLD_RANK={rank}".encode()
        for pid in session_pids(self.proc.pid):
            st = _stat_fields(pid)
            if not st or st[1] != self.proc.pid:
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if want in f.read().split(b"\0"):
                        return pid
            except OSError:
                pass
        raise AssertionError(f"no rank {rank} among mpirun's children")

    def wait_log(self, timeout=5):
        """The whole forwarded stderr, once mpirun has exited and closed it."""
        self.drain.join(timeout)
        return self.text()

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            # A clean stop first: mpirun forwards SIGTERM to the ranks.
            t0 = time.time()
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=15)
                print(f"[mpirun: SIGTERM -> exit {rc} in {time.time() - t0:.1f} s]")
                if rc != 0:
                    print("---- mpirun's stderr ----\n" + self.wait_log().rstrip() + "\n----")
            except subprocess.TimeoutExpired:
                print("[mpirun: no exit within 15 s of SIGTERM; killed]")
        left = kill_session(self.proc.pid)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
        assert not left, f"processes left in the job's session after SIGKILL: {left}"


def post_completion(port, prompt, max_tokens, stream, ignore_eos=False, timeout=60):
    body = json.dumps({"model": MODEL_ID, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "stream": stream, "ignore_eos": ignore_eos}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return s


def read_until_closed(s, deadline):
    """Reads until the server closes (or resets) the connection or the
    deadline passes: (bytes, "eof" | "reset" | "timeout")."""
    data = b""
    while True:
        left = deadline - time.time()
        if left <= 0:
            return data, "timeout"
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            return data, "timeout"
        except (ConnectionResetError, BrokenPipeError):
            return data, "reset"
        if not chunk:
            return data, "eof"
        data += chunk


def read_some(s, n_bytes, timeout=30):
    got = b""
    deadline = time.time() + timeout
    while len(got) < n_bytes:
        s.settimeout(max(0.1, deadline - time.time()))
        chunk = s.recv(4096)
        assert chunk, "the server closed early: " + got.decode(errors="replace")
        got += chunk
    return got


def generate_text(prompt, n):
    """One process's greedy text; `generate` prints it and then one newline."""
    p = subprocess.run([kvant_bin(), "generate", "-m", model_path(), "-p", prompt, "-n", str(n),
                        "--temp", "0", "-t", "1"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.endswith("\n"), repr(p.stdout)
    return p.stdout[:-1]


def stream_text(data):
    """The text of a streamed completion (raw HTTP bytes), and its finish."""
    head, _, body = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        # The complete chunks of what arrived; a cut-off last one is dropped.
        out = b""
        while True:
            size_line, sep, rest = body.partition(b"\r\n")
            if not sep:
                break
            size = int(size_line.split(b";")[0], 16)
            if size == 0 or len(rest) < size + 2:
                break
            out += rest[:size]
            body = rest[size + 2:]
        body = out
    # Only whole events (a cut-off last one is dropped).
    body = body[:body.rfind(b"\n\n") + 2] if b"\n\n" in body else b""
    events, done = sse_events(body)
    text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
    finish = [e["choices"][0].get("finish_reason") for e in events if e.get("choices")]
    return text, done, [f for f in finish if f]


GREEDY = [("The capital of France is", 12), ("Once upon a time, a small robot", 20),
          ("Red, green, blue. Red, green, blue. Red, green, blue. Red,", 16)]


def test_tp2_greedy_equals_one_process():
    want = {p: generate_text(p, n) for p, n in GREEDY}
    with DistServer() as srv:
        assert srv.request("GET", "/health")[0] == 200
        for prompt, n in GREEDY:
            status, _, body = srv.request("POST", "/v1/completions",
                                          {"model": MODEL_ID, "prompt": prompt, "max_tokens": n,
                                           "temperature": 0})
            assert status == 200, body
            got = json.loads(body)["choices"][0]["text"]
            print(f"\n{prompt!r}: generate {want[prompt]!r}, TP=2 serve {got!r}")
            assert got == want[prompt]
            # The stream carries the same text.
            s = post_completion(srv.port, prompt, n, stream=True)
            data, how = read_until_closed(s, time.time() + 60)
            s.close()
            text, done, _ = stream_text(data)
            assert done, data
            assert text == want[prompt]
            # Speculative decoding: every rank drafts from the same tokens and
            # draws the same tokens, so the text is the same.
            status, _, body = srv.request("POST", "/v1/completions",
                                          {"model": MODEL_ID, "prompt": prompt, "max_tokens": n,
                                           "temperature": 0, "speculative": True})
            assert status == 200, body
            assert json.loads(body)["choices"][0]["text"] == want[prompt]
        status, _, body = srv.request("GET", "/metrics")
        assert b"kvant_spec_decode_accepted_tokens_total 0\n" not in body, body


def _kill_mid_stream(sig, dist_timeout, bound):
    """Starts a long stream, sends `sig` to rank 1 once tokens flow, and
    measures when the client's connection ends and when mpirun exits."""
    with DistServer(dist_timeout=dist_timeout) as srv:
        rank1 = srv.rank_pid(1)
        s = post_completion(srv.port, "Write a long story about a cat.", 400, stream=True,
                            ignore_eos=True)
        try:
            head = read_some(s, 600)  # headers and a few tokens: the request is in flight
            t0 = time.time()
            os.kill(rank1, sig)
            data, how = read_until_closed(s, t0 + bound)
            t_client = time.time() - t0
        finally:
            s.close()
        try:
            rc = srv.proc.wait(timeout=max(0.1, t0 + bound - time.time()))
        except subprocess.TimeoutExpired:
            rc = None
        t_mpirun = time.time() - t0
        log = srv.wait_log() if rc is not None else srv.text()
        # Every rank ends with the job: none outlives mpirun (given a moment
        # to finish dying).
        orphans = wait_session_empty(srv.proc.pid, 5) if rc is not None else []
        text, done, finish = stream_text(head + data)
        print(f"\n{sig.name} to rank 1 (pid {rank1}), --dist-timeout {dist_timeout}: "
              f"client connection {how} after {t_client:.2f} s, "
              f"mpirun exit {rc} after {t_mpirun:.2f} s (bound {bound} s); "
              f"the client got {len(text)} chars, finish {finish}, [DONE] {done}; "
              f"left 5 s after mpirun's exit: {orphans or 'none'}")
        print("---- mpirun's stderr ----\n" + log.rstrip() + "\n----")
        assert how in ("eof", "reset"), f"the client's read did not end within {bound} s"
        assert rc is not None, f"mpirun still ran {bound} s after {sig.name}"
        assert rc != 0
        assert not orphans, f"ranks outlived mpirun: {orphans}"
        # Killed mid-stream: it did not run to its 400 tokens.
        assert finish != ["length"]
        return log


def test_sigkill_rank1_mid_stream_ends_the_job():
    # A long --dist-timeout: the job must end because mpirun saw a rank die,
    # not because a collective timed out.
    _kill_mid_stream(signal.SIGKILL, dist_timeout=60, bound=20)


def test_sigstop_rank1_mid_stream_times_out():
    log = _kill_mid_stream(signal.SIGSTOP, dist_timeout=4, bound=4 + 15)
    assert "did not complete within" in log
    assert "a peer rank has died or hangs" in log


def test_mismatched_flags_are_refused():
    args = [*MPIRUN, "-np", "1", *serve_args(), ":", "-np", "1", *serve_args("--max-running", "8")]
    t0 = time.time()
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=60)
        elapsed = time.time() - t0
    finally:
        left = kill_session(p.pid)
        if p.poll() is None:
            p.wait(timeout=15)
    assert not left, f"processes left in the job's session after SIGKILL: {left}"
    msg = "loaded a different model or runs different options than rank 0"
    print(f"\nmismatched flags: mpirun exit {p.returncode} after {elapsed:.2f} s; "
          f"{out.count(msg)} rank(s) printed the refusal")
    print("---- mpirun's output ----\n" + out.rstrip() + "\n----")
    assert p.returncode != 0
    assert msg in out
    assert "on http://" not in out  # no rank started serving
