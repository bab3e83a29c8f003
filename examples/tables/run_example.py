"""Run the tables example: start a throwaway PostgreSQL (the OS package's server, on loopback;
point ``SPARKPOINT_POSTGRES_DSN`` at a database of yours instead), write the page catalogue as
a Delta table and 20,000 page views, run the job to the end of its input (every view into
Delta and Iceberg with its page's title, each user's count upserted into PostgreSQL,
exactly-once); then rename a page in the catalogue, write more views and run again: the new
views carry the new title. Each table is read back with its own library. ``--api dataframe``
runs the DataFrame pipeline (``tables_pipeline.py``) instead of the task (``tables_task.py``).
Each step is a plain command, printed before it runs. Data goes to ``.sparkpoint/tables`` next
to the job file (removed first)."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = HERE / "job.yaml"
BIN = Path(sys.executable).parent
DATA = HERE / ".sparkpoint" / "tables"
GENERATE = HERE.parent / "pageviews" / "generate.py"

sys.path.insert(0, str(HERE))
from catalogue import PAGES, write_catalogue  # noqa: E402


def step(*args: str) -> str:
    print(f"\n$ {shlex.join(args)}", flush=True)
    return subprocess.run(args, check=True, stdout=subprocess.PIPE, text=True).stdout


def show(dsn: str) -> Counter[str]:
    """Each table read back by its own library; the titles of the views in Delta."""
    import psycopg
    from deltalake import DeltaTable
    from pyiceberg.catalog import load_catalog

    views = DeltaTable(str(DATA / "tables" / "lake" / "views")).to_pyarrow_table()
    catalog = load_catalog(
        "ice",
        type="sql",
        uri=f"sqlite:///{DATA / 'iceberg' / 'catalog.db'}",
        warehouse=(DATA / "iceberg" / "warehouse").as_uri(),
    )
    iceberg = catalog.load_table(("tables", "views")).scan().to_arrow()
    with psycopg.connect(dsn) as conn:
        counts = dict(conn.execute('SELECT "user", views FROM user_counts').fetchall())
    print(
        f"Delta lake.views: {views.num_rows} rows; Iceberg tables.views: {iceberg.num_rows} "
        f"rows; PostgreSQL user_counts: {len(counts)} users, {sum(counts.values())} views"
    )
    busiest = sorted(counts.items(), key=lambda kv: -kv[1])[:3]
    print("the busiest 3: " + ", ".join(f"{u} {c}" for u, c in busiest))
    if not views.num_rows == iceberg.num_rows == sum(counts.values()):
        sys.exit("the tables disagree")
    return Counter(t for t in views.column("title").to_pylist() if t)


def run(dsn: str, api: str) -> None:
    if DATA.exists():
        shutil.rmtree(DATA)
    sp = str(BIN / "sparkpoint")
    job = str(JOB) if api == "task" else "tables_pipeline:job"
    sets = ["--set", f"systems.pg.postgres.dsn={dsn}"]
    cwd = os.getcwd()
    os.chdir(HERE)  # the pipeline's module is found from here
    try:
        write_catalogue(DATA / "tables" / "lake" / "pages")
        print(f"the page catalogue: a Delta table of {len(PAGES)} pages")
        step(sp, "stream", "create", str(JOB), "pageviews", "--partitions", "4", *sets)
        step(sys.executable, str(GENERATE), str(JOB), "20000")
        step(sp, "run", job, "--until-caught-up", *sets)
        before = show(dsn)
        renamed = [(p, "Plans and pricing" if p == "/pricing" else t, s) for p, t, s in PAGES]
        write_catalogue(DATA / "tables" / "lake" / "pages", renamed)
        print("\nthe catalogue's /pricing page is renamed 'Plans and pricing' (a new version)")
        step(sys.executable, str(GENERATE), str(JOB), "5000", "--seed", "2")
        step(sp, "run", job, "--until-caught-up", *sets)
        after = show(dsn)
        print(f"views titled 'Plans and pricing': {after['Plans and pricing']} (new views only)")
        if before["Plans and pricing"] or not after["Plans and pricing"]:
            sys.exit("the renamed page's title is not where it should be")
    finally:
        os.chdir(cwd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", choices=["task", "dataframe"], default="task")
    args = parser.parse_args()
    dsn = os.environ.get("SPARKPOINT_POSTGRES_DSN")
    if dsn:
        run(dsn, args.api)
        return
    from sparkpoint.testing.services import PostgresServer

    with PostgresServer(Path(tempfile.mkdtemp(prefix="sparkpoint-example-pg-"))) as server:
        dsn = server.new_database("tables_example")
        print(f"a PostgreSQL for the example on {dsn}")
        run(dsn, args.api)


if __name__ == "__main__":
    main()
