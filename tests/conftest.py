"""Fixtures shared by the model tests: the upstream-check users' features (tests/check_users.py), built once."""

import os

import pytest

from models.legacy_sort import TIE_ORDER_ENV

# numpy 1.26's generic tie order on every CPU (not the AVX-512 one, where the CPU has it): the same numbers on every
# machine, and the order of UPSTREAM_NO_AVX512 (tests/check_users.py); set before any worker process starts
os.environ[TIE_ORDER_ENV] = "generic"

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
