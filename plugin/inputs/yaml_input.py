"""Reading a user's YAML (config file, simulated node) with bounded cost, whatever it holds.

Why: the daemon re-reads these files when they change, and one ConfigMap edit
reaches every node. A file must never stop the daemon or bloat it, so:

- files above `MAX_FILE_BYTES` (1 MiB; real ones are a few KiB) are refused
  before they are read;
- anchors/aliases (`&a` / `*a`) are refused: a 450-byte "billion laughs"
  file would otherwise expand to gigabytes, and config and node files have
  no need for them;
- nesting deeper than `MAX_DEPTH` levels is refused with its line, before
  the parser recurses far enough for a `RecursionError`;
- schema messages quote at most a few dozen characters of the offending value.

jsonschema is imported by the first validation, not with this module: it costs
about 8 MiB of resident memory, and a daemon that reads neither a config file nor a
node file (NVML discovery, flags only) never validates anything. A daemon that does
validates at start-up, so the import never lands inside an RPC or a live reload.

Every failure is a `YamlProblem` (message, line, fix) that the caller turns
into its own input error naming the file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml
from yaml.composer import ComposerError

from ..errors import shorten
from .yamlpath import field_path, line_of

if TYPE_CHECKING:
    import jsonschema

MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 64
#: How much of a schema error message is kept (jsonschema puts the whole offending value in it).
MAX_MESSAGE = 240


class YamlProblem(Exception):
    """Why a YAML text cannot be used; `line` is 1-based when known."""

    def __init__(self, message: str, line: int | None = None, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.line = line
        self.fix = fix


class _BoundedLoader(yaml.SafeLoader):
    """The safe loader, minus aliases and unbounded nesting."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise ComposerError(None, None, "YAML aliases (*name) are not accepted", mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def read_text(path: str) -> str:
    """The file's text (undecodable bytes replaced); `YamlProblem` when it is too big, `OSError` as raised."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(MAX_FILE_BYTES + 1) if size <= MAX_FILE_BYTES else b""
    if size > MAX_FILE_BYTES or len(data) > MAX_FILE_BYTES:
        raise YamlProblem(f"the file is {max(size, len(data))} bytes, above the limit of {MAX_FILE_BYTES} bytes "
                          "(1 MiB)", fix="point at the right file; config and node files are a few KiB")
    return data.decode("utf-8", errors="replace")


def load(text: str) -> tuple[Any, yaml.Node | None]:
    """Parse one YAML document: (data, its node tree for line numbers)."""
    loader = _BoundedLoader(text)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        if "aliases" in problem:
            fix = "write the values out instead of using anchors and aliases"
        elif "nested deeper" in problem:
            fix = "flatten the file; config and node files need only a few levels"
        else:
            fix = "fix the YAML syntax"
        raise YamlProblem(f"not valid YAML: {problem}", mark.line + 1 if mark else None, fix) from None
    except (RecursionError, MemoryError) as e:
        raise YamlProblem(f"cannot be loaded ({type(e).__name__}): nested too deeply or too large",
                          fix="simplify the file") from None
    finally:
        loader.dispose()
    return data, root


@dataclass(frozen=True)
class SchemaProblem:
    path: list[Any]
    message: str
    validator: str
    line: int | None

    @property
    def field(self) -> str:
        return field_path(self.path)


def first_schema_error(schema: dict[str, Any], data: Any, root: yaml.Node | None) -> SchemaProblem | None:
    """The first (by path) way `data` breaks `schema`, with a short message and its line."""
    try:
        import jsonschema  # noqa: PLC0415 (here, not at the top: see the module docstring)

        errors: Iterable[jsonschema.ValidationError] = jsonschema.Draft202012Validator(schema).iter_errors(data)
        first = min(errors, key=lambda e: list(e.absolute_path), default=None)
    except (RecursionError, MemoryError) as e:
        raise YamlProblem(f"cannot be validated ({type(e).__name__}): nested too deeply or too large",
                          fix="simplify the file") from None
    if first is None:
        return None
    path = list(first.absolute_path)
    line = line_of(root, path)
    extra = _unexpected_keys(first)
    if extra:  # point at the bad key itself, not at the mapping that holds it
        line = line_of(root, [*path, extra[0]]) or line
    return SchemaProblem(path, _message(first), str(first.validator), line)


def _unexpected_keys(e: jsonschema.ValidationError) -> list[str]:
    """For an `additionalProperties` error, the keys the schema does not allow, in file order."""
    if e.validator != "additionalProperties" or not isinstance(e.instance, dict) or not isinstance(e.schema, dict):
        return []
    known = set(e.schema.get("properties") or ())
    patterns = [re.compile(p) for p in (e.schema.get("patternProperties") or ())]
    return [k for k in e.instance if isinstance(k, str) and k not in known and not any(p.search(k) for p in patterns)]


def _message(e: jsonschema.ValidationError) -> str:
    """jsonschema's message, with the offending value quoted in short; a pattern is said in words
    where the schema gives them (`x-expected`): a regular expression is no help to a person."""
    expected = e.schema.get("x-expected") if isinstance(e.schema, dict) else None
    text = f"{shorten(e.instance, 60)} is not {expected}" if e.validator == "pattern" and expected else e.message
    if len(text) > MAX_MESSAGE:
        text = f"{shorten(e.instance, 60)} breaks the {e.validator!s} rule"
        if len(text) > MAX_MESSAGE:
            text = text[: MAX_MESSAGE - 1] + "…"
    return text
