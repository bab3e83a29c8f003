#!/usr/bin/env bash
# Runs pytest in .venv; "no tests ran" (exit 5) is a failure, like any other.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$PWD/.venv/bin/python"
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then echo "pytest: no tests ran - treated as a failure" >&2; exit 1; fi
exit "$rc"
