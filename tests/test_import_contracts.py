"""The package layout holds: the import contracts in ``pyproject.toml`` (SIP a protocol library, the codecs and each
carrier's wire codec free of I/O) are kept; two more, read from the carrier registry so that a carrier added
to it is covered at once, hold here (the call logic blind to carriers, carriers out of each other's packages);
and no module imports itself back through others, not even lazily inside a function."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import grimp

from callbridge.carriers import CARRIERS

ROOT = Path(__file__).resolve().parent.parent


def test_the_import_contracts_are_kept() -> None:
    """In a process of its own: import-linter reconfigures the logging of the process it runs in."""
    script = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))"
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 kept, 0 broken" in result.stdout, result.stdout


def _graph() -> grimp.ImportGraph:
    sys.path.insert(0, str(ROOT))
    try:
        return grimp.build_graph("callbridge", cache_dir=None, exclude_type_checking_imports=True)
    finally:
        sys.path.remove(str(ROOT))


def test_the_call_logic_imports_no_carriers_package() -> None:
    """``callbridge.bridge`` imports only what carriers share (``carriers.base``) and the registry (the app mounts
    it); never a carrier's own package."""
    graph = _graph()
    imported = [
        spec.package for spec in CARRIERS if graph.direct_import_exists(importer="callbridge.bridge", imported=spec.package, as_packages=True)
    ]
    assert imported == []


def test_no_carrier_reaches_into_another_but_the_one_it_builds_on() -> None:
    """No chain of imports leads from one carrier's package into another's, but from a dialect to the carrier its
    spec ``builds_on``. The registry's own imports of every carrier are not such a chain: the settings compose every
    carrier's section from it, and the generic ``/media`` URL asks it which carriers there are."""
    graph = _graph()
    graph.remove_import(importer="callbridge.config", imported="callbridge.carriers")
    for module in graph.find_children("callbridge.carriers.generic"):
        if graph.direct_import_exists(importer=module, imported="callbridge.carriers"):
            graph.remove_import(importer=module, imported="callbridge.carriers")
    reached = [
        (spec.name, other.name, graph.find_shortest_chain(spec.package, other.package, as_packages=True))
        for spec in CARRIERS
        for other in CARRIERS
        if other is not spec and other.name != spec.builds_on
        and graph.chain_exists(importer=spec.package, imported=other.package, as_packages=True)
    ]
    assert reached == []


def test_the_carrier_contracts_see_a_forbidden_import() -> None:
    """The checks above find what they look for: a carrier module that imports another's is reported."""
    graph = _graph()
    graph.add_import(importer="callbridge.carriers.plivo.http", imported="callbridge.carriers.exotel.http")
    assert graph.chain_exists(importer="callbridge.carriers.plivo", imported="callbridge.carriers.exotel", as_packages=True)
    graph.add_import(importer="callbridge.bridge.media", imported="callbridge.carriers.plivo.wire")
    assert graph.direct_import_exists(importer="callbridge.bridge", imported="callbridge.carriers.plivo", as_packages=True)


def _layout() -> ModuleType:
    """``bench/layout.py``: a script, not a package's module, loaded by its path (registered, as its dataclasses
    need)."""
    layout = sys.modules.get("bench_layout")
    if layout is None:
        spec = importlib.util.spec_from_file_location("bench_layout", ROOT / "bench" / "layout.py")
        assert spec is not None and spec.loader is not None
        layout = sys.modules["bench_layout"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(layout)
    return layout


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module: ``bench/layout.py``'s finder, on grimp's graph."""
    found: list[list[str]] = _layout().circles({module: set(graph.find_modules_directly_imported_by(module)) for module in graph.modules})
    return found


def test_no_import_circle() -> None:
    """No module imports itself back at run time, at module level or lazily (inside a function). Imports under
    ``if TYPE_CHECKING:`` are left out, as ``lint-imports`` leaves them out (``exclude_type_checking_imports``):
    they never run, and they are how a record like ``CarrierSpec`` names the bridge it is handed without
    importing it (the settings read the carrier registry, whose specs annotate with ``Settings``)."""
    assert _cycles(_graph()) == []


def test_no_import_circle_even_through_type_only_imports() -> None:
    """Not even an import under ``if TYPE_CHECKING:`` closes a circle (issue #39; ``bench/layout.py`` counts them):
    the carrier registry names what it needs of the bridge and the simulators by reference, and its types are its
    own; logging takes its settings as a protocol."""
    assert _layout().measure(ROOT).circles == []


def test_the_cycle_finder_finds_a_circle(tmp_path: Path) -> None:
    package = tmp_path / "circle"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from circle import b\n")
    (package / "b.py").write_text("from circle import c\n")
    (package / "c.py").write_text("import circle.a\n")
    (package / "d.py").write_text("import circle.a\n")
    sys.path.insert(0, str(tmp_path))
    try:
        graph = grimp.build_graph("circle", cache_dir=None)
    finally:
        sys.path.remove(str(tmp_path))
    assert _cycles(graph) == [["circle.a", "circle.b", "circle.c"]]  # a imports b lazily, inside a function


def test_only_a_carriers_own_package_names_it() -> None:
    """Issue 17's rule, kept: ``git grep -il <carrier> -- callbridge`` lists the carrier's package and the registry
    (and the package of a carrier that builds on it); shared code reads what it needs from the spec."""
    sources = {path: path.read_text(encoding="utf-8").lower() for path in (ROOT / "callbridge").rglob("*.py")}
    registry = ROOT / "callbridge" / "carriers" / "__init__.py"
    strays: dict[str, list[str]] = {}
    for spec in CARRIERS:
        if spec.name in ("generic", "sip", "webrtc"):  # words every module may use: the generic URL; SIP and WebRTC, protocols
            continue
        allowed = [ROOT / "callbridge" / "carriers" / other.name for other in CARRIERS if other is spec or other.builds_on == spec.name]
        strays[spec.name] = sorted(
            str(path.relative_to(ROOT)) for path, text in sources.items()
            if spec.name in text and path != registry and not any(folder in path.parents for folder in allowed)
        )  # fmt: skip
    assert strays == {name: [] for name in strays}


def test_no_carrier_module_decides_admission_or_draining_itself() -> None:
    """Every carrier asks the answer desk (``services.desk``) and renders what it says: none reads the admission
    book, the drain's state or the fleet's moving calls itself, or turns a refusal into "draining" or "capacity"."""
    decides = (
        "services.admits(", "moving_elsewhere(", "services.draining", "desk.draining:", "services.admission", '"draining" if',
        '"capacity"',
    )  # fmt: skip
    found = [
        f"{path.relative_to(ROOT)}: {needle}"
        for path in sorted((ROOT / "callbridge" / "carriers").rglob("*.py"))
        for needle in decides
        if needle in path.read_text()
    ]
    assert found == []
