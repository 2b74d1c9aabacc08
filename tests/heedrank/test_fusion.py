"""The normalisation pieces of heedrank/fusion.py: z-score, min-max, reciprocal ranks, RRF,
the sigmoid and the standardised weights, on numpy and torch, against hand-computed values."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from heedrank.fusion import (
    EPS,
    RRF_K,
    fuse,
    minmax,
    reciprocal_ranks,
    rrf,
    sigmoid,
    standardize,
    standardize_list,
    standardized_weights,
)


def test_standardize_is_the_population_z_score() -> None:
    xs = [3.0, 1.0, 2.0, 6.0]
    mu, sd = statistics.fmean(xs), statistics.pstdev(xs)
    assert standardize(np.array(xs)).tolist() == pytest.approx([(x - mu) / sd for x in xs])
    assert standardize_list(xs) == pytest.approx([(x - mu) / sd for x in xs])
    cols = np.array([[1.0, 5.0], [3.0, 5.0]])  # second column constant
    assert standardize(cols).tolist() == [[-1.0, 0.0], [1.0, 0.0]]


def test_constant_slices_give_zeros_and_ones() -> None:
    flat = np.array([0.1, 0.1, 0.1])  # its float64 std is ~1e-17, not 0: under EPS
    assert 0.0 < float(np.sqrt(np.mean((flat - flat.mean()) ** 2))) <= EPS
    assert standardize(flat).tolist() == pytest.approx([0.0, 0.0, 0.0], abs=1e-15)  # x - mean, not / 1e-17
    assert minmax(flat).tolist() == [1.0, 1.0, 1.0]
    assert standardize_list([4.0]) == [0.0] and standardize_list([]) == []


def test_minmax_maps_into_the_unit_interval() -> None:
    assert minmax(np.array([10.0, 5.0, 0.0])).tolist() == [1.0, 0.5, 0.0]
    assert minmax(np.array([[0.0, 2.0], [4.0, 2.0]])).tolist() == [[0.0, 1.0], [1.0, 1.0]]


def test_rrf_and_reciprocal_ranks() -> None:
    assert RRF_K == 60
    assert rrf(1) == 1.0 / 61 and rrf(3, k=0) == 1.0 / 3
    assert rrf(np.arange(1, 4)).tolist() == [1.0 / 61, 1.0 / 62, 1.0 / 63]
    assert reciprocal_ranks(4) == [1.0, 0.5, 1.0 / 3, 0.25]
    assert reciprocal_ranks(0) == []


@pytest.mark.parametrize("x", [-800.0, -3.0, 0.0, 2.5, 800.0])
def test_sigmoid_is_the_logistic_function_without_overflow(x: float) -> None:
    want = 0.0 if x < -700 else 1.0 if x > 700 else 1.0 / (1.0 + math.exp(-x))
    assert sigmoid(x) == pytest.approx(want, abs=1e-15)
    assert sigmoid(x) + sigmoid(-x) == pytest.approx(1.0)


def test_standardized_weights_carry_a_linear_map_to_raw_features() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(7, 3))
    x[:, 1] = 2.0  # a constant column weighs 0
    w = np.array([0.5, 9.0, -1.5])
    raw = standardized_weights(x, w)
    assert raw[1] == 0.0
    on_z, on_raw = standardize(x) @ w, x @ raw
    assert np.allclose(on_z - on_z.mean(), on_raw - on_raw.mean())


def test_fuse_weighs_the_two_z_scores() -> None:
    first, rer = np.array([3.0, 2.0, 1.0]), np.array([0.1, 0.1, 0.7])
    assert np.allclose(fuse(first, rer, 0.25), 0.25 * standardize(first) + 0.75 * standardize(rer))


def test_torch_matches_numpy() -> None:
    torch = pytest.importorskip("torch")
    x = np.array([[1.0, 4.0, 4.0], [2.0, 0.5, 4.0], [7.0, 1.0, 4.0]])
    w = np.array([1.0, -2.0, 3.0])
    t, tw = torch.tensor(x, dtype=torch.float64), torch.tensor(w, dtype=torch.float64)
    assert np.allclose(standardize(t).numpy(), standardize(x))
    assert np.allclose(minmax(t).numpy(), minmax(x))
    assert np.allclose(standardized_weights(t, tw).numpy(), standardized_weights(x, w))
    assert np.allclose(rrf(torch.arange(1, 4)).numpy(), rrf(np.arange(1, 4)))


def test_sigmoid_of_an_array_is_elementwise_and_finite() -> None:
    from heedrank.fusion import sigmoid

    x = np.array([[-800.0, -1.0], [0.0, 800.0]])
    got = sigmoid(x)
    assert got.shape == (2, 2) and np.isfinite(got).all()
    assert got.ravel().tolist() == pytest.approx([0.0, sigmoid(-1.0), 0.5, 1.0], abs=1e-15)


def test_a_standardizer_keeps_its_training_statistics() -> None:
    from heedrank.fusion import Standardizer, standardize

    x = np.array([[1.0, 5.0], [3.0, 5.0], [5.0, 5.0]])
    st = Standardizer.fit(x)
    assert st.mean.tolist() == [3.0, 5.0] and st.std.tolist() == pytest.approx([np.sqrt(8 / 3), 1.0])
    assert st(x) == pytest.approx(standardize(x))  # on its own data: the z-score, a constant column 0
    assert st(np.array([[3.0, 6.0]])).tolist() == [[0.0, 1.0]]  # other data: the training statistics
    w = Standardizer.fit(np.array([[0.0], [10.0]]), weights=np.array([3.0, 1.0]))
    assert w.mean.tolist() == [2.5] and w.std.tolist() == pytest.approx([np.sqrt(18.75)])
