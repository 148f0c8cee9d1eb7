# One complete `fusebot demo` on the H100 from nothing (a fresh work folder), timed.
source bench/gpu_setup.sh || exit 1
W=/tmp/fusebot-demo-once
rm -rf $W
/usr/bin/time -f "demo: %e s wall, exit %x" timeout 590 python3 -m bot.cli demo --workdir $W > $OUT/demo-once.log 2>&1
tail -1 $OUT/demo-once.log
grep -E "searching|faster:|not proposed:|opened|updated" $OUT/demo-once.log
