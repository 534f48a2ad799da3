#!/bin/bash
# Session 12, call A (issue #45), on the GPU host, two benches side by side (16 cores: they do not compete):
# 1. bench_daemon_memory.py: a simulated day of default-interval jobs at 600x, the resident's RSS beside
#    node_exporter 1.5.0, the ubuntu2404 .deb before (f813b8b) and after (.carry/s11/commit.txt), each unpacked and
#    run by the host's python3 -I -S through its own launcher, each with its own node_exporter.
# 2. bench_idle.py: default intervals in real time at the info level, the agent after (this checkout, the installed
#    .deb's vendored libraries through a .pth) and before (git archive f813b8b) beside node_exporter scraped every
#    15 s; 60 s warm-up (the start's full children), then a 300 s window.
set -u
R=$OUT/r12a; C=.carry/s11
. docs/hardware/session12-2026-12-07/prologue.sh
PYTHONPATH=$PWD timeout 420 python3 bench/bench_idle.py --node-exporter $C/node_exporter --seconds 300 \
  --warmup-seconds 60 --before /tmp/before_tree --log-level info --json > "$R/idle.json" 2> "$R/idle.err" &
IDLE=$!
memory_soaks
wait
echo "idle exit: see idle.err" >> "$R/summary.txt"
cat "$R/env.txt"; for side in before after; do echo "== memory $side"; tail -n 14 "$R/memory-$side.txt"; done
echo "== idle"; tail -5 "$R/idle.err"; head -c 5000 "$R/idle.json"
cd "$OUT" && tar czf s12a.tgz r12a && rm -rf r12a
