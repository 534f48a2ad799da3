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
# Where the zypper commit plugin keeps each running commit's whole transaction for the rpm plugin's hook
# (agent/guard/zypper/plan.py): runtime state, gone at boot.
ZYPPER_PLAN_DIR = "/run/gpuguard/zypper"

# The packages whose versions carry the AMD driver release and the ROCm release: the policy's [amd] defaults, what
# the snapshot's pairing and drift findings read, what policy freeze pins.
AMD_DRIVER_PACKAGE = "amdgpu-dkms"
ROCM_CORE_PACKAGE = "rocm-core"
# ROCm built with TheRock (7.13 on) is packaged as amdrocm-*: amdrocm-base (rocminfo and the version component, what
# rocm-core was) carries the release, in a versioned name for side-by-side installs (amdrocm-base10.0, version
# 10.0.0-4) behind a non-versioned meta package (amdrocm-base). Its release is judged beside rocm-core's: a host can
# hold a classic stack and TheRock releases at once (../shared/reference/therock-packaging-facts.md).
THEROCK_BASE_PACKAGE = "amdrocm-base"
# TheRock's core meta of one release (amdrocm-core7.14 7.14.0-1): the release's second package where amdrocm-base
# is not installed under its versioned name.
THEROCK_CORE_PACKAGE = "amdrocm-core"

# gpuguard's own package (deb and rpm): the guard refuses a transaction that removes it unless an override window
# opened with --allow-self-removal says so (agent/guard/hotpath/decision.py, Decision.self_protection).
OWN_PACKAGE = "gpuguard"

# The job bodies ``gpuguard run`` runs in children (``gpuguard _job NAME``, agent/daemon_jobs/children.py).
JOB_NAMES = ("config", "restore", "snapshot", "guard_check", "guard_events", "health", "deliver", "policy_fetch")

# ROCm and CUDA as Debian and Ubuntu package them (docs/guard.md, "GPU packages as the distributions ship them"):
# no rocm-core, no /opt/rocm, no /usr/local/cuda; each library is named after its SONAME (libamdhip64-5,
# libhsa-runtime64-1, librocblas0, libcublas12, libcufft11) and lives under /usr/lib/<triplet>. Guarded, watched and
# frozen like AMD's and NVIDIA's own packages.
DISTRIBUTION_ROCM_PACKAGES = (
    "libamdhip64*", "libhsa-runtime64*", "libhsakmt*", "libamd-comgr*", "librocm-smi*", "librocm-core*",
    "librocblas*", "librocsparse*", "librocrand*", "librocfft*", "librocsolver*", "librocprim*", "libroctx64*",
    "libroctracer*", "librocalution*", "libhipblas*", "libhipfft*", "libhipsparse*", "libhiprand*", "libhipsolver*",
    "libhipcub*", "librccl*", "libmiopen*", "hipcc", "hipify-clang",
)
DISTRIBUTION_CUDA_PACKAGES = (
    "libcublas*", "libcufft*", "libcurand*", "libcusparse*", "libcusolver*", "libnvrtc*", "libnvjitlink*",
    "libnvjpeg*", "libnpp*", "libnvblas*", "libcupti*", "libnvtoolsext*", "libnvvm*", "libcuinj*", "libaccinj*",
)
# The package that carries the ROCm release where the distribution packages ROCm without AMD's rocm-core, in order:
# Debian's librocm-core, else HIP's runtime (libamdhip64-5 5.7.1 is Debian 13's ROCm 5.7), else ROCr's. The pairing
# (agent/policy/families/amd.py) and the snapshot (agent/collectors/rocm.py) read it the same way.
DISTRIBUTION_ROCM_RELEASE_PACKAGES = ("librocm-core", "libamdhip64-", "libhsa-runtime64-")
# Where distributions put those libraries (Debian and Ubuntu multiarch, Fedora): the collectors read HIP's and the
# CUDA runtime's file names there when no package database says.
DISTRIBUTION_LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64")
# The NVIDIA driver's GL, EGL, GLX and video libraries as Debian names them (libnvidia-glcore and libnvidia-eglcore
# are libnvidia-*): one build with the driver.
NVIDIA_GL_PACKAGES = (
    "libegl-nvidia*", "libgl1-nvidia*", "libgles-nvidia*", "libglx-nvidia*", "libnvcuvid*", "libnvoptix*",
    "glx-alternative-nvidia", "xserver-xorg-video-nvidia*",
)

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
    # ROCm, CUDA and the NVIDIA driver's GL libraries as distributions package them
    *DISTRIBUTION_ROCM_PACKAGES, *DISTRIBUTION_CUDA_PACKAGES, *NVIDIA_GL_PACKAGES,
    # container runtimes
    "docker*", "containerd*", "moby-*", "podman", "runc", "crun", "cri-o*",
)
