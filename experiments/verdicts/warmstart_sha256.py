"""The warm start each run of a verdict record began from, by content (sha256 of its weights).

The same seed's warm start rebuilt on another machine need not give the same weights, and
the parts' pairs across machines assume it does; run_part.sh writes this beside each record
(<spec>-<part>.warmstart.sha256), while the part's model cache is still on its machine.

    python experiments/verdicts/warmstart_sha256.py experiments/verdicts/records/a_d-1002.json.gz
"""

import pathlib
import sys

from tether.analysis import records
from tether.policy.load import weights_sha256


def main(record: str) -> None:
    for path in sorted({run.tags["tether.model_path"] for run in records.load(record)}):
        weights = pathlib.Path(path, "model.safetensors")
        if not weights.is_file():
            sys.exit(
                f"warmstart_sha256: {weights} is not on this machine: the record's warm start is gone"
            )
        print(f"{weights_sha256(path)}  {pathlib.Path(path).name}")


if __name__ == "__main__":
    main(*sys.argv[1:])
