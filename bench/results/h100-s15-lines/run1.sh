source bench/gpu_setup.sh || exit 1
exec > >(tee $OUT/log.txt) 2>&1

S=out/dev/s15
P="--param layout=cluster,vec=1,threads=256,slices=4,buffers=1 --param layout=cluster,vec=1,threads=128,slices=4,buffers=1"
for i in 1 2; do
  python3 bench/template_sweep.py out/kb-suite/level1_38_L1Norm_.py $P --repeat 2 2>&1 | tail -4 | sed "s/^/plain$i /"
  FB_LINE=1 python3 bench/template_sweep.py out/kb-suite/level1_38_L1Norm_.py $P --repeat 2 2>&1 | tail -3 | sed "s/^/line$i /"
done
python3 bench/template_sweep.py $S/l1_65536.py $S/l1_65532.py $S/l1_65528.py --layout cluster --max 3 --repeat 2 2>&1 | tail -14
python3 bench/template_sweep.py $S/l1_65532.py $S/l1_65528.py $P --repeat 2 2>&1 | tail -7
python3 $S/copy_probe.py 2>&1 | tail -9
python3 bench/template_sweep.py out/kb-suite/level1_12_Matmul_with_diagonal_matrices_.py --compile --layout bcast --max 4 --repeat 3 2>&1 | tail -7
