"""Accelerator health check: a standalone probe proves the ML stack computes on the GPUs; the agent judges it.

``probe.py`` runs under the host's ML interpreter or container and imports nothing from the agent; ``runner.py``
spawns it and ties the pure parts together (``parse``, ``fallback``, ``classify``, ``baseline``).
"""
