"""agent/files.py: the one reader of state and config files (bounds, decoding, non-finite numbers, moving aside)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.errors import InputFileError, StateWriteError
from agent.files import (
    FileMissing,
    create_exclusive,
    make_private_directory,
    move_aside,
    read_bytes_bounded,
    read_json_file,
    remove_flat_directory,
    write_atomically,
)
from agent.strictjson import nesting_depth, parse_json_text
from tests.conftest import fill_disk

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("content,reason", [
    (b'{"a": "\xff"}', "not UTF-8 text (byte 7)"),
    (b"[" * 65 + b"]" * 65, "not valid JSON (nested deeper than 64 levels)"),
    (b"[" * 100000 + b"]" * 100000, "not valid JSON (nested deeper than 64 levels)"),
    (b'{"a": NaN}', "not valid JSON (non-finite number NaN is not allowed)"),
    (b'{"a": -Infinity}', "not valid JSON (non-finite number -Infinity is not allowed)"),
    (b'{"a": 1e400}', "not valid JSON (non-finite number 1e400 is not allowed)"),
    (b"{", "not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
])
def test_damaged_json_is_an_input_file_error_naming_the_file(tmp_path: Path, content: bytes, reason: str) -> None:
    """Every kind of damage is InputFileError with the path and a one-line reason, never a foreign exception."""
    path = tmp_path / "state.json"
    path.write_bytes(content)
    with pytest.raises(InputFileError) as caught:
        read_json_file(str(path))
    assert caught.value.path == str(path) and caught.value.reason == reason


def test_sixty_four_levels_and_finite_numbers_are_fine(tmp_path: Path) -> None:
    """JSON nested 64 levels deep with large finite numbers is read."""
    path = tmp_path / "ok.json"
    path.write_bytes(b"[" * 63 + b'{"a": 1.5e300}' + b"]" * 63)
    assert nesting_depth(read_json_file(str(path))) == 64


def test_size_is_bounded(tmp_path: Path) -> None:
    """A JSON file over max_bytes is an InputFileError saying so."""
    path = tmp_path / "big.json"
    path.write_bytes(b" " * 101)
    with pytest.raises(InputFileError, match="larger than 100 bytes"):
        read_json_file(str(path), max_bytes=100)


def test_missing_and_dangling_files_are_missing(tmp_path: Path) -> None:
    """No file, or a symlink to none, gives None (or the reason given); FileMissing from the byte reader."""
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling.json")
    for name in ("absent.json", "dangling.json"):
        assert read_json_file(str(tmp_path / name)) is None
        with pytest.raises(InputFileError, match="required here"):
            read_json_file(str(tmp_path / name), missing_reason="required here")
        with pytest.raises(FileMissing):
            read_bytes_bounded(str(tmp_path / name))


def test_a_directory_is_an_error_not_missing(tmp_path: Path) -> None:
    """A directory where a JSON file should be is an InputFileError, not FileMissing."""
    with pytest.raises(InputFileError) as caught:
        read_json_file(str(tmp_path))
    assert not isinstance(caught.value, FileMissing)


def test_move_aside_keeps_the_file_under_a_new_name(tmp_path: Path) -> None:
    """Two damaged copies in the same second both survive."""
    path = tmp_path / "last-snapshot.json"
    names = []
    for content in (b"one", b"two"):
        path.write_bytes(content)
        names.append(move_aside(str(path), clock=lambda: 1000.0))
    assert names == [f"{path}.damaged-1000", f"{path}.damaged-1000-1"]
    assert [Path(n).read_bytes() for n in names] == [b"one", b"two"] and not path.exists()
    assert move_aside(str(path)) is None


def test_a_fifo_in_place_of_a_file_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO where a state or config file belongs is 'not a regular file' at once, never a hang."""
    fifo = tmp_path / "agent.toml"
    os.mkfifo(fifo)
    with pytest.raises(InputFileError, match="not a regular file"):
        read_bytes_bounded(str(fifo))


JSON_PIECES = st.sampled_from(['{', '}', '[', ']', ',', ':', '"a"', '"\\u00e9"', '"\\ud800"', '1', '-0', '1e400', '2.5',
                               'NaN', 'Infinity', 'true', 'null', ' ', '\n', '"x', 'tru', '0x1', '01'])


@settings(max_examples=1500, deadline=None)
@given(st.one_of(st.lists(JSON_PIECES, max_size=10).map("".join),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                              lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                          max_size=3),
                              max_leaves=8).map(json.dumps)))
def test_the_fast_json_reader_accepts_and_refuses_exactly_what_strict_json_loads_does(text: str) -> None:
    """parse_json_text's C-scanner path gives json.loads's value, or refuses what it (with NaN refused) refuses."""
    try:
        expected = json.loads(text, parse_constant=_refuse, parse_float=_finite)
    except ValueError:
        with pytest.raises(InputFileError):
            parse_json_text("f.json", text)
    else:
        assert parse_json_text("f.json", text) == expected


def _refuse(name: str) -> None:
    raise ValueError(name)


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(text)
    return value


def test_the_fast_json_reader_imports_no_json_module_for_a_valid_document() -> None:
    """Reading valid JSON on the hot path does not import json (and with it re and enum)."""
    code = ("import sys; sys.path.insert(0, %r); from agent.strictjson import parse_json_text; "
            "assert parse_json_text('p', ' {\"a\": [1, 2.5, \"x\"]}\\n') == {'a': [1, 2.5, 'x']}; "
            "print(sorted(m for m in ('json', 're', 'enum') if m in sys.modules))" % str(REPO))
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("text", ['{not json', '{"a": [1, }', '{"a": NaN}', "[1] 2", "", "[" * 5000])
def test_invalid_json_in_a_fresh_interpreter_is_an_input_file_error(text: str) -> None:
    """With json not imported yet (the hook's case), bad JSON is still one InputFileError, never a SystemError
    from the C scanner (which needs json.decoder loaded to word its error)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from agent.errors import InputFileError\n"
            "from agent.strictjson import parse_json_text\n"
            "try:\n    parse_json_text('p.json', sys.argv[2])\n"
            "except InputFileError as exc:\n    print('refused', exc)\n")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(REPO), text], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused p.json"), out.stdout


def test_write_atomically_on_a_full_disk_keeps_the_old_file(small_disk: Path) -> None:
    """ENOSPC: StateWriteError (an OSError too, exit 16) in one line, the old file byte for byte, no temporary."""
    state = small_disk / "state"
    state.mkdir()
    (state / "known-good.json").write_text('{"old": true}\n')
    fill_disk(small_disk / "filler")
    with pytest.raises(StateWriteError) as info:
        write_atomically(str(state / "known-good.json"), json.dumps({"new": "x" * 300000}))
    error = info.value
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC and error.exit_code == 16
    assert str(error) == f"{state / 'known-good.json'}: cannot be written (No space left on device): the old file " \
                         f"is kept"
    assert (state / "known-good.json").read_text() == '{"old": true}\n'
    assert sorted(p.name for p in state.iterdir()) == ["known-good.json"]


def test_write_atomically_into_an_unwritable_place_is_state_write_error(tmp_path: Path) -> None:
    """A directory that cannot be made (a file in its place) is StateWriteError too, not a bare OSError."""
    (tmp_path / "state").write_text("a file, not a directory")
    with pytest.raises(StateWriteError, match="cannot be written"):
        write_atomically(str(tmp_path / "state" / "x.json"), "{}")


def test_atomic_writes_leave_no_temporary_file_and_never_follow_a_planted_link(tmp_path: Path) -> None:
    """The temporary file is new (O_EXCL, O_NOFOLLOW, mode 0600 until the final chmod): a link planted at any name
    is never written through; the write leaves only the target."""
    target = tmp_path / "metrics.prom"
    write_atomically(str(target), "a 1\n", mode=0o640)
    assert target.read_text() == "a 1\n" and oct(target.stat().st_mode & 0o777) == "0o640"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.prom"]
    fd, path = create_exclusive(str(tmp_path), ".x.")
    os.close(fd)
    assert os.path.basename(path).startswith(".x.") and oct(os.stat(path).st_mode & 0o777) == "0o600"
    with pytest.raises(FileExistsError):
        os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW)


def test_private_directory_is_made_where_tempfile_would_and_removed_with_its_files(tmp_path: Path) -> None:
    """$TMPDIR first, the next place when it is missing; mode 0700; removal takes the files left in it."""
    made = make_private_directory("gpuguard-config-", {"TMPDIR": str(tmp_path)})
    assert os.path.dirname(made) == str(tmp_path) and os.path.basename(made).startswith("gpuguard-config-")
    assert oct(os.stat(made).st_mode & 0o777) == "0o700"
    fallback = make_private_directory("gpuguard-config-", {"TMPDIR": str(tmp_path / "missing")})
    assert os.path.dirname(fallback) == "/tmp"
    for directory in (made, fallback):
        Path(directory, ".result.json.0a1b").write_text("{}")
        remove_flat_directory(directory)
        assert not os.path.exists(directory)
    remove_flat_directory(made)  # gone already: nothing raised
