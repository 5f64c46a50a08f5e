"""The two upstream-check users (../shared/data/upstream-check: real collections with upstream's own per-user
results), shared by the model tests; their features are built once per test session (tests/conftest.py)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

from data_loader import load_revlogs
from features import FeatureConfig, build_features
from models.base import ReviewData

CHECK = Path(__file__).resolve().parents[2] / "shared" / "data" / "upstream-check"
needs_check = pytest.mark.skipif(not CHECK.exists(), reason="../shared/data/upstream-check not present")


@lru_cache(maxsize=None)
def check_features(user: int, short: bool) -> ReviewData:
    """One upstream-check user's targets, day mode (`short`: same-day reviews in the histories)."""
    if not CHECK.exists():
        pytest.skip("../shared/data/upstream-check not present")
    return build_features(load_revlogs(CHECK, user), FeatureConfig(short=short))
