"""`uberprof run --dashboard`: the dashboard beside the job, in a separate low-priority process.

The parent (`uberprof run`) only picks the port, prints the URL and starts the child
(`start_dashboard`); it never waits for it, so the job is not slowed. The child
(`python -m uberprof.dashboards.live_server RUN PORT PARENT`, `serve_beside`) lowers its priority
(os.nice), waits for the first steps, serves the dashboard on 127.0.0.1 (the same app and
server as `uberprof dashboard`: `uberprof.dashboards.server`), follows the job while it runs
(`uberprof.dashboards.live`), and leaves a short while after the job ends and the whole run is
diagnosed (open pages see both), or when `uberprof run` is gone.

Light on purpose: the parent imports this module, so Dash is imported by the child only.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["FINAL_S", "GRACE_S", "HOST", "MODULE", "NICE", "free_port", "serve_beside",
           "start_dashboard"]

NICE = 10  # below the job's processes: the dashboard yields the CPU to training
GRACE_S = 10.0  # served this long after the job ends, so that open pages show the end
FINAL_S = 600.0  # at most this long for the final diagnosis after the job ends
HOST = "127.0.0.1"
MODULE = "uberprof.dashboards.live_server"  # the child's command line: python -m MODULE ...


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def start_dashboard(run_dir: Path, port: int) -> str:
    """Start the dashboard of `run_dir` beside the job; its URL (port 0: any free port). The
    child runs in its own session, so the job's Ctrl-C is not its to handle."""
    port = port or free_port()
    subprocess.Popen(
        [sys.executable, "-m", MODULE, str(run_dir), str(port), str(os.getpid())],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, env=os.environ.copy())
    return f"http://{HOST}:{port}/"


def serve_beside(run_dir: Path, port: int, parent: int, poll_s: float = 1.0) -> int:
    """The child: wait for steps, serve, stop after the job ends (or its `uberprof run`)."""
    from uberprof.rundir.follow import RunFollower

    os.nice(NICE)
    follower = RunFollower(run_dir)

    def gone() -> bool:
        return os.getppid() != parent and not _alive(parent)

    state = follower.poll()
    while state.steps == 0 and not state.ended:  # nothing to show yet
        if gone():
            return 0
        time.sleep(poll_s)
        state = follower.poll()
    if state.ended:
        return 0
    from uberprof.analysis.read import open_tables
    from uberprof.dashboards.app import create_app, loopback_hosts
    from uberprof.dashboards.data import RunData
    from uberprof.dashboards.live import EXTENSION
    from uberprof.dashboards.server import ServeError, make_server

    data = RunData.of(open_tables(run_dir))
    data.diagnose()  # read.diagnose_opened: the saved one when fresh, else made (and saved)
    app = create_app(data, allowed_hosts=loopback_hosts(HOST))
    try:
        server = make_server(HOST, port, app.server)
    except ServeError as exc:
        print(f"uberprof dashboard: {exc}", file=sys.stderr)
        return exc.code
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    live = app.server.extensions.get(EXTENSION)  # the pages' follower: one reader
    while not (live or follower).poll().ended and not gone():
        time.sleep(poll_s)
    if live is not None and not gone():
        live.wait_final(FINAL_S)  # the whole run diagnosed, on the open pages
    time.sleep(GRACE_S)
    server.shutdown()
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


if __name__ == "__main__":
    sys.exit(serve_beside(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
