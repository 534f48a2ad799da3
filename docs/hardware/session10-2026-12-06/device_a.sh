#!/bin/bash
# Session 10, call A (issue #45): the installed .deb's resident beside node_exporter 1.5.0 on the GPU host.
# 1. bench_daemon_memory.py: a day of default-interval jobs at 600x, RSS and CPU of the resident and its children.
# 2. bench_idle.py: default intervals in real time (240 s window), CPU per hour and RSS against node_exporter scraped
#    every 15 s (the checkout's agent, the .deb's vendored libraries through a .pth: the device has no network).
set -u
R=$OUT/r10a; mkdir -p "$R"
C=.carry/s10
{ date -u; cat $C/commit.txt; nvidia-smi --query-gpu=name,driver_version,pci.device_id --format=csv,noheader;
  nproc; python3 --version; } > "$R/env.txt" 2>&1
dpkg -i $C/gpuguard_*.deb > "$R/install.txt" 2>&1; echo "install exit $?" >> "$R/install.txt"
chmod 755 $C/node_exporter
timeout 230 python3 bench/bench_daemon_memory.py --gpuguard gpuguard --node-exporter $C/node_exporter --speedup 600 \
  --seconds 144 --warmup-seconds 20 --sample-seconds 8 --json "$R/memory.json" > "$R/memory.txt" 2>&1
echo "memory exit $?" >> "$R/summary.txt"
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SITE" && echo /usr/lib/gpuguard/vendor/cp312 > "$SITE/zz-gpuguard-vendor.pth"
timeout 330 python3 bench/bench_idle.py --node-exporter $C/node_exporter --seconds 240 --warmup-seconds 20 --json \
  > "$R/idle.json" 2> "$R/idle.err"
echo "idle exit $?" >> "$R/summary.txt"
cat "$R/summary.txt"; tail -25 "$R/memory.txt"; cat "$R/idle.json" | head -80
cd "$OUT" && tar czf s10a.tgz r10a && rm -rf r10a
