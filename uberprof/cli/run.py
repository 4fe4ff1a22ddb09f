"""`uberprof run`: wrap a training command and collect from every rank."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from uberprof.cli.params import BYTE_SIZE, RANK_LIST, FiniteRange
from uberprof.collect.config import CollectConfig, TraceSchedule, describe_ranks
from uberprof.collect.counters.sampler import DEFAULT_HZ, MODES, CounterSettings
from uberprof.collect.launcher import CommandNotFound, run_wrapped
from uberprof.collect.node_agent import NodeAgent
from uberprof.collect.runid import resolve_run_id
from uberprof.collect.slowdown import SlowdownSettings, default_disk_budget
from uberprof.collect.watchdog import ACTIONS, HANG_EXIT_CODE, MIN_TIMEOUT_S, STEP_FACTOR
from uberprof.rundir import RunDir

EPILOG = """\
\b
Examples:
  uberprof run -- torchrun --nproc_per_node=4 train.py
  uberprof run --trace-steps 100-102 -- python train.py --epochs 1
  uberprof run --trace-every 500 --trace-active 2 -- torchrun ... train.py
  uberprof run --no-trace -- srun python train.py        (step timeline only)
  uberprof run --trace-ranks 0,7,12-15 -- torchrun ... train.py   (traces from 6 ranks)
\b
While it runs, `uberprof trace RUN` records a window on the job's next steps (docs/trace.md).
\b
Multi-node: run the same `uberprof run -- torchrun --nnodes=N ...` on every node. Nodes land in
one run directory when --out is shared and the job has an id: torchrun's --rdzv-id, or the
scheduler's (SLURM_JOB_ID, PBS_JOBID, LSB_JOBID), or --run-id. With local --out folders, read
them together later: uberprof info node0/RUN node1/RUN.
\b
Hangs: when no rank of a node finishes a step for --hang-timeout seconds (default: the larger of
5 minutes and 20x the median step; a job that has not finished its first step is starting up, not
hung), every rank's Python stacks and Flight Recorder dump are saved in the run directory and
one line names the stuck rank(s). --on-hang stop then ends the job: uberprof run exits 124.
\b
Steps are found without code changes (the optimizer step; ProfilerStep#N when your script
runs torch.profiler itself). For loops without an optimizer, call uberprof.step() each step.
"""


@click.command(
    context_settings={"allow_interspersed_args": False},
    epilog=EPILOG,
    short_help="Run a training command and collect from every rank.",
)
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path),
              default=Path("uberprof-runs"), envvar="UBERPROF_OUT", show_default=True,
              help="Where run directories go (<out>/<run-id>).")
@click.option("--run-id", help="Name of the run directory; give the same on every node of a "
              "multi-node job that has no rendezvous or scheduler id.")
@click.option("--trace-steps", metavar="A-B[,C-D]",
              help=f"Record torch.profiler traces on these steps on every rank "
              f"[default: {TraceSchedule().describe()}].")
@click.option("--trace-every", type=click.IntRange(min=1), metavar="N",
              help="Record a trace window every N steps.")
@click.option("--trace-active", type=click.IntRange(min=1), default=3, show_default=True,
              metavar="K", help="Steps per window with --trace-every.")
@click.option("--trace-ranks", type=RANK_LIST, metavar="LIST",
              help="Record trace windows on these ranks only, e.g. 0,7,12-15 (every rank keeps "
              "its step timeline and Flight Recorder) [default: every rank].")
@click.option("--trace-on-slowdown/--no-trace-on-slowdown", default=None,
              envvar="UBERPROF_TRACE_ON_SLOWDOWN",
              help="Record a window when the job's step time, or one rank's lateness, rises "
              "beyond its own recent level (20-step median vs the 200 before, 4 MADs and 20%; "
              "jobs under 70 steps never trigger; at most 3 a run, 1 an hour): on every rank, "
              "or with --trace-ranks on the late ranks plus a healthy reference "
              "(docs/triggers.md) [default: on, off with --no-trace].")
@click.option("--trace-disk-budget", type=BYTE_SIZE, metavar="SIZE",
              help="No triggered window once the run directory's traces exceed SIZE (e.g. "
              "2GB) [default: the smaller of 5 GB and a tenth of the disk's free space].")
@click.option("--no-trace", is_flag=True, help="No traces: the step timeline only (cheapest).")
@click.option("--with-stack", is_flag=True, help="Record Python stacks in traces (larger files).")
@click.option("--modules", is_flag=True, help="Time each nn.Module (module::<path> spans in "
              "trace windows, forward only; hooks only while a window records).")
@click.option("--profile-memory", is_flag=True, help="Record allocations in trace windows "
              "(torch.profiler profile_memory): the report's memory timeline.")
@click.option("--record-shapes", type=click.Choice(["auto", "on", "off"]), default="auto",
              show_default=True, help="Record operators' input shapes in traces. auto: on CPU "
              "ranks and Gloo ranks on GPUs (Gloo collectives' sizes come only from them), off "
              "on NCCL ranks (NCCL records its own; shapes make stopping a window about 3x "
              "slower).")
@click.option("--window-memory-mb", type=click.IntRange(min=0), metavar="MB",
              help="Stop a trace window early once the rank's memory grew by this much in it "
              "(the profiler holds recorded tensors until the window ends; 0: never) "
              "[default: half the host's available memory, shared by its ranks].")
@click.option("--counters", "counters_mode", type=click.Choice(MODES), default="auto",
              show_default=True, help="Node counters: auto = host + NVML/GPM where present; "
              "host = host only; dcgm = auto + DCGM profiling fields; none = off.")
@click.option("--sample-hz", type=FiniteRange(min=0.1, max=100), default=DEFAULT_HZ,
              show_default=True, metavar="HZ",
              help="Rate of the cheap counters (host, NVML); PCIe/ECC/GPM/DCGM run at <= 1 Hz.")
@click.option("--hang-timeout", type=FiniteRange(min=1), metavar="SECONDS",
              help=f"A node whose ranks finish no step for this long is hung [default: the "
              f"larger of {MIN_TIMEOUT_S:g} s and {STEP_FACTOR:g}x the median step].")
@click.option("--on-hang", type=click.Choice(ACTIONS), default="report", show_default=True,
              help="On a hang, after saving every rank's stacks and collectives: report (one "
              f"line; the job goes on) or stop the job (uberprof run exits {HANG_EXIT_CODE}).")
@click.option("--dashboard", is_flag=True,
              help="Serve the dashboard beside the job (127.0.0.1, low priority); its URL is "
                   "printed when the job starts, and the page follows the job while it runs.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="The --dashboard's port (0: any free port).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), metavar="PORT",
              help="Serve this node's live figures (step times per rank, lateness, hang and "
              "slowdown state, trace windows) as Prometheus metrics on PORT/metrics; 0: any "
              "free port, written in node.json (docs/metrics.md) [default: off].")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, metavar="HOST",
              help="The address --metrics-port listens on (0.0.0.0: every interface).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(out: Path, run_id: str | None, trace_steps: str | None, trace_every: int | None,
        trace_active: int, trace_ranks: set[int] | None, trace_on_slowdown: bool | None,
        trace_disk_budget: int | None, no_trace: bool, with_stack: bool,
        modules: bool,
        profile_memory: bool, record_shapes: str, window_memory_mb: int | None,
        counters_mode: str, sample_hz: float, hang_timeout: float | None, on_hang: str,
        dashboard: bool, port: int, metrics_port: int | None, metrics_host: str,
        command: tuple[str, ...]) -> None:
    """Run COMMAND under uberprof: every rank's steps, trace windows and clocks are recorded.

    COMMAND is what you would run anyway (torchrun, python, srun, a launcher script); put `--`
    before it. Its output, exit code and signals pass through unchanged.
    """
    schedule = _schedule(trace_steps, trace_every, trace_active, no_trace)
    if trace_on_slowdown is None:  # on by default; --no-trace asks for no trace at all
        trace_on_slowdown = not no_trace
    config = CollectConfig(trace=schedule, with_stack=with_stack, modules=modules,
                           profile_memory=profile_memory,
                           record_shapes={"on": True, "off": False}.get(record_shapes),
                           window_memory_mb=window_memory_mb,
                           trace_ranks=None if trace_ranks is None else tuple(sorted(trace_ranks)))
    try:
        rid = resolve_run_id(run_id, command, os.environ)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--run-id") from None
    run_dir = RunDir((out / rid).absolute())
    options = {"out": str(out), "run_id": run_id, "trace": schedule.describe(),
               "trace_ranks": None if config.trace_ranks is None
               else describe_ranks(config.trace_ranks),
               "with_stack": with_stack, "record_shapes": record_shapes,
               "modules": modules, "profile_memory": profile_memory,
               "window_memory_mb": window_memory_mb,
               "counters": counters_mode, "sample_hz": sample_hz,
               "hang_timeout": hang_timeout, "on_hang": on_hang,
               "trace_on_slowdown": trace_on_slowdown, "metrics_port": metrics_port}
    slowdown = None
    if trace_on_slowdown:
        slowdown = SlowdownSettings(disk_budget_bytes=trace_disk_budget
                                    if trace_disk_budget is not None
                                    else default_disk_budget(run_dir.root))
        options["trace_disk_budget"] = slowdown.disk_budget_bytes
    counters = CounterSettings(mode=counters_mode, sample_hz=sample_hz)
    try:
        agent: NodeAgent | None = NodeAgent(run_dir, rid, command, config, options, counters)
    except OSError as exc:
        _say(f"cannot write the run directory {run_dir.root} ({exc.strerror or exc}); "
             "running the command without profiling")
        agent = None
    if agent is not None:
        on = "" if config.trace_ranks is None or not schedule.enabled else \
            f" on ranks {describe_ranks(config.trace_ranks)}"
        _say(f"run directory {run_dir.root} (traces: {schedule.describe()}{on})")
    if agent is not None and dashboard:
        from uberprof.dashboards.live_server import start_dashboard

        _say(f"dashboard: {start_dashboard(run_dir.root, port)} (from the first steps on)")
    if agent is not None and metrics_port is not None:
        url = agent.start_metrics(metrics_host, metrics_port, _say)
        if url is not None:
            _say(f"metrics: {url}")
    env = agent.child_env(os.environ) if agent else dict(os.environ)

    def started(pid: int) -> None:
        if agent is not None:
            agent.start_watchdog(pid, hang_timeout, on_hang, lambda rec: _hang_line(run_dir, rec),
                                 slowdown=slowdown)

    try:
        code = run_wrapped(command, env, started)
    except CommandNotFound as exc:
        _say(str(exc))
        code = exc.exit_code
    stopped = agent is not None and agent.watchdog is not None and agent.watchdog.stopped_job
    if stopped:
        code = HANG_EXIT_CODE
    if agent is not None:
        agent.finish(code)
        _say(_closing_line(run_dir, code, stopped))
    sys.exit(code)


def _hang_line(run_dir: RunDir, record: dict[str, object]) -> None:
    """The one line a hang costs the user's terminal: who is stuck, where the evidence is."""
    try:
        from uberprof.analysis.diagnosis.findings.failures import hang_summary

        what = hang_summary(run_dir.root)
    except Exception as exc:  # noqa: BLE001 - the evidence is saved; the summary is a courtesy
        what = f"(could not summarise it: {exc})"
    then = ("stopping the job (--on-hang stop)" if record.get("action") == "stop"
            else "the job goes on (--on-hang stop would end it)")
    _say(f"hang: no rank on this node finished a step for {float(record['timeout_s']):g} s; "
         f"{what}; evidence in {run_dir.root}; {then}; next: uberprof report {run_dir.root}")


def _schedule(steps: str | None, every: int | None, active: int, off: bool) -> TraceSchedule:
    chosen = [name for name, v in (("--trace-steps", steps), ("--trace-every", every),
                                   ("--no-trace", off)) if v]
    if len(chosen) > 1:
        raise click.UsageError(f"{' and '.join(chosen)} do not go together: pick one")
    try:
        if off:
            return TraceSchedule.off()
        if every:
            return TraceSchedule.periodic(every, active)
        if steps:
            return TraceSchedule.parse_steps(steps)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return TraceSchedule()


def _closing_line(run_dir: RunDir, code: int, stopped: bool = False) -> str:
    from uberprof.inventory import inventory, trace_not_reached

    try:
        inv = inventory([run_dir.root], check_traces=False)
    except Exception as exc:  # noqa: BLE001 - the summary is a courtesy
        return f"run directory {run_dir.root} (could not summarise it: {exc})"
    ranks = inv["ranks"]
    windows = sum(len(r["trace_windows"]) for r in ranks)
    status = "" if code == 0 else f"; the command exited with code {code}"
    if stopped:
        status = f"; the job was stopped after a hang (--on-hang stop): exit code {code}"
    missed = trace_not_reached(ranks)
    why_no_trace = f"\nuberprof: {missed}" if missed else ""
    return (f"{len(ranks)} rank(s), {_steps_per_rank([r['steps'] for r in ranks])}, "
            f"{windows} trace window file(s) in {run_dir.root}{status}{why_no_trace}"
            f"\nuberprof: next: uberprof info {run_dir.root}")


def _steps_per_rank(steps: list[int]) -> str:
    """Steps are per rank (every rank runs the same loop): a sum over ranks would mislead."""
    if not steps:
        return "0 steps"
    low, high = min(steps), max(steps)
    return f"{high} steps per rank" if low == high else f"{low}-{high} steps per rank"


def _say(message: str) -> None:
    sys.stderr.write(f"uberprof: {message}\n")
    sys.stderr.flush()
