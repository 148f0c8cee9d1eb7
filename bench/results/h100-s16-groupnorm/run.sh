source bench/gpu_setup.sh || exit 1
D=bench/results/h100-s16-groupnorm
python3 $D/gn_probe.py 2>&1 | tee $OUT/gn_probe.txt | tail -3
python3 bench/template_sweep.py out/kb-suite/level1_35_GroupNorm_.py --compile \
  --param layout=grid,vec=4,threads=256,slices=44,mode=online,buffers=1,chunks=4 \
  --param layout=grid,vec=4,threads=256,slices=88,mode=online,buffers=1,chunks=4 --repeat 2 2>&1 | tee $OUT/grid_sweep.txt | tail -5
