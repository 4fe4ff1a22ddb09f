"""The DDP sample's transformer, sharded with FSDP (`fully_shard`) instead of replicated.

Same options as samples/train_ddp.py. On CPU it runs with Gloo; all-gathers and
reduce-scatters then show up as `gloo:all_gather` / `gloo:all_reduce` in traces.
"""

from __future__ import annotations

import os
import sys
import warnings

import torch
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_ddp import TinyTransformer, exit_after_python, run

# The root module's logits are a view; nothing in this loop modifies them in place.
warnings.filterwarnings("ignore", message=".*returned a view tensor.*")


def shard(model: TinyTransformer, device: torch.device) -> TinyTransformer:
    """Each encoder layer its own FSDP unit, then the rest (embedding, head) as the root."""
    for layer in model.encoder.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def main(argv: list[str] | None = None) -> None:
    run(argv, "FSDP", shard)


if __name__ == "__main__":
    main()
    exit_after_python()
