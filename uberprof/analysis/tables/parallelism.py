"""Which parallelism a run uses, read once and used everywhere (issue 25).

A job is not always data-parallel: a rank may be a pipeline stage, hold a tensor-parallel
shard, or one of an FSDP shard group, and each calls for other remedies. The reading has two
sources, both already in the derived tables, so it costs no trace read:

- **process groups**: each trace's `distributedInfo.pg_config` (`RankInfo.process_groups`).
  A device mesh names its dimensions' groups `mesh_<dim>`, which gives the dimensions, their
  sizes and each rank's groups in global ranks.
- **API markers**: the distinct event names of each rank (only the `name` column is read,
  `derived.read_rank_names`). FSDP2 (`fully_shard`) annotates `FSDP::...`, FSDP1
  (`FullyShardedDataParallel`) `FullyShardedDataParallel.<hook>`, DDP
  `DistributedDataParallel.forward`, DTensor tensor parallelism issues functional collectives
  (`_c10d_functional::...`), `torch.distributed.pipelining` annotates `Forward i` /
  `Backward i` (GPipe) or `PP:<action>` and exchanges activations with point-to-point
  `send`/`recv`.

A kind is reported only from what the run shows, with the evidence in words; a kind the
mesh and the markers do not agree on is named with what it rests on, never guessed from the
world size. The pipeline's schedule and micro-batch count (from the send/recv order) are
filled in `pipeline` by the pipeline reading, not here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uberprof.analysis.tables import derived as D
from uberprof.ingest.head import head_text
from uberprof.rundir import RunDir

if TYPE_CHECKING:
    from uberprof.analysis.tables.context import RunContext

__all__ = ["KIND_ORDER", "Parallelism", "is_pipeline_group", "mesh_dim", "parallelism_of",
           "read_parallelism", "recorded_parallelism"]

KIND_ORDER = ("pp", "tp", "ep", "embedding", "fsdp2", "fsdp1", "ddp")  # the order `kinds` and the summary use

# Mesh dimension names that say what a dimension is for (torchtitan's and the tutorials'
# spellings); any other name is reported as a dimension, not as a kind.
_PP_DIMS = {"pp", "pipe", "pipeline"}
_TP_DIMS = {"tp", "tensor", "mp", "model"}
_EP_DIMS = {"ep", "expert", "experts", "moe"}
_OTHER_DIMS = {"cp": "context parallel", "ep": "expert parallel"}
# A process group named for a pipeline: a mesh dimension, or a hand-made group's description.
_PIPELINE_GROUP = re.compile(r"(^|[^a-z])(pp|pipe|pipeline|stage)s?([^a-z]|$)", re.IGNORECASE)

_KIND_WORDS = {"pp": "pipeline", "tp": "tensor parallel", "ep": "expert parallel",
               "embedding": "embedding sharding", "fsdp2": "FSDP2", "fsdp1": "FSDP1",
               "ddp": "DDP"}


@dataclass(frozen=True)
class Parallelism:
    """How the ranks of a run divide the work, as far as its traces tell."""

    kinds: tuple[str, ...] = ()  # in KIND_ORDER where present; () single-rank or unknown
    dims: dict[str, int] = field(default_factory=dict)  # mesh dimension -> size; {} no mesh
    groups: dict[str, list[list[int]]] = field(default_factory=dict)  # kind or dim -> groups
    stage_of: dict[int, int] = field(default_factory=dict)  # rank -> pipeline stage
    evidence: dict[str, str] = field(default_factory=dict)  # kind or dim -> what it rests on
    world_size: int = 0  # the job's ranks
    ranks_read: int = 0  # the ranks whose event names were read (markers)
    pipeline: dict[str, Any] | None = None  # schedule, micro-batches: the pipeline reading's

    def degree(self, key: str) -> int | None:
        """The size of the groups of a kind or dimension (None when not known)."""
        if key in self.dims:
            return self.dims[key]
        gs = self.groups.get(key)
        return len(gs[0]) if gs else None

    def summary(self) -> str:
        """One line for people: "pipeline (2 stages) x DDP (2)", "tensor parallel (2)"."""
        parts = [_kind_words(k, self.degree(k), self.pipeline) for k in self.kinds]
        claimed = {d for k in self.kinds for d in _dims_of(k, self.dims)}
        parts += [_dim_words(d, n) for d, n in self.dims.items() if d not in claimed]
        if parts:
            return " x ".join(parts)
        if self.world_size == 0 or (self.world_size == 1 and not self.ranks_read):
            return "not known (no rank could be analysed)"
        if self.world_size == 1:
            return "single process"
        if not self.ranks_read:
            return f"not known ({self.world_size} ranks; no analysed trace to read it from)"
        return (f"not known ({self.world_size} ranks; no DDP, FSDP, pipeline or "
                "tensor-parallel marker in the traces)")

    def as_dict(self) -> dict[str, Any]:
        """The report document's `run.parallelism` (docs/json.md): JSON keys are strings."""
        return {"kinds": list(self.kinds), "summary": self.summary(), "dims": dict(self.dims),
                "groups": {k: [list(g) for g in v] for k, v in self.groups.items()},
                "stage_of": {str(r): s for r, s in sorted(self.stage_of.items())},
                "evidence": dict(self.evidence), "ranks_read": self.ranks_read,
                "pipeline": self.pipeline}


def read_parallelism(ctx: RunContext) -> Parallelism:
    """The parallelism of an analysed run: its ranks' process groups and the API markers among
    their event names (a rank without an analysed trace shows no marker and is not counted in
    `ranks_read`)."""
    names: dict[int, set[str]] = {}
    for r in ctx.rank_ids:
        try:
            names[r] = D.read_rank_names(ctx.derived, ctx.run.inputs, r)
        except (KeyError, OSError, ValueError):
            continue  # no analysed trace: it shows no marker, and is not counted as read
    groups = {r: list(i.process_groups) for r, i in ctx.ranks.items()}
    return parallelism_of(groups, names, max(ctx.world_size, len(ctx.ranks)))


def parallelism_of(groups_of: Mapping[int, list[dict[str, Any]]],
                   names_of: Mapping[int, Iterable[str]], world_size: int) -> Parallelism:
    """The reading itself, from each rank's process groups (pg_config entries: `desc`,
    `ranks`) and event names: the mesh first, then the markers, then each kind's groups."""
    dims, dim_groups = _mesh(groups_of)
    markers = _markers(names_of)
    n = len(names_of)
    kinds: list[str] = []
    evidence: dict[str, str] = {}
    for d, size in dims.items():
        evidence[d] = f"mesh dimension '{d}' of size {size}"
    _read_pipeline(dims, markers, n, kinds, evidence)
    _read_tensor_parallel(dims, markers, n, kinds, evidence)
    _read_all_to_all(dims, markers, n, kinds, evidence)
    for kind in ("fsdp2", "fsdp1", "ddp"):
        if markers.get(kind):
            kinds.append(kind)
            evidence[kind] = _marker_words(kind, markers[kind], n)
    ordered = tuple(k for k in KIND_ORDER if k in kinds)
    everyone = sorted(set(range(world_size)) | set(names_of) | {
        r for g in groups_of.values() for pg in g for r in (pg.get("ranks") or [])
        if isinstance(r, int)})  # every rank of the job, also those whose traces are missing
    groups = dict(dim_groups)
    for kind in ordered:
        if g := _kind_groups(kind, dims, dim_groups, everyone):
            groups[kind] = g
    stages = {r: i for g in groups.get("pp", []) for i, r in enumerate(g)} \
        if "pp" in ordered else {}
    return Parallelism(kinds=ordered, dims=dims, groups=groups, stage_of=stages,
                       evidence=evidence, world_size=max(world_size, len(everyone)),
                       ranks_read=n)


# --- the mesh ---------------------------------------------------------------------------------

def _mesh(groups_of: Mapping[int, list[dict[str, Any]]]
          ) -> tuple[dict[str, int], dict[str, list[list[int]]]]:
    """Mesh dimensions (`mesh_<dim>` groups) with their sizes, and each dimension's distinct
    groups in global ranks, ordered by their first rank. A group's rank order is kept: it is
    the mesh's, and a pipeline stage is a rank's index in it."""
    dims: dict[str, int] = {}
    seen: dict[str, dict[tuple[int, ...], None]] = {}
    for r in sorted(groups_of):
        for pg in groups_of[r]:
            dim = mesh_dim(pg.get("desc") or pg.get("pg_desc"))
            ranks = pg.get("ranks")
            if not (dim and isinstance(ranks, list) and ranks
                    and all(isinstance(x, int) for x in ranks)):
                continue
            dims.setdefault(dim, len(ranks))
            seen.setdefault(dim, {})[tuple(ranks)] = None
    return dims, {d: sorted((list(g) for g in gs), key=lambda g: min(g))
                  for d, gs in seen.items()}


def mesh_dim(desc: object) -> str | None:
    """The device-mesh dimension a process group's description names (`mesh_tp` -> "tp"),
    None for a group that is not a mesh's."""
    return desc[len("mesh_"):] or None if isinstance(desc, str) and desc.startswith("mesh_") \
        else None


def is_pipeline_group(desc: object) -> bool:
    """Whether a process group's description names a pipeline (`mesh_pp`, `pipe`, `stage`):
    its ranks are the stages, a rank's index in it its stage."""
    return bool(_PIPELINE_GROUP.search(str(desc or "")))


def _dims_of(kind: str, dims: Mapping[str, int]) -> list[str]:
    """The mesh dimensions a kind runs over (by their names), [] when the mesh does not say:
    a data-parallel kind runs over the dimension that is neither pipeline, tensor, context nor
    expert parallel (of HSDP's two, FSDP over the `shard` one, DDP over the `replicate` one)."""
    if kind == "pp":
        return [d for d in dims if d in _PP_DIMS]
    if kind == "tp":
        return [d for d in dims if d in _TP_DIMS]
    if kind in ("ep", "embedding"):
        return [d for d in dims if d in _EP_DIMS]
    dp = [d for d in dims if d not in _PP_DIMS | _TP_DIMS | _EP_DIMS | set(_OTHER_DIMS)]
    prefer = "replicate" if kind == "ddp" else "shard"
    return [d for d in dp if prefer in d][:1] or dp[:1]


# --- the markers ------------------------------------------------------------------------------

_MARKERS: dict[str, re.Pattern[str]] = {
    "fsdp2": re.compile(r"^FSDP::"),
    "fsdp1": re.compile(r"FullyShardedDataParallel"),
    "ddp": re.compile(r"^DistributedDataParallel\."),
    "tp": re.compile(r"^_c10d_functional::"),
    "pp_annotation": re.compile(r"^(Forward|Backward) \d+$|^PP:"),
    "p2p": re.compile(r"^(c10d::(send|recv_|recv_any_source_)|(nccl|gloo):(send|recv))$"),
    "all_to_all": re.compile(r"^(c10d::alltoall(_base)?_|(nccl|gloo):all_to_all|"
                             r"_c10d_functional::all_to_all_single)$"),
    # sparse-feature embeddings, not a language model's token embedding (aten::embedding)
    "embedding": re.compile(r"split_embedding|^fbgemm::|torchrec|embedding_bag|EmbeddingBag"),
}

_MARKER_WORDS = {
    "fsdp2": "FSDP:: annotations (fully_shard)",
    "fsdp1": "FullyShardedDataParallel annotations",
    "ddp": "DistributedDataParallel.forward annotations",
    "tp": "functional collectives (_c10d_functional::, DTensor)",
    "pp_annotation": "pipeline schedule annotations (Forward i / Backward i / PP:)",
    "p2p": "point-to-point send/recv",
    "all_to_all": "all-to-all collectives",
    "embedding": "embedding operators or kernels (fbgemm split embeddings, TorchRec, "
                 "EmbeddingBag)",
}


def _markers(names_of: Mapping[int, Iterable[str]]) -> dict[str, list[int]]:
    """Per marker, the ranks whose event names show it."""
    out: dict[str, list[int]] = {}
    for r in sorted(names_of):
        found = {m for n in names_of[r] for m, pat in _MARKERS.items() if pat.search(n)}
        for m in found:
            out.setdefault(m, []).append(r)
    return out


def _marker_words(marker: str, ranks: list[int], n: int) -> str:
    return f"{_MARKER_WORDS[marker]} on {len(ranks)} of {n} rank(s)"


def _read_pipeline(dims: dict[str, int], markers: dict[str, list[int]], n: int,
                   kinds: list[str], evidence: dict[str, str]) -> None:
    """A pipeline: a pipeline mesh dimension, schedule annotations, or, without a mesh,
    point-to-point send/recv on every rank (what a 1-D pipeline shows and little else does)."""
    said = [f"mesh dimension '{d}'" for d in dims if d in _PP_DIMS]
    if markers.get("pp_annotation"):
        said.append(_marker_words("pp_annotation", markers["pp_annotation"], n))
    p2p = markers.get("p2p") or []
    if p2p and (said or (not dims and n > 1 and len(p2p) == n)):
        said.append(_marker_words("p2p", p2p, n))
    if said:
        kinds.append("pp")
        evidence["pp"] = "; ".join(said)


def _read_tensor_parallel(dims: dict[str, int], markers: dict[str, list[int]], n: int,
                          kinds: list[str], evidence: dict[str, str]) -> None:
    """Tensor parallelism: a tensor-parallel mesh dimension, or DTensor's functional
    collectives (compiled data parallelism can issue them too: the evidence says what it
    rests on)."""
    said = [f"mesh dimension '{d}'" for d in dims if d in _TP_DIMS]
    if markers.get("tp"):
        said.append(_marker_words("tp", markers["tp"], n))
    if said:
        kinds.append("tp")
        evidence["tp"] = "; ".join(said)


def _read_all_to_all(dims: dict[str, int], markers: dict[str, list[int]], n: int,
                     kinds: list[str], evidence: dict[str, str]) -> None:
    """All-to-alls say the ranks exchange parts of the model's work, not copies of gradients:
    with embedding operators or kernels, embedding sharding (model-parallel embeddings:
    TorchRec, fbgemm); without them, or with an expert mesh dimension, expert parallelism.
    DDP or FSDP wrapping the dense part is read besides, from its own markers."""
    a2a = markers.get("all_to_all") or []
    ep_dims = [f"mesh dimension '{d}'" for d in dims if d in _EP_DIMS]
    if not a2a and not ep_dims:
        return
    said = ep_dims + ([_marker_words("all_to_all", a2a, n)] if a2a else [])
    if a2a and markers.get("embedding") and not ep_dims:
        kinds.append("embedding")
        evidence["embedding"] = "; ".join(
            [*said, _marker_words("embedding", markers["embedding"], n)])
    else:
        kinds.append("ep")
        evidence["ep"] = "; ".join(said)


# --- groups and stages ------------------------------------------------------------------------

def _kind_groups(kind: str, dims: Mapping[str, int], dim_groups: Mapping[str, list[list[int]]],
                 everyone: list[int]) -> list[list[int]]:
    """A kind's groups: its mesh dimension's; without a mesh, every rank in one group (the
    only group the run has: a 1-D pipeline's stage is then the rank); with a mesh that names no
    dimension for it, unknown ([])."""
    own = _dims_of(kind, dims)
    if own:
        return [list(g) for g in dim_groups.get(own[0], [])]
    if not dims and everyone:
        return [list(everyone)]
    return []


def _kind_words(kind: str, degree: int | None, pipeline: dict[str, Any] | None = None) -> str:
    if kind == "pp":
        p = pipeline or {}
        bits = [f"{degree} stages"] if degree else []
        bits += [p["schedule_words"]] if p.get("schedule_words") else []
        bits += [f"{p['microbatches']} micro-batches"] if p.get("microbatches") else []
        return f"pipeline ({', '.join(bits)})" if bits else "pipeline"
    word = _KIND_WORDS[kind]
    return f"{word} ({degree})" if degree else word


def _dim_words(dim: str, size: int) -> str:
    if dim in _OTHER_DIMS:
        return f"{_OTHER_DIMS[dim]} ({size})"
    if dim in _PP_DIMS | _TP_DIMS:
        return f"mesh dimension '{dim}' ({size})"
    return f"data parallel ({size})"


# --- what `uberprof info` says, cheaply -------------------------------------------------------



def recorded_parallelism(root: Path, traces: Mapping[int, Path]) -> dict[str, Any] | None:
    """For `uberprof info`, without analysing: the reading `uberprof report` saved
    (`run.parallelism` of derived/diagnosis.json), else the mesh alone from the head of each
    rank's trace (`traces`: one file per rank), which cannot tell DDP from FSDP (the API markers
    need the events). None when neither says anything (no saved reading and no mesh)."""
    saved = _saved_reading(root)
    if saved is not None:
        return {**saved, "basis": "the last `uberprof report` (traces' process groups and "
                                  "API markers)"}
    groups = {r: g for r, path in traces.items() if (g := _header_groups(path)) is not None}
    if not groups:
        return None
    p = parallelism_of(groups, {r: () for r in groups}, len(groups))
    if not p.kinds and not p.dims:  # no mesh: only the markers could tell
        return None
    return {**p.as_dict(), "basis": "trace headers (process groups only; `uberprof report` "
                                    "also reads the DDP/FSDP/pipeline/tensor-parallel markers)"}


def _saved_reading(root: Path) -> dict[str, Any] | None:
    doc = D.read_saved_report(RunDir(root).derived_dir) or {}
    p = (doc.get("run") or {}).get("parallelism")
    return p if isinstance(p, dict) and p.get("summary") else None


def _header_groups(path: Path) -> list[dict[str, Any]] | None:
    """A trace's `distributedInfo.pg_config` as `RankInfo.process_groups` holds it, read from
    the head of the file only (`ingest.head`); None when the head does not hold it."""
    text = head_text(path)
    if text is None:
        return None
    at = text.find('"distributedInfo"')
    start = text.find("{", at) if at >= 0 else -1
    if start < 0:
        return None
    try:
        info, _ = json.JSONDecoder().raw_decode(text, start)
    except ValueError:
        return None
    pgs = info.get("pg_config") if isinstance(info, dict) else None
    if not isinstance(pgs, list):
        return None
    return [{"name": str(pg.get("pg_name")), "desc": pg.get("pg_desc"),
             "size": pg.get("pg_size"), "ranks": pg.get("ranks")}
            for pg in pgs if isinstance(pg, dict)]
