"""Node folders read back: the `uberprof run` invocation each node agent recorded (node.json).

A node is named by its folder (`nodes/<node>/`): that is the name rank.json's `node`, the
counters readers and `uberprof info` use, whatever node.json says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uberprof.rundir._checked import as_dict, as_int, as_str
from uberprof.rundir.layout import NODE_FILE, RunDir, as_run_dir, read_json


@dataclass(frozen=True)
class NodeMeta:
    """One node folder's node.json, every field checked for its type (None, or {} for the
    dicts, where absent or of the wrong type). `raw` keeps the object as written."""

    node: str  # the folder name
    folder: Path
    readable: bool = False  # node.json was read as a JSON object
    problem: str | None = None  # why node.json could not be read
    host: str | None = None
    command: list[str] | None = None  # argv of the job `uberprof run` started
    exit_code: int | None = None  # None: the run has not finished (or was killed)
    start_ns: int | None = None
    end_ns: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, Any] = field(default_factory=dict)  # what the sampler did
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def read_node(folder: Path) -> NodeMeta:
    """A node folder's metadata; never raises (a missing or broken node.json is a problem)."""
    path = folder / NODE_FILE
    try:
        raw = read_json(path)
    except (OSError, ValueError, RecursionError) as exc:
        why = "missing" if isinstance(exc, FileNotFoundError) else \
            f"unreadable ({' '.join(str(exc).split())[:200]})"
        return NodeMeta(node=folder.name, folder=folder, problem=f"{path}: {why}")
    if not isinstance(raw, dict):
        return NodeMeta(node=folder.name, folder=folder,
                        problem=f"{path}: unreadable (not a JSON object)")
    command = raw.get("command")
    return NodeMeta(
        node=folder.name,
        folder=folder,
        readable=True,
        host=as_str(raw.get("host")),
        command=[str(c) for c in command] if isinstance(command, list) else None,
        exit_code=as_int(raw.get("exit_code")),
        start_ns=as_int(raw.get("start_ns")),
        end_ns=as_int(raw.get("end_ns")),
        options=as_dict(raw.get("options")),
        versions=as_dict(raw.get("versions")),
        counters=as_dict(raw.get("counters")),
        raw=raw,
    )


def list_nodes(run: RunDir | Path | str) -> list[NodeMeta]:
    """Every node folder of a run, by name."""
    return [read_node(p) for p in as_run_dir(run).node_dirs()]



def metadata_problems(run: RunDir | Path | str) -> list[str]:
    """What is wrong with a run's run.json and its nodes' node.json, one line each naming the
    file: worded once so that `info`, `analyze`, `report`, `export`, `diff` and the dashboard
    all say it (the analysis goes on with what can be read)."""
    run = as_run_dir(run)
    out = [p] if (p := run.run_file_problem()) is not None else []
    return out + [n.problem for n in list_nodes(run) if n.problem is not None]
