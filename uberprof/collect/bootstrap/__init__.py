"""The folder `uberprof run` puts first on PYTHONPATH; it holds only `sitecustomize.py`."""

from pathlib import Path

BOOTSTRAP_DIR = Path(__file__).resolve().parent
