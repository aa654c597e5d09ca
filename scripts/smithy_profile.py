"""Where the time of AttentionSmithy's module with posenc's method goes, beside posenc's own module
(issue 49 item 4): torch.profiler's top operators of one forward + backward each, after warm-up.

    python scripts/smithy_profile.py [--encoding none|rope|alibi] [--seq-len 1024] [--rows 12]

Run it on a quiet machine (it times); B=4, H=8, D=64 (dim 512) as the bench's --smithy rows. The
tables show which operators the two modules share (the attention kernel) and which only
AttentionSmithy's ``MultiheadAttention`` runs around the method.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import posenc
from posenc.cli.bench.smithy_rows import SmithyUnit, _encoding


def _step(module, x):
    module(x).sum().backward()


def _table(name, module, x, rows):
    for _ in range(3):
        _step(module, x)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _step(module, x)
    print(f"\n== {name}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--encoding", default="none", choices=("none", "rope", "alibi"))
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=12)
    args = parser.parse_args()
    dim, heads = 512, 8
    torch.manual_seed(0)
    x = torch.randn(4, args.seq_len, dim, requires_grad=True)
    enc = _encoding(args.encoding, dim, heads, args.seq_len)
    own = posenc.MultiheadAttention(dim, heads, encoding=enc)
    causal = posenc.AttentionMask(causal=True)

    class Own(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = own

        def forward(self, x):
            return self.attn(x, mask=causal)

    _table(f"posenc MultiheadAttention, {args.encoding}", Own(), x, args.rows)
    _table(f"AttentionSmithy MultiheadAttention + PosencAttentionMethod, {args.encoding}",
           SmithyUnit(dim, heads, args.seq_len, args.encoding, bridged=True), x, args.rows)


if __name__ == "__main__":
    main()
