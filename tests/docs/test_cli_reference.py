"""docs/cli.md documents every command of ``b2bgw`` and every option each one shows in its ``--help``.

The commands come from ``b2bgw --help`` (run as a process, as a user would) and from each group's help
(``b2bgw db --help``, ...): the parser the command line builds, read through its own help texts. A command or
an option added without its section in docs/cli.md fails, naming it and the page.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
CLI_PAGE = ROOT / "docs" / "cli.md"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _listed_in_help(help_text: str) -> list[str]:
    """The command names a ``--help`` lists under its positional COMMAND / ACTION."""
    return re.findall(r"^    ([a-z][a-z0-9-]*)\s", help_text, flags=re.MULTILINE)


def commands() -> dict[str, argparse.ArgumentParser]:
    """``"db stats"`` -> its parser, for every command that runs (the leaves of the tree)."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        subs = _subcommands(parser)
        if not subs:
            found[" ".join(words)] = parser
            return
        listed = _listed_in_help(parser.format_help())
        assert sorted(listed) == sorted(subs), f"`b2bgw {' '.join(words)} --help` lists {listed}, not {sorted(subs)}"
        for name, sub in subs.items():
            walk(sub, words + [name])

    walk(build_parser(), [])
    return found


COMMANDS = commands()


def _sections() -> dict[str, str]:
    """``"db stats"`` -> the text of the cli.md section whose heading names `b2bgw db stats ...`."""
    text = CLI_PAGE.read_text(encoding="utf-8")
    sections: dict[str, str] = {}
    parts = re.split(r"^###\s+(.+)$", text, flags=re.MULTILINE)
    for heading, body in zip(parts[1::2], parts[2::2], strict=False):
        for named in re.findall(r"`b2bgw ([^`]+)`", heading):
            words = [word for word in named.split() if re.fullmatch(r"[a-z][a-z0-9-]*", word)]
            for n in range(len(words), 0, -1):
                if " ".join(words[:n]) in COMMANDS:
                    sections[" ".join(words[:n])] = heading + "\n" + body
                    break
    return sections


SECTIONS = _sections()
COMMON = CLI_PAGE.read_text(encoding="utf-8").split("## Options of every command", 1)[1].split("\n## ", 1)[0]


def test_b2bgw_help_lists_the_documented_groups():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "--help"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    listed = _listed_in_help(done.stdout)
    assert {"serve", "send", "db", "archive", "rules", "operator"} <= set(listed)
    for name in listed:
        assert f"`b2bgw {name}" in CLI_PAGE.read_text(), f"docs/cli.md has no section for `b2bgw {name}`"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_a_section(command):
    assert command in SECTIONS, (
        f"`b2bgw {command}` is not documented: add a section `### \\`b2bgw {command}\\`` "
        f"to docs/cli.md with its options"
    )


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_of_a_command_is_documented(command):
    section = SECTIONS.get(command, "")
    missing = []
    for action in COMMANDS[command]._actions:
        if action.help == argparse.SUPPRESS or not action.option_strings:
            continue
        longs = [o for o in action.option_strings if o.startswith("--")] or action.option_strings
        if not any(f"`{o}" in section or f"`{o}" in COMMON or f" {o}" in section for o in longs):
            missing.append(longs[0])
    assert not missing, f"docs/cli.md's section of `b2bgw {command}` does not document {missing}"


def test_the_counts():
    options = sum(
        1
        for parser in COMMANDS.values()
        for action in parser._actions
        if action.option_strings and action.help != argparse.SUPPRESS
    )
    assert len(COMMANDS) >= 20 and options >= 80, (len(COMMANDS), options)
