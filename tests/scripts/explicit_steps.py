"""A loop without an optimizer: steps are marked with uberprof.step()."""

import sys

import torch

import uberprof

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 7
x = torch.randn(64, 64)
for _ in range(steps):
    for _ in range(20):
        x = torch.tanh(x @ x)
    uberprof.step()
print("explicit done", flush=True)
