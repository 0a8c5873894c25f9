#!/usr/bin/env bash
# The static checks CI runs before pytest: ruff (lint) and mypy (types), both configured in pyproject.toml.
# Prints each tool's findings as file:line: code message; exits 1 if either found something.
# Usage: scripts/lint.sh (from anywhere; uses .venv when present, else the python on PATH).
set -uo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
[ -x "$py" ] || py=python3
failed=()
echo "-- ruff check (rules: [tool.ruff] in pyproject.toml)"
"$py" -m ruff check --output-format concise . || failed+=(ruff)
echo "-- mypy (strict for allocator/, --check-untyped-defs for plugin/ and the test kit: [tool.mypy])"
"$py" -m mypy || failed+=(mypy)
if [ ${#failed[@]} -gt 0 ]; then
  echo "static checks FAILED: ${failed[*]} (findings above; fix them or, where a finding is wrong, add a noqa /" \
       "type: ignore with its code and the reason on the line)"
  exit 1
fi
echo "static checks passed"
