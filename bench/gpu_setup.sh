# Sourced at the start of every device run: carried wheels into /tmp/site, the checkout on PYTHONPATH.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || return 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
