#!/usr/bin/env bash
# The real-world suite's floor table before and after a change, on the GPU machine, in at most 9 minutes.
# Run it from a copy of the changed tree at <repository root>/.gpu-<name>/ ("after"); the repository root's own tree
# is "before". Each tree is installed (editable) in turn, so the harness's sandboxed child processes import the one
# measured; torch.compile is timed once, in the "after" run. JSON to $OUT/before-<dtype>.json and
# $OUT/after-<dtype>.json; bench/realworld_table.py writes the tables from them.
#   cd .gpu-w && cp -r ../.deb . && source bench/gpu_setup.sh && bash bench/realworld_floor.sh fp32 [budget_s]
# STRATEGIES: how many of the catalog's strategies to try per problem (their first parameter sets; 4 by default).
set -u
dtype=$1
budget_s=${2:-420}
out=${OUT:-.}
names=${NAMES:-"gpt2_causal_softmax llama_rmsnorm t5_position_bias_softmax gelu_pytorch_tanh gptj_interleaved_rope
       llama_causal_softmax_fp32 t5_layernorm bert_padding_mask_softmax"}  # NAMES: another list
paths=$(for n in $names; do echo "bench/suites/realworld/$dtype/$n.py"; done)
install() { (cd "$1" && python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . >/dev/null 2>&1); }
before_s=$((budget_s * 2 / 5))
after_s=$((budget_s - before_s - 60))
n=${STRATEGIES:-4}
install .. && python3 bench/realworld_floor.py --label before --no-compile --strategies "$n" --deadline-s "$before_s" \
  --out "$out/before-$dtype.json" $paths
install . && python3 bench/realworld_floor.py --label after --strategies "$n" --deadline-s "$after_s" --out "$out/after-$dtype.json" $paths
