"""Tables as systems: Delta Lake (:mod:`.delta`), Apache Iceberg (:mod:`.iceberg`) and
PostgreSQL (:mod:`.postgres`), each stream of such a system a table, written by both APIs
(a task's message is a row, a dict of column values; a DataFrame output is written as Arrow
batches), exactly-once under ``job.processing.guarantee: exactly-once``.

Owns writing rows to tables and the staging of a table's exactly-once output; imports the
config declarations, errors, failpoints, file helpers, the model and the system interfaces.
Each kind's library (deltalake, pyiceberg, psycopg) is imported only when that kind is used:
``pip install 'sparkpoint[tables]'``.
"""
