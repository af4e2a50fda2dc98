#!/usr/bin/python3
"""bench/torch_step.py: the PyTorch yardstick of the benchmark (bench/run.sh runs it).

    /usr/bin/python3 bench/torch_step.py --emb 64 --hidden 1024 --batch 256 --steps 30
    /usr/bin/python3 bench/torch_step.py --emb 64 --hidden 1024 --batch 256 --steps 30 --ddp 2
    /usr/bin/python3 bench/torch_step.py --model gpt --steps 30
    /usr/bin/python3 bench/torch_step.py --model gpt --steps 30 --autocast bf16
    /usr/bin/python3 bench/torch_step.py --kernel

Times one training step of the same model as train.c, written the usual PyTorch way
(nn.Embedding, nn.Linear, ReLU, F.cross_entropy, torch.optim.SGD), on one thread per
process. With --model gpt, train.c's GPT (makemore's Transformer: --emb 64, --heads 4,
--layers 4, T 16, AdamW with betas 0.9 and 0.99 and weight decay 0.01), the same way
(nn.LayerNorm, a fused qkv nn.Linear, masked softmax attention, tanh GELU, F.cross_entropy
ignoring padding). With --ddp N it runs N processes under DistributedDataParallel (gloo backend),
each with batch / N rows, as data parallelism is usually done in PyTorch. Prints
"ms_per_step X", the median over --steps steps after a warm-up of 5, like bench/bench.c,
and "cpu_ms_per_step X", the same in this thread's CPU time (on a shared machine, time
another process holds the core is not counted).
The data are random tokens: the time of a step does not depend on them.

With --autocast bf16, the forward and the loss run under torch.autocast (bf16 matrix products,
fp32 weights and optimizer), the PyTorch counterpart of train.c --precision bf16. --kernel
runs one bf16 product of the GPT's fc (512 x 64 by 64 x 256) with oneDNN's verbose log on and
prints "kernel NAME", the implementation oneDNN chose (for example brg:avx512_core_bf16).

With --profile (one process), the GPT's step split by op, in CPU time, in the categories
of bench/bench gpt (bench/run.sh sets them side by side): each aten op of the forward and
backward timed as it runs (a TorchDispatchMode sees every op, the backward's too, below
autograd), in passes alternating with unprofiled steps; AdamW's step and zero_grad timed
in the unprofiled steps; "framework" is the rest of the unprofiled forward and backward
(dispatch, autograd, views, Python). Medians over --steps.
Prints "op|category|ms" lines, then cpu_ms_per_step.
"""
import argparse
import os
import socket
import statistics
import time
from collections import defaultdict

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

VOCAB, CONTEXT, WARMUP = 27, 16, 5


class Block(nn.Module):
    """pre-LayerNorm: x + attention(ln1(x)), then + mlp(ln2(x))"""

    def __init__(self, width, heads, context):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.register_buffer("causal", torch.ones(context, context).tril().bool())

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / (c // self.heads) ** 0.5
        weights = scores.masked_fill(~self.causal[:t, :t], float("-inf")).softmax(dim=-1)
        x = x + self.proj((weights @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, a.emb), nn.Embedding(CONTEXT, a.emb)
        self.blocks = nn.Sequential(*[Block(a.emb, a.heads, CONTEXT) for _ in range(a.layers)])
        self.ln_f, self.lm_head = nn.LayerNorm(a.emb), nn.Linear(a.emb, VOCAB, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        return self.lm_head(self.ln_f(self.blocks(x)))


def make_model(a):
    if a.model == "gpt":
        return Gpt(a)
    layers = [nn.Embedding(VOCAB, a.emb), nn.Flatten()]
    width = CONTEXT * a.emb
    for _ in range(a.layers):
        layers += [nn.Linear(width, a.hidden), nn.ReLU()]
        width = a.hidden
    layers.append(nn.Linear(width, VOCAB))
    return nn.Sequential(*layers)


def time_steps(model, rows, a, sync):
    gen = torch.Generator().manual_seed(42)
    x = torch.randint(0, VOCAB, (rows, CONTEXT), generator=gen)
    if a.model == "gpt":
        opt = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
        y = torch.randint(0, VOCAB, (rows, CONTEXT), generator=gen)
        y[:, 12:] = -1  # padding, ignored by the loss, as after a name of 11 characters
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        y = torch.randint(0, VOCAB, (rows,), generator=gen)
    ms, cpu = [], []
    for step in range(WARMUP + a.steps):
        sync()
        t, c = time.perf_counter(), time.thread_time()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, VOCAB).float(), y.view(-1), ignore_index=-1)
        loss.backward()
        opt.step()
        if step >= WARMUP:
            ms.append(1e3 * (time.perf_counter() - t))
            cpu.append(1e3 * (time.thread_time() - c))
    return statistics.median(ms), statistics.median(cpu)


# the categories of bench/bench gpt, by the name of the aten op that did the work; ops not
# named here (views, transposes, empty tensors, ...) are left to "framework"
CATEGORY = {
    "aten.mm": "products", "aten.addmm": "products", "aten.sum": "products",  # sum: the bias gradients
    "aten.bmm": "attention", "aten._softmax": "attention", "aten._softmax_backward_data": "attention",
    "aten.masked_fill": "attention", "aten.masked_fill_": "attention", "aten.div": "attention",
    "aten.bitwise_not": "attention",
    "aten.native_layer_norm": "LayerNorm", "aten.native_layer_norm_backward": "LayerNorm",
    "aten.gelu": "GELU", "aten.gelu_backward": "GELU",
    "aten._log_softmax": "loss", "aten._log_softmax_backward_data": "loss", "aten.nll_loss_forward": "loss",
    "aten.nll_loss_backward": "loss",
    "aten.embedding": "embedding", "aten.index_select": "embedding", "aten.embedding_dense_backward": "embedding",
    "aten.embedding_backward": "embedding", "aten.index_add_": "embedding", "aten.arange": "embedding",
    "aten.add": "residuals and copies", "aten.add_": "residuals and copies", "aten.copy_": "residuals and copies",
    "aten.clone": "residuals and copies", "aten._unsafe_view": "residuals and copies", "aten.cat": "residuals and copies",
}


def profile_steps(model, a):
    """the step's CPU time split by category: see the docstring"""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpTimes(TorchDispatchMode):  # every aten op the forward and backward run, timed alone
        def __init__(self):
            super().__init__()
            self.ms = defaultdict(float)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            t = time.thread_time_ns()
            out = func(*args, **(kwargs or {}))
            self.ms[CATEGORY.get(str(func.overloadpacket), "framework")] += (time.thread_time_ns() - t - clock) / 1e6
            return out

    # reading the CPU clock is a system call (about 2 us under KVM), part of which falls inside
    # each op's window: the empty window's median is taken off every op
    empty = []
    for _ in range(1001):
        t = time.thread_time_ns()
        empty.append(time.thread_time_ns() - t)
    clock = statistics.median(empty)

    gen = torch.Generator().manual_seed(42)
    x = torch.randint(0, VOCAB, (a.batch, CONTEXT), generator=gen)
    y = torch.randint(0, VOCAB, (a.batch, CONTEXT), generator=gen)
    y[:, 12:] = -1
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
    per_step = defaultdict(list)
    for step in range(WARMUP + a.steps):  # unprofiled steps and profiled passes, alternately
        t0 = time.thread_time()
        opt.zero_grad(set_to_none=True)
        t1 = time.thread_time()
        loss = F.cross_entropy(model(x).view(-1, VOCAB), y.view(-1), ignore_index=-1)
        loss.backward()
        t2 = time.thread_time()
        opt.step()
        t3 = time.thread_time()
        opt.zero_grad(set_to_none=True)
        with OpTimes() as ops:
            loss = F.cross_entropy(model(x).view(-1, VOCAB), y.view(-1), ignore_index=-1)
            loss.backward()
        opt.step()
        if step >= WARMUP:
            per_step["passes"].append(1e3 * (t2 - t1))
            per_step["optimizer"].append(1e3 * ((t1 - t0) + (t3 - t2)))
            per_step["step"].append(1e3 * (t3 - t0))
            for c in set(CATEGORY.values()):
                per_step[c].append(ops.ms[c])
    known = 0.0
    for c in sorted(set(CATEGORY.values())):
        m = statistics.median(per_step[c])
        known += m
        print(f"op|{c}|{c}|{m:.4f}")
    print(f"op|optimizer|AdamW and zero_grad|{statistics.median(per_step['optimizer']):.4f}")
    print(f"op|framework|dispatch, autograd, views: the rest of the passes|"
          f"{max(0.0, statistics.median(per_step['passes']) - known):.4f}")
    print(f"cpu_ms_per_step {statistics.median(per_step['step']):.6f}")


def ddp_worker(rank, a):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.ddp)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(make_model(a))
    ms, cpu = time_steps(model, a.batch // a.ddp, a, dist.barrier)
    if rank == 0:
        print(f"ms_per_step {ms:.6f}\ncpu_ms_per_step {cpu:.6f}", flush=True)
    dist.destroy_process_group()


def kernel_name():
    """one bf16 product under oneDNN's verbose log, in a child process whose output is read"""
    import subprocess
    import sys
    code = ("import torch; torch.set_num_threads(1); a = torch.randn(512, 64).bfloat16(); b = torch.randn(64, 256).bfloat16()\n"
            "a @ b\nwith torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON): a @ b")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    names = [line.split(",")[4] for line in out.splitlines() if line.startswith("onednn_verbose") and ",exec," in line]
    print(f"kernel {names[-1] if names else 'not oneDNN (no verbose line): ATen native'}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["mlp", "gpt"], default="mlp")
    p.add_argument("--emb", type=int, default=None, help="default 16, the GPT's 64")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=None, help="default 1, the GPT's 4")
    p.add_argument("--context", type=int, default=16, help="positions T (16, names.txt's longest name + 1)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--ddp", type=int, default=0, help="processes under DistributedDataParallel (0: one process)")
    p.add_argument("--profile", action="store_true", help="the GPT's step split by op (see above)")
    p.add_argument("--autocast", choices=["none", "bf16"], default="none", help="bf16: under torch.autocast (see above)")
    p.add_argument("--kernel", action="store_true", help="the kernel oneDNN runs for a bf16 product (see above)")
    a = p.parse_args()
    a.emb = a.emb or (64 if a.model == "gpt" else 16)
    a.layers = a.layers or (4 if a.model == "gpt" else 1)
    global CONTEXT
    CONTEXT = a.context
    if a.kernel:
        kernel_name()
    elif a.ddp:
        if a.batch % a.ddp:
            p.error("--batch must divide by --ddp")
        with socket.socket() as free: # a port nobody uses, for the processes to meet
            free.bind(("127.0.0.1", 0))
            os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(free.getsockname()[1])
        mp.spawn(ddp_worker, args=(a,), nprocs=a.ddp)
    elif a.profile:
        if a.model != "gpt":
            p.error("--profile needs --model gpt")
        torch.set_num_threads(1)
        torch.manual_seed(0)
        profile_steps(make_model(a), a)
    else:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        ms, cpu = time_steps(make_model(a), a.batch, a, lambda: None)
        print(f"ms_per_step {ms:.6f}\ncpu_ms_per_step {cpu:.6f}")


if __name__ == "__main__":
    main()
