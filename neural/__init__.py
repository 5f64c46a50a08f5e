"""The neural networks' compiled, batched and torch paths (GRU / GRU-P, NN-17, the LSTM, the Transformer): their
card batches and fine-tune recipe (card_net, card_fit, neural_seq), compiled kernels, torch modules and the batched
paths that train many users at once. The models themselves (classes, metadata) are in models/.
"""

from engine.jit_cache import use_cache_folder

use_cache_folder()  # numba's disk cache of this version (engine/jit_cache.py), before any kernel here is defined
