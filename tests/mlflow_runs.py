"""Tether-shaped MLflow runs with known metric histories, written through the real
tracking code (``Tracker``: the MLflow client, the driver's tags and artifacts)."""

from __future__ import annotations

from tether.platform.tracking.tracker import Tracker


def write_run(
    uri: str,
    experiment: str,
    name: str,
    histories: dict[str, dict[int, float]],
    params: dict | None = None,
    tags: dict | None = None,
    parent_run_id: str | None = None,
    alarms: list[dict] | None = None,
    prompts: dict[int, list[dict]] | None = None,
    finish: bool = True,
    prompt_mi: dict[int, list[dict]] | None = None,
) -> Tracker:
    """One training run as the driver writes it: params, ``tether.env`` tag, one
    ``log_metrics`` per step, alarm tags + alarms.json, prompts/iter_N.json,
    prompt_mi/iter_N.json."""
    tracker = Tracker(
        uri, experiment, run_name=name, parent_run_id=parent_run_id, tags=dict(tags or {})
    )
    tracker.log_params(params or {"env.id": "tether/FrozenLake-v0"})
    tracker.set_tags({"tether.env": "tether/FrozenLake-v0"})
    steps = sorted({s for h in histories.values() for s in h})
    for step in steps:
        tracker.log_metrics({k: h[step] for k, h in histories.items() if step in h}, step=step)
    for event in alarms or []:
        tracker.set_tags({f"alarm.{event['name']}": event["iteration"]})
    if alarms:
        tracker.log_json(alarms, "alarms.json")
    for it, groups in (prompts or {}).items():
        tracker.log_json({"iteration": it, "groups": groups}, f"prompts/iter_{it:04d}.json")
    for it, groups in (prompt_mi or {}).items():
        tracker.log_json({"iteration": it, "groups": groups}, f"prompt_mi/iter_{it:04d}.json")
    if finish:
        tracker.finish()
    return tracker
