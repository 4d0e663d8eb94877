"""`kvant plan` as a user runs it: --mtp counts the first multi-token-prediction
layer's weights and K/V, and refuses a config without one."""
import json
import os
import subprocess

from kvant_server import kvant_bin

PLAN = os.path.join(os.path.dirname(__file__), "..", "fixtures", "plan")


def plan(*args):
    p = subprocess.run([kvant_bin(), "plan", *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def test_mtp_counts_one_more_layer_and_its_weights():
    cfg = os.path.join(PLAN, "deepseek_v3_config.json")
    rc, out, err = plan("-c", cfg, "--memory", "1GiB", "--json")
    assert rc == 0, err
    rc, out_mtp, err = plan("-c", cfg, "--memory", "1GiB", "--json", "--mtp")
    assert rc == 0, err
    a, b = json.loads(out), json.loads(out_mtp)
    assert b["layers"] == a["layers"] + 1
    assert b["dtypes"][0]["bytes_per_token_per_rank"] > a["dtypes"][0]["bytes_per_token_per_rank"]
    assert b["dtypes"][0]["pages"] < a["dtypes"][0]["pages"]
    rc, text, err = plan("-c", os.path.join(PLAN, "glm_5.2_config.json"), "--gpus", "8", "--mtp")
    assert rc == 0, err
    assert "served, with the first MTP layer" in text and "left out of the serving total" not in text
    rc, _, err = plan("-c", os.path.join(PLAN, "smollm2_135m_config.json"), "--memory", "1GiB",
                      "--mtp")
    assert rc != 0 and "num_nextn_predict_layers" in err
