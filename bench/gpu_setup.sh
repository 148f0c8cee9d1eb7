# Sourced by the bench scripts before a run. With wheels in .whl/ (a GPU machine without network), installs them into
# /tmp/site and puts them and this checkout on PYTHONPATH; otherwise fusebot must already be installed (make test
# sets up .venv). Prints the GPU, its driver and the memory in use.
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || return 1
  export PYTHONPATH=/tmp/site:$PWD
  python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . >/dev/null 2>&1 || true
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
