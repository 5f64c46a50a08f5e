"""What exists only to reproduce upstream's published numbers: its per-target padded batches and trainer
(target_batches, training, seq_torch), torch's seeded RNG without torch (torch_rng), numpy's quicksort tie orders
(legacy_sort*), and the torch modules of classical models that its trainer fits (fsrs6_torch, history_torch).
"""

from engine.jit_cache import use_cache_folder

use_cache_folder()  # numba's disk cache of this version (engine/jit_cache.py), before any kernel here is defined
