"""gpuguard: keeps a GPU host's kernel, driver and ROCm/CUDA stack frozen and working."""

__version__ = "0.1.0"
