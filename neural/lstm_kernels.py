"""The LSTM row's network (models/lstm.py, spec models.md §2.3) and its reverse pass in numba: `lstm_cards_loss` is
neural/card_fit.py's card_loss for the LSTM.

Why compiled: stepped in torch, the fine-tune (20 passes per fold, two stacked nn.LSTMs and ~20 other operations per
time step, autograd and AdamW around them) cost ~47 s per 100k reviews, the most of any row. Here one forward and
one reverse pass per card:
- the cards of a call, sorted by length, are cut into chunks of ≈ CHUNK_STEPS steps; in a chunk their steps are
  laid out time-major as torch's PackedSequence does (cards sorted by length, longest first; block k holds step k
  of every card still running), so each layer that acts per position is ONE matrix product over all the chunk's
  steps, and each LSTM step is one product over the cards still running (np.dot: BLAS; cards of like length in a
  chunk make these products fewer and larger: a product of 10 rows costs ~2× per row one of 100 rows);
- a card runs up to its last target's history only (CardSet's c_steps), and the layers after the LSTMs (the MLP
  ResBlock, the output layer) and the heads run only at the rows some target reads (the last step of its history):
  with same-day reviews in the histories and never targets, 30–45% of the rows are read by no target (sim36 users)
  and only need the LSTMs, whose state carries on (~10% per pass);
- the reverse pass walks the same layers backwards; the weight gradients are products over all steps at the end;
- every array a chunk needs lives in one work space made once per call (`workspace`) and shared by its chunks:
  made afresh per chunk, the ~50 arrays (several above malloc's mmap threshold, so returned to the kernel on every
  free) cost about as much as the arithmetic in page faults.

Precision (`model[4]`, a zero of the dtype: numba compiles one version per dtype): float32 is the default run's
(models/lstm.py PRECISION; upstream's LSTM runs in torch's float32 too), float64 the reference that
tests/test_lstm_compiled.py holds equal to torch autograd (other.py --precision float64). In float32 the work space,
the weights (rounded from the optimizer's float64 copy at each call), the BLAS products (sgemm) and the per-element
arithmetic are float32 (`like` gives every constant the arrays' dtype, since a float64 constant would widen the
expression; `exp32` (engine/vec_math.py) vectorises 8 wide), so twice the elements per vector instruction
and half the memory traffic. What stays float64: the heads (per target: softmax, pow, log, three exp, the BCE, and
dL/d(logits); only the reverse's two products over the targets run in the network's dtype), the loss sum, each
chunk's gradient summed into the float64 gradient (so sums over many chunks keep their digits), and the optimizer
(AdamW state, gradient norm and clipping, the master weights, in card_fit). Measured on a fixed real batch (a
simulated user's 2,000 cards, 10k steps, loss and gradient, one thread, old and new alternated in one
process, medians of 8): the float64 kernel before these changes ≈ 5 µs per step; the read rows alone 1.06–1.10×;
float32 with float64 per-element arithmetic 1.25×; float32 throughout, with LayerNorm's row sums four rows at a
time (independent addition chains, each row still summed in its own order, so float64 is unchanged bit for bit;
~2× per LayerNorm) 1.6×. Whole runs: the LSTM row's projection for 10,000 users (bench/bench_executors.py project)
37.0 CPU-hours against 53.6 for the kernels before, measured back to back on a busy machine.

Where a pass goes (profiled on one fine-tune group of a 45k-review simulated user: 22k packed rows in 43 chunks,
float32, one core; each part timed alone on the chunks' real layouts, min of 5; a busy machine, so ±20%): the whole
forward + reverse ≈ 3.1–4 µs per row. Per LSTM layer: forward ≈ 0.36–0.48 µs (the input product ≈ 0.08–0.10, the
per-step recurrent products ≈ 0.10, gates and cell ≈ 0.18), reverse ≈ 0.46–0.65 µs (gate gradients ≈ 0.16, scalar
code; per-step recurrent products ≈ 0.17; the weight gradients dgᵀ·h_prev and dgᵀ·u ≈ 0.1–0.2 each, sgemm with a
transposed operand; dL/du ≈ 0.08). Per call on all rows: linear ≈ 40 ns, its reverse ≈ 90, LayerNorm ≈ 40, its
reverse ≈ 27, SiLU ≈ 62 before it ran flat (below). The heads ≈ 17% of a pass (the pass without them: 0.83×,
paired). perf: the BLAS library ≈ 38% of the kernel's samples, a third of that its packing copies (operands with
20 columns). 95% of the rows are in steps with ≥ 17 cards running, where sgemm costs about what hand-written loops do
(20→80 product at 16–128 cards: 70–110 ns per row by hand, 86–130 by sgemm; at 4 cards 110 against 400).
Changed after that profile (each checked bit for bit on that group; the embedded data's result lines identical):
the biases and the recurrent term are added where the gates are activated, and the recurrent gradient written
straight into dh_rec (fewer passes over [N, 4H]); the heads' nine logits as nine independent sums and base^(−d) as
exp(−d·ln base) (libm's pow was the costliest call per target; P(recall) moves by ≤ 2e−16); SiLU, its reverse and
the residual additions over their arrays flat. Together ≈ 0.9× per pass (paired medians of 101 alternations in one
process; 0.95× of it the flat layers); the LSTM row's projection for 10,000 users (bench/bench_executors.py project),
old and new alternated twice back to back: 33.9 → 33.2 and 35.7 → 31.0 CPU-hours (166.97 → 163.47 and 176.41 →
153.24 ms per 1k raw reviews). Tried and not kept: the cell and gate-gradient loops split into short per-row
loops that vectorise (vectorised, same bits, not faster: 1.02×); hand-written fixed-size products for the
recurrence and the weight gradients (faster alone at few cards, no faster in place); chunks of 128–2048 steps (none
faster; 128: 1.17× slower); column sums of the reverse linears into a fresh array (0.996×); the cells' tanh over a
step's rows flat (0.999×).

The heads batched per chunk (`heads_forward`, `heads_backward`; 2026-11-24): the per-target scalar heads above were
rewritten over all of a chunk's targets at once, the transcendentals over flat arrays (vec_math.exp_vec and the
new log_vec, both within 1 ulp of libm, so P(recall) moves by ≤ 3e−16), the logits with the targets innermost
(same bits), the reverse as two float64 products; and lstm_backward's two weight gradients as one product
dgᵀ·[h_prev | u]. Paired in one process (old and new kernels alternated 40 times, float32, one thread, the
fine-tune's groups of sim36 users 19, 10, 27 and 5; CPU time): 1.115× per pass (heads 1.07×, fused weight
gradients 1.03–1.04×, logits 1.01×); the heads now ≈ 90–120 ns per target forward and ≈ 75 backward (was ≈ 17% of
a pass, now ≈ 5%). Where a pass goes now (perf, samples attributed to the compiled functions by address; user 19,
float32, one core): BLAS ≈ 42% (sgemm's kernel 26%, its packing copies 15%), lstm_forward's gates and cells 16%
(the gates ≈ 1.6 ns per activation: exp32 and a division, vectorised; a flat loop over a step's whole block is
≈ 1.3, compute-bound without FMA), layer_norm_back 7%, layer_norm 6%, lstm_backward 8%, the heads 5%, SiLU and
its reverse 5%, the per-chunk set-up 2%. Tried and not kept: the biases folded into the gate activations (same
bits, 1.0×); layer_norm_back's and linear_back's column sums into arrays of their own (same bits in float32,
1.00–1.01× in place though 1.15× for the call alone); the transposed weights made C-contiguous for the forward
products (other sgemm packing, P(recall) moved 1e−8, 1.00×).

FMA and products that add (2026-11-24, branch lstm3): perf of the kernel above (user 19, float32, one core, attached
after compilation): sgemm's kernel 25%, its packing copies 12%, OpenBLAS zeroing np.dot's outputs (memset, beta = 0)
2.5%; lstm_forward 17%, lstm_backward 8%, the LayerNorms 11%, SiLU 5%, the heads 5.5%. Two changes, each measured
alone against the kernel before it (pair: old and new alternated 15 times in one process on the fine-tune groups of
sim36 users 19, 10, 27 and 5, float32, one thread, CPU time; the busy machine's noise ±5%):
- fastmath per function (`FAST`, `EXACT_EXP`): numba emits no FMA without "contract"; with it every a·b + c of the
  per-element code (the exp32 polynomial, the cells, LayerNorm, the gate gradients, the heads' logits) is one
  instruction and one rounding: 1.12× (paired median; 1.11× by minima); "reassoc"/"nsz" on the functions without an
  inlined exponential another 1.01–1.04×. The 80 gates activated in one loop (tanh as 2·σ(2z) − 1: same bits) was
  1.008× alone and is kept because it is one loop instead of three;
- `gemm_acc` (beta = 1): the biases written first and the products added onto them, the per-step recurrent term
  added onto the gates' rows (no scratch), linear_back's weight gradients into the chunk's gradient: 1.04×.
Both together: the row's projection for 10,000 users (bench/bench_executors.py project), main's kernel and this
one back to back three times on the busy machine: 28.40 → 27.48, 25.59 → 23.31, 28.25 → 23.47 CPU-hours (140.5 →
135.9, 124.8 → 115.3, 139.7 → 115.6 ms per 1k raw reviews; paired ratios 1.03, 1.10, 1.20, medians 28.25 → 23.47;
the 45k-review user 6.79 → 6.02, 5.47 → 5.13, 6.52 → 5.38 s); the result lines of the embedded users and sim36
users 5, 10, 15, 19, 25, 30 equal to main's (sizes, Log Loss, RMSE(bins) to the printed digit; one AUC by 1e−6).
The float32 gradient moves by ≤ 2.5e−7 relative to the kernel before (the loss by 1.2e−9, P(recall) by ≤ 1.3e−7);
the float64 path stays equal to torch autograd (tests/test_lstm_compiled.py). Not measured for want of time: the
LayerNorms (all six are followed by a linear) folded into that linear (γ into its weights' columns, so the forward
writes only x̂ and the reverse sums dL/dγ over 20×20 or 80×20 weight entries instead of the rows), the backward's
per-step dL/dh_prev and dL/du as one product per step, larger chunks for the per-position layers.

On AMD Zen 4 (AVX-512; OpenBLAS 0.3.31 runs its SkylakeX kernels; 2026-11-24, branch lstm4): perf of the kernel
above (the 45k-review user's fine-tune pass, 40k rows, float32, one core, ≈ 1.4 µs per row): BLAS 44% (sgemm's
packed kernel 21%, its small-matrix kernels 14%, packing copies 8%), the compiled code 53%. OpenBLAS multiplies
small matrices (M·N·K ≤ 100³) with kernels that skip the packing, and those measured faster on every product here;
products alone (CPU time, min of 5): the weight gradient dgᵀ·[h_prev | u] ([80, 40] over a chunk's ~512 rows) 100 ns
per row in one product, 59 in blocks of ≤ 312 rows (`SMALL_MNK`); u·w_ihᵀ [N, 20]·[20, 80] 36 ns per row with w_ih
untransposed ("t") and 31 with w_ihᵀ C-contiguous ("n", `dot_acc`); the recurrence's per-step h·w_hhᵀ at 8, 17, 43,
128 cards 108, 76, 53, 40 ns per row against 38, 36, 32, 31. Paired (bench/bench_lstm.py: lstm_cards_loss on one
fine-tune pass of sim36 users 19, 10, 27, 5, the old and new kernels alternated 7 times each in one process, float32,
one thread, CPU time): the blocked weight gradient 1.078× (per user 1.07–1.08), the transposed weights in the
LSTM's forward products another 1.033× (1.03–1.04), both 1.110× against the kernel before (1.10–1.12; the
45k-review user's pass, 40k rows in 2 groups: 1.118×, 9 pairs). The float32 gradient moves by ≤ 2.4e−7 of its
largest entry, the loss and P(recall) not at all (float64: 2e−16). The LSTM row's projection for 10,000 users
(bench/bench_executors.py project), main's kernel and this one back to back four times: 13.91 → 13.03, 12.85 →
11.71, 12.95 → 12.22, 13.00 → 12.02 CPU-hours (68.5 → 64.5, 63.6 → 57.7, 64.0 → 60.0, 64.1 → 59.5 ms per 1k raw
reviews; paired 1.07, 1.10, 1.06, 1.08); a pass is ≈ 1.2 µs per row now, the LSTM layers ≈ 130 ns per row
forward and ≈ 190 reverse each (alone, 512-row chunks; their products ≈ 63 and ≈ 124 of it).
Measured and not kept: dL/dh_prev and dL/du of a step as one product dg·[w_hh | w_ih] ([nk, 80]·[80, 40]: 61–65
ns per row against 31–34 + 31 for the two products; dL/du is already one product over the chunk after the
recurrence); hand-written products with FMA for the per-step 20→80 product (a row at a time, the 80 outputs
innermost or the 20 terms innermost: 107–550 ns per row against sgemm's 31–38); the 20×20 linears with transposed
weights (12.5 against 12.3 ns per row alone: no gain); the gate-gradient loop of lstm_backward split into three
per-row loops of few arrays each (dh and dc in place, the four gate gradients, dc and h_prev to the previous step;
0.983× paired, 28 pairs); chunks of 1024 steps (0.95×) or 256 (1.00×; sim36 users 19
and 27, 7 pairs each). Not tried for want of a clear gain: each LayerNorm folded into the linear after it (γ into
its weight columns, β into its bias) would save what writing y = x̂·γ (+ β) and summing dL/dγ over the rows cost: a
LayerNorm alone without them ([512, 20] float32, min of 5) 13.4 against 16.6 ns per row forward, 10.9 against 12.6
reverse, ≈ 24 ns per row for the ≈ 4.8 LayerNorms a row passes (3 at every row, 3 at the read rows): ≈ 2% of a
pass at most, before the folded weights and their gradients per chunk.

The LayerNorms again (2026-11-24, branch ln5). Each part timed alone on a [512, 20] array (float32, CPU time, min
of 7 × 2000 calls from a compiled loop, so without dispatch): layer_norm 16.8–17.1 ns per row (17.9–18.0 with β), of
which the two row sums ≈ 6.5 (four rows at a time: latency-bound scalar chains) and writing x̂, y ≈ 4.0;
layer_norm_back 12.7–13.4 (15.8–16.5 with β): the two sums ≈ 4.3, gx ≈ 5.2, dL/dγ added into memory at every row
≈ 4.2. Two changes, kept together:
- layer_norm writes x̂ once, from x − μ again, instead of storing x − μ, then scaling it and reading it back:
  13.5–14.0 (14.5–14.7 with β); float32 moves by ≤ 1 ulp (LLVM regroups (x − μ)·σ⁻¹ once it is not stored);
- dL/dγ and dL/dβ of each LayerNorm from the weight gradient of the layer after it (a linear, or an LSTM's input
  product; `ln_weight_grads`): that gradient taken over x̂ instead of y = x̂·γ + β, G = gzᵀ·x̂, then dL/dw = G·diag(γ)
  (+ Σgz·βᵀ), dL/dγ_j = Σ_i G[i, j]·w[i, j], dL/dβ_j = Σ_i (Σgz)_i·w[i, j]: [20, 20] or [80, 20] per chunk instead
  of sums over the rows; layer_norm_back (only dL/dx now) 8.9–9.2 with or without β; linear_ln_back 25.1 against
  linear_back's 24.7. The LSTMs get x̂ as their `u` (lstm_backward reads u only for dL/dw_ih).
Paired (bench/bench_lstm.py, sim36 users 19, 10, 27, 5, 7 pairs each): the first alone 1.009×, with the second for
the four linear-fed LayerNorms 1.015×, for all six 1.033× (per user medians 1.04, 1.04, 1.04, 1.03); then
layer_norm_back adding dL/dx onto the residual stream's gradient where one follows (`acc`: three `add` passes
fewer) another 1.025× (11 pairs each against the kernel before it; per user 1.02–1.03). Both against main's
kernel: 1.043× (9 pairs; per user medians 1.04, 1.05, 1.04, 1.04), the 45k-review user's pass (/tmp/big45,
40k rows in 2 groups) 1.053× (9 pairs). The row's projection (bench/bench_executors.py project --rows LSTM), main
and this back to back 7 times on a busy machine (load ≈ 2 on 2 cores): 12.00 → 11.98, 12.10 → 12.31, 12.42 →
11.52, 11.96 → 11.84, 11.91 → 11.18, 12.52 → 12.21, 12.28 → 13.18 CPU-hours (median ratio 1.01; the 45k-review
user 2.72 → 2.63 s, medians 12.10 → 11.98 CPU-hours). The float32
gradient moves by ≤ 1.0e−6 of its largest entry (the output layer's weights), its distance to the float64 gradient
unchanged (max 1.4e−7–8.1e−7 against 1.0e−7–9.0e−7 before; rms 3.8e−9–2.2e−8 against 3.4e−9–2.3e−8), the loss by
≤ 3e−9, P(recall) by ≤ 1e−7; float64 by ≤ 3.4e−15. Measured and not kept: numba compiles with LLVM's SLP
vectoriser off (NUMBA_SLP_VECTORIZE=0), so a loop over range(H), which LLVM unrolls fully before its loop
vectoriser runs, stays scalar, and for a runtime 20-wide row the loop vectoriser's body (16 lanes × 4) never runs;
per row over range(H): 46–49 ns per row (31.8 with SLP on: loads and stores of arrays that may alias interleave);
each row's sums as 4 column lanes: 25; rows as to_fixed_tuple (indexed by the loop variable: alloca and switch):
96; eight chains (two per row, or two rows × four columns) 18–22 under "reassoc", 10–12 with "contract" only,
against 6.5 for the four of today (11.3 with "contract" only); 8 rows at a time: 7.2 for the sums; masked sums over
a 4-row block flat (80 values, 4 masks): 12.9; the output loop over the block's 4 rows at once: 16.2; dL/dγ per
block of four rows (in the sums' loop or a loop of its own): 14.2–15.5 for the reverse without β (slower);
layer_norm's squares of a block summed in the loop that sums the next block (eight chains; 13.8 → 11.8 alone,
1.007× in place, 11 pairs against the kernel with `acc`); the reverse's gx of a block written in the loop that
sums the next block: 22 against 9 (slower); silu_back folded into the gx loop of the LayerNorm before it (three
passes fewer: pre_ln, ln1, mlp_ln2): 1.005× in place (11 pairs, a busy machine); v2 = v1 + h2 formed at the
read rows only, in the gather (no `add` over every row; same bits): 0.991× (11 pairs). Not tried: γ folded into
the next layer's weights (the forward would save only the y writes now: 13.7 against 13.8 ns per row alone).

Vectorising the LSTMs' own loops (2026-11-24, branch bw5; AMD Zen 4, float32; perf of a pass on sim36 user 19
before: lstm_forward 15% and lstm_backward 12% of the kernel's samples, the backward's gate-gradient loop scalar at
≈ 42 ns per row and layer). numba compiles with LLVM's SLP vectoriser off, so only the loop vectoriser can help, and
it vectorises a loop only (i) if the loop is still a loop — a constant trip count of H = 20 is unrolled first, into
20 scalar copies; a large body (the gate gradients) escapes the full unroll and is vectorised 4 wide — and (ii) if
each pair of arrays written and read is either provably apart or two distinct objects that a run-time check can
compare: one array read at a step's rows and written at the previous step's (c, dL/dc) defeats it. Kept, each paired
with bench/bench_lstm.py (sim36 users 19, 10, 27, 5; 7 pairs each; the busy machine's noise ±5%), result bits as
stated:
- σ of a step's gates and tanh of its cells flat over the step's rows (the g gate's rows doubled: exact):
  lstm_forward alone 138 → 116 ns per row and layer; 1.038× per pass; bits unchanged;
- the cards' length sort by counting (kernel_math.stable_argsort_small; numba's merge sort was 1.3% of the samples):
  with the above 1.054×; bits unchanged;
- dL/dc through the next step in two arrays by step parity, each parity its own call of `gate_grads` (so each call
  sees two distinct objects), h_prev copied apart: 1.080×; the float32 gradient within 1.4e−7 of its largest entry
  (vector FMAs), loss and P(recall) bits unchanged;
- the cells likewise in two arrays by parity (`cells`), the g gate kept as σ(2z) (g = 2σ − 1 where used), the
  per-row loops with the row width read at run time: 1.090×;
- with ln5's LayerNorms merged: 1.138×; the inputs copied card by card (feats read in order): 1.154×.
Measured and not kept: the gates in unit-major order (row 4j + q, so that a step's cells run flat with interleaved
loads of the gates): the forward 139 → 134 ns per row and layer but the backward 182 → 188–194 (its loops gathered);
the gates copied into four planes [4, N, H] and the whole backward flat over them, dg copied back into rows for
the products: 1.014× per pass against 1.038× without it; run-time row widths in chunk_loss's and the heads' copy
loops: 1.091× against 1.090× (noise); the biases' rows as a rank-1 product: slower (120 against 119 ns per row);
NUMBA_SLP_VECTORIZE=1 for the whole kernel: no change (5.5–5.9 against 5.5–5.9 ms per pass).

Arrays LLVM could not tell apart (2026-11-24, branch ovh; AMD Zen 4, float32). A loop vectorises only where every
array it writes is either provably apart from those it reads or checkable at run time, and a check that fails sends
it to the scalar loop: silu_back handed one array as gy and ga (in place) always failed its check (9.9 ns per row of
20 against 2.4 for `silu_back_ip`, which reads and writes one argument at the same index); the heads' per-target
loops wrote one row of their work space and read others of the same array (unknown distances in one object: no
check possible), so each is now a function of its own with the rows as separate arguments (heads backward 45.3 →
33.5 ns per target alone, forward 45.6 → 43.7: its float64 exp and log dominate). With them, the weights' and the
gradient's views and the LSTMs' transposed weights (`lstm_wt`) once per call instead of per chunk, gemm_acc's alpha
and beta a global constant (np.ones per product was 25–45 ns of a product's ≈ 100 ns fixed cost), dL/dv2 zeroed
flat and copied at the read rows, the row copies with the width read at run time, and the encoded inputs stored in
float32 (models/lstm.py; half the memory `inputs` reads card by card): paired with bench/bench_lstm.py (7–9 pairs
each) 1.03× per pass on sim36 users 19, 10, 27, 5 and 1.03× on the 45k-review user, then the heads another 1.026×
on the latter (1.01× on sim36 users 19 and 27); loss, gradient and P(recall) bit-identical throughout, and the
result lines of the embedded users and sim36 users 5, 10, 19, 27 equal to main's. The row's projection
(bench/bench_executors.py project --rows LSTM), main's code and this back to back twice on the same machine as the
previous stop but slower today (main's code 53.05 / 51.53 ms per 1k raw reviews against 51.2 / 51.7 then): 53.05 →
51.49 and 51.53 → 49.97 ms per 1k (10.72 → 10.41 and 10.42 → 10.17 CPU-hours for 10,000 users; ≈ 5.0–5.15 s per
100k raw reviews). Measured and not kept: the biases' gradient as a ones column of the weight-gradient product (hu
[N, 41]: 0.995×; padded to 48 columns: 0.990×; the sum over [N, 4H] it replaces is cheap); gate_grads' row width
read at run time (0.990×). What is left of a call's fixed cost, timed on one 3-step card (one chunk): ≈ 31 µs; perf
of it: reference counts of array views 12%, rounding the weights to float32 and zeroing the float32 gradient buffer
(once per call) ≈ 13%, the weight-gradient products' [80, 40] and [20, 20] outputs ≈ 8%, ln_weight_grads ≈ 6%,
flush_grad ≈ 5%.

Row copies and the heads' last loops (2026-11-25; AMD Zen 4, float32). perf of a pass on the 45k-review simulated
user: chunk_loss's own code 5%, a third of it row copies in which LLVM reloaded the row index at every element (a
store into the destination might have changed it), now `gather_rows` / `scatter_rows`, which copy whole rows; the
heads' last loops read each target's label and weight through its index (a divsd and a branch per target), now
gathered once into rows of the heads' work space so that `recall_and_log_arg` and `bce_grad` vectorise;
heads_backward's two products in the network's dtype on heads_forward's feature-major read rows (were float64 on a
float64 copy); each target's row found once in chunk_loss. Paired (bench/bench_lstm.py): 1.026× per pass on the
45k-review user (25 pairs), the heads' products another 1.007×; against the kernel before them 1.027× on sim36 users
19, 10, 27, 5 (9 pairs); loss and P(recall) bit-identical, the gradient within 1.5e−7 of its largest entry (the
heads' products). The row's projection, the kernel before and this back to back twice: 53.82 → 50.36 and 52.00 →
49.40 ms per 1k raw reviews (10.90 → 10.32 and 10.51 → 9.99 CPU-hours; ≈ 4.9–5.1 s per 100k on a day when the
kernel before measured 2–4% slower than at its own stop). Measured and not kept: LayerNorm's row sums eight rows at
a time (alone 13.8 → 12.0 ns per row on [512, 20]; in a pass 0.99×, 9 pairs); the LayerNorm before each LSTM
writing x̂ straight into lstm_backward's [h_prev | u] rows instead of the copy there (strided rows: 0.96×); chunks
of 320 steps (0.98×); the linears' forward in dot_acc's form (the linears' dot_wt_acc is the one product that
OpenBLAS sends to its packed path, ≈ 4% of a pass, but alone both forms take 12.3 ns per row).

The chunk plans kept across passes (2026-11-25). The fine-tune visits one card order in all 20 passes, so its groups
come back unchanged, and with them everything a chunk needs besides the weights: the cards sorted by length and cut
into chunks, each chunk's lockstep plan, its inputs copied into the packed order, and its read rows and target maps
(`chunk_plan`; alone ≈ 0.9 ms of a 47 ms pass on the 45k-review user, plus the cache misses of its scattered reads in
place). card_net.fit_compiled says when the order repeats, models/lstm.py's kernel_layout then appends an empty memo
to the layout (`plan_memo`), and `call_plans` fills it on a group's first training call and reads it afterwards
(predictions, one call per group, neither read nor fill it). The other networks' card_loss protocol is unchanged:
only the LSTM's layout has the 11th entry. Paired (bench/bench_lstm.py, which now hands the new kernel the
fine-tune's layout with its memo): 1.026× per pass on the 45k-review user (15 pairs, 14 of them ≥ 1.0),
bit-identical; result lines of the embedded users and sim36 users 5, 10, 19, 27 identical. The row's projection, the
kernel before and this back to back twice on a machine that slowed down between the pairs: 52.13 → 48.39 and 57.62 →
55.86 ms per 1k raw reviews (paired 1.077 and 1.032; the kernel before had measured 49.86 and 49.69 an hour earlier);
the next morning, quiet, three more pairs: 52.08 → 47.23, 48.93 → 47.76, 49.68 → 49.18 ms per 1k (≈ 4.7–4.9 s per
100k raw reviews). Measured and not kept the same day: the per-step row views of the recurrence replaced by BLAS
calls at element offsets (numba's reference counts of views, NRT_incref/decref ≈ 1.2% of a pass: 1.00×, 11 pairs);
the gate-gradient loop over a row width read at run time (16 wide instead of 4: 0.98×); exp32 with 2^n made by the
1.5·2^23 shift (two instructions fewer; same bits, 1.00×) and with a degree-6 minimax polynomial (σ alone 0.32 → 0.29
ns per value, in a pass within the noise).

A feature-major layout (every quantity of the LSTMs as [features, cards], so that the loops run contiguously over
a step's cards, 8 float32 lanes) was tried in three forms and not kept (measured on the 45k-review simulated user's
fine-tune batch: 39,829 packed rows in 77 chunks, float32, one thread; old and new alternated, minimum of 7–12;
float32 gradient within 5e−8 (relative) of this kernel's, float64 still equal to torch):
- all by hand (each gate's 20-term sum with one card per lane, activated where it is summed; the reverse pass's
  products likewise): the whole call 1.3× slower, an LSTM layer's forward 450 → 770–835 ns per row, forward and
  reverse 757 → 1240–1550. The recurrent 20→80 product alone took 137–182 ns per row against sgemm's ≈ 100: without
  fastmath numba emits no FMA, and each lane's sum is a chain of 20 dependent additions (latency-bound); and the
  activations fused into it cost ≈ 3 ns per gate against 0.75 in a flat loop (exp32 and one division each);
- the products through BLAS at explicit leading dimensions (numba's numba_xxgemm takes a step's columns of a
  [features, ld] array without copying them) and only the gates and the cell by hand, in per-step loops over each
  feature's row: forward 335 vs 345 ns per row, reverse 394 vs 449 (today vs feature-major), the whole call
  1.05–1.1× slower. At a median of 43 cards per step each of the ~100 row loops of a step is ~5 vector iterations
  plus a scalar remainder, set-up and overlap checks, no cheaper than today's 20-wide rows. The weight gradients
  called as gemm with beta = 1 into the gradient took what np.dot takes (≈ 80 ns per row each, about half the FMA
  peak; dL/du 56–84);
- step-blocked (step k of a chunk a block [features, Q], Q = the chunk's cards rounded up to 8, so that a step's
  elementwise loops run flat over whole blocks with no remainder, the previous step at the same place of the
  previous block; z_k = [u_k; h_{k−1}; 1] so that one gemm per step gives the gates with both biases, and the weight
  gradients one gemm over every step): the LSTM layers alone 0.92× (forward 342 → 294 ns per row, reverse
  398 → 384), but lstm_cards_loss as a whole 1.01× on that batch and 1.04–1.3× slower on small simulated users
  (sim36 users 10 and 20: 3.6k and 1.2k rows; old and new alternated 15 times in one process): the scatter into and
  out of the blocks, the padded lanes and the per-call set-up eat the gain.
What numba needs for such loops to vectorise at all (measured then): unsigned column indices (with signed ones it
adds a wrap-around for negative indices, and the contiguous loads become gathers), rows whose length is not a
multiple of 4 KiB (rows of 1024 float32 ran the product ~6× slower: L1 set conflicts), and few arrays per loop (a
loop writing a unit's four gates stayed scalar: LLVM gives up on the overlap checks between its arrays).

Every operation follows torch's forward and backward (LayerNorm eps 1e−5, SiLU, nn.LSTM's gate order i, f, g, o,
clamp passing the gradient where −25 ≤ z ≤ 25). Tested equal to autograd of LSTMNet's torch path in float64
(tests/test_lstm_compiled.py), float32 against float64 in tests/test_lstm_float32.py.

Parameters are flat in LSTMNet.parameters() order (`views` cuts them); `model` = (mean of ln(1e−5 + Δt), mean of
ln(duration), their stds, a zero of the compute dtype): the input_mean / input_std buffers and the precision.

Why hand-written, not generated (issue #39): engine/traced.py generates a plug-in, its gradient and its lanes from a
recurrence of a few floats per card written in torch (init / step / curve, FSRS v1-v6, FSRS-7, SBD); a network's state
is a vector and its step matrix products (torch.stack, @, nn modules), which the tracer does not record (TraceError:
"torch op stack is not traced"), so there is nothing generated to compare. The network is written in torch once more
as the reference (neural/lstm_torch.py), which tests/test_lstm_compiled.py holds this kernel equal to, and which the
`--trainer upstream` path runs; the speed this kernel buys over it is measured above (~47 s per 100k reviews stepped
in torch).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import overload
from numba.typed import List
from numba.np.linalg import _BLAS  # numba's own BLAS binding (what its np.dot calls): internal API, numba pinned

from engine.jit import inlined
from engine.kernel_math import BCE_GRAD_EPS, BCE_LOG_FLOOR, card_batch_bounds, lockstep_plan, stable_argsort_small
from engine.vec_math import exp32, exp_bounded, exp_vec, log_vec

H = 20
G4 = 4 * H  # gates i, f, g, o
N_IN = 6
N_CURVES = 3
LN_EPS = 1e-5
# numba's fastmath flags (LLVM's): "contract" lets a·b + c become one FMA (every x86-64 CPU since 2013 has it:
# fewer instructions and one rounding instead of two), "reassoc" and "nsz" let sums be regrouped (vectorised
# reductions). The functions with exponentials (the activations: exp32 / exp_bounded inlined) get "contract" only:
# regrouped, exp32's Cody–Waite reduction (x − n·ln2_hi) − n·ln2_lo may be folded, and its error measured 1.7e−7
# against 1.0e−7 (contract: 0.8e−7)
EXACT_EXP = {"contract"}
FAST = {"contract", "reassoc", "nsz"}
CHUNK_STEPS = 512  # with the shared work space, 2048-step chunks measured no faster (the 1.9× per step they once
# cost was the page faults of their arrays, made afresh per chunk)
# (name, shape) of LSTMNet.parameters() in order; tests check it against the torch module
SHAPES = (("pre_w", (H, N_IN)), ("pre_b", (H,)), ("pre_ln", (H,)), ("pre2_w", (H, H)), ("pre2_b", (H,)),
          ("ln1", (H,)), ("ih1", (G4, H)), ("hh1", (G4, H)), ("bih1", (G4,)), ("bhh1", (G4,)),
          ("ln2", (H,)), ("ln2_b", (H,)), ("ih2", (G4, H)), ("hh2", (G4, H)), ("bih2", (G4,)), ("bhh2", (G4,)),
          ("mlp_ln1", (H,)), ("mlp_w1", (H, H)), ("mlp_b1", (H,)), ("mlp_ln2", (H,)), ("mlp_w2", (H, H)),
          ("mlp_b2", (H,)), ("out_ln", (H,)), ("out_w", (H, H)), ("out_b", (H,)),
          ("w_w", (N_CURVES, H)), ("w_b", (N_CURVES,)), ("s_w", (N_CURVES, H)), ("s_b", (N_CURVES,)),
          ("d_w", (N_CURVES, H)), ("d_b", (N_CURVES,)))
N_PARAMS = sum(int(np.prod(s)) for _, s in SHAPES)


@njit(cache=True, error_model="numpy", fastmath=FAST)
def views(th):
    """The parameter views of a flat vector (SHAPES order), as a tuple."""
    o = 0

    def mat(o, r, c):
        return th[o:o + r * c].reshape((r, c)), o + r * c

    pre_w, o = mat(o, H, N_IN)
    pre_b, pre_ln = th[o:o + H], th[o + H:o + 2 * H]
    o += 2 * H
    pre2_w, o = mat(o, H, H)
    pre2_b, ln1 = th[o:o + H], th[o + H:o + 2 * H]
    o += 2 * H
    ih1, o = mat(o, G4, H)
    hh1, o = mat(o, G4, H)
    bih1, bhh1, ln2, ln2_b = th[o:o + G4], th[o + G4:o + 2 * G4], th[o + 2 * G4:o + 2 * G4 + H], \
        th[o + 2 * G4 + H:o + 2 * G4 + 2 * H]
    o += 2 * G4 + 2 * H
    ih2, o = mat(o, G4, H)
    hh2, o = mat(o, G4, H)
    bih2, bhh2, mlp_ln1 = th[o:o + G4], th[o + G4:o + 2 * G4], th[o + 2 * G4:o + 2 * G4 + H]
    o += 2 * G4 + H
    mlp_w1, o = mat(o, H, H)
    mlp_b1, mlp_ln2 = th[o:o + H], th[o + H:o + 2 * H]
    o += 2 * H
    mlp_w2, o = mat(o, H, H)
    mlp_b2, out_ln = th[o:o + H], th[o + H:o + 2 * H]
    o += 2 * H
    out_w, o = mat(o, H, H)
    out_b = th[o:o + H]
    o += H
    w_w, o = mat(o, N_CURVES, H)
    w_b = th[o:o + N_CURVES]
    o += N_CURVES
    s_w, o = mat(o, N_CURVES, H)
    s_b = th[o:o + N_CURVES]
    o += N_CURVES
    d_w, o = mat(o, N_CURVES, H)
    d_b = th[o:o + N_CURVES]
    return (pre_w, pre_b, pre_ln, pre2_w, pre2_b, ln1, ih1, hh1, bih1, bhh1, ln2, ln2_b, ih2, hh2, bih2, bhh2,
            mlp_ln1, mlp_w1, mlp_b1, mlp_ln2, mlp_w2, mlp_b2, out_ln, out_w, out_b, w_w, w_b, s_w, s_b, d_w, d_b)


# ----------------------------------------------------------------------------------------------- activations

def exp_act(x):
    """The activations' exponential in x's own precision: exp_bounded (float64) or exp32 (float32)."""


@overload(exp_act, inline="always")
def _exp_act(x):
    if x == types.float32:
        return lambda x: exp32(x)
    return lambda x: exp_bounded(x)


def like(a, c):
    """The constant c in the type of a (a float or an array of floats): float32 arithmetic stays float32, where a
    float64 constant would widen every expression it enters."""


@overload(like, inline="always")
def _like(a, c):
    if getattr(a, "dtype", a) == types.float32:
        return lambda a, c: np.float32(c)
    return lambda a, c: c


@inlined(error_model="numpy")
def sigmoid(z):
    """1 / (1 + e^−z) in z's precision; float64: relative error below 1e−13."""
    one = like(z, 1.0)
    return one / (one + exp_act(-z))


@inlined(error_model="numpy")
def tanh(x):
    """2σ(2x) − 1 in x's precision; float64: absolute error below 1e−14."""
    one = like(x, 1.0)
    return (one + one) / (one + exp_act(-(x + x))) - one


# ----------------------------------------------------------------------------------------------- per-position layers
# Every layer writes into arrays it is given (`out`, …): one work space per call of lstm_cards_loss (`workspace`)
# serves all its chunks, because allocating the chunk's ~50 arrays afresh (several above malloc's mmap threshold)
# cost as much as the arithmetic: a third of the time went to the kernel's page faults.

_GEMM32 = _BLAS().numba_xxgemm(types.float32)
_GEMM64 = _BLAS().numba_xxgemm(types.float64)
_ONE32, _ONE64 = np.ones(1, np.float32), np.ones(1, np.float64)  # gemm_acc's alpha and beta (np.ones per call: 25–45
# ns of a product's ≈ 100 ns fixed cost, for each of a pass's per-step products)


def gemm_acc(ta, tb, m, n, k, a, lda, b, ldb, c, ldc):
    """C += op(A)·op(B) in BLAS's column-major terms (ta, tb: ord("n") or ord("t"); a, b, c: arrays whose first
    element is the matrix's; lda, ldb, ldc in elements). np.dot always overwrites its output (beta = 0): OpenBLAS
    then zeroes it first (a memset, 2.5% of a pass) and every bias or gradient sum needs a pass of its own after.
    With beta = 1 the product lands on what is there: the biases written first, the weight gradients straight into
    the chunk's gradient."""


@overload(gemm_acc)
def _gemm_acc(ta, tb, m, n, k, a, lda, b, ldb, c, ldc):
    f32 = a.dtype == types.float32
    fn = _GEMM32 if f32 else _GEMM64
    kind = ord("s") if f32 else ord("d")

    one = _ONE32 if f32 else _ONE64  # a global: frozen into the code as a constant, nothing allocated per call

    def impl(ta, tb, m, n, k, a, lda, b, ldb, c, ldc):
        if m == 0 or n == 0 or k == 0:
            return
        r = fn(kind, np.int8(ta), np.int8(tb), np.intp(m), np.intp(n), np.intp(k), one.ctypes, a.ctypes,
               np.intp(lda), b.ctypes, np.intp(ldb), one.ctypes, c.ctypes, np.intp(ldc))
        if r != 0:
            raise RuntimeError("gemm failed")
    return impl


@inlined
def row_ld(x):
    """The row stride of a 2-D array whose rows are contiguous (a row slice of a C-contiguous array), in elements."""
    return x.strides[0] // x.itemsize


@njit(cache=True, error_model="numpy")
def dot_wt_acc(x, w, out):
    """out [N, M] += x [N, K]·wᵀ (w [M, K] C-contiguous; x, out: rows contiguous)."""
    assert x.strides[1] == x.itemsize and out.strides[1] == out.itemsize and w.shape[1] == x.shape[1]
    gemm_acc(ord("t"), ord("n"), w.shape[0], x.shape[0], x.shape[1], w, w.shape[1], x, row_ld(x), out, row_ld(out))


# OpenBLAS (0.3.31, SkylakeX kernels) multiplies small matrices (M·N·K ≤ 100³) with kernels that skip its packing
# copies: a chunk's weight gradient dgᵀ·[h_prev | u] ([80, 40] summed over ~512 rows) took 100 ns per row in one
# product and 59 in blocks of ≤ 312 rows (also 59 ns per row at 256; 67 at 64: per-call overhead)
SMALL_MNK = 1_000_000


@njit(cache=True, error_model="numpy")
def dot_acc(x, wt, out):
    """out [N, M] += x [N, K]·wt [K, M] (wt C-contiguous: a weight matrix transposed; x, out: rows contiguous).
    Against dot_wt_acc (w untransposed, BLAS's "t" operand) OpenBLAS's small kernels ran this form ("n", "n") 1.2×
    faster on a chunk's rows ([N, 20]·[20, 80], N = 128–512: 31 ns per row against 36–40) and 1.3–2.8× on the
    recurrence's per-step products (8–64 rows: 31–38 ns per row against 45–108)."""
    assert x.strides[1] == x.itemsize and out.strides[1] == out.itemsize and wt.shape[0] == x.shape[1]
    gemm_acc(ord("n"), ord("n"), wt.shape[1], x.shape[0], x.shape[1], wt, wt.shape[1], x, row_ld(x), out,
             row_ld(out))


@njit(cache=True, error_model="numpy")
def dot_tn_acc(gy, x, gw):
    """gw [M, K] += gy [N, M]ᵀ·x [N, K] (rows contiguous; gw C-contiguous): a weight gradient summed over rows, in
    blocks of rows small enough for BLAS's small-matrix kernels (SMALL_MNK)."""
    assert x.strides[1] == x.itemsize and gy.strides[1] == gy.itemsize and gw.shape[1] == x.shape[1]
    n, blk = x.shape[0], max(64, SMALL_MNK // (x.shape[1] * gy.shape[1]))
    for r in range(0, n, blk):
        e = min(r + blk, n)
        gemm_acc(ord("n"), ord("t"), x.shape[1], gy.shape[1], e - r, x[r:e], row_ld(x), gy[r:e], row_ld(gy), gw,
                 gw.shape[1])


@njit(cache=True, error_model="numpy", fastmath=FAST)
def linear(x, w, b, out):
    """out [N, out] = x [N, in]·wᵀ + b (b written first, the product added onto it)."""
    for r in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[r, j] = b[j]
    dot_wt_acc(x, w, out)


@njit(cache=True, error_model="numpy", fastmath=FAST)
def linear_back(x, w, gy, gw, gb, gx, want_gx):
    """Reverse of `linear`: adds dL/dw, dL/db; dL/dx into gx (with want_gx)."""
    dot_tn_acc(gy, x, gw)
    for r in range(gy.shape[0]):
        for j in range(gy.shape[1]):
            gb[j] += gy[r, j]
    if want_gx:
        np.dot(gy, w, gx)


@njit(cache=True, error_model="numpy", fastmath=FAST)
def ln_weight_grads(g, gbias, gamma, beta, has_beta, w, gw, ggamma, gbeta):
    """The gradients of a layer z = y·wᵀ + b whose input is a LayerNorm's y = x̂·γ (+ β), given g = gzᵀ·x̂ (its
    weight gradient taken over x̂ instead of y) and gbias = Σ_rows gz: adds dL/dw = g·diag(γ) (+ gbias·βᵀ), dL/dγ_j
    = Σ_i g[i, j]·w[i, j] and dL/dβ_j = Σ_i gbias[i]·w[i, j]. Per chunk [out, in] operations in place of
    layer_norm_back's sums of gy·x̂ and gy over the rows (which wrote dL/dγ into memory at every row)."""
    zero = like(g, 0.0)
    for i in range(w.shape[0]):
        for j in range(w.shape[1]):
            gw[i, j] += g[i, j] * gamma[j] + (gbias[i] * beta[j] if has_beta else zero)
            ggamma[j] += g[i, j] * w[i, j]
            if has_beta:
                gbeta[j] += gbias[i] * w[i, j]


@njit(cache=True, error_model="numpy", fastmath=FAST)
def linear_ln_back(xh, gamma, w, gy, gw, gb, ggamma, gx):
    """Reverse of `linear` on a LayerNorm's output y = x̂·γ (no β): adds dL/dw, dL/db and that LayerNorm's dL/dγ
    (ln_weight_grads); gx = dL/dy."""
    g = np.zeros(w.shape, w.dtype)
    linear_back(xh, w, gy, g, gb, gx, True)  # g = gyᵀ·x̂: the weight gradient over x̂
    ln_weight_grads(g, gb, gamma, gamma, False, w, gw, ggamma, ggamma)  # gb: unused without β


@njit(cache=True, error_model="numpy", fastmath=FAST)
def gather_rows(x, rows, out):
    """out[i] = x[rows[i]]. A function of its own, with each row's index loaded once: inline in chunk_loss, LLVM
    reloaded rows[i] at every element (a store into out might have changed it) and copied element by element; here
    it copies whole rows with vector moves. The row width is read at run time (a constant 20 unrolls the loop
    into scalar moves)."""
    m = x.shape[1]
    for i in range(len(rows)):
        r = rows[i]
        for j in range(m):
            out[i, j] = x[r, j]


@njit(cache=True, error_model="numpy", fastmath=FAST)
def scatter_rows(x, rows, out):
    """out[rows[i]] = x[i] (the reverse of gather_rows, for the same reason a function of its own)."""
    m = x.shape[1]
    for i in range(len(rows)):
        r = rows[i]
        for j in range(m):
            out[r, j] = x[i, j]


@inlined
def flat(x):
    """A C-contiguous [N, M] array as a flat view of its N·M values."""
    return x.reshape(x.size)


@njit(cache=True, error_model="numpy", fastmath=EXACT_EXP)
def silu(a, y, sg):
    """y = a·σ(a), and σ(a) into sg for the reverse pass. The elementwise layers run over the arrays flat (all are
    C-contiguous): one long loop vectorises where 20-wide rows left a scalar remainder and overlap checks per row
    (~3 ns per element before)."""
    af, yf, sf = flat(a), flat(y), flat(sg)
    for e in range(len(af)):
        s = sigmoid(af[e])
        sf[e] = s
        yf[e] = af[e] * s


@njit(cache=True, error_model="numpy", fastmath=FAST)
def silu_back(a, sg, gy, ga):
    """ga = dL/da of y = a·σ(a): gy·σ(a)·(1 + a·(1 − σ(a))), ga apart from gy (in place: `silu_back_ip`)."""
    one = like(a, 1.0)
    af, sf, gyf, gaf = flat(a), flat(sg), flat(gy), flat(ga)
    for e in range(len(af)):
        s = sf[e]
        gaf[e] = gyf[e] * s * (one + af[e] * (one - s))


@njit(cache=True, error_model="numpy", fastmath=FAST)
def silu_back_ip(a, sg, g):
    """silu_back with dL/dy in g turned into dL/da in place. Handed the same array as gy and ga, silu_back's loop
    fails LLVM's run-time overlap check and runs scalar: 9.9 ns per row of 20 against 2.4 here (one array read and
    written at the same index, which LLVM sees is safe to vectorise)."""
    one = like(a, 1.0)
    af, sf, gf = flat(a), flat(sg), flat(g)
    for e in range(len(af)):
        s = sf[e]
        gf[e] = gf[e] * s * (one + af[e] * (one - s))


@njit(cache=True, error_model="numpy", fastmath=FAST)
def add(a, b, out):
    """out = a + b (out may be a or b)."""
    af, bf, of = flat(a), flat(b), flat(out)
    for e in range(len(af)):
        of[e] = af[e] + bf[e]


@njit(cache=True, error_model="numpy", fastmath=FAST)
def layer_norm(x, gamma, beta, has_beta, y, xh, rstd):
    """LayerNorm over the last axis (eps 1e−5): y = x̂·γ (+ β), and x̂, 1/σ kept for the reverse pass. Rows go four
    at a time (the last block repeats its last row): each row's sums are a chain of 20 dependent additions, and four
    independent chains keep the adder busy (~1.5× per LayerNorm); every row is still summed in its own order. x̂ is
    written once, from x − μ again (1.2× against storing x − μ, scaling it and reading it back)."""
    n, m = x.shape
    zero, one, eps, fm = like(x, 0.0), like(x, 1.0), like(x, LN_EPS), like(x, float(m))
    for r in range(0, n, 4):
        r1, r2, r3 = min(r + 1, n - 1), min(r + 2, n - 1), min(r + 3, n - 1)
        s0 = s1 = s2 = s3 = zero
        for j in range(m):
            s0 += x[r, j]
            s1 += x[r1, j]
            s2 += x[r2, j]
            s3 += x[r3, j]
        mu = (s0 / fm, s1 / fm, s2 / fm, s3 / fm)
        s0 = s1 = s2 = s3 = zero
        for j in range(m):
            d0, d1, d2, d3 = x[r, j] - mu[0], x[r1, j] - mu[1], x[r2, j] - mu[2], x[r3, j] - mu[3]
            s0 += d0 * d0
            s1 += d1 * d1
            s2 += d2 * d2
            s3 += d3 * d3
        rstd[r], rstd[r1], rstd[r2], rstd[r3] = (one / math.sqrt(s0 / fm + eps), one / math.sqrt(s1 / fm + eps),
                                                 one / math.sqrt(s2 / fm + eps), one / math.sqrt(s3 / fm + eps))
        for q in range(min(4, n - r)):  # x̂ written once, from x − μ again (not stored, then scaled, then read)
            row, mq = r + q, mu[q]
            rs = rstd[row]
            for j in range(m):
                xj = (x[row, j] - mq) * rs
                xh[row, j] = xj
                y[row, j] = xj * gamma[j] + (beta[j] if has_beta else zero)


@njit(cache=True, error_model="numpy", fastmath=FAST)
def layer_norm_back(xh, rstd, gamma, gy, gx, acc):
    """Reverse of `layer_norm` with respect to x: gx = dL/dx = (d − mean(d) − x̂·mean(d·x̂))/σ, d = gy·γ, or with
    acc gx += dL/dx (a residual stream's gradient; no `add` pass after). dL/dγ and dL/dβ come from the next layer's
    weight gradient (ln_weight_grads). The rows' two sums four rows at a time, as in layer_norm."""
    n, m = xh.shape
    zero, fm = like(xh, 0.0), like(xh, float(m))
    for r in range(0, n, 4):
        r1, r2, r3 = min(r + 1, n - 1), min(r + 2, n - 1), min(r + 3, n - 1)
        a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = zero
        for j in range(m):
            d0, d1, d2, d3 = gy[r, j] * gamma[j], gy[r1, j] * gamma[j], gy[r2, j] * gamma[j], gy[r3, j] * gamma[j]
            a0 += d0
            a1 += d1
            a2 += d2
            a3 += d3
            b0 += d0 * xh[r, j]
            b1 += d1 * xh[r1, j]
            b2 += d2 * xh[r2, j]
            b3 += d3 * xh[r3, j]
        sa, sb = (a0, a1, a2, a3), (b0, b1, b2, b3)
        for q in range(min(4, n - r)):
            row = r + q
            s1, s2, rs = sa[q] / fm, sb[q] / fm, rstd[row]
            for j in range(m):
                gx[row, j] = (gx[row, j] if acc else zero) + (gy[row, j] * gamma[j] - s1 - xh[row, j] * s2) * rs


# ----------------------------------------------------------------------------------------------- the recurrence

@njit(cache=True, error_model="numpy", fastmath=EXACT_EXP)
def cells(act, c_prev, c_cur, r0, p0, nk):
    """The cells of step k > 0 (rows r0 .. r0 + nk − 1; the previous step's at p0): c = f·c_prev + i·g, with g =
    2σ(2z) − 1 from the g gate's column (σ(2z))."""
    one = like(act, 1.0)
    two = one + one
    m = c_cur.shape[1]
    for q in range(nk):
        r, rp = r0 + q, p0 + q
        for j in range(m):
            c_cur[r, j] = act[r, H + j] * c_prev[rp, j] + act[r, j] * (two * act[r, 2 * H + j] - one)


@njit(cache=True, error_model="numpy", fastmath=EXACT_EXP)
def lstm_wt(w_ih, w_hh):
    """lstm_forward's weights: w_ihᵀ and w_hhᵀ C-contiguous [H, 4H] (dot_acc's faster form), the g gate's columns
    doubled (exact: tanh(z) = 2σ(2z) − 1, so that one σ activates all 80 gates). Made once per lstm_cards_loss
    call rather than in every chunk (two allocations, transposes and passes per layer and chunk before)."""
    two = like(w_ih, 2.0)
    wt_ih, wt_hh = np.ascontiguousarray(w_ih.T), np.ascontiguousarray(w_hh.T)
    for i in range(H):
        for j in range(2 * H, 3 * H):
            wt_ih[i, j] *= two
            wt_hh[i, j] *= two
    return wt_ih, wt_hh


@njit(cache=True, error_model="numpy", fastmath=EXACT_EXP)
def lstm_forward(u, wt_ih, wt_hh, b_ih, b_hh, off, bs, h, c_even, c_odd, tc, act, tmp):
    """nn.LSTM (one layer, zero initial state) over packed time-major rows u [N, H] (weights as `lstm_wt` gives
    them): block k = rows off[k] .. off[k] + bs[k] − 1, the step k of the bs[k] longest cards (their previous step:
    the first bs[k] rows of block k − 1). Writes h, tanh(c) [N, H], the cells c of the even steps' rows into
    c_even and of the odd steps' into c_odd, and the activated gates act [N, 4H] (the g gate's column as σ(2z): g =
    tanh(z) = 2σ(2z) − 1, which lstm_backward computes); tmp [≥ 1, 4H] is scratch.

    How LLVM vectorises these loops (measured on AMD Zen 4, float32, the layer alone on sim36 users' chunks):
    - The transcendentals run flat over a step's rows (contiguous in every array): σ of all its gates (the g
      gate's weights and bias doubled, which is exact, so σ(2z) has the same bits as before), then tanh of all its
      cells; in rows of 20 the cells' tanh ran 4 wide. The layer's forward 138 → 116 ns per row.
    - A loop over a row's 20 values with the constant trip count H is unrolled into 20 scalar copies; its loads
      and stores are then vectorised only where LLVM can prove that the arrays do not overlap, which it cannot for
      arrays handed in. With the row width read at run time (`m`) the loop stays a loop, and LLVM vectorises it
      behind a run-time overlap check: the cells, h and the biases' rows ≈ 5% of the layer's forward.
    - A loop that reads one array at a step's rows and writes it at the previous step's (the cells c[rp] → c[r])
      cannot get that check (one object, unknown distance) and stays scalar: the steps' cells alternate between
      two arrays, each parity with its own call of `cells`, so that every call sees two distinct arrays.
    """
    n = u.shape[0]
    one = like(u, 1.0)
    two = one + one
    for j in range(G4):
        tmp[0, j] = b_ih[j] + b_hh[j]
    for j in range(2 * H, 3 * H):  # the g gate's rows doubled (exactly): tanh(z) = 2σ(2z) − 1, so σ activates all
        tmp[0, j] *= two
    m4, m = act.shape[1], h.shape[1]
    for r in range(n):  # the gates' pre-activations: both biases, then u·w_ihᵀ added onto them (gemm_acc)
        for j in range(m4):
            act[r, j] = tmp[0, j]
    dot_acc(u, wt_ih, act)
    af = flat(act)
    for k in range(len(bs)):
        r0 = off[k]
        nk = bs[k]
        if k > 0:  # the recurrent term added onto the step's rows (none at the first step: zero state)
            p0 = off[k - 1]
            dot_acc(h[p0:p0 + nk], wt_hh, act[r0:r0 + nk])
        a = af[r0 * G4:(r0 + nk) * G4]
        for e in range(nk * G4):  # every gate of the step: σ, flat
            a[e] = sigmoid(a[e])
        if k == 0:
            for r in range(nk):
                for j in range(H):
                    c_even[r, j] = act[r, j] * (two * act[r, 2 * H + j] - one)
        elif k % 2 == 0:  # two call sites, each with two distinct arrays (see the docstring)
            cells(act, c_odd, c_even, r0, off[k - 1], nk)
        else:
            cells(act, c_even, c_odd, r0, off[k - 1], nk)
        c = c_even if k % 2 == 0 else c_odd
        cs, ts = flat(c[r0:r0 + nk]), flat(tc[r0:r0 + nk])
        for e in range(nk * H):  # tanh over the step's cells flat (16 wide; in rows of 20 it ran 4 wide)
            ts[e] = tanh(cs[e])
        for q in range(nk):
            r = r0 + q
            for j in range(m):
                h[r, j] = act[r, 3 * H + j] * tc[r, j]


@njit(cache=True, error_model="numpy", fastmath=FAST)
def gate_grads(gates, tanh_c, gh, dh_rec, c, dc_in, dc_out, dg, r0, p0, nk):
    """lstm_backward at step k > 0 (rows r0 .. r0 + nk − 1, the previous step's at p0): the gates' gradients into
    dg and dL/dc through this step into dc_out at the previous step's rows (dc_in: into this step's)."""
    one = like(dg, 1.0)
    for q in range(nk):
        r, rp = r0 + q, p0 + q
        for j in range(H):
            i, f, o = gates[r, j], gates[r, H + j], gates[r, 3 * H + j]
            g = (one + one) * gates[r, 2 * H + j] - one
            tcj = tanh_c[r, j]
            dh = gh[r, j] + dh_rec[r, j]
            dc = dc_in[r, j] + dh * o * (one - tcj * tcj)
            dg[r, j] = dc * g * i * (one - i)
            dg[r, H + j] = dc * c[rp, j] * f * (one - f)
            dg[r, 2 * H + j] = dc * i * (one - g * g)
            dg[r, 3 * H + j] = dh * tcj * o * (one - o)
            dc_out[rp, j] = dc * f


@njit(cache=True, error_model="numpy", fastmath=FAST)
def lstm_backward(u, h, c_even, c_odd, tanh_c, gates, w_ih, w_hh, off, bs, gh, g_ih, g_hh, g_bih, g_bhh, gu, dg,
                  dh_rec, dc_even, dc_odd, hu):
    """Backpropagation through time of `lstm_forward` given dL/dh [N, H] (from the layers above): adds the weight
    gradients; gu = dL/du. dg [N, 4H], dh_rec, dc_even, dc_odd [N, H] and hu [N, 2H] are scratch: hu = [h_prev | u],
    so that both weight gradients come from one product dgᵀ·hu (dg packed once by BLAS instead of twice, 1.03–1.04×
    per pass; BLAS blocks the sums differently, so the gradient moves at rounding level: 8e−8 relative in float32).

    dL/dc through the next step is read from one of dc_even / dc_odd and written for the previous step into the
    other (by the step's parity): with one array read at a step's rows and written at the previous step's, LLVM
    cannot tell the two apart and left the loop scalar (≈ 42 ns per row); with two it vectorises the loop 4 wide."""
    n = u.shape[0]
    zero, one = like(u, 0.0), like(u, 1.0)
    # dL/dh and dL/dc through the next step (dh_rec, the step's dc array) are written at every row a next step
    # has, below; zero at each card's last row (the rows of block k past bs[k + 1]); h_prev is zero at the first step
    for k in range(len(bs)):
        dc_in = dc_even if k % 2 == 0 else dc_odd
        for q in range(bs[k + 1] if k + 1 < len(bs) else 0, bs[k]):
            for j in range(H):
                dh_rec[off[k] + q, j] = 0.0
                dc_in[off[k] + q, j] = 0.0
    for q in range(bs[0] if len(bs) else 0):
        for j in range(H):
            hu[q, j] = 0.0
    m, m4 = h.shape[1], dg.shape[1]  # H and 4H at run time (see lstm_forward)
    for r in range(n):
        for j in range(m):
            hu[r, H + j] = u[r, j]
    for k in range(len(bs) - 1, -1, -1):
        r0 = off[k]
        nk = bs[k]
        if k > 0:
            p0 = off[k - 1]
            if k % 2 == 0:  # two call sites, so that each sees two distinct arrays (see the docstring)
                gate_grads(gates, tanh_c, gh, dh_rec, c_odd, dc_even, dc_odd, dg, r0, p0, nk)
            else:
                gate_grads(gates, tanh_c, gh, dh_rec, c_even, dc_odd, dc_even, dg, r0, p0, nk)
            for q in range(nk):  # h_prev apart: a third array written in the loop above kept it scalar
                for j in range(m):
                    hu[r0 + q, j] = h[p0 + q, j]
            np.dot(dg[r0:r0 + nk], w_hh, dh_rec[p0:p0 + nk])  # the previous step's only term of its kind
        else:
            for r in range(nk):
                for j in range(H):
                    i, o = gates[r, j], gates[r, 3 * H + j]
                    g = (one + one) * gates[r, 2 * H + j] - one
                    tcj = tanh_c[r, j]
                    dh = gh[r, j] + dh_rec[r, j]
                    dc = dc_even[r, j] + dh * o * (one - tcj * tcj)
                    dg[r, j] = dc * g * i * (one - i)
                    dg[r, H + j] = zero
                    dg[r, 2 * H + j] = dc * i * (one - g * g)
                    dg[r, 3 * H + j] = dh * tcj * o * (one - o)
    gw = np.zeros((G4, 2 * H), u.dtype)  # [4H, 2H]: dL/dw_hh | dL/dw_ih
    dot_tn_acc(dg, hu, gw)
    for i in range(G4):
        for j in range(H):
            g_hh[i, j] += gw[i, j]
            g_ih[i, j] += gw[i, H + j]
    np.dot(dg, w_ih, gu)
    gb = np.zeros(G4, u.dtype)
    for r in range(n):
        for j in range(m4):
            gb[j] += dg[r, j]
    for j in range(G4):  # both biases have the same gradient: one sum, added to each
        g_bhh[j] += gb[j]
        g_bih[j] += gb[j]


@njit(cache=True, error_model="numpy", fastmath=FAST)
def lstm_layer_back(xh, rstd, h, c_even, c_odd, tanh_c, gates, w_ih, w_hh, gamma, beta, has_beta, off, bs, gv,
                    g_ih, g_hh, g_bih, g_bhh, g_gamma, g_beta, gih, gbih, gu, dg, dh_rec, dc_even, dc_odd, hu):
    """Reverse of one residual block LN → LSTM (v_out = v_in + LSTM(LN(v_in))) given dL/dv_out in gv, which becomes
    dL/dv_in. u = x̂ (lstm_backward reads u only for dL/dw_ih = dgᵀ·u): dL/dw_ih, dL/db_ih over x̂ into the scratch
    gih, gbih, from which ln_weight_grads gives the LayerNorm's dL/dγ, dL/dβ and dL/dw_ih over u = x̂·γ + β."""
    gih.fill(0.0)
    gbih.fill(0.0)
    lstm_backward(xh, h, c_even, c_odd, tanh_c, gates, w_ih, w_hh, off, bs, gv, gih, g_hh, gbih, g_bhh, gu, dg, dh_rec,
                  dc_even, dc_odd, hu)
    ln_weight_grads(gih, gbih, gamma, beta, has_beta, w_ih, g_ih, g_gamma, g_beta)
    for j in range(G4):
        g_bih[j] += gbih[j]
    layer_norm_back(xh, rstd, gamma, gu, gv, True)


# ----------------------------------------------------------------------------------------------- the heads

@njit(cache=True, error_model="numpy", fastmath=EXACT_EXP)
def shift_max(z0, z1, z2, a0, a1, a2):
    """a_k = z_k − max(z0, z1, z2) per target: the softmax's exp arguments (heads_forward)."""
    for t in range(len(z0)):
        zmax = max(z0[t], max(z1[t], z2[t]))
        a0[t], a1[t], a2[t] = z0[t] - zmax, z1[t] - zmax, z2[t] - zmax


@njit(cache=True, error_model="numpy", fastmath=EXACT_EXP)
def clamp25(z, a):
    """a = z clamped to ±25 (the s and d logits' exp arguments)."""
    for t in range(len(z)):
        a[t] = min(max(z[t], -25.0), 25.0)


@njit(cache=True, error_model="numpy", fastmath=EXACT_EXP)
def normalise3(e0, e1, e2):
    """The softmax's three exponentials divided by their sum, in place."""
    for t in range(len(e0)):
        tot = 0.0
        tot += e0[t]
        tot += e1[t]
        tot += e2[t]
        e0[t], e1[t], e2[t] = e0[t] / tot, e1[t] / tot, e2[t] / tot


@njit(cache=True, error_model="numpy", fastmath=EXACT_EXP)
def curve_base(tt, s, b):
    """b = 1 + Δt / (1e−7 + s): a curve's base, whose −d-th power is its P(recall)."""
    for t in range(len(tt)):
        b[t] = 1.0 + tt[t] / (1e-7 + s[t])


@njit(cache=True, error_model="numpy", fastmath=EXACT_EXP)
def neg_product(d, lb, out):
    """out = −d·ln(base): the exponent of base^(−d)."""
    for t in range(len(d)):
        out[t] = -d[t] * lb[t]


@njit(cache=True, error_model="numpy", fastmath=EXACT_EXP)
def dot3(w0, w1, w2, p0, p1, p2, out):
    """out = Σ_c w_c·p_c per target, summed in curve order: the mixture of the curves' P(recall) (heads_forward) and
    the softmax reverse's Σ_c w_c·p_c (heads_backward)."""
    for t in range(len(w0)):
        p = 0.0
        p += w0[t] * p0[t]
        p += w1[t] * p1[t]
        p += w2[t] * p2[t]
        out[t] = p


@njit(cache=True, error_model="numpy", fastmath=EXACT_EXP)
def recall_and_log_arg(pr, ty, la_in):
    """P(recall) = (1 − 1e−7)·mixture, in place, and the BCE's log argument: p for a recall, 1 − p for a lapse
    (for libm's log1p(−p)). This and bce_grad take the targets' labels and weights gathered into rows of their own:
    read through the target index inside heads_forward, these loops stayed scalar (a divsd and a branch per target)."""
    for t in range(len(pr)):
        p = pr[t] * (1.0 - 1e-7)
        pr[t] = p
        la_in[t] = p if ty[t] > 0.5 else 1.0 - p


@njit(cache=True, error_model="numpy", fastmath=EXACT_EXP)
def bce_grad(pr, ty, tw, gp):
    """dL/d(mixture) per target: kernel_math.bce's gradient (its clamp) times dp/d(mixture) = 1 − 1e−7."""
    for t in range(len(pr)):
        p = pr[t]
        gp[t] = tw[t] * (p - ty[t]) / max(p * (1.0 - p), BCE_GRAD_EPS) * (1.0 - 1e-7)


@njit(cache=True, error_model="numpy")
def head_weights(w_w, s_w, d_w):
    """The heads' weights as one [9, H] matrix in their dtype: rows w, s, d of the 3 curves (the logits' order in
    heads_forward and the products of heads_backward)."""
    nc = N_CURVES
    wh = np.empty((3 * nc, H), w_w.dtype)
    for k in range(nc):
        for i in range(H):
            wh[k, i], wh[nc + k, i], wh[2 * nc + k, i] = w_w[k, i], s_w[k, i], d_w[k, i]
    return wh


@njit(cache=True, error_model="numpy", fastmath=EXACT_EXP)
def heads_forward(v, tr, tj, t_dt, t_y, t_w, w_w, w_b, s_w, s_b, d_w, d_b, p_out, hw, vtb):
    """The heads of a chunk's targets, all at once: target t reads row tr[t] of v (its history's last state) and is
    target tj[t] of the layout. P(recall) = (1 − 1e−7)·Σ_c w_c·(1 + Δt/(1e−7 + s_c))^(−d_c) into p_out[tj[t]];
    returns Σ weight·BCE (summed in t's order) and keeps in hw [N_HEAD, T] what heads_backward needs.

    Why batched: per target these are 9 logits, a softmax, 6 clamped exp, 3 log, 3 exp and the BCE's log; in one
    scalar loop per target the libm calls and their data-dependent chains cost ≈ 17% of a pass. Here each kind of
    transcendental runs over one flat array of all the targets' arguments (vec_math's exp_vec and log_vec: several
    values per instruction, within 1 ulp of libm), the cheap arithmetic between them in plain loops. The logits are
    summed exactly as in a per-target loop (the products in the network's dtype, each of the nine sums in float64
    in input order), but with the targets innermost over the read rows gathered feature-major, so the loops
    vectorise (63 → 31 ns per target, same bits); only the exp's and log's last bits differ from libm's (P(recall)
    within ~1e−16 relative). Measured on a 450-target chunk: forward ≈ 90–120 ns per target, backward ≈ 75."""
    n_t = len(tr)
    z_, a_, e_, b_, l_, pc_ = hw[0:9], hw[9:18], hw[18:27], hw[27:30], hw[30:33], hw[33:36]
    pr, la_in, la, tt, ty, tw = hw[36], hw[38], hw[39], hw[40], hw[41], hw[42]
    nz = 3 * N_CURVES
    wh = head_weights(w_w, s_w, d_w)
    bh = np.empty(nz)
    for k in range(N_CURVES):
        bh[k], bh[N_CURVES + k], bh[2 * N_CURVES + k] = w_b[k], s_b[k], d_b[k]
    vt = vtb[:H * n_t].reshape((H, n_t))  # the read rows feature-major, so the logits' loops run over targets
    for t in range(n_t):
        r = tr[t]
        for i in range(H):
            vt[i, t] = v[r, i]
    for k in range(nz):  # z_k = b_k + Σ_i w_ik·v_i, each target's sum in input order as one scalar dot product
        zk, b = z_[k], bh[k]
        for t in range(n_t):
            zk[t] = b
        for i in range(H):
            w, vi = wh[k, i], vt[i]
            for t in range(n_t):
                zk[t] += w * vi[t]
    nc = N_CURVES
    # the exp arguments: softmax shifted by its max, s and d clamped to ±25. Each loop over the targets is a
    # function of its own whose rows are separate arguments: as rows of the one array hw, every loop that wrote one
    # row and read another stayed scalar (LLVM cannot order accesses at unknown distances in one object)
    shift_max(z_[0], z_[1], z_[2], a_[0], a_[1], a_[2])
    for k in range(nc, 3 * nc):
        clamp25(z_[k], a_[k])
    for t in range(n_t):  # the targets' elapsed days, labels and weights, gathered once into rows of their own
        jt = tj[t]
        tt[t], ty[t], tw[t] = t_dt[jt], t_y[jt], t_w[jt]
    exp_vec(flat(a_), flat(e_))  # rows: e^(z_w − max) (then w, below), s, d
    normalise3(e_[0], e_[1], e_[2])
    for k in range(nc):
        curve_base(tt, e_[nc + k], b_[k])
    log_vec(flat(b_), flat(l_))
    a3 = a_[0:nc]
    for k in range(nc):
        neg_product(e_[2 * nc + k], l_[k], a3[k])
    exp_vec(flat(a3), flat(pc_))  # base^(−d) as e^(−d·ln base) (the log serves dp/dd too)
    dot3(e_[0], e_[1], e_[2], pc_[0], pc_[1], pc_[2], pr)
    recall_and_log_arg(pr, ty, la_in)
    for t in range(n_t):
        p_out[tj[t]] = pr[t]
    log_vec(la_in, la)
    bce_grad(pr, ty, tw, hw[37])
    loss = 0.0
    for t in range(n_t):  # kernel_math.bce's clamps, with the logarithm computed above; summed in t's order
        loss += -tw[t] * max(la[t], BCE_LOG_FLOOR) if la_in[t] > 0.0 else -tw[t] * BCE_LOG_FLOOR
    return loss


@njit(cache=True, error_model="numpy", fastmath=FAST)
def logit_grads(gp, dot, w_, s_, d_, pc_k, b_k, l_k, zs, zd, tt, gw, gs_, gd_):
    """dL/d(logits) of one curve k over the targets (heads_backward; dot = Σ_c w_c·p_c); each row its own
    argument."""
    for t in range(len(gp)):
        g = gp[t]
        w, s, d, pc = w_[t], s_[t], d_[t], pc_k[t]
        gw[t] = g * w * (pc - dot[t])  # softmax's reverse
        # dp_c/ds = −d·base^(−d−1)·(−t/(1e−7 + s)²); ds/dz = s inside the clamp
        gs = g * w * d * pc / b_k[t] * tt[t] / (1e-7 + s) ** 2
        gs_[t] = gs * s if -25.0 <= zs[t] <= 25.0 else 0.0
        gd = -g * w * pc * l_k[t]
        gd_[t] = gd * d if -25.0 <= zd[t] <= 25.0 else 0.0


@njit(cache=True, error_model="numpy", fastmath=FAST)
def heads_backward(vt, tr, w_w, s_w, d_w, hw, gbuf, gv, g_w_w, g_w_b, g_s_w, g_s_b, g_d_w, g_d_b):
    """Reverse of heads_forward: dL/d(logits) per target as flat float64 arrays, then, in the network's dtype, the
    heads' weight gradients as one product gz·v [9, T]·[T, H] (vt: heads_forward's feature-major read rows [H, T])
    and dL/dv = gzᵀ·W [T, 9]·[9, H], each added once per chunk (not per target) into the gradient and gv (zeroed
    here; gv: the read rows); gbuf [≥ T·(H + 9)] of that dtype is scratch. The products were float64 BLAS on a
    float64 copy of the read rows; the gradients they feed are in the network's dtype either way."""
    n_t = len(tr)
    z_, e_, b_, l_, pc_, gp, tt = hw[0:9], hw[18:27], hw[27:30], hw[30:33], hw[33:36], hw[37], hw[40]
    gz = hw[9:18]  # the exp arguments are spent: dL/d(logits) [9, T]
    nc = N_CURVES
    nz = 3 * nc
    dot = hw[38]  # the BCE's log arguments are spent
    dot3(e_[0], e_[1], e_[2], pc_[0], pc_[1], pc_[2], dot)  # once, for the three curves
    for k in range(nc):
        logit_grads(gp, dot, e_[k], e_[nc + k], e_[2 * nc + k], pc_[k], b_[k], l_[k], z_[nc + k], z_[2 * nc + k], tt,
                    gz[k], gz[nc + k], gz[2 * nc + k])
    for k in range(nc):  # the biases' gradients: float64 sums over the targets
        sw = ss = sd = 0.0
        for t in range(n_t):
            sw += gz[k, t]
            ss += gz[nc + k, t]
            sd += gz[2 * nc + k, t]
        g_w_b[k] += sw
        g_s_b[k] += ss
        g_d_b[k] += sd
    gzd = gbuf[:nz * n_t].reshape((nz, n_t))  # dL/d(logits) in the network's dtype
    gzf, gf = flat(gzd), flat(gz)
    for e in range(nz * n_t):
        gzf[e] = gf[e]
    gw = np.dot(gzd, vt.T)  # [9, H]
    wh = head_weights(w_w, s_w, d_w)
    gvt = gbuf[nz * n_t:(nz + H) * n_t].reshape((n_t, H))
    np.dot(gzd.T, wh, gvt)  # [T, H]
    for k in range(nc):
        for i in range(H):
            g_w_w[k, i] += gw[k, i]
            g_s_w[k, i] += gw[nc + k, i]
            g_d_w[k, i] += gw[2 * nc + k, i]
    for r in range(gv.shape[0]):
        for i in range(H):
            gv[r, i] = 0.0
    m = gv.shape[1]  # H at run time: a constant 20 unrolls the row loop into scalar moves
    for t in range(n_t):
        r = tr[t]
        for i in range(m):
            gv[r, i] += gvt[t, i]


# ----------------------------------------------------------------------------------------------- one chunk of cards

N_W20, N_W80, N_W1 = 46, 4, 6  # [N, H], [N, 4H] and [N] arrays of one chunk (chunk_loss names them)
N_HEAD = 43  # float64 rows per target of the heads' work space (heads_forward names them)


@njit(cache=True, error_model="numpy", fastmath=FAST)
def workspace(n, dt, n_t=1):
    """Work arrays of dtype dt for chunks of up to n rows and n_t targets: ([N_W20, n, H], [N_W80, n, 4H],
    [N_W1, n], the heads' float64 [N_HEAD·n_t] (reshaped per chunk, so that its rows are contiguous for flat
    loops), [n_t·(H + 9)] of dt (heads_backward's scratch) and [n_t·H] of dt (heads_forward's [H, T])). A chunk's
    inputs are its plan's (`chunk_plan`)."""
    return (np.empty((N_W20, n, H), dt), np.empty((N_W80, n, G4), dt), np.empty((N_W1, n), dt),
            np.empty(N_HEAD * n_t), np.empty(n_t * (H + 3 * N_CURVES), dt), np.empty(n_t * H, dt))


def chunk_grad(grad, th):
    """Where a chunk adds its gradient: grad itself in float64; in float32 a float32 buffer of its own, which
    `flush_grad` adds into grad (float64) after each chunk, so sums over many chunks do not lose float32 digits."""


@overload(chunk_grad)
def _chunk_grad(grad, th):
    if th.dtype == grad.dtype:
        return lambda grad, th: grad
    return lambda grad, th: np.zeros(len(grad), th.dtype)


def flush_grad(grad, buf):
    """grad += buf and buf = 0, unless buf is grad (float64)."""


@overload(flush_grad)
def _flush_grad(grad, buf):
    if buf.dtype == grad.dtype:
        return lambda grad, buf: None

    def flush(grad, buf):
        for j in range(len(grad)):
            grad[j] += buf[j]
            buf[j] = 0.0
    return flush


@njit(cache=True, error_model="numpy", fastmath=EXACT_EXP)
def encode(feats, src, dst, model, x):
    """x[dst] = the 6 inputs of the rows whose features are feats[src]: standardised ln(1e−5 + Δt),
    ln(clamp(duration, 100, 60000)) and the one-hot rating (clamped ≥ 1)."""
    mean0, mean1, std0, std1 = model[0], model[1], model[2], model[3]
    for i in range(len(src)):
        s, r = src[i], dst[i]
        for j in range(N_IN):
            x[r, j] = 0.0
        x[r, 0] = (math.log(1e-5 + feats[s, 0]) - mean0) / std0
        x[r, 1] = (math.log(min(max(feats[s, 1], 100.0), 60000.0)) - mean1) / std1
        x[r, 2 + max(int(feats[s, 2]), 1) - 1] = 1.0


@njit(cache=True, error_model="numpy", fastmath=FAST)
def encode_rows(feats, model):
    """encode() of every row of feats: [len(feats), N_IN] in the kernels' dtype (model[4]'s). A fine-tune reads the
    same rows in each of its passes, so models/lstm.py encodes them once per fit and hands these to the kernel in
    place of the raw features (`inputs`): the two logarithms per row were ~1–2% of a pass. In float32 each value
    rounds once from the same float64 result, exactly as encode() writing into the float32 work space directly; kept
    in float64 they were twice the memory, which `inputs` reads card by card (cards far apart: ≈ 1.4% of a pass on
    a 45k-review user, most of it waiting on memory)."""
    x = np.empty((len(feats), N_IN), dtype=np.asarray(model[4]).dtype)
    rows = np.arange(len(feats))
    encode(feats, rows, rows, model, x)
    return x


@njit(cache=True, error_model="numpy", fastmath=FAST)
def inputs(feats, src, dst, model, x):
    """x[dst] = the 6 inputs of the rows feats[src]: copied when feats already holds them (encode_rows, N_IN
    columns), encoded from the raw (Δt, duration, rating) otherwise. chunk_loss hands the rows card by card, so that
    feats is read in order (a card's rows are contiguous there) and the writes scatter within the chunk's small x
    (time-major, feats' reads jumped between cards: ~1.8% of a pass, most of it waiting on memory)."""
    if feats.shape[1] == N_IN:
        for i in range(len(src)):
            s, r = src[i], dst[i]
            for j in range(N_IN):
                x[r, j] = feats[s, j]
    else:
        encode(feats, src, dst, model, x)


@njit(cache=True, error_model="numpy", fastmath=FAST)
def chunk_plan(model, layout, cards):
    """What a chunk of `cards` needs besides the weights, the same in every pass over them: (bs, off) of its packed
    time-major layout (cards longest first; row of card rank q at step k = off[k] + q; bs[k] cards run step k),
    x0 [rows, N_IN] its inputs in that layout, and its targets: tr (the read row each one reads, in the order
    their losses are summed: card rank, then target), tj (its index in the layout's t_* arrays) and rd (read row
    -> row)."""
    feats, c_start, c_steps, c_tfirst, c_count, t_pos = layout[:6]
    steps = np.empty(len(cards), dtype=np.int64)
    for q in range(len(cards)):
        steps[q] = c_steps[cards[q]]
    rank = stable_argsort_small(steps, True)
    bs, off = lockstep_plan(steps[rank])
    n = off[len(bs)]
    src, dst = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)  # card by card: feats read in order
    i = 0
    for q in range(len(cards)):
        c = cards[rank[q]]
        for k in range(c_steps[c]):
            src[i], dst[i] = c_start[c] + k, off[k] + q
            i += 1
    x0 = np.empty((n, N_IN), dtype=np.asarray(model[4]).dtype)
    inputs(feats, src, dst, model, x0)
    # the rows that some target reads (its history's last step); the layers after the LSTMs run on these only
    n_t = 0
    for q in range(len(cards)):
        n_t += c_count[cards[rank[q]]]
    tr, tj = np.empty(n_t, dtype=np.int64), np.empty(n_t, dtype=np.int64)
    ri = np.full(n, -1, dtype=np.int64)  # row -> its place among the read rows (−1: read by no target)
    i = 0
    for q in range(len(cards)):  # the targets in the order their losses are summed (card rank, then target)
        c = cards[rank[q]]
        for jt in range(c_tfirst[c], c_tfirst[c] + c_count[c]):
            r = off[t_pos[jt] - 1] + q  # the row of the state after the target's history (its last step)
            ri[r] = 0
            tr[i], tj[i] = r, jt
            i += 1
    rd = np.empty(n, dtype=np.int64)  # read row -> row
    m = 0
    for r in range(n):
        if ri[r] >= 0:
            ri[r] = m
            rd[m] = r
            m += 1
    for i in range(n_t):
        tr[i] = ri[tr[i]]  # the target's read row
    return bs, off, x0, tr, tj, rd[:m].copy()


@njit(cache=True, error_model="numpy", fastmath=FAST)
def chunk_loss(model, layout, plan, par, wts, want, grs, p_out, ws):
    """Σ weight·BCE of the targets of one chunk of cards (`plan`: its chunk_plan), P(recall) into p_out, gradient
    added into the views grs (par, grs: `views` of the weights and of the gradient; wts: both LSTMs' `lstm_wt`);
    ws = workspace(≥ the chunk's rows and targets)."""
    t_dt, t_y, t_w = layout[6], layout[8], layout[9]
    (pre_w, pre_b, pre_ln, pre2_w, pre2_b, ln1, ih1, hh1, bih1, bhh1, ln2, ln2_b, ih2, hh2, bih2, bhh2,
     mlp_ln1, mlp_w1, mlp_b1, mlp_ln2, mlp_w2, mlp_b2, out_ln, out_w, out_b, w_w, w_b, s_w, s_b, d_w, d_b) = par
    wt_ih1, wt_hh1, wt_ih2, wt_hh2 = wts
    bs, off, x0, tr, tj, rd = plan
    n, n_t, m = off[len(bs)], len(tr), len(rd)
    w20, w80, w1 = ws[0], ws[1], ws[2]
    (a1, s1, sg1, n1, xh1, a2, v0, sg2, u1, xhu1, h1, c1, tc1, v1, u2, xhu2, h2, c2, tc2, v2, m0, xhm0, m1, m2,
     sgm1, m3, xhm3, m4, m5, sgm4, v3, f0, xhf0, f1, v, sgf1) = (
        w20[0, :n], w20[1, :n], w20[2, :n], w20[3, :n], w20[4, :n], w20[5, :n], w20[6, :n], w20[7, :n], w20[8, :n],
        w20[9, :n], w20[10, :n], w20[11, :n], w20[12, :n], w20[13, :n], w20[14, :n], w20[15, :n], w20[16, :n],
        w20[17, :n], w20[18, :n], w20[19, :n], w20[20, :n], w20[21, :n], w20[22, :n], w20[23, :n], w20[24, :n],
        w20[25, :n], w20[26, :n], w20[27, :n], w20[28, :n], w20[29, :n], w20[30, :n], w20[31, :n], w20[32, :n],
        w20[33, :n], w20[34, :n], w20[35, :n])
    gv, gb1, gb2, dh_rec, dc_even = w20[36, :n], w20[37, :n], w20[38, :n], w20[39, :n], w20[40, :n]
    dc_odd, c1b, c2b = w20[43, :n], w20[44, :n], w20[45, :n]  # the cells of odd steps in c1b, c2b
    (m0, xhm0, m1, m2, sgm1, m3, xhm3, m4, m5, sgm4, v3, f0, xhf0, f1, v, sgf1) = (
        m0[:m], xhm0[:m], m1[:m], m2[:m], sgm1[:m], m3[:m], xhm3[:m], m4[:m], m5[:m], sgm4[:m], v3[:m], f0[:m],
        xhf0[:m], f1[:m], v[:m], sgf1[:m])
    v2r, gv2 = w20[41, :m], w20[42, :n]  # v2 at the read rows; dL/dv2 at every row
    g1, g2, tmp80, dg = w80[0, :n], w80[1, :n], w80[2, :n], w80[3, :n]
    hu = flat(w80[2])[:n * 2 * H].reshape((n, 2 * H))  # lstm_backward's [h_prev | u] (tmp80 serves the forward only)
    rs1, rsu1, rsu2, rsm0, rsm3, rsf0 = w1[0, :n], w1[1, :n], w1[2, :n], w1[3, :m], w1[4, :m], w1[5, :m]
    # forward, layer by layer over all rows
    linear(x0, pre_w, pre_b, a1)
    silu(a1, s1, sg1)
    layer_norm(s1, pre_ln, pre_ln, False, n1, xh1, rs1)
    linear(n1, pre2_w, pre2_b, a2)
    silu(a2, v0, sg2)
    layer_norm(v0, ln1, ln1, False, u1, xhu1, rsu1)
    lstm_forward(u1, wt_ih1, wt_hh1, bih1, bhh1, off, bs, h1, c1, c1b, tc1, g1, tmp80)
    add(v0, h1, v1)
    layer_norm(v1, ln2, ln2_b, True, u2, xhu2, rsu2)
    lstm_forward(u2, wt_ih2, wt_hh2, bih2, bhh2, off, bs, h2, c2, c2b, tc2, g2, tmp80)
    add(v1, h2, v2)
    gather_rows(v2, rd, v2r)
    layer_norm(v2r, mlp_ln1, mlp_ln1, False, m0, xhm0, rsm0)
    linear(m0, mlp_w1, mlp_b1, m1)
    silu(m1, m2, sgm1)
    layer_norm(m2, mlp_ln2, mlp_ln2, False, m3, xhm3, rsm3)
    linear(m3, mlp_w2, mlp_b2, m4)
    silu(m4, m5, sgm4)
    add(v2r, m5, v3)
    layer_norm(v3, out_ln, out_ln, False, f0, xhf0, rsf0)
    linear(f0, out_w, out_b, f1)
    silu(f1, v, sgf1)
    # heads at every target: p = (1 − 1e−7)·Σ_c w_c·(1 + t/(1e−7 + s_c))^(−d_c), all of the chunk's targets at once
    hw = ws[3][:N_HEAD * n_t].reshape((N_HEAD, n_t))
    loss = heads_forward(v, tr, tj, t_dt, t_y, t_w, w_w, w_b, s_w, s_b, d_w, d_b, p_out, hw, ws[5])
    (g_pre_w, g_pre_b, g_pre_ln, g_pre2_w, g_pre2_b, g_ln1, g_ih1, g_hh1, g_bih1, g_bhh1, g_ln2, g_ln2_b, g_ih2,
     g_hh2, g_bih2, g_bhh2, g_mlp_ln1, g_mlp_w1, g_mlp_b1, g_mlp_ln2, g_mlp_w2, g_mlp_b2, g_out_ln, g_out_w,
     g_out_b, g_w_w, g_w_b, g_s_w, g_s_b, g_d_w, g_d_b) = grs
    if not want:
        return loss
    heads_backward(ws[5][:H * n_t].reshape((H, n_t)), tr, w_w, s_w, d_w, hw, ws[4], gv[:m], g_w_w, g_w_b, g_s_w,
                   g_s_b, g_d_w, g_d_b)
    gih, gbih = np.empty((G4, H), pre_w.dtype), np.empty(G4, pre_w.dtype)  # an LSTM's dL/dw_ih, dL/db_ih over x̂
    # reverse pass, layer by layer; the residual stream's gradient is carried in gb2 (read rows: gb2[:m], gv2 at
    # every row from dL/dv2 on)
    gv, gb1, gb2 = gv[:m], gb1[:m], gb2[:m]
    silu_back_ip(f1, sgf1, gv)
    linear_ln_back(xhf0, out_ln, out_w, gv, g_out_w, g_out_b, g_out_ln, gb1)
    layer_norm_back(xhf0, rsf0, out_ln, gb1, gb2, False)  # dL/dv3
    silu_back(m4, sgm4, gb2, gv)
    linear_ln_back(xhm3, mlp_ln2, mlp_w2, gv, g_mlp_w2, g_mlp_b2, g_mlp_ln2, gb1)
    layer_norm_back(xhm3, rsm3, mlp_ln2, gb1, gv, False)
    silu_back_ip(m1, sgm1, gv)
    linear_ln_back(xhm0, mlp_ln1, mlp_w1, gv, g_mlp_w1, g_mlp_b1, g_mlp_ln1, gb1)
    layer_norm_back(xhm0, rsm0, mlp_ln1, gb1, gb2, True)  # dL/dv2 at the read rows
    gv, gb1 = w20[36, :n], w20[37, :n]
    gf = flat(gv2)
    for e in range(n * H):  # dL/dv2: only through the LSTMs at the rows no target reads (flat: vectorised)
        gf[e] = 0.0
    scatter_rows(gb2, rd, gv2)
    lstm_layer_back(xhu2, rsu2, h2, c2, c2b, tc2, g2, ih2, hh2, ln2, ln2_b, True, off, bs, gv2, g_ih2, g_hh2, g_bih2,
                    g_bhh2, g_ln2, g_ln2_b, gih, gbih, gb1, dg, dh_rec, dc_even, dc_odd, hu)  # dL/dv1 into gv2
    lstm_layer_back(xhu1, rsu1, h1, c1, c1b, tc1, g1, ih1, hh1, ln1, ln1, False, off, bs, gv2, g_ih1, g_hh1, g_bih1,
                    g_bhh1, g_ln1, g_ln1, gih, gbih, gb1, dg, dh_rec, dc_even, dc_odd, hu)  # dL/dv0 into gv2
    silu_back_ip(a2, sg2, gv2)
    linear_ln_back(xh1, pre_ln, pre2_w, gv2, g_pre2_w, g_pre2_b, g_pre_ln, gb1)
    layer_norm_back(xh1, rs1, pre_ln, gb1, gv, False)
    silu_back_ip(a1, sg1, gv)
    linear_back(x0, pre_w, gv, g_pre_w, g_pre_b, gb1, False)
    return loss


@njit(cache=True, error_model="numpy", fastmath=FAST)
def make_plans(model, layout, cards):
    """The chunk plans of a call's cards (`chunk_plan`): the cards sorted by length, shortest first, so that cards of
    like length share a chunk (fewer, larger recurrent products: ~1.1× per pass measured), and cut into chunks of
    ≈ CHUNK_STEPS steps, whose per-row arrays stay in cache."""
    c_steps = layout[2]
    cards = cards[stable_argsort_small(c_steps[cards], False)]
    bounds = card_batch_bounds(c_steps[cards], CHUNK_STEPS)
    plans = List()
    for b in range(len(bounds) - 1):
        plans.append(chunk_plan(model, layout, cards[bounds[b]:bounds[b + 1]]))
    return plans


def _memo_maker(dtype):
    """A compiled (disk-cached) maker of plan_memo's two empty typed lists for plans of `dtype`: a typed List made
    from Python compiles numba's list constructor in every process (~0.5 s, each run), one made in a cached
    function is loaded with it (~10 ms)."""
    arr = getattr(types, np.dtype(dtype).name)[:, ::1]
    ints = types.int64[::1]
    plans = types.ListType(types.Tuple((ints, ints, arr, ints, ints, ints)))

    def make():
        return List.empty_list(ints), List.empty_list(plans)
    return make


_memo32 = njit(cache=True)(_memo_maker(np.float32))
_memo64 = njit(cache=True)(_memo_maker(np.float64))


def plan_memo(dtype) -> tuple:
    """An empty memo of chunk plans for a layout whose card groups repeat (models/lstm.py's kernel_layout appends it
    to the layout as its 11th entry): (the groups' cards, their plans), filled by `call_plans` on first sight."""
    name = np.dtype(dtype).name
    if name == "float32":
        return _memo32()
    if name == "float64":
        return _memo64()
    raise ValueError(f"plan_memo: no plans of {name}")


def call_plans(model, layout, cards, want):
    """make_plans(model, layout, cards), remembered in the layout's memo when it has one (`plan_memo`) and `want`:
    the fine-tune visits the same card groups in each of its 20 passes, and their plans (sorting, packing, the
    read rows, the inputs copied into the packed order) were ≈ 2–3% of a pass."""


@overload(call_plans)
def _call_plans(model, layout, cards, want):
    if len(layout) <= 10:
        return lambda model, layout, cards, want: make_plans(model, layout, cards)

    def memoised(model, layout, cards, want):
        keys, plans = layout[10]
        for g in range(len(keys)):
            if np.array_equal(keys[g], cards):
                return plans[g]
        made = make_plans(model, layout, cards)
        if want:
            keys.append(cards.copy())
            plans.append(made)
        return made
    return memoised


@njit(cache=True, error_model="numpy", fastmath=FAST)
def lstm_cards_loss(model, layout, cards, theta, want, grad, p_out):
    """neural/card_fit.py's card_loss for the LSTM (model: input_mean and input_std, 4 floats): Σ weight·BCE over
    every target of `cards`, each target's P(recall) written to p_out[its index]; with `want`, the gradient is ADDED
    into grad. The cards go in chunks of ≈ CHUNK_STEPS steps (`make_plans`), shortest cards first, so the per-row
    arrays stay in cache; one work space serves them all. Only the order in which the gradient's sums are added
    depends on the chunks. layout: card_fit's, or with a memo of the chunk plans as its 11th entry (`plan_memo`)."""
    plans = call_plans(model, layout, cards, want)
    n_max = t_max = 1
    for b in range(len(plans)):
        bs, off, tr = plans[b][0], plans[b][1], plans[b][3]
        n_max, t_max = max(n_max, off[len(bs)]), max(t_max, len(tr))
    th = np.empty(len(theta), dtype=np.asarray(model[4]).dtype)  # the network's weights in its dtype
    for i in range(len(theta)):  # a loop: a slice assignment's shape check compiles numba's error message (~3 s)
        th[i] = theta[i]
    ws = workspace(n_max, th.dtype, t_max)
    g = grad if want else np.zeros(N_PARAMS)  # unused without `want`: chunk_loss's views need a full vector
    gc = chunk_grad(g, th)
    par, grs = views(th), views(gc)  # once per call, as the LSTMs' transposed weights
    wts = lstm_wt(par[6], par[7]) + lstm_wt(par[12], par[13])
    loss = 0.0
    for b in range(len(plans)):
        loss += chunk_loss(model, layout, plans[b], par, wts, want, grs, p_out, ws)
        if want:
            flush_grad(g, gc)
    return loss
