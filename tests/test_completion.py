"""Shell completion generated from the real parser (packaging/completion.py): bash and zsh complete the real
subcommands, options, choices and file arguments."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from agent.cli import build_parser
from tests import needs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packaging"))
import completion  # noqa: E402 - packaging/ is not a package; the build imports it the same way

TIMEOUT_SECONDS = 20

HUB_COMMANDS = ["serve", "add-host", "add-reader", "add-admin", "policy", "deny", "rollout"]


def top_level_commands() -> List[str]:
    """The subcommands argparse really has, straight from the parser."""
    [sub] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return list(sub.choices)


def bash_complete(script: Path, line: str) -> List[str]:
    """What bash offers for ``line`` (the cursor at its end), through the generated script."""
    words = line.split(" ")
    program = (f"source {script}\nCOMP_WORDS=({' '.join(repr(w) for w in words)})\nCOMP_CWORD={len(words) - 1}\n"
               '_gpuguard\nprintf "%s\\n" "${COMPREPLY[@]}"\n')
    result = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], capture_output=True, text=True,
                            timeout=TIMEOUT_SECONDS, check=True)
    return result.stdout.split()


def zsh_complete(script: Path, line: str) -> List[str]:
    """What the zsh function adds for ``line`` that matches the word being typed (zsh's own filter), with
    compadd/_files recorded instead of drawn."""
    words = line.split(" ")
    program = (f"compdef() {{ : }}\ncompadd() {{ [[ $1 == -- ]] && shift; print -l -- $@ }}\n"
               "_files() { print -- '<files>' $@ }\n_message() { : }\n"
               f"source {script}\nwords=({' '.join(repr(w) for w in words)})\nCURRENT={len(words)}\n"
               f"PREFIX={words[-1]!r}\n_gpuguard\n")
    result = subprocess.run(["zsh", "-f", "-c", program], capture_output=True, text=True, timeout=TIMEOUT_SECONDS,
                            check=True)
    return [word for word in result.stdout.split() if word.startswith(words[-1])]


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict:
    where = tmp_path_factory.mktemp("completion")
    out = {}
    for shell in ("bash", "zsh"):
        out[shell] = where / shell
        out[shell].write_text(completion.render(shell))
    return out


def test_tables_list_every_command_path_of_the_parser() -> None:
    """The generator walks the parser: every top-level command and the nested ones (hub serve, policy compile)."""
    paths = {level.path: level for level in completion.levels(build_parser())}
    assert paths[""].subcommands == tuple(top_level_commands())
    assert "status" in paths[""].subcommands and "hub serve" in paths and "policy compile" in paths
    assert paths["status"].options == ("--config", "--drain", "--help", "--json", "--node-name", "--offline",
                                       "--root", "--slurm", "-h")
    assert paths["status"].values == {"--config": "file", "--root": "dir", "--node-name": "value"}
    assert paths[""].values["--log-level"] == "choices:debug info warning error"


def test_bash_completes_subcommands_options_choices_and_files(scripts: dict, tmp_path: Path) -> None:
    """Real bash, the generated script: top level, nested, options, --log-level choices, --config files."""
    if shutil.which("bash") is None:
        needs.unavailable("bash completion tests", "bash is not installed")
    script = scripts["bash"]
    assert bash_complete(script, "gpuguard ") == top_level_commands()
    assert bash_complete(script, "gpuguard st") == ["status"]
    assert bash_complete(script, "gpuguard hub ") == HUB_COMMANDS
    assert bash_complete(script, "gpuguard status --") == ["--config", "--drain", "--help", "--json",
                                                              "--node-name", "--offline", "--root", "--slurm"]
    assert bash_complete(script, "gpuguard --log-level ") == ["debug", "info", "warning", "error"]
    assert bash_complete(script, "gpuguard --log-level debug hub serve --c") == ["--config"]
    (tmp_path / "agent-test.toml").write_text("")
    assert bash_complete(script, f"gpuguard status --config {tmp_path}/agent-t") == [f"{tmp_path}/agent-test.toml"]


def test_zsh_completes_the_same(scripts: dict) -> None:
    """Real zsh: the script parses, and the completion function offers the same words."""
    if shutil.which("zsh") is None:
        needs.unavailable("zsh completion tests", "zsh is not installed (apt-get install zsh)")
    script = scripts["zsh"]
    subprocess.run(["zsh", "-n", str(script)], check=True, timeout=TIMEOUT_SECONDS)
    assert script.read_text().startswith("#compdef gpuguard\n")
    assert zsh_complete(script, "gpuguard ") == top_level_commands()
    assert zsh_complete(script, "gpuguard hub ") == HUB_COMMANDS
    assert zsh_complete(script, "gpuguard status --") == ["--config", "--drain", "--help", "--json",
                                                              "--node-name", "--offline", "--root", "--slurm"]
    assert zsh_complete(script, "gpuguard --log-level ") == ["debug", "info", "warning", "error"]
    assert zsh_complete(script, "gpuguard status --config ") == ["<files>"]
