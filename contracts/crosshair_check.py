"""Run CrossHair on the spec modules (``kvledger spec-check``, CI, tests).

CrossHair resolves options by reading each package's ``__init__.py``, which
fails on the ``kvledger`` namespace package an editable install builds from
the ``package-dir`` mapping. So CrossHair runs with ``PYTHONPATH`` pointing
at a generated *view*: a temporary ``kvledger/`` package whose sub-packages
are symlinks to the real ``spec/``, ``impl/`` and ``contracts/`` folders.
The same view serves ``mypy`` (see ``.ci/run``).
"""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import kvledger.contracts
import kvledger.impl
import kvledger.spec

SPEC_MODULES = (
    "kvledger.spec.ledger",
    "kvledger.spec.lru",
    "kvledger.spec.locks",
    "kvledger.spec.prefix",
    "kvledger.spec.session",
    "kvledger.spec.admission",
)


def checkable(module: str) -> list[str]:
    """The functions (and methods) defined in ``module`` that carry an icontract contract: what CrossHair checks.

    Imports ``module`` (``ImportError`` if it cannot be). A module where this
    is empty would be reported by CrossHair as "no counterexample" having
    checked nothing.
    """
    mod = importlib.import_module(module)
    found: list[str] = []

    def contracted(obj: object) -> bool:
        return any(getattr(obj, attr, None) for attr in ("__preconditions__", "__postconditions__", "__invariants__"))

    for name, obj in vars(mod).items():
        if getattr(obj, "__module__", None) != module:
            continue
        if inspect.isclass(obj):
            if contracted(obj):
                found.append(name)
            found += [f"{name}.{m}" for m, f in vars(obj).items() if callable(f) and contracted(f)]
        elif callable(obj) and contracted(obj):
            found.append(name)
    return found


def build_view(root: Path) -> Path:
    """Create ``root/kvledger`` with symlinks to the three sub-packages; return ``root``."""
    pkg = root / "kvledger"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text('"""Generated view of kvledger for CrossHair and mypy."""\n')
    for mod in (kvledger.spec, kvledger.impl, kvledger.contracts):
        link = pkg / mod.__name__.rsplit(".", 1)[1]
        target = Path(next(iter(mod.__path__))).resolve()
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target, target_is_directory=True)
    return root


def crosshair_command(targets: Sequence[str], per_condition_timeout: float) -> list[str]:
    """The ``crosshair check`` command line for ``targets`` (module names or file paths)."""
    return [
        sys.executable,
        "-m",
        "crosshair",
        "check",
        "--analysis_kind=icontract",
        f"--per_condition_timeout={per_condition_timeout}",
        *targets,
    ]


def run_crosshair(
    targets: Sequence[str], view: Path, *, per_condition_timeout: float = 4.0, timeout: float = 600.0
) -> subprocess.CompletedProcess[str]:
    """Run CrossHair on ``targets`` with the view on ``PYTHONPATH``; exit code 0 means nothing found."""
    build_view(view)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(view), env.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        crosshair_command(targets, per_condition_timeout),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
