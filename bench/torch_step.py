#!/usr/bin/python3
"""bench/torch_step.py: the PyTorch yardstick of the benchmark (bench/run.sh runs it).

    /usr/bin/python3 bench/torch_step.py --emb 64 --hidden 1024 --batch 256 --steps 30
    /usr/bin/python3 bench/torch_step.py --emb 64 --hidden 1024 --batch 256 --steps 30 --ddp 2

Times one training step of the same model as train.c, written the usual PyTorch way
(nn.Embedding, nn.Linear, ReLU, F.cross_entropy, torch.optim.SGD), on one thread per
process. With --ddp N it runs N processes under DistributedDataParallel (gloo backend),
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


def make_model(a):
    layers = [nn.Embedding(VOCAB, a.emb), nn.Flatten()]
    width = CONTEXT * a.emb
    for _ in range(a.layers):
        layers += [nn.Linear(width, a.hidden), nn.ReLU()]
        width = a.hidden
    layers.append(nn.Linear(width, VOCAB))
    return nn.Sequential(*layers)


def time_steps(model, rows, a, sync):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(42)
    x = torch.randint(0, VOCAB, (rows, CONTEXT), generator=gen)
    y = torch.randint(0, VOCAB, (rows,), generator=gen)
    ms = []
    for step in range(WARMUP + a.steps):
        sync()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
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
    p.add_argument("--emb", type=int, default=16)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--ddp", type=int, default=0, help="processes under DistributedDataParallel (0: one process)")
    a = p.parse_args()
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
