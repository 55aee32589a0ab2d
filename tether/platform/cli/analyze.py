"""``tether analyze``: the declared experiments read by their protocols, and the
instruments checked against known answers.

- ``tether analyze pilot``: the collapse pilot's protocol (docs/collapse.md) applied to the
  records its parts exported (the rules in ``tether.analysis.pilot``; this module prints);
- ``tether analyze paper``: the reproduction families (docs/reproduction.md), every option
  of ``tether.analysis.paper`` passed through;
- ``tether analyze known-answer``: the known-answer harness (``tether.testing.harness``).
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from .console import console, fail

analyze_app = typer.Typer(
    help="Read declared experiments by their protocols; check the instruments.",
    no_args_is_help=True,
)
#: A command whose options belong to the argparse program it runs (``--help`` included).
PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


@analyze_app.command("paper", context_settings=PASSTHROUGH, add_help_option=False)
def paper(ctx: typer.Context):
    """The reproduction families (docs/reproduction.md); --help lists the options."""
    from ...analysis.paper import main

    raise typer.Exit(main(list(ctx.args), prog="tether analyze paper"))


@analyze_app.command("known-answer")
def known_answer():
    """The MI proxies on policies whose answer is known: one table."""
    from ...testing.harness import main

    main()


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


def _wide():
    """A console of at least 180 columns: a pipe's 80 would cut every cell of a run's row."""
    from rich.console import Console

    return Console(width=max(180, console.width))


@analyze_app.command("pilot")
def pilot(
    records: list[Path] = typer.Argument(
        ..., help="Pilot records (experiments/collapse_pilot/records/*.json.gz)."
    ),
    lead: bool = typer.Option(
        False,
        "--lead-times",
        help="Also each alarm's lead over the fall of held-out success, and the share of "
        "collapsing runs warned first.",
    ),
):
    """The collapse pilot by its protocol (docs/collapse.md).

    Per run: the precondition by mid-run, the probe's MI change, the entropy and format
    checks, the regime (template, low_entropy, format, none) and where the MI went.
    """
    from ...analysis import pilot as rules

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
            table.add_row(name.removeprefix("tether-collapse-pilot-"), *_cells(row))
    _wide().print(table)
    for name, result in verdicts.items():
        state = {True: "qualifies", False: "does not qualify", None: "incomplete"}
        console.print(
            f"{name}: precondition in {result['precondition_held']} of {result['runs']}, "
            f"template collapse in {result['collapsed']} of {result['runs']}: "
            f"{state[result['qualifies']]}",
            highlight=False,
        )
    if lead:
        _print_lead_times(rules, loaded)


def _print_lead_times(rules, loaded: list[dict]) -> None:
    rows = rules.lead_times(loaded)
    table = Table(title="Alarm lead times (docs/collapse.md)")
    for column in (
        "candidate",
        "seed",
        "regime",
        "alarm",
        "at",
        "success fell at",
        "lead",
        "success at alarm",
        "success at end",
    ):
        table.add_column(column)
    for r in rows:
        table.add_row(
            r["candidate"],
            str(r["seed"]),
            str(r["regime"]),
            str(r["alarm"] or "none"),
            str(r["alarm_iteration"] or "-"),
            str(r["fall"] or "never"),
            "-" if r["lead"] is None else f"{r['lead']:+d}",
            _num(r["success_at_alarm"]),
            _num(r["success_end"]),
        )
    _wide().print(table)
    rate = rules.alarm_first_rate(rows)
    console.print(
        f"alarm first on {rate['alarm_first']} of {rate['runs']} collapsing runs "
        f"[{_num(rate['ci_low'], 2)}, {_num(rate['ci_high'], 2)}] (Wilson 95 %)",
        highlight=False,
    )
