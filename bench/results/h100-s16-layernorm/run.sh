source bench/gpu_setup.sh || exit 1
D=bench/results/h100-s16-layernorm
git log -1 --format='checkout %h %s' 2>/dev/null
python3 $D/ln_probe.py 132 2>&1 | tee $OUT/ln_probe.txt | tail -3
python3 $D/ln_probe.py 132 window 2>&1 | tee $OUT/ln_probe_window.txt | tail -3
python3 bench/template_sweep.py out/kb-suite/level1_40_LayerNorm.py --compile --layout split --max 3 --repeat 2 2>&1 | tee $OUT/split_sweep.txt | tail -8
