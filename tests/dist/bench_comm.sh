#!/usr/bin/env bash
# `kvant bench --tp 2 --json` under mpirun, with and without --comm-split:
# one JSON object (rank 0's), each rank's communication share, and with the
# split each share equal to its wait plus its transfer, all within [0, 1],
# the transfer above zero (two ranks exchange every step).
# Usage: bench_comm.sh KVANT MODEL PYTHON MPIRUN [MPIRUN FLAGS...]
set -euo pipefail
kvant=$1 model=$2 python=$3
shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(bench -m "$model" --prompt-tokens 8 --gen-tokens 8 --reps 1 --json -t 1 --tp 2)
"$@" -np 2 "$kvant" "${common[@]}" > "$tmp/plain.out"
"$@" -np 2 "$kvant" "${common[@]}" --comm-split > "$tmp/split.out"
"$python" - "$tmp/plain.out" "$tmp/split.out" <<'PY'
import json, sys
def load(p):
    text = open(p).read()
    objs = [json.loads(l) for l in text.splitlines() if l.startswith("{")]
    assert len(objs) == 1, text  # rank 0 prints, rank 1 does not
    return objs[0]
a, b = load(sys.argv[1]), load(sys.argv[2])
for j in (a, b):
    assert j["tp"] == 2 and len(j["decode_comm_share_ranks"]) == 2, j
    assert all(0 < s <= 1 for s in j["decode_comm_share_ranks"]), j
    assert j["decode_comm_share_min"] == min(j["decode_comm_share_ranks"]), j
assert "decode_comm_wait_share_ranks" not in a, a
w, t = b["decode_comm_wait_share_ranks"], b["decode_comm_transfer_share_ranks"]
for s, x, y in zip(b["decode_comm_share_ranks"], w, t, strict=True):
    assert 0 <= x <= 1 and 0 < y <= 1 and abs(x + y - s) < 2e-4, (s, x, y)
print("bench --tp 2: shares", a["decode_comm_share_ranks"], "split: share",
      b["decode_comm_share_ranks"], "wait", w, "transfer", t)
PY
