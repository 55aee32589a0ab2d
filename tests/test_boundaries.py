"""What may import what (docs/architecture.md), enforced.

- The pure core (``algos``, ``diagnostics``, ``envs``) imports no Ray, at module level or
  inside a function.
- ``envs`` and the run config import no torch: a config is validated, and a bad one
  refused, without it; ``import tether`` registers the gymnasium ids without it.
- No import cycle among Tether's modules, counting function-level imports.
- The layer map: each package imports only the Tether packages its row of the layer
  table allows (``LAYER_MAP``, the same map the table states), counting function-level
  imports.
- Every name a config field accepts is a key of the registry that implements it.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import tether

ROOT = Path(tether.__file__).resolve().parent
PURE = ("algos", "diagnostics", "envs")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}


def _imports(module: str) -> list[tuple[str, list[str]]]:
    """(imported module, names) of every import statement in ``module``, at any depth,
    relative imports resolved."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((target, [alias.name for alias in node.names]))
    return out


def _tether_edges(module: str) -> set[str]:
    edges = set()
    for target, names in _imports(module):
        for name in names or [None]:
            if name and f"{target}.{name}" in MODULES:
                edges.add(f"{target}.{name}")
            elif target in MODULES:
                edges.add(target)
    edges.discard(module)
    return edges


# The layer table of docs/architecture.md, as data: package -> the Tether packages (or
# single modules) it may import. Its own package is always allowed. ``ALL`` = everything.
ALL = "everything"
LAYER_MAP: dict[str, set[str] | str] = {
    "tether": {"envs"},  # ``import tether`` registers the environments
    "seeds": set(),
    "lazy": set(),
    "sections": set(),
    "envs": {"sections"},
    "algos": {"lazy", "sections"},
    "agent": {"envs", "rollout.base", "seeds"},
    "diagnostics": {"algos", "agent", "lazy", "sections"},
    "policy": {"agent", "envs", "seeds", "sections"},
    "rollout": {"algos", "seeds", "sections"},
    "testing": {"actors", "algos", "diagnostics", "policy", "platform"},
    "store": set(),
    "analysis": {"diagnostics.proxies", "store"},
    "actors": {"agent", "algos", "diagnostics", "envs", "policy", "rollout", "seeds"},
    "dashboards": {"analysis", "diagnostics.proxies"},
    "platform": ALL,
}


def _package_of(module: str) -> str:
    """``tether.algos.vocab`` -> ``algos``; ``tether.seeds`` -> ``seeds``; ``tether``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_package_has_a_row_in_the_layer_map():
    packages = {_package_of(module) for module in MODULES}
    assert packages == set(LAYER_MAP), (
        f"not in the layer map: {sorted(packages - set(LAYER_MAP))}; "
        f"in the map but gone: {sorted(set(LAYER_MAP) - packages)}"
    )


def test_layer_map_is_respected():
    offenders = []
    for module in sorted(MODULES):
        package = _package_of(module)
        allowed = LAYER_MAP[package]
        if allowed == ALL:
            continue
        for target in sorted(_tether_edges(module)):
            if _package_of(target) == package or any(
                target == f"tether.{entry}" or target.startswith(f"tether.{entry}.")
                for entry in allowed
            ):
                continue
            offenders.append(f"{module} -> {target}")
    assert not offenders, (
        "imports the layer map (docs/architecture.md) does not allow: " + "; ".join(offenders)
    )


def _layer_table() -> dict[str, set[str] | str]:
    """The layer table of docs/architecture.md: package -> its "may import (Tether)" cell."""
    text = (ROOT.parent / "docs" / "architecture.md").read_text()
    table = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not re.fullmatch(r"`tether(\.\w+)?`", cells[1]):
            continue
        package = _package_of(cells[1].strip("`"))
        names = set(re.findall(r"`([\w.]+)`", cells[3]))
        table[package] = ALL if cells[3] == ALL else names
    return table


def test_layer_table_in_architecture_md_states_the_layer_map():
    assert _layer_table() == LAYER_MAP


@pytest.mark.parametrize("package", PURE)
def test_pure_core_never_imports_ray(package):
    offenders = [
        f"{module}: {target}"
        for module in MODULES
        if module.startswith(f"tether.{package}")
        for target, _ in _imports(module)
        if target.split(".")[0] == "ray"
    ]
    assert not offenders, offenders


def _fresh_import(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; report which heavy packages it loaded."""
    probe = (
        code + "\nimport json, sys\nprint(json.dumps({m: m in sys.modules for m in "
        "('torch', 'ray', 'transformers')}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_pure_core_modules_load_without_ray():
    modules = sorted(m for m in MODULES if m.split(".")[1:2] and m.split(".")[1] in PURE)
    loaded = _fresh_import(
        "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    )
    assert not loaded["ray"]


def test_envs_and_config_load_without_torch(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo:\n  kl_coef: -1\n")
    env_modules = sorted(m for m in MODULES if m.startswith("tether.envs"))
    loaded = _fresh_import(
        "import importlib\n"
        + "".join(f"importlib.import_module({m!r})\n" for m in env_modules)
        + "from tether.platform.config import ConfigError, load_config\n"
        + f"load_config({str(ROOT.parent / 'experiments' / 'quickstart.yaml')!r})\n"
        + f"try:\n    load_config({str(bad)!r})\nexcept ConfigError as exc:\n"
        + "    assert 'algo.kl_coef' in str(exc)\nelse:\n    raise SystemExit('accepted')\n"
    )
    assert not loaded["torch"] and not loaded["ray"] and not loaded["transformers"]


def test_import_tether_registers_the_envs_without_torch():
    loaded = _fresh_import(
        "import gymnasium, tether\n"
        "env = gymnasium.make('tether/FrozenLake-v0').unwrapped\n"
        "assert type(env).__name__ == 'FrozenLakeEnv'\n"
    )
    assert not loaded["torch"] and not loaded["ray"]


def test_no_import_cycles():
    graph = {module: _tether_edges(module) for module in MODULES}
    # Tarjan's strongly connected components: a component of two or more is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    assert not cycles, cycles


def _choices(model, field: str) -> set[str]:
    annotation = model.model_fields[field].annotation
    literal = next(
        a
        for a in (annotation, *typing.get_args(annotation))
        if typing.get_origin(a) is typing.Literal
    )
    return set(typing.get_args(literal))


def test_config_choices_are_the_registries():
    from tether.algos.advantages import ADVANTAGE_ESTIMATORS
    from tether.algos.filters import (
        FILTER_METRICS,
        FILTER_REWARDS,
        FILTER_STRATEGIES,
        LOSS_SCALINGS,
    )
    from tether.algos.losses import AGGREGATION_MODES, KL_ESTIMATORS, OFF_POLICY_CORRECTIONS
    from tether.algos.presets import PRESETS
    from tether.algos.settings import AlgoConfig, FilterConfig

    assert _choices(AlgoConfig, "advantage") == set(ADVANTAGE_ESTIMATORS)
    assert _choices(AlgoConfig, "loss_agg") == set(AGGREGATION_MODES)
    assert _choices(AlgoConfig, "kl_estimator") == set(KL_ESTIMATORS)
    assert _choices(AlgoConfig, "preset") == set(PRESETS)
    assert _choices(AlgoConfig, "off_policy") == {"none", *OFF_POLICY_CORRECTIONS}
    assert _choices(FilterConfig, "strategy") == set(FILTER_STRATEGIES)
    assert _choices(FilterConfig, "loss_scaling") == set(LOSS_SCALINGS)
    assert _choices(FilterConfig, "metric") == set(FILTER_METRICS)
    assert _choices(FilterConfig, "reward") == set(FILTER_REWARDS)
    from tether.platform.config import ModelConfig
    from tether.policy.tiny import TINY_SIZES

    assert _choices(ModelConfig, "size") == set(TINY_SIZES)


def _section_classes(model: type, seen: set) -> set:
    """Every pydantic model class nested in ``model``'s fields (unions, lists, optionals)."""
    from pydantic import BaseModel

    def walk(annotation) -> None:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation not in seen:
                seen.add(annotation)
                for field in annotation.model_fields.values():
                    walk(field.annotation)
        for arg in typing.get_args(annotation):
            walk(arg)

    walk(model)
    return seen


def test_every_config_section_is_a_strict_section():
    """One settings base (issue 31): every section of the run config and of a sweep spec,
    down to each alarm and act-mode response, refuses unknown keys and validates
    assignments the same way."""
    from tether.platform.config import TetherConfig
    from tether.platform.sweep.spec import SweepConfig
    from tether.sections import StrictSection

    classes = _section_classes(TetherConfig, set()) | _section_classes(SweepConfig, set())
    assert len(classes) > 20
    loose = sorted(c.__name__ for c in classes if not issubclass(c, StrictSection))
    assert not loose, f"config sections not derived from StrictSection: {loose}"


def test_platform_modules_and_functions_stay_small():
    """No module of tether/platform and its rooms over 450 lines, no function over 60
    (issue 31)."""
    long_files, long_functions = [], []
    for path in sorted((ROOT / "platform").rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > 450:
            long_files.append(f"{path.name}: {len(text.splitlines())}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 60:
                    long_functions.append(f"{path.name}:{node.lineno} {node.name} ({length})")
    assert not long_files and not long_functions, (long_files, long_functions)


def test_no_folder_holds_more_than_15_modules():
    """A folder of tether/ is a room a newcomer can take in: at most 15 modules."""
    crowded = {
        str(folder.relative_to(ROOT)): n
        for folder in [ROOT, *(p for p in ROOT.rglob("*") if p.is_dir())]
        if (n := len(list(folder.glob("*.py")))) > 15
    }
    assert not crowded, crowded
