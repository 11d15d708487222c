"""`keras_side.swap`: a function swapped while blocks run, the blocks nested, overlapping (as two threads' would) and
ended by an error, and what the first block found always coming back."""
import types

import pytest

from keras_side import swap


def original():
    return "original"


def ours():
    return "ours"


def test_a_block_swaps_the_function_and_its_end_gives_it_back_after_an_error_too():
    owner = types.SimpleNamespace(f=original)
    with swap.swapped(owner, "f", ours):
        assert owner.f is ours and swap.before(owner, "f") is original
    assert owner.f is original and swap.before(owner, "f") is original
    with pytest.raises(RuntimeError), swap.swapped(owner, "f", ours):
        raise RuntimeError
    assert owner.f is original


def test_blocks_that_end_out_of_order_keep_the_swap_until_the_last_one_ends():
    """Two threads' blocks: the first to open ends first, the other still inside. A block that put back what it
    found would give the original back too early, then leave `ours` behind for good."""
    owner = types.SimpleNamespace(f=original)
    first, second = swap.swapped(owner, "f", ours), swap.swapped(owner, "f", ours)
    first.__enter__()
    second.__enter__()
    assert swap.before(owner, "f") is original  # not the first block's `ours`
    first.__exit__(None, None, None)
    assert owner.f is ours
    second.__exit__(None, None, None)
    assert owner.f is original


def test_each_attribute_is_swapped_on_its_own():
    a, b = types.SimpleNamespace(f=original), types.SimpleNamespace(f=original, g=original)
    with swap.swapped(a, "f", ours), swap.swapped(b, "g", ours):
        assert (a.f, b.f, b.g) == (ours, original, ours)
    assert (a.f, b.f, b.g) == (original, original, original)


def test_another_replacement_while_a_block_is_open_is_an_error():
    owner = types.SimpleNamespace(f=original)
    with swap.swapped(owner, "f", ours):
        with pytest.raises(RuntimeError, match="f is swapped for ours already"), swap.swapped(owner, "f", original):
            pass
        assert owner.f is ours
    assert owner.f is original
