"""A line chart as an SVG document, written by our own small code (no
plotting library): for the figure of docs/scaling.md (bn_scaling.py --plot).

    svg = line_chart("title", "x label", "y label",
                     [Series("flat", [(1, 300), (2, 410)], "#c0392b")])
"""

import collections
import html

Series = collections.namedtuple("Series", "name points color dashed",
                                defaults=(False,))

WIDTH, HEIGHT = 640, 400
LEFT, RIGHT, TOP, BOTTOM = 70, 190, 40, 50


def _nice_step(span, ticks=5):
    raw = span / ticks
    mag = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def line_chart(title, xlabel, ylabel, series, xticks=None):
    """The SVG text of a chart of `series` (each a polyline with markers; a
    dashed one without). The y axis starts at 0."""
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x1 = x0 + 1
    step = _nice_step(max(ys))
    y1 = step * (int(max(ys) / step) + 1)
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x):
        return LEFT + (x - x0) / (x1 - x0) * pw

    def py(y):
        return TOP + ph - y / y1 * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
           f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{WIDTH / 2:.0f}" y="22" text-anchor="middle" '
           f'font-size="14">{html.escape(title)}</text>']
    y = 0.0
    while y <= y1 + 1e-9:
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{py(y):.1f}" '
                   f'y2="{py(y):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{py(y) + 4:.1f}" '
                   f'text-anchor="end">{y:g}</text>')
        y += step
    for x in (xticks or sorted(set(xs))):
        out.append(f'<text x="{px(x):.1f}" y="{TOP + ph + 18}" '
                   f'text-anchor="middle">{x:g}</text>')
    out.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + ph}" '
               'stroke="black"/>')
    out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{TOP + ph}" '
               f'y2="{TOP + ph}" stroke="black"/>')
    out.append(f'<text x="{LEFT + pw / 2:.0f}" y="{HEIGHT - 12}" '
               f'text-anchor="middle">{html.escape(xlabel)}</text>')
    out.append(f'<text x="16" y="{TOP + ph / 2:.0f}" text-anchor="middle" '
               f'transform="rotate(-90 16 {TOP + ph / 2:.0f})">'
               f'{html.escape(ylabel)}</text>')
    for i, s in enumerate(series):
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        out.append(f'<polyline points="{pts}" fill="none" stroke="{s.color}" '
                   f'stroke-width="2"{dash}/>')
        if not s.dashed:
            for x, y in s.points:
                out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" '
                           f'fill="{s.color}"/>')
        ly = TOP + 10 + 22 * i
        lx = LEFT + pw + 16
        out.append(f'<line x1="{lx}" x2="{lx + 24}" y1="{ly}" y2="{ly}" '
                   f'stroke="{s.color}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{lx + 30}" y="{ly + 4}">{html.escape(s.name)}'
                   '</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
