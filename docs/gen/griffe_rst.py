"""Griffe extension: read kvledger's reST-flavoured docstrings as Markdown.

kvledger's docstrings are written for people reading the source: Sphinx roles
(``:class:`~kvledger.spec.types.Owner```) and doctest blocks (``>>> ...``).
mkdocstrings renders docstrings as Markdown, where a role shows up as literal
text and a doctest turns into nested block quotes. This extension rewrites,
once the whole package is loaded (so relative names can be resolved):

* a role whose target resolves to an object of the package into a
  cross-reference (``[`Owner`][kvledger.spec.types.Owner]``), which
  mkdocs-autorefs turns into a link; ``--strict`` then fails on a reference to
  an object that does not exist;
* a role whose target module is not in the source tree at all (a docstring
  citing a module that has not landed yet) into plain code;
* a doctest block into a fenced ``pycon`` block;

and it points each module at its real file (``spec/ledger.py``) rather than the
symlinked view mkdocstrings loaded it through.

The source files are not touched.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

logger = griffe.get_logger("kvledger.docs.griffe_rst")

_ROLE = re.compile(r":(?:py:)?(?:class|func|mod|meth|attr|data|exc|obj):`(~?)([\w.]+)`")


def _module_exists(root: Path, package: str, dotted: str) -> bool:
    """Whether some prefix of ``dotted`` (below ``package``) is a module or package on disk."""
    parts = dotted.split(".")
    if parts[0] != package:
        return False
    for n in range(len(parts), 1, -1):
        rel = Path(*parts[1:n])
        if (root / rel).with_suffix(".py").is_file() or (root / rel / "__init__.py").is_file():
            return True
    return False


def _resolve(obj: griffe.Object | griffe.Alias, target: str) -> str | None:
    """The full path ``target`` names in ``obj``'s scope, or ``None``."""
    package = obj.package.name
    if target.split(".", 1)[0] == package:
        return target
    head, _, rest = target.partition(".")
    try:
        full = obj.resolve(head)
    except (griffe.NameResolutionError, AttributeError):
        return None
    return f"{full}.{rest}" if rest else full


def _fence_doctests(text: str) -> str:
    """Wrap each run of doctest lines (``>>>`` through the next blank line) in a ``pycon`` fence."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    in_fence = False
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        if not in_fence and line.lstrip().startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip())
                i += 1
            out += [f"{indent}```pycon", *(indent + b for b in block), f"{indent}```"]
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


class RstToMarkdown(griffe.Extension):
    """Rewrite Sphinx roles and doctest blocks once the package is loaded."""

    def _rewrite(self, obj: griffe.Object | griffe.Alias, root: Path) -> None:
        doc = obj.docstring
        if doc is None:
            return
        package = obj.package.name

        def role(m: re.Match[str]) -> str:
            short, target = m.group(1) == "~", m.group(2)
            title = target.rsplit(".", 1)[-1] if short else target
            full = _resolve(obj, target)
            if full is None or not _module_exists(root, package, full):
                logger.info("kvledger docs: %s cites %s, which is not in the source tree", obj.path, target)
                return f"`{title}`"
            return f"[`{title}`][{full}]"

        doc.value = _fence_doctests(_ROLE.sub(role, doc.value))

    def _walk(self, obj: griffe.Object, root: Path) -> None:
        self._rewrite(obj, root)
        for member in obj.members.values():
            if member.is_alias:
                continue  # an import: documented where it is defined
            self._walk(member, root)  # type: ignore[arg-type]

    def _real_paths(self, mod: griffe.Module) -> None:
        # NOTE: the view's sub-packages are symlinks; show readers spec/ledger.py, not build/docs-view/...
        # Griffe has no public setter for a module's path: if its private field goes away, the
        # view's path is shown instead, which is still correct.
        if isinstance(mod.filepath, Path) and mod.filepath.resolve() != mod.filepath and hasattr(mod, "_filepath"):
            lines = mod.lines_collection
            real = mod.filepath.resolve()
            if mod.filepath in lines:
                lines[real] = lines[mod.filepath]
            mod._filepath = real
        for member in mod.modules.values():
            if not member.is_alias:
                self._real_paths(member)  # type: ignore[arg-type]

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Griffe 2 event: the whole package is loaded."""
        if pkg.filepath is None or isinstance(pkg.filepath, list):
            return
        self._walk(pkg, Path(pkg.filepath).parent)
        self._real_paths(pkg)

    def on_package_loaded(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Griffe 1 name of the same event."""
        self.on_package(pkg=pkg, **kwargs)
