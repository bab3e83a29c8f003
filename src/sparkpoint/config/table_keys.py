"""The declared keys of a table's stream (:mod:`sparkpoint.system.tables`): how its rows land
and how its schema may change. A table system's own keys (``systems.<s>.delta.path`` and the
like) are declared by its factory. Imports the key declarations only."""

from __future__ import annotations

from sparkpoint.config.key_spec import ConfigKey, int_at_least, one_of

TABLE_KEYS = (
    ConfigKey(
        "streams.<s>.table.mode",
        "append",
        "append | upsert",
        "a table's rows: appended, or upserted by streams.<s>.table.key (a row replaces the "
        "one with its key; in one batch the last row of a key wins)",
        one_of("append", "upsert"),
    ),
    ConfigKey(
        "streams.<s>.table.key",
        None,
        "col[,col]",
        "the columns that identify a row of an upserted table (its primary key)",
    ),
    ConfigKey(
        "streams.<s>.table.schema.evolution",
        "none",
        "none | add-columns",
        "whether a batch with a column its table lacks adds it to the table (add-columns) or "
        "is refused (none); a changed column type is always refused",
        one_of("none", "add-columns"),
    ),
    ConfigKey(
        "streams.<s>.table.partition.by",
        None,
        "col[,col]",
        "Delta and Iceberg: the columns a new table is partitioned by (identity partitions); "
        "systems.<s>.default.stream.table.partition.by sets it for every table of a system",
    ),
    ConfigKey(
        "tables.<s>.source",
        None,
        "<system>.<table or stream> | parquet:<directory>",
        "a global table every task reads whole (context.get_table / batch.table): a Delta, "
        "Iceberg or PostgreSQL table of a table system, a compacted stream (each key's newest "
        "value), or a directory of Parquet files",
    ),
    ConfigKey(
        "tables.<s>.key",
        None,
        "a column",
        "the column a task looks a global table's rows up by (context.get_table(t).get(key))",
    ),
    ConfigKey(
        "tables.<s>.query",
        None,
        "SQL",
        "a global table from a PostgreSQL system: the query whose rows it holds (default: the "
        "whole table the source names)",
    ),
    ConfigKey(
        "tables.<s>.refresh.ms",
        "60000",
        "an integer >= 0",
        "how often the driver checks a global table's source for a new version (0: read once, "
        "at the job's start); a new version is seen from the next commit on",
        int_at_least(0),
    ),
)
