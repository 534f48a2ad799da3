#!/bin/bash
# Session 9: registered workloads (issue #44) on the borrowed GPU host. A small language model built in code (no
# downloaded weights): embedding, 4 attention+MLP blocks, bf16 autocast, AdamW, a checkpoint round trip. Registered
# three times: instrumented (gates), uninstrumented (the overhead's reference), and with one operator forced to the
# CPU (`--cpu-op`: gelu on h.cpu()). Three `gpuguard health run`s (the baseline builds), then the shim's overhead
# measured directly, instrumented and not, interleaved. .carry/s9/*.deb built from the branch (commit.txt).
set -u
R=$OUT/r9; mkdir -p "$R"
C=.carry/s9
TORCH=/opt/torch/.venv/bin/python3
{ date -u; cat $C/commit.txt; nvidia-smi --query-gpu=name,driver_version,pci.device_id --format=csv,noheader;
  $TORCH -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'; } > "$R/env.txt" 2>&1
dpkg -i $C/*.deb > "$R/install.txt" 2>&1; echo "install exit $?" >> "$R/install.txt"
mkdir -p /opt/wl && cp $C/model_step.py /opt/wl/ && chmod -R a+rX /opt/wl
cat > /etc/gpuguard/agent.toml <<TOML
[health]
python = "$TORCH"

[[health.workloads]]
name = "tiny-lm"
script = "/opt/wl/model_step.py"
metric = "samples_per_second"

[[health.workloads]]
name = "tiny-lm-plain"
script = "/opt/wl/model_step.py"
metric = "samples_per_second"
instrument_ops = false
gates = false

[[health.workloads]]
name = "tiny-lm-cpu-op"
script = "/opt/wl/model_step.py"
args = ["--cpu-op"]
metric = "samples_per_second"
gates = false
TOML
for n in 1 2 3; do
  gpuguard health run --json > "$R/run-$n.json" 2> "$R/run-$n.err"; echo "run-$n exit $?" >> "$R/summary.txt"
done
gpuguard health run > "$R/run-4.txt" 2> "$R/run-4.err"; echo "run-4 (table) exit $?" >> "$R/summary.txt"
# The shim's overhead directly: the same workload, instrumented and not, interleaved 3 times each (as root).
for i in 1 2 3; do
  for mode in ops none; do
    GPUGUARD_WORKLOAD_NONCE=x $TORCH -I -u /usr/lib/gpuguard/agent/health/workload_shim.py --script /opt/wl/model_step.py \
      --instrument $mode -- --steps 30 > "$R/direct-$mode-$i.txt" 2>&1
  done
done
$TORCH - "$R" > "$R/figures.txt" <<'PY'
import json, os, sys
r = sys.argv[1]
for name in sorted(n for n in os.listdir(r) if n.startswith("run-") and n.endswith(".json")):
    d = json.load(open(os.path.join(r, name)))
    print(name, d["status"], "|", d["summary"][:200])
    for w in d.get("workloads", []):
        print("  ", w["name"], w["status"], w["metrics"], "gpu calls", w["accelerator_calls"], "cpu calls",
              w["host_calls"], "fallback", [(o["op"], o["calls"]) for o in w["fallback_ops"]][:5],
              "runs", w["baseline_runs"], "wall", w["wall_seconds"])
        if w["status"] != "pass":
            print("     ", w["summary"][:300])
rates = {"ops": [], "none": []}
for mode in rates:
    for i in (1, 2, 3):
        for line in open(os.path.join(r, "direct-%s-%d.txt" % (mode, i))):
            if line.startswith("{") and "gpuguard_result" in line:
                rates[mode].append(json.loads(line)["gpuguard_result"]["samples_per_second"])
print("direct samples/s instrumented", [round(x, 1) for x in rates["ops"]], "plain", [round(x, 1) for x in rates["none"]])
if rates["ops"] and rates["none"]:
    import statistics
    print("instrumented/plain median ratio %.3f" % (statistics.median(rates["ops"]) / statistics.median(rates["none"])))
PY
cat "$R/summary.txt" "$R/figures.txt"
cd "$OUT" && tar czf s9.tgz r9 && rm -rf r9
