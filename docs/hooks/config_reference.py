"""mkdocs hook: the configuration reference, generated from sparkpoint's key registry at build
time (``<!-- config-keys -->`` in configuration.md), so it never drifts from the code."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- config-keys -->"


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


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, reference())
    return markdown
