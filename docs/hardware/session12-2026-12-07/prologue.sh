# Sourced by device_a.sh and device_b.sh with R (the results folder) and C (the carried folder) set: records the
# host, installs the carried after.deb (its vendored libraries reach the checkout's bench runs through a .pth) and
# unpacks the carried before tree; memory_soaks runs the two simulated days. (device_a.sh and device_b.sh ran with
# these lines inline; moved here unchanged afterwards.)
mkdir -p "$R"
{ date -u; cat $C/commit.txt; nvidia-smi --query-gpu=name,driver_version,pci.device_id --format=csv,noheader;
  nproc; python3 --version; } > "$R/env.txt" 2>&1
chmod 755 $C/node_exporter
dpkg -i $C/after.deb > "$R/install.txt" 2>&1; echo "install exit $?" >> "$R/install.txt"
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SITE" && echo /usr/lib/gpuguard/vendor/cp312 > "$SITE/zz-gpuguard-vendor.pth"
mkdir -p /tmp/before_tree && tar xzf $C/before_tree.tgz -C /tmp/before_tree

# The simulated day beside node_exporter for the carried before.deb and after.deb, each unpacked and run by the host's
# python3 -I -S through its own launcher, in the background (the caller waits).
memory_soaks() {
  for side in before after; do
    mkdir -p /tmp/$side && dpkg-deb -x $C/$side.deb /tmp/$side
    sed -i "s#^GPUGUARD_LIB = .*#GPUGUARD_LIB = \"/tmp/$side/usr/lib/gpuguard\"#" /tmp/$side/usr/bin/gpuguard
    timeout 220 python3 bench/bench_daemon_memory.py --node-exporter $C/node_exporter --speedup 600 --seconds 144 \
      --warmup-seconds 20 --sample-seconds 8 --gpuguard "python3 -I -S /tmp/$side/usr/bin/gpuguard" \
      --json "$R/memory-$side.json" > "$R/memory-$side.txt" 2>&1 &
  done
}
