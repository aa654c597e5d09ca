"""Helper for tests/test_trainer.py: train a small dropout model, optionally hang part-way.

    python resume_train_script.py OUT_DIR PARAMS_OUT --steps N --checkpoint-every K
        [--resume] [--hang-at-call C --marker PATH]

With ``--hang-at-call C`` the C-th call of the loss function (counted in this process) writes
``PATH`` and sleeps, so the test can SIGKILL the process at a known point after a checkpoint.
The data and the loss draw from torch, numpy and ``random``, so every RNG has to be restored.
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from posenc.training.trainer import TrainConfig, Trainer


class NoisyData(Dataset):
    def __init__(self, n: int = 40) -> None:
        g = torch.Generator().manual_seed(123)
        self.x = torch.randn(n, 6, generator=g)
        self.y = self.x.sum(-1, keepdim=True)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        noise = torch.from_numpy(np.random.normal(0.0, 0.05, size=6).astype(np.float32))
        return self.x[i] + noise, self.y[i]


class DropoutNet(nn.Module):
    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, hidden), nn.GELU(), nn.Dropout(0.3), nn.LayerNorm(hidden), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("params_out")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--checkpoint-every", type=int, default=0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--hang-at-call", type=int, default=0)
    ap.add_argument("--marker", default="")
    args = ap.parse_args()

    torch.manual_seed(7)
    model = DropoutNet()
    calls = 0

    def loss_fn(m: nn.Module, batch):
        nonlocal calls
        calls += 1
        if calls == args.hang_at_call:
            with open(args.marker, "w") as f:
                f.write("hanging")
            while True:
                time.sleep(1)
        x, y = batch
        weight = 1.0 + random.random()  # python RNG in the loss
        loss = weight * ((m(x) - y) ** 2).mean()
        return loss, {"weight": weight}

    cfg = TrainConfig(
        steps=args.steps, batch_size=8, lr=5e-3, warmup_steps=3, min_lr_ratio=0.1, seed=11,
        out_dir=args.out_dir, log_every=3, checkpoint_every=args.checkpoint_every,
        resume=args.resume, progress=False, device="cpu",
    )
    Trainer(model, NoisyData(), loss_fn, cfg, model_config={"hidden": 16}).fit()
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.params_out)


if __name__ == "__main__":
    main()
