#!/usr/bin/env sh
# Install sparkpoint from this source tree into a new virtual env: the Dockerfile's install step,
# also run by tests/e2e/test_install.py (so what the image installs is tested without Docker).
#
# usage: docker/install.sh VENV [EXTRAS]      (EXTRAS: e.g. kafka,s3,azure; PYTHON: python3)
set -eu
venv=$1
extras=${2:-}
src=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
dist=$(mktemp -d)
"$python" -m venv "$venv"
"$venv/bin/python" -m pip wheel -q --no-deps -w "$dist" "$src"
wheel=$(ls "$dist"/sparkpoint-*.whl)
if [ -n "$extras" ]; then
  "$venv/bin/python" -m pip install -q "$wheel[$extras]"
else
  "$venv/bin/python" -m pip install -q "$wheel"
fi
rm -rf "$dist"
