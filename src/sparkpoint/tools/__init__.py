"""Operator tools behind the CLI, usable from Python: streams, checkpoints and state."""
