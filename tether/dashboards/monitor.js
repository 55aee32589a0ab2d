"use strict";
// The live collapse monitor's page. It reads api/runs (authorised by the session cookie
// or by no login at all: the script never sees a token) and builds the DOM from text
// nodes only, so run names, alarm fields and evidence from the store are never parsed as
// HTML.
const REFRESH_MS = Number(document.body.dataset.refreshMs) || 5000;
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                "#7f7f7f", "#bcbd22", "#17becf"];
const num = (v) => typeof v === "number" && isFinite(v);
const fmt = (v) => num(v) ? v.toFixed(3) : "–";
const lastOf = (c, key) => (c && c[key] && c[key].length ? c[key][c[key].length - 1] : null);
// plotly reads a few HTML tags in trace names; entities keep every character literal
const ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"};
const plotText = (s) => String(s).replace(/[&<>]/g, (c) => ENTITIES[c]);
// a run's name in plot legends: shortened, so a long name does not squeeze the plot
const LABEL = 32;
const label = (run) => plotText(run.name.length > LABEL ? run.name.slice(0, LABEL) + "…"
                                                         : run.name);
const colorOf = (runs, run) => COLORS[runs.indexOf(run) % COLORS.length];

function el(tag, props, ...children) {
  const node = Object.assign(document.createElement(tag), props || {});  // properties, not markup
  node.append(...children.map((c) => (c instanceof Node ? c : String(c ?? ""))));
  return node;
}

// "0.123 [0.100, 0.150]": the latest value with its 95 % interval when logged
function withInterval(c) {
  const low = lastOf(c, "ci_low"), high = lastOf(c, "ci_high");
  return fmt(lastOf(c, "y")) + (num(low) && num(high) ? ` [${fmt(low)}, ${fmt(high)}]` : "");
}

function groundedText(run) {
  const grounded = lastOf(run.curves.grounded, "y"), p = lastOf(run.curves.mi, "p_grounded");
  if (!num(grounded)) return "–";
  return (grounded >= 0.5 ? "yes" : "no") +
    (num(p) ? ` (permutation test, p = ${p.toFixed(3)} for I(X;Z))` : " (permutation test)");
}

// reading accuracy on the probe set, or why there is none
function readingText(c) {
  if (lastOf(c.reading_defined, "y") === 0) return "not defined for this env";
  return lastOf(c.reading, "y") === null ? "–" : withInterval(c.reading);
}

function runRow(run) {
  if (run.error) return el("tr", {id: "run-" + run.run_id}, el("td", {}, run.name),
    el("td", {}, run.status), el("td", {className: "error", colSpan: 9}, run.error));
  const c = run.curves;
  const alarms = run.alarms.map((a) => a.name + "@" + a.iteration).join(", ") || "none";
  return el("tr", {id: "run-" + run.run_id}, el("td", {}, run.name), el("td", {}, run.status),
    el("td", {className: "latest-iteration"}, run.latest_iteration),
    el("td", {}, fmt(lastOf(c.success, "y"))), el("td", {}, fmt(lastOf(c.kept_ratio, "y"))),
    el("td", {className: "mi"}, withInterval(c.mi)),
    el("td", {className: "grounded"}, groundedText(run)),
    el("td", {className: "entropy"}, withInterval(c.entropy)),
    el("td", {className: "probe-mi"}, c.probe_mi && c.probe_mi.x.length
                                         ? withInterval(c.probe_mi) : "–"),
    el("td", {className: "reading"}, readingText(c)),
    el("td", {className: "alarms"}, alarms));
}

function alarmBanner(run, a) {
  // act-mode responses (name "action:<kind>") are shown beside the alarms that caused them
  const action = a.mode === "act" && String(a.name).startsWith("action:");
  return el("div", {className: "alarm-banner" + (a.mode === "warn" ? " warn" : "") +
                    (action ? " action" : "")},
    `${action ? "ACTION" : "ALARM"} ${a.name} in run ${run.name} at iteration ${a.iteration}` +
      (a.message ? ": " + a.message : ""),
    ...(a.evidence || []).map((line) => el("div", {className: "evidence"}, line)));
}

// The shaded 95 % interval of a curve: a closed polygon over the steps that have one.
function bandTrace(c, color, text, run, name) {
  if (!c.ci_low || !c.ci_high) return null;
  const idx = c.x.map((_, j) => j).filter((j) => num(c.ci_low[j]) && num(c.ci_high[j]));
  if (!idx.length) return null;
  const x = idx.map((j) => c.x[j]);
  return {x: x.concat(x.slice().reverse()),
          y: idx.map((j) => c.ci_high[j]).concat(idx.map((j) => c.ci_low[j]).reverse()),
          fill: "toself", fillcolor: color, opacity: 0.2, line: {width: 0}, mode: "lines",
          hoverinfo: "skip", showlegend: false, name: text + " 95% CI",
          meta: {band: run, curve: name}};
}

function curveTraces(runs, names, dashes) {
  const traces = [];
  runs.forEach((run) => names.forEach((name, k) => {
    const c = run.curves[name];
    if (!c || !c.x.length) return;
    const color = colorOf(runs, run), text = label(run) + " " + name;
    const band = bandTrace(c, color, text, run.run_id, name);
    if (band) traces.push(band);
    traces.push({x: c.x, y: c.y, mode: "lines+markers", name: text,
                 line: {dash: dashes[k], color}});
    if (c.null_q95 && c.null_q95.some(num))
      traces.push({x: c.x, y: c.null_q95, mode: "lines", name: text + " null 95%",
                   line: {dash: "dash", width: 1, color}, meta: {null: run.run_id, curve: name}});
  }));
  return traces;
}

// Tag each drawn interval polygon (plotly's fill path) as .ci-band with its run id.
function markBands(div) {
  div.querySelectorAll(".scatterlayer .trace").forEach((group) => {
    const trace = group.__data__ && group.__data__[0] && group.__data__[0].trace;
    const fill = group.querySelector("path.js-fill");
    if (fill && trace && trace.meta && trace.meta.band) {
      fill.classList.add("ci-band");
      fill.setAttribute("data-run", trace.meta.band);
    }
  });
}

// The y-range when a band reaches far past the rest (the report's rule, render.py
// band_limits): every value, the bands only as far beyond the values as the farthest of
// their span, 0.05 of their size, 0.05 and three times the median band edge's reach
// beyond them; null (autoscale) when every band fits.
function bandRange(traces) {
  const finite = (ys) => (ys || []).filter(num);
  const ys = traces.filter((t) => !(t.meta && t.meta.band)).flatMap((t) => finite(t.y));
  const bands = traces.filter((t) => t.meta && t.meta.band).flatMap((t) => finite(t.y));
  if (!ys.length || !bands.length) return null;
  const low = Math.min(...ys), high = Math.max(...ys);
  const reach = bands.map((v) => Math.max(0, low - v, v - high)).sort((a, b) => a - b);
  const mid = reach.length >> 1;
  const median = reach.length % 2 ? reach[mid] : (reach[mid - 1] + reach[mid]) / 2;
  const pad = Math.max(high - low, 0.05 * Math.max(Math.abs(low), Math.abs(high)), 0.05,
                       3 * median);
  const bLow = Math.min(...bands), bHigh = Math.max(...bands);
  if (bLow >= low - pad && bHigh <= high + pad) return null;
  const lo = Math.max(bLow, low - pad), hi = Math.min(bHigh, high + pad), m = 0.05 * (hi - lo);
  return [lo - m, hi + m];
}

function react(id, traces, layout) {
  const div = document.getElementById(id);
  const range = bandRange(traces);
  if (range) layout = {...layout, yaxis: {...layout.yaxis, range}};
  return Plotly.react(div, traces, layout).then(() => {
    if (!div.tetherMarks) div.on("plotly_afterplot", () => markBands(div));  // zoom, pan
    div.tetherMarks = true;
    markBands(div);
  });
}

// Error bars from a curve's interval, aligned to the given indexes.
function errorBars(c, idx) {
  if (!c.ci_low || !c.ci_high) return {visible: false};
  const y = idx.map((j) => c.y[j]);
  return {type: "data", symmetric: false, visible: true, thickness: 1,
          array: idx.map((j, n) => (num(c.ci_high[j]) ? c.ci_high[j] - y[n] : null)),
          arrayminus: idx.map((j, n) => (num(c.ci_low[j]) ? y[n] - c.ci_low[j] : null))};
}

function regimeTrace(run, color) {
  const e = run.curves.entropy, m = run.curves.mi;
  const steps = m.x.filter((s) => e.x.includes(s));
  const ie = steps.map((s) => e.x.indexOf(s)), im = steps.map((s) => m.x.indexOf(s));
  return {x: ie.map((j) => e.y[j]), y: im.map((j) => m.y[j]), error_x: errorBars(e, ie),
          error_y: errorBars(m, im), text: steps.map((s) => "it " + s),
          mode: "lines+markers+text", textposition: "top center", name: label(run),
          line: {color}, marker: {color}};
}

function draw(data) {
  const runs = data.runs, shown = runs.filter((r) => !r.error);
  document.getElementById("updated").textContent = runs.length + " runs, updated " +
    new Date(data.time * 1000).toLocaleTimeString() + " (sampling " + data.sampling + ")";
  document.getElementById("alarms").replaceChildren(
    ...runs.flatMap((run) => run.alarms.map((a) => alarmBanner(run, a))));
  document.querySelector("#runs tbody").replaceChildren(...runs.map(runRow));
  const shapes = shown.flatMap((run) => run.alarms.filter((a) => num(a.iteration)).map((a) => ({
    type: "line", xref: "x", yref: "paper", x0: a.iteration, x1: a.iteration, y0: 0, y1: 1,
    line: {color: "red", dash: "dash"}})));
  const layout = (title, x, y) => ({title: {text: title, font: {size: 13}}, margin: {t: 35, b: 40},
    xaxis: {title: {text: x}}, yaxis: {title: {text: y}}, legend: {font: {size: 9}},
    shapes: x === "iteration" ? shapes : []});
  return Promise.all([
    react("plot-mi", curveTraces(shown, ["mi", "entropy"], ["solid", "dot"]),
          layout("I(X;Z) and H(Z|X) over training", "iteration", "nats / token")),
    react("plot-regime", shown.filter((r) => r.curves.mi.x.length)
                                .map((r) => regimeTrace(r, colorOf(shown, r))),
          layout("regime plot: (H(Z|X), I(X;Z)) path", "H(Z|X)", "I(X;Z)")),
    react("plot-success", curveTraces(shown, ["success", "val_success"], ["solid", "dot"]),
          layout("success", "iteration", "success")),
    react("plot-kept", curveTraces(shown, ["kept_ratio"], ["solid"]),
          layout("filter kept ratio", "iteration", "kept ratio")),
    react("plot-probe", curveTraces(shown, ["mi", "probe_mi"], ["dot", "solid"]),
          layout("I(X;Z): batch (dotted) and probe set (solid)", "iteration", "nats / token")),
    react("plot-reading", curveTraces(shown, ["reading"], ["solid"]),
          layout("reading accuracy on the probe set", "iteration", "share of levels"))]);
}

async function refresh() {
  try {
    const response = await fetch("api/runs", {credentials: "same-origin"});
    if (!response.ok) throw new Error((await response.json()).error || response.status);
    await draw(await response.json());
  } catch (err) {
    document.getElementById("updated").textContent = "error: " + err.message;
  }
}
refresh();
setInterval(refresh, REFRESH_MS);
