#!/usr/bin/env python3
"""tools/diverge.py: make diverge. How far layouts drift when gradient pieces add as floats.

For each --reduce (exact, fp32, bf16) it trains the same model as ./train --reduce HOW
(one piece a step: the whole batch's sum, rounded once), then as 2 and 4 microbatches
(./train --microbatches M) and on 2, 4 and 8 data-parallel ranks (train_dp), and compares
each run's training loss with that reference, step by step. It writes OUT/diverge.svg
(the loss difference against steps, a panel per reduction) and OUT/diverge.md (each run's
first differing step, final validation loss and names). docs/exactness.md explains both.

    python3 tools/diverge.py                 # 25,000 steps of the default MLP, as ./train (OUT=out)
    QUICK=1 python3 tools/diverge.py         # 2,000 steps (STEPS=N: N steps)
    python3 tools/diverge.py --model gpt --steps 1000   # any flags of train.c, appended
"""
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.environ.get("OUT", "out")
STEPS = os.environ.get("STEPS") or ("2000" if os.environ.get("QUICK") == "1" else "25000")
EXTRA = sys.argv[1:]
REDUCTIONS = ["exact", "fp32", "bf16"]
WINDOW = 50  # steps averaged in each point of the picture


def ranks(n):
    """How many of n ranks this machine's MPI should start (tools/mpirun --ranks)."""
    out = subprocess.run([os.path.join(ROOT, "tools/mpirun"), "--ranks", str(n)], capture_output=True, text=True)
    return int(out.stdout.strip() or n)


def layouts():
    yield "1 piece", []
    for m in (2, 4):
        yield f"{m} microbatches", ["--microbatches", str(m)]
    for n in sorted({ranks(2), ranks(4), ranks(8)} - {1}):
        yield f"{n} ranks", ["MPI", str(n)]


def run(name, how, args, work):
    log = os.path.join(work, f"{how}-{name.replace(' ', '_')}.csv")
    cmd = [os.path.join(ROOT, "train"), "--reduce", how]
    if args and args[0] == "MPI":
        cmd = [os.path.join(ROOT, "tools/mpirun"), "-n", args[1], os.path.join(ROOT, "train_dp"), "--reduce", how]
        args = []
    cmd += args + ["--steps", STEPS, "--eval-every", "0", "--samples", "5", "--log", log] + EXTRA
    if os.path.exists(log):
        os.remove(log)
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        sys.exit(f"tools/diverge.py: {' '.join(cmd)} failed:\n{out.stderr}")
    lines = out.stdout.splitlines()
    val = next(l.split()[2] for l in lines if l.startswith("validation loss"))
    names = lines[lines.index("names:") + 1:][:5]
    said = next((l for l in lines if l.startswith("--reduce")), "")
    losses = []
    with open(log) as f:
        next(f)
        for row in f:
            losses.append(float(row.split(",")[1]))
    return {"name": name, "losses": losses, "val": val, "names": names, "said": said}


def first_difference(a, b):
    return next((i + 1 for i, (x, y) in enumerate(zip(a, b)) if x != y), 0)


def svg(path, panels):
    """One panel per reduction: log10 of the mean |loss difference| over WINDOW steps."""
    W, H, left, top, gap = 300, 220, 60, 40, 30
    lo, hi = -10, 0  # 1e-10 .. 1, and 0 on the frame's bottom edge, a decade below 1e-10
    zero = lo - 1
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    width = left + len(panels) * (W + gap) + 250
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{top + H + 60}" '
         'font-family="sans-serif" font-size="11">',
         f'<text x="{left}" y="16" font-size="13">|training loss - the one-piece run\'s|, mean over '
         f'{WINDOW} steps (MLP unless flags say; {STEPS} steps)</text>']
    for p, (how, runs) in enumerate(panels):
        x0 = left + p * (W + gap)
        s.append(f'<rect x="{x0}" y="{top}" width="{W}" height="{H}" fill="none" stroke="#999"/>')
        s.append(f'<text x="{x0 + W / 2}" y="{top - 6}" text-anchor="middle" font-size="12">--reduce {how}</text>')
        for e in range(lo, hi + 1, 2):
            y = top + H - (e - zero) / (hi - zero) * H
            s.append(f'<line x1="{x0}" x2="{x0 + W}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
            if p == 0:
                s.append(f'<text x="{x0 - 4}" y="{y + 4:.1f}" text-anchor="end">1e{e}</text>')
        if p == 0:
            s.append(f'<text x="{x0 - 4}" y="{top + H + 4}" text-anchor="end">0</text>')
        n = len(runs[0]["losses"])
        for t in (0, n // 2, n):
            s.append(f'<text x="{x0 + t / max(n, 1) * W:.1f}" y="{top + H + 14}" text-anchor="middle">{t:,}</text>')
        s.append(f'<text x="{x0 + W / 2}" y="{top + H + 30}" text-anchor="middle">step</text>')
        ref = runs[0]["losses"]
        for k, r in enumerate(runs[1:]):
            pts = []
            n = min(len(ref), len(r["losses"]))
            for w0 in range(0, n, WINDOW):
                d = [abs(a - b) for a, b in zip(ref[w0:w0 + WINDOW], r["losses"][w0:w0 + WINDOW])]
                m = sum(d) / len(d)
                e = min(max(math.log10(m), lo), hi) if m > 0 else zero
                x = x0 + (w0 + len(d) / 2) / n * W
                y = top + H - (e - zero) / (hi - zero) * H
                pts.append(f"{x:.1f},{y:.1f}")
            s.append(f'<polyline fill="none" stroke="{colors[k % len(colors)]}" stroke-width="1.5" '
                     f'points="{" ".join(pts)}"/>')
    lx = left + len(panels) * (W + gap)
    for k, r in enumerate(panels[0][1][1:]):
        y = top + 14 + 30 * k
        s.append(f'<line x1="{lx}" x2="{lx + 20}" y1="{y - 4}" y2="{y - 4}" stroke="{colors[k]}" stroke-width="2"/>')
        s.append(f'<text x="{lx + 26}" y="{y}">{r["name"]}</text>')
        # a run with another's bits under every float reduction lies under that one's line
        twin = next((j for j in range(k) if all(runs[j + 1]["losses"] == runs[k + 1]["losses"]
                                                for how, runs in panels if how != "exact")), None)
        if twin is not None:
            s.append(f'<text x="{lx + 26}" y="{y + 12}" fill="#666">(the same bits as {panels[0][1][twin + 1]["name"]})</text>')
    s.append(f'<text x="{lx}" y="{top + H}">a line at 0: the same</text>')
    s.append(f'<text x="{lx}" y="{top + H + 14}">bits at every step</text>')
    s.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(s) + "\n")


def main():
    os.makedirs(OUT, exist_ok=True)
    work = os.path.join(OUT, "diverge")
    os.makedirs(work, exist_ok=True)
    panels = []
    for how in REDUCTIONS:
        runs = [run(name, how, args, work) for name, args in layouts()]
        panels.append((how, runs))
        print(f"--reduce {how}: {len(runs)} runs of {STEPS} steps done", flush=True)
    svg(os.path.join(OUT, "diverge.svg"), panels)
    md = ["| --reduce | layout | losses first differ at step | validation loss | names |", "| --- | --- | --- | --- | --- |"]
    for how, runs in panels:
        ref = runs[0]["losses"]
        for r in runs:
            d = first_difference(ref, r["losses"]) if r is not runs[0] else 0
            first = "never" if d == 0 else str(d)
            if r is runs[0]:
                first = "(the reference)"
            md.append(f"| {how} | {r['name']} | {first} | {r['val']} | {' '.join(r['names'])} |")
    with open(os.path.join(OUT, "diverge.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    print(f"picture: {OUT}/diverge.svg, table: {OUT}/diverge.md")


if __name__ == "__main__":
    main()
