"""Facts read off a host root with the standard library only, shared by the collectors and the guard's hot path.

Each fact has one parser here (os-release, the KFD topology's gfx targets, the loaded GPU kernel modules, the dpkg
status file, the rpm database): the collectors wrap them in models, the apt hook and the dnf checker call them
directly. ``context.py`` reads the host context every judgement of a host uses (OS, GPU targets, loaded GPU
modules) through them. Nothing here imports pydantic, structlog or any agent module but ``agent.records``
(tests/test_imports.py).
"""
