"""rpm_version_problem against the real rpm: hypothesis-generated EVRs, judged by rpm's spec parser (python3-rpm).

rpm.ver() accepts anything; rpm.spec() applies rpmbuild's tag rules (illegal characters, empty tags, one token),
so a /usr/bin/python3 worker writes a minimal spec with the EVR's Epoch, Version and Release and reports whether
rpm parses it. Locally the test is skipped when python3-rpm is missing; in CI it fails.
"""

from __future__ import annotations

from typing import Iterator, List, Optional

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agent.versions import rpm_version_problem
from tests.rpm_worker import RpmWorker, start_rpm_worker

pytestmark = pytest.mark.slow  # a real rpm worker process: left out of `make test-fast`

WORKER = r"""
import json, os, sys, tempfile, rpm
rpm.setLogFile(open(os.devnull, "w"))
for line in sys.stdin:
    epoch, version, release = json.loads(line)
    spec = ("Name: x\n" + ("Epoch: %s\n" % epoch if epoch is not None else "") + "Version: %s\nRelease: %s\n"
            "Summary: x\nLicense: MIT\n%%description\nx\n") % (version, release)
    fd, path = tempfile.mkstemp(suffix=".spec")
    os.write(fd, spec.encode("utf-8"))
    os.close(fd)
    try:
        rpm.spec(path)
        ok = True
    except ValueError:
        ok = False
    finally:
        os.unlink(path)
    sys.stdout.write(json.dumps(ok) + "\n")
    sys.stdout.flush()
"""


@pytest.fixture(scope="module")
def real_rpm() -> Iterator[RpmWorker]:
    worker = start_rpm_worker(WORKER, "rpm version validity checks", probe="import rpm; rpm.spec", quiet=True)
    yield worker
    worker.close()


# '%', '{' and '}' are rpm macro syntax (expanded before the check), left out on purpose; so is blank space at
# either end of a part, which a spec file's tag parser trims (inside a part rpm refuses it, as this checker does).
PART = st.text(alphabet="0123456789aZ._+~^-:; é\t", max_size=8).filter(lambda s: s == s.strip())
EVRS = st.builds(lambda e, v, r: (f"{e}:" if e is not None else "") + v + (f"-{r}" if r is not None else ""),
                 st.one_of(st.none(), st.sampled_from(["0", "1", "12", "", "x"])), PART,
                 st.one_of(st.none(), PART))


def _split(evr: str) -> List[Optional[str]]:
    """The EVR's parts as rpm_version_problem reads it: epoch before the first ':', release after the last '-'."""
    head, colon, rest = evr.partition(":")
    epoch, text = (head, rest) if colon else (None, evr)
    version, hyphen, release = text.rpartition("-")
    return [epoch, version, release] if hyphen else [epoch, text, None]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(evr=EVRS)
def test_rpm_version_problem_agrees_with_rpm_spec_parsing(real_rpm: RpmWorker, evr: str) -> None:
    """An EVR is valid here exactly when rpm accepts its epoch, version and release as spec tags."""
    epoch, version, release = _split(evr)
    assume(all(p is None or p == p.strip() for p in (epoch, version, release)))  # a spec would trim these
    if not evr:
        assert rpm_version_problem(evr) is not None
        return
    accepted = bool(real_rpm.ask([epoch, version or "", release if release is not None else "1"]))
    assert (rpm_version_problem(evr) is None) == accepted, (evr, rpm_version_problem(evr))
