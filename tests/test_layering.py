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


def test_the_root_holds_commands_and_no_library_twins():
    """The library's old homes at the asr/ root are gone (issue 79, step 6): checkpoints, averaging, WER
    scoring and the learning rate live in their packages, and nothing imports the old paths."""
    for old in ("checkpointing", "averaging", "metrics", "schedulers"):
        assert not (ROOT / "asr" / f"{old}.py").exists(), old
        for path in (ROOT / "asr").rglob("*.py"):
            assert not imports_any(path, [f"asr.{old}"]), (path, old)



@pytest.mark.parametrize("package", ["asr/models", "asr/data", "asr/decoding", "asr/synthesis", "features"])
def test_models_data_and_decoding_never_import_training(package):
    """Training is built above models, data and decoding (asr.run composes them); a model's key that names a
    training thing (model.drophead_schedule, a schedule shape) is checked by the recipe's reader, asr.experiment."""
    offenders = {str(path.relative_to(ROOT)): imports_any(path, ["asr.training", "asr.run", "asr.experiment"])
                 for path in sorted((ROOT / package).rglob("*.py"))}
    assert {path: names for path, names in offenders.items() if names} == {}
