#!/usr/bin/env bash
# Installs what building and testing kvant needs on a Debian machine:
# the compiler toolchain and C++ libraries from Debian's packages, and a
# small Python venv (.venv) for the test tooling.
#   --oracle  also builds .venv-oracle with torch + transformers + gguf +
#             ml_dtypes, used only to regenerate the committed fixtures.
set -euo pipefail
cd "$(dirname "$0")/.."

oracle=0
for a in "$@"; do
  case "$a" in
    --oracle) oracle=1 ;;
    *) echo "setup.sh: unknown option $a" >&2; exit 2 ;;
  esac
done

pkgs=(build-essential cmake ninja-build pkg-config git
      libgtest-dev libgmock-dev libbenchmark-dev
      nlohmann-json3-dev libpcre2-dev libutf8proc-dev libxxhash-dev
      libspdlog-dev libfmt-dev libcli11-dev libomp-dev clang
      libboost-dev libboost-system-dev libopenmpi-dev openmpi-bin iproute2
      json-schema-test-suite)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  $PY -m venv .venv
fi
.venv/bin/pip install -q --disable-pip-version-check -r scripts/requirements-test.txt

if ((oracle)); then
  [[ -x .venv-oracle/bin/python ]] || $PY -m venv .venv-oracle
  .venv-oracle/bin/pip install -q --disable-pip-version-check -r scripts/requirements-oracle.txt
fi
echo "setup: done"
