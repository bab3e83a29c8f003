"""The declared keys of a table's stream (:mod:`sparkpoint.system.tables`): how its rows land
and how its schema may change. A table system's own keys (``systems.<s>.delta.path`` and the
like) are declared by its factory. Imports the key declarations only."""

from __future__ import annotations

from sparkpoint.config.key_spec import ConfigKey, one_of

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
)
