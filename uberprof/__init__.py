"""uberprof: where every rank of a distributed PyTorch job spends its time, and why.

Most users never import this: `uberprof run -- torchrun ... train.py` needs no code change.
The Python API is for loops uberprof cannot see (`uberprof.step()`) and for profiling without
the CLI (`with uberprof.profile(): ...`).
"""

from typing import TYPE_CHECKING, Any

from uberprof._version import __version__
from uberprof.api import profile, step

if TYPE_CHECKING:
    from uberprof.loader import Run

__all__ = ["__version__", "load", "profile", "step"]


def load(path: Any, **kwargs: Any) -> "Run":
    """Analyse a run directory or trace folder (or reuse its analysis): see `uberprof.loader`.

    Imported lazily so that `import uberprof` stays cheap inside training jobs.
    """
    from uberprof.loader import load as _load

    return _load(path, **kwargs)
