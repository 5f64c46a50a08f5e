"""exp, sigmoid and tanh in plain arithmetic that numba/LLVM vectorises inside a loop (AVX2: 4 doubles a time),
for every compiled kernel that needs them: the GRU family (`exp1`, `sigmoid1`, `tanh1` below), the LSTM
(`exp_bounded` in float64, `exp32` in float32), the Transformer's softmax (`exp_nonpos`) and ACT-R's sums over
past reviews (`exp_table`: scalar, not vectorised, a table instead of a long polynomial).

Why several exponentials rather than one: each row's result lines are pinned to the rounding of the one it was
measured with. They all reduce x = k·ln2 + r and evaluate a polynomial, but in different ways (and within 1 ulp
of each other, not bit for bit), and a last-bit change is not harmless everywhere: the Transformer's predictions
take few distinct values, so a 1e−15 change reorders near-ties and moves its AUC by up to 1e−3 (sim36).
Merging them means re-checking the rows whose kernels switch.

The GRU family's functions:

Why: numba calls the C library's exp and tanh one value at a time (this machine's numba has no SVML vector library),
about 6 ns and 27 ns per call, and a GRU step needs 2H exp and H tanh: once the GRU's multiply-adds ran several
cards per instruction (neural/gru_kernels.py), these calls were ~75% of its forward pass. Here the same functions
are a Cody–Waite range reduction x = k·ln2 + r (|r| ≤ ln2/2), a degree-13 Taylor polynomial for e^r − 1 and the
scale 2^k built in the exponent bits, branch-free: ~3 ns a value in a vectorised loop on this (shared) machine.
`exp1`, `sigmoid1` and `tanh1` are inlined into the caller's loop; `*_vec` run them over an array. They, `log1` and
`log1p1` are inlined by LLVM (`inlined(llvm=True)`, engine/jit.py): compiled once per caller's flags and inlined
into its machine code, rather than copied by numba into every call site. A generated lane kernel calls them ~12
times, and each copy had been numba work: FSRS-6's generated kernel 6.6 → 5.0 s to compile, FSRS-7's cold run
10.3 → 8.3 s; the same results to the bit (every row's result lines) and the same kernel speed (29 Nov 2026; the
Transformer's and the GRU's reassociating kernels still copy them, engine/jit.LLVM_INLINE_FLAGS). A loop vectorises
only when LLVM can prove at run time that what it writes does not overlap what it reads: write the results to
another array than the arguments (in place, the loop runs scalar, ~2× slower).

Accuracy: exp within 1 ulp, sigmoid within 4 and tanh within 3 ulp of the C library over the ranges tested
(tests/test_gru_lockstep.py), so results move in the last bits only (not bit-identical to math.exp / math.tanh).
Edge values follow the C library: exp overflows to inf above ~709.78 and underflows to 0 (through subnormals) below
~−745; NaN stays NaN; tanh(±large) = ±1.

How 2^k is built: t = x/ln2 + 1.5·2^52 rounds x/ln2 to the nearest integer k in t's low mantissa bits (t's ulp is
1), so k is t's bit pattern minus 1.5·2^52's (`_as_int`, a bit cast); (k + 1023) << 52 is then the bit pattern of
2^k. k is split in two halves k1 + k2 so that both scales stay normal numbers over the whole clamped range
(exp(−745) needs 2^−1075). exp1 / exp_vec have no fused multiply-adds (numba's default: the same results on every
x86 CPU). sigmoid_vec and tanh_vec, which only the GRU family calls, are compiled with fastmath "contract": the
polynomial's multiply-adds fuse (FMA on every x86-64 CPU since 2013; one without FMA computes the same code
unfused, so the last bits there differ), 3.8 → 2.6 ns a sigmoid and 5.1 → 3.6 ns a tanh (512-value arrays, min of
200 interleaved rounds), still within 2 and 3 ulp of the C library (issue #19, neural/gru_kernels.py).
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from engine.jit import inlined

_SHIFT = 6755399441055744.0  # 1.5·2^52
_SHIFT_BITS = 0x4338000000000000  # its bit pattern
_INV_LN2 = 1.4426950408889634
_LN2_HI = 0.6931471803691238  # ln2's top 32 bits: k·_LN2_HI is exact for |k| < 2^21
_LN2_LO = 1.9082149292705877e-10  # ln2 − _LN2_HI
_X_MAX = 710.0  # exp(x) = inf above ~709.78, 0 below ~−745.13: clamping there keeps k1, k2 in range
_X_MIN = -746.0
# 1/n!, n = 13 .. 1: e^r − 1 = r·(1 + r/2·(1 + r/3·(...))) written as Horner in r
_C = (1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0,
      1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0)


@intrinsic
def _as_int(typingctx, x):
    """The bit pattern of a float64 as an int64 (no conversion: one register move, vectorisable)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return types.int64(types.float64), codegen


@intrinsic
def _as_float(typingctx, x):
    """The float64 whose bit pattern is the int64 x."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


@inlined
def _expm1_parts(v):
    """(q, s1, s2) with e^v = (1 + q)·s1·s2 and e^v − 1 = q·s + (s − 1), s = s1·s2 = 2^k: v = k·ln2 + r,
    q = e^r − 1 (v clamped to [_X_MIN, _X_MAX]; 2^k as two normal powers of two, so that 2^−1075 .. 2^1024 are
    reachable; NaN passes through q)."""
    c13, c12, c11, c10, c9, c8, c7, c6, c5, c4, c3, c2, c1 = _C
    v = _X_MAX if v > _X_MAX else v
    v = _X_MIN if v < _X_MIN else v
    t = v * _INV_LN2 + _SHIFT
    kf = t - _SHIFT
    r = (v - kf * _LN2_HI) - kf * _LN2_LO
    p = c13
    p = p * r + c12
    p = p * r + c11
    p = p * r + c10
    p = p * r + c9
    p = p * r + c8
    p = p * r + c7
    p = p * r + c6
    p = p * r + c5
    p = p * r + c4
    p = p * r + c3
    p = p * r + c2
    p = p * r + c1
    k1 = _as_int((kf * 0.5 + _SHIFT)) - _SHIFT_BITS  # k1 = round(k / 2), k2 = k − k1
    k2 = _as_int(t) - _SHIFT_BITS - k1
    return p * r, _as_float((k1 + 1023) << 52), _as_float((k2 + 1023) << 52)


@inlined(llvm=True)
def exp1(v):
    """exp(v) (within 1 ulp of the C library's), as arithmetic that vectorises inside a loop."""
    q, s1, s2 = _expm1_parts(v)
    return (1.0 + q) * s1 * s2


@inlined(llvm=True)
def sigmoid1(v):
    """1 / (1 + exp(−v)), torch's sigmoid as the GRU's gates compute it."""
    return 1.0 / (1.0 + exp1(-v))


@inlined(llvm=True)
def tanh1(v):
    """tanh(v) = e / (e + 2) with e = expm1(2v) (accurate near 0 too); |v| > 25 gives ±1 exactly, as tanh does in
    double."""
    q, s1, s2 = _expm1_parts(2.0 * (25.0 if v > 25.0 else (-25.0 if v < -25.0 else v)))
    s = s1 * s2
    e = q * s + (s - 1.0)
    return e / (e + 2.0)


@njit(cache=True, error_model="numpy")
def exp_vec(x, out):
    """out[i] = exp(x[i]). out may be x, but a loop that writes what it reads does not vectorise: LLVM checks at run
    time that the arrays do not overlap, else runs the scalar loop."""
    for i in range(len(x)):
        out[i] = exp1(x[i])


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def sigmoid_vec(x, out):
    """out[i] = 1 / (1 + exp(−x[i])) (as exp_vec: fast only with out apart from x; fused multiply-adds, see the
    module docstring)."""
    for i in range(len(x)):
        out[i] = sigmoid1(x[i])


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def tanh_vec(x, out):
    """out[i] = tanh(x[i]) (as exp_vec: fast only with out apart from x; fused multiply-adds, as sigmoid_vec)."""
    for i in range(len(x)):
        out[i] = tanh1(x[i])


# ------------------------------------------------------------------ the LSTM's (neural/lstm_kernels.py)

EXP_BOUND = 40.0  # σ(±40) and tanh(±20) are 0 or 1 to within 5e−18: no larger argument is needed
INV_FACTORIAL = tuple(1.0 / math.factorial(k) for k in range(15))


@inlined(error_model="numpy")
def exp_bounded(x):
    """e^x for x clamped to ±EXP_BOUND in plain arithmetic, so that the loops over the activations vectorise (libm's
    exp is one call per element: ~4× slower here, the largest cost of the forward pass): e^(x/64) by its Taylor
    series to degree 14 (Estrin's scheme), squared 6 times; relative error below 1e−13."""
    y = min(max(x, -EXP_BOUND), EXP_BOUND) * (1.0 / 64.0)
    c = INV_FACTORIAL
    y2 = y * y
    p = ((((c[14] * y2 + (c[12] + c[13] * y)) * y2 + (c[10] + c[11] * y)) * y2 + (c[8] + c[9] * y)) * y2
         + (c[6] + c[7] * y)) * y2 + (c[4] + c[5] * y)
    p = (p * y2 + (c[2] + c[3] * y)) * y2 + (c[0] + c[1] * y)
    p = p * p
    p = p * p
    p = p * p
    p = p * p
    p = p * p
    return p * p


LN2_HI = 0.693359375  # ln 2 = LN2_HI + LN2_LO, LN2_HI with 9 significant bits: n·LN2_HI is exact in float32
LN2_LO = math.log(2.0) - LN2_HI
LOG2E = 1.0 / math.log(2.0)


@intrinsic
def _f32_from_bits(typingctx, bits):
    """The float32 whose bit pattern is the int32 `bits` (an LLVM bitcast: vectorises, unlike math.ldexp)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


@inlined(error_model="numpy")
def exp32(x):
    """e^x in float32 for x clamped to ±EXP_BOUND, in plain arithmetic so the loops vectorise 8 floats wide: x =
    n·ln 2 + r (|r| ≤ ln2/2, Cody–Waite's two-part ln 2), e^r by its Taylor series to degree 7 (truncation below
    2e−8 relative), times 2^n made from its exponent bits. Error within a few float32 ulps."""
    f = np.float32
    x = min(max(x, f(-EXP_BOUND)), f(EXP_BOUND))
    n = np.floor(x * f(LOG2E) + f(0.5))
    r = (x - n * f(LN2_HI)) - n * f(LN2_LO)
    p = f(1.0 / 5040.0) * r + f(1.0 / 720.0)
    p = p * r + f(1.0 / 120.0)
    p = p * r + f(1.0 / 24.0)
    p = p * r + f(1.0 / 6.0)
    p = p * r + f(0.5)
    p = p * r + f(1.0)
    p = p * r + f(1.0)
    return p * _f32_from_bits((np.int32(n) + np.int32(127)) << np.int32(23))


# --------------------------------------------------------- the Transformer's (neural/transformer_kernels.py)

_TF_EXP_FLOOR = -708.0  # exp(−708) ≈ 3e−308, the smallest result kept normal


@inlined
def exp_nonpos1(x):
    """One value of exp_nonpos (below), for loops that vectorise across other axes (the Transformer's lane kernel,
    neural/transformer_lanes.py): the same operations, so the same result."""
    v = _TF_EXP_FLOOR if x < _TF_EXP_FLOOR else x
    k = np.floor(v * _INV_LN2 + 0.5)  # an integer in [−1022, 0], as a float: vroundpd, no int64 conversion
    r = (v - k * _LN2_HI) - k * _LN2_LO
    p = 1.0 / 6227020800.0
    p = p * r + 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    # 2^k in the exponent bits; through int32 (AVX2 converts doubles to int32 in vectors, not to int64)
    return p * np.int64((np.int64(np.int32(k)) + 1023) << 52).view(np.float64)  # NaN: p is NaN already


@inlined
def exp_nonpos(x, out, n):
    """out[:n] = exp(x[:n]) for x <= 0 (the softmax's shifted scores), written so that the compiler vectorises
    it (a scalar math.exp call per element was most of the forward pass): x = k·ln 2 + r, |r| <= ln2/2, exp(r) by
    its Taylor polynomial to degree 13 (truncation < 1e−17), times 2^k built in the exponent bits (k rounded as
    a float and converted through int32: a float→int64 conversion has no AVX2 vector form and kept the loop
    scalar, ~3.4 ns an exp against ~2 now). Within a few
    ulp of math.exp where the result matters (tests/test_transformer_compiled.py; far below the softmax's largest
    term, 1, a reassociated reduction may lose digits of a term that weighs nothing); below −708 the result is
    exp(−708) instead of a subnormal; a NaN stays NaN. x and out may be the same array."""
    for m in range(n):
        out[m] = exp_nonpos1(x[m])


# ------------------------------------------------- ACT-R's and DASH[ACT-R]'s (models/act_r.py, models/dash.py)

def _two_to_the_i_over_128() -> np.ndarray:
    """Bit patterns of the doubles nearest 2^(i/128), i = 0..127, from 60-digit decimal arithmetic (so the table does
    not depend on this machine's pow): powers of one 2^(1/128), whose 128 products lose ~1e−57 relative, far below
    a double's rounding (one Decimal exp per entry gave the same table but cost ~6–18 ms per process at import)."""
    from decimal import Decimal, localcontext

    values = []
    with localcontext() as ctx:
        ctx.prec = 60
        step = (Decimal(2).ln() / 128).exp()
        x = Decimal(1)
        for _ in range(128):
            values.append(float(x))
            x *= step
    return np.array(values, dtype=np.float64).view(np.int64)


_EXP2_TABLE_BITS = _two_to_the_i_over_128()


def _ln2_lo() -> float:
    """ln 2 − _LN2_HI to double precision from 50-digit ln 2 (ln 2's double has already lost these digits)."""
    from decimal import Decimal, localcontext

    with localcontext() as ctx:
        ctx.prec = 50
        return float(Decimal(2).ln() - Decimal(_LN2_HI))


_INV_LN2_128 = 128.0 / math.log(2.0)
_LN2_128_HI = _LN2_HI / 128.0  # ln2's top 32 bits: k·_LN2_128_HI is exact for |k| < 2^21 (|x| <= 709: |k| < 2^17)
_LN2_128_LO = _ln2_lo() / 128.0
_TABLE_EXP_MIN = -708.0  # below it the result is subnormal or 0, above _TABLE_EXP_MAX it overflows: libm's exp
_TABLE_EXP_MAX = 709.0


@inlined
def exp_table(x):
    """e^x within ~1 ulp of the C library's, for the scalar loops where libm's exp call was the largest single
    cost (ACT-R's and DASH[ACT-R]'s sums over past reviews: one exp per pair, a few pairs per loop, so nothing to
    vectorise): x = (128·e + i)·ln2/128 + r with |r| <= ln2/256, e^x = 2^e · 2^(i/128) · e^r, 2^(i/128) from a
    128-entry table, e^r by its Taylor polynomial to degree 5 (truncation < 1e−18 relative). A dozen flops and one
    load, inlined; libm's exp is a call. Outside [−708, 709] (subnormal results, 0, overflow, NaN) it calls libm."""
    if not (_TABLE_EXP_MIN < x < _TABLE_EXP_MAX):
        return math.exp(x)
    kd = x * _INV_LN2_128 + _SHIFT  # round(x·128/ln2) in the low mantissa bits
    k = _as_int(kd) - _SHIFT_BITS
    kd -= _SHIFT
    r = (x - kd * _LN2_128_HI) - kd * _LN2_128_LO
    scale = _as_float(_EXP2_TABLE_BITS[k & 127] + ((k >> 7) << 52))
    p = r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0)))))
    return scale + scale * p


# ------------------------------------------- a log and log1p that vectorise (FSRS-6's lanes, the LSTM's heads)

@intrinsic
def _lshr(typingctx, x, n):
    """x >> n as a LOGICAL shift of an int64 (numba's >> on int64 is arithmetic, which AVX2 has no vector form
    for, so a loop using it stays scalar; vpsrlq is the logical one)."""
    def codegen(context, builder, signature, args):
        return builder.lshr(args[0], args[1])
    return types.int64(types.int64, types.int64), codegen


_TWO52_BITS = 0x4330000000000000  # 2^52: its bit pattern OR a small integer i is the double 2^52 + i
_LOG_SHIFT = 0x00095F6200000000  # (0x3ff00000 − 0x3fe6a09e) << 32: moves the mantissa's cut from 1 to √2/2
_LOG_MANT = 0x000FFFFFFFFFFFFF
_LOG_HALF_SQRT2 = 0x3FE6A09E00000000  # high word of √2/2 (its low word is the mantissa's own)
_LOG_K_OFFSET = 4503599627370496.0 + 1023.0  # 2^52 + the exponent bias
_TWO54 = 18014398509481984.0
_MIN_NORMAL = 2.2250738585072014e-308
# ln(1 + f) = f − f²/2 + s·(f²/2 + R(s²)), s = f / (2 + f): the minimax coefficients of R from fdlibm's e_log.c
_LG1, _LG2, _LG3, _LG4 = 6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01, \
    2.222219843214978396e-01
_LG5, _LG6, _LG7 = 1.818357216161805012e-01, 1.531383769920937332e-01, 1.479819860511658591e-01


@inlined(error_model="numpy")
def _log_core(x):
    """ln x for a positive finite x (subnormals included), branch-free: x = 2^k·m with m in [√2/2, √2) found in
    the bits (k as a double by the 2^52 trick: AVX2 has no int64→double conversion), then fdlibm's reduction
    f = m − 1, s = f/(2 + f) and its degree-14 odd polynomial."""
    sub = x < _MIN_NORMAL
    xs = x * _TWO54 if sub else x
    u = _as_int(xs) + _LOG_SHIFT
    m = _as_float((u & _LOG_MANT) + _LOG_HALF_SQRT2)
    k = _as_float(_lshr(u, 52) | _TWO52_BITS) - _LOG_K_OFFSET
    k = k - 54.0 if sub else k
    f = m - 1.0
    hfsq = 0.5 * f * f
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (_LG2 + w * (_LG4 + w * _LG6))
    t2 = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7)))
    return s * (hfsq + (t2 + t1)) + k * _LN2_LO - hfsq + f + k * _LN2_HI


@inlined(error_model="numpy", llvm=True)
def log1(x):
    """ln x within 1 ulp of the C library's, as arithmetic that vectorises inside a loop (numba calls libm's log
    one value at a time). Edges as libm: log(0) = −inf, log(x < 0) = NaN, log(inf) = inf, NaN stays NaN."""
    r = _log_core(x)
    if x > 0.0 and x < math.inf:
        return r
    if x == 0.0:
        return -math.inf
    return x if x == math.inf else math.nan


@inlined(error_model="numpy", llvm=True)
def log1p1(x):
    """ln(1 + x) to within a few ulp for any x > −1 (vectorisable, as log1): u = 1 + x rounded, then
    ln(1 + x) = ln u + c/u with c = (1 + x) − u recovered exactly (Sterbenz: x − (u − 1) while u < 2, else
    1 − (u − x)); for tiny x, u = 1 and the result is c = x. Edges: −1 gives −inf, below −1 NaN, inf inf."""
    u = 1.0 + x
    c = (1.0 - (u - x)) if u >= 2.0 else (x - (u - 1.0))
    r = _log_core(u) + c / u
    if x > -1.0 and x < math.inf:
        return r
    if x == -1.0:
        return -math.inf
    return x if x == math.inf else math.nan


@njit(cache=True, error_model="numpy")
def log_vec(x, out):
    """out[i] = ln x[i] for every x, libm's values at the edges (log1's); out apart from x, as for exp_vec. One
    loop that LLVM vectorises (the LSTM's heads: all of a chunk's targets' logs at once)."""
    for i in range(len(x)):
        out[i] = log1(x[i])
