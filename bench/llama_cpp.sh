#!/usr/bin/env bash
# Reference figures from llama.cpp on the same machine and model. Fetches the
# llama-cpp-python source distribution from PyPI (it vendors llama.cpp under
# vendor/llama.cpp), builds llama-bench and llama-quantize for this CPU only,
# converts the SmolLM2 Q4_1 GGUF to BF16 and runs llama-bench. Nothing it
# fetches or builds is committed: sources and binaries go to build-llamacpp/,
# the BF16 model to models/, the JSON to bench/out/ (all git-ignored).
#
# usage: bench/llama_cpp.sh [build|run|batched|kl|server|serve|all]   (default all; kl:
#        weight-quantization accuracy, see kl() below; batched: llama-batched-bench, see
#        batched() below; server builds llama-server, serve measures it over HTTP, see serve())
#   JOBS=2 bench/llama_cpp.sh    build with 2 jobs (default 1: the machine is shared)
#   THREADS=2 PP=512 TG=128      llama-bench settings
set -euo pipefail

stage="${1:-all}"
root="$(cd "$(dirname "$0")/.." && pwd)"
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
jobs="${JOBS:-1}"
threads="${THREADS:-2}"
pp="${PP:-512}"
tg="${TG:-128}"
work="$root/build-llamacpp"
src="$work/llama_cpp_python-$version"
bin="$work/build/bin"
q4="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
bf16="$root/models/SmolLM2-135M-Instruct.BF16.gguf"
out="$root/bench/out"

build() {
  mkdir -p "$work"
  if [[ ! -d "$src/vendor/llama.cpp" ]]; then
    python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work"
    tar -xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
  fi
  # The sdist keeps the submodule's git metadata: its HEAD names the llama.cpp commit.
  commit="$(cat "$src/.git/modules/vendor/llama.cpp/HEAD" 2>/dev/null || echo unknown)"
  echo "llama-cpp-python $version vendors llama.cpp commit $commit" | tee "$work/VERSION"
  cmake -S "$src/vendor/llama.cpp" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_OPENMP=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON >"$work/cmake.log"
  nice -n 10 ninja -C "$work/build" -j "$jobs" llama-bench llama-quantize llama-perplexity \
    llama-batched-bench
}

run() {
  [[ -x "$bin/llama-bench" ]] || { echo "llama-bench not built; run '$0 build' first" >&2; exit 1; }
  [[ -f "$q4" ]] || { echo "missing $q4 (scripts fetch it)" >&2; exit 1; }
  if [[ ! -f "$bf16" ]]; then
    "$bin/llama-quantize" --allow-requantize "$q4" "$bf16" BF16
  fi
  mkdir -p "$out"
  local json="$out/llama_cpp_smollm2_bf16_t${threads}.json"
  echo "load before run: $(uptime)" | tee "$out/llama_cpp_load.txt"
  "$bin/llama-bench" -m "$bf16" -t "$threads" -p "$pp" -n "$tg" -o json >"$json"
  echo "load after run: $(uptime)" | tee -a "$out/llama_cpp_load.txt"
  python3 - "$json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    kind = f"pp{r['n_prompt']}" if r['n_prompt'] else f"tg{r['n_gen']}"
    print(f"{kind}: {r['avg_ts']:.1f} ± {r['stddev_ts']:.1f} tokens/s  "
          f"(build {r.get('build_commit')}, {r.get('cpu_info')}, threads {r.get('n_threads')})")
PY
  echo "wrote $json"
}

# Batched decode on llama.cpp's side: llama-batched-bench prefills NPL
# sequences of NPP tokens each and then decodes NTG tokens in all of them at
# once; S_TG is its decode-only rate (NPL * NTG / decode seconds), the figure
# `kvant bench --batched` reports as decode_tok_s. Same BF16 model as run().
batched() {
  [[ -x "$bin/llama-batched-bench" ]] || { echo "llama-batched-bench not built; run '$0 build' first" >&2; exit 1; }
  [[ -f "$bf16" ]] || "$bin/llama-quantize" --allow-requantize "$q4" "$bf16" BF16 >/dev/null
  local npp="${NPP:-128}" ntg="${NTG:-128}" npl="${NPL:-1,8,32,64}"
  mkdir -p "$out"
  local json="$out/llama_batched_smollm2_bf16_t${threads}.jsonl"
  # The KV cache holds every sequence's prompt and generation.
  local ctx=$(( (npp + ntg) * ${npl##*,} + 256 ))
  "$bin/llama-batched-bench" -m "$bf16" -t "$threads" -tb "$threads" -c "$ctx" -b 2048 -ub 512 \
    -npp "$npp" -ntg "$ntg" -npl "$npl" --output-format jsonl >"$json" 2>"$work/batched.log"
  python3 - "$json" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    print(f"npl {r['pl']}: S_PP {r['speed_pp']:.1f}  S_TG {r['speed_tg']:.1f}  S {r['speed']:.1f} tokens/s")
PY
  echo "wrote $json"
}

# llama-server from the same sources (its own target, configured on demand so
# that the default build stays short).
server() {
  [[ -d "$src/vendor/llama.cpp" ]] || build
  cmake -S "$src/vendor/llama.cpp" -B "$work/build" -DLLAMA_BUILD_SERVER=ON >>"$work/cmake.log"
  nice -n 10 ninja -C "$work/build" -j "$jobs" llama-server
}

# HTTP serving on llama.cpp's side: llama-server with NP slots (continuous
# batching, each slot NPP + NTG tokens of context) on 127.0.0.1:PORT, driven
# by the same client as kvant serve: `kvant bench serve` (streaming
# /v1/completions, random prompt ids, exactly NTG tokens with ignore_eos).
serve() {
  [[ -x "$bin/llama-server" ]] || { echo "llama-server not built; run '$0 server' first" >&2; exit 1; }
  [[ -x "$root/build/kvant" ]] || { echo "build kvant first (scripts/build.sh)" >&2; exit 1; }
  [[ -f "$bf16" ]] || "$bin/llama-quantize" --allow-requantize "$q4" "$bf16" BF16 >/dev/null
  local port="${PORT:-18181}" np="${NP:-64}" npp="${NPP:-128}" ntg="${NTG:-64}"
  local conc="${CONC:-1,8,32,64}" rpc="${RPC:-2}"
  mkdir -p "$out"
  "$bin/llama-server" -m "$bf16" -t "$threads" -tb "$threads" -np "$np" \
    -c $(( np * (npp + ntg + 16) )) --host 127.0.0.1 --port "$port" >"$work/server.log" 2>&1 &
  local pid=$!
  trap "kill $pid 2>/dev/null; wait $pid 2>/dev/null" EXIT
  python3 - "$port" <<'PY'
import sys, time, urllib.request
for _ in range(240):
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2).status == 200:
            sys.exit(0)
    except Exception:
        pass
    time.sleep(0.5)
sys.exit("llama-server did not come up in 120 s (see build-llamacpp/server.log)")
PY
  "$root/build/kvant" bench serve --url "http://127.0.0.1:$port" --concurrency "$conc" \
    --prompt-tokens "$npp" --gen-tokens "$ntg" --requests-per-client "$rpc" \
    --out "$out/llama_server_smollm2_bf16_t${threads}.json"
}

# Weight-quantization accuracy on llama.cpp's side: a BF16 GGUF of each model
# (SmolLM2 and Gemma 3 270M; both sources are 4-bit GGUFs, so "BF16" means
# their dequantized weights), requantized to Q4_0 and Q4_K_M, scored by
# llama-perplexity with --kl-divergence against the BF16 logits on the same
# WikiText-2 test chunks kvant eval-weights uses (CTX tokens, CHUNKS chunks,
# the second half of each scored).
kl() {
  [[ -x "$bin/llama-perplexity" ]] || { echo "llama-perplexity not built; run '$0 build' first" >&2; exit 1; }
  local text="$root/../shared/data/wikitext-2-raw/wiki.test.raw" ctx="${CTX:-512}" chunks="${CHUNKS:-16}"
  mkdir -p "$out"
  for src in "$q4" "$root/models/gemma-3-270m-q4_k_m.gguf"; do
    [[ -f "$src" ]] || { echo "missing $src (scripts fetch it)" >&2; exit 1; }
    local stem base
    stem="$(basename "$src" .gguf)"
    base="$root/models/$stem.BF16.gguf"
    [[ -f "$base" ]] || "$bin/llama-quantize" --allow-requantize "$src" "$base" BF16 >/dev/null
    for q in Q4_0 Q4_K_M; do
      [[ -f "$root/models/$stem.$q.gguf" ]] ||
        "$bin/llama-quantize" --allow-requantize "$base" "$root/models/$stem.$q.gguf" "$q" >/dev/null
    done
    local kld="$work/$stem.kld"
    "$bin/llama-perplexity" -m "$base" -f "$text" -c "$ctx" --chunks "$chunks" -t "$threads" \
      --kl-divergence-base "$kld" >"$out/llama_kl_${stem}_bf16.txt" 2>&1
    grep -E "Final estimate" "$out/llama_kl_${stem}_bf16.txt" | sed "s/^/$stem BF16: /"
    for q in Q4_0 Q4_K_M; do
      "$bin/llama-perplexity" -m "$root/models/$stem.$q.gguf" -f "$text" -c "$ctx" --chunks "$chunks" \
        -t "$threads" --kl-divergence-base "$kld" --kl-divergence >"$out/llama_kl_${stem}_$q.txt" 2>&1
      echo "$stem $q:"
      sed -n '/====== Perplexity statistics/,$p' "$out/llama_kl_${stem}_$q.txt" |
        grep -E "^(Mean PPL\(Q\)|Mean    KLD|Maximum KLD|99.0%   KLD|Median  KLD|RMS Δp|Same top p)" || true
    done
  done
}

case "$stage" in
  build) build ;;
  run) run ;;
  kl) kl ;;
  batched) batched ;;
  server) server ;;
  serve) serve ;;
  all) build; run ;;
  *) echo "usage: $0 [build|run|batched|kl|server|serve|all]" >&2; exit 2 ;;
esac
