#!/bin/bash
# Session 7 H200 run: issue #28 (resident RSS beside node_exporter) and issue #30 (a host no repository serves:
# freeze, coverage, a dpkg -i of a violating cuda-cudart build rolled back by the daemon from a rebuilt .deb).
set -u
R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
C=.carry/s7
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
{ date -u; cat $C/commit.txt; python3 --version; uname -r; nproc; df -h / | tail -1; apt-cache policy 2>&1 | head -5; } > $R/env.txt 2>&1
dpkg -i $C/gpuguard_*.deb > $R/install.txt 2>&1; echo "install exit $?" >> $R/install.txt
tail -1 $R/install.txt
if [ "${1:-}" = bench ]; then
# ---- #28: a compressed day of the resident beside node_exporter
( sleep 70; pid=$(pgrep -f "gpuguard run --config" | head -1); echo "pid $pid"; grep -E "VmRSS|VmHWM" /proc/$pid/status; python3 - "$pid" <<'PY'
import sys
maps = open(f"/proc/{sys.argv[1]}/maps").read()
for lib in ("pydantic_core", "libssl", "apscheduler", "_ssl"):
    print(lib, "mapped:", lib in maps)
PY
) > $R/resident_probe.txt 2>&1 &
timeout 200 python3 bench/bench_daemon_memory.py --gpuguard gpuguard --node-exporter $C/node_exporter --speedup 600 --seconds 144 --warmup-seconds 20 --sample-seconds 8 --json $R/soak.json > $R/soak.txt 2>&1
echo "bench exit $?" >> $R/soak.txt
wait
el "bench done"; tail -8 $R/soak.txt
exit 0
fi
# ---- #30: a host whose CUDA no repository offers
G=$R/rollback; mkdir -p $G
{
el "snapshot"; gpuguard snapshot > $G/snapshot.json 2> $G/snapshot.err; echo "snapshot exit $?"
el "freeze"; gpuguard policy freeze -o /etc/gpuguard/policy.d/50-freeze.toml --force; echo "freeze exit $?"
# the default action is block (apt/dnf refused); a dpkg -i bypass is rolled back only with action rollback
sed -i 's/^action = "block"/action = "rollback"/' /etc/gpuguard/policy.d/50-freeze.toml
cp /etc/gpuguard/policy.d/50-freeze.toml $G/
gpuguard policy check; echo "check exit $?"
gpuguard policy compile; echo "compile exit $?"
el "record"; /usr/bin/time -v timeout 300 gpuguard guard rollback > $G/record.out 2> $G/record.err; echo "record exit $?"
tail -25 $G/record.err | grep -E "Elapsed|Maximum resident"
el "recorded"; du -sh /var/lib/gpuguard/debs; ls -la /var/lib/gpuguard/debs | head -80
} > $G/part1.txt 2>&1
tail -5 $G/part1.txt
cat $G/record.out | head -20
gpuguard status --offline > $G/status.txt 2>&1; echo "status exit $?" >> $G/status.txt
gpuguard status --offline --json > $G/status.json 2>/dev/null
python3 - $G/status.json > $G/coverage.txt <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
def find(o, path=""):
    if isinstance(o, dict):
        for k, v in o.items():
            if "coverage" in k or "restorable" in k:
                print(path + "/" + k, json.dumps(v)[:4000])
            find(v, path + "/" + k)
    elif isinstance(o, list):
        for i, v in enumerate(o):
            find(v, f"{path}[{i}]")
find(d)
PY
grep -i -E "rollback|restor" $G/status.txt
cp /var/lib/gpuguard/rollback-coverage.json $G/ 2>/dev/null; cp /var/lib/gpuguard/known-good.json $G/ 2>/dev/null
# the violating build: the rebuilt known-good cudart with a newer version, as a vendor hotfix would be
{
deb=$(ls /var/lib/gpuguard/debs/cuda-cudart-13-0_*.deb | head -1); echo "known-good file: $deb"
rm -rf /tmp/fake && dpkg-deb -R "$deb" /tmp/fake && sed -i 's/^Version: .*/Version: 13.0.97-1/' /tmp/fake/DEBIAN/control
echo "13.0.97 hotfix" > /tmp/fake/usr/share/doc/cuda-cudart-13-0-hotfix.txt 2>/dev/null || { mkdir -p /tmp/fake/usr/share/doc; echo x > /tmp/fake/usr/share/doc/cuda-cudart-13-0-hotfix.txt; }
dpkg-deb --root-owner-group -b /tmp/fake /tmp/cuda-cudart-13-0_13.0.97-1_amd64.deb; echo "fake build exit $?"
for f in /var/lib/dpkg/info/cuda-cudart-13-0*.list /var/lib/dpkg/info/cuda-cudart-13-0*.md5sums; do cp $f $G/before-$(basename $f); done
} > $G/part2.txt 2>&1
cat $G/part2.txt
sed -i 's|^# python = "python3".*|python = "/opt/torch/.venv/bin/python3"|' /etc/gpuguard/agent.toml
printf '\n[daemon]\nhealth_first_run_seconds = 0\n' >> /etc/gpuguard/agent.toml
gpuguard run --config /etc/gpuguard/agent.toml > $G/daemon.log 2>&1 &
dpid=$!
for i in $(seq 1 60); do grep -q daemon_started $G/daemon.log && break; sleep 0.5; done
el "daemon up"
sleep 3
{
el "dpkg -i violating"; dpkg -i --force-depends /tmp/cuda-cudart-13-0_13.0.97-1_amd64.deb; echo "dpkg exit $?"
dpkg-query -W cuda-cudart-13-0
for i in $(seq 1 240); do v=$(dpkg-query -W -f '${Version}' cuda-cudart-13-0); [ "$v" = "13.0.96-1" ] && break; sleep 0.5; done
el "version now $(dpkg-query -W -f '${Version} ${Status}' cuda-cudart-13-0)"
sleep 2
echo "--- dpkg --audit"; dpkg --audit; echo "audit exit $?"
echo "--- apt-get check"; apt-get check; echo "check exit $?"
echo "--- dpkg --verify"; dpkg --verify cuda-cudart-13-0; echo "verify exit $?"
for f in /var/lib/dpkg/info/cuda-cudart-13-0*.list /var/lib/dpkg/info/cuda-cudart-13-0*.md5sums; do cmp $f $G/before-$(basename $f) && echo "same: $(basename $f)"; done
ls /usr/share/doc/cuda-cudart-13-0-hotfix.txt 2>&1
} > $G/part3.txt 2>&1
cat $G/part3.txt
for i in $(seq 1 60); do grep -q '"health_checked\|"event": "health_' $G/daemon.log && grep -q 'job_child_exited.*"job": "health"' $G/daemon.log && break; sleep 1; done
kill -TERM $dpid; wait $dpid; echo "daemon exit $?" >> $G/part3.txt
grep -E '"job": "health"|health_' $G/daemon.log | cut -c1-400 | head -8
grep -E '"event": "(guard_|rollback|policy_violation|package_db|health_)' $G/daemon.log | cut -c1-600 | head -40
gpuguard guard rollback > $G/after.out 2>&1; echo "guard after exit $?" >> $G/after.out; tail -3 $G/after.out
el "health"; timeout 60 gpuguard health run --python /opt/torch/.venv/bin/python3 > $G/health.txt 2>&1; echo "health exit $?" >> $G/health.txt; tail -4 $G/health.txt
cp /var/lib/gpuguard/audit.log $G/ 2>/dev/null; ls /var/lib/gpuguard > $G/state_ls.txt
# ---- #32: a signed policy bundle verified by this host's gpgv, compiled, enforced by the hook
B=$R/bundle; mkdir -p $B
{
el "bundle"; gpgv --version | head -1
mkdir -p /etc/gpuguard/keys && cp $C/fleet.gpg /etc/gpuguard/keys/fleet.gpg && chmod 644 /etc/gpuguard/keys/fleet.gpg
sed -i 's/^# policy_source = "local".*/policy_source = "bundle"/' /etc/gpuguard/agent.toml; grep -n policy_source /etc/gpuguard/agent.toml
sed 's/13\.0\.\*/13.*/' $C/fleet-3.bundle > /tmp/tampered.bundle; cp $C/fleet-3.bundle.sig /tmp/tampered.bundle.sig
cmp -s $C/fleet-3.bundle /tmp/tampered.bundle && echo "TAMPER FAILED (same bytes)"
gpuguard policy install /tmp/tampered.bundle; echo "tampered install exit $?"
gpuguard policy install $C/fleet-3.bundle; echo "install exit $?"
gpuguard policy install $C/fleet-3.bundle; echo "install again exit $?"
gpuguard policy explain; echo "explain exit $?"
apt-get remove -y cuda-compat-13-0; echo "apt remove exit $?"; dpkg-query -W cuda-compat-13-0
gpuguard status --offline | grep -E "policy|rollback|guard"
gpuguard guard rollback; echo "guard under the bundle exit $?"
} > $B/bundle.txt 2>&1
cat $B/bundle.txt | cut -c1-400
el end
cd $OUT && tar czf results.tgz r && rm -rf r
