"""Where SGLang's C++ radix tree is built from (``legacy_cpp.one_build_per_source``): releases that ship the same
sources share one copy and one build; different sources get their own; every other extension is left alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvledger.contracts.adapters.sglang import legacy_cpp


def _release(root: Path, name: str, binding: str) -> list[str]:
    """A release's ``cpp_radix_tree`` directory (two sources and a header, as SGLang ships it) and the sources its
    ``radix_tree.py`` passes to ``load``."""
    here = root / name / "cpp_radix_tree"
    here.mkdir(parents=True)
    (here / "tree_v2_binding.cpp").write_text(binding)
    (here / "tree_v2.cpp").write_text("int tree() { return 1; }\n")
    (here / "tree_v2.h").write_text("int tree();\n")
    (here / "radix_tree.py").write_text("# not a source\n")
    return [str(here / "tree_v2_binding.cpp"), str(here / "tree_v2.cpp")]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, list[str], dict[str, Any]]]:
    """torch's ``load`` recorded instead of run, under an extension directory of the test's own."""
    seen: list[tuple[str, list[str], dict[str, Any]]] = []
    ext = pytest.importorskip("torch.utils.cpp_extension")
    monkeypatch.setattr(ext, "load", lambda name, sources, **kw: seen.append((name, list(sources), kw)) or name)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    return seen


def _load(name: str, sources: list[str], **kw: Any) -> Any:
    """``load`` as SGLang's module calls it: read from ``torch.utils.cpp_extension`` while the module imports."""
    with legacy_cpp.one_build_per_source():
        from torch.utils.cpp_extension import load

        return load(name=name, sources=sources, **kw)


def test_the_same_sources_in_two_environments_share_one_copy_and_build(
    calls: list[tuple[str, list[str], dict[str, Any]]], tmp_path: Path
) -> None:
    a = _release(tmp_path, "sglang-a", "// binding\n")
    b = _release(tmp_path, "sglang-b", "// binding\n")
    _load(legacy_cpp.CPP_EXTENSION, a, extra_cflags=["-O3"])
    _load(legacy_cpp.CPP_EXTENSION, b, extra_cflags=["-O3"])
    (name_a, src_a, kw_a), (name_b, src_b, kw_b) = calls
    assert name_a == name_b == legacy_cpp.CPP_EXTENSION
    assert src_a == src_b and kw_a == kw_b, (src_a, src_b, kw_a, kw_b)
    shared = Path(src_a[0]).parent
    assert shared.is_relative_to(tmp_path / "ext") and kw_a["build_directory"] == str(shared / "build")
    assert kw_a["extra_cflags"] == ["-O3"]  # NOTE: SGLang's own arguments pass unchanged
    assert sorted(p.name for p in shared.iterdir()) == ["build", "tree_v2.cpp", "tree_v2.h", "tree_v2_binding.cpp"]
    assert (shared / "tree_v2_binding.cpp").read_text() == "// binding\n"


def test_other_sources_get_a_copy_and_a_build_of_their_own(
    calls: list[tuple[str, list[str], dict[str, Any]]], tmp_path: Path
) -> None:
    _load(legacy_cpp.CPP_EXTENSION, _release(tmp_path, "sglang-a", "// binding\n"))
    _load(legacy_cpp.CPP_EXTENSION, _release(tmp_path, "sglang-b", "// another binding\n"))
    (_, src_a, kw_a), (_, src_b, kw_b) = calls
    assert Path(src_a[0]).parent != Path(src_b[0]).parent and kw_a["build_directory"] != kw_b["build_directory"]
    assert Path(src_b[0]).read_text() == "// another binding\n"


def test_another_extension_or_a_chosen_build_directory_is_left_alone(
    calls: list[tuple[str, list[str], dict[str, Any]]], tmp_path: Path
) -> None:
    sources = _release(tmp_path, "sglang-a", "// binding\n")
    _load("some_other_ext", sources)
    _load(legacy_cpp.CPP_EXTENSION, sources, build_directory=str(tmp_path / "mine"))
    assert calls == [
        ("some_other_ext", sources, {}),
        (legacy_cpp.CPP_EXTENSION, sources, {"build_directory": str(tmp_path / "mine")}),
    ]
    from torch.utils import cpp_extension

    assert getattr(cpp_extension.load, "__name__", "") == "<lambda>"  # NOTE: put back after the import
