#!/usr/bin/env bash
# Create .venv and install Tether and bubblewrap (DeepCoder's sandbox); `--test` adds the
# test tools (pytest, Playwright and Debian's Chromium for the monitor's browser test).
#
# torch is installed first and pinned to 2.13.0, so pip never picks a newer
# (multi-GB CUDA) build.  On a machine without a GPU, point TETHER_TORCH_INDEX at
# PyTorch's CPU wheel index to get the small CPU build; where pip already finds
# a CPU build of 2.13.0 (as on Tether's dev and CI machines) nothing is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TETHER_VENV:-.venv}
WITH_TESTS=0
for arg in "$@"; do
  case "$arg" in
    --test) WITH_TESTS=1 ;;
    *) echo "usage: bash scripts/setup.sh [--test]" >&2; exit 2 ;;
  esac
done
PYTHON=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q "torch==2.13.0" ${TETHER_TORCH_INDEX:+--index-url "$TETHER_TORCH_INDEX"}
fi
if [ "$WITH_TESTS" = 0 ]; then
  "$VENV/bin/python" -m pip install -q -e .
else
  "$VENV/bin/python" -m pip install -q -e ".[test]"
fi
# DeepCoder runs model-written programs under bubblewrap (sandbox.isolation: auto refuses
# to run them without it); the monitor's browser test drives the system Chromium
# (Debian's package) via Playwright.
APT_PACKAGES=()
command -v bwrap >/dev/null || APT_PACKAGES+=(bubblewrap)
if [ "$WITH_TESTS" = 1 ] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  APT_PACKAGES+=(chromium)
fi
if [ "${#APT_PACKAGES[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${APT_PACKAGES[@]}"
  else
    echo "note: install ${APT_PACKAGES[*]} (e.g. sudo apt-get install ${APT_PACKAGES[*]}):" \
         "bubblewrap isolates DeepCoder's untrusted code, chromium runs the browser test"
  fi
fi
"$VENV/bin/python" -c "
from tether.envs.sandbox import SandboxUnavailable, resolve_isolation
try:
    resolve_isolation('auto'); print('DeepCoder sandbox: bubblewrap works')
except SandboxUnavailable as exc:
    print(f'note: {exc}')"
"$VENV/bin/python" -c "import torch, tether; print(f'tether {tether.__version__} ready: torch {torch.__version__}, CUDA {torch.version.cuda}')"
