"""The page catalogue: the Delta table ``pages`` the example joins every view with (a global
table). Another team's table in real life; here written with deltalake, as they would."""

from __future__ import annotations

from pathlib import Path

PAGES = [
    ("/", "Home", "marketing"),
    ("/pricing", "Pricing", "marketing"),
    ("/docs", "Documentation", "product"),
    ("/blog", "Blog", "marketing"),
    ("/signup", "Sign up", "funnel"),
    ("/login", "Log in", "funnel"),
    ("/about", "About us", "company"),
]


def write_catalogue(path: Path, pages: list[tuple[str, str, str]] = PAGES) -> None:
    """(Over)write the catalogue at ``path``: one Delta version."""
    import pyarrow as pa
    from deltalake import write_deltalake

    rows = pa.table({k: [p[i] for p in pages] for i, k in enumerate(("page", "title", "section"))})
    write_deltalake(str(path), rows, mode="overwrite")
