"""Two "nodes" on one machine: network namespaces joined by a veth pair (needs root and iproute2).

Each node gets its own host name through `unshare --uts` when commands run with `node.run()`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from tests._jobs import job_env, job_limit, stop


def netns_available() -> bool:
    return os.geteuid() == 0 and all(shutil.which(t) for t in ("ip", "unshare"))


requires_netns = pytest.mark.skipif(not netns_available(),
                                    reason="needs root, iproute2 and unshare")


@dataclass(frozen=True)
class Node:
    ns: str
    veth: str
    addr: str
    hostname: str

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside this node's namespace under its own host name."""
        script = f'hostname {self.hostname} && exec "$@"'
        return ["ip", "netns", "exec", self.ns, "unshare", "--uts", "sh", "-c", script, "sh", *argv]

    def start(self, argv: list[str]) -> subprocess.Popen[str]:
        """`argv` started in this node, output captured, Gloo talking over the node's veth."""
        return subprocess.Popen(self.command(argv), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env=job_env(GLOO_SOCKET_IFNAME=self.veth))


def wait_ok(procs: list[subprocess.Popen[str]], timeout: float | None = None) -> None:
    """Wait for every process; each must exit with 0 (a failure shows its output). They run
    together, so one deadline for all: `timeout`, else the longest of their jobs' limits."""
    limit = timeout if timeout is not None else max(job_limit(p.args) for p in procs)
    deadline = time.monotonic() + limit
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stop(procs)  # all of them, not only this one: nothing outlives the test
            out, err = p.communicate()
            raise AssertionError(f"still running after {limit:.0f} s:\n{out}\n{err[-3000:]}")
        assert p.returncode == 0, f"{out}\n{err[-3000:]}"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextmanager
def two_nodes(tag: str, rate: str | None = None) -> Iterator[tuple[Node, Node]]:
    """Namespaces `<tag>a`/`<tag>b`, linked by a veth pair, optionally capped with tc at `rate`."""
    suffix = f"{tag}{os.getpid() % 10000}"
    subnet = 10 + os.getpid() % 200
    a = Node(f"up{suffix}a", f"v{suffix}a"[:15], f"10.{subnet}.7.1", f"node-{tag}-a")
    b = Node(f"up{suffix}b", f"v{suffix}b"[:15], f"10.{subnet}.7.2", f"node-{tag}-b")
    try:
        for n in (a, b):
            _ip("netns", "add", n.ns)
        _ip("link", "add", a.veth, "type", "veth", "peer", "name", b.veth)
        for n in (a, b):
            _ip("link", "set", n.veth, "netns", n.ns)
            _ip("-n", n.ns, "addr", "add", f"{n.addr}/24", "dev", n.veth)
            _ip("-n", n.ns, "link", "set", n.veth, "up")
            _ip("-n", n.ns, "link", "set", "lo", "up")
            if rate:  # samples/train_ddp.py's LinkShaper changes it with this burst/latency
                subprocess.run(["ip", "netns", "exec", n.ns, "tc", "qdisc", "add", "dev", n.veth,
                                "root", "tbf", "rate", rate, "burst", "256kb", "latency", "50ms"],
                               check=True, capture_output=True)
        yield a, b
    finally:
        for n in (a, b):
            subprocess.run(["ip", "netns", "del", n.ns], capture_output=True, check=False)
