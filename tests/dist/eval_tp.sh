#!/usr/bin/env bash
# `kvant eval` over two ranks (--tp 2, under mpirun) against one process, on
# SmolLM2: multiple choice (ARC, zero-shot), WikiText windows and one GSM8K
# generation. Rank 0 runs the tasks and rank 1 its share of every forward
# (src/eval/eval_link.h). Every item must be there; log-likelihoods and
# perplexities within the TP tolerance (partial sums add in another order;
# a choice's log-likelihood sums its tokens' differences: measured 0.27 at
# most over these 12 items' choices, and 0.004 per WikiText token); the
# predicted choices agree on 10 of 12 at least; GSM8K must finish.
# Usage: eval_tp.sh KVANT MODEL PYTHON MPIRUN [MPIRUN FLAGS...]
set -euo pipefail
kvant=$1 model=$2 python=$3
shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(-m "$model" --tasks arc_challenge,wikitext,gsm8k
        --limit arc_challenge=12,wikitext=3,gsm8k=1 --arc-shots 0 --gsm8k-shots 0
        --max-gen-tokens 16 --window 160 --stride 64 --max-len 512 --chunk 64 -q --no-resume)
"$kvant" eval "${common[@]}" -t 2 --out "$tmp/one.json" > /dev/null
"$@" -np 2 "$kvant" eval "${common[@]}" -t 1 --tp 2 --out "$tmp/tp2.json" > "$tmp/tp2.md"
test ! -e "$tmp/tp2.json.partial.jsonl"
"$python" - "$tmp/one.json" "$tmp/tp2.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert b["config"]["ranks"] == {"tp": 2, "ep": 1}, b["config"]
worst_ll = 0.0
ia, ib = a["tasks"]["arc_challenge"]["items"], b["tasks"]["arc_challenge"]["items"]
assert [x["id"] for x in ia] == [x["id"] for x in ib] and len(ia) == 12
agree = 0
for x, y in zip(ia, ib):
    for p, q in zip(x["ll"], y["ll"], strict=True):
        worst_ll = max(worst_ll, abs(p - q))
    agree += x["pred"] == y["pred"]
wa, wb = a["tasks"]["wikitext"]["items"], b["tasks"]["wikitext"]["items"]
assert [x["id"] for x in wa] == [x["id"] for x in wb] and len(wa) == 3
worst_ppl = max(abs(x["nll_per_token"] - y["nll_per_token"]) for x, y in zip(wa, wb))
ga, gb = a["tasks"]["gsm8k"]["items"], b["tasks"]["gsm8k"]["items"]
assert len(ga) == len(gb) == 1
print(f"eval tp2 vs one process: ARC choice log-likelihood |diff| max {worst_ll:.4f}, "
      f"predictions agree on {agree} of {len(ia)}, "
      f"WikiText nll/token |diff| max {worst_ppl:.4f}, GSM8K {len(gb)} item generated")
assert worst_ll < 0.6, worst_ll
assert agree >= 10, agree
assert worst_ppl < 0.02, worst_ppl
PY
