"""Fixtures shared by the model tests: the upstream-check users' features (tests/check_users.py), built once."""

import os

import pytest

from upstream.legacy_sort import TIE_ORDER_ENV

# the published results' tie order (numpy 2.2 on an AVX-512 CPU; upstream/legacy_sort.py), the default, pinned so that
# a developer's own SRS_BENCH_TIE_ORDER cannot change what the tests hold; set before any worker process starts
os.environ[TIE_ORDER_ENV] = "published"

from check_users import check_features


@pytest.fixture
def user8():
    return check_features(8, False)


@pytest.fixture
def user8_short():
    return check_features(8, True)


@pytest.fixture
def user12():
    return check_features(12, False)


@pytest.fixture
def user12_short():
    return check_features(12, True)


@pytest.fixture(scope="session")
def user8_lstm():
    """User 8 with the LSTM's inputs (same-day histories, fractional intervals, durations, equalized rows)."""
    from check_users import CHECK
    from data_loader import load_revlogs
    from features import FeatureConfig, build_features
    from models.lstm import attach_sequences

    rev = load_revlogs(CHECK, 8)
    return attach_sequences(build_features(rev, FeatureConfig(short=True)), rev)
