"""Print, as JSON, which contracts each contract tier attaches to the reference implementation.

Run by the docs hook in a subprocess (it imports torch and patches classes).
For each tier it calls ``kvledger.contracts.bindings.install(tier)`` and asks
icontract which pre/postconditions wrap each public method of every class in
``kvledger.impl`` (and tier ``on``'s light checker which laws it checks,
``__kvledger_laws__``); so the table on the "Contracts and checking" page is what
the bindings really install, not what someone remembers them installing.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
from typing import Any

from icontract import _checkers

import kvledger.impl
from kvledger.contracts import bindings


def _impl_classes() -> list[type]:
    out = []
    for info in pkgutil.iter_modules(kvledger.impl.__path__, "kvledger.impl."):
        mod = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ == mod.__name__:
                out.append(cls)
    return out


def _laws(fn: Any) -> list[str]:
    light = list(getattr(fn, "__kvledger_laws__", ()))  # NOTE: tier on's light checker (bindings.checked)
    checker = _checkers.find_checker(fn)
    if checker is None:
        return light
    pre = [c.description or "(unnamed)" for group in getattr(checker, "__preconditions__", []) for c in group]
    post = [c.description or "(unnamed)" for c in getattr(checker, "__postconditions__", [])]
    return [f"requires: {d}" for d in pre] + list(reversed(post)) + light  # outermost decorator first, as written


def main() -> None:
    classes = _impl_classes()
    table: dict[str, dict[str, list[str]]] = {}
    for level in bindings.LEVELS:
        bindings.install(level)
        try:
            for cls in classes:
                for name, fn in vars(cls).items():
                    if name.startswith("_") or not callable(fn):
                        continue
                    laws = _laws(fn)
                    if laws:
                        table.setdefault(f"{cls.__module__}.{cls.__qualname__}.{name}", {})[level] = laws
        finally:
            bindings.uninstall()
    print(json.dumps(table, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
