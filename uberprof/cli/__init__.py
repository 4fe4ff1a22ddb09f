"""The `uberprof` command: one module per subcommand."""

from __future__ import annotations

import importlib

import click

from uberprof._version import __version__

# Each subcommand, defined by the function of its name in uberprof/cli/<name>.py, imported when
# it is asked for: importing all thirteen at the start made every command pay for the others
# (`run`'s collector, the dashboard's server: 15-35 ms of `uberprof analyze`'s start).
COMMANDS = ("analyze", "calibrate", "dashboard", "diff", "doctor", "export", "info", "report",
            "run", "scaling", "trace", "watch", "whatif")


class _Commands(click.Group):
    """A group that imports a subcommand's module on first use (`COMMANDS`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            module = importlib.import_module(f"uberprof.cli.{cmd_name}")
            self.add_command(getattr(module, cmd_name), cmd_name)
        return super().get_command(ctx, cmd_name)


HELP = """\
Profile and troubleshoot distributed PyTorch training: where every rank's
time goes, and why. `run` collects; `info` and `watch` show what was collected
(`trace` records a window on a running job, now);
`analyze`, `report` and `diff` diagnose it; `whatif` projects what fixing it
would gain; `scaling` compares runs of one job at several sizes; `dashboard`
and `export` let you look around; `doctor` and `calibrate` check the machine
and its links. Each command's --help lists its options; docs/<command>.md in
the repository explains them.

\b
Wrap the command you already use; no change to your script:
  uberprof run -- torchrun --nproc_per_node=8 train.py --lr 3e-4
  uberprof run --trace-steps 50-52 -- python train.py
\b
Then look at what was collected, and what holds the job back:
  uberprof info uberprof-runs/<run-id>
  uberprof watch uberprof-runs/<run-id>     (while it runs)
  uberprof report uberprof-runs/<run-id>
  uberprof dashboard uberprof-runs/<run-id>
\b
Check what this machine lets uberprof collect:
  uberprof doctor
"""


@click.group(cls=_Commands, help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="uberprof")
def main() -> None:
    pass
