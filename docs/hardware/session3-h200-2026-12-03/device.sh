#!/bin/bash
# Session 3 H200 run (issue #17): the installed .deb's snapshot beside the operator's reads and the previous build,
# health run (1 cold + 5 warm, naive checks interleaved), the daemon's memory beside node_exporter.
set -u
R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
T=/opt/torch/.venv/bin/python3
C=.carry/s3
{ date -u; uname -r; nproc; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -V; $T -c 'import torch; print(torch.__version__)'; cat $C/commit.txt; } > $R/env.txt 2>&1
dpkg -i $C/gpuguard_*.deb > $R/install.txt 2>&1; echo "install exit $?" >> $R/install.txt
tail -2 $R/install.txt
# the previous build (.carry/final, the last session's final HEAD) unpacked beside it, compiled as its postinst would
mkdir -p /tmp/old && dpkg-deb -x .carry/final/gpuguard_*.deb /tmp/old && python3 -m compileall -q /tmp/old/usr/lib/gpuguard
OLD="python3 -IS -c 'import sys; sys.path[:0]=[\"/tmp/old/usr/lib/gpuguard\",\"/tmp/old/usr/lib/gpuguard/vendor\"]; from agent.cli import main; sys.exit(main())'"
gpuguard snapshot > $R/snapshot.txt 2>&1; echo "exit $?" >> $R/snapshot.txt
gpuguard snapshot --json > $R/snapshot.json 2>/dev/null
for i in 1 2 3 4 5; do /usr/bin/time -f "%e s wall %U user %S sys %M KB" gpuguard snapshot >/dev/null 2>>$R/snapshot_time.txt; done
PYTHONPATH=/usr/lib/gpuguard/vendor python3 bench/bench_snapshot.py --gpuguard gpuguard --pairs 15 --compare "$OLD" --json $R/bench_snapshot.json > $R/bench_snapshot.txt 2>&1
python3 -IS -X importtime /usr/bin/gpuguard snapshot 2> $R/snapshot_importtime.txt >/dev/null
cat $R/snapshot.txt | head -12; cat $R/snapshot_time.txt $R/bench_snapshot.txt
timeout 200 python3 bench/bench_daemon_memory.py --gpuguard gpuguard --node-exporter .carry/i17/node_exporter --speedup 600 --seconds 150 --warmup-seconds 30 --sample-seconds 10 --json $R/soak.json > $R/soak.txt 2>&1
tail -14 $R/soak.txt
timeout 240 python3 bench/bench_health.py --gpuguard gpuguard --python $T --out $R/health --baseline-runs 1 --unchanged-runs 5 --naive-runs 5 --budget-seconds 200 > $R/bench_health.txt 2>&1
grep -v '^ ' $R/bench_health.txt | head -40
cd $OUT && tar czf results.tgz r && rm -rf r
