"""Evaluate any registered model: `python other.py --model GRU` (see `--help` for the list)."""

import sys

import models
from runner import main

if __name__ == "__main__":
    sys.exit(main(None, "Evaluate any registered model with upstream srs-benchmark's protocol.",
                  "FSRS-6", sorted(models.REGISTRY)))
