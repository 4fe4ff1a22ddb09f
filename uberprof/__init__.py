"""uberprof: where every rank of a distributed PyTorch job spends its time, and why.

Most users never import this: `uberprof run -- torchrun ... train.py` needs no code change.
The Python API is for loops uberprof cannot see (`uberprof.step()`) and for profiling without
the CLI (`with uberprof.profile(): ...`).
"""

from uberprof._version import __version__
from uberprof.api import profile, step

__all__ = ["__version__", "profile", "step"]
