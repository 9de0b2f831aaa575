"""The package's layering: only the command line (probust.cli) and the entry point import it."""

from __future__ import annotations

import ast
from pathlib import Path

import probust

PACKAGE = Path(probust.__file__).parent


def _imported_modules(tree: ast.AST, module: str) -> set[str]:
    """Absolute names of every module ``module``'s source imports (relative imports resolved)."""
    names = set()
    package = module.split(".")[:-1]  # the package a relative import starts from
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_nothing_outside_the_cli_imports_the_cli():
    offenders = []
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20
    for path in files:
        rel = path.relative_to(PACKAGE.parent)
        if rel.parts[1] == "cli" or rel.as_posix() == "probust/__main__.py":
            continue
        module = ".".join(rel.with_suffix("").parts)
        for name in _imported_modules(ast.parse(path.read_text(encoding="utf-8")), module):
            if name == "probust.cli" or name.startswith("probust.cli."):
                offenders.append(f"{rel}: {name}")
    assert not offenders, "the library imports the command line: " + "; ".join(offenders)


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def test_no_module_imports_a_private_name_of_another_package():
    """Packages share only public names: ``probust.data._idx`` or ``probust.models._checkpoint.x``
    is nobody's business outside ``probust.data`` / ``probust.models``. The small utility modules
    at the top (``probust._checks``, ``probust._user_model``, ...) are the package-wide exception."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent)
        module = ".".join(rel.with_suffix("").parts)  # probust.pkg.__init__ resolves relative imports right
        own = module.split(".")[1] if rel.parent != Path("probust") else ""
        for name in _imported_modules(ast.parse(path.read_text(encoding="utf-8")), module):
            parts = name.split(".")
            if parts[0] != "probust" or len(parts) < 3 or parts[1] == own:
                continue
            if any(_is_private(part) for part in parts[2:]):
                offenders.append(f"{rel}: {name}")
    assert not offenders, "private names imported across packages: " + "; ".join(offenders)
