#!/usr/bin/env bash
# Creates .venv and installs fusebot into it. Safe to run again: it only installs what is missing or changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  if "$PY" -c "import torch" 2>/dev/null; then
    # A machine with torch already installed (a GPU image, say): use it instead of downloading another.
    "$PY" -m venv --system-site-packages .venv
  else
    "$PY" -m venv .venv
  fi
fi
VPY=.venv/bin/python
if ! "$VPY" -c "import torch" 2>/dev/null; then
  # torch first, pinned: a bare `torch` requirement would fetch several GB of CUDA wheels on a CPU machine.
  # FUSEBOT_TORCH_INDEX_URL picks the build (CI on GitHub: PyTorch's CPU index); unset, pip's own configuration does.
  "$VPY" -m pip install -q --disable-pip-version-check ${FUSEBOT_TORCH_INDEX_URL:+--index-url "$FUSEBOT_TORCH_INDEX_URL"} \
    "torch==${FUSEBOT_TORCH_VERSION:-2.13.0}"
fi
stamp=.venv/.fusebot-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  if grep -qx "include-system-site-packages = false" .venv/pyvenv.cfg; then
    # uv resolves, downloads and installs the rest in parallel (this script from a fresh clone, on the 2-core CI
    # machine with a load average of 7-8: 4 min 35 s and 98 s of CPU, against 8 min 17 s and 139 s with pip alone).
    # It never sees a venv's system site-packages, so a venv over a system torch keeps pip. Bytecode compiled as pip
    # does: the sandbox mounts the venv read-only, and a module without its .pyc is compiled at every sandboxed start.
    "$VPY" -m pip install -q --disable-pip-version-check "uv>=0.5"
    "$VPY" -m uv pip install --python "$VPY" --quiet --compile-bytecode -e ".[dev]"
  else
    "$VPY" -m pip install -q --disable-pip-version-check -e ".[dev]"
  fi
  touch "$stamp"
fi
if ! command -v bwrap >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  # The sandbox untrusted code runs in (make test, make demo, fusebot eval/optimize/worker); installed where this
  # user may install packages without a password (root, or passwordless sudo).
  SUDO=$([ "$(id -u)" = 0 ] && echo "" || { sudo -n true 2>/dev/null && echo sudo -n; } || echo none)
  if [ "$SUDO" != none ]; then
    $SUDO apt-get update -qq >/dev/null && $SUDO apt-get install -y -qq bubblewrap >/dev/null || true
  fi
fi
if ! command -v bwrap >/dev/null 2>&1; then
  echo "bootstrap: bubblewrap (bwrap) is not installed: fusebot will refuse to evaluate code here" \
       "(Debian/Ubuntu: apt-get install bubblewrap; or FUSEBOT_UNSAFE_NO_SANDBOX=1 at your own risk)" >&2
fi
