"""Every third-party module the packages import is declared in pyproject.toml.

An install from the project's own metadata (``pip install .`` or
``pip install '.[etl]'``, what ``scripts/serve`` does) must be enough for
every module of it to import and run: a module that works here only because
something else happened to install its dependency fails on a fresh machine.
The check reads the source (every ``import``, also those inside functions,
which only fail when that code runs) and maps each top-level module name to
the distribution that provides it in this environment:

* ``spark_etl`` may use the core dependencies and the ``etl`` extra;
* the other packages (gateway, broker_core, ledger_contract, routes,
  xml_schemas) the core dependencies only;
* an import guarded by ``except ImportError`` (an optional feature) must
  still be declared, in the core dependencies or in some extra.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PACKAGES = ("broker_core", "gateway", "ledger_contract", "routes", "spark_etl", "xml_schemas")
#: the packages with Python code (routes and xml_schemas hold data files)
CODE_PACKAGES = [p for p in PACKAGES if next((ROOT / p).rglob("*.py"), None) is not None]
#: the extras each package may use besides the core dependencies
EXTRAS_OF = {"spark_etl": ("etl",)}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(extras: tuple[str, ...] = ()) -> set[str]:
    """Normalised names of the core dependencies and of *extras* (following
    the project's references to its own extras, ``b2bgw[etl]``)."""
    project = PYPROJECT["project"]
    own = _norm(project["name"])
    names: set[str] = set()
    todo = [*project.get("dependencies", ())] + [r for e in extras for r in project["optional-dependencies"][e]]
    seen_extras = set(extras)
    while todo:
        req = Requirement(todo.pop())
        if _norm(req.name) == own:
            for extra in req.extras - seen_extras:
                seen_extras.add(extra)
                todo += project["optional-dependencies"][extra]
            continue
        names.add(_norm(req.name))
    return names


@dataclass(frozen=True)
class Use:
    module: str  # top-level module name
    file: str
    line: int
    guarded: bool  # inside ``try: ... except ImportError``


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(t, ast.Name) and t.id in ("ImportError", "ModuleNotFoundError", "Exception") for t in types)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, root: Path = ROOT) -> list[Use]:
    """The absolute imports of a source file (``if TYPE_CHECKING:`` blocks,
    never run, left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    uses: list[Use] = []
    rel = str(path.relative_to(root))

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child, guarded)
            return
        if isinstance(node, ast.Try):
            inner = guarded or any(_catches_import_error(h) for h in node.handlers)
            for child in node.body:
                visit(child, inner)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, guarded)
            return
        if isinstance(node, ast.Import):
            uses.extend(Use(a.name.split(".")[0], rel, node.lineno, guarded) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            uses.append(Use(node.module.split(".")[0], rel, node.lineno, guarded))
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(tree, False)
    return uses


def third_party(uses: list[Use]) -> list[Use]:
    return [u for u in uses if u.module not in sys.stdlib_module_names and u.module not in PACKAGES]


def distributions_of(module: str) -> set[str]:
    return {_norm(d) for d in importlib.metadata.packages_distributions().get(module, ())}


def test_the_code_packages_are_found():
    assert {"broker_core", "gateway", "ledger_contract", "spark_etl"} <= set(CODE_PACKAGES)


def test_the_declaration_reader_follows_the_projects_own_extras():
    """``test`` names ``b2bgw[etl]``: its closure holds the etl extra's
    dependencies, and the core ones are always there."""
    etl = declared(("etl",))
    assert {"pyspark", "pyarrow", "tqdm", "sqlalchemy"} <= etl
    assert "pyspark" not in declared()
    assert {"pytest", "pyspark", "tqdm"} <= declared(("test",))


def test_the_import_walk_sees_function_level_and_guarded_imports(tmp_path):
    """A dependency imported inside a function only fails when that code
    runs (a progress bar on a terminal): the walk must see it; one under
    ``except ImportError`` is marked optional; ``TYPE_CHECKING`` is skipped."""
    src = tmp_path / "m.py"
    src.write_text(
        "from __future__ import annotations\nimport os\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import numpy\n"
        "try:\n    import uvloop\nexcept ImportError:\n    uvloop = None\n"
        "def bar():\n    from tqdm import tqdm\n    return tqdm\n"
        "from .sibling import x\nimport ledger_contract.facts\n"
    )
    got = {(u.module, u.guarded) for u in third_party(imports_of(src, tmp_path))}
    assert got == {("uvloop", True), ("tqdm", False)}


@pytest.mark.parametrize("package", CODE_PACKAGES)
def test_every_imported_distribution_is_declared(package):
    allowed = declared(EXTRAS_OF.get(package, ()))
    anywhere = declared(tuple(PYPROJECT["project"]["optional-dependencies"]))
    problems = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for use in third_party(imports_of(path)):
            provided_by = distributions_of(use.module)
            if not provided_by:
                problems.append(f"{use.file}:{use.line}: {use.module!r} is provided by no installed distribution")
                continue
            ok = provided_by & (anywhere if use.guarded else allowed)
            if not ok:
                where = (
                    "in some extra"
                    if use.guarded
                    else (
                        "in [project] dependencies"
                        + "".join(f" or the {e!r} extra" for e in EXTRAS_OF.get(package, ()))
                    )
                )
                problems.append(
                    f"{use.file}:{use.line}: imports {use.module!r} ({' / '.join(sorted(provided_by))}), "
                    f"which pyproject.toml does not declare {where}"
                )
    assert not problems, "\n".join(problems)
