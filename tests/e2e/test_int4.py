"""INT4 weights end to end on the default model: `kvant quantize` (RTN and
activation-aware) writes a compressed-tensors directory from the GGUF, a
server loads it (weights INT4, tokenizer and chat template from the
directory) and answers through the official client; and one process serves
with BF16 prefill and INT4 decode weights from the GGUF itself."""
import json
import os
import subprocess
import tempfile

import openai

from kvant_server import MODEL_ID, Server, kvant_bin, model_path

CALIB = os.path.join(os.path.dirname(__file__), "../../data/calib/arc_challenge_train.txt")
MMLU_DEV = os.path.join(os.path.dirname(__file__), "../../data/calib/mmlu_dev.txt")


def quantize(out, *extra, log=None):
    r = subprocess.run([kvant_bin(), "quantize", "--in", model_path(), "--out", out, "--json", *extra],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    if log is not None:
        log.extend(r.stderr.splitlines())
    return json.loads(r.stdout)


def ask(srv):
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=120)
    r = client.chat.completions.create(model=MODEL_ID, temperature=0, max_tokens=24,
                                       messages=[{"role": "user", "content": "What is the capital of France?"}])
    return r.choices[0]


def test_quantized_directory_serves():
    with tempfile.TemporaryDirectory() as d:
        # Two calibration files, their tokens in the order given: a first one of
        # a few hundred tokens, so 1,024 are reached only through the second; a
        # third, past the cap, is not tokenized and not named.
        head = os.path.join(d, "head.txt")
        with open(CALIB, encoding="utf-8") as f, open(head, "w", encoding="utf-8") as g:
            g.write(f.read(2000))
        for method, extra in (("rtn", ["--group-size", "32"]),
                              ("awq", ["--group-size", "128", "--method", "awq", "--calib", head,
                                       "--calib", MMLU_DEV, "--calib", CALIB, "--calib-tokens", "1024"])):
            out = os.path.join(d, method)
            log = []
            s = quantize(out, *extra, log=log)
            if method == "awq":
                assert any(line.endswith(f"awq: 1024 calibration tokens from {head} + {MMLU_DEV}, "
                                         "searching scales...") for line in log), log
            assert s["quantized_tensors"] == 210  # 30 layers x q, k, v, o, gate, up, down
            # Scales and zero points counted: at most 0.29 of the BF16 bytes.
            assert s["quantized_int4_bytes"] <= 0.29 * s["quantized_bf16_bytes"], s
            with Server("--model-name", MODEL_ID, model=out) as srv:
                assert any("weights: prefill int4" in line for line in srv.log), srv.log
                c = ask(srv)
                assert c.finish_reason in ("stop", "length")
                assert len(c.message.content.strip()) > 0


def test_split_precision_serves_from_the_gguf():
    with Server("--prefill-weights", "bf16", "--decode-weights", "int4", "--int4-group", "32") as srv:
        assert any("prefill bf16" in line and "decode int4" in line and "both resident" in line
                   for line in srv.log), srv.log
        c = ask(srv)
        assert "Paris" in c.message.content, c.message.content


def test_clip_without_calibration_is_refused():
    with tempfile.TemporaryDirectory() as d:
        for extra, msg in ((["--clip"], "--clip weighs each column"),
                           (["--method", "awq", "--calib", CALIB, "--calib", os.path.join(d, "none.txt")],
                            "cannot open " + os.path.join(d, "none.txt")),
                           (["--format", "fp8", "--clip"], "are INT4 options")):
            r = subprocess.run([kvant_bin(), "quantize", "--in", model_path(), "--out", os.path.join(d, "x"),
                                *extra], capture_output=True, text=True, timeout=60)
            assert r.returncode != 0 and msg in r.stderr, r.stderr
            assert not os.path.exists(os.path.join(d, "x"))
