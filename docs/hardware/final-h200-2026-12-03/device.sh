#!/bin/bash
# Final H200 run: #17 (snapshot bench, daemon soak), #19 (freeze, check, compile, explain, refused move), #20 (busy tenant).
set -u
R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
T=/opt/torch/.venv/bin/python3
C=.carry/final
{ date -u; uname -r; nproc; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -V; $T -c 'import torch; print(torch.__version__)'; cat .carry/final/commit.txt; } > $R/env.txt 2>&1
dpkg -i $C/gpuguard_*.deb > $R/install.txt 2>&1; echo "install exit $?" >> $R/install.txt
id gpuguard-probe >> $R/install.txt 2>&1
tail -3 $R/install.txt
# ---- #19: freeze, check, compile, explain, moves
mkdir -p /etc/gpuguard/policy.d
gpuguard policy freeze > $R/freeze.toml 2> $R/freeze.err; echo "freeze exit $?" >> $R/freeze.err
cp $R/freeze.toml /etc/gpuguard/policy.d/50-freeze.toml
gpuguard policy check > $R/policy_check.txt 2>&1; echo "exit $?" >> $R/policy_check.txt
gpuguard policy check --json > $R/policy_check.json 2>&1
gpuguard policy compile > $R/policy_compile.txt 2>&1; echo "exit $?" >> $R/policy_compile.txt
gpuguard policy explain > $R/policy_explain.txt 2>&1; echo "exit $?" >> $R/policy_explain.txt
gpuguard policy freeze --allow-point-releases --kernel-series > $R/freeze_wide.toml 2>&1; echo "exit $?" >> $R/freeze_wide.toml
python3 $C/hook_cases.py > $R/hook_cases.txt 2>&1
cat $R/freeze.err $R/policy_check.txt $R/policy_compile.txt; tail -5 $R/policy_explain.txt; cat $R/hook_cases.txt
# ---- #17: snapshot side by side with the operator's reads; daemon soak beside node_exporter
for i in 1 2 3 4 5; do /usr/bin/time -f "%e s wall %U user %S sys %M KB" gpuguard snapshot >/dev/null 2>>$R/snapshot_time.txt; done
gpuguard snapshot > $R/snapshot.txt 2>&1
PYTHONPATH=/usr/lib/gpuguard/vendor python3 bench/bench_snapshot.py --gpuguard gpuguard --pairs 15 --json $R/bench_snapshot.json > $R/bench_snapshot.txt 2>&1
python3 -IS -X importtime /usr/bin/gpuguard snapshot 2> $R/snapshot_importtime.txt >/dev/null
cat $R/snapshot_time.txt $R/bench_snapshot.txt
rm -f /etc/gpuguard/policy.d/50-freeze.toml
timeout 200 python3 bench/bench_daemon_memory.py --gpuguard gpuguard --node-exporter .carry/i17/node_exporter --speedup 600 --seconds 150 --warmup-seconds 30 --sample-seconds 10 --json $R/soak.json > $R/soak.txt 2>&1
tail -25 $R/soak.txt
# ---- #20: busy tenant
timeout 400 python3 bench/busy_tenant.py --gpuguard gpuguard --run-as gpuguard-probe --python $T --out $R/busy --idle-runs 3 > $R/busy.log 2>&1; echo "busy_tenant exit $?" >> $R/busy.log
sed -n "/^step /,\$p" $R/busy.log | cut -c1-300
cd $OUT && tar czf results.tgz r && rm -rf r
