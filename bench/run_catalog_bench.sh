# One batch of the catalog's H100 bench (issue 4, item 4), for a device run (at most 10 minutes a command).
#
# Here, once:   python bench/make_kb_suite.py --kernelbench PATH/TO/KernelBench     (fills out/kb-suite, git-ignored)
# On the device, carrying .whl, out/kb-suite and out/h100-catalog (the table and traces so far), one batch a command:
#   bash bench/run_catalog_bench.sh 'level1_2*'          # then 'level1_3*', 'level1_4*', ..., 'level2_*'
# The table and each problem's folder accumulate in out/h100-catalog (a cut-off batch resumes from its traces; the
# table keeps every batch's rows) and are copied to $OUT; bring them back to bench/results/h100-catalog/ and commit
# README.md and results.json.
set -u
BATCH=${1:?globs over out/kb-suite without .py, joined by commas, e.g. "level1_2*" or "level1_23*,level1_40*"}
BUDGET=${BUDGET:-90}          # search seconds per problem (the issue allows 300; one device command allows 600)
# BENCH_TIMEOUT (s, default 540) stops the bench itself before the device command's limit, so the results still come back
ROUNDS=${ROUNDS:-6}           # with outputs handed over by CUDA IPC a 6 GB problem's candidate verifies in ~3 s:
IMPLS=${IMPLS:-3}             # the wall budget, not the rounds, should end a search
source bench/gpu_setup.sh || exit 1
mkdir -p out/h100-catalog
# The H100's measured copy bandwidth (bench/results/h100-harness); on any other GPU the harness measures its own.
BW=""; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q "H100" && BW="--bandwidth 3.01e12"
timeout "${BENCH_TIMEOUT:-540}" python3 -m bot.cli bench out/kb-suite --out out/h100-catalog --backend cuda $BW \
  --budget-seconds "$BUDGET" --rounds "$ROUNDS" --ideas 2 --implementations "$IMPLS" --verbose --pattern "$(echo "$BATCH" | sed 's/,/.py,/g').py" 2>&1 | tee -a out/h100-catalog/bench.log | grep -v " INFO " | tail -40
if [ -n "${OUT:-}" ]; then  # the device returns files at most a few folders deep: the problems' folders as one archive
  mkdir -p "$OUT/h100-catalog" && cp out/h100-catalog/README.md out/h100-catalog/results.json out/h100-catalog/bench.log "$OUT/h100-catalog/"
  tar -czf "$OUT/h100-catalog/problems.tgz" -C out/h100-catalog problems
fi
cat out/h100-catalog/README.md
