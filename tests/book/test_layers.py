"""The package's layers hold: ``core < theory < {data, models} < adapt < chapters``.

Every import in ``src/fmlab`` (function-level ones included) is read with :mod:`ast`
(:func:`fmlab.repro.package_imports`, the reader behind the cache keys) and checked
against that order; a chapter module imports no other chapter.
"""

import ast
from pathlib import Path

import pytest

from fmlab.repro import import_closure, module_parts, package_imports

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "fmlab"

# The rank of each layer: a module may import layers of lower or equal rank only
# (data and models share a rank but may not import each other).
RANK = {"core": 0, "theory": 1, "data": 2, "models": 2, "adapt": 3, "chapters": 4}


def layer(parts: tuple[str, ...]) -> str:
    """The layer of a module given as its dotted parts below ``fmlab``."""
    return parts[0] if parts and parts[0] in RANK else "core"


def violations(root: Path = PACKAGE) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        here = module_parts(path, root)
        src_layer = layer(here)
        for line, target in package_imports(path, root):
            dst_layer = layer(target)
            where = f"{path.relative_to(root)}:{line} imports fmlab.{'.'.join(target)}"
            if RANK[dst_layer] > RANK[src_layer]:
                bad.append(f"{where} ({src_layer} may not import {dst_layer})")
            elif {src_layer, dst_layer} == {"data", "models"}:
                bad.append(f"{where} (data and models do not import each other)")
            elif src_layer == dst_layer == "chapters" and len(here) > 1:
                if len(target) > 1 and chapter_of(target[1]) != chapter_of(here[1]):
                    bad.append(f"{where} (a chapter imports no other chapter)")
    return bad


def chapter_of(module: str) -> str:
    """``ch4_kernel_view`` -> ``ch4``."""
    return module.split("_")[0]


def test_every_import_follows_the_layers():
    assert violations() == []


def test_the_checker_sees_a_violation(tmp_path):
    """An upward import, a function-level one and a cross-chapter one are caught."""
    pkg = tmp_path / "fmlab"
    for d in ("theory", "chapters"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "theory" / "x.py").write_text("def f():\n    from ..adapt import probes\n")
    (pkg / "chapters" / "ch1_a.py").write_text("from .ch2_b import g\n")
    (pkg / "chapters" / "ch2_b.py").write_text("from .ch2_figures import h\n")
    found = violations(pkg)
    assert any("theory/x.py:2" in v and "adapt" in v for v in found)
    assert any("ch1_a.py:1" in v and "other chapter" in v for v in found)
    assert not any("ch2_b.py" in v for v in found)


@pytest.mark.parametrize("name", ["core", "theory", "data", "models", "adapt"])
def test_each_layer_exists(name):
    assert name == "core" or (PACKAGE / name / "__init__.py").exists()


def test_each_public_name_is_defined_once():
    """No two modules define the same public function or class (no homonyms), and no
    notebook defines a class that shadows one of the package's."""
    import json

    where: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                if not node.name.startswith("_"):
                    where.setdefault(node.name, []).append(
                        str(path.relative_to(PACKAGE))
                    )
    twice = {name: files for name, files in where.items() if len(files) > 1}
    assert twice == {}
    notebooks = PACKAGE.parents[1] / "notebooks"
    for nb in sorted(notebooks.glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            for node in ast.walk(ast.parse("".join(cell["source"]).replace("%", "#"))):
                if isinstance(node, ast.ClassDef):
                    assert node.name not in where, f"{nb.name} shadows {node.name}"


def notebook_imports(notebook: Path) -> set[tuple[str, ...]]:
    """The fmlab modules a notebook imports, as parts below ``fmlab``."""
    import json

    found = set()
    for cell in json.loads(notebook.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        lines = "".join(cell["source"]).splitlines()
        code = "\n".join("" if ln.lstrip()[:1] in "%!" else ln for ln in lines)
        for node in ast.walk(ast.parse(code)):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                parts = tuple(name.split("."))
                if parts[0] == "fmlab":
                    found.add(parts[1:])
    return found


@pytest.mark.parametrize(
    "notebook",
    sorted((PACKAGE.parents[1] / "notebooks").glob("*.ipynb")),
    ids=lambda p: p.stem,
)
def test_each_page_imports_only_what_its_outputs_key_hashes(notebook):
    """A page's execution-cache key (``code_fingerprint(chapter, outputs=True)``)
    hashes the import closure of its chapter's modules, figures included; a module
    that the page imported from outside that closure would leave the key stale."""
    chapter = f"ch{int(notebook.name[:2])}"
    own = sorted((PACKAGE / "chapters").glob(f"{chapter}_*.py"))
    hashed = {module_parts(p, PACKAGE) for p in import_closure(own, PACKAGE)}
    modules = {
        parts
        for parts in notebook_imports(notebook)
        if (PACKAGE.joinpath(*parts).with_suffix(".py")).exists()
        or (PACKAGE.joinpath(*parts) / "__init__.py").exists()
    }
    assert sorted(modules - hashed) == []
