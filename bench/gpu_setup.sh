# Sourced by the bench scripts and GPU test runs before a run on a GPU machine without network.
# - Wheels in .whl/ are installed into the interpreter's own site-packages (not a --target folder: the bubblewrap
#   sandbox binds site-packages, so a PYTHONPATH folder would be invisible inside it), then this checkout, editable.
# - bubblewrap and libcap2 .debs in .deb/ are unpacked with dpkg -x into /tmp/debroot, whose usr/bin goes on PATH.
# Prints the GPU, its driver and the memory in use.
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade .whl/*.whl || return 1
  python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . >/dev/null 2>&1 || return 1
fi
if ! command -v bwrap >/dev/null 2>&1 && compgen -G ".deb/*.deb" >/dev/null; then
  for deb in .deb/*.deb; do dpkg -x "$deb" /tmp/debroot; done
  export PATH=/tmp/debroot/usr/bin:$PATH
  export LD_LIBRARY_PATH=/tmp/debroot/usr/lib/x86_64-linux-gnu:/tmp/debroot/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
