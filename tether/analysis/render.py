"""One small figure description, two renderers: matplotlib (PNG) and plotly (HTML).

Every report figure is built once as a ``Figure`` of ``Panel``s; the PNG and the
interactive HTML are drawn from the same numbers, so they cannot disagree.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

PALETTE = [
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
]


@dataclass
class Series:
    name: str
    x: list
    y: list
    mode: str = "lines+markers"  # lines | markers | lines+markers | bar
    error: tuple[list, list] | None = None  # (low, high) absolute bounds: error bars on
    #                                          bars and markers, a shaded band on lines
    text: list[str] | None = None
    color: str | None = None
    dash: bool = False  # dashed line: a reference level (null, chance)


@dataclass
class Panel:
    title: str
    xlabel: str = ""
    ylabel: str = ""
    series: list[Series] = field(default_factory=list)
    #: (x, label): alarms on the time axis
    vlines: list[tuple[float, str]] = field(default_factory=list)
    #: (matrix, column labels, row labels)
    heatmap: tuple[np.ndarray, list, list] | None = None
    #: (x cut, y cut, {(x high, y high): label}): the regime quadrants
    quadrants: tuple[float, float, dict] | None = None
    zero_line: bool = False


@dataclass
class Figure:
    name: str
    title: str
    panels: list[Panel]
    columns: int = 2


def band_limits(panel: Panel) -> tuple[float, float] | None:
    """The y-range of a panel whose lines carry interval bands, when a band reaches far
    past the rest: every estimate, and the bands as far beyond the estimates as the
    farthest of (the estimates' own span, 0.05 of their size, 0.05, three times the median
    band edge's reach beyond them), so one very wide band (a `log_jackknife` interval at
    the ceiling whose left-out prompt brought a replicate to it) runs off the plot instead
    of flattening every curve, while bands that are all wider than the curves' movement
    (a Wilson interval around a flat rate) stay whole.  None (the renderer's own scale)
    when every band fits or the panel has none."""
    ys = [v for s in panel.series for v in s.y if v is not None and math.isfinite(v)]
    bands = [
        v
        for s in panel.series
        if s.error is not None and s.mode != "bar"
        for side in s.error
        for v in side
        if v is not None and math.isfinite(v)
    ]
    if not ys or not bands:
        return None
    low, high = min(ys), max(ys)
    reach = statistics.median(max(0.0, low - v, v - high) for v in bands)
    pad = max(high - low, 0.05 * max(abs(low), abs(high)), 0.05, 3 * reach)
    if min(bands) >= low - pad and max(bands) <= high + pad:
        return None
    return max(min(bands), low - pad), min(max(bands), high + pad)


def _grid(n: int, columns: int) -> tuple[int, int]:
    columns = max(1, min(columns, n))
    return math.ceil(n / columns), columns


def to_matplotlib(figure: Figure):
    rows, cols = _grid(len(figure.panels), figure.columns)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    for ax in axes.flat[len(figure.panels) :]:
        ax.set_visible(False)
    for ax, panel in zip(axes.flat, figure.panels):
        _draw_panel(ax, panel, fig)
    fig.suptitle(figure.title, fontsize=11)
    fig.tight_layout()
    return fig


def _draw_panel(ax, panel: Panel, fig) -> None:
    ax.set_title(panel.title, fontsize=9)
    ax.set_xlabel(panel.xlabel, fontsize=8)
    ax.set_ylabel(panel.ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    if panel.heatmap is not None:
        matrix, xlabels, ylabels = panel.heatmap
        image = ax.imshow(matrix, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_xticks(range(len(xlabels)), [str(v) for v in xlabels], fontsize=6)
        ax.set_yticks(range(len(ylabels)), [str(v) for v in ylabels], fontsize=6)
        fig.colorbar(image, ax=ax)
        return
    bars = [s for s in panel.series if s.mode == "bar"]
    width = 0.8 / max(1, len(bars))
    for k, s in enumerate(panel.series):
        color = s.color or PALETTE[k % len(PALETTE)]
        if s.mode == "bar":
            pos = np.arange(len(s.x)) + (k - (len(bars) - 1) / 2) * width
            err = None if s.error is None else np.abs(np.array(s.error) - np.array(s.y))
            ax.bar(pos, s.y, width, yerr=err, label=s.name, color=color, capsize=3)
            ax.set_xticks(
                np.arange(len(s.x)), [str(v) for v in s.x], rotation=30, ha="right", fontsize=7
            )
            continue
        style = {"lines": "-", "markers": "o", "lines+markers": "-o"}[s.mode]
        if s.dash:
            style = style.replace("-", "--")
        ax.plot(
            s.x,
            s.y,
            style,
            label=s.name,
            color=color,
            markersize=4,
            linewidth=0.9 if s.dash else None,
        )
        if s.error is not None and s.mode == "markers":
            ax.errorbar(
                s.x,
                s.y,
                yerr=np.abs(np.array(s.error) - np.array(s.y)),
                fmt="none",
                ecolor=color,
                capsize=2,
                linewidth=0.8,
            )
        elif s.error is not None:
            ax.fill_between(s.x, s.error[0], s.error[1], color=color, alpha=0.2, linewidth=0)
        if s.mode != "lines" and s.text:
            for x, y, t in zip(s.x, s.y, s.text):
                ax.annotate(t, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    for x, label in panel.vlines:
        ax.axvline(x, color="red", linestyle="--", linewidth=1)
        ax.annotate(
            label,
            (x, 1),
            xycoords=("data", "axes fraction"),
            rotation=90,
            fontsize=6,
            color="red",
            va="top",
            ha="right",
        )
    if panel.zero_line:
        ax.axhline(0, color="gray", linewidth=0.8)
    if panel.quadrants is not None:
        xc, yc, labels = panel.quadrants
        ax.axvline(xc, color="gray", linestyle=":")
        ax.axhline(yc, color="gray", linestyle=":")
        for (x_high, y_high), label in labels.items():
            ax.annotate(
                label,
                (0.98 if x_high else 0.02, 0.97 if y_high else 0.03),
                xycoords="axes fraction",
                ha="right" if x_high else "left",
                va="top" if y_high else "bottom",
                fontsize=7,
                color="gray",
            )
    if panel.xlabel == "iteration":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    limits = band_limits(panel)
    if limits is not None:
        margin = 0.05 * (limits[1] - limits[0])
        ax.set_ylim(limits[0] - margin, limits[1] + margin)
    if panel.series:
        ax.legend(fontsize=6)


def _error_bars(s: Series) -> dict | None:
    """Plotly's ``error_y`` of a series with (low, high) bounds (None without them)."""
    if s.error is None:
        return None
    return dict(
        type="data",
        symmetric=False,
        array=list(np.array(s.error[1]) - s.y),
        arrayminus=list(np.array(s.y) - s.error[0]),
    )


def to_plotly(figure: Figure):
    from plotly import graph_objects as go
    from plotly.subplots import make_subplots

    rows, cols = _grid(len(figure.panels), figure.columns)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[p.title for p in figure.panels])
    for k, panel in enumerate(figure.panels):
        row, col = k // cols + 1, k % cols + 1
        if panel.heatmap is not None:
            matrix, xlabels, ylabels = panel.heatmap
            fig.add_trace(
                go.Heatmap(
                    z=matrix,
                    x=[str(v) for v in xlabels],
                    y=[str(v) for v in ylabels],
                    colorscale="Viridis",
                    showscale=False,
                ),
                row=row,
                col=col,
            )
        for j, s in enumerate(panel.series):
            color = s.color or PALETTE[j % len(PALETTE)]
            if s.mode == "bar":
                err = _error_bars(s)
                trace = go.Bar(
                    x=[str(v) for v in s.x], y=s.y, name=s.name, error_y=err, marker_color=color
                )
            else:
                err = _error_bars(s) if s.mode == "markers" else None
                trace = go.Scatter(
                    x=list(s.x),
                    y=list(s.y),
                    mode=s.mode,
                    name=s.name,
                    text=s.text,
                    error_y=err,
                    line=dict(color=color, dash="dash" if s.dash else None),
                )
                if s.error is not None and s.mode != "markers":  # the band, under the line
                    fig.add_trace(
                        go.Scatter(
                            x=list(s.x) + list(s.x)[::-1],
                            y=list(s.error[1]) + list(s.error[0])[::-1],
                            fill="toself",
                            fillcolor=color,
                            opacity=0.2,
                            line=dict(width=0),
                            hoverinfo="skip",
                            showlegend=False,
                            name=f"{s.name} interval",
                        ),
                        row=row,
                        col=col,
                    )
            fig.add_trace(trace, row=row, col=col)
        for x, label in panel.vlines:
            fig.add_vline(
                x=x,
                line_dash="dash",
                line_color="red",
                annotation_text=label,
                annotation_font_size=9,
                row=row,
                col=col,
            )
        if panel.quadrants is not None:
            xc, yc, _ = panel.quadrants
            fig.add_vline(x=xc, line_dash="dot", line_color="gray", row=row, col=col)
            fig.add_hline(y=yc, line_dash="dot", line_color="gray", row=row, col=col)
        fig.update_xaxes(title_text=panel.xlabel, row=row, col=col)
        limits = band_limits(panel)
        if limits is not None:
            margin = 0.05 * (limits[1] - limits[0])
            fig.update_yaxes(range=[limits[0] - margin, limits[1] + margin], row=row, col=col)
        fig.update_yaxes(title_text=panel.ylabel, row=row, col=col)
    fig.update_layout(
        title=figure.title,
        height=360 * rows,
        template="plotly_white",
        legend=dict(font=dict(size=9)),
    )
    return fig


def save(figure: Figure, out_dir):
    """Write ``<name>.png`` and ``<name>.html`` (plotly loaded from its CDN) in ``out_dir``;
    returns the plotly figure (the report embeds it rather than building it twice)."""
    from pathlib import Path

    out_dir = Path(out_dir)
    fig = to_matplotlib(figure)
    fig.savefig(out_dir / f"{figure.name}.png", dpi=100)  # tight_layout already fitted it
    plt.close(fig)
    interactive = to_plotly(figure)
    interactive.write_html(out_dir / f"{figure.name}.html", include_plotlyjs="cdn")
    return interactive
