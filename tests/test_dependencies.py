"""An installed transformers outside Tether's declared range is refused before a run
starts, in one line (an older one would otherwise fail mid-run inside an actor)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from typer.testing import CliRunner

from tether.platform.cli.main import app
from tether.platform.environment import DependencyError, check_installed


def _declared() -> Requirement:
    return next(
        req
        for req in map(Requirement, metadata.requires("tether"))
        if req.name == "transformers" and req.marker is None
    )


def _pretend_installed(monkeypatch, version: str) -> None:
    real = metadata.version
    monkeypatch.setattr(
        metadata, "version", lambda name: version if name == "transformers" else real(name)
    )


def test_the_installed_transformers_is_accepted():
    assert metadata.version("transformers") in _declared().specifier
    check_installed("transformers")


@pytest.mark.parametrize("below", ["4.0.0", "just below the floor"])
def test_an_older_transformers_is_refused_with_what_to_install(monkeypatch, below):
    spec = str(_declared().specifier)
    floor = Version(next(s.version for s in _declared().specifier if s.operator == ">="))
    version = below if below[0].isdigit() else f"{floor.major}.{floor.minor - 1}.99"
    _pretend_installed(monkeypatch, version)
    with pytest.raises(DependencyError) as info:
        check_installed("transformers")
    assert str(info.value) == (
        f"transformers {version} is installed but Tether needs transformers{spec}; "
        f"run: pip install 'transformers{spec}'"
    )


def test_a_newer_prerelease_is_accepted(monkeypatch):
    _pretend_installed(monkeypatch, "99.0.0.dev0")
    check_installed("transformers")


def test_tether_run_refuses_it_before_anything_starts(monkeypatch, tmp_path):
    _pretend_installed(monkeypatch, "4.0.0")
    out = tmp_path / "runs"
    quickstart = Path(__file__).resolve().parents[1] / "experiments" / "quickstart.yaml"
    result = CliRunner().invoke(app, ["run", str(quickstart), f"experiment.output_dir={out}"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: transformers 4.0.0 is installed")
    assert not out.exists()  # no warm start, no Ray, no run directory
