"""Install a signed policy bundle: verify, no serial rollback, in scope, compiles; then it is the bundle in force.

Each check refuses with BundleRefused (exit 17) and one line naming why, recorded as the last refusal in
``policy-bundle/state.json`` until a bundle is installed (a bundle still offered is refused again at the next
fetch; the serial a hub claims for a bundle that fails its signature is its word only, so it is never recorded
or reported); each refusal has its kind (agent/wire.py's REFUSAL_KINDS), recorded beside its sentence; nothing
else changes then, so the compiled policy in force keeps guarding. Only a bundle that passed every check replaces
the one in force, and only with ``[guard] policy_source = "bundle"`` is it compiled into the file the apt hook and
the dnf checkers read. Signature checks run gpgv (agent/bundle/verify.py), never on the hot path.
One install at a time (a lock file in ``policy-bundle/``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Literal, Optional, Sequence, Tuple

from agent.bundle.format import MATRIX_FILE_NAME, MAX_BUNDLE_BYTES, BundleInvalid, PolicyBundle, parse_bundle
from agent.bundle.roles import check_bundle_expiry, floor_reset, vouch
from agent.bundle.root import RootStore
from agent.bundle.scope import ScopeFacts, scope_refusal
from agent.bundle.state import BundleRefusal, BundleState, read_bundle_state, write_bundle_state
from agent.bundle.verify import verify_signature
from agent.errors import BundleRefused, GpuguardError, InputFileError
from agent.files import FileMissing, open_append_regular, read_bytes_bounded
from agent.statepaths import StatePaths

# Where the staged bundle's knowledge tables go (policy-bundle/knowledge once in force, agent/statepaths.py).
KNOWLEDGE_DIR = "knowledge"

if TYPE_CHECKING:  # pragma: no cover
    from agent.bundle.deny import DenyList
    from agent.bundle.freshness import FreshnessStatement
    from agent.bundle.roles import RootMetadata
    from agent.bundle.rollout_fields import RolloutFields
    from agent.bundle.source import PolicySettings
    from agent.host import Host
    from agent.policy.compiled import CompiledPolicy
    from agent.policy.knowledge_files import BundleKnowledge


@dataclass(frozen=True)
class Installed:
    """A bundle now in force: its serial and signing key; ``compiled`` when it was compiled for the hook
    (``policy_source = "bundle"``); ``unchanged`` when the very same bundle was in force already;
    ``rolled_back_from`` the serial in force before, when an operator's ``allow_rollback`` let a lower one in."""

    serial: int
    fingerprint: str
    policy_name: str
    compiled: bool
    unchanged: bool = False
    rolled_back_from: Optional[int] = None


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    import fcntl

    with os.fdopen(open_append_regular(str(directory / ".lock"), 0o644), "ab") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _extract(bundle: PolicyBundle, target: Path) -> Path:
    """Write the bundle's policy files to ``target/policy.d``, its matrix and its knowledge tables
    (``target/knowledge``) beside; the policy.d path."""
    policy_dir = target / "policy.d"
    policy_dir.mkdir(parents=True)
    for name, text in sorted(bundle.policy_files.items()):
        _write_bytes(policy_dir / name, text.encode("utf-8"))
    if bundle.matrix is not None:
        _write_bytes(target / MATRIX_FILE_NAME, bundle.matrix.encode("utf-8"))
    if bundle.knowledge is not None:
        (target / KNOWLEDGE_DIR).mkdir()
        for name, text in sorted(bundle.knowledge.items()):
            _write_bytes(target / KNOWLEDGE_DIR / name, text.encode("utf-8"))
    return policy_dir


def _check_knowledge(bundle: PolicyBundle, origin: str) -> None:
    """Each knowledge table the bundle carries parsed strictly (agent/policy/knowledge_files.py ``check_carried``);
    BundleRefused of kind ``format`` naming the file and the field otherwise, before anything is written."""
    from agent.policy.knowledge import KnowledgeInvalid
    from agent.policy.knowledge_files import check_carried

    try:
        check_carried(bundle.knowledge)
    except KnowledgeInvalid as exc:
        raise BundleRefused(origin, f"not a policy bundle: {exc}", "format", bundle.serial) from None


def _compile(policy_dir: Path, matrix_path: Optional[str], source: str, serial: int,
             knowledge: Optional["BundleKnowledge"]) -> "CompiledPolicy":
    """The bundle's policy compiled as ``policy compile`` does; BundleRefused naming every problem otherwise."""
    from agent.policy.load import load_and_compile

    try:
        return load_and_compile(str(policy_dir), matrix_path, knowledge)[1]
    except GpuguardError as exc:
        text = str(exc).replace(str(policy_dir) + "/", "").replace(str(policy_dir), "policy.d")
        raise BundleRefused(source, f"does not compile: {text}", "compile", serial) from None


class BundleInstaller:
    """Installs bundles into one state directory of one Host under the ``[guard]`` settings."""

    def __init__(self, host: "Host", guard: "PolicySettings", state_dir: str) -> None:
        self.host = host
        self.guard = guard
        self.paths = StatePaths(state_dir)
        self.directory = host.path(self.paths.policy_bundle_dir)

    def state(self) -> BundleState:
        return read_bundle_state(str(self.host.path(self.paths.policy_bundle_state)))

    def install(self, bundle_data: bytes, signature_data: bytes, *, origin: str, source: Literal["hub", "file"],
                facts: Callable[[], ScopeFacts], allow_rollback: bool = False) -> Installed:
        """Check and install one bundle (``origin`` names it in messages); BundleRefused, recorded with its kind,
        otherwise. The serial recorded is the bundle's own once its signature was verified, never what the hub
        claimed for it (a refused answer's claims are not facts). ``allow_rollback`` (an operator's explicit revert,
        never the hub's path) lets a serial below the one in force, or the same serial with other content, in;
        every other check still applies."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with _locked(self.directory):
            state = self.state()
            with tempfile.TemporaryDirectory(prefix=".incoming-", dir=self.directory) as work:
                try:
                    return self._install(Path(work), state, bundle_data, signature_data, origin, source, facts,
                                         allow_rollback)
                except BundleRefused as exc:
                    write_bundle_state(str(self.host.path(self.paths.policy_bundle_state)),
                                       state.with_refusal(exc.serial, exc.kind, exc.reason, self.host.clock()))
                    raise

    def walk_roots(self, chain: Sequence[Tuple[bytes, bytes]], origin: str) -> "RootMetadata":
        """Take the next root versions in order (agent/bundle/root.py) under the install lock."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with _locked(self.directory):
            return RootStore(self.host, self.paths.state_dir, self.guard.keys_dir).walk(chain, self.host.clock(),
                                                                                        origin)

    def floor_void(self) -> bool:
        """Whether a rotation voided the serial floor of the bundle in force (agent/bundle/roles.py floor_reset);
        False when the root cannot be told (the floor then stands)."""
        try:
            root = RootStore(self.host, self.paths.state_dir, self.guard.keys_dir).trusted(self.paths.policy_root)
            return floor_reset(root, self.state())
        except GpuguardError:
            return False

    def record_freshness(self, statement: "FreshnessStatement", newest: Optional[int]) -> None:
        """Keep what a checked freshness statement says for this host (agent/bundle/freshness.py)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with _locked(self.directory):
            write_bundle_state(str(self.host.path(self.paths.policy_bundle_state)),
                               replace(self.state(), freshness_issued_at=statement.issued,
                                       freshness_expires=statement.expires_at, freshness_newest=newest,
                                       withdrawn=statement.withdrawn,
                                       freshness_deny_serial=statement.deny_serial))

    def take_deny(self, root: "RootMetadata", data: bytes, signature: bytes, origin: str) -> Tuple["DenyList", bool]:
        """Check and put in force a deny list (agent/bundle/deny.py) under the install lock: (the list, whether it
        was new); a refusal is recorded with its kind and raised (BundleRefused), and nothing else changes then."""
        from agent.bundle.deny import take_deny

        self.directory.mkdir(parents=True, exist_ok=True)
        with _locked(self.directory):
            state_path = str(self.host.path(self.paths.policy_bundle_state))
            try:
                deny, new = take_deny(self.host, root, self.paths, data, signature, self.host.clock(), origin)
            except BundleRefused as exc:
                write_bundle_state(state_path, replace(self.state(), deny_refused=BundleRefusal(
                    exc.serial, exc.reason, self.host.clock(), exc.kind)))
                raise
            if new or self.state().deny_serial != deny.serial or self.state().deny_refused is not None:
                write_bundle_state(state_path, replace(self.state(), deny_serial=deny.serial, deny_refused=None))
            return deny, new

    def install_deny(self, data: bytes, signature: bytes, origin: str) -> Tuple["DenyList", bool]:
        """:meth:`take_deny` under the root this host trusts (``gpuguard policy deny install``, the air-gapped path);
        BundleRefused of kind signature when it trusts none (a deny list is judged by the root's policy roles)."""
        root = RootStore(self.host, self.paths.state_dir, self.guard.keys_dir).trusted(origin)
        if root is None:
            raise BundleRefused(origin, "no trusted root: a deny list is judged by the root's fleet-wide policy role "
                                        "(gpuguard policy trust-root ROOT_JSON first)", "signature")
        return self.take_deny(root, data, signature, origin)

    def record_denied_installed(self, found: Sequence[str]) -> None:
        """Keep the packages installed here at a denied version (``status`` attention, the heartbeat's ``denied``
        word); the file is written only when that changes."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with _locked(self.directory):
            state = self.state()
            if state.denied_installed != tuple(found):
                write_bundle_state(str(self.host.path(self.paths.policy_bundle_state)),
                                   replace(state, denied_installed=tuple(found)))

    def record_rollout(self, notice: Optional[str], fields: Optional[RolloutFields] = None) -> None:
        """Keep the hub's newest rollout fields and notice (None clears each); the file is written only when one
        changes."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with _locked(self.directory):
            state = self.state()
            if state.rollout != notice or state.rollout_fields != fields:
                write_bundle_state(str(self.host.path(self.paths.policy_bundle_state)),
                                   state.with_rollout(notice, self.host.clock(), fields))

    def record_hub_offer(self, offered: Optional[int]) -> None:
        """Keep whether the hub offers only serials below the one in force (``offered``; None: none in scope), with
        since when; the file is written only when that changes."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with _locked(self.directory):
            state = self.state()
            updated = state.with_hub_offer(offered, self.host.clock())
            if updated != state:
                write_bundle_state(str(self.host.path(self.paths.policy_bundle_state)), updated)

    def _install(self, work: Path, state: BundleState, bundle_data: bytes, signature_data: bytes, origin: str,
                 source: Literal["hub", "file"], facts: Callable[[], ScopeFacts], allow_rollback: bool) -> Installed:
        bundle_file, signature_file = work / "bundle.json", work / "bundle.json.sig"
        _write_bytes(bundle_file, bundle_data)
        _write_bytes(signature_file, signature_data)
        root = RootStore(self.host, self.paths.state_dir, self.guard.keys_dir).trusted(origin)
        vouched = None
        if root is None:
            fingerprint = verify_signature(self.host, str(bundle_file), str(signature_file), self.guard.keys_dir,
                                           origin)
        else:
            vouched = vouch(self.host, root, bundle_file, signature_file, facts(), self.host.clock(), origin)
            fingerprint = ",".join(vouched.signers)
        try:
            bundle = parse_bundle(bundle_data, origin)
        except BundleInvalid as exc:
            raise BundleRefused(origin, f"not a policy bundle: {exc.reason}", "format") from None
        expires = None
        if root is not None:
            expires = check_bundle_expiry(bundle.expires, self.host.clock(), origin, bundle.serial)
            if bundle.serial in state.withdrawn:
                raise BundleRefused(origin, f"serial {bundle.serial} is withdrawn (the hub's signed freshness "
                                            f"statement says so)", "freshness", bundle.serial)
        digest = hashlib.sha256(bundle_data).hexdigest()
        floor, floor_digest = (None, None) if floor_reset(root, state) else self._in_force(state, origin)
        rolled_back_from = None
        if floor is not None and bundle.serial <= floor:
            if bundle.serial == floor and digest == floor_digest:
                if state.serial == floor:
                    return Installed(bundle.serial, fingerprint, "", compiled=False, unchanged=True)
                # The very bundle in place, its state lost: installed again, which writes the state anew.
            elif allow_rollback:
                rolled_back_from = floor
            elif bundle.serial == floor:
                raise BundleRefused(origin, f"serial {bundle.serial} is in force already with other content "
                                            f"(a new bundle needs a higher serial)", "rollback", bundle.serial)
            else:
                raise BundleRefused(origin, f"serial {bundle.serial} is below serial {floor} in force (no rollback: "
                                            f"push the older policy again with a new serial)", "rollback",
                                     bundle.serial)
        refusal = None if bundle.scope.all else scope_refusal(bundle.scope, facts())
        if refusal is not None:
            raise BundleRefused(origin, refusal, "scope", bundle.serial)
        _check_knowledge(bundle, origin)
        staged = work / "staged"
        policy_dir = _extract(bundle, staged)
        matrix = str(staged / MATRIX_FILE_NAME) if bundle.matrix is not None else self.guard.matrix_path
        from agent.policy.knowledge_files import BundleKnowledge

        knowledge = BundleKnowledge(str(staged / KNOWLEDGE_DIR), bundle.serial) if bundle.knowledge else None
        compiled = _compile(policy_dir, matrix, origin, bundle.serial, knowledge)
        self._commit(staged, bundle_file, signature_file)
        installed = Installed(bundle.serial, fingerprint, compiled.name, compiled=False,
                              rolled_back_from=rolled_back_from)
        if self.guard.policy_source == "bundle":
            installed = replace(installed, compiled=self._compile_in_force(origin, bundle.serial))
        write_bundle_state(str(self.host.path(self.paths.policy_bundle_state)),
                           BundleState(serial=bundle.serial, fingerprint=fingerprint, source=source,
                                       installed_at=self.host.clock(), sha256=digest, refused=None,
                                       rollout=state.rollout, rollout_at=state.rollout_at,
                                       rollout_fields=state.rollout_fields,
                                       role=vouched.role if vouched else None,
                                       signers=vouched.signers if vouched else (), expires=expires,
                                       freshness_issued_at=state.freshness_issued_at,
                                       freshness_expires=state.freshness_expires,
                                       freshness_newest=state.freshness_newest, withdrawn=state.withdrawn,
                                       freshness_deny_serial=state.freshness_deny_serial,
                                       deny_serial=state.deny_serial, deny_refused=state.deny_refused,
                                       denied_installed=state.denied_installed))
        return installed

    def _in_force(self, state: BundleState, origin: str) -> Tuple[Optional[int], Optional[str]]:
        """The serial in force and its bundle's sha256: the higher of the state's and the bundle file's in place, so
        a lost or reset state file never lowers the floor a bundle must rise above (the file was verified when it
        was installed). BundleRefused when the file in place is damaged and the state names no serial."""
        path = self.host.path(self.paths.policy_bundle)
        try:
            data = read_bytes_bounded(str(path), MAX_BUNDLE_BYTES)
            placed = parse_bundle(data, str(path))
        except FileMissing:
            return state.serial, state.sha256
        except (InputFileError, OSError) as exc:
            if state.serial is not None:
                return state.serial, state.sha256
            raise BundleRefused(origin, f"the serial in force cannot be told: {exc} (and "
                                        f"{self.paths.policy_bundle_state} names none); remove "
                                        f"{self.paths.policy_bundle_dir} to start over", "rollback") from None
        if state.serial is not None and state.serial >= placed.serial:
            return state.serial, state.sha256
        return placed.serial, hashlib.sha256(data).hexdigest()

    def _commit(self, staged: Path, bundle_file: Path, signature_file: Path) -> None:
        """Move the checked bundle into place: its policy.d swapped by renames, then matrix, knowledge, signature,
        bundle."""
        live = self.host.path(self.paths.policy_bundle_policy_dir)
        old = staged.parent / "old-policy.d"
        if live.exists():
            os.replace(live, old)
        os.replace(staged / "policy.d", live)
        shutil.rmtree(old, ignore_errors=True)
        matrix = self.host.path(self.paths.policy_bundle_matrix)
        if (staged / MATRIX_FILE_NAME).exists():
            os.replace(staged / MATRIX_FILE_NAME, matrix)
        elif matrix.exists():
            matrix.unlink()
        knowledge = self.host.path(self.paths.policy_bundle_knowledge_dir)
        old_knowledge = staged.parent / "old-knowledge"
        if knowledge.exists():
            os.replace(knowledge, old_knowledge)
        if (staged / KNOWLEDGE_DIR).exists():
            os.replace(staged / KNOWLEDGE_DIR, knowledge)
        shutil.rmtree(old_knowledge, ignore_errors=True)
        os.replace(signature_file, self.host.path(self.paths.policy_bundle_signature))
        os.replace(bundle_file, self.host.path(self.paths.policy_bundle))

    def _compile_in_force(self, origin: str, serial: int) -> bool:
        """Compile the bundle now in place into the compiled policy the hook reads (atomically)."""
        from agent.bundle.source import policy_source
        from agent.policy.load import write_compiled

        chosen = policy_source(self.host, self.guard, self.paths.state_dir)
        # the state file names the new serial only after this (none at all on a first install): the knowledge in
        # place is this bundle's
        from agent.policy.knowledge_files import BundleKnowledge

        directory = self.host.path(self.paths.policy_bundle_knowledge_dir)
        knowledge = BundleKnowledge(str(directory), serial) if directory.is_dir() else None
        from agent.bundle.deny import with_denied

        compiled = _compile(Path(chosen.policy_path), chosen.matrix_path, origin, serial, knowledge)
        write_compiled(str(self.host.path(self.paths.compiled_policy)), with_denied(compiled, self.host, self.paths))
        return True

