"""Regenerate the KubeRay CRD schemas this directory keeps (see README.md here).

Each CRD's served ``v1`` ``openAPIV3Schema`` (not the ~1 MB CRD with its other
versions) is written as gzip-compressed, key-sorted JSON, byte-for-byte reproducible:

    git clone https://github.com/ray-project/kuberay /tmp/kuberay
    python deploy/kuberay/schemas/regenerate.py /tmp/kuberay --ref v1.7.0

``KUBERAY`` is a clone (or a bare git directory) of ray-project/kuberay; ``--ref`` is
the tag or commit to read the CRDs from.  Update README.md here with the new version.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
from pathlib import Path

import yaml

CRD_DIR = "ray-operator/config/crd/bases"
CRDS = {"raycluster": "ray.io_rayclusters.yaml", "rayjob": "ray.io_rayjobs.yaml"}
HERE = Path(__file__).resolve().parent


def v1_schema(crd: dict) -> dict:
    """The ``openAPIV3Schema`` of the CRD's ``v1`` version."""
    for version in crd["spec"]["versions"]:
        if version["name"] == "v1":
            return version["schema"]["openAPIV3Schema"]
    raise SystemExit(f"{crd['metadata']['name']}: no v1 version")


def encode(schema: dict) -> bytes:
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return gzip.compress(text.encode(), compresslevel=9, mtime=0)  # mtime 0: reproducible


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kuberay", type=Path, help="clone or bare git dir of ray-project/kuberay")
    parser.add_argument("--ref", default="v1.7.0", help="tag or commit (default: v1.7.0)")
    parser.add_argument("--out", type=Path, default=HERE, help="output directory")
    args = parser.parse_args()

    def git(*cmd: str) -> str:
        return subprocess.run(
            ["git", "-C", str(args.kuberay), *cmd], check=True, capture_output=True, text=True
        ).stdout

    commit = git("rev-parse", f"{args.ref}^{{commit}}").strip()
    for name, filename in CRDS.items():
        crd = yaml.safe_load(git("show", f"{commit}:{CRD_DIR}/{filename}"))
        out = args.out / f"{name}.v1.json.gz"
        out.write_bytes(encode(v1_schema(crd)))
        print(f"{out}: {crd['metadata']['name']} v1 from {CRD_DIR}/{filename} at {commit}")
    print(
        f"KubeRay {git('describe', '--tags', commit).strip()} ({commit}); licence: "
        f"copy {args.kuberay}/LICENSE to {args.out / 'LICENSE'} if it changed"
    )


if __name__ == "__main__":
    main()
