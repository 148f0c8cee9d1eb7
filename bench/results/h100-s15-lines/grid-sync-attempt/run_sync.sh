source bench/gpu_setup.sh >/dev/null || exit 1
mkdir -p $OUT/gpu
python3 -m pytest -q -m gpu tests/runner/test_catalog.py -k "softmax_long_rows or groupnorm_runs or gemm_groupnorm or logsumexp_max or argmax" -p no:cacheprovider --junitxml=$OUT/gpu/catalog-grid-sync.xml 2>&1 | tail -3 | tee $OUT/gpu/catalog-grid-sync.log
rm -rf /tmp/old && mkdir -p /tmp/old && cp -r runner bench /tmp/old/ && cp out/dev/s15/cuda_grid_old.py /tmp/old/runner/catalog/cuda_grid.py
(cd /tmp/old && PYTHONPATH=/tmp/site:/tmp/old python3 -c "import runner.catalog.cuda_grid as g; print('old module:', g.__file__, 'fb_arrive' in open(g.__file__).read())")
P="--param layout=grid,vec=4,threads=256,slices=44,chunks=4,mode=online,buffers=1 --param layout=grid,vec=4,threads=1024,slices=44,chunks=4,mode=online,buffers=1 --param layout=grid,vec=4,threads=256,slices=88,chunks=4,mode=online,buffers=1"
for i in 1 2; do
  (cd /tmp/old && PYTHONPATH=/tmp/site:/tmp/old python3 bench/template_sweep.py $OLDPWD/out/kb-suite/level1_35_GroupNorm_.py $P --repeat 2 2>&1 | tail -3 | sed "s/^/old$i /")
  python3 bench/template_sweep.py out/kb-suite/level1_35_GroupNorm_.py $P --repeat 2 2>&1 | tail -3 | sed "s/^/new$i /"
done | tee $OUT/sweep_sync.txt
BUDGET=45 BENCH_TIMEOUT=200 bash bench/run_catalog_bench.sh 'level1_35*' 2>&1 | grep -E "^\| level1_35_" | head -3
