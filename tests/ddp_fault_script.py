"""Helper for tests/test_hostile_input_round2.py, run under ``torchrun --nproc-per-node 2
--max-restarts 1`` on CPU (gloo).

    torchrun --standalone --nproc-per-node 2 --max-restarts 1 ddp_fault_script.py OUT_DIR [--kill-at-step S]

Trains a small dropout model 8 steps with a checkpoint every 2, always with ``resume=True`` (the
first start finds no checkpoint and starts fresh). With ``--kill-at-step S``, rank 1 of the first
attempt (``TORCHELASTIC_RESTART_COUNT == 0``) SIGKILLs itself in the loss of step ``S``: torchrun
then stops rank 0, restarts both, and they resume from the last checkpoint. Each rank of the last
attempt writes ``OUT_DIR/rank{r}.pt`` with its final parameters and the attempt number.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
from torch import nn
from torch.utils.data import Dataset

from posenc.training.trainer import TrainConfig, Trainer


class Data(Dataset):
    def __init__(self, n: int = 40) -> None:
        g = torch.Generator().manual_seed(11)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x @ torch.tensor([[1.0], [-2.0], [0.5], [1.5]])

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--kill-at-step", type=int, default=0)
    args = ap.parse_args()
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.3), nn.Linear(16, 1))
    calls = {"n": 0}

    def loss_fn(m: nn.Module, batch):
        calls["n"] += 1
        if args.kill_at_step and attempt == 0 and rank == 1 and trainer.step + 1 == args.kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)  # a worker lost mid-run, between two checkpoints
        x, y = batch
        return ((m(x) - y) ** 2).mean(), {}

    cfg = TrainConfig(steps=8, batch_size=4, lr=1e-2, warmup_steps=1, seed=3, out_dir=os.path.join(args.out_dir, "run"),
                      checkpoint_every=2, log_every=1, progress=False, device="cpu", resume=True)
    trainer = Trainer(model, Data(), loss_fn, cfg)
    trainer.fit()
    final = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save({"final": final, "attempt": attempt, "calls": calls["n"]}, os.path.join(args.out_dir, f"rank{rank}.pt"))


if __name__ == "__main__":
    main()
