#!/bin/bash
# Session 11, call A (issue #45), on the GPU host, two benches side by side (16 cores: they do not compete):
# 1. bench_daemon_memory.py: a simulated day of default-interval jobs at 600x, the resident's RSS beside
#    node_exporter 1.5.0, the ubuntu2404 .deb before (f813b8b) and after (.carry/s11/commit.txt), each unpacked and
#    run by the host's python3 -I -S through its own launcher, each with its own node_exporter.
# 2. bench_idle.py: default intervals in real time at the info level, the agent after (this checkout, the installed
#    .deb's vendored libraries through a .pth) and before (git archive f813b8b) beside node_exporter scraped every
#    15 s; 60 s warm-up (the start's full children), then a 150 s window (what the device budget left allowed).
set -u
R=$OUT/r11a; mkdir -p "$R"; C=.carry/s11
{ date -u; cat $C/commit.txt; nvidia-smi --query-gpu=name,driver_version,pci.device_id --format=csv,noheader;
  nproc; python3 --version; } > "$R/env.txt" 2>&1
chmod 755 $C/node_exporter
dpkg -i $C/after.deb > "$R/install.txt" 2>&1; echo "install exit $?" >> "$R/install.txt"
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SITE" && echo /usr/lib/gpuguard/vendor/cp312 > "$SITE/zz-gpuguard-vendor.pth"
mkdir -p /tmp/before_tree && tar xzf $C/before_tree.tgz -C /tmp/before_tree
PYTHONPATH=$PWD timeout 235 python3 bench/bench_idle.py --node-exporter $C/node_exporter --seconds 150 \
  --warmup-seconds 60 --before /tmp/before_tree --log-level info --json > "$R/idle.json" 2> "$R/idle.err" &
IDLE=$!
for side in before after; do
  mkdir -p /tmp/$side && dpkg-deb -x $C/$side.deb /tmp/$side
  sed -i "s#^GPUGUARD_LIB = .*#GPUGUARD_LIB = \"/tmp/$side/usr/lib/gpuguard\"#" /tmp/$side/usr/bin/gpuguard
  timeout 220 python3 bench/bench_daemon_memory.py --node-exporter $C/node_exporter --speedup 600 --seconds 144 \
    --warmup-seconds 20 --sample-seconds 8 --gpuguard "python3 -I -S /tmp/$side/usr/bin/gpuguard" \
    --json "$R/memory-$side.json" > "$R/memory-$side.txt" 2>&1 &
done
wait
echo "idle exit: see idle.err" >> "$R/summary.txt"
cat "$R/env.txt"; for side in before after; do echo "== memory $side"; tail -n 14 "$R/memory-$side.txt"; done
echo "== idle"; tail -5 "$R/idle.err"; head -c 5000 "$R/idle.json"
cd "$OUT" && tar czf s11a.tgz r11a && rm -rf r11a
