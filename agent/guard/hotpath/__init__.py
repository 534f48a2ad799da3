"""The guard's hot path: what runs inside every apt and dnf transaction, standard library only.

The transaction model, the decision (policy evaluation, fail-safe, refusal lines and exit codes), override windows,
the state files, and the one never-raise entry the apt hook, the dnf checker and the dnf5 action share. Modules
here import the standard library, agent.hostfacts and the stdlib-only policy evaluator, nothing else (enforced by
tests/test_imports.py): they start in tens of milliseconds on the system python3 -IS.
"""
