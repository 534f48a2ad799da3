"""Defaults as plain constants: what the command line needs before it knows which command runs, and the watched
packages the settings default to.

Nothing here imports anything: ``agent/cli.py`` reads these to build its parser, so ``gpuguard snapshot`` does not
load the settings models (pydantic), the collectors or the logger just to print a default in ``--help``; and the
daemon's ``[snapshot]`` settings default to the watched packages without loading the collectors.
"""

DEFAULT_CONFIG_PATH = "/etc/gpuguard/agent.toml"
DEFAULT_HUB_CONFIG_PATH = "/etc/gpuguard/hub.toml"
DEFAULT_STATE_DIR = "/var/lib/gpuguard"
# The local policy files ([guard] policy_path) and the trusted keyrings of signed policy bundles ([guard] keys_dir).
DEFAULT_POLICY_DIR = "/etc/gpuguard/policy.d"
DEFAULT_KEYS_DIR = "/etc/gpuguard/keys"

# The packages whose versions carry the AMD driver release and the ROCm release: the policy's [amd] defaults, what
# the snapshot's pairing and drift findings read, what policy freeze pins.
AMD_DRIVER_PACKAGE = "amdgpu-dkms"
ROCM_CORE_PACKAGE = "rocm-core"
# ROCm built with TheRock (7.13 on) is packaged as amdrocm-*: amdrocm-base (rocminfo and the version component, what
# rocm-core was) carries the release, in a versioned name for side-by-side installs (amdrocm-base10.0, version
# 10.0.0-4) behind a non-versioned meta package (amdrocm-base). Its release is judged beside rocm-core's: a host can
# hold a classic stack and TheRock releases at once (../shared/reference/therock-packaging-facts.md).
THEROCK_BASE_PACKAGE = "amdrocm-base"

# gpuguard's own package (deb and rpm): the guard refuses a transaction that removes it unless an override window
# opened with --allow-self-removal says so (agent/guard/hotpath/decision.py, Decision.self_protection).
OWN_PACKAGE = "gpuguard"

# The job bodies ``gpuguard run`` runs in children (``gpuguard _job NAME``, agent/daemon_jobs/children.py).
JOB_NAMES = ("config", "restore", "snapshot", "guard_check", "guard_events", "health", "deliver", "policy_fetch")

# Kernel, GPU driver, ROCm/CUDA user space, firmware and container stack: the packages whose movement matters.
DEFAULT_WATCHED_PATTERNS = (
    # kernels and what DKMS builds against
    "linux-image-*", "linux-modules-*", "linux-headers-*", "linux-generic*", "linux-hwe-*", "linux-oem-*",
    "linux-aws*", "linux-azure*", "linux-gcp*",
    "kernel", "kernel-core", "kernel-modules*", "kernel-devel*", "kernel-headers", "kernel-uek*", "kernel-default*",
    "dkms", "linux-firmware*", "firmware-amd-graphics", "firmware-nvidia-*",
    # AMD driver and ROCm user space
    "amdgpu*", "rocm*", "amdrocm*", "hip-*", "hipcc*", "hsa-*", "hsakmt*", "rocminfo", "amd-smi*", "comgr", "rccl*",
    "miopen-hip*", "rocblas*", "hipblaslt*", "amd-container-toolkit*",
    # NVIDIA driver and CUDA user space
    "nvidia-*", "libnvidia-*", "cuda", "cuda-*", "libcuda*", "libcudnn*", "libnccl*", "kmod-nvidia*",
    "xserver-xorg-video-nvidia*", "datacenter-gpu-manager*", "nvidia-container-toolkit*", "libnvidia-container*",
    # companions judged beside them: dcgm-exporter, the amdsmi library and binding as distributions package them
    "dcgm-exporter", "datacenter-gpu-manager-exporter", "libamd-smi*", "python3-amdsmi*",
    # container runtimes
    "docker*", "containerd*", "moby-*", "podman", "runc", "crun", "cri-o*",
)
