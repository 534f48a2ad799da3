"""The bodies of the daemon's jobs, one per file; ``agent/daemon.py`` schedules them and owns signals.

    runtime.py    what every job shares: the Host, the settings in force, the outbox, in-memory state, the emitter
    resident_settings.py  the settings as the resident holds them: validated by pydantic in a config child, read as
                  a plain record (ResidentSettings) beside the validated JSON every child gets
    snapshot.py   take a snapshot, store it, report a changed content hash, evaluate the policy
    watch.py      notice package database changes (dpkg, rpm) cheaply and ask for a guard check at once
    guard.py      after a package change: check_and_rollback, forward guard events, then ask for the snapshot
    guard_events.py  forward guard-events.jsonl (apt hook, rollback) to the outbox, durably, at least once
    health.py     run the health check (agent.health, when installed), report it; after a package change gate the
                  change on it (the policy's [health] after_change: a health-gated rollback)
    health_schedule.py  the health job's mode per run (functional right after a change) and its retries while the
                  GPUs are busy, health_deferred when they never stop
    heartbeat.py  a periodic "alive" event with pairing, compliance, last health and outbox depth
    delivery.py   drain the outbox to the endpoint, in order (in a child), with backoff while it is down
    policy_fetch.py  the hub's policy bundle fetched and installed (in a child), with the plan of the next probe
    hub_probe.py  the policy fetch's cheap first step: a stdlib-only child asking the last full fetch's questions
    procstatus.py a process's peak RSS from /proc (stdlib only: the lean children read it too)
    snapshot_stamp.py  a stamp of the snapshot's inputs, so an interval run with nothing changed starts no child
    metrics.py    rewrite the node_exporter textfile from the state and the outbox
    children.py   run the config's validation, the read-back at start, the snapshot, the guard's rollback check and
                  forwarding, the health check and delivery's sending in short-lived children
    child_main.py the child's side (``gpuguard _job NAME``)
    protocol.py   each job's request and result record, checked field by field when read
    hooks.py      the policy engine's, the health runner's and the health-gated rollback's entry points (Protocols)
    job_runner.py how the scheduler calls a body: never raises, runs again when asked while running, reschedules
    scheduler.py  the resident's scheduler: each job on its own thread at its interval, never overlapping itself
    systemd_notify.py  sd_notify: READY=1, WATCHDOG=1, STATUS=, STOPPING=1 under systemd (a no-op without it)
    memory.py     cap glibc's malloc arenas, give freed memory back after each job
    openssl.py    keep ssl and hashlib's OpenSSL backend out of the resident (``gpuguard run``)
    lazy_asyncio.py  asyncio unloaded in the resident until something uses it (structlog imports it)

Every body may be slow or fail; none of them knows about the scheduler. A body that wants to run again sooner
says so by its return value or through the ``request_*`` callables it was given.
"""
