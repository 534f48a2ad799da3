#!/bin/bash
# H200 run 2: #20 after the utilization-confirm fix: the installed .deb's probe user, busy tenants; NFD labels and
# the Slurm check from a short daemon run.
set -u
R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
T=/opt/torch/.venv/bin/python3
C=.carry/final
{ date -u; uname -r; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat $C/commit.txt; } > $R/env.txt 2>&1
dpkg -i $C/gpuguard_*.deb > $R/install.txt 2>&1; echo "install exit $?" >> $R/install.txt
id gpuguard-probe >> $R/install.txt 2>&1; ls -ld /var/lib/gpuguard-probe >> $R/install.txt 2>&1
tail -3 $R/install.txt
# the installed agent's own health run as root: the probe drops to gpuguard-probe
sed -i "s|^#\? *python = .*|python = \"$T\"|" /etc/gpuguard/agent.toml 2>/dev/null
grep -n "^\[health\]" -A3 /etc/gpuguard/agent.toml > $R/agent_toml_health.txt 2>&1
cat $R/agent_toml_health.txt
timeout 120 gpuguard health run --json > $R/health_run.json 2> $R/health_run.err; echo "health exit $?" >> $R/health_run.err
python3 -c "import json,sys; d=json.load(open('$R/health_run.json')); print(d['status'], d['summary']); s=d.get('sandbox') or {}; print('sandbox', json.dumps(s)[:400])" 2>&1 | tee $R/health_run.txt
tail -2 $R/health_run.err
timeout 400 python3 bench/busy_tenant.py --gpuguard gpuguard --run-as gpuguard-probe --python $T --out $R/busy --idle-runs 3 > $R/busy.log 2>&1; echo "busy_tenant exit $?" >> $R/busy.log
sed -n "/^step /,\$p" $R/busy.log | cut -c1-330
# NFD labels and the Slurm check after a short daemon run
mkdir -p /etc/kubernetes/node-feature-discovery/features.d
gpuguard run > $R/daemon.log 2>&1 &
D=$!
sleep 25
ls -la /etc/kubernetes/node-feature-discovery/features.d/ > $R/nfd_ls.txt 2>&1
cat /etc/kubernetes/node-feature-discovery/features.d/gpuguard > $R/nfd_gpuguard.txt 2>&1
gpuguard status > $R/status.txt 2>&1; echo "status exit $?" >> $R/status.txt
gpuguard status --slurm > $R/slurm.txt 2>&1; echo "slurm exit $?" >> $R/slurm.txt
kill -TERM $D; wait $D; echo "daemon exit $?" >> $R/daemon.log
cat $R/nfd_ls.txt $R/nfd_gpuguard.txt $R/status.txt $R/slurm.txt; tail -3 $R/daemon.log
cd $OUT && tar czf results.tgz r && rm -rf r
