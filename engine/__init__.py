"""How models are compiled and trained, for every model alike: numba's set-up and cache (jit, jit_cache), the
one-pass-per-card engine and its plug-in contract (seq_engine, seq_model, seq_model_stub), the tracer that turns a
torch-style model into a compiled plug-in with its lanes (traced, traced_codegen, traced_lanes), the card-major
autograd engine, L-BFGS, the prefix tree, and the shared vectorisable maths (kernel_math, vec_math, lanes).
"""

from engine.jit_cache import use_cache_folder

use_cache_folder()  # numba's disk cache of this version (engine/jit_cache.py), before any kernel here is defined
