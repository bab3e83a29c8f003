"""Task-local state: key-value stores and (later) the state backends that back them up."""
