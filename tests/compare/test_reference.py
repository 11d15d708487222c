import numpy as np
import pytest
import statsmodels.api as sm

from compare.data import panel as data, reference, synthetic
from compare.referee.tolerances import FD_RTOL, OLS_VS_STATSMODELS_ATOL, TRUTH_STD_ERRORS


@pytest.mark.parametrize("asset", synthetic.ASSETS)
def test_ols_recovers_the_true_process(panel, asset):
    """On all rows, the four-regressor OLS (HAR + leverage) finds the true slopes within 3 standard errors."""
    design = data.har_features(panel, asset)
    fit = reference.ols(design, None, features=data.HAR + data.LEVERAGE)
    truth = np.r_[synthetic.TRUE.slopes, synthetic.TRUE.leverage()[synthetic.ASSETS.index(asset)]]
    z = np.abs(fit.slopes - truth) / fit.std_errors
    assert (z < TRUTH_STD_ERRORS).all(), dict(zip(fit.features, z.round(2)))
    assert fit.slopes[-1] < 0  # leverage: a fall yesterday raises today's variance


def test_ols_matches_statsmodels(panel):
    train, test = data.split_dates(data.har_features(panel, "indice"), data.DEFAULT_SPLIT, None)
    fit = reference.ols(train, test)
    sm_fit = sm.OLS(train["y"].to_numpy(), sm.add_constant(train[list(data.HAR)].to_numpy())).fit()
    np.testing.assert_allclose(np.r_[fit.intercept, fit.slopes], sm_fit.params, atol=OLS_VS_STATSMODELS_ATOL, rtol=0)
    np.testing.assert_allclose(fit.std_errors, sm_fit.bse[1:], rtol=1e-6)
    pred = sm_fit.predict(sm.add_constant(test[list(data.HAR)].to_numpy()))
    np.testing.assert_allclose(fit.test_mse, np.mean((test["y"].to_numpy() - pred) ** 2), rtol=1e-10)


def test_gradient_matches_central_differences():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(256, 3)), rng.normal(size=(256, 1))
    kernel, bias = rng.normal(size=(3, 1)), rng.normal(size=(1,))
    g_kernel, g_bias = reference.mse_gradient(x, y, kernel, bias)
    h = 1e-6
    fd = np.zeros(4)
    for i in range(4):
        step = np.zeros(4)
        step[i] = h
        up = reference.mse(x, y, kernel + step[:3, None], bias + step[3:])
        down = reference.mse(x, y, kernel - step[:3, None], bias - step[3:])
        fd[i] = (up - down) / (2 * h)
    assert reference.relative_error(np.r_[g_kernel[:, 0], g_bias], fd) < FD_RTOL


def test_fixed_batch_is_reproducible(har):
    a = reference.fixed_batch(har.x_train, har.y_train, seed=0)
    b = reference.fixed_batch(har.x_train, har.y_train, seed=0)
    assert a[0].shape == (256, 3) and a[2][0].shape == (3, 1) and a[2][1].shape == (1,)
    for u, v in zip([a[0], a[1], *a[2]], [b[0], b[1], *b[2]]):
        np.testing.assert_array_equal(u, v)
