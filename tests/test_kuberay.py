"""deploy/kuberay/: the RayCluster and RayJob validate against KubeRay's CRD schemas (kept
in deploy/kuberay/schemas/), the GPU worker group autoscales, the job runs a `tether
sweep` command the docs document, and all of it uses deploy/Dockerfile's image, which
does cluster.yaml's setup."""

from __future__ import annotations

import copy
import gzip
import json
import os
import re
import shlex
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
KUBERAY = ROOT / "deploy" / "kuberay"
SCHEMAS = KUBERAY / "schemas"
MANIFESTS = {"RayCluster": KUBERAY / "raycluster.yaml", "RayJob": KUBERAY / "rayjob.yaml"}
SCHEMA_FILES = {
    "RayCluster": SCHEMAS / "raycluster.v1.json.gz",
    "RayJob": SCHEMAS / "rayjob.v1.json.gz",
}
PLACEHOLDER = "REPLACE-WITH-YOUR-REGISTRY/tether:latest"


def load_schema(kind: str) -> dict:
    return json.loads(gzip.decompress(SCHEMA_FILES[kind].read_bytes()))


def strict(schema):
    """The CRD schema as `kubectl apply` applies it (strict field validation, the default
    since Kubernetes 1.27): a field the schema does not declare is an error, except under
    ``x-kubernetes-preserve-unknown-fields``.  (Plain JSON Schema would accept a typo.)"""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        k: strict(v)
        if k in ("properties", "items", "additionalProperties", "allOf", "anyOf", "oneOf", "not")
        else v
        for k, v in schema.items()
    }
    if "properties" in out:
        out["properties"] = {k: strict(v) for k, v in schema["properties"].items()}
    if (
        schema.get("type") == "object"
        and "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def errors(kind: str, manifest: dict) -> list[str]:
    """Every schema violation of ``manifest`` (a RayCluster or RayJob), as readable lines."""
    found = []
    if manifest.get("apiVersion") != "ray.io/v1" or manifest.get("kind") != kind:
        found.append(
            f"apiVersion/kind: want ray.io/v1 {kind}, got "
            f"{manifest.get('apiVersion')} {manifest.get('kind')}"
        )
    # OpenAPI v3 schemas are JSON Schema draft 4 in the parts CRDs use (boolean
    # exclusiveMinimum, no $ref); CEL rules (x-kubernetes-validations) are not evaluated.
    validator = jsonschema.Draft4Validator(strict(load_schema(kind)))
    for e in sorted(validator.iter_errors(manifest), key=lambda e: list(e.absolute_path)):
        found.append(f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}")
    return found


def manifest(kind: str) -> dict:
    return yaml.safe_load(MANIFESTS[kind].read_text())


@pytest.mark.parametrize("kind", list(MANIFESTS))
def test_manifest_validates_against_kuberays_crd_schema(kind):
    assert errors(kind, manifest(kind)) == []


def _set(doc: dict, path: str, value) -> dict:
    doc = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is _DELETE:
        del node[int(last) if isinstance(node, list) else last]
    else:
        node[last] = value
    return doc


_DELETE = object()
BROKEN = [  # (kind, path, value, what the validation must report)
    ("RayCluster", "spec.enableInTreeAutoscalng", True, "enableInTreeAutoscalng"),  # typo
    ("RayCluster", "spec.workerGroupSpecs.0.maxReplicas", "eight", "'eight' is not of type"),
    ("RayCluster", "spec.workerGroupSpecs.0.groupName", _DELETE, "'groupName' is a required"),
    ("RayCluster", "spec.autoscalerOptions.version", "v3", "'v3' is not one of"),
    ("RayCluster", "spec.headGroupSpec.template.spec.containers.0.gpus", 1, "gpus"),
    ("RayCluster", "spec.headGroupSpec.template", _DELETE, "'template' is a required"),
    ("RayJob", "spec.entrypoint", ["tether", "sweep"], "is not of type 'string'"),
    ("RayJob", "spec.shutdownAfterJobFinishes", "yes", "is not of type 'boolean'"),
    ("RayJob", "spec.submitterPodTemplate.spec.containers.0.imag", "x", "imag"),
    ("RayJob", "spec.clusterSelectors", {"ray.io/cluster": "tether"}, "clusterSelectors"),
    ("RayJob", "kind", "RayJobs", "apiVersion/kind"),
]


@pytest.mark.parametrize(
    "kind,path,value,expected", BROKEN, ids=[f"{k}:{p}" for k, p, _, _ in BROKEN]
)
def test_a_broken_manifest_fails_validation(kind, path, value, expected):
    found = errors(kind, _set(manifest(kind), path, value))
    assert found, f"{path}={value!r} passed validation"
    assert any(expected in line for line in found), found


def _containers(pod_template: dict) -> list[dict]:
    return pod_template["spec"]["containers"]


def test_gpu_worker_group_autoscales_and_the_head_has_no_gpu():
    spec = manifest("RayCluster")["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    head = spec["headGroupSpec"]
    assert head["rayStartParams"].get("num-gpus") == "0"
    for c in _containers(head["template"]):
        assert "nvidia.com/gpu" not in c.get("resources", {}).get("limits", {})
    gpu_groups = [
        g
        for g in spec["workerGroupSpecs"]
        if all(
            int(c["resources"]["limits"].get("nvidia.com/gpu", 0)) >= 1
            for c in _containers(g["template"])
        )
    ]
    assert gpu_groups, "no worker group whose containers all have nvidia.com/gpu limits"
    for g in gpu_groups:
        assert g["minReplicas"] == 0 and g["maxReplicas"] > 0
        assert g["minReplicas"] <= g.get("replicas", 0) <= g["maxReplicas"]
        for c in _containers(g["template"]):
            requests = c["resources"].get("requests", {})
            # Kubernetes: an extended resource's request, if given, equals its limit.
            assert (
                requests.get("nvidia.com/gpu", c["resources"]["limits"]["nvidia.com/gpu"])
                == c["resources"]["limits"]["nvidia.com/gpu"]
            )
    assert max(g["maxReplicas"] for g in gpu_groups) == 8  # cluster.yaml's max_workers


def readme_commands(program: str) -> set[str]:
    """The ``program ...`` commands in the fenced code blocks of README.md and the docs
    pages (docs/*.md; sweeps and ``ray job submit`` are in docs/sweeps.md), also after `--`
    of `ray job submit`, without trailing comments and line continuations."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = "\n".join(page.read_text() for page in pages)
    commands = set()
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            at = line.find(program + " ")
            if at < 0 or (at and not line[at - 1].isspace()):
                continue
            words = shlex.split(line[at:], comments=True)
            commands.add(shlex.join(words))
    return commands


def test_rayjob_runs_a_sweep_command_the_readme_documents():
    spec = manifest("RayJob")["spec"]
    entrypoint = spec["entrypoint"]
    documented = readme_commands("tether sweep")
    assert "tether sweep experiments/sensitivity.yaml" in documented  # the parser works
    assert entrypoint.startswith("tether sweep ")
    assert entrypoint in documented, f"{entrypoint!r} is not among {sorted(documented)}"
    # The spec exists where the image's checkout has it (the head's workingDir) and loads.
    from tether.platform.sweep.spec import load_sweep_spec

    args = shlex.split(entrypoint)[2:]
    assert (ROOT / args[0]).is_file()
    load_sweep_spec(ROOT / args[0], [a for a in args[1:] if not a.startswith("--")])
    head = manifest("RayCluster")["spec"]["headGroupSpec"]["template"]
    assert _containers(head)[0]["workingDir"] == "/home/ray/tether"


def test_rayjob_submits_to_the_raycluster():
    cluster, job = manifest("RayCluster"), manifest("RayJob")["spec"]
    assert job["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    assert "rayClusterSpec" not in job  # KubeRay: one of the two; the cluster outlives jobs
    assert job.get("submissionMode", "K8sJobMode") == "K8sJobMode"  # SidecarMode refuses it


def test_everything_runs_the_dockerfiles_image_with_cluster_yamls_setup():
    images = set()
    for kind in MANIFESTS:
        doc = manifest(kind)["spec"]
        templates = [doc.get("submitterPodTemplate")]
        if kind == "RayCluster":
            templates += [doc["headGroupSpec"]["template"]] + [
                g["template"] for g in doc["workerGroupSpecs"]
            ]
        images |= {c["image"] for t in templates if t for c in _containers(t)}
    assert images == {PLACEHOLDER}
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert re.search(r"^FROM \$\{CUDA_IMAGE\}", dockerfile, re.M)
    assert re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:[\d.]+-(cudnn-)?runtime-", dockerfile, re.M)
    setup = " ".join(yaml.safe_load((ROOT / "cluster.yaml").read_text())["setup_commands"])
    for pattern in (r'"torch==[^"]+"', r"--index-url \S+", r"--python 3\.\d+", r"\[vllm\]"):
        wanted = re.search(pattern, setup).group(0)
        assert wanted in dockerfile, f"deploy/Dockerfile lacks cluster.yaml's {wanted}"


#: Where the stored schemas come from: KubeRay's CRDs at this release, through
#: schemas/regenerate.py (README.md there says the same).  Each stored file's sha256 was
#: recorded after regenerating it from a clone at the tag and getting the same bytes; the
#: CRD files' git blob ids let anyone check the source itself (`git ls-tree v1.7.0 ...`).
KUBERAY_SOURCE = {
    "repository": "https://github.com/ray-project/kuberay",
    "release": "v1.7.0",
    "commit": "59d663aeec13760646da3db9c1cf8cfe883e30b7",
}
KUBERAY_V1_7_0_SHA256 = {  # stored file -> (source file at the release, its blob, sha256)
    "raycluster.v1.json.gz": (
        "ray-operator/config/crd/bases/ray.io_rayclusters.yaml",
        "ff0be58ada3bd457605eff1f258c16df21e61e21",
        "ba7b8513756991be575a40a308a398123eed852fc2bb2bce3d9f091576013829",
    ),
    "rayjob.v1.json.gz": (
        "ray-operator/config/crd/bases/ray.io_rayjobs.yaml",
        "c7d3f081af8cf08c256a8c33a0c3b6ea28b816a0",
        "6b79074ef4a76a42d432a0b778b79da5ba5e6862bd3e31898db3ceda59a52e29",
    ),
    "LICENSE": (  # copied unchanged
        "LICENSE",
        "1dcfa84a3fb6aae76a0fb0890ba330d3296c913d",
        "24a918b9cf6d1d0aa84f17384038bedbccdd51e815afdd9d1b49b13d4a7dd6d9",
    ),
}


def _regenerate_module():
    import importlib.util

    path = SCHEMAS / "regenerate.py"
    spec = importlib.util.spec_from_file_location("kuberay_regenerate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stored_schemas_are_kuberays_at_the_recorded_release():
    """An edited schema (or one regenerated from another release without updating the
    table above and README.md) fails here: its checksum is not the recorded one."""
    import hashlib

    assert {p.name for p in SCHEMAS.iterdir() if p.name != "__pycache__"} == {
        *KUBERAY_V1_7_0_SHA256,
        "README.md",
        "regenerate.py",
    }
    for name, (source, blob, sha256) in KUBERAY_V1_7_0_SHA256.items():
        got = hashlib.sha256((SCHEMAS / name).read_bytes()).hexdigest()
        assert got == sha256, f"{name} is not KubeRay {KUBERAY_SOURCE['release']}'s {source}"
    module = _regenerate_module()
    for kind, filename in module.CRDS.items():  # the script reads the files named above
        assert KUBERAY_V1_7_0_SHA256[f"{kind}.v1.json.gz"][0] == f"{module.CRD_DIR}/{filename}"
    readme = (SCHEMAS / "README.md").read_text()
    for value in (
        *KUBERAY_SOURCE.values(),
        *(blob for _, blob, _ in KUBERAY_V1_7_0_SHA256.values()),
    ):
        assert value in readme, f"schemas/README.md does not name {value}"
    assert f"--ref {KUBERAY_SOURCE['release']}" in readme
    assert f'default="{KUBERAY_SOURCE["release"]}"' in (SCHEMAS / "regenerate.py").read_text()
    for kind, file in SCHEMA_FILES.items():
        schema = load_schema(kind)
        assert set(schema["properties"]) >= {"apiVersion", "kind", "metadata", "spec"}
        assert module.encode(schema) == file.read_bytes()  # sorted, compact, mtime 0
    assert "Apache" in readme and "Apache License" in (SCHEMAS / "LICENSE").read_text()


@pytest.mark.skipif(
    not os.environ.get("TETHER_KUBERAY_CLONE"),
    reason="set TETHER_KUBERAY_CLONE to a clone of ray-project/kuberay to compare with it",
)
def test_stored_schemas_regenerate_from_the_kuberay_source(tmp_path):
    """The recorded checksums, checked against the source itself: the CRDs at the recorded
    commit of a KubeRay clone, through regenerate.py, give the stored files byte for byte."""
    import subprocess

    clone = os.environ["TETHER_KUBERAY_CLONE"]
    subprocess.run(
        [
            sys.executable,
            str(SCHEMAS / "regenerate.py"),
            clone,
            "--ref",
            KUBERAY_SOURCE["commit"],
            "--out",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
    )
    tags = subprocess.run(
        ["git", "-C", clone, "tag", "--points-at", KUBERAY_SOURCE["commit"]],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert KUBERAY_SOURCE["release"] in tags
    (tmp_path / "LICENSE").write_bytes(
        subprocess.run(
            ["git", "-C", clone, "show", f"{KUBERAY_SOURCE['commit']}:LICENSE"],
            check=True,
            capture_output=True,
        ).stdout
    )
    for name, (source, blob, _) in KUBERAY_V1_7_0_SHA256.items():
        assert (tmp_path / name).read_bytes() == (SCHEMAS / name).read_bytes(), name
        at = f"{KUBERAY_SOURCE['commit']}:{source}"
        assert (
            subprocess.run(
                ["git", "-C", clone, "rev-parse", at], check=True, capture_output=True, text=True
            ).stdout.strip()
            == blob
        ), at
