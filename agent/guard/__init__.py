"""The package-manager guard: apt and dnf transactions judged against the pinned pairing policy, and rollback.

- ``hotpath/``: what runs inside every apt and dnf transaction (transaction, decision, override windows, state
  files, the shared entry); standard library only.
- ``apt/`` and ``dnf/``: each front end's entry and protocol, its package tool, package-file cache, rollback
  backend and native pins (apt preferences, dnf versionlock). They never import each other.
- ``rollback/``: the neutral rollback core and the backend Protocol both front ends implement.
- ``manager.py`` picks apt or dnf for a host; ``pin_records.py`` computes the pins both render; ``locks.py`` waits
  for a package manager's lock; ``settings.py`` the ``[guard]`` settings. The commands are in agent/commands/.

tests/test_imports.py enforces the import rules; docs/architecture.md draws the flows.
"""
