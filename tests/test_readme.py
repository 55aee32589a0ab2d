"""The README's Python example runs as written (a micro run in a store of the test's own)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## From Python") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_is_short_and_its_example_is_too():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 120
    code = [line for line in readme_example().splitlines() if line.strip()]
    assert 8 <= len(code) <= 15


def test_the_readme_python_example_runs(tmp_path):
    code = readme_example()
    # the one change: the run's outputs and model cache in the test's directory, not /tmp
    where = f'"experiment.output_dir={tmp_path}/runs", "model.cache_dir={tmp_path}/models", '
    assert code.count('["experiment.seed=3", ') == 1
    code = code.replace('["experiment.seed=3", ', '["experiment.seed=3", ' + where)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("FINISHED {"), out.stdout
    steps = [int(line.split()[0]) for line in lines[1:]]
    assert steps and steps == sorted(steps), out.stdout  # the proxy's history, by iteration
