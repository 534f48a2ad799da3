"""Shell completion for ``gpuguard``, generated from its argparse parser (agent/cli.py) at package build time.

    python3 packaging/completion.py bash > gpuguard        # /usr/share/bash-completion/completions/gpuguard
    python3 packaging/completion.py zsh > _gpuguard        # zsh: vendor-completions (Debian), site-functions (RPM)

Both scripts carry the same tables, read from the parser: the subcommands and options at each command path
("", "hub", "hub serve", ...), which options take a value, and their choices. An option whose value is a path
(metavar PATH, FILE, DIR, or a --config/--root/--output option) completes file names. Nothing is hand-kept: a
new subcommand appears in the completion at the next build.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
_PATH_OPTIONS = ("--config", "--root", "--output", "--state-dir", "--tokens-file", "--policy", "--python")
_PATH_METAVARS = ("PATH", "FILE", "DIR")


class Level(NamedTuple):
    """What can follow one command path."""

    path: str
    subcommands: Tuple[str, ...]
    options: Tuple[str, ...]
    values: Dict[str, str]  # option -> "file", "dir", "value" or "choices:a b c"


def _value_kind(action: argparse.Action) -> Optional[str]:
    if action.nargs == 0:
        return None  # a flag
    if action.choices:
        return "choices:" + " ".join(str(c) for c in action.choices)
    metavar = action.metavar if isinstance(action.metavar, str) else ""
    if metavar == "DIR" or any(o in ("--root", "--state-dir") for o in action.option_strings):
        return "dir"
    if metavar in _PATH_METAVARS or any(o in _PATH_OPTIONS for o in action.option_strings):
        return "file"
    return "value"


def levels(parser: argparse.ArgumentParser, path: str = "") -> Iterator[Level]:
    """Every command path of the parser, depth first."""
    subcommands: Dict[str, argparse.ArgumentParser] = {}
    options: List[str] = []
    values: Dict[str, str] = {}
    for action in parser._actions:  # argparse has no public walk of its actions
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                subcommands[name] = child
            continue
        for option in action.option_strings:
            options.append(option)
            kind = _value_kind(action)
            if kind is not None:
                values[option] = kind
    yield Level(path, tuple(subcommands), tuple(sorted(options)), values)
    for name, child in subcommands.items():
        yield from levels(child, f"{path} {name}".strip())


def _parser() -> argparse.ArgumentParser:
    sys.path.insert(0, str(REPO))
    from agent.cli import build_parser

    return build_parser()


def _case_table(function: str, rows: List[Tuple[str, str]]) -> str:
    """A shell function answering its argument from a table (the same text works in bash and zsh)."""
    lines = [f"{function}() {{", '    case "$1" in']
    lines += [f'        "{key}") echo "{value}" ;;' for key, value in rows]
    lines += ["    esac", "}"]
    return "\n".join(lines)


def _tables(all_levels: List[Level], prefix: str) -> str:
    subs = [(lv.path, " ".join(lv.subcommands)) for lv in all_levels]
    opts = [(lv.path, " ".join(lv.options)) for lv in all_levels]
    kinds = [(f"{lv.path}|{option}", kind) for lv in all_levels for option, kind in sorted(lv.values.items())]
    return "\n\n".join((_case_table(f"{prefix}_subcommands", subs), _case_table(f"{prefix}_options", opts),
                        _case_table(f"{prefix}_value", kinds)))


_HEADER = "# {name} completion for gpuguard: generated from agent/cli.py by packaging/completion.py; do not edit.\n"

_BASH_BODY = r"""
# The command path: the words so far that name a subcommand of the path before them (options are skipped).
__gpuguard_path() {
    local path="" word i
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${COMP_WORDS[i]}"
        case " $(__gpuguard_subcommands "$path") " in
            *" $word "*) path="${path:+$path }$word" ;;
        esac
    done
    echo "$path"
}

_gpuguard() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD - 1]}"
    local path kind
    path="$(__gpuguard_path)"
    kind="$(__gpuguard_value "$path|$prev")"
    case "$kind" in
        file) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        dir) COMPREPLY=($(compgen -d -- "$cur")); return ;;
        value) COMPREPLY=(); return ;;
        choices:*) COMPREPLY=($(compgen -W "${kind#choices:}" -- "$cur")); return ;;
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$(__gpuguard_options "$path")" -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$(__gpuguard_subcommands "$path")" -- "$cur"))
    fi
}
complete -o filenames -F _gpuguard gpuguard
"""

_ZSH_BODY = r"""
__gpuguard_path() {
    local path="" word i
    for ((i = 2; i < CURRENT; i++)); do
        word="${words[i]}"
        case " $(__gpuguard_subcommands "$path") " in
            *" $word "*) path="${path:+$path }$word" ;;
        esac
    done
    echo "$path"
}

_gpuguard() {
    local path kind
    path="$(__gpuguard_path)"
    kind="$(__gpuguard_value "$path|${words[CURRENT - 1]}")"
    case "$kind" in
        file) _files; return ;;
        dir) _files -/; return ;;
        value) _message 'value'; return ;;
        choices:*) compadd -- ${=kind#choices:}; return ;;
    esac
    if [[ "$PREFIX" == -* ]]; then
        compadd -- ${=$(__gpuguard_options "$path")}
    else
        compadd -- ${=$(__gpuguard_subcommands "$path")}
    fi
}

if [[ "$funcstack[1]" == "_gpuguard" ]]; then
    _gpuguard "$@"
else
    compdef _gpuguard gpuguard
fi
"""


def render(shell: str, parser: Optional[argparse.ArgumentParser] = None) -> str:
    """The completion script for ``shell`` ("bash" or "zsh")."""
    all_levels = list(levels(parser or _parser()))
    tables = _tables(all_levels, "__gpuguard")
    if shell == "bash":
        return _HEADER.format(name="bash") + "\n" + tables + "\n" + _BASH_BODY
    if shell == "zsh":
        return "#compdef gpuguard\n" + _HEADER.format(name="zsh") + "\n" + tables + "\n" + _ZSH_BODY
    raise ValueError(f"unknown shell {shell!r}; use bash or zsh")


def main(argv: Optional[List[str]] = None) -> int:
    args = argparse.ArgumentParser(description="print gpuguard's shell completion")
    args.add_argument("shell", choices=["bash", "zsh"])
    sys.stdout.write(render(args.parse_args(argv).shell))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
