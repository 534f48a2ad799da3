"""``gpuguard status``: what the agent on this host last saw and whether anything needs attention.

    facts.py    gather: read the state directory, /proc, systemd and the hub (I/O; damage becomes a reason)
    reboot.py   the reboot a rollback left to do (also for the daemon's NFD labels)
    assess.py   assess: facts and a time in, checks and an exit code out (pure)
    render.py   the views: a table or --json (the command: agent/commands/status.py)
"""
