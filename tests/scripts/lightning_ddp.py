"""A real Lightning job for the client tests: Trainer(accelerator="cpu", devices=2,
strategy="ddp") on random data. Run as `python lightning_ddp.py` (Lightning starts the second
rank itself) or under `torchrun --nproc_per_node=2` (Lightning joins torchrun's ranks)."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "samples"))
from train_ddp import exit_after_python  # the samples' clean exit (Gloo's teardown race)

BATCH = 8


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=16)
    args = p.parse_args()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    torch.manual_seed(0)
    n = args.steps * 2 * BATCH  # every rank gets `steps` batches
    data = TensorDataset(torch.randn(n, 32), torch.randn(n, 1))
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=args.steps,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Regression(), DataLoader(data, batch_size=BATCH))
    if trainer.global_rank == 0:
        print(f"lightning trained {trainer.global_step} steps on {trainer.world_size} ranks",
              flush=True)


if __name__ == "__main__":
    main()
    exit_after_python()
