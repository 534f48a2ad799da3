#!/bin/bash
# H200 run 3: the probe's limits hold as gpuguard-probe (771453c).
set -u
R=$OUT/r; mkdir -p $R
T=/opt/torch/.venv/bin/python3
C=.carry/final
{ date -u; cat $C/commit.txt; grep -E '^(CapEff|CapBnd)' /proc/self/status; } > $R/env.txt 2>&1
dpkg -i $C/gpuguard_*.deb > $R/install.txt 2>&1; echo "install exit $?" >> $R/install.txt
sed -i "s|^#\? *python = .*|python = \"$T\"|" /etc/gpuguard/agent.toml
for i in 1 2; do timeout 120 gpuguard health run --json > $R/health_run$i.json 2> $R/health_run$i.err; echo "health exit $?" >> $R/health_run$i.err; done
python3 - $R <<'PY'
import json, sys
for i in (1, 2):
    d = json.load(open(f"{sys.argv[1]}/health_run{i}.json"))
    s = d.get("sandbox") or {}
    print(i, d["status"], d["summary"], "| user", s.get("user"), s.get("uid"), "| rlimits", s.get("rlimits"),
          "| memory", s.get("memory_limit"), "| notes", s.get("notes"))
    p = d.get("probe") or {}
    print("   probe uid/gid", p.get("uid"), p.get("gid"), "groups", p.get("groups"), "wall", d.get("wall_seconds"))
PY
cat $R/env.txt
# where the snapshot's CPU goes on this host
gpuguard snapshot > /dev/null 2>&1
python3 -I -S -m cProfile -s tottime /usr/bin/gpuguard snapshot 2>&1 | grep -A28 'Ordered by' > $R/snapshot_profile.txt
cat $R/snapshot_profile.txt | cut -c1-160
for i in 1 2 3; do /usr/bin/time -f "%e s wall %U user %S sys" gpuguard snapshot >/dev/null 2>>$R/snapshot_time.txt; done
for i in 1 2 3; do /usr/bin/time -f "nvidia-smi %e s wall %U user %S sys" nvidia-smi >/dev/null 2>>$R/snapshot_time.txt; done
cat $R/snapshot_time.txt
cd $OUT && tar czf results.tgz r && rm -rf r
