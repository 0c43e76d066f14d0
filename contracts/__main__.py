"""``python -m kvledger.contracts``: the ``kvledger`` command, for environments without its entry-point script."""

from kvledger.contracts.cli import app

if __name__ == "__main__":
    app(prog_name="kvledger")
