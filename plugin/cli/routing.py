"""Errors become exit codes here, by kind (`plugin.errors`), for every command.

Bad input exits 2 with its message (file, field, fix), a runtime failure exits
1 with its message, and anything else is a bug: its traceback is printed and
the exit code is 1, never "bad input". A reader closing our output
(`... | head -1`) is neither: a quiet exit (`pipes.py`).
"""

from __future__ import annotations

import traceback
from typing import Any

import click

from ..errors import InputError, RuntimeFailure
from .help import SectionedCommand
from .pipes import quiet_on_closed_pipe


class BadInput(click.ClickException):
    """A user input error: `Error: <file>: <field>: <problem> (fix: ...)`, exit 2 (no usage text)."""

    exit_code = 2


class Command(SectionedCommand):
    """A click command that routes the program's errors to exit codes (and lays out its help, `help.py`)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with quiet_on_closed_pipe():
                return super().invoke(ctx)
        except InputError as e:
            raise BadInput(str(e)) from None
        except RuntimeFailure as e:
            raise click.ClickException(str(e)) from None
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as e:  # noqa: BLE001 (a bug: say so, with the traceback, and exit 1)
            click.echo(traceback.format_exc(), err=True, nl=False)
            raise click.ClickException(f"internal error (a bug, please report it with the traceback above): "
                                       f"{type(e).__name__}: {e}") from None


class Group(click.Group):
    """The top-level group: a closed pipe while it prints help or usage is a quiet exit too."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        with quiet_on_closed_pipe():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with quiet_on_closed_pipe():  # a command's own --help is printed while the group invokes it
            return super().invoke(ctx)
