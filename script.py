"""Evaluate the FSRS family on every user: `python script.py --processes 8`.

Flags mirror upstream srs-benchmark's script.py (`--dry`, `--pretrain`, `--binary`, `--recency`, `--partitions`,
...); run `python script.py --help` for all of them. Results go to result/<name>.jsonl, one line per user.
"""

import sys

import models
from runner import main

FSRS_FAMILY = [name for name in models.REGISTRY if name.startswith("FSRS")]

if __name__ == "__main__":
    sys.exit(main(None, "Evaluate FSRS models with upstream srs-benchmark's protocol (TimeSeriesSplit(5), "
                        "Log Loss / RMSE(bins) / AUC per user).", "FSRS-6", FSRS_FAMILY))
