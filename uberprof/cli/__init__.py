"""The `uberprof` command: one module per subcommand."""

from __future__ import annotations

import click

from uberprof._version import __version__
from uberprof.cli.analyze import analyze
from uberprof.cli.calibrate import calibrate
from uberprof.cli.dashboard import dashboard
from uberprof.cli.diff import diff
from uberprof.cli.doctor import doctor
from uberprof.cli.export import export
from uberprof.cli.info import info
from uberprof.cli.report import report
from uberprof.cli.run import run
from uberprof.cli.scaling import scaling
from uberprof.cli.trace import trace
from uberprof.cli.watch import watch
from uberprof.cli.whatif import whatif

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


@click.group(help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="uberprof")
def main() -> None:
    pass


main.add_command(run)
main.add_command(info)
main.add_command(doctor)
main.add_command(analyze)
main.add_command(dashboard)
main.add_command(calibrate)
main.add_command(report)
main.add_command(export)
main.add_command(diff)
main.add_command(watch)
main.add_command(trace)
main.add_command(whatif)
main.add_command(scaling)
