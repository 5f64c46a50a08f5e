"""Hand-written lane kernels: a model's equations over 8 cards side by side, for the compiled trainer's batches
(FSRS-6; FSRS v4, 4.5 and 5; FSRS v1-v3). Each is held by a test to its model's one-card plug-in; engine/traced_lanes.py
generates the same form from a traced model.
"""

from engine.jit_cache import use_cache_folder

use_cache_folder()  # numba's disk cache of this version (engine/jit_cache.py), before any kernel here is defined
