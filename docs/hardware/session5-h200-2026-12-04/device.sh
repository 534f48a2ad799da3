#!/bin/bash
# Session 5 H200 run (issue #28): the .deb of the carried commit; the resident daemon's RSS over a day of default
# intervals at 600x (144 s) beside prometheus-node-exporter 1.5.0 (Debian's binary), in one run.
set -u
R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
C=.carry/s5
{ date -u; cat $C/commit.txt; python3 --version; uname -r; } > $R/env.txt 2>&1
dpkg -i $C/gpuguard_*.deb > $R/install.txt 2>&1; echo "install exit $?" >> $R/install.txt
tail -1 $R/install.txt; cat $R/env.txt
( sleep 60; pid=$(pgrep -f "gpuguard run --config" | head -1); echo "pid $pid"; grep -E "VmRSS|VmHWM" /proc/$pid/status; python3 - "$pid" <<'PY'
import sys
maps = open(f"/proc/{sys.argv[1]}/maps").read()
print("pydantic_core mapped:", "pydantic_core" in maps, "libssl mapped:", "libssl" in maps)
PY
) > $R/resident_probe.txt 2>&1 &
timeout 200 python3 bench/bench_daemon_memory.py --gpuguard gpuguard --node-exporter $C/node_exporter --speedup 600 --seconds 144 --warmup-seconds 20 --sample-seconds 8 --json $R/soak.json > $R/soak.txt 2>&1
echo "bench exit $?" >> $R/soak.txt
wait
tail -12 $R/soak.txt; cat $R/resident_probe.txt
cd $OUT && tar czf results.tgz r && rm -rf r
