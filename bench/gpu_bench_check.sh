#!/usr/bin/env bash
# `make bench-check` on the GPU machine, in calls that fit its 10-minute limit: the tests that need real speeds
# (`timing`, the gpu-marked ones among them) in one process with nothing beside them, or the real-world suite verified
# end to end (`suite`: 504 s on one H200 host's 16 cores, its timm and torchvision problems included). Each test has
# its own timeout (570 s); the whole log goes to $OUT/bench-check-<part>.log and the summary is printed last.
#   bash bench/gpu_bench_check.sh timing      (carry .whl and .deb: bench/gpu_fetch.sh)
#   bash bench/gpu_bench_check.sh suite
set -uo pipefail
part=${1:?timing or suite}
source bench/gpu_setup.sh || exit 1
log=${OUT:-.}/bench-check-$part.log
python3 -m pytest -q -p no:cacheprovider -m "$part" tests/bench tests/runner --timeout "${TEST_TIMEOUT_S:-570}" \
  -rA --durations=10 2>&1 | tee "$log" | grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed|^E " | tail -40
