#!/usr/bin/env python3
"""Regenerate the options table of docs/configuration.md from plugin/config/flags.py.

    python scripts/options_docs.py            # rewrite the table in place
    python scripts/options_docs.py --check    # exit 1 if the table is stale (tests/cli/test_options_model.py too)

The table sits between `<!-- options-table:start -->` and `<!-- options-table:end -->`.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "configuration.md"
START, END = "<!-- options-table:start -->\n", "<!-- options-table:end -->"


def render(text: str) -> str:
    sys.path.insert(0, str(ROOT))
    from plugin.config.flags import markdown_table

    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return head + START + markdown_table() + END + tail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    text = DOC.read_text()
    new = render(text)
    if args.check:
        if new != text:
            print(f"{DOC} is stale: run python scripts/options_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
