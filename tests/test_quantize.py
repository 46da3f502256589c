"""FP8 quantize / dequantize (MXFP8 and blockwise) against a NumPy statement of the rules written here
from the OCP MX v1.0 / OFP8 specs and DeepSeek-V3's recipe, independent of the C++ (no shared code: FP8
values come from the format definitions and rounding is a nearest-value search with ties to the even code),
plus the cuBLASLt / Transformer Engine swizzled-scale interop. Fresh random inputs; never zeros only."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st

import jax_moe_ffi as jmf
from jax_moe_ffi import reference as ref

FORMATS = {  # from the OFP8 spec: mantissa bits, exponent bias, emax_elem, largest finite
    "e4m3": dict(man=3, bias=7, emax=8, max=448.0, maxcode=0x7E, dtype=ml_dtypes.float8_e4m3fn),
    "e5m2": dict(man=2, bias=15, emax=15, max=57344.0, maxcode=0x7B, dtype=ml_dtypes.float8_e5m2),
}
IN_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


# ------------------------------------------------------------------------------ NumPy spec model
def fp8_values(fmt):
    """Positive finite values of codes 0..maxcode, from the format definition (sign 0)."""
    f = FORMATS[fmt]
    out = []
    for code in range(f["maxcode"] + 1):
        e, m = code >> f["man"], code & ((1 << f["man"]) - 1)
        if e == 0:
            out.append(m * 2.0 ** (1 - f["bias"] - f["man"]))
        else:
            out.append((1 + m / 2 ** f["man"]) * 2.0 ** (e - f["bias"]))
    return np.array(out, np.float64)


def np_round_fp8(v, fmt):
    """uint8 codes of float64 values v: nearest representable, ties to the even code, saturating at the
    largest finite value, NaN -> 0x7F (with the sign bit of v)."""
    f = FORMATS[fmt]
    table = fp8_values(fmt)
    v = np.asarray(v, np.float64)
    a = np.abs(np.nan_to_num(v, nan=0.0))
    idx = np.clip(np.searchsorted(table, a, side="right") - 1, 0, f["maxcode"])
    top = idx >= f["maxcode"]
    nxt = np.minimum(idx + 1, f["maxcode"])
    dlo, dhi = a - table[idx], table[nxt] - a
    code = np.where(dlo < dhi, idx, np.where(dhi < dlo, nxt, np.where(idx % 2 == 0, idx, nxt)))
    code = np.where(top, f["maxcode"], code)
    code = np.where(np.isnan(v), 0x7F, code)
    return (code | (np.signbit(v).astype(np.int64) << 7)).astype(np.uint8)


def _blocks(x64, axis, b):
    """x moved so `axis` is last, padded with zeros to a multiple of b, as [..., nb, b]; and n."""
    xm = np.moveaxis(x64, axis, -1)
    n = xm.shape[-1]
    nb = -(-n // b)
    xp = np.concatenate([xm, np.zeros(xm.shape[:-1] + (nb * b - n,))], axis=-1)
    return xp.reshape(xm.shape[:-1] + (nb, b)), n


def _unblock(codes, n, axis, shape_moved):
    return np.moveaxis(codes.reshape(shape_moved[:-1] + (-1,))[..., :n], -1, axis)


def np_mxfp8(x, fmt="e4m3", axis=-1):
    """OCP MX v1.0 MXFP8 of x along `axis`: (codes uint8, E8M0 scale uint8)."""
    f = FORMATS[fmt]
    x64 = np.asarray(x).astype(np.float64)
    blk, n = _blocks(x64, axis, 32)
    special = np.isnan(blk).any(-1) | np.isinf(blk).any(-1)
    amax = np.max(np.abs(np.where(np.isfinite(blk), blk, 0.0)), axis=-1)
    _, e = np.frexp(amax)  # amax = m * 2^e, m in [0.5, 1): floor(log2(amax)) = e - 1
    se = np.where(amax == 0, -127, np.clip(e - 1 - f["emax"], -127, 127))
    scale = np.where(special, 255, se + 127).astype(np.uint8)
    codes = np_round_fp8(np.where(special[..., None], 0.0, blk) / 2.0 ** se[..., None], fmt)
    codes = np.where(special[..., None], 0x7F, codes).astype(np.uint8)
    return _unblock(codes, n, axis, np.moveaxis(x64, axis, -1).shape), np.moveaxis(scale, -1, axis)


def _np_block_scale(amax32, fmt, pow2):
    """Blockwise scales (float32) of block maxima (float32), zero / non-finite blocks handled by the caller."""
    f = FORMATS[fmt]
    if pow2:  # the smallest 2^k with amax <= max * 2^k, k in [-126, 127]
        a = amax32.astype(np.float64)
        with np.errstate(divide="ignore"):
            k = np.floor(np.log2(np.where(a > 0, a, 1.0) / f["max"])).astype(np.int64) - 2
        for _ in range(6):
            k = np.where(a > f["max"] * np.exp2(k.astype(np.float64)), k + 1, k)
        return np.exp2(np.clip(k, -126, 127).astype(np.float64)).astype(np.float32)
    with np.errstate(under="ignore"):
        s = amax32 / np.float32(f["max"])  # IEEE float32 division
    return np.maximum(s, np.float32(2.0 ** -126))


def np_blockwise(x, fmt="e4m3", axis=-1, block=(1, 128), pow2=False):
    """DeepSeek-V3 blockwise FP8: (codes uint8, float32 scale)."""
    x32 = np.asarray(x).astype(np.float32)
    if block[0] == 1:
        xm = np.moveaxis(x32, axis, -1)
        n = xm.shape[-1]
        nb = -(-n // 128)
        blk = np.concatenate([xm, np.zeros(xm.shape[:-1] + (nb * 128 - n,), np.float32)], -1)
        blk = blk.reshape(xm.shape[:-1] + (nb, 128))
        red = (-1,)
    else:
        r, n = x32.shape[-2:]
        nbr, nbc = -(-r // 128), -(-n // 128)
        pad = np.zeros(x32.shape[:-2] + (nbr * 128, nbc * 128), np.float32)
        pad[..., :r, :n] = x32
        blk = pad.reshape(x32.shape[:-2] + (nbr, 128, nbc, 128))
        red = (-3, -1)
    special = (~np.isfinite(blk)).any(axis=red, keepdims=True)
    amax = np.max(np.abs(np.where(np.isfinite(blk), blk, 0)), axis=red, keepdims=True)
    zero = (amax == 0) & ~special
    s = _np_block_scale(amax, fmt, pow2)
    s = np.where(zero, np.float32(1), s)
    with np.errstate(all="ignore"):
        q = (blk / s) if not pow2 else (blk.astype(np.float64) / s.astype(np.float64))
    codes = np_round_fp8(np.where(special, 0.0, q), fmt)
    codes = np.where(special, 0x7F, codes).astype(np.uint8)
    s = np.where(special, np.float32(np.nan), s).astype(np.float32)
    if block[0] == 1:
        codes = np.moveaxis(codes.reshape(xm.shape[:-1] + (-1,))[..., :n], -1, axis)
        scale = np.moveaxis(s[..., 0], -1, axis)
    else:
        codes = codes.reshape(x32.shape[:-2] + (nbr * 128, nbc * 128))[..., :r, :n]
        scale = s[..., :, 0, :, 0]
    return codes, scale


def codes_of(q):
    return np.asarray(q.data).view(np.uint8)


def assert_codes_equal(got, want, x=None):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    bad = np.argwhere(got != want)
    if len(bad):
        i = tuple(bad[0])
        extra = f", x={np.asarray(x)[i]!r}" if x is not None and np.asarray(x).shape == got.shape else ""
        raise AssertionError(f"{len(bad)} codes differ, first at {i}: got {got[i]:#04x} want {want[i]:#04x}{extra}")


def random_x(rng, shape, dtype="float32", spread=30, specials=0.0):
    """Normal values with per-row magnitudes 2^[-spread, spread] (varied block scales), optional specials."""
    if dtype == "float16":  # keep inside float16's range (specials come only from `specials`)
        spread = min(spread, 12)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread + 1, shape[:-1] + (1,)))
    if specials:
        u = rng.random(shape)
        x = np.where(u < specials / 3, np.nan, x)
        x = np.where((u >= specials / 3) & (u < 2 * specials / 3), np.inf * np.sign(rng.standard_normal(shape)), x)
        x = np.where((u >= 2 * specials / 3) & (u < specials), 0.0, x)
    return x.astype(IN_DTYPES[dtype])


# ------------------------------------------------------------------------------ the model itself
def test_fp8_value_tables_match_ml_dtypes():
    """The spec-derived value tables agree with ml_dtypes' decoding of every code."""
    for fmt, f in FORMATS.items():
        codes = np.arange(f["maxcode"] + 1, dtype=np.uint8)
        dec = codes.view(f["dtype"]).astype(np.float64)
        np.testing.assert_array_equal(dec, fp8_values(fmt))
    assert fp8_values("e4m3")[-1] == 448 and fp8_values("e4m3")[1] == 2.0 ** -9
    assert fp8_values("e5m2")[-1] == 57344 and fp8_values("e5m2")[1] == 2.0 ** -16


def test_numpy_is_ieee():
    """The blockwise model divides in NumPy float32, which must keep subnormals (XLA:CPU flushes them)."""
    assert np.float32(2.0 ** -140) / np.float32(2.0) == np.float32(2.0 ** -141) != 0


# ------------------------------------------------------------------------ mxfp8 against the model
@given(rows=st.integers(1, 6), cols=st.integers(1, 200), dtype=st.sampled_from(list(IN_DTYPES)),
       fmt=st.sampled_from(["e4m3", "e5m2"]), axis=st.sampled_from([-1, -2, 0]), seed=st.integers(0, 2**31 - 1),
       specials=st.sampled_from([0.0, 0.05]))
def test_mxfp8_matches_spec(rows, cols, dtype, fmt, axis, seed, specials):
    rng = np.random.default_rng(seed)
    shape = (rows, cols) if axis != 0 else (cols, rows)
    x = random_x(rng, shape, dtype, specials=specials)
    q = jmf.quantize(x, "mxfp8", axis=axis, dtype=fmt)
    want_codes, want_scale = np_mxfp8(x, fmt, axis)
    assert q.data.dtype == jnp.dtype(FORMATS[fmt]["dtype"]) and q.scale.dtype == jnp.uint8
    np.testing.assert_array_equal(np.asarray(q.scale), want_scale)
    assert_codes_equal(codes_of(q), want_codes, x)


def test_mxfp8_scale_choice():
    """X = 2^(floor(log2 amax) - 8) for E4M3, 2^(... - 15) for E5M2, clamped to [-127, 127]."""
    rng = np.random.default_rng(1)
    amaxes = np.array([1.0, 1.99, 2.0, 448.0, 500.0, 2.0 ** -100, 2.0 ** 100, 3e38, 2.0 ** -126, 1e-40], np.float32)
    x = (rng.uniform(-0.5, 0.5, (len(amaxes), 32)) * amaxes[:, None]).astype(np.float32)
    x[:, 7] = -amaxes  # the block maximum, negative
    q = jmf.quantize(x, "mxfp8")
    flog2 = np.array([0, 0, 1, 8, 8, -100, 100, 127, -126, -133])
    np.testing.assert_array_equal(np.asarray(q.scale)[:, 0], np.clip(flog2 - 8, -127, 127) + 127)
    q5 = jmf.quantize(x, "mxfp8", dtype="e5m2")
    np.testing.assert_array_equal(np.asarray(q5.scale)[:, 0], np.clip(flog2 - 15, -127, 127) + 127)
    # amax = 448 -> X = 1: the maximum is exactly representable; 500 -> X = 1 too, 500 saturates to 448
    d = np.asarray(q.data).astype(np.float32)
    assert d[3, 7] == -448 and d[4, 7] == -448


def test_mxfp8_round_half_even():
    """Midpoints between neighbouring FP8 values round to the even code (X = 1 via a 256 in the block)."""
    for fmt, ties, want in [
        ("e4m3", [1.0625, 1.1875, 17.0, 19.0, 2.0 ** -10, 3 * 2.0 ** -10, 5 * 2.0 ** -10, 15 * 2.0 ** -10, 1.09375],
         [1.0, 1.25, 16.0, 20.0, 0.0, 2.0 ** -8, 2 * 2.0 ** -9, 2.0 ** -6, 1.125]),
        ("e5m2", [1.125, 1.375, 2.0 ** -17, 3 * 2.0 ** -17, 7 * 2.0 ** -17, 40.0],
         [1.0, 1.5, 0.0, 2.0 ** -15, 4 * 2.0 ** -16, 40.0]),
    ]:
        big = 256.0 if fmt == "e4m3" else 32768.0
        x = np.zeros((2, 32), np.float32)
        x[:, 0] = big
        x[0, 1:1 + len(ties)] = ties
        x[1, 1:1 + len(ties)] = -np.array(ties)
        x[:, 20:] = np.random.default_rng(2).uniform(-1, 1, (2, 12))
        q = jmf.quantize(x, "mxfp8", dtype=fmt)
        assert np.all(np.asarray(q.scale) == 127)
        d = np.asarray(q.data).astype(np.float64)
        np.testing.assert_array_equal(d[0, 1:1 + len(ties)], want)
        np.testing.assert_array_equal(d[1, 1:1 + len(ties)], -np.array(want))
        assert_codes_equal(codes_of(q), np_mxfp8(x, fmt)[0])


def test_mxfp8_saturation():
    """x / X beyond the largest finite value saturates (the floor scale rule makes this reachable)."""
    x = np.random.default_rng(3).uniform(-100, 100, (2, 64)).astype(np.float32)
    x[0, :4] = [511.0, -480.0, 464.0, 449.0]  # X = 1: all beyond 448 (464 is the tie that would round to 480)
    x[1, :3] = [65535.0, -61440.0, 57345.0]
    q = jmf.quantize(x, "mxfp8")
    np.testing.assert_array_equal(np.asarray(q.data).astype(np.float32)[0, :4], [448, -448, 448, 448])
    q5 = jmf.quantize(x, "mxfp8", dtype="e5m2")
    d5 = np.asarray(q5.data).astype(np.float32)
    np.testing.assert_array_equal(d5[1, :3] * 2.0 ** (int(np.asarray(q5.scale)[1, 0]) - 127), [57344, -57344, 57344])
    assert np.all(np.isfinite(d5))  # E5M2 has Inf, but saturation never produces it
    assert_codes_equal(codes_of(q5), np_mxfp8(x, "e5m2")[0])


def test_mxfp8_zero_nan_inf_blocks():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 96)).astype(np.float32)
    x[0, 32:64] = 0.0
    x[0, 40] = -0.0
    x[1, 5] = np.nan
    x[2, 70] = -np.inf
    x[3, 0:32] = np.inf
    q = jmf.quantize(x, "mxfp8")
    s = np.asarray(q.scale)
    assert s[0, 1] == 0  # all-zero block: the smallest scale 2^-127
    assert np.all(codes_of(q)[0, 32:64] == np.where(np.signbit(x[0, 32:64]), 0x80, 0))
    assert s[1, 0] == 255 and s[2, 2] == 255 and s[3, 0] == 255
    assert np.all(codes_of(q)[1, :32] == 0x7F) and np.all(codes_of(q)[2, 64:] == 0x7F)
    for r, b in [(0, 0), (0, 2), (1, 1), (1, 2), (2, 0), (2, 1), (3, 1)]:  # neighbours unaffected
        assert s[r, b] not in (0, 255)
    deq = np.asarray(jmf.dequantize(q))
    assert np.all(np.isnan(deq[1, :32])) and np.all(np.isnan(deq[2, 64:])) and np.all(np.isfinite(deq[1, 32:]))
    np.testing.assert_array_equal(s, np_mxfp8(x)[1])
    assert_codes_equal(codes_of(q), np_mxfp8(x)[0])


def test_mxfp8_subnormals():
    """E4M3 subnormals down to 2^-9 (E5M2: 2^-16), float32 subnormal inputs, the -127 clamp."""
    x = np.zeros((3, 32), np.float32)
    x[0, 0] = 256.0  # X = 1
    x[0, 1:8] = np.arange(1, 8) * 2.0 ** -9  # exactly the E4M3 subnormals
    x[0, 8] = 0.4 * 2.0 ** -9  # rounds to 0
    x[0, 9] = 0.6 * 2.0 ** -9  # rounds to 2^-9
    x[1, :4] = [2.0 ** -130, -3 * 2.0 ** -136, 2.0 ** -140, 1e-45]  # float32 subnormals: X clamped to 2^-127
    x[2, :3] = [1e-39, 2.0 ** -149, 5e-40]
    q = jmf.quantize(x, "mxfp8")
    assert list(np.asarray(q.scale)[:, 0]) == [127, 0, 0]
    d = np.asarray(q.data).astype(np.float64)
    np.testing.assert_array_equal(d[0, 1:10], list(np.arange(1, 8) * 2.0 ** -9) + [0.0, 2.0 ** -9])
    np.testing.assert_array_equal(d[1, :3], [2.0 ** -3, -3 * 2.0 ** -9, 0.0])  # 2^-140 * 2^127 < 2^-10: 0
    for fmt in ("e4m3", "e5m2"):
        want_codes, want_scale = np_mxfp8(x, fmt)
        qq = jmf.quantize(x, "mxfp8", dtype=fmt)
        np.testing.assert_array_equal(np.asarray(qq.scale), want_scale)
        assert_codes_equal(codes_of(qq), want_codes, x)


def test_mxfp8_partial_blocks_and_axis_minus2():
    rng = np.random.default_rng(5)
    for shape in [(3, 1), (2, 31), (2, 33), (1, 95), (4, 129)]:
        x = random_x(rng, shape, "bfloat16")
        q = jmf.quantize(x, "mxfp8")
        assert q.scale.shape == shape[:-1] + (-(-shape[-1] // 32),)
        assert_codes_equal(codes_of(q), np_mxfp8(x)[0])
        xt = np.ascontiguousarray(x.T)
        qt = jmf.quantize(xt, "mxfp8", axis=-2)  # columnwise: blocks run down the columns
        assert qt.axis == -2 and qt.scale.shape == (-(-shape[-1] // 32),) + shape[:-1]
        assert_codes_equal(codes_of(qt), codes_of(q).T)
        np.testing.assert_array_equal(np.asarray(qt.scale), np.asarray(q.scale).T)
    x3 = random_x(rng, (2, 40, 3, 5), "float16")
    for axis in (0, 1, 2, -1, -3):
        q = jmf.quantize(x3, "mxfp8", axis=axis)
        wc, ws = np_mxfp8(x3, "e4m3", axis)
        np.testing.assert_array_equal(np.asarray(q.scale), ws)
        assert_codes_equal(codes_of(q), wc)


COLWISE_CASES = [("mxfp8", {}), ("mxfp8", {"dtype": "e5m2"}), ("blockwise", {}), ("blockwise", {"pow2_scale": True}),
                 ("blockwise", {"dtype": "e5m2"})]


def _np_model(x, recipe, axis, kw):
    fmt = kw.get("dtype", "e4m3")
    if recipe == "mxfp8":
        return np_mxfp8(x, fmt, axis)
    return np_blockwise(x, fmt, axis, kw.get("block", (1, 128)), kw.get("pow2_scale", False))


@pytest.mark.parametrize("dtype", list(IN_DTYPES))
@pytest.mark.parametrize("recipe,kw", COLWISE_CASES)
def test_colwise_native_matches_spec(recipe, kw, dtype):
    """axis=-2 runs the kernels' native colwise path (blocks down the rows, no transpose in the HLO): odd row
    counts (partial 32 / 128-row blocks), column counts not a multiple of 8, a batch, specials and tiny blocks."""
    rng = np.random.default_rng(15)
    for shape in [(70, 13), (129, 24), (1, 9), (2, 300, 37), (3, 33, 8)]:
        x = random_x(rng, shape, dtype, specials=0.01)
        x.reshape(-1)[:40] = (x.reshape(-1)[:40].astype(np.float32) * np.float32(2.0 ** -130)).astype(x.dtype)
        q = jmf.quantize(x, recipe, axis=-2, **kw)
        want_codes, want_scale = _np_model(x, recipe, -2, kw)
        b = 32 if recipe == "mxfp8" else 128
        assert q.axis == -2 and q.scale.shape == shape[:-2] + (-(-shape[-2] // b), shape[-1])
        np.testing.assert_array_equal(np.asarray(q.scale), want_scale)
        assert_codes_equal(codes_of(q), want_codes, x)
    hlo = jax.jit(lambda a: jmf.quantize(a, recipe, axis=-2, **kw)).lower(x).as_text()
    assert "transpose" not in hlo, "axis=-2 should need no transpose"


# ---------------------------------------------------------------------- blockwise against the model
@given(shape=st.sampled_from([(1, 1), (3, 128), (2, 129), (5, 300), (130, 200), (2, 129, 131), (256, 64)]),
       dtype=st.sampled_from(list(IN_DTYPES)), fmt=st.sampled_from(["e4m3", "e5m2"]),
       block=st.sampled_from([(1, 128), (128, 128)]), axis=st.sampled_from([-1, -2]),
       pow2=st.booleans(), seed=st.integers(0, 2**31 - 1), specials=st.sampled_from([0.0, 0.02]))
def test_blockwise_matches_spec(shape, dtype, fmt, block, axis, pow2, seed, specials):
    if len(shape) < 2 and axis == -2:
        axis = -1
    rng = np.random.default_rng(seed)
    x = random_x(rng, shape, dtype, specials=specials)
    q = jmf.quantize(x, "blockwise", axis=axis, dtype=fmt, block=block, pow2_scale=pow2)
    want_codes, want_scale = np_blockwise(x, fmt, axis, block, pow2)
    assert q.scale.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(q.scale), want_scale)
    assert_codes_equal(codes_of(q), want_codes, x)


def test_blockwise_scales_and_special_blocks():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    x[0, :128] = 0.0
    x[1, 3] = np.nan
    x[2, 200] = np.inf
    x[3, :128] *= 2.0 ** -125  # a tiny block: amax / 448 would be subnormal -> scale 2^-126
    q = jmf.quantize(x, "blockwise")
    s = np.asarray(q.scale)
    assert s[0, 0] == 1.0 and np.all(codes_of(q)[0, :128] == 0)
    assert np.isnan(s[1, 0]) and np.isnan(s[2, 1]) and np.all(codes_of(q)[1, :128] == 0x7F)
    assert s[3, 0] == np.float32(2.0 ** -126)
    amax = np.abs(x[0, 128:]).max()
    assert s[0, 1] == np.float32(amax) / np.float32(448)
    d = np.asarray(q.data).astype(np.float32)
    assert np.abs(d[0, 128:]).max() == 448  # the block maximum maps to +-448 (up to float32 rounding)
    qp = jmf.quantize(x, "blockwise", pow2_scale=True)
    sp = np.asarray(qp.scale)
    ok = np.isfinite(sp) & (sp != 1.0)
    assert np.all(np.log2(sp[ok]) == np.round(np.log2(sp[ok])))  # powers of two
    assert np.nanmax(np.abs(np.asarray(qp.data).astype(np.float32))) <= 448
    wc, ws = np_blockwise(x)
    np.testing.assert_array_equal(s, ws)
    assert_codes_equal(codes_of(q), wc)


def test_blockwise_subnormal_inputs_divide_exactly():
    """Tiny blocks divide float32 subnormals exactly (the CPU kernel clears XLA's FTZ/DAZ)."""
    x = np.zeros((2, 128), np.float32)
    x[0, :6] = [2.0 ** -120, 3e-39, -1e-40, 7e-42, 2.0 ** -130, 1.5e-38]
    x[1, :3] = [2.0 ** -140, -2.0 ** -141, 2.0 ** -143]
    for pow2 in (False, True):
        q = jmf.quantize(x, "blockwise", pow2_scale=pow2)
        wc, ws = np_blockwise(x, pow2=pow2)
        np.testing.assert_array_equal(np.asarray(q.scale), ws)
        assert_codes_equal(codes_of(q), wc, x)
        assert np.count_nonzero(codes_of(q)[0]) >= 4


def test_blockwise_128x128_batched_weights():
    rng = np.random.default_rng(7)
    w = random_x(rng, (3, 200, 130), "bfloat16")  # stacked experts [G, K, N]
    q = jmf.quantize(w, "blockwise", block=(128, 128), axis=-2)
    assert q.scale.shape == (3, 2, 2) and q.block == (128, 128) and q.axis == -2
    for g in range(3):
        wc, ws = np_blockwise(w[g], block=(128, 128))
        np.testing.assert_array_equal(np.asarray(q.scale[g]), ws)
        assert_codes_equal(codes_of(q)[g], wc)


# ------------------------------------------------------------------------------- dequantize accuracy
@pytest.mark.parametrize("recipe,block,fmt", [("mxfp8", None, "e4m3"), ("mxfp8", None, "e5m2"),
                                              ("blockwise", None, "e4m3"), ("blockwise", (128, 128), "e4m3"),
                                              ("blockwise", None, "e5m2")])
def test_dequantize_error_bound(recipe, block, fmt):
    """|dequantize(quantize(x)) - x| <= 2^-3 * amax of the block (RNE half-ulp, or the floor-scale saturation)."""
    rng = np.random.default_rng(8)
    x = random_x(rng, (64, 384), "float32", spread=20)
    q = jmf.quantize(x, recipe, dtype=fmt, block=block)
    y = np.asarray(jmf.dequantize(q), np.float64)
    b = 32 if recipe == "mxfp8" else 128
    if block == (128, 128):
        blocks_x = x.reshape(1, 64, 3, 128).transpose(0, 2, 1, 3).reshape(3, -1)
        blocks_e = (y - x).reshape(1, 64, 3, 128).transpose(0, 2, 1, 3).reshape(3, -1)
    else:
        blocks_x, blocks_e = x.reshape(-1, b), (y - x).reshape(-1, b)
    amax = np.abs(blocks_x).max(-1)
    rel = np.abs(blocks_e).max(-1) / amax
    assert np.all(rel <= 2.0 ** -3), rel.max()
    assert rel.max() > 0  # it is lossy: the check can fail


@pytest.mark.parametrize("recipe,block", [("mxfp8", None), ("blockwise", None), ("blockwise", (128, 128))])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fp8_similarity_random_normal(recipe, block, dtype):
    x = np.random.default_rng().standard_normal((256, 512)).astype(IN_DTYPES[dtype])
    q = jmf.quantize(x, recipe, block=block)
    y = np.asarray(jmf.dequantize(q), np.float64)
    xx = x.astype(np.float64)
    metric = 1 - 2 * np.sum(xx * y) / (np.sum(xx * xx) + np.sum(y * y))
    assert 0 < metric < 1e-3, metric
    yb = jmf.dequantize(q, jnp.bfloat16)
    assert yb.dtype == jnp.bfloat16 and yb.shape == x.shape


# -------------------------------------------------------------------------- transforms and pytree
def test_jit_vmap_pytree():
    rng = np.random.default_rng(9)
    x = random_x(rng, (3, 5, 70), "bfloat16")
    for recipe, kw in [("mxfp8", {}), ("blockwise", {}), ("blockwise", {"block": (128, 128)})]:
        eager = jmf.quantize(x, recipe, **kw)
        jitted = jax.jit(lambda a: jmf.quantize(a, recipe, **kw))(x)
        assert_codes_equal(codes_of(jitted), codes_of(eager))
        np.testing.assert_array_equal(np.asarray(jitted.scale), np.asarray(eager.scale))
        for axis in ([-1, -2] if recipe == "mxfp8" else [-1]):
            vm = jax.vmap(lambda a: jmf.quantize(a, recipe, axis=axis, **kw))(x)
            for i in range(x.shape[0]):
                one = jmf.quantize(x[i], recipe, axis=axis, **kw)
                assert_codes_equal(codes_of(vm)[i], codes_of(one))
                np.testing.assert_array_equal(np.asarray(vm.scale)[i], np.asarray(one.scale))
    q = jmf.quantize(x, "mxfp8", axis=1)
    leaves, tree = jax.tree.flatten(q)
    assert len(leaves) == 2 and leaves[0].dtype == jnp.float8_e4m3fn and leaves[1].dtype == jnp.uint8
    back = jax.jit(lambda qq: qq)(q)  # a QuantizedArray crosses jit boundaries
    assert isinstance(back, jmf.QuantizedArray) and back.axis == -2 and back.recipe == "mxfp8"
    np.testing.assert_array_equal(np.asarray(jax.jit(jmf.dequantize)(q)), np.asarray(jmf.dequantize(q)))


def test_not_differentiable():
    x = jnp.asarray(np.random.default_rng(10).standard_normal((4, 64)), jnp.float32)
    with pytest.raises(TypeError, match="not differentiable"):
        jax.grad(lambda a: jmf.dequantize(jmf.quantize(a, "mxfp8")).sum())(x)
    with pytest.raises(TypeError, match="not differentiable"):
        jax.jvp(lambda a: jmf.quantize(a, "blockwise").scale, (x,), (x,))
    # stop_gradient is the documented way to quantise inside a differentiated function
    g = jax.grad(lambda a: (a * jmf.dequantize(jmf.quantize(jax.lax.stop_gradient(a), "mxfp8"))).sum())(x)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(jmf.dequantize(jmf.quantize(x, "mxfp8"))))


def test_reference_matches_ffi():
    """The pure-JAX reference (the GPU fallback) gives the same bits as the FFI kernels."""
    rng = np.random.default_rng(11)
    x = random_x(rng, (6, 300), "float32", specials=0.02)
    for recipe, kw in [("mxfp8", {}), ("mxfp8", {"dtype": "e5m2", "axis": 0}), ("blockwise", {}),
                       ("blockwise", {"pow2_scale": True}), ("blockwise", {"block": (128, 128), "dtype": "e5m2"})]:
        a = jmf.quantize(x, recipe, **kw)
        b = jax.jit(lambda v: ref.quantize_reference(v, recipe, **kw))(x)
        assert_codes_equal(codes_of(b), codes_of(a))
        np.testing.assert_array_equal(np.asarray(b.scale), np.asarray(a.scale))


def test_bad_inputs():
    x = jnp.ones((4, 64), jnp.float32) * jnp.arange(64, dtype=jnp.float32)
    with pytest.raises(TypeError, match="`x`"):
        jmf.quantize(jnp.arange(64), "mxfp8")
    with pytest.raises(ValueError, match="`x`"):
        jmf.quantize(jnp.float32(3.0), "mxfp8")
    with pytest.raises(ValueError, match="`x`"):
        jmf.quantize(jnp.ones((64,)), "blockwise", block=(128, 128))
    with pytest.raises(ValueError, match="`recipe`"):
        jmf.quantize(x, "nvfp4")
    with pytest.raises(ValueError, match="`axis`"):
        jmf.quantize(x, "mxfp8", axis=2)
    with pytest.raises(TypeError, match="`axis`"):
        jmf.quantize(x, "mxfp8", axis=1.5)
    with pytest.raises(ValueError, match="`axis`"):
        jmf.quantize(jnp.ones((2, 4, 8)), "blockwise", block=(128, 128), axis=0)
    with pytest.raises(TypeError, match="`dtype`"):
        jmf.quantize(x, "mxfp8", dtype="e3m4")
    with pytest.raises(TypeError, match="`dtype`"):
        jmf.quantize(x, "mxfp8", dtype=jnp.int8)
    with pytest.raises(ValueError, match="`block`"):
        jmf.quantize(x, "mxfp8", block=16)
    with pytest.raises(ValueError, match="`block`"):
        jmf.quantize(x, "blockwise", block=(64, 64))
    with pytest.raises(TypeError, match="`q`"):
        jmf.dequantize(x)
    with pytest.raises(TypeError, match="`dtype`"):
        jmf.dequantize(jmf.quantize(x, "mxfp8"), jnp.int32)
    q = jmf.quantize(x, "mxfp8", dtype=jnp.float8_e5m2)  # dtypes are accepted too
    assert q.data.dtype == jnp.float8_e5m2 and q.fmt == "e5m2"


# ------------------------------------------------------------------------------- swizzled scales
def swizzle_offset(r, c, scale_cols):
    """NVIDIA's 1D block scaling factor layout (cuBLAS docs; nvmath get_block_scale_offset): 128 x 4 tiles,
    row-tile major, 512 bytes each; inside a tile (r % 32) * 16 + (r % 128 // 32) * 4 + c % 4."""
    tiles_per_row = -(-scale_cols // 4)
    return (r // 128 * tiles_per_row + c // 4) * 512 + (r % 32) * 16 + (r % 128 // 32) * 4 + c % 4


def test_swizzle_documented_examples():
    """nvmath-python's worked example: a 128-row operand with 8 blocks per row (NVFP4 K=128 there, MXFP8
    K=256 here -- only the block size differs): (row 5, block 2) -> 82, (row 5, block 5) -> 593."""
    assert swizzle_offset(5, 2, 8) == 82 and swizzle_offset(5, 5, 8) == 593
    x = np.random.default_rng(12).standard_normal((128, 256)).astype(np.float32)
    x *= np.exp2(np.arange(128) % 40 - 20)[:, None] * np.exp2(np.arange(256) // 32)[None, :]
    q = jmf.quantize(x, "mxfp8")
    sw = np.asarray(jmf.to_swizzled_scales(q))
    assert sw.shape == (128, 8) and sw.dtype == np.uint8
    flat = sw.reshape(-1)
    s = np.asarray(q.scale)
    assert flat[82] == s[5, 2] and flat[593] == s[5, 5]
    assert flat[0] == s[0, 0] and flat[1] == s[0, 1] and flat[4] == s[32, 0] and flat[16] == s[1, 0]
    assert flat[512] == s[0, 4]


@pytest.mark.parametrize("shape,axis", [((300, 100), -1), ((130, 33), -1), ((2, 129, 200), -1),
                                        ((200, 70), -2), ((3, 40, 260), -2), ((1, 32), -1)])
def test_swizzle_layout_and_round_trip(shape, axis):
    rng = np.random.default_rng(13)
    x = random_x(rng, shape, "bfloat16", spread=40)
    q = jmf.quantize(x, "mxfp8", axis=axis)
    sw = np.asarray(jmf.to_swizzled_scales(q))
    s = np.asarray(q.scale)
    mat = s if axis == -1 else np.swapaxes(s, -1, -2)  # [..., rows, K/32]
    rows, kb = mat.shape[-2:]
    rp, kp = -(-rows // 128) * 128, -(-kb // 4) * 4
    assert sw.shape == mat.shape[:-2] + (rp, kp)
    flat = sw.reshape(mat.shape[:-2] + (-1,))
    rr, cc = np.meshgrid(np.arange(rows), np.arange(kb), indexing="ij")
    off = swizzle_offset(rr, cc, kb)
    np.testing.assert_array_equal(np.take(flat, off.reshape(-1), axis=-1).reshape(mat.shape), mat)
    mask = np.ones(rp * kp, bool)
    mask[off.reshape(-1)] = False
    assert np.all(flat[..., mask] == 0)  # padding entries
    back = jmf.from_swizzled_scales(q.data, sw, axis=axis)
    np.testing.assert_array_equal(np.asarray(back.scale), s)
    assert back.axis == q.axis and back.recipe == "mxfp8"
    np.testing.assert_array_equal(np.asarray(jmf.dequantize(back)), np.asarray(jmf.dequantize(q)))
    flat_in = jnp.asarray(flat)  # a flat buffer, as cuBLASLt holds it
    if hasattr(jnp, "float8_e8m0fnu"):
        flat_in = jax.lax.bitcast_convert_type(flat_in, jnp.float8_e8m0fnu)
    np.testing.assert_array_equal(np.asarray(jmf.from_swizzled_scales(q.data, flat_in, axis=axis).scale), s)


def test_swizzle_bad_inputs():
    x = jnp.asarray(np.random.default_rng(14).standard_normal((4, 64)), jnp.float32)
    with pytest.raises(ValueError, match="`q`"):
        jmf.to_swizzled_scales(jmf.quantize(x, "blockwise"))
    q = jmf.quantize(x, "mxfp8")
    with pytest.raises(ValueError, match="`swizzled_scales`"):
        jmf.from_swizzled_scales(q.data, jnp.zeros((4, 2), jnp.uint8))
    with pytest.raises(TypeError, match="`data`"):
        jmf.from_swizzled_scales(x, jmf.to_swizzled_scales(q))
    with pytest.raises(TypeError, match="`swizzled_scales`"):
        jmf.from_swizzled_scales(q.data, jnp.zeros((128, 4), jnp.int32))


# ------------------------------------------------------------------ 128x128 tiles, written transposed
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 300), st.integers(1, 300)),
       dtype=st.sampled_from(list(IN_DTYPES)), fmt=st.sampled_from(["e4m3", "e5m2"]), pow2=st.booleans(),
       plain=st.booleans(), seed=st.integers(0, 2 ** 31 - 1))
def test_tiles_transposed_matches_the_model_and_quantize_of_the_transpose(shape, dtype, fmt, pow2, plain, seed):
    """quantize_tiles_transposed(x) gives the NumPy model's 128x128 codes of x, transposed, and exactly what
    quantize(swapaxes(x)) gives; with plain=True also the untransposed quantisation (odd sizes, specials)."""
    rng = np.random.default_rng(seed)
    x = random_x(rng, shape, dtype, spread=20, specials=0.02)
    if shape[0] == 1:
        x = x[0]  # rank 2 too
    kw = {"block": (128, 128), "dtype": fmt, "pow2_scale": pow2}
    qt, q = jmf.quantize_tiles_transposed(x, dtype=fmt, pow2_scale=pow2, plain=plain)
    want_codes, want_scale = _np_model(x, "blockwise", -1, kw)
    assert_codes_equal(codes_of(qt), np.swapaxes(want_codes, -1, -2))
    np.testing.assert_array_equal(np.asarray(qt.scale), np.swapaxes(want_scale, -1, -2))
    ref_t = jmf.quantize(jnp.swapaxes(jnp.asarray(x), -1, -2), "blockwise", **kw)
    assert_codes_equal(codes_of(qt), codes_of(ref_t))
    np.testing.assert_array_equal(np.asarray(qt.scale), np.asarray(ref_t.scale))
    assert qt.data.dtype == ref_t.data.dtype and (qt.axis, qt.block) == (ref_t.axis, ref_t.block)
    if plain:
        assert_codes_equal(codes_of(q), want_codes)
        np.testing.assert_array_equal(np.asarray(q.scale), want_scale)
    else:
        assert q is None


@pytest.mark.parametrize("shape", [(0, 128), (3, 0, 5), (2, 7, 0)])
@pytest.mark.parametrize("plain", [False, True])
def test_tiles_transposed_empty(shape, plain):
    qt, q = jmf.quantize_tiles_transposed(jnp.zeros(shape, jnp.bfloat16), plain=plain)
    assert qt.data.shape == shape[:-2] + (shape[-1], shape[-2]) and (q is not None) == plain
    if plain:
        assert q.data.shape == shape


def test_tiles_transposed_errors():
    with pytest.raises(ValueError, match="rank >= 2"):
        jmf.quantize_tiles_transposed(jnp.ones((128,)))
    with pytest.raises(TypeError, match="`x`"):
        jmf.quantize_tiles_transposed(jnp.ones((128, 128), jnp.int32))
    with pytest.raises(TypeError, match="pow2_scale"):
        jmf.quantize_tiles_transposed(jnp.ones((128, 128)), pow2_scale=1)
    with pytest.raises(TypeError, match="not differentiable"):
        jax.grad(lambda a: jnp.sum(jmf.quantize_tiles_transposed(a)[0].scale))(jnp.ones((128, 128)))


# --------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("dtype", list(IN_DTYPES))
def test_gpu_matches_cpu_bitwise(dtype):
    """CUDA and CPU kernels give identical bits (aligned / unaligned rows, partial blocks, specials, tiny blocks),
    along axis -1 and natively along axis -2 (rows not a multiple of 32 / 128, columns not a multiple of 8)."""
    from jax_moe_ffi import _registry

    assert "jax_moe_ffi_quantize_mxfp8" in _registry.cuda_targets, _registry.cuda_load_error
    assert "jax_moe_ffi_quantize_blockwise" in _registry.cuda_targets
    cpu, gpu = jax.devices("cpu")[0], jax.devices("gpu")[0]
    rng = np.random.default_rng()
    for shape in [(64, 256), (33, 7168), (5, 37), (3, 257, 130), (1, 8), (300, 1000), (129, 77), (2, 161, 264),
                  (1000, 24), (40, 3, 200)]:
        x = random_x(rng, shape, dtype, spread=60, specials=0.01)
        x.reshape(-1)[:64] = (x.reshape(-1)[:64].astype(np.float32) * np.float32(2.0 ** -135)).astype(x.dtype)
        for recipe, kw in [("mxfp8", {}), ("mxfp8", {"dtype": "e5m2"}), ("mxfp8", {"axis": -2}),
                           ("mxfp8", {"axis": -2, "dtype": "e5m2"}), ("mxfp8", {"axis": 0}),
                           ("blockwise", {}), ("blockwise", {"pow2_scale": True}), ("blockwise", {"dtype": "e5m2"}),
                           ("blockwise", {"axis": -2}), ("blockwise", {"axis": -2, "pow2_scale": True}),
                           ("blockwise", {"axis": -2, "dtype": "e5m2"}),
                           ("blockwise", {"block": (128, 128)}), ("blockwise", {"block": (128, 128),
                                                                                "pow2_scale": True})]:
            qc = jmf.quantize(jax.device_put(x, cpu), recipe, **kw)
            qg = jmf.quantize(jax.device_put(x, gpu), recipe, **kw)
            assert_codes_equal(codes_of(qg), codes_of(qc))
            np.testing.assert_array_equal(np.asarray(qg.scale), np.asarray(qc.scale))
            if kw.get("axis", -1) in (-1, -2) and x.size <= 100_000:
                want_codes, want_scale = _np_model(x, recipe, kw.get("axis", -1), kw)
                assert_codes_equal(codes_of(qg), want_codes)
                np.testing.assert_array_equal(np.asarray(qg.scale), want_scale)


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("dtype", list(IN_DTYPES))
def test_gpu_tiles_transposed_matches_cpu_bitwise(dtype):
    """The CUDA tile kernel's transposed store (8 x 8 byte blocks; 8-byte stores when R % 8 == 0, bytes
    otherwise) gives the CPU's bits, plain and transposed, on odd shapes with specials; (40, 300, 520) has more tiles
    than the H200 holds CTAs at once, so each CTA walks several tiles, across batch entries."""
    from jax_moe_ffi import _registry

    assert "jax_moe_ffi_quantize_tiles_t" in _registry.cuda_targets, _registry.cuda_load_error
    cpu, gpu = jax.devices("cpu")[0], jax.devices("gpu")[0]
    rng = np.random.default_rng()
    for shape in [(256, 256), (3, 2048, 768), (129, 77), (2, 161, 264), (5, 37), (1, 8), (300, 1000), (8, 136),
                  (40, 300, 520)]:
        x = random_x(rng, shape, dtype, spread=40, specials=0.01)
        for kw in [{}, {"pow2_scale": True}, {"dtype": "e5m2"}]:
            for plain in (False, True):
                tc, pc = jmf.quantize_tiles_transposed(jax.device_put(x, cpu), plain=plain, **kw)
                tg, pg = jax.jit(lambda a: jmf.quantize_tiles_transposed(a, plain=plain, **kw))(
                    jax.device_put(x, gpu))
                assert_codes_equal(codes_of(tg), codes_of(tc))
                np.testing.assert_array_equal(np.asarray(tg.scale), np.asarray(tc.scale))
                if plain:
                    assert_codes_equal(codes_of(pg), codes_of(pc))


def _f32_sweep(rng, n):
    """float32 bit patterns whose exponents sit within 2^-24 of their 32-element block's maximum, so every
    FP8 rounding case (normal, subnormal, zero, saturation) occurs; a quarter are exact rounding ties."""
    e_blk = rng.integers(1, 255, (n // 32, 1))
    e = np.clip(e_blk - rng.integers(0, 25, (n // 32, 32)), 0, 254).astype(np.uint32)
    man = rng.integers(0, 1 << 23, (n // 32, 32), dtype=np.uint32)
    tie = (man & 0x7F0000) | np.where(rng.random(man.shape) < 0.5, 1 << 19, 1 << 20)  # e4m3 / e5m2 midpoints
    man = np.where(rng.random(man.shape) < 0.25, tie, man).astype(np.uint32)
    bits = (rng.integers(0, 2, man.shape, dtype=np.uint32) << 31) | (e << 23) | man
    return bits.reshape(-1).view(np.float32)


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs an NVIDIA GPU")
def test_gpu_matches_cpu_bit_patterns():
    """The GPU encodes with the hardware FP8 conversion, the CPU with integer code: every bfloat16 and float16
    bit pattern (sorted, so blocks hold neighbours of their maximum, and shuffled), and 2^22 float32 patterns
    near their block maxima with many exact ties, give the same bits in every recipe, rowwise and colwise."""
    cpu, gpu = jax.devices("cpu")[0], jax.devices("gpu")[0]
    rng = np.random.default_rng(16)
    inputs = []
    for dt in (ml_dtypes.bfloat16, np.float16):
        pats = np.arange(1 << 16, dtype=np.uint16).view(dt)
        inputs += [pats.reshape(2048, 32), rng.permutation(pats).reshape(256, 256)]
    f32 = _f32_sweep(rng, 1 << 22)
    inputs += [f32.reshape(-1, 1024), np.ascontiguousarray(f32.reshape(-1, 32).T)]
    for x in inputs:
        for recipe, kw in [("mxfp8", {}), ("mxfp8", {"dtype": "e5m2"}), ("blockwise", {}),
                           ("blockwise", {"pow2_scale": True}), ("blockwise", {"dtype": "e5m2"}),
                           ("blockwise", {"block": (128, 128)})]:
            for axis in ([-1, -2] if "block" not in kw else [-1]):
                qc = jmf.quantize(jax.device_put(x, cpu), recipe, axis=axis, **kw)
                qg = jmf.quantize(jax.device_put(x, gpu), recipe, axis=axis, **kw)
                assert_codes_equal(codes_of(qg), codes_of(qc), x)
                np.testing.assert_array_equal(np.asarray(qg.scale), np.asarray(qc.scale))


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs an NVIDIA GPU")
def test_gpu_large_and_similarity():
    x = jax.random.normal(jax.random.key(0), (8192, 7168), jnp.bfloat16)
    for recipe, kw in [("mxfp8", {}), ("blockwise", {}), ("blockwise", {"block": (128, 128)})]:
        q = jax.jit(lambda a: jmf.quantize(a, recipe, **kw))(x)
        y = jmf.dequantize(q).astype(jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
        xf = x.astype(y.dtype)
        metric = 1 - 2 * jnp.sum(xf * y) / (jnp.sum(xf * xf) + jnp.sum(y * y))
        assert 0 < float(metric) < 1e-3
        ref_codes, ref_scale = (np_mxfp8 if recipe == "mxfp8" else
                                lambda a: np_blockwise(a, block=kw.get("block", (1, 128))))(np.asarray(x[:256]))
        assert_codes_equal(codes_of(q)[:256], ref_codes)
        np.testing.assert_array_equal(np.asarray(q.scale)[: ref_scale.shape[0]], ref_scale)
