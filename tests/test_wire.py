"""The one wire format: its byte count by hand, its round trip, its packed codes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from diloco_lite.wire import WireFormat, from_bytes, to_bytes


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


# --------------------------------------------------------------------------------------------
# Against a plain numpy reference of the format (module docstring of `wire`)
# --------------------------------------------------------------------------------------------


def reference_quantize(x, bits):
    """Symmetric absmax per row (last axis; a vector or scalar is one row), in float64:
    s = max|x| / q_max, q = round(x / s) (0 for an all-zero row). The wire computes s in
    float32 (XLA may divide by q_max as a multiply: within an ulp), hence the tolerances."""
    x = np.asarray(x, np.float64)
    rows = x.reshape(-1, x.shape[-1]) if x.ndim >= 2 else x.reshape(1, -1)
    q_max = 2 ** (bits - 1) - 1
    scale = np.abs(rows).max(axis=1, keepdims=True) / q_max
    codes = np.zeros(rows.shape, np.int64)
    for r in range(rows.shape[0]):
        if scale[r, 0] > 0:
            codes[r] = np.round(rows[r] / scale[r, 0])
    return codes, scale


def reference_pack(codes, bits):
    """Offset codes u = q + q_max, `8 // bits` a byte, the first in the lowest bits; a row that
    does not fill its last byte is padded with raw zero bits."""
    per, q_max = 8 // bits, 2 ** (bits - 1) - 1
    rows, n = codes.shape
    out = np.zeros((rows, -(-n // per)), np.uint8)
    for r in range(rows):
        for i in range(n):
            out[r, i // per] |= (int(codes[r, i]) + q_max) << (bits * (i % per))
    return out


def reference_bfloat16_bits(x):
    """float32 -> bfloat16 bits by round to nearest, ties to even (finite values)."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


HAND = np.array([[1.4, -0.84, 0.28, 0.0, -1.26],  # max 1.4: x/max = 1, -.6, .2, 0, -.9
                 [0.0, 0.0, 0.0, 0.0, 0.0],  # all zero: scale 0, codes 0
                 [-2.0, 0.5, 1.1, -0.3, 0.0]], np.float32)  # max 2: -1, .25, .55, -.15, 0
HAND_CODES = {  # round(x / max · q_max), by hand
    8: [[127, -76, 25, 0, -114], [0] * 5, [-127, 32, 70, -19, 0]],  # 76.2, 25.4, 114.3 ...
    4: [[7, -4, 1, 0, -6], [0] * 5, [-7, 2, 4, -1, 0]],  # 4.2, 1.4, 6.3; 1.75, 3.85, 1.05
    2: [[1, -1, 0, 0, -1], [0] * 5, [-1, 0, 1, 0, 0]],  # .6, .2, .9; .25, .55, .15
}


def unpacked_codes(payload, bits, n):
    """The signed codes of a payload, read back by hand from its bytes."""
    raw = np.asarray(payload["codes"])
    if bits == 8:
        return raw.astype(np.int64)
    per, q_max = 8 // bits, 2 ** (bits - 1) - 1
    u = [(raw >> (bits * k)) & (2 ** bits - 1) for k in range(per)]
    return np.stack(u, axis=-1).reshape(raw.shape[0], -1)[:, :n].astype(np.int64) - q_max


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_codes_of_a_small_array_by_hand(bits):
    payload = WireFormat(bits).encode(jnp.asarray(HAND))
    np.testing.assert_array_equal(unpacked_codes(payload, bits, 5), HAND_CODES[bits])
    q_max = 2 ** (bits - 1) - 1
    want_scales = np.array([[1.4], [0.0], [2.0]]) / q_max
    np.testing.assert_allclose(payload["scales"], want_scales, rtol=1e-6)
    np.testing.assert_allclose(WireFormat(bits).decode(payload, HAND.shape),
                               np.asarray(HAND_CODES[bits]) * want_scales, rtol=1e-6)
    codes, scales = reference_quantize(HAND, bits)  # the reference agrees with the hand
    np.testing.assert_array_equal(codes, HAND_CODES[bits])


def test_sixteen_bit_codes_by_hand():
    """bfloat16 bits: 1 = 0x3F80, −2 = 0xC000; 1 + 2⁻⁸ is a tie (0x3F80_8000) and rounds to
    the even 0x3F80, 1 + 3·2⁻⁸ (0x3F81_8000) to the even 0x3F82."""
    x = np.array([1.0, -2.0, 0.0, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8], np.float32)
    codes = np.asarray(WireFormat(16).encode(jnp.asarray(x))["codes"])
    np.testing.assert_array_equal(codes, [0x3F80, 0xC000, 0x0000, 0x3F80, 0x3F82])
    np.testing.assert_array_equal(reference_bfloat16_bits(x), codes)


@pytest.mark.parametrize("shape", [(6, 7), (5, 8), (3, 2, 9), (13,), (1, 1)])
@pytest.mark.parametrize("bits", [32, 16, 8, 4, 2])
def test_payload_and_decoded_values_match_the_numpy_reference(bits, shape):
    """Every format against the reference above: the bytes on the wire (codes, packed, and
    scales) and the values the receiver decodes, over rows of different magnitudes."""
    rng = np.random.default_rng(bits * 100 + len(shape))
    x = (rng.standard_normal(shape) * rng.uniform(0.01, 100.0, shape[:-1] + (1,))).astype(
        np.float32)
    wire = WireFormat(bits)
    payload = wire.encode(jnp.asarray(x))
    got = np.asarray(wire.decode(payload, shape))
    if bits == 32:
        np.testing.assert_array_equal(payload["codes"], x)
        np.testing.assert_array_equal(got, x)
        return
    if bits == 16:
        want = reference_bfloat16_bits(x)
        np.testing.assert_array_equal(payload["codes"], want)
        decoded = (want.astype(np.uint32) << 16).view(np.float32)  # bf16 bits -> float32
        np.testing.assert_array_equal(got, decoded)
        return
    codes, scales = reference_quantize(x, bits)
    np.testing.assert_allclose(payload["scales"], scales, rtol=1e-6)
    want_bytes = codes.astype(np.int8) if bits == 8 else reference_pack(codes, bits)
    np.testing.assert_array_equal(payload["codes"], want_bytes)
    assert payload["codes"].dtype == want_bytes.dtype
    np.testing.assert_allclose(got, (codes * scales).reshape(shape), rtol=1e-6)


def test_payloads_packed_into_one_byte_buffer_come_back_bit_for_bit():
    """Three learners' 4-bit payloads of two tensors (uint8 codes, fp32 scales) and a 16-bit one:
    the buffer holds each learner's bytes end to end (checked by hand for the first leaf), and
    unpacking gives every leaf back exactly, dtype and shape included."""
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(3, 5, 6)).astype(np.float32), rng.normal(size=(3, 7)).astype(np.float32)]
    tree = [jax.vmap(WireFormat(4).encode)(jnp.asarray(x)) for x in xs]
    tree.append(jax.vmap(WireFormat(16).encode)(jnp.asarray(xs[1])))
    buf = to_bytes(tree)
    leaves = jax.tree.leaves(tree)
    assert buf.dtype == jnp.uint8 and buf.shape == (3, sum(x[0].nbytes for x in leaves))
    first = np.asarray(leaves[0][1]).view(np.uint8).ravel()  # learner 1's first leaf, raw bytes
    np.testing.assert_array_equal(np.asarray(buf[1, :first.size]), first)
    back = from_bytes(buf, tree)
    for got, want in zip(jax.tree.leaves(back), leaves, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # all learners gathered from one learner's template: the leading axis comes from the buffer
    one = jax.tree.map(lambda a: a[:1], tree)
    again = from_bytes(buf, one)
    assert jax.tree.leaves(again)[0].shape == leaves[0].shape
