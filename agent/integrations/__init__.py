"""Where operators look: node-feature-discovery labels for Kubernetes and a node check for Slurm.

    nfd.py     the features.d file: a pure renderer (state -> text) and an atomic writer (dot-file, rename)
    slurm.py   the Slurm verdict from ``gpuguard status``'s assessment, and draining/resuming through scontrol
"""
