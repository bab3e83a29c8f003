# The targets here are exactly what CI runs (.ci/run calls `make test`).
.PHONY: setup example example-windows example-rekey example-avro test docs test-fast lint typecheck soak bench bench-commit bench-blobstore bench-filelog bench-dataframe bench-changelog bench-affinity bench-kafka bench-loop bench-ttl bench-timers bench-windows bench-exactly-once bench-rekey bench-reshard bench-scale bench-standby bench-long bench-peers bench-schemas bench-tables example-tables clean

# .venv with sparkpoint and its test tools ([dev] extra, Azurite via npm)
setup:
	@scripts/bootstrap.sh dev

# the example needs only what `pip install sparkpoint` brings (no test tools, no npm)
example:
	@scripts/bootstrap.sh run
	@.venv/bin/python examples/pageviews/run_example.py

# the windows example: per-user minute counts and sessions (examples/windows)
example-windows:
	@scripts/bootstrap.sh run
	@.venv/bin/python examples/windows/run_example.py

# re-keying: views partitioned by page, counted per user through an intermediate stream
example-rekey:
	@scripts/bootstrap.sh run
	@.venv/bin/python examples/rekey/run_example.py

# Avro through a Schema Registry: views in Avro, counted per user, the counts out in Avro
example-avro:
	@scripts/bootstrap.sh schemas
	@.venv/bin/python examples/avro/run_example.py

# Delta, Iceberg and PostgreSQL tables, and a global table (starts a throwaway PostgreSQL)
example-tables:
	@scripts/bootstrap.sh tables
	@.venv/bin/python examples/tables/run_example.py

# lint + types + every test suite (slow and cluster suites included); fails on no tests.
test: setup
	@.venv/bin/ruff check src tests examples bench soak docs/hooks
	@.venv/bin/ruff format --check src tests examples bench soak docs/hooks
	@.venv/bin/mypy
	@NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet
	@scripts/pytest.sh tests examples -n 3 --durations=15

test-fast: setup
	@scripts/pytest.sh tests examples -n 3 -m "not slow"

lint: setup
	@.venv/bin/ruff check src tests examples bench soak docs/hooks && .venv/bin/ruff format --check src tests examples bench soak docs/hooks

# the documentation site (docs/, mkdocs.yml) into build/site; warnings are errors. Only the
# docs tools are installed (.venv-docs): no Java, Spark or test services
docs:
	@scripts/bootstrap.sh docs
	@NO_MKDOCS_2_WARNING=1 .venv-docs/bin/mkdocs build --strict

typecheck: setup
	@.venv/bin/mypy

# 100 SIGKILLs over the example job, a dual-commit job with a flaky blob store (also on a
# standalone cluster), a job with time in its state, the windows example and the example with
# exactly-once output; prints kills=K mismatches=M lost=L duplicates=D dangling=X
soak: setup
	@.venv/bin/python soak/soak.py --kills $${KILLS:-100} --variants example,dual,cluster,time,windows,windows-df,exactly,joins

bench: setup
	@.venv/bin/python bench/run.py

# the page-view count with Avro input and output through a Schema Registry against JSON, both APIs;
# then the avro serde against Quix Streams' Avro serializer (its own venv under bench/out/venvs)
bench-schemas: setup
	@.venv/bin/python bench/schemas.py

bench-tables: setup
	@.venv/bin/python bench/tables.py

bench-commit: setup
	@.venv/bin/python bench/commit.py

bench-blobstore: setup
	@.venv/bin/python bench/blobstore.py

bench-filelog: setup
	@.venv/bin/python bench/filelog.py

bench-dataframe: setup
	@.venv/bin/python bench/dataframe.py

bench-changelog: setup
	@.venv/bin/python bench/changelog_compaction.py

bench-affinity: setup
	@.venv/bin/python bench/host_affinity.py

bench-kafka: setup
	@.venv/bin/python bench/kafka.py

bench-loop: setup
	@.venv/bin/python bench/tight_loop.py

bench-ttl: setup
	@.venv/bin/python bench/ttl.py

bench-timers: setup
	@.venv/bin/python bench/timers.py

# minute counts and sessions on 1M views: both APIs, Spark SS, Bytewax and PyFlink (the peers
# installed into bench/out/venvs on first use), every window checked
bench-windows: setup
	@.venv/bin/python bench/windows.py

# the example with exactly-once output vs at-least-once, side by side (target >= 0.8x)
bench-exactly-once: setup
	@.venv/bin/python bench/exactly_once.py

# counting per user through a re-key vs on input already partitioned by user (target >= 0.5x)
bench-rekey: setup
	@.venv/bin/python bench/rekey.py

bench-reshard: setup
	@.venv/bin/python bench/reshard.py

# 4, 16, 64 and 256 tasks on the same 1M views, local[2] and a 2-worker cluster (target: 256 at
# >= 0.8x of 4); then one task's state of 100 MB, 1 GB and 5 GB: commit pause, uploads, restores
# from each backend vs a copy, standby promotion (needs about 35 GB free under $TMPDIR)
bench-scale: setup
	@.venv/bin/python bench/scale.py --plot bench/out/scale.png
	@.venv/bin/python bench/state_size.py --plot bench/out/state-size.png

# a 1 GB task brought back after a lost executor: standby promotion vs changelog restore
bench-standby: setup
	@.venv/bin/python bench/standby.py

# 30 minutes of the example on a steady feed (not in CI): RSS, open files and disk every minute
bench-long: setup
	@.venv/bin/python bench/long.py

# sparkpoint vs Spark Structured Streaming, PyFlink, Bytewax and Quix Streams (each installed into
# its own venv under bench/out/venvs): throughput, recovery, checkpoint cost; about 40 minutes
bench-peers: setup
	@.venv/bin/python bench/peers/run.py

clean:
	rm -rf .venv .venv-docs .venv-docs.log .sparkpoint .mypy_cache .ruff_cache .pytest_cache
