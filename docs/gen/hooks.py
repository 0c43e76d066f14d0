"""mkdocs hook for the kvledger site: real output and real source, produced at build time.

Pages ask for generated content with a directive in an HTML comment, on a line
of its own (or, for ``spec-link``, inline)::

    <!-- kvledger:readme-commands -->          the README's set-up commands, verbatim
    <!-- kvledger:run check -->                ``kvledger check --examples 5``'s table
    <!-- kvledger:run check-json -->           the same run with ``--json``
    <!-- kvledger:run faults -->               ``kvledger faults``' table
    <!-- kvledger:help [SUBCOMMAND] -->        ``kvledger [SUBCOMMAND] --help``
    <!-- kvledger:help-rest -->                the help of every subcommand not shown yet
    <!-- kvledger:source PATH NAME... -->      source of NAMEs (``a.b`` for nested) in PATH
    <!-- kvledger:api PACKAGE -->              ``::: module`` for every module of PACKAGE on disk
    <!-- kvledger:contract-tiers -->           which laws each contract tier attaches
    <!-- kvledger:check-laws -->               the suites, models and laws of that ``--json`` run
    <!-- kvledger:doctest PATH [NAME] -->      the doctest of a docstring (run by pytest in CI)
    <!-- kvledger:spec-link MODULE... -->      links to the MODULEs' reference that exist

Commands start in the background when the build starts (``on_pre_build``) and
run in parallel with page rendering; their output is cached for the life of
the process (``mkdocs serve`` rebuilds reuse it until a source file changes).
A directive that cannot be honoured fails the build: nothing is hand-typed.

mkdocstrings reads the package statically through a generated ``kvledger/``
view (the same one CI builds for mypy and CrossHair), because the editable
install maps ``kvledger.spec`` etc. onto top-level folders with no
``kvledger/`` directory for griffe to find.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority, get_plugin_logger
from mkdocs.utils import get_relative_url

log = get_plugin_logger("kvledger")

ROOT = Path(__file__).resolve().parents[2]
VIEW = ROOT / "build" / "docs-view"
LAYERS = {"kvledger.spec": "spec", "kvledger.impl": "impl", "kvledger.contracts": "contracts"}
# Modules shown first on each API page (the rest follow alphabetically, so a new module appears by itself).
FIRST = {
    "kvledger.spec": ["types", "errors", "ledger"],
    "kvledger.impl": ["slots", "owners", "allocators", "req_to_token", "mamba", "integrity"],
    "kvledger.contracts": [
        "bindings",
        "abstraction",
        "machines.pool",
        "machines.suites",
        "machines.runner",
        "machines.profiles",
    ],
}
CHECK_ARGS = ["check", "--examples", "5"]
# Mermaid 11 (the major version Material for MkDocs expects), from the npm package, MIT licence beside it.
MERMAID = "assets/vendor/mermaid-11.17.2.min.js"
HELP_COLUMNS = "80"
DIRECTIVE = re.compile(r"<!--\s*kvledger:([\w-]+)((?:(?!-->).)*)-->")


# --------------------------------------------------------------------------- commands


class Run:
    """A command started in the background; a thread collects its output when it ends."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv = argv
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.result: tuple[int, str, float] | None = None
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()

    def _collect(self) -> None:
        out, _ = self.proc.communicate()
        self.result = (self.proc.returncode, out, time.perf_counter() - self.started)

    def wait(self) -> tuple[int, str, float]:
        """Exit status, combined output, seconds from start to exit."""
        self._thread.join(timeout=300)
        if self.result is None:
            self.proc.kill()
            raise PluginError(f"kvledger docs: `{' '.join(self.argv)}` did not finish in 300 s")
        return self.result


_runs: dict[str, Run] = {}
_runs_key: float = -1.0


def _kvledger() -> str:
    exe = Path(sys.executable).with_name("kvledger")
    found = str(exe) if exe.exists() else shutil.which("kvledger")
    if not found:
        raise PluginError("kvledger docs: the `kvledger` command is not installed next to this Python")
    return found


def _source_mtime() -> float:
    return max(p.stat().st_mtime for layer in LAYERS.values() for p in (ROOT / layer).rglob("*.py"))


def _start(name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("KVLEDGER_")}
    full_env.update({"NO_COLOR": "1", "TERM": "dumb", "COLUMNS": HELP_COLUMNS, "PYTHONHASHSEED": "0"})
    full_env.update(env or {})
    _runs[name] = Run(argv, full_env)


def _get(name: str) -> tuple[int, str, float]:
    if name not in _runs:
        raise PluginError(f"kvledger docs: nothing was started for {name!r}")
    return _runs[name].wait()


def _clean(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def _fence(body: str, lang: str = "text", title: str | None = None, extra: str = "", css: str = "") -> str:
    """A fenced block; ``css`` adds classes (``kvl-console``, ``kvl-wrap``) styled in ``stylesheets/extra.css``."""
    opts = f' title="{title}"' if title else ""
    if css:
        return f"``` {{ .{lang} {css}{opts}{extra} }}\n{body}\n```"
    return f"```{lang}{opts}{extra}\n{body}\n```"


# --------------------------------------------------------------------------- directives


def _readme_commands(_: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"^```bash\n(.*?)^```", text, re.S | re.M)
    if not m:
        raise PluginError("kvledger docs: README.md has no ```bash block of set-up commands")
    return _fence(m.group(1).rstrip("\n"), "bash", "README.md", css=".kvl-wrap")


def _run(arg: str) -> str:
    which = arg.strip()
    if which not in ("check", "check-json", "faults"):
        raise PluginError(f"kvledger docs: unknown run {which!r}")
    code, out, _seconds = _get(which)
    if code not in (0, 1):  # 1 is a violated law: real output worth showing; anything else is a crash
        raise PluginError(f"kvledger docs: `kvledger {' '.join(_runs[which].argv[1:])}` exited {code}:\n{out}")
    shown = "kvledger " + " ".join(_runs[which].argv[1:])
    if which == "check-json":
        try:
            payload = json.loads(out[out.index("{") :])
        except ValueError as err:
            raise PluginError(f"kvledger docs: `{shown}` printed no JSON:\n{out}") from err
        body = json.dumps(payload, indent=2)
        return "\n".join(
            [
                f'??? example "`{shown}` (captured when this site was built)"',
                "",
                *("    " + line for line in _fence(body, "json").splitlines()),
            ]
        )
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    note = f'<p class="kvl-caption">Captured by the docs build on {when}; exit status {code}.</p>'
    return _fence(_clean(out), "text", f"$ {shown}", css=".kvl-console") + "\n\n" + note


_helps_shown: set[str] = set()


def _helps() -> dict[str, str]:
    code, out, _ = _get("help")
    if code != 0:
        raise PluginError(f"kvledger docs: docs/gen/cli_help.py exited {code}:\n{out}")
    helps: dict[str, str] = json.loads(out)
    return helps


def _help(arg: str) -> str:
    sub = arg.strip()
    helps = _helps()
    if sub not in helps:
        raise PluginError(f"kvledger docs: `kvledger` has no subcommand {sub!r} (it has {', '.join(helps)})")
    _helps_shown.add(sub)
    return _fence(_clean(helps[sub]), "text", f"$ kvledger {sub + ' ' if sub else ''}--help", css=".kvl-console")


def _help_rest(_: str) -> str:
    """Help for every subcommand the page has not shown yet (so a new one appears by itself)."""
    rest = [sub for sub in _helps() if sub not in _helps_shown]
    return "\n\n".join(f"## `kvledger {sub}`\n\n{_help(sub)}" for sub in rest)


def _find(tree: ast.Module, dotted: str, path: str) -> ast.stmt:
    body: list[ast.stmt] = tree.body
    node: ast.stmt | None = None
    for part in dotted.split("."):
        node = None
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and stmt.name == part:
                node = stmt
            elif isinstance(stmt, ast.Assign | ast.AnnAssign):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if any(isinstance(t, ast.Name) and t.id == part for t in targets):
                    node = stmt
        if node is None:
            raise PluginError(f"kvledger docs: {path} has no {dotted!r} (looked for {part!r})")
        body = getattr(node, "body", [])
    assert node is not None
    return node


def _source(arg: str) -> str:
    path, *names = arg.split()
    if not names:
        raise PluginError(f"kvledger docs: `source {path}` names nothing to include")
    file = ROOT / path
    text = file.read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = ast.parse(text)
    spans = []
    for name in names:
        node = _find(tree, name, path)
        decorators = getattr(node, "decorator_list", [])
        start = min([node.lineno] + [d.lineno for d in decorators])
        end = node.end_lineno or node.lineno
        spans.append([start, end])
    spans.sort()
    merged: list[list[int]] = []
    for s, e in spans:  # adjacent definitions (only blank lines between) become one block
        if merged and all(not line.strip() for line in lines[merged[-1][1] : s - 1]):
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    out = []
    for s, e in merged:
        body = "\n".join(lines[s - 1 : e])
        indent = min(len(line) - len(line.lstrip()) for line in body.splitlines() if line.strip())
        body = "\n".join(line[indent:] for line in body.splitlines())
        out.append(_fence(body, "python", f"{path}, lines {s}–{e}", f' linenums="{s}"'))
    return "\n\n".join(out)


def _modules(package: str) -> list[str]:
    folder = ROOT / LAYERS[package]
    # NOTE: sub-packages are listed as ``sub.module``; engine adapters (which import the engine) are left out.
    found = sorted(
        ".".join(p.relative_to(folder).with_suffix("").parts)
        for p in folder.rglob("*.py")
        if p.stem != "__init__" and "sglang" not in p.relative_to(folder).parts
    )
    first = [m for m in FIRST.get(package, []) if m in found]
    return first + [m for m in found if m not in first]


def _api(arg: str) -> str:
    package = arg.strip()
    if package not in LAYERS:
        raise PluginError(f"kvledger docs: unknown package {package!r}")
    return "\n\n".join(f"::: {package}.{m}" for m in _modules(package))


def _spec_functions() -> dict[str, str]:
    """Every public module-level function of ``spec/``, by name: law names that are spec functions get a link."""
    out: dict[str, str] = {}
    for file in sorted((ROOT / "spec").glob("*.py")):
        for node in ast.parse(file.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                out.setdefault(node.name, f"kvledger.spec.{file.stem}.{node.name}")
    return out


def _check_laws(_: str) -> str:
    """One row per suite of the captured ``--json`` run: its models and the laws it checks."""
    code, out, _s = _get("check-json")
    if code not in (0, 1):
        raise PluginError(f"kvledger docs: `kvledger check --json` exited {code}:\n{out}")
    results = json.loads(out[out.index("{") :])["results"]
    suites: dict[str, tuple[list[str], list[str]]] = {}
    for r in results:
        models, laws = suites.setdefault(r["suite"], ([], []))
        models.append(r["model"])
        laws.extend(law for law in r["rules"] if law not in laws)
    spec = _spec_functions()

    def show(law: str) -> str:
        if law in spec:
            return f"[`{law}`][{spec[law]}]"
        return f"`{law}`" if law.isidentifier() else law

    rows = ["| suite | models | laws checked after every step |", "|---|---|---|"]
    for name, (models, laws) in suites.items():
        rows.append(f"| `{name}` | {', '.join(models)} | {', '.join(show(law) for law in laws)} |")
    return "\n".join(rows)


def _contract_tiers(_: str) -> str:
    code, out, _s = _get("contract-tiers")
    if code != 0:
        raise PluginError(f"kvledger docs: docs/gen/contract_table.py exited {code}:\n{out}")
    table: dict[str, dict[str, list[str]]] = json.loads(out)
    if not table:
        raise PluginError("kvledger docs: no contracts found on any tier (did kvledger.contracts.bindings change?)")
    rows = ["| method | `on`: incremental | `slow`: whole pool + refinement |", "|---|---|---|"]
    for path, tiers in table.items():
        mod_cls, meth = path.rsplit(".", 1)
        cls = mod_cls.rsplit(".", 1)[1]
        cells = ["<br>".join(tiers.get(t, [])) or "—" for t in ("on", "slow")]
        rows.append(f"| [`{cls}.{meth}`][{path}] | {cells[0]} | {cells[1]} |")
    return "\n".join(rows)


def _spec_link(arg: str) -> str:
    present = []
    for module in arg.split():
        layer, _, name = module.rpartition(".")
        if layer not in LAYERS:
            raise PluginError(f"kvledger docs: spec-link to {module!r}, outside {', '.join(LAYERS)}")
        if (ROOT / LAYERS[layer] / f"{name}.py").is_file():
            present.append(f"[`{module}`][{module}]")
    if not present:
        return ""
    listed = present[0] if len(present) == 1 else ", ".join(present[:-1]) + " and " + present[-1]
    return f"Specified in {listed}."


def _doctest(arg: str) -> str:
    path, *name = arg.split()
    text = (ROOT / path).read_text(encoding="utf-8")
    tree = ast.parse(text)
    node = _find(tree, name[0], path) if name else tree
    doc = ast.get_docstring(node, clean=True)  # type: ignore[arg-type]
    examples = [] if doc is None else doc.split("\n\n")
    found = [block for block in examples if block.lstrip().startswith(">>>")]
    if not found:
        raise PluginError(f"kvledger docs: the docstring of {path} {' '.join(name)} has no doctest")
    where = f"{path}, docstring of {name[0]}" if name else f"{path}, module docstring"
    return _fence("\n\n".join(found), "pycon", where)


HANDLERS: dict[str, Callable[[str], str]] = {
    "readme-commands": _readme_commands,
    "run": _run,
    "help": _help,
    "help-rest": _help_rest,
    "source": _source,
    "api": _api,
    "contract-tiers": _contract_tiers,
    "check-laws": _check_laws,
    "spec-link": _spec_link,
    "doctest": _doctest,
}


# --------------------------------------------------------------------------- mkdocs events


@event_priority(100)
def on_config(config: Any) -> Any:
    """Build the ``kvledger/`` view mkdocstrings reads (cheap; redone every build)."""
    from kvledger.contracts.crosshair_check import build_view

    build_view(VIEW)
    return config


def on_pre_build(config: Any) -> None:
    """Start every command the pages need, unless the sources are unchanged since the last build."""
    global _runs_key
    key = _source_mtime()
    if key == _runs_key and _runs:
        return
    for run in _runs.values():
        if run.proc.poll() is None:
            run.proc.kill()
    _runs.clear()
    _runs_key = key
    exe = _kvledger()
    _start("check", [exe, *CHECK_ARGS], {"COLUMNS": "100"})
    _start("check-json", [exe, *CHECK_ARGS, "--json"])
    _start("faults", [exe, "faults"], {"COLUMNS": "100"})
    _start("help", [sys.executable, str(ROOT / "docs" / "gen" / "cli_help.py")])
    _start("contract-tiers", [sys.executable, str(ROOT / "docs" / "gen" / "contract_table.py")])


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Expand the ``<!-- kvledger:... -->`` directives of one page."""
    _helps_shown.clear()

    def expand(m: re.Match[str]) -> str:
        name, arg = m.group(1), m.group(2)
        if name not in HANDLERS:
            raise PluginError(f"kvledger docs: {page.file.src_uri}: unknown directive kvledger:{name}")
        text = HANDLERS[name](arg)
        # A directive indented inside an admonition or a tab: indent what replaces it the same way.
        before = markdown[markdown.rfind("\n", 0, m.start()) + 1 : m.start()]
        if before and not before.strip():
            text = text.replace("\n", "\n" + before)
        return text

    return DIRECTIVE.sub(expand, markdown)


def on_post_page(output: str, page: Any, config: Any) -> str:
    """Load the vendored Mermaid on pages that have a diagram (Material then uses it instead of a CDN)."""
    if '<pre class="mermaid">' not in output:
        return output
    src = get_relative_url(MERMAID, page.url)
    return output.replace("</body>", f'<script src="{src}"></script>\n</body>', 1)


def on_post_build(config: Any) -> None:
    """Report what the captured commands cost (the build's budget is a minute)."""
    for name, run in _runs.items():
        if run.result is not None:
            log.info("%s: %.1f s", name, run.result[2])
