"""Test support shipped with sparkpoint, for its own tests and for users' tests."""
