"""What the layout and import-graph contract tests read of the source: its Python files, a module's dotted name,
and the absolute names a file imports (anywhere in it, inside functions too; relative imports resolved against its
package)."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def py_files(*roots: str) -> list[Path]:
    """Every Python file under the repository folders ``roots``."""
    return [p for r in roots for p in (REPO / r).rglob("*.py") if "__pycache__" not in p.parts]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, *, type_checking: bool = True) -> set[str]:
    """Absolute names ``path`` imports: each ``from`` module and each name imported from it. ``type_checking``
    False leaves out the imports under ``if TYPE_CHECKING:`` (names for a checker, never loaded)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    if not type_checking:
        for guard in [n for n in ast.walk(tree) if isinstance(n, ast.If) and ast.unparse(n.test).endswith("TYPE_CHECKING")]:
            guard.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found |= {f"{base}.{a.name}" for a in node.names} | {base}
    return found
