"""A chaos sweep (issue #35): a 4-trial sweep submitted with `ray job submit` to a local
`ray start --head` cluster (``test_sweep_jobs``'s ``cluster``), its MLflow server a real
``mlflow server`` (``tests/mlflow_server.py``), through this schedule of faults, each
injected when its condition holds (polled with a deadline, from the job's driver log and
the cluster's process titles), in this order:

1. after the first iteration line: a rollout worker SIGKILLed while it collects (its
   share is collected again);
2. after the next: the environment pools alive then SIGKILLed while a rollout worker
   collects;
3. after the next: a learner SIGKILLed while it updates (the group is rebuilt from the
   last checkpoint, the lost iteration re-run);
4. after the next: the tracking server SIGKILLed for 2 minutes while the trials train
   (they spool; a trial that ends meanwhile waits for its spool to drain), then started
   again on the same port and store (the spools replay);
5. once the spools have replayed and every running trial has logged an iteration: one
   trial's process (Tune's ``ImplicitFunc``) SIGKILLed: the trial errors, its actors go
   with it;
6. once a trial has finished and another runs (at once, after 5): the job's driver
   stopped (`ray job stop`) and the sweep resubmitted with ``--resume`` (the interrupted
   trial continues its own MLflow run from its last checkpoint, the errored one runs
   again from its start in a new run, the finished ones not at all).

Faults 1-3 must strike: each is checked by the line the trial prints for the fault it
survived (``trial <id>: rollout worker <k> failed ...``, ``trial <id>: learner died ...``).
Under load a kill can land between stages (the process title still names the method that
just returned), leaving nothing to survive; such a fault is struck again at the next
occasion, up to ``STRIKES`` times, and the schedule says which attempt struck and when.

Then: the job succeeds; each of the 4 trials has exactly one FINISHED MLflow run, in which
every metric key has each of its steps exactly once and none missing (the trial killed
has a FAILED run besides; the one interrupted continued its run: it is tagged resumed);
and its metrics equal
those of the same trial (the same swept values and seed) in a fault-free sweep of the
same spec, exactly, except ``NOT_COMPARED``: readings of the wall clock and of process
memory, which differ between any two runs (``timing/*``, ``rollout/tokens_per_s``,
``system/peak_rss_gb*``: restarted or reused processes peak differently), and the
counters of the faults themselves (``rollout/worker_failures``,
``tether.learner_restarts``).  Everything else is deterministic here: a lost share is
collected again with the same seed and weights, a rebuilt learner re-runs from its
checkpoint with the checkpoint's RNG state, a re-run trial starts over from its seed, and
a replayed spool writes the values that were logged.  (At this size rollout/success is 0
throughout; the equality rests on the losses, log-probs, rewards, lengths and the rest,
about 66 keys a trial.)
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.mlflow_server import MlflowServer
from tests.test_sweep_jobs import _ray, _submit, _wait, _wait_for_job
from tests.test_sweep_jobs import cluster as cluster_fixture

cluster = cluster_fixture  # the job tests' cluster (module-scoped: one per file)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]  # (the default: 900 s)

ITERATIONS = 10  # enough that a trial still runs when the job is stopped
OUTAGE_S = 120.0
#: The smoke sweep's 2 x 2 grid cut to few, tiny iterations: a checkpoint every iteration
#: (a rebuilt learner re-runs at most the iteration it died in), no diagnostics.
SHAPE = (
    f"trainer.iterations={ITERATIONS}",
    f"trainer.val_every={ITERATIONS}",
    "trainer.val_episodes=4",
    "trainer.checkpoint_every=1",
    "trainer.samples_every=2",
    "trainer.learner_restart_backoff_s=0.5",
    "rollout.groups=2",
    "rollout.max_reply_tokens=32",
    "diagnostics.enabled=false",
)
EXPERIMENT = "tether-sweep-smoke"
#: Not compared with the fault-free sweep: wall-clock readings (durations, throughput,
#: peak memory of processes that restarted or were reused), and the faults' own counters.
NOT_COMPARED = (
    "timing/",
    "system/",
    "rollout/tokens_per_s",
    "rollout/worker_failures",
    "tether.learner_restarts",
)


# -- the cluster's processes and the job's log -------------------------------------------
def _processes(cluster) -> dict[int, str]:
    """pid -> process title of the cluster's live processes (descendants of its head)."""
    parents, titles = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except (OSError, UnicodeDecodeError):
            continue
        if stat[0] != "Z":
            parents[int(pid)], titles[int(pid)] = int(stat[1]), title
    mine, grew = {cluster["pid"]}, True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in mine} - mine
        mine |= more
        grew = bool(more)
    return {pid: titles[pid] for pid in mine if pid in titles}


def _actors(cluster, kind: str, method: str | None = None) -> list[int]:
    """PIDs of the cluster's ``kind`` actors (running ``method``, when given)."""
    title = re.compile(rf"ray::{kind}(\.(\w+))?\b")
    return [
        pid
        for pid, t in _processes(cluster).items()
        if (m := title.match(t)) and (method is None or m.group(2) == method)
    ]


class JobLog:
    """The job's driver log (the sweep's trial lines), read from disk."""

    def __init__(self, cluster, job_id: str) -> None:
        self.path = cluster["logs"] / f"job-driver-{job_id}.log"

    def text(self) -> str:
        return self.path.read_text(errors="replace") if self.path.is_file() else ""

    def iterations(self) -> int:
        """Iteration lines so far (all trials)."""
        return len(re.findall(r"trial \w+ iteration \d+", self.text()))

    def trials(self) -> dict[str, set[str]]:
        text = self.text()
        return {
            event: set(re.findall(rf"trial (\w+) {event}", text))
            for event in ("started", "finished", "FAILED")
        }


def _kill(pid: int, what: str, schedule: list[str], t0: float) -> None:
    os.kill(pid, signal.SIGKILL)
    schedule.append(f"{time.monotonic() - t0:6.0f} s  SIGKILL {what} (pid {pid})")
    print(schedule[-1], flush=True)


def _kill_when(cluster, log: JobLog, after: int, kind: str, busy: str, schedule, t0, what):
    """Once the job has logged more than ``after`` iteration lines and a ``busy`` actor
    (``Kind.method``) is at work: SIGKILL a ``kind`` actor (that one when it is of
    ``kind``, else every ``kind`` actor)."""
    busy_kind, method = busy.split(".")

    def ready():
        if log.iterations() <= after or not _actors(cluster, busy_kind, method):
            return None
        pids = _actors(cluster, kind, method if kind == busy_kind else None)
        return pids[:1] if kind == busy_kind else pids

    pids = _wait(ready, 900, f"{busy} after iteration line {after}", every=0.2)
    for pid in pids:
        _kill(pid, what, schedule, t0)


#: Kills of one fault before the test gives up on it striking.
STRIKES = 3
#: Iteration lines (of any trial) after a kill with no fault line: it landed between stages.
MISSED_AFTER_LINES = 4
#: A survived fault's line in a trial's log, by fault kind (``events.fault_message``).
FAULT_LINES = {
    "rollout": re.compile(r"trial \w+: rollout worker \d+ failed"),
    "learner": re.compile(r"trial \w+: learner died"),
}


def _fault_lines(cluster, fault: str) -> int:
    """How many faults of this kind the trials have reported surviving (their logs)."""
    logs = cluster["logs"].glob("worker-*.out")
    return sum(len(FAULT_LINES[fault].findall(f.read_text(errors="replace"))) for f in logs)


def _strike(cluster, log: JobLog, fault: str, kind: str, busy: str, schedule, t0, what):
    """``_kill_when`` until the trials report surviving the fault (a ``fault`` line), at
    most ``STRIKES`` kills; returns the attempt that struck."""
    for attempt in range(1, STRIKES + 1):
        before, lines = _fault_lines(cluster, fault), log.iterations()
        _kill_when(cluster, log, lines, kind, busy, schedule, t0, what)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and log.iterations() < lines + MISSED_AFTER_LINES:
            if _fault_lines(cluster, fault) > before:
                break
            time.sleep(0.5)
        if _fault_lines(cluster, fault) > before:
            schedule.append(
                f"{time.monotonic() - t0:6.0f} s  {what}: struck (kill {attempt}, after "
                f"{lines} iteration lines)"
            )
            print(schedule[-1], flush=True)
            return attempt
        schedule.append(f"{time.monotonic() - t0:6.0f} s  {what}: kill {attempt} missed")
        print(schedule[-1], flush=True)
    raise AssertionError(f"{what}: no kill of {STRIKES} struck\n" + "\n".join(schedule))


@pytest.fixture
def server(tmp_path):
    with MlflowServer(tmp_path / "mlflow_server") as running:
        yield running


def _args(cluster, out: Path, uri: str | None) -> tuple[str, ...]:
    tracking = (
        (f"tracking.uri={uri}", "tracking.probe_every_s=1", "tracking.drain_timeout_s=900")
        if uri
        else ()
    )
    return (f"experiment.output_dir={out}", f"model.cache_dir={cluster['models']}", *tracking)


def _trials(uri: str) -> dict[tuple, list]:
    """The sweep's child runs by their swept values."""
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    out: dict[tuple, list] = {}
    for run in runs:
        if run.data.tags.get("mlflow.parentRunId"):
            values = tuple(
                sorted((k, v) for k, v in run.data.tags.items() if k.startswith("sweep.param."))
            )
            out.setdefault(values, []).append(run)
    return out


def _metrics(client: MlflowClient, run) -> dict[str, list[tuple[int, float]]]:
    """Every metric key's history: [(step, value)] in step order."""
    return {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        for key in run.data.metrics
    }


def test_chaos_sweep(cluster, server, tmp_path):
    chaos_out, reference_out = tmp_path / "chaos", tmp_path / "reference"
    args = _args(cluster, chaos_out, server.uri)
    t0, schedule = time.monotonic(), []
    _submit(cluster, "chaos", *args, shape=SHAPE)
    log = JobLog(cluster, "chaos")

    # 1-3: a rollout worker, every environment pool and a learner, each while it works,
    # each struck again until the trials report surviving it.
    worker = "RolloutWorker", "RolloutWorker.collect"
    _strike(cluster, log, "rollout", *worker, schedule, t0, "a collecting rollout worker")
    pools = "EnvPoolActor", "RolloutWorker.collect"
    _strike(cluster, log, "rollout", *pools, schedule, t0, "the environment pools")
    learner = "Learner", "Learner.update"
    _strike(cluster, log, "learner", *learner, schedule, t0, "a learner")
    seen = log.iterations()

    # 4: the tracking server away for OUTAGE_S while the trials train.
    _wait(lambda: log.iterations() > seen, 600, "an iteration after the kills", every=0.5)
    server.kill()
    down, lines_before = time.monotonic(), log.iterations()
    schedule.append(f"{down - t0:6.0f} s  tracking server SIGKILLed")
    _wait(lambda: time.monotonic() - down >= OUTAGE_S, OUTAGE_S + 60, "the outage's end", every=1)
    trained_during_outage = log.iterations() - lines_before
    server.start()
    schedule.append(
        f"{time.monotonic() - t0:6.0f} s  tracking server back after "
        f"{time.monotonic() - down:.0f} s; {trained_during_outage} iteration lines meanwhile"
    )
    print(schedule[-1], flush=True)
    assert trained_during_outage >= 2, log.text()[-3000:]

    # 5: once the trials' spools have replayed, the process of a running trial.
    def spools_replayed():  # (the trials' own output: in their processes' logs)
        text = "".join(f.read_text(errors="replace") for f in cluster["logs"].glob("worker-*.out"))
        return text.count("is back; replayed") >= text.count("did not take a write") > 0

    _wait(spools_replayed, 900, "the trials' spools to replay", every=1)

    def trials_logging():  # every trial process runs a trial that has logged an iteration
        trials, pids = log.trials(), _actors(cluster, "ImplicitFunc", "train")
        running = trials["started"] - trials["finished"] - trials["FAILED"]
        logged = set(re.findall(r"trial (\w+) iteration", log.text()))
        return pids if pids and len(running) == len(pids) and running <= logged else None

    failed_before = log.trials()["FAILED"]
    pid = _wait(trials_logging, 600, "a running trial that has logged", every=0.2)[0]
    _kill(pid, "a trial's process", schedule, t0)
    _wait(lambda: log.trials()["FAILED"] - failed_before, 300, "the trial's error")

    # 6: once a trial has finished and another runs, the job stopped and resumed.
    def one_finished_one_running():
        trials = log.trials()
        assert len(trials["finished"]) < 4, "the sweep ended before the job stop"
        return trials["finished"] and trials["started"] - trials["finished"] - trials["FAILED"]

    _wait(one_finished_one_running, 900, "a finished and a running trial", every=0.5)
    _ray(cluster, "job", "stop", "chaos", "--address", cluster["address"], timeout=300)
    schedule.append(f"{time.monotonic() - t0:6.0f} s  ray job stop")
    assert _wait_for_job(cluster, "chaos", 300) == "STOPPED"
    _submit(cluster, "chaos-resume", *args, "--resume", shape=SHAPE)
    schedule.append(f"{time.monotonic() - t0:6.0f} s  resubmitted with --resume")
    status = _wait_for_job(cluster, "chaos-resume", 1800)
    resumed_log = JobLog(cluster, "chaos-resume").text()
    assert status == "SUCCEEDED", resumed_log[-4000:]
    schedule.append(f"{time.monotonic() - t0:6.0f} s  resumed sweep SUCCEEDED")
    print("\n".join(schedule), flush=True)

    # The same sweep without faults (its own SQLite store): the reference.
    _submit(cluster, "reference", *_args(cluster, reference_out, None), shape=SHAPE)
    status = _wait_for_job(cluster, "reference", 1800)
    assert status == "SUCCEEDED", JobLog(cluster, "reference").text()[-4000:]
    print(f"{time.monotonic() - t0:6.0f} s  reference sweep SUCCEEDED", flush=True)

    chaos_client = MlflowClient(server.uri)
    reference_uri = f"sqlite:///{reference_out / 'mlflow.db'}"
    reference_client = MlflowClient(reference_uri)
    chaos, reference = _trials(server.uri), _trials(reference_uri)
    assert len(chaos) == 4 and sorted(chaos) == sorted(reference)

    # The faults happened and were survived where they struck (any run of any trial).
    last = Counter()
    for runs in chaos.values():
        for run in runs:
            for key in ("rollout/worker_failures", "tether.learner_restarts"):
                last[key] += run.data.metrics.get(key, 0.0)
    assert last["rollout/worker_failures"] >= 2 and last["tether.learner_restarts"] >= 1, last

    for values, runs in chaos.items():
        finished = [r for r in runs if r.info.status == "FINISHED"]
        assert len(finished) == 1, (values, [r.info.status for r in runs])
        (ref_run,) = reference[values]
        assert ref_run.info.status == "FINISHED"
        got, expected = _metrics(chaos_client, finished[0]), _metrics(reference_client, ref_run)
        # Every metric step exactly once, none missing: each key's steps are the
        # reference's (1..ITERATIONS, validation at 0 and ITERATIONS), no step twice.
        assert set(got) == set(expected), (values, set(got) ^ set(expected))
        for key, history in got.items():
            steps = [step for step, _ in history]
            assert len(steps) == len(set(steps)), (values, key, Counter(steps))
            assert steps == [step for step, _ in expected[key]], (values, key, steps)
        assert [s for s, _ in got["rollout/success"]] == list(range(1, ITERATIONS + 1))
        assert [s for s, _ in got["val/success"]] == [0, ITERATIONS]
        # Equal to the fault-free run, except the wall clock and the fault counters.
        compared = [k for k in got if not k.startswith(NOT_COMPARED)]
        different = {k: (got[k], expected[k]) for k in compared if got[k] != expected[k]}
        assert not different, (values, different)
        assert len(compared) > 20
    # The trial whose process was killed ran again after the resume (its first run
    # FAILED); the one the job stop interrupted continued its own run (tagged resumed),
    # or, stopped before its first checkpoint, ran again in a new one (its first KILLED).
    runs = [r for runs in chaos.values() for r in runs]
    statuses = [r.info.status for r in runs]
    resumed = [r for r in runs if int(r.data.tags.get("tether.resume_count", "0")) >= 1]
    assert statuses.count("FAILED") >= 1, statuses
    assert all(r.info.status == "FINISHED" for r in resumed), resumed
    assert resumed or statuses.count("KILLED") >= 1, statuses
