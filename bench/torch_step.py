#!/usr/bin/python3
"""bench/torch_step.py: the PyTorch yardstick of the benchmark (bench/run.sh runs it).

    /usr/bin/python3 bench/torch_step.py --emb 64 --hidden 1024 --batch 256 --steps 30
    /usr/bin/python3 bench/torch_step.py --emb 64 --hidden 1024 --batch 256 --steps 30 --ddp 2
    /usr/bin/python3 bench/torch_step.py --model gpt --steps 30

Times one training step of the same model as train.c, written the usual PyTorch way
(nn.Embedding, nn.Linear, ReLU, F.cross_entropy, torch.optim.SGD), on one thread per
process. With --model gpt, train.c's GPT (makemore's Transformer: --emb 64, --heads 4,
--layers 4, T 16, AdamW with betas 0.9 and 0.99 and weight decay 0.01), the same way
(nn.LayerNorm, a fused qkv nn.Linear, masked softmax attention, tanh GELU, F.cross_entropy
ignoring padding). With --ddp N it runs N processes under DistributedDataParallel (gloo backend),
each with batch / N rows, as data parallelism is usually done in PyTorch. Prints
"ms_per_step X", the median over --steps steps after a warm-up of 5, like bench/bench.c.
The data are random tokens: the time of a step does not depend on them.
"""
import argparse
import os
import socket
import statistics
import time

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
    ms = []
    for step in range(WARMUP + a.steps):
        sync()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, VOCAB), y.view(-1), ignore_index=-1)
        loss.backward()
        opt.step()
        if step >= WARMUP:
            ms.append(1e3 * (time.perf_counter() - t))
    return statistics.median(ms)


def ddp_worker(rank, a):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.ddp)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(make_model(a))
    ms = time_steps(model, a.batch // a.ddp, a, dist.barrier)
    if rank == 0:
        print(f"ms_per_step {ms:.6f}", flush=True)
    dist.destroy_process_group()


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
    a = p.parse_args()
    a.emb = a.emb or (64 if a.model == "gpt" else 16)
    a.layers = a.layers or (4 if a.model == "gpt" else 1)
    global CONTEXT
    CONTEXT = a.context
    if a.ddp:
        if a.batch % a.ddp:
            p.error("--batch must divide by --ddp")
        with socket.socket() as free: # a port nobody uses, for the processes to meet
            free.bind(("127.0.0.1", 0))
            os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(free.getsockname()[1])
        mp.spawn(ddp_worker, args=(a,), nprocs=a.ddp)
    else:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        print(f"ms_per_step {time_steps(make_model(a), a.batch, a, lambda: None):.6f}")


if __name__ == "__main__":
    main()
