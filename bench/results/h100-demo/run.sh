# `fusebot demo` (the README's first command, without its local set-up: the device has no network) on the H100, twice.
source bench/gpu_setup.sh || exit 1
W=/tmp/fusebot-demo
for n in 1 2; do
  /usr/bin/time -f "run $n: %e s wall" timeout 280 python3 -m bot.cli demo --workdir $W 2>&1 | tee $OUT/demo-$n.log | tail -25
  git -C $W/repo log --oneline --all | head -8 > $OUT/repo-log-$n.txt
done
git -C $W/repo show --stat fusebot/main/examples > $OUT/branch-stat.txt 2>&1
for f in $(git -C $W/repo ls-tree -r --name-only fusebot/main/examples | grep -E "BENCHMARK.md$"); do
  echo "== $f"; git -C $W/repo show "fusebot/main/examples:$f"
done > $OUT/benchmarks.md
