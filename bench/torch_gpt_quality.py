#!/usr/bin/python3
"""bench/torch_gpt_quality.py: the GPT's quality in PyTorch, beside train.c's (docs/gpt.md).

    /usr/bin/python3 bench/torch_gpt_quality.py --steps 12000          # about an hour on one core
    /usr/bin/python3 bench/torch_gpt_quality.py --data other.txt --seed 7
    /usr/bin/python3 bench/torch_gpt_quality.py --steps 5000 --autocast bf16   # beside train.c --precision bf16

Trains bench/torch_step.py's Gpt (makemore's Transformer, the model of train.c --model gpt)
the usual PyTorch way: AdamW (lr 5e-4, betas 0.9 and 0.99, weight decay 0.01), 32 names a
step drawn with torch.randint, PyTorch's own initialisation. On the same split as train.c:
the lines shuffled with data.h's counter-based Fisher-Yates (seed 42 unless --split-seed),
the last 10% for validation, rows [0, name..., 0] with targets -1 after the end. Prints
every --eval-every steps the loss of the last step and the mean validation loss over every
valid target, as `./train --model gpt --eval-every N` does. Its bits are not train.c's (its
random batches and initial values are PyTorch's): the curve is what to compare. With
--autocast bf16 the passes run under torch.autocast (bf16 products, fp32 weights, loss and
optimizer), as train.c --precision bf16 does; the same seed then draws the same batches and
initial values as without it, so the two runs differ by the precision alone.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_step  # noqa: E402

U64 = (1 << 64) - 1
STREAM_SPLIT = 2  # util.h


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & U64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & U64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & U64
    return x ^ (x >> 31)


def rng_u64(seed, stream, index):  # util.h's: every random number a pure function of these
    return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index)


def split_lines(lines, seed):
    """data.h's split: a Fisher-Yates shuffle of the lines, then 90% train, 10% validation"""
    order = list(range(len(lines)))
    for i in range(len(lines) - 1, 0, -1):
        j = rng_u64(seed, STREAM_SPLIT, i) % (i + 1)
        order[i], order[j] = order[j], order[i]
    lines = [lines[o] for o in order]
    n_val = len(lines) // 10
    return lines[: len(lines) - n_val], lines[len(lines) - n_val :]


def encode(words, stoi, T):
    x = torch.zeros(len(words), T, dtype=torch.long)
    y = torch.full((len(words), T), -1, dtype=torch.long)
    for r, w in enumerate(words):
        ix = torch.tensor([stoi[c] for c in w], dtype=torch.long)
        x[r, 1 : 1 + len(ix)], y[r, : len(ix)], y[r, len(ix)] = ix, ix, 0
    return x, y


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "names.txt"))
    p.add_argument("--steps", type=int, default=12000)
    p.add_argument("--eval-every", type=int, default=1000)
    p.add_argument("--seed", type=int, default=3407, help="PyTorch's seed (batches, initial values)")
    p.add_argument("--split-seed", type=int, default=42, help="train.c's --seed, which draws the split")
    p.add_argument("--autocast", choices=["none", "bf16"], default="none", help="bf16: under torch.autocast")
    a = p.parse_args()
    with open(a.data, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    train, val = split_lines(lines, a.split_seed)
    chars = sorted(set("".join(lines)))  # tokens by code point, 0 the end (data.h)
    stoi = {c: i + 1 for i, c in enumerate(chars)}
    T = max(len(w) for w in lines) + 1
    xt, yt = encode(train, stoi, T)
    xv, yv = encode(val, stoi, T)
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    torch_step.VOCAB, torch_step.CONTEXT = len(chars) + 1, T
    model = torch_step.Gpt(argparse.Namespace(emb=64, heads=4, layers=4))
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
    V = torch_step.VOCAB
    bf16 = a.autocast == "bf16"
    print(f"{len(train)} training names, {len(val)} validation names ({int((yv >= 0).sum())} targets), T {T}")
    for step in range(1, a.steps + 1):
        ix = torch.randint(0, len(train), (32,))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(xt[ix]).view(-1, V).float(), yt[ix].view(-1), ignore_index=-1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % a.eval_every == 0 or step == a.steps:
            with torch.no_grad():
                total = 0.0
                for i in range(0, len(val), 256):
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                        logits = model(xv[i : i + 256]).view(-1, V).float()
                    total += F.cross_entropy(logits, yv[i : i + 256].view(-1), ignore_index=-1, reduction="sum").item()
            print(f"step {step}/{a.steps} | train loss {loss.item():.4f} | val loss {total / int((yv >= 0).sum()):.4f}",
                  flush=True)


if __name__ == "__main__":
    main()
