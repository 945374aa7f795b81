"""The monorepo's own promises: installed commands work and the dependency rule holds."""

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

PACKAGES = {
    "xtrain": REPO_ROOT / "packages/engine",
    "deeptrace": REPO_ROOT / "packages/deeptrace",
    "clusterx": REPO_ROOT / "packages/clusterx",
    "xtop": REPO_ROOT / "apps/tui",
}
# What each package may import among the four (docs/architecture.md, "Dependency rule").
# clusterx is the base: it imports none of the others, and its record, states and atomic write serve them all.
ALLOWED = {
    "xtrain": {"xtrain", "deeptrace", "clusterx"},
    "deeptrace": {"deeptrace", "clusterx"},
    "clusterx": {"clusterx"},
    "xtop": {"xtop", "clusterx", "deeptrace"},
}


def imported_top_level_modules(src: Path) -> set[str]:
    found: set[str] = set()
    for path in src.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_dependency_rule(package: str) -> None:
    imported = imported_top_level_modules(PACKAGES[package] / "src")
    forbidden = (imported & set(PACKAGES)) - ALLOWED[package]
    assert not forbidden, f"{package} imports {sorted(forbidden)}, which the dependency rule forbids"


@pytest.mark.parametrize("package", ["deeptrace", "clusterx", "xtop"])
def test_no_torch_outside_the_engine(package: str) -> None:
    assert "torch" not in imported_top_level_modules(PACKAGES[package] / "src")


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_declared_dependencies_cover_imports(package: str) -> None:
    """Every third-party module a package imports is declared in its own pyproject.toml."""
    project = tomllib.loads((PACKAGES[package] / "pyproject.toml").read_text())["project"]
    declared = {_requirement_name(r) for r in project["dependencies"]}
    for extra in project.get("optional-dependencies", {}).values():
        declared |= {_requirement_name(r) for r in extra}
    module_to_distribution = {"pynvml": "nvidia-ml-py", "yaml": "pyyaml"}
    imported = imported_top_level_modules(PACKAGES[package] / "src") - {package}
    third_party = {m for m in imported if m not in sys.stdlib_module_names}
    missing = {m for m in third_party if _normalise(module_to_distribution.get(m, m)) not in declared}
    assert not missing, f"{package} imports {sorted(missing)} without declaring them"


def _requirement_name(requirement: str) -> str:
    for stop in "<>=!~[; ":
        requirement = requirement.split(stop, maxsplit=1)[0]
    return _normalise(requirement)


def _normalise(name: str) -> str:
    """Distribution names compare without case and with '-' for '_' (flash_attn is the module of flash-attn)."""
    return name.strip().lower().replace("_", "-")


@pytest.mark.parametrize("command", sorted(PACKAGES))
def test_console_script_help(command: str) -> None:
    exe = Path(sys.executable).parent / command
    result = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "Usage:" in result.stdout


def test_dashboard_imports_no_torch() -> None:
    code = "import sys, xtop.cli; assert 'torch' not in sys.modules, 'xtop pulled in torch'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
