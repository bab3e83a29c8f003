"""The configuration reference, generated from sparkpoint's key registry: committed in
docs/configuration.md between ``<!-- config-keys -->`` and ``<!-- /config-keys -->`` (so it
reads on its own, outside the built site), regenerated there by
``python docs/hooks/config_reference.py --write``, and, as an mkdocs hook, rebuilt at build
time, so the site never drifts from the code (a test holds the committed copy to it too)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- config-keys -->", "<!-- /config-keys -->"
PAGE = Path(__file__).resolve().parents[1] / "configuration.md"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def reference() -> str:
    from sparkpoint.config import KEYS, plugin_keys

    plugins = plugin_keys()
    sections: dict[str, list[str]] = {}
    for spec in (*KEYS, *plugins):
        section = spec.pattern.split(".", 1)[0]
        default = "" if spec.default is None else f"`{spec.default}`"
        row = (
            f"| `{_cell(spec.pattern).replace('&lt;', '<').replace('&gt;', '>')}` | {default} "
            f"| {_cell(spec.allowed)} | {_cell(spec.help)} |"
        )
        sections.setdefault(section, []).append(row)
    out = []
    for section, rows in sections.items():
        out += [f"## `{section}.*`", "", "| key | default | allowed | what |", "|---|---|---|---|"]
        out += [*rows, ""]
    return "\n".join(out)


def render(markdown: str) -> str:
    """``markdown`` with the reference between the markers made current."""
    if BEGIN not in markdown:
        return markdown
    head, rest = markdown.split(BEGIN, 1)
    tail = rest.split(END, 1)[1] if END in rest else "\n"
    return f"{head}{BEGIN}\n\n{reference()}\n{END}{tail}"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return render(markdown)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python docs/hooks/config_reference.py --write")
    PAGE.write_text(render(PAGE.read_text()))
    print(f"wrote the configuration reference into {PAGE}")
