"""The task API: what a user's task implements and what it is given, as Kafka's
``processor/api`` is apart from its ``internals``.

Owns ``StreamTask`` and the protocols of what its methods receive (:mod:`.task`): the context,
collector and coordinator, the timers (``context.timers``) and window stores and joins
(``context.windows``). The implementations are the executor runtime's
(:mod:`sparkpoint.runtime.executor`); ``tests/test_architecture.py`` holds that this package
imports none of them.

May import every package below the runtime; no runtime package (imports under
``TYPE_CHECKING`` aside), nor pyspark.
"""
