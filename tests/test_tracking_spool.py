"""Tracking never stops training: a real ``mlflow server`` killed (SIGKILL) for longer
than the client's retry budget, then started again on the same port and store.

The budget is shortened through MLflow's own environment variables (one retry, backoff
factor 1: with the server killed a connection is refused at once, so a few seconds), as
a user would; the outages below last several times that.  The request timeout stays
long (30 s): it bounds only a request to a server that is up, and a loaded machine's
server can take more than a few seconds to answer one. Read back from the server afterwards, every step, param and
artifact is there exactly once and the run's final status is set.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections import Counter

import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from tests.conftest import checkpointed_run_config
from tests.mlflow_server import MlflowServer
from tether.platform.cli.main import app
from tether.platform.config import TrackingConfig
from tether.platform.tracking.tracker import SPOOL_DIRNAME, Tracker

BUDGET_S = 6.0  # 2 refused attempts + backoff (<= 1 s) + jitter (<= 1 s), with margin


@pytest.fixture
def short_retries(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with MlflowServer(tmp_path_factory.mktemp("mlflow_server")) as running:
        yield running


def _steps(client, run_id, key):
    return Counter(m.step for m in client.get_metric_history(run_id, key))


def _artifacts(client, run_id, path=None):
    out = []
    for item in client.list_artifacts(run_id, path):
        out += _artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return out


def test_outage_spools_then_sync_replays_exactly_once(server, short_retries, tmp_path):
    messages = []
    settings = TrackingConfig(uri=server.uri, probe_every_s=0.5, drain_timeout_s=0)
    tracker = Tracker(
        server.uri,
        "spool-test",
        run_name="outage",
        spool_root=tmp_path / "spool",
        settings=settings,
        notify=messages.append,
    )
    tracker.log_params({"a": 1, "b": "x"})
    tracker.log_metrics({"loss": 1.0}, step=0)
    with pytest.raises(MlflowException):  # a write the server refuses is not spooled
        tracker.log_params({"a": 2})
    assert tracker.spool.pending == 0

    server.kill()
    down = time.monotonic()
    tracker.log_metrics({"loss": 0.9}, step=1)  # pays the (shortened) retry budget once
    first = time.monotonic() - down
    assert len(messages) == 1 and "spooling" in messages[0]
    # Spooled writes must not pay the retry budget: they do not reach MLflow's client at
    # all (only the cheap /health probe may run).  Counted, not timed, so a loaded machine
    # cannot fail it; benchmarks/tracking_spool.py times them.
    client_calls = []
    real_client = tracker.client

    class CountingClient:
        def __getattr__(self, name):
            client_calls.append(name)
            return getattr(real_client, name)

    tracker.client = CountingClient()
    started = time.monotonic()
    for step in (2, 3):
        tracker.log_metrics({"loss": 1.0 - step / 10}, step=step)
    tracker.set_tags({"phase": "outage"})
    tracker.log_params({"c": 3})
    tracker.log_text("hello", "notes/hello.txt")
    artifact = tmp_path / "table.csv"
    artifact.write_text("x,y\n1,2\n")
    tracker.log_artifact(artifact)
    artifact.write_text("changed after logging\n")  # the spool kept its own copy
    spooled = time.monotonic() - started
    tracker.client = real_client
    print(f"first failed write {first:.1f} s; 6 spooled writes {spooled * 1000:.0f} ms")
    assert client_calls == [], "spooled writes went to the MLflow client"
    assert tracker.spool.pending == 7  # the failed write and these 6
    assert not tracker.finish("FINISHED")  # drain_timeout_s 0: left on disk, said so
    assert "tether sync-tracking" in messages[-1]
    spool_dir = tmp_path / "spool" / tracker.run_id
    records = [json.loads(line) for line in (spool_dir / "spool.jsonl").read_text().splitlines()]
    assert [r["op"] for r in records] == [
        "metrics",
        "metrics",
        "metrics",
        "tags",
        "params",
        "text",
        "file",
        "terminate",
    ]
    time.sleep(max(0.0, BUDGET_S - (time.monotonic() - down)))  # outlast the retry budget

    left_by_a_killed_driver = tmp_path / "copy" / tracker.run_id  # the same spool, twice
    shutil.copytree(spool_dir, left_by_a_killed_driver)

    server.start()
    synced = CliRunner().invoke(app, ["sync-tracking", str(spool_dir)])
    assert synced.exit_code == 0, synced.output
    assert f"replayed {len(records)} writes into run" in synced.output
    assert not spool_dir.exists()
    client, run_id = MlflowClient(server.uri), tracker.run_id

    def check(status):
        run = client.get_run(run_id)
        assert run.info.status == status
        assert run.data.params == {"a": "1", "b": "x", "c": "3"}
        assert run.data.tags["phase"] == "outage"
        assert _steps(client, run_id, "loss") == {0: 1, 1: 1, 2: 1, 3: 1}
        assert sorted(_artifacts(client, run_id)) == ["notes/hello.txt", "table.csv"]
        assert (
            client.download_artifacts(run_id, "table.csv", str(tmp_path / "dl"))
            and (tmp_path / "dl" / "table.csv").read_text() == "x,y\n1,2\n"
        )

    check("FINISHED")
    # `tether run --resume` finds the spool first thing (here: the copy, all of it again):
    # replayed before the run is marked RUNNING again, and nothing lands twice.
    resumed = Tracker(
        server.uri,
        "spool-test",
        run_id=run_id,
        settings=settings,
        spool_root=left_by_a_killed_driver.parent,
        notify=messages.append,
    )
    assert "replaying 8 spooled writes" in messages[-2] and "is back" in messages[-1]
    assert not left_by_a_killed_driver.exists()
    check("RUNNING")
    assert resumed.finish("FINISHED")
    check("FINISHED")


ITERATIONS = 5


def test_training_run_survives_a_server_outage(
    server, short_retries, micro_policy, models_dir, ray_local, tmp_path
):
    from tether.platform.run.trainer import Trainer

    cfg = checkpointed_run_config(
        tmp_path,
        models_dir,
        ITERATIONS,
        trainer={"samples_every": 1, "samples_per_log": 1},
        tracking={"uri": server.uri, "probe_every_s": 1.0, "drain_timeout_s": 300},
    )
    messages, outage = [], {}

    def on_event(kind, data):
        if kind == "tracking":
            messages.append(data["message"])
        elif kind == "iteration" and data["iteration"] == 1:
            server.kill()  # iteration 2 runs with the server gone
            outage["down"] = time.monotonic()
        elif kind == "iteration" and data["iteration"] == 2:
            # back while iteration 3 trains, and not before the retry budget is spent
            # (an idle machine runs iteration 2 in less: the outage was 5.8 s once):
            # iteration 4's first write finds it up and replays the spool mid-run
            def restart():
                time.sleep(max(0.0, BUDGET_S + 0.5 - (time.monotonic() - outage["down"])))
                server.start()

            outage["thread"] = threading.Thread(target=restart)
            outage["thread"].start()
        elif kind == "iteration" and data["iteration"] == 3:
            outage["thread"].join()
            outage["up"] = time.monotonic()

    summary = Trainer(cfg, on_event).run()
    assert summary.status == "FINISHED" and summary.iterations == ITERATIONS
    print(f"outage {outage['up'] - outage['down']:.0f} s; messages: {messages}")
    assert outage["up"] - outage["down"] > BUDGET_S
    assert len(messages) == 2 and "spooling" in messages[0] and "is back" in messages[1]

    client = MlflowClient(server.uri)
    run = client.get_run(summary.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["tether.status"] == "FINISHED"
    assert run.data.tags["tether.iterations_done"] == str(ITERATIONS)
    assert run.data.params == {
        k: str(v)[:6000] for k, v in cfg.flat().items() if k != "experiment.run_name"
    }  # (a tag, not a param)
    every_step = {step: 1 for step in range(1, ITERATIONS + 1)}
    for key in ("rollout/success", "timing/log", "actor/pg_loss"):
        assert _steps(client, summary.run_id, key) == every_step, key
    assert _steps(client, summary.run_id, "val/success") == {0: 1, ITERATIONS: 1}
    files = Counter(_artifacts(client, summary.run_id))
    for it in range(1, ITERATIONS + 1):
        assert (
            files[f"samples/iter_{it:04d}.txt"] == 1 and files[f"prompts/iter_{it:04d}.json"] == 1
        )
    assert not (tmp_path / "runs" / SPOOL_DIRNAME / summary.run_id).exists()


def test_an_unreachable_server_refuses_the_run_before_ray_or_the_warm_start(tmp_path, monkeypatch):
    """Checked before any work: a wrong tracking URI fails with one line, and neither Ray
    nor the policy (the warm start: minutes on a cold cache) was started for it."""
    import ray

    from tests.mlflow_server import free_port
    from tether.platform import preflight
    from tether.platform.run.trainer import Trainer
    from tether.store import TrackingError

    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    cfg = checkpointed_run_config(tmp_path, tmp_path / "models", 1, tracking={"uri": uri})

    def work(what):
        def started(*args, **kwargs):
            raise AssertionError(f"{what} started before the tracking server was checked")

        return started

    monkeypatch.setattr(preflight, "connect", work("Ray"))
    monkeypatch.setattr(preflight, "wait_until_fits", lambda *args, **kwargs: None)
    monkeypatch.setattr(preflight, "resolve_model", work("the warm start"))
    # Refused in seconds: after one /health request with a timeout of at most 5 s (and,
    # by the stand-ins above, before Ray, the MLflow client with its retry budget or the
    # warm start).  The requests are recorded, not timed: a loaded machine cannot fail it.
    from tether import store  # where the reachability check lives

    probes, urlopen = [], store.urllib.request.urlopen

    def recorded(url, *args, timeout=None, **kwargs):
        probes.append((url, timeout))
        return urlopen(url, *args, timeout=timeout, **kwargs)

    monkeypatch.setattr(store.urllib.request, "urlopen", recorded)
    ray_before = ray.is_initialized()  # an earlier test of the session may have started it
    with pytest.raises(TrackingError) as refused:
        Trainer(cfg).run()
    assert [url for url, _ in probes] == [f"{uri}/health"], probes
    assert 0 < probes[0][1] <= 5.0, probes
    assert ray.is_initialized() == ray_before
    message = str(refused.value)
    assert (
        message.startswith(f"MLflow tracking server {uri} is unreachable") and "\n" not in message
    )


@pytest.mark.slow  # nightly; CONTRIBUTING.md, "Tests", Nightly
def test_server_gone_during_the_warm_start_spools_from_the_first_write(
    server, short_retries, micro_policy, models_dir, ray_local, tmp_path, monkeypatch
):
    """As a user met it: the server answers when the run starts and goes away while the
    run builds its policy (the warm start, here: the cached one), before anything but the
    MLflow run itself was written.  The run trains on: every write from the first spools,
    with one warning, and is replayed once the server is back."""
    from tether.platform import preflight
    from tether.platform.run.trainer import Trainer

    iterations = 2
    cfg = checkpointed_run_config(
        tmp_path,
        models_dir,
        iterations,
        tracking={"uri": server.uri, "probe_every_s": 1.0, "drain_timeout_s": 300},
    )
    resolve_model = preflight.resolve_model

    def server_goes_away_during_the_warm_start(*args, **kwargs):
        server.kill()
        return resolve_model(*args, **kwargs)

    monkeypatch.setattr(preflight, "resolve_model", server_goes_away_during_the_warm_start)
    messages, restart = [], {}

    def on_event(kind, data):
        if kind == "tracking":
            messages.append(data["message"])
        elif kind == "iteration" and data["iteration"] == 1:  # back while the run trains
            restart["thread"] = threading.Thread(target=server.start)
            restart["thread"].start()

    summary = Trainer(cfg, on_event).run()
    restart["thread"].join()
    print(f"messages: {messages}")
    assert summary.status == "FINISHED" and summary.iterations == iterations
    assert len(messages) == 2 and "spooling" in messages[0] and "is back" in messages[1]
    client = MlflowClient(server.uri)
    run = client.get_run(summary.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {
        k: str(v)[:6000] for k, v in cfg.flat().items() if k != "experiment.run_name"
    }
    assert run.data.tags["tether.model_path"] == summary.model_path
    assert run.data.tags["tether.iterations_done"] == str(iterations)
    assert _steps(client, summary.run_id, "rollout/success") == {1: 1, 2: 1}
    assert _steps(client, summary.run_id, "val/success") == {0: 1, iterations: 1}
    assert not (tmp_path / "runs" / SPOOL_DIRNAME / summary.run_id).exists()
