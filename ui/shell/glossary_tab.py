"""The Glossary tab: every metric with the events it starts and ends at (glossary.py), and every setting
of a pane from its declaration (what it does, the metric it moves, who honours it)."""

from __future__ import annotations

import html

import gradio as gr

from engine.core.toggles import Toggle

from . import glossary


def metrics_html() -> str:
    rows = "".join(
        f"<tr><td><code>{html.escape(m.name)}</code></td><td>{html.escape(m.label)}</td><td>{html.escape(m.unit)}</td>"
        f"<td>{html.escape(m.start or '—')}</td><td>{html.escape(m.end)}</td><td>{html.escape(m.clock)}</td></tr>"
        for m in glossary.METRICS.values())
    return ('<table class="lab-table lab-glossary"><thead><tr><th>name</th><th>shown as</th><th>unit</th>'
            f"<th>start event</th><th>end event</th><th>clock</th></tr></thead><tbody>{rows}</tbody></table>")


def settings_html(declared: tuple[Toggle, ...]) -> str:
    """Every setting of a pane, from its declaration: what it does and the metric it moves."""
    rows = "".join(
        f"<tr><td><code>{html.escape(t.name)}</code></td><td>{html.escape(t.label)}</td>"
        f"<td>{html.escape(str(t.default))}</td><td>{html.escape(t.help)}</td>"
        f"<td>{'<code>' + html.escape(t.glossary) + '</code>' if t.glossary else '—'}</td>"
        f"<td>{html.escape(', '.join(t.backends))}</td></tr>"
        for t in declared)
    return ('<table class="lab-table lab-glossary"><thead><tr><th>setting</th><th>control</th><th>default</th>'
            f"<th>what it does</th><th>moves</th><th>honoured by</th></tr></thead><tbody>{rows}</tbody></table>")


def build(declared: tuple[Toggle, ...]) -> None:
    """The tab (inside a gr.Tab); `declared`: a pane's settings, the engine's toggles and the page's own."""
    gr.Markdown("Every number on the page, with the events it starts and ends at. Hover a number "
                "anywhere to see its definition.")
    gr.HTML(metrics_html())
    gr.Markdown("### Settings\nEach pane's settings, as declared once in the code (`engine/core/config.py`, "
                "`ui/chat/settings.py`). *Network* is simulated on the page's own transport; the server's "
                "figures stay the engine's.")
    gr.HTML(settings_html(declared))
