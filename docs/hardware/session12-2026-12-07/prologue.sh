# Sourced by device_a.sh and device_b.sh with R (the results folder) and C (the carried folder) set: records the
# host, installs the carried after.deb (its vendored libraries reach the checkout's bench runs through a .pth) and
# unpacks the carried before tree. (device_a.sh ran with these lines inline; moved here unchanged afterwards.)
mkdir -p "$R"
{ date -u; cat $C/commit.txt; nvidia-smi --query-gpu=name,driver_version,pci.device_id --format=csv,noheader;
  nproc; python3 --version; } > "$R/env.txt" 2>&1
chmod 755 $C/node_exporter
dpkg -i $C/after.deb > "$R/install.txt" 2>&1; echo "install exit $?" >> "$R/install.txt"
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SITE" && echo /usr/lib/gpuguard/vendor/cp312 > "$SITE/zz-gpuguard-vendor.pth"
mkdir -p /tmp/before_tree && tar xzf $C/before_tree.tgz -C /tmp/before_tree
