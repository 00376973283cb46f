"""bench/scale.py's plot, an SVG written by hand (the harness venv has no plotting library): two panels, the CPU time
of each part of the audit against the tenants and against the turns, with the audit's own cost (harness and
mitmdump) and a dashed line where it would be if it grew from the first point in proportion to the bytes the proxy
inspected."""

from __future__ import annotations

from html import escape
from typing import Any

WIDTH, HEIGHT = 380, 344  # one panel
LEFT, RIGHT, TOP, BOTTOM = 52, 16, 118, 40  # the legend above the plot
#: (key or keys summed, label, colour, dashed)
SERIES = ((("hermes_cpu",), "Hermes", "#999999", False),
          (("harness_cpu",), "harness", "#1f77b4", False),
          (("judge_cpu",), "of the harness: reconcile and verdict", "#9467bd", False),
          (("mitmdump_cpu",), "mitmdump", "#ff7f0e", False),
          (("harness_cpu", "mitmdump_cpu"), "audit (harness + mitmdump)", "#d62728", False))


def _ticks(top: float) -> list[float]:
    """About five round steps from 0 to at least `top`."""
    raw = max(top, 1e-9) / 5
    step = next(m * 10 ** e for e in range(-3, 6) for m in (1, 2, 5) if m * 10 ** e >= raw)
    return [step * i for i in range(int(top / step) + 2)]


def _panel(rows: list[dict[str, Any]], by: str, x0: int) -> list[str]:
    xs = [r[by] for r in rows]
    values = {label: [sum(r[k] for k in keys) for r in rows] for keys, label, _, _ in SERIES}
    own = values["audit (harness + mitmdump)"]
    linear = [own[0] * r["mb"] / rows[0]["mb"] for r in rows]
    ticks = _ticks(max(max(v) for v in [*values.values(), linear]))
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    lo, hi = min(xs), max(xs)

    def px(x: float) -> float:
        return x0 + LEFT + (w * (x - lo) / (hi - lo) if hi > lo else w / 2)

    def py(y: float) -> float:
        return TOP + h - h * y / ticks[-1]

    out = [f'<text x="{x0 + WIDTH / 2}" y="18" text-anchor="middle" font-weight="bold">CPU seconds against {by}</text>',
           f'<line x1="{px(lo)}" y1="{py(0)}" x2="{px(hi)}" y2="{py(0)}" stroke="black"/>',
           f'<line x1="{x0 + LEFT}" y1="{py(0)}" x2="{x0 + LEFT}" y2="{TOP}" stroke="black"/>']
    for t in ticks:
        out.append(f'<text x="{x0 + LEFT - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{t:g}</text>'
                   f'<line x1="{x0 + LEFT}" y1="{py(t):.1f}" x2="{x0 + WIDTH - RIGHT}" y2="{py(t):.1f}" '
                   'stroke="#eeeeee"/>')
    for x in xs:
        out.append(f'<text x="{px(x):.1f}" y="{py(0) + 16}" text-anchor="middle">{x}</text>')
    out.append(f'<text x="{x0 + LEFT + w / 2}" y="{HEIGHT - 6}" text-anchor="middle">{by}</text>')
    lines = [(v, label, colour, dashed) for (_, label, colour, dashed), v in zip(SERIES, values.values(), strict=True)]
    lines.append((linear, "audit, in proportion to the bytes inspected", "#d62728", True))
    for n, (v, label, colour, dashed) in enumerate(lines):
        at = [(px(x), py(y)) for x, y in zip(xs, v, strict=True)]
        dash = ' stroke-dasharray="5,4"' if dashed else ""
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in at)
        out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        if not dashed:
            out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"/>' for x, y in at]
        legend_y = 34 + 14 * n
        out.append(f'<line x1="{x0 + LEFT + 8}" y1="{legend_y}" x2="{x0 + LEFT + 26}" y2="{legend_y}" '
                   f'stroke="{colour}" stroke-width="2"{dash}/><text x="{x0 + LEFT + 30}" y="{legend_y + 4}">'
                   f"{escape(label)}</text>")
    return out


def plot(by_tenants: list[dict[str, Any]], by_turns: list[dict[str, Any]]) -> str:
    """The SVG of both panels."""
    body = _panel(by_tenants, "tenants", 0) + _panel(by_turns, "turns", WIDTH)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * WIDTH}" height="{HEIGHT}" '
            f'font-family="sans-serif" font-size="11">\n<rect width="100%" height="100%" fill="white"/>\n'
            + "\n".join(body) + "\n</svg>\n")
