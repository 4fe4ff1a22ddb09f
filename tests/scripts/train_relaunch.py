"""Lightning-style launch: the script re-runs its own command line for the other ranks.

The first process becomes rank 0 itself and starts `sys.argv` again with RANK/LOCAL_RANK set
for ranks 1..N-1, the way PyTorch Lightning's subprocess launcher does.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "samples"))
import train_ddp

WORLD = int(os.environ.get("RELAUNCH_WORLD", "2"))

if "LOCAL_RANK" not in os.environ:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(WORLD)}
    children = [
        subprocess.Popen([sys.executable, *sys.orig_argv[1:]],
                         env={**os.environ, **common, "RANK": str(r), "LOCAL_RANK": str(r)})
        for r in range(1, WORLD)
    ]
    os.environ.update(common, RANK="0", LOCAL_RANK="0")
    train_ddp.main(sys.argv[1:])
    sys.exit(max(c.wait() for c in children))
else:
    train_ddp.main(sys.argv[1:])
