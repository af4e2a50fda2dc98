#!/usr/bin/python3
"""bench/openblas_core.py: the fastest correct OpenBLAS kernel for PyTorch on this CPU.

    /usr/bin/python3 bench/openblas_core.py

Debian's OpenBLAS picks its kernels by the CPU's model, and a CPU newer than the library
gets its generic kernels: on an Intel Xeon of family 6, model 207, OpenBLAS 0.3.21 ran a
512 x 512 sgemm at 19 GFLOP/s, and at 98 with OPENBLAS_CORETYPE=SkylakeX, with the same
results. So the benchmark does not trust the default: for each core type (the default
first), a fresh process times torch.mm on 512 x 512 floats, one thread, the median of 20,
and compares the product with one computed in double precision. A core type whose
instructions the CPU lacks dies (illegal instruction) and is left out, as is one whose
product is off by more than float rounding can explain. Prints a line a candidate, then
"best NAME" ("default": leave OPENBLAS_CORETYPE unset).
"""
import os
import subprocess
import sys

CANDIDATES = ["default", "Haswell", "SkylakeX", "Cooperlake", "Zen", "Sandybridge"]
PROBE = """
import statistics, time, torch
torch.set_num_threads(1)
g = torch.Generator().manual_seed(1)
a, b = torch.randn(512, 512, generator=g), torch.randn(512, 512, generator=g)
ref = a.double() @ b.double()
times = []
for _ in range(25):
    t = time.perf_counter()
    c = torch.mm(a, b)
    times.append(time.perf_counter() - t)
err = ((c.double() - ref).abs().max() / ref.abs().max()).item()
print(2 * 512 ** 3 / statistics.median(times[5:]) / 1e9, err)
"""


def main():
    best, best_gflops = "default", 0.0
    for name in CANDIDATES:
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        env.pop("OPENBLAS_CORETYPE", None)
        if name != "default":
            env["OPENBLAS_CORETYPE"] = name
        run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
        if run.returncode != 0:
            print(f"coretype {name}: does not run here (exit {run.returncode})")
            continue
        gflops, err = map(float, run.stdout.split())
        ok = err < 1e-5  # float sums over 512 terms: about 1e-6 of the largest element
        print(f"coretype {name}: {gflops:.1f} GFLOP/s, relative error {err:.1e}{'' if ok else ' (wrong: left out)'}")
        if ok and gflops > best_gflops:
            best, best_gflops = name, gflops
    print(f"best {best}")


if __name__ == "__main__":
    main()
