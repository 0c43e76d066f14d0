"""Import SGLang's memory-manager modules on a CPU-only machine.

SGLang's radix caches and allocators are plain Python over torch tensors and
run on CPU, but the modules around them import GPU-only code at import time:
the ``sgl_kernel`` CUDA kernels, ``tvm_ffi`` (0.5.23), the NSA attention and
``radix_attention`` layer modules (0.5.9; they pull CUDA JIT kernels),
``hf_transformers_utils`` (model loading through Hugging Face, which the
memory manager never calls), and ``sglang.srt.configs`` whose package
``__init__`` imports every model configuration (and through them
torchvision, which pulls a CUDA torch).

:func:`import_sglang` checks the installed version against the range the
adapters were tested on, then stubs **only** those modules, and only when
they cannot be imported as they are: a module that imports is left alone. A
stub answers every attribute with a placeholder class; calling or
instantiating it raises :class:`StubbedGPUModule` naming the module, so a
stub can never stand in silently for code that runs.
``sglang.srt.configs`` is not stubbed: it becomes the real package with its
``__init__`` skipped, so ``sglang.srt.configs.mamba_utils`` and friends are
SGLang's own code.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import re
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "COMPONENTS",
    "EARLY_COMPONENTS",
    "INC_LOCK",
    "LEGACY",
    "LEGACY_CPP",
    "LEGACY_MAMBA",
    "LEGACY_SWA",
    "SCHEDULER",
    "UNIFIED",
    "SGLangUnavailable",
    "SGLangVersionError",
    "StubbedGPUModule",
    "TestedRange",
    "base_release",
    "import_sglang",
    "import_sglang_package",
    "installed_release_or_none",
    "installed_version",
    "release_tuple",
    "stubbed_modules",
]


class SGLangUnavailable(ImportError):
    """SGLang is not installed in this environment."""


class SGLangVersionError(ImportError):
    """The installed SGLang is outside the range an adapter was tested on."""


class StubbedGPUModule(RuntimeError):
    """Code tried to *use* something from a GPU-only module that was stubbed for a CPU run."""


def release_tuple(version: str) -> tuple[int, ...]:
    """A version as numbers to compare: its dotted release, then a post release's number.

    ``0.5.12`` -> ``(0, 5, 12)``; ``0.5.12.post1`` -> ``(0, 5, 12, 1)`` (after ``0.5.12``, before ``0.5.13``). A
    local part (``+cpu``) and a pre-release tag (``rc1``) are not counted.
    """
    found = _VERSION.match(version)
    if found is None:
        return ()
    numbers = tuple(int(p) for p in found.group(1).split("."))
    return (*numbers, int(found.group(2))) if found.group(2) else numbers


def base_release(version: str) -> str:
    """The release a version patches: ``0.5.12.post1`` -> ``0.5.12``; a plain release is its own.

    A post release ships its release's memory manager with fixes elsewhere, so the adapters drive it, and the
    tests judge it, as that release (B1 and B5 shipped in 0.5.12.post1 as in 0.5.12; B3 and B4 in 0.5.10.post1).
    """
    found = _VERSION.match(version)
    return version if found is None else found.group(1)


_VERSION = re.compile(r"(\d+(?:\.\d+)*)(?:\.?post(\d+))?")


@dataclass(frozen=True)
class TestedRange:
    """The SGLang releases (inclusive) an adapter family was tested on, and the GPU-only modules it may stub."""

    family: str
    lowest: str
    highest: str
    stubs: tuple[str, ...]
    """Modules replaced by a stub when they do not import (a trailing ``.*`` stubs the whole package)."""
    bare_packages: tuple[str, ...] = ("sglang.srt.configs",)
    """Packages made importable with their ``__init__`` skipped."""
    pre_stubs: tuple[str, ...] = ()
    """Modules outside SGLang stubbed before ``import sglang`` itself (when ``sglang/__init__`` needs them)."""

    __test__ = False  # NOTE: not a pytest test class despite the name

    def contains(self, version: str) -> bool:
        """Whether ``version`` (or the release a post release patches) lies in the range."""
        return release_tuple(self.lowest) <= release_tuple(base_release(version)) <= release_tuple(self.highest)

    def describe(self) -> str:
        span = self.lowest if self.lowest == self.highest else f"{self.lowest} to {self.highest}"
        return f"SGLang {span}"


_CACHE_STUBS = (
    "sgl_kernel.*",
    "sglang.srt.utils.hf_transformers_utils",
    "sglang.srt.layers.attention.nsa.index_buf_accessor",
    "sglang.srt.layers.attention.nsa.quant_k_cache",
    "sglang.srt.layers.radix_attention",
)
"""The GPU-only modules 0.5.9 to 0.5.20's caches and scheduler import."""

LEGACY = TestedRange(
    "legacy (RadixCache)",
    "0.5.9",
    "0.5.23",
    # NOTE: from 0.5.21 the caches' import chain also reaches tvm_ffi and the hf_transformers package (as UNIFIED's)
    (*_CACHE_STUBS, "tvm_ffi.*", "sglang.srt.utils.hf_transformers.*"),
    # NOTE: from 0.5.10 utils/common.py imports torchvision.io at module level (see SCHEDULER).
    pre_stubs=("torchvision.*",),
)
"""0.5.9 to 0.5.23: ``RadixCache`` as it was before (and beside) the unified rewrite; SGLang still ships it in 0.5.23.

NOTE: the adapter reads what moved from the installed code (``legacy``'s docstring lists it).
"""

LEGACY_MAMBA = TestedRange(
    "legacy Mamba (MambaRadixCache)", "0.5.9", "0.5.20", LEGACY.stubs, pre_stubs=LEGACY.pre_stubs
)
"""0.5.9 to 0.5.20: ``MambaRadixCache`` beside the unified cache; 0.5.21 no longer ships it.

NOTE: 0.5.13's ``MambaRadixCache`` allocates Mamba slots from ``mamba_allocator``, and from 0.5.10 its
insert frees the duplicates past ``prev_prefix_len`` itself; the adapter reads both from the installed code.
"""

LEGACY_CPP = TestedRange("legacy C++ tree (RadixCacheCpp)", "0.5.9", "0.5.20", LEGACY.stubs, pre_stubs=LEGACY.pre_stubs)
"""0.5.9 to 0.5.20: ``RadixCacheCpp`` over the C++ ``RadixTree`` (the same C++ sources in every one); 0.5.21 no
longer ships it.

NOTE: where it reads its host-cache settings moves (``server_args``, then ``runtime_context`` from 0.5.19); the
adapter reads that from the installed code (``legacy_cpp``'s docstring).
"""

LEGACY_SWA = TestedRange("legacy SWA (SWARadixCache)", "0.5.9", "0.5.20", LEGACY.stubs, pre_stubs=LEGACY.pre_stubs)
"""0.5.9 to 0.5.20: ``SWARadixCache`` beside the unified cache; 0.5.21 no longer ships it.

NOTE: its lock receipt (a bare uuid, then ``IncLockRefResult``) and where its allocator lives move; the adapter
reads both from the installed code (``legacy_swa``'s docstring).
"""

SCHEDULER = TestedRange(
    "scheduler (Scheduler, 0.5.9 to 0.5.12)",
    "0.5.9",
    "0.5.12",
    _CACHE_STUBS,
    # NOTE: from 0.5.10 utils/common.py imports torchvision.io at module level (from 0.5.11 sglang/__init__
    # reaches it); installing torchvision would pull a CUDA torch, and the scheduler never decodes images.
    pre_stubs=("torchvision.*",),
)
"""0.5.9 to 0.5.12: the whole ``Scheduler`` (its modules import more than the caches do)."""

UNIFIED = TestedRange(
    "unified (UnifiedRadixCache)",
    "0.5.22",
    "0.5.23",
    ("sgl_kernel.*", "tvm_ffi.*", "sglang.srt.utils.hf_transformers_utils", "sglang.srt.utils.hf_transformers.*"),
)
"""0.5.22 and 0.5.23: ``UnifiedRadixCache`` with its Python and Rust tree cores, locked through ``lock`` (a
``TreeLock``)."""

INC_LOCK = TestedRange(
    "unified, locked through inc_lock_ref (UnifiedRadixCache, 0.5.17 to 0.5.21)", "0.5.17", "0.5.21", UNIFIED.stubs
)
"""0.5.17 to 0.5.21: ``UnifiedRadixCache`` on a tree core (Python; Rust from 0.5.19), with the older lock and match
API: ``inc_lock_ref`` returns the receipt ``dec_lock_ref`` is given back, and a match carries its slots."""

EARLY_UNIFIED = TestedRange(
    "unified, components on the cache (UnifiedRadixCache, 0.5.11 to 0.5.16)",
    "0.5.11",
    "0.5.16",
    tuple(dict.fromkeys((*SCHEDULER.stubs, *UNIFIED.stubs))),
    pre_stubs=SCHEDULER.pre_stubs,
)
"""0.5.11 to 0.5.16: the first ``UnifiedRadixCache``, its nodes, LRU lists and locks on the cache itself."""

COMPONENTS = TestedRange("scheduler components (Scheduler, UnifiedRadixCache)", "0.5.17", "0.5.23", UNIFIED.stubs)
"""0.5.17 to 0.5.23: the scheduler assembled from components over a ``UnifiedRadixCache`` on a tree core (its
Python one)."""

EARLY_COMPONENTS = TestedRange(
    "scheduler components, cache components on the cache (Scheduler, UnifiedRadixCache, 0.5.13 to 0.5.16)",
    "0.5.13",
    "0.5.16",
    EARLY_UNIFIED.stubs,
    pre_stubs=EARLY_UNIFIED.pre_stubs,
)
"""0.5.13 to 0.5.16: the first schedulers assembled from components, over the first ``UnifiedRadixCache`` (nodes on
the cache, sessions in its embedded ``StreamingSession``; KV fields on the ``Req`` itself, from 0.5.16 split with a
``ReqKvInfo``)."""


_stubbed: list[str] = []


def stubbed_modules() -> tuple[str, ...]:
    """The modules :func:`import_sglang` replaced by stubs in this process, in order."""
    return tuple(_stubbed)


def installed_version() -> str:
    """The installed SGLang version; :class:`SGLangUnavailable` when there is none."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError as err:
        raise SGLangUnavailable(
            "sglang is not installed: the SGLang adapters need it (see .ci/sglang_env for a CPU environment)"
        ) from err


def installed_version_or_none() -> str | None:
    """The installed SGLang version, or ``None`` (the main CI environment has none)."""
    try:
        return installed_version()
    except SGLangUnavailable:
        return None


def installed_release_or_none() -> str | None:
    """The release the installed SGLang is, or patches (:func:`base_release`); ``None`` when none is installed."""
    have = installed_version_or_none()
    return None if have is None else base_release(have)


def unavailable_reason(version: str) -> str | None:
    """Why SGLang ``version`` cannot be used here (a test's skip reason), or ``None`` when it is installed."""
    have = installed_version_or_none()
    if have == version:
        return None
    why = (
        "SGLang is not installed (build an environment with .ci/sglang_env)" if have is None else f"{have} is installed"
    )
    return f"needs SGLang {version}; {why}"


class _Placeholder(type):
    """The type of a stubbed name: usable as a base class, an annotation or an attribute path; never callable."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _placeholder(cls.__module__, f"{cls.__qualname__}.{name}")
        setattr(cls, name, value)
        return value

    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """Any value, in a pydantic model's field typed with this name (0.5.16 to 0.5.20 type fields of their
        request models with ``xgrammar`` classes); no value of it is ever made."""
        # NOTE: called by pydantic only, so pydantic_core is there whenever this runs (SGLang's venvs have it)
        from pydantic_core import core_schema

        return core_schema.any_schema()

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise StubbedGPUModule(
            f"{cls.__module__}.{cls.__qualname__} is GPU-only code that kvledger stubbed to import SGLang on CPU; "
            "it cannot run"
        )


def _placeholder(module: str, qualname: str) -> type:
    return _Placeholder(qualname.rpartition(".")[2], (), {"__module__": module, "__qualname__": qualname})


class _StubModule(types.ModuleType):
    """A module whose every public attribute is a placeholder that refuses to run."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _placeholder(self.__name__, name)
        setattr(self, name, value)
        return value


def _make_stub(name: str, package: bool) -> _StubModule:
    mod = _StubModule(name, f"kvledger CPU stub for GPU-only module {name}")
    mod.__file__ = None
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=package)
    if package:
        mod.__path__ = []
    mod.__kvledger_stub__ = True  # type: ignore[attr-defined]
    return mod


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the submodules of stubbed packages (``sgl_kernel.flash_attn`` ...) as stubs."""

    def __init__(self) -> None:
        self.packages: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if any(fullname.startswith(p + ".") for p in self.packages):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        _stubbed.append(spec.name)
        return _make_stub(spec.name, package=True)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


_finder = _StubFinder()


def _imports(name: str) -> bool:
    """Whether ``name`` imports as it is.

    NOTE: a failed import leaves nothing half-done behind: Python drops every module whose execution
    the error interrupted, and what imported completely (torch, SGLang's CPU modules) is kept, as it
    must be (a C extension cannot be loaded twice).
    """
    if name in sys.modules:
        return True
    try:
        importlib.import_module(name)
    except Exception:
        return False
    return True


def _exported_names(init_file: str, package: str) -> dict[str, str]:
    """``name -> submodule`` for every ``from <package>.<sub> import name`` in a package ``__init__``."""
    with open(init_file, encoding="utf-8") as f:
        tree = ast.parse(f.read(), init_file)
    out: dict[str, str] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.module.startswith(package + "."):
            for alias in stmt.names:
                out[alias.asname or alias.name] = stmt.module
    return out


def _bare_package(name: str) -> None:
    """Make package ``name`` importable without running its ``__init__``.

    Its submodules load normally; a name its ``__init__`` re-exports
    (``from sglang.srt.configs import Qwen3NextConfig``) is imported from its
    own submodule on first access, so only the configurations actually named
    are loaded.
    """
    if name in sys.modules:
        return
    parent = name.rpartition(".")[0]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None or spec.origin is None:
        raise SGLangUnavailable(f"{name} is not a package of the installed SGLang")
    exported = _exported_names(spec.origin, name)
    mod = types.ModuleType(name, f"{name} with its __init__ skipped by kvledger (it imports every model config)")
    mod.__path__ = list(spec.submodule_search_locations)
    mod.__spec__ = spec
    mod.__file__ = spec.origin
    mod.__package__ = name

    def lazy(attr: str) -> Any:
        if attr not in exported:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        try:
            value = getattr(importlib.import_module(exported[attr]), attr)
        except ImportError:
            # NOTE: a model configuration needs Hugging Face transformers, which the memory manager never
            # uses and kvledger does not install; the name only appears in isinstance() checks of model code.
            value = _placeholder(exported[attr], attr)
            _stubbed.append(f"{exported[attr]}.{attr}")
        setattr(mod, attr, value)
        return value

    mod.__getattr__ = lazy  # type: ignore[method-assign]
    sys.modules[name] = mod
    if parent:
        setattr(sys.modules[parent], name.rpartition(".")[2], mod)


def _stub(name: str) -> None:
    package = name.endswith(".*")
    base = name[:-2] if package else name
    if package and base in _finder.packages:
        return
    if _imports(base):
        return
    # NOTE: every parent must exist first; SGLang's own parents (sglang.srt.layers ...) import on CPU.
    parent = base.rpartition(".")[0]
    if parent and parent not in sys.modules:
        importlib.import_module(parent)
    stub = _make_stub(base, package)
    sys.modules[base] = stub
    if parent:
        setattr(sys.modules[parent], base.rpartition(".")[2], stub)
    if package:
        _finder.packages.add(base)
    _stubbed.append(base)


ON_DEMAND = ("torchvision", "xgrammar")
"""Stubbed only when an import of SGLang's fails for want of them: from 0.5.10 ``sglang.srt.utils.common`` imports
``torchvision.io`` at module level (torchvision pulls a CUDA torch and is never installed); 0.5.16 to 0.5.20's
function-call parser (which ``server_args`` imports) imports ``xgrammar``, a grammar engine with CUDA kernels."""


def import_on_demand(module: str) -> types.ModuleType:
    """``import module``, stubbing a package of :data:`ON_DEMAND` (whole) when, and only when, the import needs it.

    NOTE: a release whose import does not fail keeps the real behaviour of code that probes for the package (0.5.21
    on defer their function-call parser's ``xgrammar`` import). A module imported before the stub saw the package
    missing (and took its path without it); one imported after sees the stub.
    """
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    for _ in range(len(ON_DEMAND) + 1):
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as err:
            missing = (err.name or "").partition(".")[0]
            if missing not in ON_DEMAND or missing in _finder.packages:
                raise
            _stub(missing + ".*")
    return importlib.import_module(module)


def import_sglang_package() -> types.ModuleType:
    """``import sglang`` (:func:`import_on_demand`)."""
    return import_on_demand("sglang")


def import_sglang(tested: TestedRange, modules: Sequence[str] = ()) -> str:
    """Check the SGLang version against ``tested``, install the CPU stubs, import ``modules``; return the version.

    Raises :class:`SGLangUnavailable` when SGLang is not installed and
    :class:`SGLangVersionError` (naming the tested range) when it is outside
    ``tested``. Idempotent: a second call stubs nothing new.
    """
    version = installed_version()
    if not tested.contains(version):
        raise SGLangVersionError(
            f"installed SGLang {version} is outside the range the kvledger {tested.family} adapters were "
            f"tested on ({tested.describe()}); install a tested release, e.g. pip install --no-deps "
            f"sglang=={tested.highest}"
        )
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    for name in tested.pre_stubs:
        _stub(name)
    import_sglang_package()
    for name in tested.bare_packages:
        parent = name.rpartition(".")[0]
        if parent:
            importlib.import_module(parent)
        _bare_package(name)
    for name in tested.stubs:
        _stub(name)
    for name in modules:
        import_on_demand(name)
    return version
