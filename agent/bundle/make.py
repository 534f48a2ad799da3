"""Make a policy bundle from a policy.d directory (``gpuguard policy bundle``), after ``policy check`` passed."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Sequence

from agent.bundle.format import BUNDLE_FORMAT, MATRIX_FILE_NAME, BundleInvalid, BundleScope, PolicyBundle
from agent.errors import InputFileError, UsageError
from agent.files import decode_text, read_bytes_bounded
from agent.models import first_validation_problem


def policy_files_of(path: str) -> Dict[str, str]:
    """The policy files a bundle carries: every ``*.toml`` of a directory (the matrix aside), or the one file."""
    root = Path(path)
    if root.is_dir():
        files = sorted(p for p in root.iterdir() if p.suffix == ".toml" and p.is_file() and p.name != MATRIX_FILE_NAME)
    else:
        files = [root]
    return {file.name: decode_text(str(file), read_bytes_bounded(str(file))) for file in files}


def knowledge_files_of(paths: Sequence[str]) -> Optional[Dict[str, str]]:
    """The knowledge tables a bundle carries (file name -> text), each parsed strictly first (agent/policy/
    knowledge.py): KnowledgeInvalid naming the file and field; None when none is given."""
    from agent.policy.knowledge_files import read_table

    out: Dict[str, str] = {}
    for path in paths:
        read_table(path)
        name = Path(path).name
        if name in out:
            raise UsageError(f"--knowledge: {name} given twice")
        out[name] = decode_text(path, read_bytes_bounded(path))
    return out or None


def make_bundle(policy_path: str, serial: int, scope: BundleScope, created_by: str, created_at: str,
                matrix_path: Optional[str] = None, matrix_version: Optional[str] = None,
                expires: Optional[str] = None, knowledge_paths: Sequence[str] = ()) -> PolicyBundle:
    """The bundle of these policy files (and the matrix file at ``matrix_path`` and the knowledge tables at
    ``knowledge_paths``, when given); UsageError naming the field when a value is not allowed in a bundle."""
    from pydantic import ValidationError

    matrix = None
    if matrix_path is not None:
        try:
            matrix = decode_text(matrix_path, read_bytes_bounded(matrix_path))
        except InputFileError as exc:
            raise UsageError(str(exc)) from None
    try:
        return PolicyBundle(format=BUNDLE_FORMAT, serial=serial, created_at=created_at, created_by=created_by,
                            matrix_version=matrix_version, scope=scope, policy_files=policy_files_of(policy_path),
                            matrix=matrix, expires=expires, knowledge=knowledge_files_of(knowledge_paths))
    except ValidationError as exc:
        raise BundleInvalid(policy_path, f"cannot be a bundle: {first_validation_problem(exc)}") from None
