#!/bin/bash
# Session 8 (issue #39), run on an H100 (an H200 was asked for; none started): the real probe from the .deb before (5d2c064) and after the corroboration, baseline and
# sandbox work, alternating, and a forged result from a wrapper interpreter around the host's own torch python.
# Run on the device host from the repository root, with the two .debs in .carry/s8/ (base.deb, head.deb).
set -u
R=$OUT/r; mkdir -p "$R"
C=.carry/s8
TORCH=/opt/torch/.venv/bin/python3
export PYTHONUNBUFFERED=1
{ date -u; cat $C/commit.txt; python3 --version; uname -r; nvidia-smi --query-gpu=name,pci.device_id,driver_version --format=csv,noheader; } > "$R/env.txt" 2>&1

install() {  # $1: base|head
  dpkg -i "$C/$1.deb" > "$R/install-$1.txt" 2>&1; echo "install $1 exit $?" >> "$R/install-$1.txt"
}

run_health() {  # $1: label; $2...: extra arguments
  local label=$1; shift
  /usr/bin/time -f "%e s wall" -o "$R/$label.time" gpuguard health run --python "$TORCH" --json "$@" \
    > "$R/$label.json" 2> "$R/$label.err"
  echo "$label exit $? $(cat "$R/$label.time")" >> "$R/summary.txt"
}

# The real probe, four runs each, alternating builds (the first run of a build after its install warms caches).
for round in 1 2; do
  install base; run_health "base-$round-a"; run_health "base-$round-b"
  install head; run_health "head-$round-a"; run_health "head-$round-b"
done

# A forged result: the wrapper runs the real interpreter and edits the probe's result line on its way out.
mkdir -p /opt/forge
forge() {  # $1: name, $2: sed expression applied to the probe's output
  cat > "/opt/forge/$1" <<EOF
#!/bin/sh
case " \$* " in *" -c "*) exec $TORCH "\$@";; esac
$TORCH "\$@" | sed -e '$2'
EOF
  chmod 755 "/opt/forge/$1"
}
forge three-gpus 's/"device_count": 1,/"device_count": 3,/'
forge fast-gemm 's/"gemm_bf16_tflops": \([0-9]\)/"gemm_bf16_tflops": 5\1/'
forge copy-gpu 's/"gpus": \[\(.*\)\], "groups"/"gpus": [\1, \1], "groups"/'
# A replay: an honest result line recorded from the real probe, printed again without touching the GPU.
printf '#!/bin/sh\ncase " $* " in *" -c "*) exec %s "$@";; esac\n%s "$@" | tee /opt/forge/recorded.txt\n' \
  "$TORCH" "$TORCH" > /opt/forge/record
printf '#!/bin/sh\ncase " $* " in *" -c "*) exec %s "$@";; esac\nsleep 3; grep GPUGUARD_PROBE_RESULT /opt/forge/recorded.txt\n' \
  "$TORCH" > /opt/forge/replay
chmod 755 /opt/forge/record /opt/forge/replay
touch /opt/forge/recorded.txt && chmod 666 /opt/forge/recorded.txt
gpuguard health run --python /opt/forge/record --json > "$R/record.json" 2> "$R/record.err"
echo "record exit $?" >> "$R/summary.txt"
for name in three-gpus fast-gemm copy-gpu replay; do
  /usr/bin/time -f "%e s wall" -o "$R/forged-$name.time" gpuguard health run --python "/opt/forge/$name" --json \
    > "$R/forged-$name.json" 2> "$R/forged-$name.err"
  echo "forged-$name exit $? $(cat "$R/forged-$name.time")" >> "$R/summary.txt"
done
gpuguard health baseline show > "$R/baseline-show.txt" 2>&1; echo "baseline show exit $?" >> "$R/baseline-show.txt"
gpuguard status --offline > "$R/status.txt" 2>&1; echo "status exit $?" >> "$R/status.txt"

python3 - "$R" > "$R/figures.txt" <<'PY'
import json, os, sys
r = sys.argv[1]
for name in sorted(os.listdir(r)):
    if not name.endswith(".json"):
        continue
    try:
        d = json.load(open(os.path.join(r, name)))
    except ValueError as exc:
        print(name, "unreadable:", exc)
        continue
    gpus = (d.get("probe") or {}).get("gpus") or []
    corr = d.get("corroboration") or {}
    print(name, d.get("status"), "wall", d.get("wall_seconds"), "probe", d.get("probe_wall_seconds"),
          "gemm", [round(g.get("gemm_bf16_tflops") or 0, 1) for g in gpus],
          "copy", [round(g.get("copy_bandwidth_gbps") or 0) for g in gpus],
          "disagree", [x.get("kind") for x in corr.get("disagreements") or []],
          "containment", (d.get("sandbox") or {}).get("containment"), "| ", (d.get("summary") or "")[:200])
PY
cat "$R/summary.txt" "$R/figures.txt"
cd "$OUT" && tar czf s8.tgz r && rm -rf r
