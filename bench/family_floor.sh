#!/usr/bin/env bash
# One family of the real-world suite against the memory floor, on the GPU machine, in under 8 minutes by
# default: the RoPE problems and the causal softmaxes, bf16 first, then fp32 while the budget lasts. For each problem
# bench/realworld_floor.py times eager and torch.compile, and builds, verifies (float64 oracle) and times the first
# parameter set of each of the catalog's first STRATEGIES strategies (3: for RoPE the rope template with a head per
# thread, with 4 heads per thread, then the general kernel it replaces; for the causal softmax the register-resident
# kernel, which skips the masked half, and the next two row layouts); bench/family_table.py then writes README.md and
# results.json to $OUT and prints the table.
#   source bench/gpu_setup.sh && OUT=/some/folder bash bench/family_floor.sh [budget_s]
# NAMES, DTYPES, STRATEGIES: other problems, dtypes, strategies per problem. ALSO: realworld_floor.py --also values
# (space-separated; each first parameter set's variant with those fields replaced, e.g. "buffers=1"); TITLE, NOTE: the
# README's title and a paragraph saying what the run compares.
set -u
out=${OUT:?OUT: the folder for README.md and results.json}
budget_s=${1:-330}  # no problem starts after this; one problem takes up to about 2 minutes more
names=${NAMES:-"llama_rope gpt2_causal_softmax gptj_interleaved_rope neox_partial_rope llama_causal_softmax_fp32"}
dtypes=${DTYPES:-"bf16 fp32"}
paths=$(for d in $dtypes; do for n in $names; do echo "bench/suites/realworld/$d/$n.py"; done; done)
mkdir -p "$out"
also=()
for a in ${ALSO:-}; do also+=(--also "$a"); done
python3 bench/realworld_floor.py --label family --strategies "${STRATEGIES:-3}" --deadline-s "$budget_s" \
  "${also[@]}" --out "$out/rows.json" $paths
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
cmd="OUT=<folder> bash bench/family_floor.sh $budget_s"
for v in NAMES DTYPES STRATEGIES ALSO; do [ -n "${!v:-}" ] && cmd="$v=\"${!v}\" $cmd"; done
python3 bench/family_table.py "$out/rows.json" --gpu "$gpu" --out "$out" --command "$cmd" \
  ${TITLE:+--title "$TITLE"} ${NOTE:+--note "$NOTE"}
