"""A real Hugging Face `Trainer` job for the client tests: a tiny GPT-2 built from a config
(nothing downloaded) trained on random tokens, on CPU; 2 ranks under torchrun."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.utils import logging

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "samples"))
from train_ddp import exit_after_python  # the samples' clean exit (Gloo's teardown race)

SEQ, VOCAB, BATCH = 32, 256, 4


class RandomTokens(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, VOCAB, (SEQ,), generator=g)
        return {"input_ids": ids, "labels": ids}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=16)
    args = p.parse_args()
    logging.set_verbosity_error()
    torch.manual_seed(0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=VOCAB,
                                       n_positions=SEQ))
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(output_dir=out, max_steps=args.steps,
                                  per_device_train_batch_size=BATCH, use_cpu=True,
                                  report_to=[], save_strategy="no", logging_strategy="no",
                                  disable_tqdm=True, dataloader_num_workers=0, seed=0)
        trainer = Trainer(model=model, args=targs,
                          train_dataset=RandomTokens(args.steps * BATCH * world))
        result = trainer.train()
    if trainer.is_world_process_zero():
        print(f"hf trained {result.global_step} steps on {world} ranks", flush=True)


if __name__ == "__main__":
    main()
    exit_after_python()
