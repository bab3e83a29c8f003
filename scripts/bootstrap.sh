#!/usr/bin/env bash
# Creates .venv with sparkpoint, once; re-runs only when pyproject.toml changes or more is needed.
#   scripts/bootstrap.sh run   what a job needs: `pip install sparkpoint` (make example)
#   scripts/bootstrap.sh schemas  that and the [schemas] extra (make example-avro)
#   scripts/bootstrap.sh tables  that and the [tables] extra, and PostgreSQL (make example-tables)
#   scripts/bootstrap.sh dev   that, the [dev] extra, Azurite (npm) and PostgreSQL for the tests
#   scripts/bootstrap.sh docs  .venv-docs with only what the docs build needs (make docs):
#                              mkdocs, and sparkpoint without its runtime dependencies
# Checks for Java 17+ (Spark needs it) and Python 3.11+, and says exactly what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-dev}
case "$mode" in run|schemas|tables|dev|docs) ;; *) echo "usage: $0 [run|schemas|tables|dev|docs]" >&2; exit 2 ;; esac

say() { printf 'bootstrap: %s\n' "$*" >&2; }

find_python() {
  for cand in "${PYTHON:-}" python3.13 python3.12 python3.11 python3; do
    [ -n "$cand" ] || continue
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      echo "$cand"; return 0
    fi
  done
  say "Python 3.11 or newer is required; none found on PATH."
  exit 3
}

if [ "$mode" = docs ]; then
  # the docs build imports sparkpoint.config (its config reference) and nothing that runs jobs:
  # no Java, Spark, Arrow or RocksDB; confluent-kafka for the Kafka system's declared keys
  stamp=.venv-docs/.sparkpoint-installed
  want=$(sha1sum pyproject.toml | cut -d' ' -f1)
  if [ -x .venv-docs/bin/mkdocs ] && [ "$(cat "$stamp" 2>/dev/null || true)" = "$want" ]; then
    exit 0
  fi
  PY=$(find_python)
  say "creating .venv-docs with $PY and installing the docs tools"
  [ -x .venv-docs/bin/python ] || "$PY" -m venv .venv-docs
  if ! { .venv-docs/bin/python -m pip install -q --no-deps -e . &&
         .venv-docs/bin/python -m pip install -q pyyaml orjson 'mkdocs>=1.6' 'mkdocs-material>=9.5' 'confluent-kafka>=2.4' 'zlib-ng>=0.5'; } \
       >.venv-docs.log 2>&1; then
    tail -n 30 .venv-docs.log >&2; say "pip install failed (full log: .venv-docs.log)"; exit 4
  fi
  echo "$want" > "$stamp"
  say "ready: .venv-docs"
  exit 0
fi

if ! command -v java >/dev/null 2>&1; then
  say "Java 17 is required by Spark but 'java' is not on PATH."
  say "Install it (Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless) or set JAVA_HOME."
  exit 3
fi
java_major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
if [ -z "$java_major" ] || [ "$java_major" -lt 17 ]; then
  say "Java 17 or newer is required by Spark; found: $(java -version 2>&1 | head -n1)"
  exit 3
fi

PY=$(find_python)

stamp=.venv/.sparkpoint-installed
want=$(sha1sum pyproject.toml | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
# a dev install serves every mode, a schemas or tables install `run` too; a run install only `run`
if [ -x .venv/bin/python ] && { [ "$have" = "$want dev" ] || [ "$have" = "$want $mode" ] \
    || { [ "$mode" = run ] && { [ "$have" = "$want schemas" ] || [ "$have" = "$want tables" ]; }; }; }; then
  exit 0
fi
case "$mode" in
  dev) spec='.[dev]'; what="sparkpoint with its test tools" ;;
  schemas) spec='.[schemas]'; what="sparkpoint with its Schema Registry serdes" ;;
  tables) spec='.[tables]'; what="sparkpoint with its Delta, Iceberg and PostgreSQL tables" ;;
  *) spec='.'; what="sparkpoint" ;;
esac
say "creating .venv with $PY and installing $what (first run takes a minute or two)"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# Azurite (Azure Blob Storage emulator) for the blob store tests, from the npm registry: it
# installs beside pip's install and the JVM archive (waited for at the end)
npm_pid=""
if [ "$mode" = dev ] && [ ! -x .venv/node/node_modules/.bin/azurite-blob ]; then
  if command -v npm >/dev/null 2>&1; then
    say "installing azurite (npm) into .venv/node for the Azure blob store tests, meanwhile"
    npm install --silent --no-audit --no-fund --prefix .venv/node azurite@3 >.venv/npm.log 2>&1 &
    npm_pid=$!
  else
    say "npm not found: the Azure blob store tests need azurite (apt-get install -y npm)"
    exit 3
  fi
fi
# PostgreSQL's server (the OS package) for the table tests and example, meanwhile too
pg_pid=""
have_postgres() { command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }
if { [ "$mode" = dev ] || [ "$mode" = tables ]; } && ! have_postgres; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing PostgreSQL (apt-get) for the table tests and example, meanwhile"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; } \
      >.venv/apt.log 2>&1 &
    pg_pid=$!
  else
    say "PostgreSQL's server is needed for the table tests (Debian/Ubuntu: sudo apt-get install -y postgresql)"
    exit 3
  fi
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -m pip install -q -e "$spec" >.venv/install.log 2>&1; then
  grep -v "^WARNING: Location" .venv/install.log | tail -n 30 >&2
  say "pip install failed (full log: .venv/install.log)"; exit 4
fi
.venv/bin/python -c 'import sparkpoint, pyspark, rocksdict' || { say "installation failed"; exit 4; }
# a class-data-sharing archive of the Spark driver JVM: every Spark start is seconds faster
# (sparkpoint/runtime/spark/jvm_archive.py); only a speed-up, so a failure is reported, not fatal
say "archiving the Spark JVM's classes for faster starts (about 30 s, once)"
.venv/bin/python -m sparkpoint.runtime.spark.jvm_archive >.venv/jvm-archive.log 2>&1 \
  || { tail -n 5 .venv/jvm-archive.log >&2; say "warning: no JVM class archive; Spark starts slower"; }
if [ -n "$npm_pid" ] && ! wait "$npm_pid"; then
  tail -n 20 .venv/npm.log >&2; say "npm install azurite failed"; exit 4
fi
if [ -n "$pg_pid" ] && ! wait "$pg_pid"; then
  tail -n 20 .venv/apt.log >&2; say "apt-get install postgresql failed"; exit 4
fi
echo "$want $mode" > "$stamp"
say "ready: .venv ($mode; $(.venv/bin/python --version), pyspark $(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)'))"
