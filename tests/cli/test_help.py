"""`--help` as a user reads it: the command's own options first, the shared ones under their heading, an example
that works as typed, every `--format` described, and whole summaries in the top-level list."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from plugin.cli import cli
from plugin.config.flags import options_for

COMMANDS = sorted(cli.commands)
HEADING = "Node and daemon options:"


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real entry point (`python -m plugin`), as a user's shell runs it."""
    return subprocess.run([sys.executable, "-m", "plugin", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def entries(help_text: str) -> dict[str, str]:
    """Each option's help entry (its first flag -> the entry's text, flag line and continuation lines)."""
    out: dict[str, str] = {}
    current = None
    for line in help_text.splitlines():
        m = re.match(r"^  (-\w, )?(--[\w-]+)", line)
        if m:
            current = m.group(2)
            out[current] = line
        elif current and line.startswith("    "):
            out[current] += " " + line.strip()
        else:
            current = None
    return out


def section(help_text: str, title: str) -> str:
    """The lines of a help section (from its title to the next unindented line)."""
    lines = help_text.splitlines()
    start = lines.index(title)
    end = next((i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith(" ")), len(lines))
    return "\n".join(lines[start + 1:end])


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    out = {}
    for command in COMMANDS:
        proc = run(command, "--help")
        assert proc.returncode == 0 and not proc.stderr, proc.stderr
        out[command] = proc.stdout
    return out


@pytest.mark.parametrize("command", ["allocate", "explain", "discover", "demo"])
def test_own_options_come_before_the_node_options(helps, command):
    text = helps[command]
    shared = {o.flag for o in options_for(command)}
    assert text.count(HEADING) == 1, text
    heading = text.index(HEADING)
    listed = entries(text)
    own = [flag for flag in listed if flag not in shared and flag != "--help"]
    assert own, f"{command} shows no options of its own"
    for flag in own:
        assert text.index(f"  {flag}") < heading, f"{command}: {flag} is listed after the node options"
    for flag in shared:
        assert text.index(f"  {flag}") > heading, f"{command}: {flag} is not under {HEADING!r}"


def test_serve_lists_every_option_under_the_node_heading(helps):
    text = helps["serve"]
    node = entries(text[text.index(HEADING):])
    assert set(node) == {o.flag for o in options_for("serve")}


@pytest.mark.parametrize("command", ["allocate", "explain", "discover"])
def test_format_is_described_value_by_value(helps, command):
    entry = entries(helps[command])["--format"]
    choices = re.search(r"\[([a-z|]+)\]", entry).group(1).split("|")
    words = entry.split("]", 1)[1].split("[default:")[0]  # the description: no metavar, no default
    assert all(re.search(rf"\b{c}\b", words) for c in choices), entry


def test_size_and_the_id_lists_are_described_in_words(helps):
    text = helps["allocate"]
    # The gRPC field names are no help to someone who has not read the proto.
    for field in ("allocation_size", "available_deviceIDs", "must_include_deviceIDs"):
        assert field not in text
    listed = entries(text)
    for flag in ("--size", "--available", "--must-include"):
        words = re.sub(r"\[.*?\]", "", listed[flag]).split(None, 2)[2]  # drop the flag and its metavar
        assert len(words.split()) >= 4, listed[flag]


def examples(text: str) -> list[str]:
    title = "Example:" if "Example:" in text.splitlines() else "Examples:"
    return [line.strip() for line in section(text, title).splitlines() if line.strip()]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_an_example(helps, command):
    found = examples(helps[command])
    assert len(found) == 1 and found[0].startswith(f"topo-device-plugin {command} "), found


@pytest.mark.parametrize("command", ["allocate", "explain", "discover", "demo"])
def test_the_example_works_as_typed(helps, command, tmp_path):
    """`serve` is left out: it runs until stopped (tests/daemon cover it)."""
    args = shlex.split(examples(helps[command])[0])[1:]
    proc = run(*args, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.strip()


def test_every_option_says_how_to_set_it_from_the_environment(helps):
    for command, text in helps.items():
        assert "TOPO_DP_<OPTION>" in text, command


def test_top_level_help_shows_each_summary_whole():
    proc = run("--help")
    assert proc.returncode == 0
    listing = section(proc.stdout, "Commands:")
    assert "..." not in listing
    flat = " ".join(listing.split())
    for name, command in cli.commands.items():
        summary = " ".join(command.help.split("\n\n")[0].split())
        assert f"{name} {summary}" in flat, (name, summary)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_and_argument_says_what_it_is(command):
    # issue 33: `health --help` listed `{clear}` with nothing beside it. Each entry of every command's
    # help has words next to its name.
    import click

    cmd = cli.commands[command]
    ctx = click.Context(cmd, info_name=command)
    bare = []
    for param in cmd.get_params(ctx):
        if isinstance(param, click.Argument):
            text = getattr(cmd, "arguments", {}).get(param.name or "", "")
        else:
            record = param.get_help_record(ctx)
            text = record[1] if record else "hidden"
        if not text.strip():
            bare.append(param.name)
    assert bare == [], f"{command} --help: no description for {bare}"
