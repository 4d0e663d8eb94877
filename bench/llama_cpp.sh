#!/usr/bin/env bash
# Reference figures from llama.cpp on the same machine and model. Fetches the
# llama-cpp-python source distribution from PyPI (it vendors llama.cpp under
# vendor/llama.cpp), builds llama-bench and llama-quantize for this CPU only,
# converts the SmolLM2 Q4_1 GGUF to BF16 and runs llama-bench. Nothing it
# fetches or builds is committed: sources and binaries go to build-llamacpp/,
# the BF16 model to models/, the JSON to bench/out/ (all git-ignored).
#
# usage: bench/llama_cpp.sh [build|run|all]   (default all)
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
  nice -n 10 ninja -C "$work/build" -j "$jobs" llama-bench llama-quantize llama-perplexity
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

case "$stage" in
  build) build ;;
  run) run ;;
  all) build; run ;;
  *) echo "usage: $0 [build|run|all]" >&2; exit 2 ;;
esac
