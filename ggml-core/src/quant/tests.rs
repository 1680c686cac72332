//! Unit tests of the byte-level API: lengths, errors, alignment, round trips.

use super::*;
use crate::dtype::ALL_DTYPES;

const MAX_N: usize = 4 * QK_K;

/// A deterministic, varied test row.
fn row(n: usize) -> [f32; MAX_N] {
    let mut x = [0.0f32; MAX_N];
    let mut s = 0x1234_5678u32;
    for v in x.iter_mut().take(n) {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        *v = (s as f32 / u32::MAX as f32 - 0.5) * 6.0;
    }
    x
}

/// Worst absolute error bound (relative to the row's largest magnitude) of a round trip.
fn tolerance(dtype: DType) -> f32 {
    match dtype {
        DType::F32 => 0.0,
        DType::F16 => 1e-3,
        DType::BF16 => 8e-3,
        DType::Q8_0 | DType::Q8_1 | DType::Q8K => 1e-2,
        DType::Q6K => 2.5e-2,
        DType::Q5_1 | DType::Q5K => 5e-2,
        DType::Q5_0 => 0.1,
        DType::Q4_1 | DType::Q4K => 0.1,
        // values of the other sign than the largest one only reach 7/8 of it
        DType::Q4_0 => 0.2,
        DType::Q3K => 0.25,
        DType::Q2K => 0.4,
        DType::I32 => f32::INFINITY,
    }
}

#[test]
fn round_trip_error_bounds_all_dtypes() {
    let n = 2 * QK_K;
    let x = row(n);
    let amax = x[..n].iter().fold(0.0f32, |a, v| a.max(fabs(*v)));
    for dtype in ALL_DTYPES {
        if dtype == DType::I32 {
            continue;
        }
        let mut bytes = [0u8; MAX_N * 4];
        let nbytes = dtype.row_size(n).unwrap();
        quantize_row(dtype, &x[..n], &mut bytes[..nbytes]).unwrap();
        let mut y = [0.0f32; MAX_N];
        dequantize_row(dtype, &bytes[..nbytes], &mut y[..n]).unwrap();
        let err = x[..n]
            .iter()
            .zip(&y[..n])
            .fold(0.0f32, |e, (a, b)| e.max(fabs(a - b)));
        assert!(
            err <= tolerance(dtype) * amax,
            "{dtype}: error {err} (amax {amax})"
        );
    }
}

fn fabs(v: f32) -> f32 {
    f32::from_bits(v.to_bits() & 0x7FFF_FFFF)
}

#[test]
fn i32_is_unsupported() {
    let mut b = [0u8; 4];
    let mut y = [0.0f32; 1];
    assert_eq!(
        quantize_row(DType::I32, &[1.0], &mut b),
        Err(QuantError::Unsupported { dtype: DType::I32 })
    );
    assert_eq!(
        dequantize_row(DType::I32, &b, &mut y),
        Err(QuantError::Unsupported { dtype: DType::I32 })
    );
}

#[test]
fn bad_lengths_are_errors() {
    let x = row(64);
    let mut bytes = [0u8; 1024];
    let mut y = [0.0f32; 600];

    // Not a multiple of the block size.
    assert_eq!(
        quantize_row(DType::Q4_0, &x[..33], &mut bytes[..18]),
        Err(QuantError::NotBlockMultiple {
            dtype: DType::Q4_0,
            len: 33
        })
    );
    assert_eq!(
        dequantize_row(DType::Q6K, &bytes[..210], &mut y[..255]),
        Err(QuantError::NotBlockMultiple {
            dtype: DType::Q6K,
            len: 255
        })
    );
    // Destination / source of the wrong size.
    assert_eq!(
        quantize_row(DType::Q8_0, &x[..64], &mut bytes[..67]),
        Err(QuantError::SizeMismatch {
            dtype: DType::Q8_0,
            what: "destination bytes",
            expected: 68,
            actual: 67
        })
    );
    assert_eq!(
        dequantize_row(DType::Q2K, &bytes[..85], &mut y[..256]),
        Err(QuantError::SizeMismatch {
            dtype: DType::Q2K,
            what: "source bytes",
            expected: 84,
            actual: 85
        })
    );
    assert_eq!(
        quantize_row(DType::F16, &x[..3], &mut bytes[..8]),
        Err(QuantError::SizeMismatch {
            dtype: DType::F16,
            what: "destination bytes",
            expected: 6,
            actual: 8
        })
    );
    assert_eq!(
        dequantize_row(DType::F32, &bytes[..7], &mut y[..2]),
        Err(QuantError::SizeMismatch {
            dtype: DType::F32,
            what: "source bytes",
            expected: 8,
            actual: 7
        })
    );

    // Typed rows.
    let mut blocks = [BlockQ8_1::zeroed(); 3];
    assert_eq!(
        quantize_row_q8_1(&x[..64], &mut blocks),
        Err(QuantError::SizeMismatch {
            dtype: DType::Q8_1,
            what: "destination blocks",
            expected: 2,
            actual: 3
        })
    );
    assert_eq!(
        quantize_row_q8_1(&x[..40], &mut blocks[..1]),
        Err(QuantError::NotBlockMultiple {
            dtype: DType::Q8_1,
            len: 40
        })
    );
    assert_eq!(
        dequantize_row_q8_1(&blocks[..1], &mut y[..64]),
        Err(QuantError::SizeMismatch {
            dtype: DType::Q8_1,
            what: "source blocks",
            expected: 2,
            actual: 1
        })
    );
    let mut kb = [BlockQ8K::zeroed(); 1];
    assert!(quantize_row_q8_k(&x[..32], &mut kb).is_err());
    assert!(quantize_row_q8_k(&y[..256], &mut kb).is_ok());

    // Empty rows are fine.
    for dtype in ALL_DTYPES {
        if dtype != DType::I32 {
            assert_eq!(quantize_row(dtype, &[], &mut []), Ok(()));
            assert_eq!(dequantize_row(dtype, &[], &mut []), Ok(()));
        }
    }
}

#[test]
fn errors_display() {
    use core::fmt::Write;
    struct Buf {
        b: [u8; 128],
        n: usize,
    }
    impl Write for Buf {
        fn write_str(&mut self, s: &str) -> core::fmt::Result {
            let end = self.n + s.len();
            self.b
                .get_mut(self.n..end)
                .ok_or(core::fmt::Error)?
                .copy_from_slice(s.as_bytes());
            self.n = end;
            Ok(())
        }
    }
    let cases = [
        (
            QuantError::Unsupported { dtype: DType::I32 },
            "i32: no conversion to or from f32",
        ),
        (
            QuantError::NotBlockMultiple {
                dtype: DType::Q4K,
                len: 300,
            },
            "q4_K: row of 300 values is not a multiple of the block size 256",
        ),
        (
            QuantError::SizeMismatch {
                dtype: DType::Q8_0,
                what: "destination bytes",
                expected: 68,
                actual: 67,
            },
            "q8_0: destination bytes: got 67, expected 68",
        ),
    ];
    for (e, want) in cases {
        let mut buf = Buf { b: [0; 128], n: 0 };
        write!(buf, "{e}").unwrap();
        assert_eq!(core::str::from_utf8(&buf.b[..buf.n]).unwrap(), want);
    }
}

/// The byte API gives the same bytes whether or not the buffers are aligned for the block
/// type, and the same as the typed API.
#[test]
fn unaligned_buffers() {
    let n = 2 * QK_K;
    let x = row(n);
    for dtype in ALL_DTYPES {
        if dtype == DType::I32 {
            continue;
        }
        let nbytes = dtype.row_size(n).unwrap();
        // Backing store aligned to 8, then offset by 0 and by 1 byte.
        let mut store_a = [0u64; MAX_N / 2];
        let mut store_b = [0u64; MAX_N / 2];
        let a: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut store_a)[..nbytes];
        let b: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut store_b)[1..1 + nbytes];
        quantize_row(dtype, &x[..n], a).unwrap();
        quantize_row(dtype, &x[..n], b).unwrap();
        assert_eq!(a, b, "{dtype}");
        let mut ya = [0.0f32; MAX_N];
        let mut yb = [0.0f32; MAX_N];
        dequantize_row(dtype, a, &mut ya[..n]).unwrap();
        dequantize_row(dtype, b, &mut yb[..n]).unwrap();
        for i in 0..n {
            assert_eq!(ya[i].to_bits(), yb[i].to_bits(), "{dtype} [{i}]");
        }
    }
    // Typed == bytes for one type of each family.
    let mut q = [BlockQ4K::zeroed(); 2];
    quantize_row_q4_k(&x[..n], &mut q).unwrap();
    let mut bytes = [0u8; 288];
    quantize_row(DType::Q4K, &x[..n], &mut bytes).unwrap();
    assert_eq!(bytemuck::cast_slice::<BlockQ4K, u8>(&q), &bytes[..]);
    let mut q = [BlockQ5_1::zeroed(); 16];
    quantize_row_q5_1(&x[..n], &mut q).unwrap();
    let mut bytes = [0u8; 384];
    quantize_row(DType::Q5_1, &x[..n], &mut bytes).unwrap();
    assert_eq!(bytemuck::cast_slice::<BlockQ5_1, u8>(&q), &bytes[..]);
}

#[test]
fn trait_constants() {
    fn check<B: QuantBlock>() {
        assert_eq!(B::BLOCK_SIZE, B::DTYPE.block_size());
        assert_eq!(size_of::<B>(), B::DTYPE.type_size());
    }
    check::<BlockQ4_0>();
    check::<BlockQ4_1>();
    check::<BlockQ5_0>();
    check::<BlockQ5_1>();
    check::<BlockQ8_0>();
    check::<BlockQ8_1>();
    check::<BlockQ2K>();
    check::<BlockQ3K>();
    check::<BlockQ4K>();
    check::<BlockQ5K>();
    check::<BlockQ6K>();
    check::<BlockQ8K>();
}

/// Non-finite inputs do not panic (results are unspecified, as in ggml).
#[test]
fn non_finite_inputs_do_not_panic() {
    let mut x = row(QK_K);
    x[3] = f32::NAN;
    x[70] = f32::INFINITY;
    x[200] = -f32::INFINITY;
    x[201] = f32::MAX;
    x[202] = f32::MIN_POSITIVE / 3.0;
    for dtype in ALL_DTYPES {
        if dtype == DType::I32 {
            continue;
        }
        let mut bytes = [0u8; MAX_N * 4];
        let nbytes = dtype.row_size(QK_K).unwrap();
        quantize_row(dtype, &x[..QK_K], &mut bytes[..nbytes]).unwrap();
        let mut y = [0.0f32; QK_K];
        dequantize_row(dtype, &bytes[..nbytes], &mut y).unwrap();
    }
}

/// ggml's `make_qx_quants` with `rmse_type == 0`: `iscale = -nmax / max` (max: the first
/// value of largest magnitude), `L = nmax + clamp(nearest_int(iscale * x), -nmax,
/// nmax - 1)`, scale `1 / iscale`. Here `iscale = -4 / 8 = -0.5`, so `L = 4 - x / 2` with
/// the last value (`-8`, whose `4` clamps to `3`) at `7`, and the scale is `-2`.
#[test]
fn make_qx_quants_without_search_rounds_and_offsets() {
    let x = [2.0, -4.0, 6.0, 8.0, -8.0];
    let mut ls = [0i8; 5];
    let scale = helpers::make_qx_quants(4, &x, &mut ls, 0);
    assert_eq!(scale, -2.0);
    assert_eq!(ls, [3, 6, 1, 0, 7]);
}

/// ggml's `make_qx_quants` with a negative `rmse_type` returns right after the first pass:
/// `0.5 * (sumlx / suml2 + 1 / iscale)`. With weights `x^2` and `l = [-1, 2, -3, -4, 3]`
/// (the same `L` as above, less 4): `sumlx = sum x^3 l = -8 - 128 - 648 - 2048 - 1536 =
/// -4368`, `suml2 = sum x^2 l^2 = 4 + 64 + 324 + 1024 + 576 = 1992`, both exact in f32, and
/// `1 / iscale = -2`.
#[test]
fn make_qx_quants_early_return_averages_the_two_scales() {
    let x = [2.0, -4.0, 6.0, 8.0, -8.0];
    let mut ls = [0i8; 5];
    let scale = helpers::make_qx_quants(4, &x, &mut ls, -1);
    assert_eq!(scale, 0.5 * (-4368.0f32 / 1992.0 - 2.0));
    assert_eq!(ls, [3, 6, 1, 0, 7]);
}

/// With an infinite value the first pass's sums are NaN (`iscale = -0`, `l = 0`, weight
/// inf): ggml's early return then takes its other branch, `1 / iscale = -inf`, and every
/// `L` is `nmax + 0`.
#[test]
fn make_qx_quants_early_return_with_an_infinite_value() {
    let x = [f32::INFINITY, 1.0];
    let mut ls = [0i8; 2];
    let scale = helpers::make_qx_quants(4, &x, &mut ls, -1);
    assert_eq!(scale, f32::NEG_INFINITY);
    assert_eq!(ls, [4, 4]);
}

/// ggml zeroes a group only when its largest magnitude is below `GROUP_MAX_EPS`
/// (`amax < GROUP_MAX_EPS`): a group whose largest magnitude is exactly that still
/// quantises, in `make_qx_quants` and `make_q3_quants` alike (scale `1 / iscale` =
/// `-amax / 4`, the value at `L = 0`).
#[test]
fn a_group_at_the_zero_threshold_still_quantises() {
    let eps = helpers::GROUP_MAX_EPS;
    let x = [eps, 0.0];
    let mut ls = [0i8; 2];
    let want = 1.0 / (-4.0 / eps);
    assert_eq!(helpers::make_qx_quants(4, &x, &mut ls, 0), want);
    assert_eq!(ls, [0, 4]);
    let mut ls = [0i8; 2];
    assert_eq!(helpers::make_q3_quants(4, &x, &mut ls, false), want);
    assert_eq!(ls, [0, 4]);
    // Just below it, both give a zero group.
    let below = [f32::from_bits(eps.to_bits() - 1), 0.0];
    assert_eq!(helpers::make_qx_quants(4, &below, &mut ls, 0), 0.0);
    assert_eq!(helpers::make_q3_quants(4, &below, &mut ls, false), 0.0);
    assert_eq!(ls, [0, 0]);
}

/// ggml's `make_q3_quants` without the refinement: `iscale = -nmax / max = -4 / 2 = -2`,
/// `L = nmax + clamp(nearest_int(iscale * x))`, scale `1 / iscale = -0.5`.
#[test]
fn make_q3_quants_without_refinement() {
    let x = [0.5, -1.0, 2.0];
    let mut ls = [0i8; 3];
    let scale = helpers::make_q3_quants(4, &x, &mut ls, false);
    assert_eq!(scale, -0.5);
    assert_eq!(ls, [3, 6, 0]);
}

/// Q2_K of a block whose sub-block scales are all zero or NaN: ggml's
/// `quantize_row_q2_K_ref` tests `max_scale > 0` and otherwise zeroes `d` and every
/// scale, whatever the NaN scale was. A NaN input with a payload (quiet, payload 5) at
/// the start of sub-block 0 gives that sub-block a NaN scale carrying the payload, and
/// every other value is zero (scale 0, min 0).
#[test]
fn q2_k_with_no_positive_scale_zeroes_every_scale() {
    let mut x = [0.0f32; QK_K];
    x[0] = f32::from_bits(0x7fc0_0005);
    let b = quantize_block_q2_k(&x);
    assert_eq!(b.scales, [0u8; QK_K / 16]);
    assert_eq!(b.d.to_bits(), 0);
    assert_eq!(b.dmin.to_bits(), 0);
}

fn qkx2(nstep: i32) -> helpers::Qkx2Params {
    helpers::Qkx2Params {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep,
        use_mad: false,
    }
}

/// `make_qkx2_quants` keeps ggml's signs of zero: the min is the first value and moves
/// only to a strictly smaller one (`xi < min`), and is raised to 0 only when strictly
/// positive (`min > 0`); the returned min is its negation. Zeros starting with +0 and ending with -0
/// return `-0.0`; a row starting with -0 (its min; no search steps) returns `+0.0`.
#[test]
fn make_qkx2_quants_keeps_the_signs_of_zero() {
    let (mut ls, mut aux) = ([9u8; 3], [0u8; 3]);
    let w = [1.0f32; 3];
    let (scale, min) = helpers::make_qkx2_quants(qkx2(4), &[0.0, 0.0, -0.0], &w, &mut ls, &mut aux);
    assert_eq!((scale.to_bits(), min.to_bits()), (0, 0x8000_0000));
    assert_eq!(ls, [0, 0, 0]);
    let (_, min) = helpers::make_qkx2_quants(qkx2(0), &[-0.0, 1.0, 0.5], &w, &mut ls, &mut aux);
    assert_eq!(min.to_bits(), 0, "min {min}");
}

/// With no search steps (`nstep < 1`) `make_qkx2_quants` returns the first pass: scale
/// `(max - min) / nmax` (as `1 / iscale`) and `-min`; one step (`nstep = 1`, two trials)
/// already finds a better scale for these values.
#[test]
fn make_qkx2_quants_without_and_with_a_search() {
    let x = [-1.0f32, 0.35, 0.8, 2.0];
    let w = [1.0f32; 4];
    let (mut ls, mut aux) = ([0u8; 4], [0u8; 4]);
    let (scale, min) = helpers::make_qkx2_quants(qkx2(0), &x, &w, &mut ls, &mut aux);
    assert_eq!(scale, 1.0 / (3.0 / 3.0));
    assert_eq!(min, 1.0);
    assert_eq!(ls, [0, 1, 2, 3]);
    let first = (scale, min, ls);
    let (scale, min) = helpers::make_qkx2_quants(qkx2(1), &x, &w, &mut ls, &mut aux);
    assert_ne!(
        (scale, min, ls),
        first,
        "one search step changes nothing here"
    );
}

/// Q4_1 and Q5_1 keep the first of equal minima (ggml's `v < min`): a block whose
/// minimum is zero, +0 before -0, stores `m = +0`.
#[test]
fn q4_1_and_q5_1_keep_the_first_of_equal_minima() {
    let mut x = [1.0f32; 32];
    x[3] = 0.0;
    x[7] = -0.0;
    assert_eq!(legacy::quantize_block_q4_1(&x).m.to_bits(), 0);
    assert_eq!(legacy::quantize_block_q5_1(&x).m.to_bits(), 0);
    x[3] = -0.0;
    x[7] = 0.0;
    assert_eq!(legacy::quantize_block_q4_1(&x).m.to_bits(), 0x8000);
    assert_eq!(legacy::quantize_block_q5_1(&x).m.to_bits(), 0x8000);
}

/// Q3_K and Q6_K take the super-block scale from the first sub-block of the largest
/// magnitude (ggml's `if (scale > amax)`): with sub-blocks p and -p, whose scales have
/// equal magnitudes and opposite signs, the block is the one of p alone but for the
/// second sub-block's quants (the later one does not flip the scale's sign).
#[test]
fn q3_k_and_q6_k_keep_the_first_of_equal_magnitude_scales() {
    let mut x = [0.0f32; QK_K];
    // Multiples of the scale, so that neither sign rounds a tie.
    for (i, v) in x[..16].iter_mut().enumerate() {
        *v = ((i % 8) as f32 - 4.0) * 0.5;
    }
    let mut both = x;
    for i in 0..16 {
        both[16 + i] = -x[i];
    }
    let (q3, q3_both) = (
        kquants::quantize_block_q3_k(&x),
        kquants::quantize_block_q3_k(&both),
    );
    assert_ne!(q3.d.to_bits(), 0);
    assert_eq!(q3_both.d.to_bits(), q3.d.to_bits(), "Q3_K d");
    let (q6, q6_both) = (
        kquants::quantize_block_q6_k(&x),
        kquants::quantize_block_q6_k(&both),
    );
    assert_ne!(q6.d.to_bits(), 0);
    assert_eq!(q6_both.d.to_bits(), q6.d.to_bits(), "Q6_K d");
    assert_eq!(q6_both.scales[0], q6.scales[0], "Q6_K: p's scale");
}
