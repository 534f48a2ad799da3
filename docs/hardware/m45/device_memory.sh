#!/bin/bash
# Issue #45 (m45): the Ubuntu 24.04 resident's RSS beside node_exporter on the GPU host's own Python 3.12, the code
# before (f813b8b) and after side by side (each with its own node_exporter), as docs/reporting.md "Memory over a day
# of jobs" (Python 3.12) measured on the development container.
# Prepare here (the device has no network), then run with carry [".carry/m45"] (about 160 s):
#   git archive f813b8b | (mkdir -p /tmp/m45-before && tar -x -C /tmp/m45-before)
#   W=$PWD; (cd /tmp/m45-before && packaging/build.sh --target ubuntu2404 --no-hub --wheelhouse $W/build/wheelhouse \
#       --offline --out /tmp/m45-before/out)    # $W: this checkout, whose wheelhouse holds the cp312 wheels
#   packaging/build.sh --target ubuntu2404 --no-hub --out /tmp/m45-after
#   mkdir -p .carry/m45; cp /tmp/m45-before/out/gpuguard_*.deb .carry/m45/before.deb
#   cp /tmp/m45-after/gpuguard_*.deb .carry/m45/after.deb; cp <Debian's prometheus-node-exporter> .carry/m45/node_exporter
#   bash docs/hardware/m45/device_memory.sh
set -u
R=$OUT/m45; mkdir -p "$R"; C=.carry/m45
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; python3 --version; } > "$R/env.txt" 2>&1
chmod 755 $C/node_exporter
for side in before after; do
  dpkg-deb -x $C/$side.deb /tmp/$side
  sed -i "s#^GPUGUARD_LIB = .*#GPUGUARD_LIB = \"/tmp/$side/usr/lib/gpuguard\"#" /tmp/$side/usr/bin/gpuguard
  timeout 230 python3 bench/bench_daemon_memory.py --node-exporter $C/node_exporter --speedup 600 --seconds 144 \
    --warmup-seconds 20 --sample-seconds 8 --gpuguard "python3 -I -S /tmp/$side/usr/bin/gpuguard" \
    --json "$R/$side.json" > "$R/$side.txt" 2>&1 &
done
wait
cat "$R/env.txt"; for side in before after; do echo "== $side"; tail -n 12 "$R/$side.txt"; done
