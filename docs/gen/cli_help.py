"""Print ``kvledger [SUB] --help`` for the command and each subcommand, as JSON.

Run by the docs hook in a subprocess: one Python start (and one torch import)
for every help text instead of one per subcommand. The texts come from the
installed Typer app itself, invoked as the ``kvledger`` script invokes it.
"""

from __future__ import annotations

import json

from typer.main import get_command
from typer.testing import CliRunner

from kvledger.contracts.cli import app


def main() -> None:
    runner = CliRunner()
    group = get_command(app)
    subs = ["", *sorted(getattr(group, "commands", {}))]
    out = {}
    for sub in subs:
        args = [sub, "--help"] if sub else ["--help"]
        result = runner.invoke(app, args, prog_name="kvledger")
        if result.exit_code != 0:
            raise SystemExit(f"kvledger {' '.join(args)} exited {result.exit_code}:\n{result.output}")
        out[sub] = result.output
    print(json.dumps(out))


if __name__ == "__main__":
    main()
