#!/bin/bash
# H200 run 4: the snapshot bench with nvidia-smi -q in the same-facts reference; where pathlib is used.
set -u
R=$OUT/r; mkdir -p $R
C=.carry/final
{ date -u; cat $C/commit.txt; } > $R/env.txt
dpkg -i $C/gpuguard_*.deb > $R/install.txt 2>&1; echo "install exit $?" >> $R/install.txt
gpuguard snapshot > /dev/null 2>&1
PYTHONPATH=/usr/lib/gpuguard/vendor python3 bench/bench_snapshot.py --gpuguard gpuguard --pairs 15 --json $R/bench_snapshot.json > $R/bench_snapshot.txt 2>&1
cat $R/bench_snapshot.txt
python3 -I -S - > $R/pathlib_callers.txt 2>&1 <<'PY'
import cProfile, pstats, sys, io
sys.path[:0] = ["/usr/lib/gpuguard", "/usr/lib/gpuguard/vendor"]
from agent.cli import main
pr = cProfile.Profile(); pr.enable()
main(["snapshot"], out=io.StringIO())
pr.disable()
s = pstats.Stats(pr, stream=sys.stdout); s.sort_stats("cumulative")
s.print_callers(r"pathlib.py:\d+\(__init__\)")
s.print_callers(r"posix.stat")
PY
grep -v "^$" $R/pathlib_callers.txt | cut -c1-200 | head -40
cd $OUT && tar czf results.tgz r && rm -rf r
