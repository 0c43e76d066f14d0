"""Import vLLM's v1 KV cache manager (``vllm.v1.core``) on a CPU-only machine.

vLLM's ``KVCacheManager``, ``BlockPool``, ``FreeKVCacheBlockQueue``,
``KVCacheBlock``, the single-type managers and the KV cache coordinators are
plain Python over block ids and never touch a device, but the modules around
them import the serving stack at import time: ``vllm/__init__`` (through
``vllm.env_override``) pulls ``torch._inductor``; ``vllm.config`` and
``vllm.utils`` import psutil, zmq, transformers, Hugging Face hub clients,
OpenAI protocol types, image libraries and structured-output backends; the
manager never calls any of them.

:func:`import_vllm` checks the installed version against the releases the
adapter was tested on, makes ``vllm`` a package whose ``__init__`` is
skipped, and then imports the requested modules. A module that fails to
import is replaced by a stub **only** when it is in :data:`STUBBABLE` (and
only then: one that imports is left alone), and the import is retried; a
module outside that list that fails is an error. A stub answers every
attribute with a placeholder class; calling or instantiating it raises
:class:`StubbedModule` naming the module, so a stub can never stand in
silently for code that runs.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import Any

__all__ = [
    "CORE_MODULES",
    "STUBBABLE",
    "STUB_VERSION",
    "TESTED",
    "StubbedModule",
    "VLLMUnavailable",
    "VLLMVersionError",
    "import_vllm",
    "installed_version",
    "installed_version_or_none",
    "stubbed_modules",
    "unavailable_reason",
]


class VLLMUnavailable(ImportError):
    """vLLM is not installed in this environment."""


class VLLMVersionError(ImportError):
    """The installed vLLM is not one of the releases the adapter was tested on."""


class StubbedModule(RuntimeError):
    """Code tried to *use* something from a module that was stubbed for a CPU run."""


TESTED: tuple[str, ...] = (
    "0.6.6.post1",
    "0.7.0",
    "0.7.3",
    "0.8.5.post1",
    "0.9.2",
    "0.10.2",
    "0.11.2",
    "0.12.0",
    "0.13.0",
    "0.14.1",
    "0.15.1",
    "0.16.0",
    "0.17.1",
    "0.18.1",
    "0.19.1",
    "0.20.2",
    "0.21.0",
    "0.22.0",
    "0.22.1",
    "0.23.0",
    "0.24.0",
    "0.25.1",
    "0.26.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
    "0.34.0",
)
"""The releases the vLLM adapter was run against (docs/vllm.md lists each one's API shape and results)."""

CORE_MODULES: tuple[str, ...] = ("vllm.v1.core.kv_cache_manager", "vllm.v1.core.kv_cache_utils", "vllm.v1.request")
"""What the adapter imports; the coordinators and the block pool come with them where the release has them."""

STUBBABLE: tuple[str, ...] = (
    "psutil",
    "zmq",
    "urllib3",
    "cbor2",
    "transformers",
    "huggingface_hub",
    "safetensors",
    "aiohttp",
    "requests",
    "openai_harmony",
    "openai",
    "PIL",
    "pybase64",
    "cachetools",
    "cloudpickle",
    "uvloop",
    "cpuinfo",
    "prometheus_client",
    "llguidance",
    "xgrammar",
    "mistral_common",
    "blake3",
    "gguf",
    "cv2",
    "tqdm",
    "setproctitle",
    "fastapi",
    "diskcache",
    "vllm.parser",
    "vllm.transformers_utils.configs",
    "vllm.multimodal",
    "vllm.model_executor",
    "vllm.compilation",
)
"""Modules (with their submodules) that may be stubbed, and only when they fail to import.

Third-party packages of the serving stack, vLLM's output parsers (``vllm.parser``
runs xgrammar at import), its model-configuration package (which imports
every Hugging Face model config), and, for 0.8.x/0.9.x, its multimodal registry
(built at import on a ``cachetools`` cache), model executor and compilation
passes (which import ``torch._inductor``). None of them runs in the KV cache manager.
"""

_stubbed: list[str] = []


def stubbed_modules() -> tuple[str, ...]:
    """The modules :func:`import_vllm` replaced by stubs in this process, in order."""
    return tuple(_stubbed)


def installed_version() -> str:
    """The installed vLLM version; :class:`VLLMUnavailable` when there is none."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError as err:
        raise VLLMUnavailable(
            "vllm is not installed: the vLLM adapter needs it (see .ci/vllm_env for a CPU environment)"
        ) from err


def installed_version_or_none() -> str | None:
    """The installed vLLM version, or ``None`` (the main CI environment has none)."""
    try:
        return installed_version()
    except VLLMUnavailable:
        return None


def unavailable_reason(version: str | None = None) -> str | None:
    """Why vLLM (``version``, or any tested release) cannot be used here (a skip reason), or ``None``."""
    have = installed_version_or_none()
    if have is None:
        return "vLLM is not installed (build an environment with .ci/vllm_env)"
    if version is not None and have != version:
        return f"needs vLLM {version}; {have} is installed"
    if have not in TESTED:
        return f"vLLM {have} is installed, outside the tested releases ({', '.join(TESTED)})"
    return None


def _schema(cls: type, source: Any, handler: Any) -> Any:
    from pydantic_core import core_schema

    return core_schema.any_schema()


class _Placeholder(type):
    """The type of a stubbed name: usable as a base class, an annotation, a pydantic field type; never callable."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _placeholder(cls.__module__, f"{cls.__qualname__}.{name}")
        setattr(cls, name, value)
        return value

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise StubbedModule(
            f"{cls.__module__}.{cls.__qualname__} belongs to a module kvledger stubbed to import vLLM's KV cache "
            "manager on CPU; it cannot run"
        )

    def __getitem__(cls, item: Any) -> Any:
        return cls


def _placeholder(module: str, qualname: str) -> type:
    return _Placeholder(
        qualname.rpartition(".")[2],
        (),
        {
            "__module__": module,
            "__qualname__": qualname,
            # NOTE: vLLM's pydantic config classes name stubbed classes in field types.
            "__get_pydantic_core_schema__": classmethod(_schema),
        },
    )


class _StubModule(types.ModuleType):
    """A module whose every public attribute is a placeholder that refuses to run."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _placeholder(self.__name__, name)
        setattr(self, name, value)
        return value


def _make_stub(name: str) -> _StubModule:
    mod = _StubModule(name, f"kvledger CPU stub for module {name}")
    mod.__file__ = None
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    mod.__path__ = []
    mod.__kvledger_stub__ = True  # type: ignore[attr-defined]
    return mod


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the submodules of stubbed packages (``transformers.utils`` ...) as stubs."""

    def __init__(self) -> None:
        self.packages: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if any(fullname.startswith(p + ".") for p in self.packages):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _make_stub(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None

    def find_distributions(self, context: Any = None) -> list[importlib.metadata.Distribution]:
        """A stubbed package's distribution metadata, so ``importlib.metadata.version`` answers for it.

        NOTE: 0.21.0–0.31.0's ``vllm.transformers_utils.config`` reads ``version("transformers")`` at import
        (below 5.0.0, 0.21–0.23 warn and 0.24 on raise ImportError); a stub reports :data:`STUB_VERSION`.
        """
        name = getattr(context, "name", None)
        if not isinstance(name, str):
            return []
        wanted = name.replace("-", "_").lower()
        return [_StubDistribution(p) for p in sorted(self.packages) if "." not in p and p.lower() == wanted]


STUB_VERSION = "999.0.0+kvledger.stub"
"""The version ``importlib.metadata`` reports for a stubbed package: above any minimum a release gates on at import."""


class _StubDistribution(importlib.metadata.Distribution):
    """The metadata of a stubbed package: its name and :data:`STUB_VERSION`, no files."""

    def __init__(self, name: str) -> None:
        self._name = name

    def read_text(self, filename: str) -> str | None:
        if filename == "METADATA":
            return f"Metadata-Version: 2.1\nName: {self._name}\nVersion: {STUB_VERSION}\n"
        return None

    def locate_file(self, path: Any) -> Any:
        raise FileNotFoundError(f"{self._name} is a kvledger CPU stub: it has no files")


_finder = _StubFinder()


def _stubbable(name: str) -> str | None:
    """The entry of :data:`STUBBABLE` that covers module ``name``, or ``None``."""
    return next((s for s in STUBBABLE if name == s or name.startswith(s + ".")), None)


def _stub(name: str) -> None:
    parent = name.rpartition(".")[0]
    if parent and parent not in sys.modules:
        importlib.import_module(parent)
    sys.modules[name] = stub = _make_stub(name)
    if parent:
        setattr(sys.modules[parent], name.rpartition(".")[2], stub)
    _finder.packages.add(name)
    _stubbed.append(name)


def _bare_vllm() -> None:
    """Make ``vllm`` importable without running its ``__init__`` (it imports ``torch._inductor``)."""
    if "vllm" in sys.modules:
        return
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.submodule_search_locations is None:
        raise VLLMUnavailable("vllm is installed but its package cannot be found")
    mod = types.ModuleType("vllm", "vllm with its __init__ skipped by kvledger (it imports torch._inductor)")
    mod.__path__ = list(spec.submodule_search_locations)
    mod.__spec__ = spec
    mod.__file__ = spec.origin
    mod.__package__ = "vllm"
    sys.modules["vllm"] = mod


def _failing_module(err: BaseException, wanted: str) -> str | None:
    """The stubbable module whose import failed, read off the error chain, or ``None``."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        name = getattr(e, "name", None)
        if isinstance(e, ImportError) and isinstance(name, str):
            hit = _stubbable(name)
            if hit is not None and hit not in _finder.packages:
                return hit
        e = e.__cause__ or e.__context__
    # NOTE: an error raised while a stubbable module itself executes (vllm.parser running a stubbed xgrammar)
    # names no module: find the innermost stubbable module of the traceback.
    tb = err.__traceback__
    hit = None
    while tb is not None:
        mod = tb.tb_frame.f_globals.get("__name__")
        if isinstance(mod, str):
            found = _stubbable(mod)
            if found is not None and found not in _finder.packages:
                hit = found
        tb = tb.tb_next
    if hit is not None and hit != wanted:
        return hit
    return None


def _import_with_stubs(name: str) -> None:
    for _ in range(4 * len(STUBBABLE) + 4):
        try:
            importlib.import_module(name)
            return
        except Exception as err:  # NOTE: any import-time failure; only a stubbable culprit is retried
            culprit = _failing_module(err, name)
            if culprit is None:
                raise
            for m in [m for m in sys.modules if m == culprit or m.startswith(culprit + ".")]:
                del sys.modules[m]
            _stub(culprit)
    raise ImportError(f"importing {name}: too many stubs needed ({', '.join(_stubbed)})")


def import_vllm(modules: Sequence[str] = CORE_MODULES, *, any_version: bool = False) -> str:
    """Check the vLLM version, import ``modules`` with the CPU stubs they need; return the version.

    Raises :class:`VLLMUnavailable` when vLLM is not installed and
    :class:`VLLMVersionError` (naming the tested releases) when it is not one
    of them, unless ``any_version``. Idempotent: a second call stubs nothing new.
    """
    version = installed_version()
    if version not in TESTED and not any_version:
        raise VLLMVersionError(
            f"installed vLLM {version} is not a release the kvledger vLLM adapter was tested on "
            f"({', '.join(TESTED)}); install one, e.g. pip install --no-deps vllm=={TESTED[-1]}"
        )
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    _bare_vllm()
    for name in modules:
        _import_with_stubs(name)
    return version
