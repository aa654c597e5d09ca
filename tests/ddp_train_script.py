"""Helper for tests/test_trainer.py, run under ``torchrun --nproc_per_node 2`` on CPU (gloo).

    torchrun --standalone --nproc_per_node 2 ddp_train_script.py OUT_DIR

Each rank writes ``OUT_DIR/rank{r}.pt`` with its initial and final parameters and the dataset
indices it trained on, one list per step.
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn
from torch.utils.data import Dataset

from posenc.training.trainer import TrainConfig, Trainer


class IndexedData(Dataset):
    def __init__(self, n: int = 48) -> None:
        g = torch.Generator().manual_seed(5)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x @ torch.tensor([[1.0], [-1.0], [2.0], [0.5]])

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return {"x": self.x[i], "y": self.y[i], "index": i}


def main() -> None:
    out_dir = sys.argv[1]
    rank = int(os.environ["RANK"])
    torch.manual_seed(100 + rank)  # different inits on purpose: DDP must broadcast rank 0's
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 1))
    seen: list[list[int]] = []

    def loss_fn(m: nn.Module, batch):
        seen.append(batch["index"].tolist())
        loss = ((m(batch["x"]) - batch["y"]) ** 2).mean()
        return loss, {}

    cfg = TrainConfig(steps=5, batch_size=6, lr=1e-2, warmup_steps=1, seed=3, out_dir=os.path.join(out_dir, "run"),
                      log_every=1, progress=False, device="cpu")
    trainer = Trainer(model, IndexedData(), loss_fn, cfg)
    assert trainer.world_size == 2 and trainer.rank == rank
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}  # after DDP's broadcast
    metrics = trainer.fit()
    # fit() created the group, so it tears it down, DDP wrapper first (an orderly exit)
    assert trainer.train_model is model and not torch.distributed.is_initialized()
    final = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save({"init": init, "final": final, "seen": seen, "train_loss": metrics["train_loss"],
                "world_size": trainer.world_size}, os.path.join(out_dir, f"rank{rank}.pt"))


if __name__ == "__main__":
    main()
