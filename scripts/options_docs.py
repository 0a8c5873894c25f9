#!/usr/bin/env python3
"""Regenerate what is written from the option declarations in plugin/config/flags.py.

    python scripts/options_docs.py            # rewrite both in place
    python scripts/options_docs.py --check    # exit 1 if either is stale (tests/cli/test_options_model.py too)

Two checked-in files hold generated parts:

* docs/configuration.md: the options table, between `<!-- options-table:start -->` and
  `<!-- options-table:end -->`;
* charts/topo-device-plugin/values.schema.json: the `config.flags` subtree (`chart_schema_flags`),
  and nothing else of that file, which is written by hand.

The config file's own `flags:` schema needs no step: the daemon builds it from the same
declarations when it starts (`plugin.config.schema()`).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "configuration.md"
CHART_SCHEMA = ROOT / "charts" / "topo-device-plugin" / "values.schema.json"
START, END = "<!-- options-table:start -->\n", "<!-- options-table:end -->"


def render_doc(text: str) -> str:
    from plugin.config.flags import markdown_table

    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return head + START + markdown_table() + END + tail


def render_chart_schema(text: str) -> str:
    """values.schema.json with its `config.flags` subtree regenerated (the file is `json.dumps(indent=2)`)."""
    from plugin.config.flags import chart_schema_flags

    data = json.loads(text)
    try:
        config = data["properties"]["config"]["properties"]
    except KeyError:
        raise SystemExit(f"options_docs: {CHART_SCHEMA} has no properties.config.properties") from None
    config["flags"] = chart_schema_flags()  # same key, same place: the rest of the file is untouched
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a generated part is stale")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    stale = []
    for path, render in ((DOC, render_doc), (CHART_SCHEMA, render_chart_schema)):
        text = path.read_text()
        new = render(text)
        if new == text:
            continue
        if args.check:
            stale.append(path.relative_to(ROOT))
        else:
            path.write_text(new)
            print(f"options_docs: wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"options_docs: stale: {', '.join(map(str, stale))} (fix: run python scripts/options_docs.py)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
