#!/bin/bash
# Session 8, second call: HEAD after the memory rule took a rise seen as evidence whatever the gaps; three honest
# runs of the real probe and one replayed honest line (the GPU untouched). .carry/s8/head.deb as in device.sh.
set -u
R=$OUT/r2; mkdir -p "$R"
C=.carry/s8
TORCH=/opt/torch/.venv/bin/python3
{ date -u; cat $C/commit.txt; nvidia-smi --query-gpu=name,pci.device_id --format=csv,noheader; } > "$R/env.txt" 2>&1
dpkg -i "$C/head.deb" > "$R/install.txt" 2>&1; echo "install exit $?" >> "$R/install.txt"
for n in 1 2 3; do
  gpuguard health run --python "$TORCH" --json > "$R/honest-$n.json" 2> "$R/honest-$n.err"
  echo "honest-$n exit $?" >> "$R/summary.txt"
done
mkdir -p /opt/forge
printf '#!/bin/sh\ncase " $* " in *" -c "*) exec %s "$@";; esac\n%s "$@" | tee /opt/forge/recorded.txt\n' \
  "$TORCH" "$TORCH" > /opt/forge/record
printf '#!/bin/sh\ncase " $* " in *" -c "*) exec %s "$@";; esac\nsleep 3; grep GPUGUARD_PROBE_RESULT /opt/forge/recorded.txt\n' \
  "$TORCH" > /opt/forge/replay
chmod 755 /opt/forge/record /opt/forge/replay
touch /opt/forge/recorded.txt && chmod 666 /opt/forge/recorded.txt
gpuguard health run --python /opt/forge/record --json > "$R/record.json" 2> "$R/record.err"
echo "record exit $?" >> "$R/summary.txt"
gpuguard health run --python /opt/forge/replay --json > "$R/replay.json" 2> "$R/replay.err"
echo "replay exit $?" >> "$R/summary.txt"
python3 - "$R" > "$R/figures.txt" <<'PY'
import json, os, sys
r = sys.argv[1]
for name in sorted(n for n in os.listdir(r) if n.endswith(".json")):
    d = json.load(open(os.path.join(r, name)))
    c = d.get("corroboration") or {}
    print(name, d.get("status"), "wall", d.get("wall_seconds"),
          "memory:", [x for x in (c.get("checked") or []) + (c.get("unverified") or []) if "device memory" in x],
          "disagree", [x.get("kind") for x in c.get("disagreements") or []])
PY
cat "$R/summary.txt" "$R/figures.txt"
cd "$OUT" && tar czf s8b.tgz r2 && rm -rf r2
