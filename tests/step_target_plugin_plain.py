"""tests/step_target_plugin.py without its fused functions: the engine's plain card loop on the same model."""

from step_target_plugin import N_ADJ, N_STATE, curve, curve_vjp, init, init_vjp, step, step_vjp  # noqa: F401
