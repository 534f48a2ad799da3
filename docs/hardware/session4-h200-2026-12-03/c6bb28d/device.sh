#!/bin/bash
# Session 4 H200 run, part 3 (issue #17): the .deb of c6bb28d (OpenSSL kept out of the resident, the probe's os._exit):
# the daemon's memory beside node_exporter, the health check (1 cold + 5 warm), the probe alone old vs new.
set -u
R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
T=/opt/torch/.venv/bin/python3
C=.carry/s4b
{ date -u; cat $C/commit.txt; python3 -c 'import _sha2; print("builtin sha2:", _sha2)'; } > $R/env.txt 2>&1
dpkg -i $C/gpuguard_*.deb > $R/install.txt 2>&1; echo "install exit $?" >> $R/install.txt
tail -1 $R/install.txt; cat $R/env.txt
( sleep 70; pid=$(pgrep -f "gpuguard run --config" | head -1); echo "pid $pid"; grep -E "libssl|libcrypto" /proc/$pid/maps | awk '{print $6}' | sort -u; echo "mapped openssl libs: $(grep -c -E 'libssl|libcrypto' /proc/$pid/maps)"; grep VmRSS /proc/$pid/status ) > $R/maps_openssl.txt 2>&1 &
timeout 170 python3 bench/bench_daemon_memory.py --gpuguard gpuguard --node-exporter .carry/i17/node_exporter --speedup 300 --seconds 120 --warmup-seconds 30 --sample-seconds 15 --json $R/soak.json > $R/soak.txt 2>&1
wait
tail -8 $R/soak.txt; cat $R/maps_openssl.txt
mkdir -p /tmp/oldp && dpkg-deb --fsys-tarfile .carry/s4/gpuguard_*.deb | tar -xO ./usr/lib/gpuguard/agent/health/probe.py > /tmp/oldp/probe.py
for i in 1 2 3; do
  for which in /tmp/oldp/probe.py /usr/lib/gpuguard/agent/health/probe.py; do
    s=$(date +%s.%N); $T $which > /tmp/p.out 2>/dev/null; e=$(date +%s.%N)
    python3 -c "import json,sys; t=open('/tmp/p.out').read().split('GPUGUARD_PROBE_RESULT ',1)[1]; d=json.loads(t); print('$which', round($e-$s,3), d['phase_seconds'], d['gpus'][0]['gemm_bf16_tflops'] if d['gpus'] else None)" >> $R/probe_ab.txt
  done
done
cat $R/probe_ab.txt
cd $OUT && tar czf results.tgz r && rm -rf r
