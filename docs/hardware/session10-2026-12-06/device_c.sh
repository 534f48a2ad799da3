#!/bin/bash
# Session 10, call C (issue #45): bench_idle.py beside node_exporter 1.5.0 (call A's run of it failed: the bench
# imports agent/ from the checkout, which needs the repository root on PYTHONPATH), default intervals, 240 s window.
set -u
R=$OUT/r10c; mkdir -p "$R"
C=.carry/s10
{ date -u; cat $C/commit.txt; nvidia-smi --query-gpu=name,pci.device_id --format=csv,noheader; nproc; } > "$R/env.txt" 2>&1
dpkg -i $C/gpuguard_*.deb > "$R/install.txt" 2>&1
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SITE" && echo /usr/lib/gpuguard/vendor/cp312 > "$SITE/zz-gpuguard-vendor.pth"
chmod 755 $C/node_exporter
PYTHONPATH=$PWD timeout 330 python3 bench/bench_idle.py --node-exporter $C/node_exporter --seconds 240 \
  --warmup-seconds 20 --json > "$R/idle.json" 2> "$R/idle.err"
echo "idle exit $?" >> "$R/summary.txt"
cat "$R/summary.txt"; tail -5 "$R/idle.err"; head -c 6000 "$R/idle.json"
cd "$OUT" && tar czf s10c.tgz r10c && rm -rf r10c
