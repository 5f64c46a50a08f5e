"""Fixtures shared by the model tests: the upstream-check users' features (tests/check_users.py), built once."""

import pytest

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
