#!/usr/bin/env python3
"""bench/plot.py: the pictures of what `make bench` measures, as plain SVG (no library).

    python3 bench/plot.py out/bench      # reads the .tsv files bench/run.sh wrote there,
                                         # writes scaling.svg, gflops.svg and gpt_ops.svg

  scaling.tsv  strategy, ranks, speed-up over train.c (a median of ratios, one run)
  gflops.tsv   series, MFLOP per step, GFLOP/s, point label
  gpt_ops.tsv  width C, who (train.c or PyTorch), category, ms per step
  meta.tsv     cpu, date, cores, peak (one core, float32 FMA), exact_bound (the exact tile alone),
               load (the machine's load average: other work slows the wall clock)

Every picture names the CPU and the date it was measured on.
"""
import math
import os
import sys
from collections import OrderedDict, defaultdict
from xml.sax.saxutils import escape

FONT = "font-family='DejaVu Sans, Helvetica, Arial, sans-serif'"
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]


class Svg:
    def __init__(self, width, height):
        self.w, self.h, self.items = width, height, []

    def text(self, x, y, s, size=12, anchor="start", weight="normal", color="#222", rotate=None):
        rot = f" transform='rotate({rotate} {x:.1f} {y:.1f})'" if rotate is not None else ""
        self.items.append(f"<text x='{x:.1f}' y='{y:.1f}' font-size='{size}' text-anchor='{anchor}' "
                          f"font-weight='{weight}' fill='{color}' {FONT}{rot}>{escape(s)}</text>")

    def line(self, x1, y1, x2, y2, color="#222", width=1, dash=None):
        d = f" stroke-dasharray='{dash}'" if dash else ""
        self.items.append(f"<line x1='{x1:.1f}' y1='{y1:.1f}' x2='{x2:.1f}' y2='{y2:.1f}' stroke='{color}' "
                          f"stroke-width='{width}'{d}/>")

    def rect(self, x, y, w, h, fill, stroke="none", opacity=1.0):
        self.items.append(f"<rect x='{x:.1f}' y='{y:.1f}' width='{max(w, 0):.1f}' height='{max(h, 0):.1f}' "
                          f"fill='{fill}' stroke='{stroke}' fill-opacity='{opacity}'/>")

    def polyline(self, pts, color, width=2, dash=None):
        d = f" stroke-dasharray='{dash}'" if dash else ""
        p = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        self.items.append(f"<polyline points='{p}' fill='none' stroke='{color}' stroke-width='{width}'{d}/>")

    def circle(self, x, y, r, color):
        self.items.append(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='{r}' fill='{color}'/>")

    def write(self, path):
        with open(path, "w") as f:
            f.write(f"<svg xmlns='http://www.w3.org/2000/svg' width='{self.w}' height='{self.h}' "
                    f"viewBox='0 0 {self.w} {self.h}'>\n<rect width='100%' height='100%' fill='white'/>\n")
            f.write("\n".join(self.items))
            f.write("\n</svg>\n")


def read_tsv(path):
    with open(path) as f:
        return [line.rstrip("\n").split("\t") for line in f if line.strip() and not line.startswith("#")]


def nice_ticks(top, n=5):
    """ticks from 0 to at least top, at a round step"""
    raw = top / n
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(math.ceil(top / step)) + 1)]


def fmt(v):
    return f"{v:g}" if v >= 10 or v == int(v) else f"{v:.1f}"


def axes(svg, x0, y0, w, h, yticks, ymax, ylabel, ysuffix=""):
    """a frame with horizontal grid lines at yticks; returns y(value)"""
    def y(v):
        return y0 + h - h * v / ymax
    for t in yticks:
        svg.line(x0, y(t), x0 + w, y(t), "#ddd")
        svg.text(x0 - 6, y(t) + 4, fmt(t) + ysuffix, 11, "end", color="#555")
    svg.line(x0, y0 + h, x0 + w, y0 + h, "#444")
    svg.line(x0, y0, x0, y0 + h, "#444")
    svg.text(x0 - 42, y0 + h / 2, ylabel, 12, "middle", rotate=-90)
    return y


def footer(svg, meta, what):
    load = f", load average {meta['load']}" if meta.get("load") else ""
    svg.text(12, svg.h - 10, f"{what}; make bench on {meta['cores']} cores of {meta['cpu']}, {meta['date']}{load}",
             10.5, color="#666")


def label_column(svg, x, ends, size=11.5):
    """labels at the right end of lines, nudged apart so that they never overlap: (y, text, color)"""
    placed = []
    for y, s, c in sorted(ends):
        y = max(y, placed[-1] + size + 2) if placed else y
        placed.append(y)
        svg.text(x, y + 4, s, size, color=c, weight="bold")


def scaling(rows, meta, path):
    """speed-up and efficiency against ranks, a line per strategy"""
    cores = int(meta["cores"])
    data = OrderedDict()
    for strategy, ranks, speedup in rows:
        data.setdefault(strategy, []).append((int(ranks), float(speedup)))
    ranks = sorted({r for pts in data.values() for r, _ in pts})
    svg = Svg(1240, 470)
    svg.text(20, 28, "Which strategy scales: speed-up over train.c, and efficiency, against ranks", 17, weight="bold")
    svg.text(20, 48, f"ideal (dashed): as many times faster as the cores the ranks can use; more ranks than the "
                     f"{cores} cores (shaded) share them", 12, color="#444")
    panels = [("speed-up over train.c (x)", lambda r, s: s, lambda r: min(r, cores), ""),
              (f"efficiency: speed-up / cores used, min(ranks, {cores})", lambda r, s: 100 * s / min(r, cores),
               lambda r: 100, "%")]
    for k, (title, value, ideal, suffix) in enumerate(panels):
        x0, y0, w, h = 70 + k * 620, 80, 240, 320
        ymax = max(max(value(r, s) for pts in data.values() for r, s in pts), max(ideal(r) for r in ranks)) * 1.1
        ytick = nice_ticks(ymax, 5)
        ymax = ytick[-1]
        y = axes(svg, x0, y0, w, h, ytick, ymax, title, suffix)

        def x(r):
            i = ranks.index(r)
            return x0 + 20 + (w - 40) * i / max(1, len(ranks) - 1)
        over = [r for r in ranks if r > cores]
        if over:
            left = (x(max(r for r in ranks if r <= cores)) + x(min(over))) / 2
            svg.rect(left, y0, x0 + w - left, h, "#f0e6d2", opacity=0.7)
            svg.text((left + x0 + w) / 2, y0 + 14, "more ranks", 11, "middle", color="#7a5c1e")
            svg.text((left + x0 + w) / 2, y0 + 27, f"than {cores} cores", 11, "middle", color="#7a5c1e")
        for r in ranks:
            svg.text(x(r), y0 + h + 16, f"{r}" + (f" (on {cores} cores)" if r > cores else ""), 11, "middle")
        svg.text(x0 + w / 2, y0 + h + 34, "ranks", 12, "middle")
        svg.polyline([(x(r), y(ideal(r))) for r in ranks], "#888", 1.5, "5,4")
        ends = []
        for i, (strategy, pts) in enumerate(data.items()):
            c = PALETTE[i % len(PALETTE)]
            pts = sorted(pts)
            svg.polyline([(x(r), y(value(r, s))) for r, s in pts], c, 2.5)
            for r, s in pts:
                svg.circle(x(r), y(value(r, s)), 3.5, c)
            shown = [(r, s) for r, s in pts if r >= min(cores, pts[-1][0])][:2]  # at the cores' count, and beyond
            text = " / ".join(f"{value(r, s):.{0 if suffix else 2}f}{suffix or 'x'}" for r, s in shown)
            ends.append((y(value(*pts[-1])), f"{strategy}: {text}", c))
        svg.text(x0 + w + 8, min(e[0] for e in ends) - 14,
                 "at " + " / ".join(str(r) for r in ranks if r >= cores)[:12] + " ranks", 11, color="#444")
        label_column(svg, x0 + w + 8, ends, 11)
    footer(svg, meta, "speed-ups are medians of ratios to train.c's time in the same run")
    svg.write(path)


def gflops(rows, meta, path):
    """GFLOP/s against the work of a step, train.c beside PyTorch, under the core's peak"""
    series = OrderedDict()
    for name, mflop, g, label in rows:
        series.setdefault(name, []).append((float(mflop), float(g), label))
    peak, bound = float(meta["peak"]), float(meta.get("exact_bound", 0) or 0)
    svg = Svg(1000, 480)
    svg.text(20, 28, "How close to the core's peak: GFLOP/s against the work of a training step, one core", 17,
             weight="bold")
    svg.text(20, 48, "train.c (solid) beside PyTorch (dashed) on the same models; the MLP at --emb 64 --batch 256 and "
                     "hidden 64 to 2048, the GPT at widths C 64 to 256", 12, color="#444")
    x0, y0, w, h = 80, 80, 640, 330
    ytick = nice_ticks(peak * 1.08, 6)
    y = axes(svg, x0, y0, w, h, ytick, ytick[-1], "GFLOP/s")
    lo = min(m for pts in series.values() for m, _, _ in pts) / 1.5
    hi = max(m for pts in series.values() for m, _, _ in pts) * 1.5

    def x(m):
        return x0 + w * (math.log10(m) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
    for d in range(int(math.floor(math.log10(lo))), int(math.ceil(math.log10(hi))) + 1):
        for m in (1, 2, 5):
            v = m * 10 ** d
            if lo <= v <= hi:
                svg.line(x(v), y0, x(v), y0 + h, "#eee")
                svg.text(x(v), y0 + h + 16, f"{v:g}", 11, "middle", color="#555")
    svg.text(x0 + w / 2, y0 + h + 36, "MFLOP per training step (log scale)", 12, "middle")
    svg.line(x0, y(peak), x0 + w, y(peak), "#000", 1.5, "8,4")
    svg.text(x0 + 6, y(peak) - 6, f"one core's peak, float32 fused multiply-adds: {peak:.0f} GFLOP/s", 11.5)
    if bound:
        svg.line(x0, y(bound), x0 + w, y(bound), "#555", 1.2, "3,3")
        svg.text(x0 + 6, y(bound) - 6, f"the exact tile alone, operands in cache: {bound:.0f} GFLOP/s", 11.5, color="#444")
    ends = []
    for i, (name, pts) in enumerate(series.items()):
        c = PALETTE[(i // 2) % len(PALETTE)]
        pts = sorted(pts)
        svg.polyline([(x(m), y(g)) for m, g, _ in pts], c, 2.5, None if "train.c" in name else "7,4")
        for m, g, label in pts:
            svg.circle(x(m), y(g), 3.5, c)
            if "train.c" in name:
                svg.text(x(m), y(g) - 8, label, 10, "middle", color=c)
        ends.append((y(pts[-1][1]), f"{name}: {pts[-1][1]:.0f}", c))
    label_column(svg, x0 + w + 10, ends)
    footer(svg, meta, "GFLOP/s count 6 x (weights of the matrix products, plus attention's) x tokens per step")
    svg.write(path)


CATEGORY_COLOR = OrderedDict([
    ("products, exact", "#08519c"), ("products, float", "#6baed6"), ("products", "#3182bd"),
    ("attention", "#e6550d"), ("GELU", "#31a354"), ("LayerNorm", "#756bb1"), ("loss", "#8c6d31"),
    ("embedding", "#969696"), ("residuals and copies", "#e377c2"), ("optimizer", "#bcbd22"),
    ("framework", "#d9d9d9"),
])


def gpt_ops(rows, meta, path):
    """the GPT's step split by op: a pair of stacked bars (train.c, PyTorch) per width"""
    ms = defaultdict(lambda: defaultdict(float))
    widths, whos = [], []
    for c, who, cat, v in rows:
        ms[(int(c), who)][cat] += float(v)
        widths += [int(c)] if int(c) not in widths else []
        whos += [who] if who not in whos else []
    cats = [c for c in CATEGORY_COLOR if any(c in m for m in ms.values())]
    cats += sorted({c for m in ms.values() for c in m} - set(cats))
    colors = {c: CATEGORY_COLOR.get(c, PALETTE[i % len(PALETTE)]) for i, c in enumerate(cats)}
    bar, gap, top = 26, 30, 112
    svg = Svg(1000, top + len(widths) * (len(whos) * (bar + 6) + gap) + 40)
    svg.text(20, 28, "Where the GPT's step goes: time per op, train.c beside PyTorch (one core, CPU time)", 17,
             weight="bold")
    svg.text(20, 48, "makemore's GPT (4 blocks, 4 heads, 16 positions, 32 names a step) at three widths C; "
                     "each width on its own scale", 12, color="#444")
    lx, ly = 20, 72
    for c in cats:  # the legend, in rows
        if lx + 24 + 6.6 * len(c) > 980:
            lx, ly = 20, ly + 18
        svg.rect(lx, ly - 10, 12, 12, colors[c])
        svg.text(lx + 16, ly, c, 11.5)
        lx += 30 + 6.6 * len(c)
    y = top
    for C in widths:
        total = {who: sum(ms[(C, who)].values()) for who in whos}
        scale = 690 / max(total.values())
        svg.text(20, y + 4, f"C = {C}", 13, weight="bold")
        if len(whos) == 2 and all(total.values()):
            a, b = whos
            r = total[a] / total[b]
            svg.text(90, y + 4, f"{a} {'slower' if r > 1 else 'faster'} than {b}: {max(r, 1 / r):.2f}x", 12,
                     color="#444")
        for who in whos:
            y += 6
            svg.text(150, y + bar / 2 + 4, who, 12, "end")
            x = 160
            for c in cats:
                v = ms[(C, who)].get(c, 0.0)
                if v <= 0:
                    continue
                svg.rect(x, y, v * scale, bar, colors[c], "white")
                if v * scale > 34:
                    dark = c in ("products, exact", "products", "attention", "LayerNorm", "loss")
                    svg.text(x + v * scale / 2, y + bar / 2 + 4, f"{v:.1f}", 10.5, "middle",
                             color="white" if dark else "#222")
                x += v * scale
            svg.text(x + 6, y + bar / 2 + 4, f"{total[who]:.1f} ms", 12, weight="bold")
            y += bar
        y += gap
    footer(svg, meta, "ms in this thread's CPU time, medians over steps; bench/bench ops and bench/torch_step.py --profile")
    svg.write(path)


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "out/bench"
    meta = {k: v for k, v in read_tsv(os.path.join(d, "meta.tsv"))}
    made = []
    for name, draw in (("scaling", scaling), ("gflops", gflops), ("gpt_ops", gpt_ops)):
        src = os.path.join(d, name + ".tsv")
        if os.path.exists(src) and read_tsv(src):
            draw(read_tsv(src), meta, os.path.join(d, name + ".svg"))
            made.append(os.path.join(d, name + ".svg"))
    print("wrote " + ", ".join(made) if made else "no data to draw in " + d)


if __name__ == "__main__":
    main()
