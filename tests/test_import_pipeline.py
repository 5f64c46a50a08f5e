"""Issue 3 × issue 2: collections converted by build_dataset.py go through the feature pipeline like the real data
set, and give upstream's evaluated-review counts for the two collections upstream itself was run on."""

from pathlib import Path

import pytest

import build_dataset as bd
from data_loader import list_user_ids, load_revlogs
from features import FeatureConfig, NotEnoughData, build_features
from split import evaluated_size

from check_users import UPSTREAM

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "anki"
EMBEDDED = Path(__file__).resolve().parents[1] / "data" / "embedded"


@pytest.mark.parametrize("name, upstream_user, targets", [
    ("kedarmhaswade-my-anki-decks.anki21", "8", 4450),
    ("illdepence-kanjiplot.anki2", "12", 3668),
    ("kedarmhaswade-SAT-math-formulas.colpkg", None, 14),
    ("kedarmhaswade-english-vocab-2023.apkg", None, 0),
])
def test_converted_collection_runs_through_features(name, upstream_user, targets):
    revlogs, _, _, _ = bd.convert_collection(FIXTURES / name)
    for fcfg in (FeatureConfig(), FeatureConfig(short=True)):
        if targets == 0:
            # 94 reviews over 6 days: every first interval falls in a cell the outlier rule removes
            with pytest.raises(NotEnoughData):
                build_features(revlogs, fcfg)
            continue
        data = build_features(revlogs, fcfg)
        assert len(data) == targets
        if upstream_user:
            expected = UPSTREAM["FSRS-6"][upstream_user]["size"]
            assert evaluated_size(len(data)) == expected


def test_embedded_data_set_is_what_the_runner_reads():
    assert list_user_ids(EMBEDDED) == [1, 2, 3, 4]
    assert [len(build_features(load_revlogs(EMBEDDED, u))) for u in (1, 2, 3)] == [4450, 3668, 14]
