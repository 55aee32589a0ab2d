"""``tether analyze``: the declared experiments read from their committed records.

``tether analyze pilot`` applies the collapse pilot's protocol (docs/collapse.md) to the
records its parts exported; the rules live in ``tether.analysis.pilot``, this module only
prints them.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from .console import console, fail

analyze_app = typer.Typer(
    help="Read a declared experiment's committed records by its protocol.",
    no_args_is_help=True,
)


def _num(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _yes(value) -> str:
    return {True: "yes", False: "no", None: "missing"}[value]


COLUMNS = (
    "candidate",
    "seed",
    "zero-RV 16-25",
    "q1 SNR @20/@25",
    "precond.",
    "probe MI first→last",
    "drop",
    "sep.",
    "H last ≥ first low",
    "format min",
    "regime",
    "gap [95 % CI]",
    "val success",
)


def _cells(row: dict) -> list[str]:
    """One run's row of the pilot table, after its candidate's name."""
    pre, col = row["precondition"], row["collapse"]
    mi = col.get("mi") or [None, None]
    gap = col.get("gap") or [None, None, None]
    h_last, h_low = col.get("h_last"), col.get("h_first_low")
    return [
        str(row["seed"]),
        _num(pre["zero_rv_mean"], 1),
        "/".join(_num(v, 2) for v in pre["low_snr"]),
        _yes(pre["holds"]),
        f"{_num(mi[0])}→{_num(mi[1])}",
        _num(col.get("mi_drop")),
        _yes(col.get("separated")),
        _yes(None if None in (h_last, h_low) else h_last >= h_low),
        _num(col.get("format_ok_min"), 2),
        str(col["regime"] or "missing"),
        f"{_num(gap[0])} [{_num(gap[1])}, {_num(gap[2])}]",
        "→".join(_num(v) for v in row["val"]) or "-",
    ]


@analyze_app.command("pilot")
def pilot(
    records: list[Path] = typer.Argument(
        ..., help="Pilot records (experiments/collapse_pilot/records/*.json.gz)."
    ),
):
    """The collapse pilot by its protocol (docs/collapse.md): each run's readings, each
    candidate's qualification.

    Per run: the precondition by mid-run, the probe's MI change, the entropy and format
    checks, the regime (template, low_entropy, format, none) and where the MI went.
    """
    from ..analysis import pilot as rules

    try:
        loaded = [rules.load(path) for path in records]
    except ValueError as err:
        fail(f"analyze pilot: {err}")
    verdicts = rules.read(loaded)
    table = Table(title="Collapse pilot (docs/collapse.md)")
    for column in COLUMNS:
        table.add_column(column)
    for name, result in verdicts.items():
        for row in result["rows"]:
            table.add_row(name, *_cells(row))
    console.print(table)
    for name, result in verdicts.items():
        state = {True: "qualifies", False: "does not qualify", None: "incomplete"}
        console.print(
            f"{name}: precondition in {result['precondition_held']} of {result['runs']}, "
            f"template collapse in {result['collapsed']} of {result['runs']}: "
            f"{state[result['qualifies']]}",
            highlight=False,
        )
