# Developer shortcuts; CI runs .ci/run (set-up, lint gates, the whole suite). See CONTRIBUTING.md.
PYTHON := .venv/bin/python
# Tests that need a debootstrap chroot, a dnf installroot or package builds, and the slow ones (real daemons,
# servers, torch): `test-fast` leaves them out, `test-chroot` runs only the first three.
HEAVY := chroot or installroot or packaging

.PHONY: setup lint test test-fast test-chroot

setup:
	bash scripts/setup.sh --test

lint:
	.venv/bin/ruff check .
	.venv/bin/mypy

test:
	$(PYTHON) -m pytest -q

test-fast:
	$(PYTHON) -m pytest -q -m "not ($(HEAVY)) and not slow"

test-chroot:
	$(PYTHON) -m pytest -q -m "$(HEAVY)"
