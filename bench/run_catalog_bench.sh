# One batch of the catalog bench: `fusebot bench` over the problems of bench/suites/catalog.txt that match the globs.
#
# Once:       python bench/make_kb_suite.py --kernelbench PATH/TO/KernelBench     (fills out/kb-suite, git-ignored)
# Then:       bash bench/run_catalog_bench.sh 'level1_*,level2_*'                  (or one batch at a time:
#             'level1_2*', then 'level1_3*', ...: the table in $OUTDIR keeps every batch's rows, and a batch cut off
#             by BENCH_TIMEOUT resumes from its traces)
# Bring $OUTDIR's README.md and results.json to bench/results/<gpu>-catalog/ and name the commit (bench.log's first line).
set -u
BATCH=${1:?globs over out/kb-suite without .py, joined by commas, e.g. "level1_2*" or "level1_23*,level1_40*"}
BUDGET=${BUDGET:-45}          # search seconds per problem (the table in bench/results/h100-catalog used 45)
ROUNDS=${ROUNDS:-6}           # enough that the wall budget, not the rounds, ends a search
IMPLS=${IMPLS:-3}
OUTDIR=${OUTDIR:-out/h100-catalog}
# BENCH_TIMEOUT (s, default 540) stops the bench before an outer limit, so the table so far is still written
# On a machine without network, fusebot's dependencies come from wheels in .whl/ (bench/gpu_setup.sh).
source bench/gpu_setup.sh || exit 1
mkdir -p "$OUTDIR"
echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)" >> "$OUTDIR/bench.log"
# The H100 80GB HBM3's copy rate (the fastest sample of a 4 GB device copy), given so that every batch of the table
# shares one floor; on any other GPU the harness measures its own.
BW=""; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q "H100" && BW="--bandwidth 3.01e12"
timeout "${BENCH_TIMEOUT:-540}" python3 -m bot.cli bench out/kb-suite --out "$OUTDIR" --backend cuda $BW \
  --budget-seconds "$BUDGET" --rounds "$ROUNDS" --ideas 2 --implementations "$IMPLS" --verbose \
  --pattern "$(echo "$BATCH" | sed 's/,/.py,/g').py" 2>&1 | tee -a "$OUTDIR/bench.log" | grep -v " INFO " | tail -40
if [ -n "${OUT:-}" ]; then  # a remote run that returns the files under $OUT: the problems' folders as one archive
  mkdir -p "$OUT/$(basename "$OUTDIR")"
  cp "$OUTDIR/README.md" "$OUTDIR/results.json" "$OUTDIR/bench.log" "$OUT/$(basename "$OUTDIR")/"
  tar -czf "$OUT/$(basename "$OUTDIR")/problems.tgz" -C "$OUTDIR" problems
fi
cat "$OUTDIR/README.md"
