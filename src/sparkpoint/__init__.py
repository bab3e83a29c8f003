"""sparkpoint: stateful stream processing on Spark with Samza's state and checkpoint model."""

from __future__ import annotations

__version__ = "0.1.0"
