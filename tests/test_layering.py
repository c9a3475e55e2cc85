"""Which way the imports run where issue 79 (step 6) set them: read with ``ast``, every import counted
(those inside functions and under TYPE_CHECKING too), so a loop cannot hide behind a late import."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imported(path: Path) -> set[str]:
    """The dotted names ``path`` imports (``from a.b import c`` gives ``a.b`` and ``a.b.c``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def imports_any(path: Path, modules: list[str]) -> list[str]:
    return sorted(name for name in imported(path) for module in modules if name == module or name.startswith(module + "."))


# The library packages the commands use: none of them imports the command line back.
@pytest.mark.parametrize("package", ["asr/studies", "asr/checkpoints", "asr/decoding", "asr/inference"])
def test_a_library_package_never_imports_the_command_line(package):
    for path in sorted((ROOT / package).rglob("*.py")):
        assert not imports_any(path, ["asr.cli"]), f"{path.relative_to(ROOT)} imports {imports_any(path, ['asr.cli'])}"


# asr/inference from the bottom up: each module imports only those before it (Recogniser.transcribe runs the
# strategies, so they see it through RecogniserProtocol, never its module).
INFERENCE_ORDER = ["config", "interface", "segmentation", "strategies", "adaptation", "settings", "recogniser"]


@pytest.mark.parametrize("position", range(len(INFERENCE_ORDER)))
def test_the_inference_modules_import_only_those_below_them(position):
    name = INFERENCE_ORDER[position]
    above = [f"asr.inference.{other}" for other in INFERENCE_ORDER[position + 1:]]
    assert not imports_any(ROOT / "asr" / "inference" / f"{name}.py", above), name


@pytest.mark.parametrize("old, new", [("asr.checkpointing", "asr.checkpoints.io"),
                                      ("asr.averaging", "asr.checkpoints.averaging"),
                                      ("asr.metrics", "asr.decoding.scoring")])
def test_an_old_module_path_hands_on_the_same_objects(old, new):
    """Kept for old imports (asr/training/ still writes them): the same functions, not copies."""
    import importlib

    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    public = [name for name in vars(new_module) if not name.startswith("_")
              and getattr(getattr(new_module, name), "__module__", None) == new]
    assert public
    for name in public:
        assert getattr(old_module, name) is getattr(new_module, name), name
