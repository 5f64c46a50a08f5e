"""FSRS-6's published constants, shared by the torch model (fsrs6.py) and the compiled trainer (fsrs6_fast.py)."""

# Defaults: per-parameter medians of per-user fits (fsrs-optimizer since 2025-06, fsrs-rs DEFAULT_PARAMETERS).
DEFAULT_W = [0.212, 1.2931, 2.3065, 8.2956, 6.4133, 0.8334, 3.0194, 0.001, 1.8722, 0.1666, 0.796, 1.4835, 0.0614,
             0.2629, 1.6483, 0.6014, 1.8729, 0.5425, 0.0912, 0.0658, 0.1542]
# Prior widths of the L2 pull towards the post-S0 weights.
SIGMA = [6.43, 9.66, 17.58, 27.85, 0.57, 0.28, 0.6, 0.12, 0.39, 0.18, 0.33, 0.3, 0.09, 0.16, 0.57, 0.25, 1.03, 0.31,
         0.32, 0.14, 0.27]
S_MIN = 0.001
S_MAX = 36500.0
# Box constraints applied after every optimizer step (published run: w19 lower bound 0).
CLIP_LO = [S_MIN] * 4 + [1, 0.001, 0.001, 0.001, 0, 0, 0.001, 0.001, 0.001, 0.001, 0, 0, 1, 0, 0, 0, 0.1]
CLIP_HI = [100] * 4 + [10, 4, 4, 0.75, 4.5, 0.8, 3.5, 5, 0.25, 0.9, 4, 1, 6, 2, 2, 0.8, 0.8]
LR = 4e-2  # Adam learning rate of both trainers
