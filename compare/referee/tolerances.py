"""Every tolerance the checks and tests use, with the reason for its size. Compare structure before values."""

# Training reaches the known answer (`checks.ols_reached`). After 40 epochs of Adam(0.01) a run ends where its seed
# (initial weights, batch order) left it: on the default data, over 200 seeds, up to 5.3% above OLS's test MSE and
# 0.41 from its slopes (the regressors are collinear, so the slopes move along a flat valley). A constant tolerance
# would let the seed decide the verdict, so each run measures the band on its own data: the HAR trained once per
# seed by the many-model trainers, each seed's distance to OLS, this percentile of them. A correct path is one more
# draw of the same training, so it lands beyond the band with probability 1 - 99.9% (exchangeability: no
# assumption on the distances' distribution); three engines' two measures false-alarm at most 0.6% of runs.
OLS_BAND_PERCENTILE = 99.9
# ...and never beyond these, so that a band that is itself wide (every seed far from OLS: training that does not
# reach it on this data) cannot pass a broken path. A band past them cannot decide, and the check says so.
OLS_MSE_HARD = 0.25  # a model 25% worse than OLS on the test days has not reached it
SLOPE_HARD = 1.0  # a stationary HAR's slopes lie in [0, 1): a slope 1 away is no estimate of it
# `compare --converge` (`checks.converge_spec`): Adam(0.05) decayed to 0 over 2,000 steps ends at the training rows'
# least squares up to the last steps' mini-batch noise. Over 300 seeds (native.jax.many.train_seeds, a one-off run,
# docs/dev-notes.md) on each of the ten panels of tests/compare/test_verdict.py: at most 1.7e-3 from OLS's test MSE
# (a short history, whose test days differ most from its training days) and 4.6e-3 from its slopes; on the default
# data 1.6e-4 and 2.3e-3. The ten panels' converged `compare` runs (make test-full) end within 0.21 of these.
# Each converged run confirms them on its own data: its seeds train the converged way too (`checks.Band.converged`).
CONVERGED_MSE_RTOL = 5e-3
CONVERGED_SLOPE_ATOL = 1e-2
# One fixed run, not a verdict: the lesson's first loops and the tests that train the HAR at seed 0 on the default
# data, whose slopes land 0.01 to 0.03 from OLS's (deterministic: the same seed and data give the same weights).
SLOPE_ATOL = 0.05

# Gradients against the float64 formula 2/n·Xᵀ(Xw+b−y).
GRAD_RTOL_F32 = 1e-5  # float32 sums of 256 terms: ~sqrt(256)·6e-8 plus rounding of the inputs
GRAD_RTOL_F64 = 1e-12  # float64 sums of 256 terms: ~sqrt(256)·1.1e-16, with wide margin
# torch under a float64 policy: Keras 3.15.1 computes the Dense in float32 (keras-team/keras#23704); measured 1.3e-7.
GRAD_RTOL_F64_UPSTREAM = 1e-6
FD_RTOL = 1e-7  # central differences in float64, step 1e-6: truncation ~h², cancellation ~1e-16/h

# Moving weights between engines.
PORTABLE_ATOL = 1e-6  # standardized units: the same float32 weights, each engine's own float32 matmul
# Same init, same batches, same Adam: after 720 steps the engines differ only by float32 reduction order. Every two
# paths within it (each path within half of it of the paths' median: `checks.same_arithmetic`).
SAME_ARITHMETIC_ATOL = 1e-5
# ...over every epoch for the HAR (convex: rounding differences stay at ~1e-7), over this many for any other model.
# A model with kinks (ReLU, MAE) amplifies them once a unit or residual crosses zero on one engine and not on the
# other: torch against JAX, from the same start and batches (`compare --model conv1d --engines torch,jax
# --same-epochs N`), conv1d measured 2.4e-7 after 10 epochs, 2.3e-3 after 40. The model's sensitivity, not arithmetic.
SAME_ARITHMETIC_EPOCHS = 3

# Within one engine.
SCAN_VS_LOOP_ATOL = 1e-6  # the fused lax.scan driver against the Python loop over the same jitted step
COMPILED_VS_EAGER_ATOL = 1e-5  # torch.compile's fused kernels round the batch sums differently, step after step
# The torch walk-forward's compiled steps (torch's Adam traced one tensor at a time) against its eager ones (Adam's
# fused kernel): the same update, its moments updated in another order (a lerp against a multiply-add). Measured on
# the 582 walk-forward models: 2.4e-7 after 3 epochs, 8.9e-8 after 40.
TRACED_VS_FUSED_ADAM_ATOL = 1e-6
MODEL_API_ATOL = 1e-6  # Sequential, Functional and subclass MLPs with copied weights, float32
SHARPE_ATOL = 1e-6  # keras.ops Sharpe (float32 means and stds of ~4,500 days) against pandas in float64

# Statistics.
OLS_VS_STATSMODELS_ATOL = 1e-8  # two float64 least-squares solvers on a well-conditioned design
TRUTH_STD_ERRORS = 3.0  # OLS recovers the true slopes within this many standard errors
# The leverage slope is ~-10 log RV per unit return with a standard error of ~1.2: Adam(0.01) ends ~0.01 from the
# optimum in standardized units, which is ~1.5 standard errors of this one slope.
LEVERAGE_STD_ERRORS = 2.0

# Gradient parity of any model (compare.parity): float32 gradients of deeper models (LSTM, LayerNorm, Conv1D)
# against float64 autograd, elementwise |diff| <= ATOL + RTOL·|expected|.
PARITY_RTOL = 1e-4  # float32 through a few layers and a recurrence: ~1e-6 relative, with margin
PARITY_ATOL = 1e-6  # elements whose true gradient is ~0 (a ReLU at its kink, a zero-padded position)
VMAP_VS_ALONE_ATOL = 1e-6  # a vmapped model against the same trainer run alone: batched float32 matmuls
# Models sharded over devices against one device (the walk-forward's forecasts): each model's own float32 operations,
# but XLA's CPU kernels choose how to sum a dot's terms by the shapes they get, and a device holding fewer models can
# get another order (YNNPACK's dot; a vector loop's remainder). Measured 0 on the machine of earlier rounds, up to
# 7.2e-7 on an AMD EPYC (AVX2): under one ulp of a log-variance forecast near -8 (9.5e-7). Four such ulps.
SHARDED_ATOL = 4e-6
CONV_AS_MATMUL_RTOL = 1e-6  # native.jax.convolution against XLA's convolution, relative to the largest output or
# gradient: the same float32 products summed in another order, a few ulps of the sums (measured 2e-7)
FLOOR_VS_LOOP_ATOL = 1e-6  # the bench floors (no Keras) against the native loop, 3 epochs: the same ops, measured
# equal to the bit on every model here; the margin is for another machine's kernels
# Walk-forward forecasts of 40-epoch Adam fits against OLS forecasts, per asset: measured within 0.21% (JAX) and
# 0.30% (torch) on the six synthetic assets; the margin covers other seeds' Adam noise around the optimum.
WALK_FORWARD_MSE_RTOL = 0.01

# Optimizers (tests/native/test_optim.py): 40 steps on weights of size ~1 from the same gradients.
# The Keras-exact optimizers do Keras's float32 operations in Keras's order: measured 0 (bit-identical) after 40
# steps; one ulp of a weight of size ~2 is allowed, for a platform whose kernels round one operation otherwise.
OPTIMIZER_EXACT_ATOL = 2.5e-7
# The stock optimizer where no convention differs: Keras computes Adam's bias corrections 1 − β^t in float32 (0.999
# is not a float32 number, so 1 − β2 is off by 1.3e-5 relative), torch in float64: up to ~6e-8 a step on weights
# near 1, measured 1.4e-6 after 40 steps.
OPTIMIZER_ROUNDING_ATOL = 2e-6
# A convention that matters moves the weights elsewhere by at least this share of how far they moved at all
# (measured: 0.1 to 16; the float32 rounding of a real equivalent is ~1e-5 of it).
OPTIMIZER_CONVENTION_MIN = 1e-2

# The zoo: `fit` and a native loop from the same weights, batches and Keras-exact optimizer, 3 epochs. What is left
# is float32 reduction order (each engine's kernels for a loss, a BatchNorm mean, an LSTM cell), step after step.
ZOO_ATOL = 1e-5
# The loss and metrics a loop reports per epoch against `fit`'s History: the same float32 values, accumulated over
# the epoch in another order (fit's Mean metrics, a loop's running sum); measured up to 3e-8.
HISTORY_ATOL = 1e-6

# Training parity of any model (compare.parity.assert_training_matches): every step's weights on two paths from the
# same start and batches, |diff| <= ATOL + RTOL·|expected|. What is left on the zoo is float32 reduction order step
# after step (ZOO_ATOL above, measured <= 2.4e-7 after 3 epochs); the relative part covers weights far from 1.
TRAINING_ATOL = 1e-5
TRAINING_RTOL = 1e-5

# Data parallelism (native/torch/ddp.py): two processes, each the mean loss of its shard of the global batch,
# gradients averaged by DDP's all-reduce, against one process on the same global batches. The sums are split in two
# and added in another order: measured 2.6e-8 on the HAR after 3 epochs.
DATA_PARALLEL_ATOL = 1e-5
