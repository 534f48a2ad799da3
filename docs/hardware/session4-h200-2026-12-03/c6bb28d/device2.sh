#!/bin/bash
# Session 4 H200 run, part 2: gpuguard health run (1 cold + 5 warm, naive checks interleaved) from the installed .deb.
set -u
R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
T=/opt/torch/.venv/bin/python3
C=.carry/s4b
{ dpkg -i $C/gpuguard_*.deb > $R/install.txt 2>&1; echo "install exit $?" >> $R/install.txt; }
dpkg-query -W gpuguard > $R/installed.txt 2>&1
timeout 200 python3 bench/bench_health.py --gpuguard gpuguard --python $T --out $R/health --baseline-runs 1 --unchanged-runs 5 --naive-runs 5 --budget-seconds 180 > $R/bench_health.txt 2>&1
grep -v '^ ' $R/bench_health.txt | head -40
cd $OUT && tar czf results.tgz r && rm -rf r
