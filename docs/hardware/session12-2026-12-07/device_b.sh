#!/bin/bash
# Session 12, call B (issue #45), on the GPU host, four benches side by side (16 cores: they do not compete):
# 1-2. bench_idle.py at default intervals in real time, `info`, beside node_exporter 1.5.0 scraped every 15 s, 150 s
#      warm-up (the start's full children and the first backstop fetch), 240 s window: the agent of this checkout
#      (the installed .deb's vendored libraries through a .pth) and --before the session's start (81d5bb3), over
#      plain HTTP (--tls none) and over HTTPS with a public-sized trust store (--tls public: certifi's bundle plus
#      the bench's CA).
# 3-4. bench_daemon_memory.py: a simulated day of default-interval jobs at 600x, the resident's RSS beside
#      node_exporter, the ubuntu2404 .deb before (81d5bb3) and after (.carry/s12/commit.txt), each unpacked and run
#      by the host's python3 -I -S through its own launcher.
set -u
R=$OUT/r12b; C=.carry/s12
. docs/hardware/session12-2026-12-07/prologue.sh
for tls in none public; do
  PYTHONPATH=$PWD timeout 430 python3 bench/bench_idle.py --node-exporter $C/node_exporter --seconds 240 \
    --warmup-seconds 150 --before /tmp/before_tree --log-level info --tls $tls --json \
    > "$R/idle-$tls.json" 2> "$R/idle-$tls.err" &
done
memory_soaks
wait
cat "$R/env.txt"; for side in before after; do echo "== memory $side"; tail -n 8 "$R/memory-$side.txt"; done
for tls in none public; do echo "== idle $tls"; tail -3 "$R/idle-$tls.err"; python3 -c "
import json, sys; d = json.load(open(sys.argv[1]))
print({k: v for k, v in d.items() if 'per_hour' in k or 'ratio' in k or k.endswith('children')})" "$R/idle-$tls.json"; done
cd "$OUT" && tar czf s12b.tgz r12b && rm -rf r12b
