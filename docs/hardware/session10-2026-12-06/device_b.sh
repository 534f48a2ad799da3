#!/bin/bash
# Session 10, call B (issue #45): the known-good record of a 40-package 4 GB synthetic stack on the GPU host's idle
# cores, side by side with the record before issue #45 (git archive f5f00b1 agent) and tar | gzip -6 of the same
# files (bench/bench_known_good.py; the .deb's vendored libraries through the .pth call A wrote).
set -u
R=$OUT/r10b; mkdir -p "$R"
C=.carry/s10
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[ -f "$SITE/zz-gpuguard-vendor.pth" ] || { dpkg -i $C/gpuguard_*.deb > /dev/null 2>&1; mkdir -p "$SITE";
  echo /usr/lib/gpuguard/vendor/cp312 > "$SITE/zz-gpuguard-vendor.pth"; }
{ date -u; cat $C/commit.txt; nproc; df -h /var/tmp | tail -1; } > "$R/env.txt" 2>&1
timeout 540 python3 bench/bench_known_good.py --total-gb 4.0 --compare $C/kg_old --dir /var/tmp/kg-bench \
  --json "$R/known_good.json" > "$R/known_good.txt" 2>&1
echo "known_good exit $?" >> "$R/summary.txt"
rm -rf /var/tmp/kg-bench
cat "$R/summary.txt" "$R/known_good.txt" | tail -40
cd "$OUT" && tar czf s10b.tgz r10b && rm -rf r10b
