"""The run is built above the loop: nothing in asr/training imports the recipe (asr.experiment), the builder
(asr.run) or anything else above it, and the package's __init__ hands on no names lazily."""

import ast
from pathlib import Path

from helpers import PROJECT_ROOT

ABOVE = ("asr.experiment", "asr.run", "asr.cli", "asr.inference", "asr.studies", "asr.train", "asr.study")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):  # those inside functions too
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_nothing_in_asr_training_imports_from_above_it():
    for path in sorted((PROJECT_ROOT / "asr" / "training").rglob("*.py")):
        above = sorted(name for name in _imports(path) if any(name == a or name.startswith(a + ".") for a in ABOVE))
        assert not above, f"{path.relative_to(PROJECT_ROOT)} imports {above}"


def test_the_training_package_hands_on_no_names_lazily():
    tree = ast.parse((PROJECT_ROOT / "asr" / "training" / "__init__.py").read_text())
    assert not [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"]
