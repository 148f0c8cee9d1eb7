#!/usr/bin/env bash
# The demo's pull request, for examples/row_gain.py and real-world modules, checked as a maintainer checks it: the PR's
# branch in a virtualenv of torch, pytest and the modules' own libraries only (bench/clean_venv.py), nothing of
# fusebot, no nvcc on PATH, a read-only home; there the PR's own tests (`pytest fusebot_kernels`), the probe of what
# they do not cover (bench/clean_probe.py) and each bench script, whose line states the PR's figure beside its own.
# Writes to $OUT: pr-body.md, demo.log, pytest.log, probe-<target>.log, bench-<target>.log.
#   bash bench/clean_venv.sh [wall_seconds]            (GPU machine: carry .whl and .deb; or here, on the CPU)
# MODULES: the real-world modules (suite paths without .py), default three; REALWORLD_SUITE_SMALL=1: their CI sizes.
set -uo pipefail
cd "$(dirname "$0")/.."
fusebot=$PWD
wall=${1:-420}
out=${OUT:-/tmp/clean-venv-out}
modules=${MODULES:-"bf16/llama_rmsnorm fp32/llama_causal_lm_loss fp32/bert_residual_layernorm"}
if command -v nvidia-smi >/dev/null 2>&1; then source bench/gpu_setup.sh || exit 1; fi
python=$(command -v python3)
[ -x .venv/bin/python ] && python=$fusebot/.venv/bin/python
mkdir -p "$out"
work=$(mktemp -d)
mkdir -p "$work/examples" "$work/tmp" "$work/home"
cp examples/row_gain.py "$work/examples/"
for m in $modules; do  # marked as a maintainer marks a module, under a class name of its own
  file=${m//\//_}
  cls=$(sed -r 's/(^|_)([a-z0-9])/\U\2/g' <<<"$file")
  sed "s/^class Model(/# fusebot: optimize\nclass $cls(/" "bench/suites/realworld/$m.py" >"$work/examples/$file.py"
done
"$python" -m bot.cli demo --workdir "$work/demo" --examples "$work/examples" --rounds 1 --wall-seconds "$wall" \
  >"$out/pr-body.md" 2>"$out/demo.log"
echo "demo: exit $? ($(grep -cE '^\| ' "$out/pr-body.md") table lines in the PR body)"
branch=fusebot/main/examples
git clone -q -b "$branch" "$work/demo/repo" "$work/pr" || { echo "no branch $branch: nothing was proposed"; exit 1; }
"$python" bench/clean_venv.py "$work/venv" --with transformers
chmod 555 "$work/home"
clean=(env -i "PATH=$work/venv/bin:/usr/bin:/bin" "HOME=$work/home" "TMPDIR=$work/tmp" "LANG=C.UTF-8"
  "TRITON_CACHE_DIR=$work/tmp/triton" ${REALWORLD_SUITE_SMALL:+"REALWORLD_SUITE_SMALL=$REALWORLD_SUITE_SMALL"})
cd "$work/pr" || exit 1
"${clean[@]}" python -m pytest -q -p no:cacheprovider -rA fusebot_kernels >"$out/pytest.log" 2>&1
echo "pytest fusebot_kernels: exit $?: $(tail -1 "$out/pytest.log")"
status=0
for folder in fusebot_kernels/*/; do
  target=$(basename "$folder")
  [ -f "$folder/dropin.py" ] || continue
  "${clean[@]}" python "$fusebot/bench/clean_probe.py" "$folder" >"$out/probe-$target.log" 2>&1 || status=1
  sed "s/^/$target: /" "$out/probe-$target.log" | grep -E "^$target: (ok|FAILED|n/a) " || { status=1; tail -5 "$out/probe-$target.log"; }
done
for script in fusebot_kernels/*/bench_*.py; do
  target=$(basename "$(dirname "$script")")
  "${clean[@]}" python "$script" >"$out/bench-$target.log" 2>&1 || status=1
  echo "$target bench: $(tail -2 "$out/bench-$target.log" | tr '\n' ' ')"
done
exit $status
