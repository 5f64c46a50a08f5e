"""AVG baseline: predicts the training split's mean recall for every review (upstream's 'AVG' row)."""

import numpy as np

from config import ACCEPTS_SECS
from models.base import InadequateData, Model, ReviewData


class AVG(Model):
    name = "AVG"
    accepts_secs = name in ACCEPTS_SECS  # --short --secs: same-day targets in the means and the test rows
    n_params = 0

    def __init__(self, cfg=None):
        self.mean = 0.9  # only used when a partition has no training rows

    def fit(self, train: ReviewData) -> "AVG":
        if len(train) == 0:
            raise InadequateData("no training rows")
        self.mean = float(train.rows["y"].mean())
        return self

    def predict(self, test: ReviewData) -> np.ndarray:
        return np.full(len(test), self.mean)
