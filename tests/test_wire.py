"""The one wire format: its byte count by hand, its round trip, its packed codes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from diloco_lite.wire import WireFormat


@pytest.mark.parametrize("bits, shape, nbytes", [
    (32, (5, 7), 5 * 7 * 4),
    (16, (5, 7), 5 * 7 * 2),  # bfloat16, no scale
    (8, (5, 7), 5 * 7 + 5 * 4),  # int8 codes + one fp32 scale per row
    (4, (5, 7), 5 * 4 + 5 * 4),  # 7 codes -> 4 bytes a row (the last half byte is padding)
    (4, (5, 8), 5 * 4 + 5 * 4),
    (2, (5, 7), 5 * 2 + 5 * 4),  # four codes a byte: 7 -> 2 bytes a row
    (4, (9,), 5 + 4),  # a vector is one row
    (8, (), 1 + 4),  # a scalar too
    (4, (2, 3, 6), 6 * 3 + 6 * 4),  # leading axes are rows
])
def test_bytes_by_hand_and_as_encoded(bits, shape, nbytes):
    wire = WireFormat(bits)
    assert wire.nbytes(shape) == nbytes
    payload = wire.encode(jnp.ones(shape))
    assert sum(a.nbytes for a in jax.tree.leaves(payload)) == nbytes


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_round_trip_error_is_at_most_half_a_step_per_row(bits):
    x = jax.random.normal(jax.random.key(0), (16, 33)) * jnp.arange(1.0, 17.0)[:, None]
    q_max = 2 ** (bits - 1) - 1
    step = np.max(np.abs(np.asarray(x)), axis=1, keepdims=True) / q_max
    got = np.asarray(WireFormat(bits).round_trip(x))
    assert np.all(np.abs(got - np.asarray(x)) <= step / 2 + 1e-6)
    levels = np.unique(np.round(got / step))  # every value is one of 2·q_max + 1 levels
    assert set(levels) <= set(range(-q_max, q_max + 1))
    assert np.max(np.abs(got), axis=1) == pytest.approx(np.max(np.abs(np.asarray(x)), axis=1))


def test_sixteen_bits_are_bfloat16_and_thirty_two_are_exact():
    x = jax.random.normal(jax.random.key(1), (4, 5))
    np.testing.assert_array_equal(WireFormat(32).round_trip(x), x)
    np.testing.assert_array_equal(WireFormat(16).round_trip(x),
                                  x.astype(jnp.bfloat16).astype(jnp.float32))
    assert WireFormat(16).encode(x)["codes"].dtype == jnp.uint16  # XLA cannot widen it
    assert set(WireFormat(16).encode(x)) == {"codes"}


def test_four_bit_codes_are_packed_two_a_byte_low_nibble_first():
    x = jnp.array([[7.0, -7.0, 1.0], [0.0, 0.0, 0.0]])  # scale 1 in row 0; row 1 all zeros
    payload = WireFormat(4).encode(x)
    u = np.array([[7 + 7, -7 + 7, 1 + 7, 0], [7, 7, 7, 0]])  # offset by q_max; a raw 0 pads
    packed = u[:, 0::2] | (u[:, 1::2] << 4)
    np.testing.assert_array_equal(payload["codes"], packed.astype(np.uint8))
    np.testing.assert_array_equal(payload["scales"], [[1.0], [0.0]])
    np.testing.assert_array_equal(WireFormat(4).decode(payload, x.shape), x)


def test_bad_bits_are_a_clear_error():
    with pytest.raises(ValueError, match=r"bits=3 .*one of \(32, 16, 8, 4, 2\)"):
        WireFormat(3)
