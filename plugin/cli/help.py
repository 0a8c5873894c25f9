"""The layout of `--help`: a command's own options first, the node and daemon options under their heading.

Why: `allocate` and `explain` take some 25 options shared by every command
that looks at a node (`plugin.config.flags`); listed in declaration order
they buried the four a user came for (`--size`, `--with`, ...). The shared
ones are grouped under one heading and their common rule (environment
variable, config file) is said once instead of on every line. Each command
ends with an example, and the top-level list shows each command's whole
summary instead of cutting it off mid-sentence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from ..config.flags import options_for

NODE_HEADING = "Node and daemon options"
NODE_NOTE = ("Which node, and how its devices are served. Each, --config aside, "
             "can also be set in the config file's flags: (camelCase, e.g. flags.deviceIdStrategy).")
ENV_NOTE = ("Every option also reads the environment variable TOPO_DP_<OPTION> (e.g. --{flag}: TOPO_DP_{env}). "
            "Precedence: flag > environment > config file > default.")


class SectionedCommand(click.Command):
    """A click command whose help lists its own options, then the declared node/daemon options, then examples."""

    def __init__(self, *args: Any, examples: Sequence[str] = (), arguments: dict[str, str] | None = None,
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        #: Shell lines shown under "Example" (one per command is the rule).
        self.examples = tuple(examples)
        #: What each positional argument means (click arguments take no help; without this the help
        #: listed `{clear}` with nothing beside it).
        self.arguments = dict(arguments or {})

    def get_short_help_str(self, limit: int = 45) -> str:
        """The first paragraph of the help, whole: the top-level list wraps it instead of cutting it."""
        if self.short_help:
            return self.short_help
        return " ".join((self.help or "").split("\n\n", 1)[0].split())

    def _shared(self) -> set[str]:
        return {o.dest for o in options_for(self.name or "")}

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        shared = self._shared()
        own: list[tuple[str, str]] = []
        node: list[tuple[str, str]] = []
        args: list[tuple[str, str]] = []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if isinstance(param, click.Argument):
                args.append((record[0] if record else param.make_metavar(ctx), self.arguments.get(param.name or "", "")))
            elif record is not None:
                (node if param.name in shared else own).append(record)
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        if own:
            with formatter.section("Options"):
                formatter.write_dl(own)
        if node:
            with formatter.section(NODE_HEADING):
                formatter.write_text(NODE_NOTE)
                formatter.write_paragraph()
                formatter.write_dl(node)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        # The environment rule, shown with the command's first own option (the one a user reaches for).
        shared = self._shared()
        with_env = [p for p in self.get_params(ctx) if isinstance(p, click.Option) and isinstance(p.envvar, str)]
        with_env.sort(key=lambda p: p.name in shared)
        if with_env:
            formatter.write_paragraph()
            formatter.write_text(ENV_NOTE.format(flag=with_env[0].opts[0].lstrip("-"),
                                                 env=str(with_env[0].envvar).removeprefix("TOPO_DP_")))
        if self.examples:
            with formatter.section("Example" if len(self.examples) == 1 else "Examples"):
                for line in self.examples:  # written as is: a shell line must not be re-wrapped
                    formatter.write(f"{'':>{formatter.current_indent}}{line}\n")
