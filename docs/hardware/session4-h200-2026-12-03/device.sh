#!/bin/bash
# Session 4 H200 run (issue #17): the installed .deb (delivery in job children) — snapshot beside the operator's
# reads and the previous session's build, the daemon's memory beside node_exporter.
set -u
R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
C=.carry/s4
{ date -u; uname -r; nproc; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -V; cat $C/commit.txt; } > $R/env.txt 2>&1
dpkg -i $C/gpuguard_*.deb > $R/install.txt 2>&1; echo "install exit $?" >> $R/install.txt
tail -2 $R/install.txt
mkdir -p /tmp/old && dpkg-deb -x .carry/s3/gpuguard_*.deb /tmp/old && python3 -m compileall -q /tmp/old/usr/lib/gpuguard
OLD="python3 -IS -c 'import sys; sys.path[:0]=[\"/tmp/old/usr/lib/gpuguard\",\"/tmp/old/usr/lib/gpuguard/vendor\"]; from agent.cli import main; sys.exit(main())'"
gpuguard snapshot > $R/snapshot.txt 2>&1; echo "exit $?" >> $R/snapshot.txt
for i in 1 2 3 4 5; do /usr/bin/time -f "%e s wall %U user %S sys %M KB" gpuguard snapshot >/dev/null 2>>$R/snapshot_time.txt; done
PYTHONPATH=/usr/lib/gpuguard/vendor python3 bench/bench_snapshot.py --gpuguard gpuguard --pairs 15 --compare "$OLD" --json $R/bench_snapshot.json > $R/bench_snapshot.txt 2>&1
head -12 $R/snapshot.txt; cat $R/snapshot_time.txt $R/bench_snapshot.txt
timeout 230 python3 bench/bench_daemon_memory.py --gpuguard gpuguard --node-exporter .carry/i17/node_exporter --speedup 300 --seconds 180 --warmup-seconds 30 --sample-seconds 15 --json $R/soak.json > $R/soak.txt 2>&1
tail -16 $R/soak.txt
cd $OUT && tar czf results.tgz r && rm -rf r
