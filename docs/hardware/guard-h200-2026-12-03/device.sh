#!/bin/bash
# Issue #13/#18 on the H200: the HEAD .deb's apt hook on the real Ubuntu 24.04 NVIDIA package set.
set -u
R=$OUT/r; mkdir -p $R
{ date -u; python3 -V; dpkg -l | grep -c '^ii'; nvidia-smi --query-gpu=driver_version --format=csv,noheader; } > $R/env.txt 2>&1
dpkg -i .carry/i18/gpuguard_*.deb > $R/install.txt 2>&1; echo "install exit $?" >> $R/install.txt
dpkg-query -W -f '${Package} ${Version} ${Architecture}\n' 'nvidia*' 'libnvidia*' 'cuda*' 'libcuda*' 2>/dev/null > $R/nvidia_packages.txt
mkdir -p /etc/gpuguard/policy.d
cat > /etc/gpuguard/policy.d/10-h200.toml <<'P'
[policy]
name = "h200"
action = "block"
[nvidia]
action = "block"
[[nvidia.pairing]]
name = "r580-cuda13"
driver = "580.*"
cuda = "13.0.*"
P
gpuguard policy check /etc/gpuguard/policy.d > $R/policy_check.txt 2>&1; echo "exit $?" >> $R/policy_check.txt
gpuguard policy compile > $R/policy_compile.txt 2>&1; echo "exit $?" >> $R/policy_compile.txt
gpuguard policy explain > $R/policy_explain.txt 2>&1; echo "exit $?" >> $R/policy_explain.txt
python3 - > $R/hook_cases.txt 2>&1 <<'PY'
import subprocess, time, statistics
inst = {}
for line in subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version} ${Architecture} ${db:Status-Abbrev}\n"], capture_output=True, text=True).stdout.splitlines():
    p = line.split()
    if len(p) >= 4 and p[3].startswith("ii"):
        inst[p[0]] = (p[1], p[2])
def line(name, old, new, arch="amd64", action=None):
    action = action or f"/var/cache/apt/archives/{name}_{new}_{arch}.deb"
    return f"{name} {old} {arch} none < {new} {arch} none {action}"
head = "VERSION 3\nAPT::Architecture=amd64\nCommandLine::AsString=apt-get%20install\n\n"
cases = {}
comp = [n for n in inst if n.startswith("libnvidia-compute-")]
if comp:
    n = comp[0]; old = inst[n][0]
    cases["libnvidia-compute alone to a newer build"] = head + line(n, old, old.replace("580.", "580.999.", 1) if "580." in old else old + "+1") + "\n"
tk = [n for n in inst if n.startswith("cuda-toolkit-13-0")]
if tk:
    cases["cuda-toolkit-13-1 beside 13.0"] = head + f"cuda-toolkit-13-1 - - none < 13.1.0-1 amd64 none /var/cache/apt/archives/cuda-toolkit-13-1_13.1.0-1_amd64.deb\n"
cases["an unrelated package (vim-tiny)"] = head + "vim-tiny - - none < 2:9.1.0016-1ubuntu7 amd64 none /x/vim-tiny.deb\n"
for label, text in cases.items():
    r = subprocess.run(["/usr/lib/gpuguard/gpuguard-apt-hook"], input=text, capture_output=True, text=True, env={"APT_HOOK_INFO_FD": "0", "PATH": "/usr/bin:/bin"})
    print(f"== {label}: exit {r.returncode}\n{text.splitlines()[-1]}\n{r.stderr}")
# start-up on this host: the allowed case against python3 -I -S -c pass, interleaved
ok = cases["an unrelated package (vim-tiny)"]
bare, hook = [], []
for _ in range(30):
    t = time.perf_counter(); subprocess.run(["python3", "-I", "-S", "-c", "pass"]); bare.append(time.perf_counter() - t)
    t = time.perf_counter(); subprocess.run(["/usr/lib/gpuguard/gpuguard-apt-hook"], input=ok, capture_output=True, text=True, env={"APT_HOOK_INFO_FD": "0", "PATH": "/usr/bin:/bin"}); hook.append(time.perf_counter() - t)
print(f"start-up: bare median {statistics.median(bare)*1e3:.1f} ms, hook (allowed, {len(inst)} installed) median {statistics.median(hook)*1e3:.1f} ms, ratio {statistics.median(hook)/statistics.median(bare):.2f}x")
PY
cat $R/hook_cases.txt
gpuguard guard rollback > $R/guard_rollback.txt 2>&1; echo "exit $?" >> $R/guard_rollback.txt
cd $OUT && tar czf results.tgz r && rm -rf r
