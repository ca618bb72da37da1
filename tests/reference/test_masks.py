import numpy as np
import pytest

from attnlab.reference.masks import causal_mask, combine, hide_mask, padding_mask, window_mask
from attnlab.reference.attention import attention


def test_causal_square_is_lower_triangular():
    np.testing.assert_array_equal(causal_mask(4), np.tril(np.ones((4, 4), bool)))


def test_causal_more_queries_than_keys_leaves_early_rows_empty():
    # Tq = 4 > Tk = 2: queries sit at positions -2, -1, 0, 1; the first two see nothing
    np.testing.assert_array_equal(causal_mask(4, 2), [[0, 0], [0, 0], [1, 0], [1, 1]])


def test_window_mask_causal_and_symmetric():
    np.testing.assert_array_equal(
        window_mask(4, left=1), [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    )
    sym = window_mask(5, left=1, right=1)
    assert (sym == sym.T).all() and sym.sum() == 13


def test_padding_mask_shapes_and_content():
    m = padding_mask([2, 3], 4)
    assert m.shape == (2, 1, 4)
    np.testing.assert_array_equal(m[:, 0], [[1, 1, 0, 0], [1, 1, 1, 0]])
    assert padding_mask([1], 3, heads=True).shape == (1, 1, 1, 3)


def test_padding_never_leaks_into_the_output():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 2))
    out = attention(q, k, v, mask=padding_mask([3, 5], 5))
    np.testing.assert_allclose(out[0], attention(q[0], k[0, :3], v[0, :3]))


def test_hide_mask_hides_keys_for_every_query():
    m = hide_mask(5, [1, 3], tq=2)
    np.testing.assert_array_equal(m, [[1, 0, 1, 0, 1]] * 2)


def test_combine_is_logical_and_and_ignores_none():
    c = combine(causal_mask(3), None, hide_mask(3, [0]))
    np.testing.assert_array_equal(c, [[0, 0, 0], [0, 1, 0], [0, 1, 1]])
    assert combine(None, None) is None


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: causal_mask(0), ValueError, r"tq must be >= 1, got 0"),
        (lambda: causal_mask(2.5), TypeError, r"tq must be an int, got float"),
        (lambda: window_mask(3, left=-1), ValueError, r"left must be an int >= 0, got -1"),
        (lambda: padding_mask([5], 4), ValueError, r"lengths must lie in 0..t=4, got \[5\]"),
        (lambda: padding_mask([1.5], 4), TypeError, r"lengths must be a 1-D sequence of ints"),
        (lambda: hide_mask(3, [3]), ValueError, r"positions must lie in 0..tk-1=2, got \[3\]"),
        (lambda: combine(np.ones(3)), TypeError, r"masks must have dtype bool"),
    ],
)
def test_mask_errors_are_named(call, error, message):
    with pytest.raises(error, match=message):
        call()
