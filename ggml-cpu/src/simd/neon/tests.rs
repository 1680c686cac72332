//! The aarch64 tables run NEON kernels for every weight dtype and activation quantiser:
//! a dtype routed to the portable code would pass every bit-for-bit comparison of
//! `simd::tests` without testing a NEON kernel, so these tests pin the routing.

use ggml_core::DType;

use super::{quantiser, tile_kind, TileKind};
use crate::simd::scalar;
use ggml_test_kit::Xorshift as Rng;

/// Every dtype the portable level has a mul_mat tile for.
fn tiled_dtypes() -> Vec<DType> {
    ggml_core::ALL_DTYPES
        .into_iter()
        .filter(|&d| (scalar::KERNELS.mm)(d).is_some())
        .collect()
}

#[test]
fn every_tiled_dtype_has_a_neon_tile() {
    let dtypes = tiled_dtypes();
    // The weight formats of issue 40: the float formats, the legacy quants, Q2_K..Q6_K.
    assert!(dtypes.len() >= 13, "only {dtypes:?}");
    for w in dtypes {
        let kind = tile_kind(w).unwrap_or_else(|| panic!("{w}: no NEON tile"));
        let want = match w {
            DType::F32 => TileKind::F32,
            DType::F16 => TileKind::F16,
            DType::BF16 => TileKind::Bf16,
            _ => TileKind::Quant,
        };
        assert_eq!(kind, want, "{w}");
    }
}

#[test]
fn every_activation_type_has_a_neon_quantiser() {
    for w in tiled_dtypes() {
        let vdt = w.vec_dot_type();
        if vdt.is_quantized() {
            assert!(
                quantiser(vdt).is_some(),
                "{w}'s activations ({vdt}): portable"
            );
        }
    }
}

/// Q8_K at the edges the shared test does not reach: NaN and infinite inputs, a maximum
/// repeated with both signs, values that round to ±127.5, subnormal maxima, a block of
/// zeros beside a nonzero one.
#[test]
fn q8k_quantiser_matches_core_at_edges() {
    let mut rng = Rng::new(40);
    let n = 1024;
    let mut cases = Vec::new();
    let mut nan = rng.vec(n, 2.0);
    nan[7] = f32::NAN;
    nan[300] = -f32::NAN;
    cases.push(nan);
    let mut inf = rng.vec(n, 2.0);
    inf[600] = f32::INFINITY;
    inf[800] = f32::NEG_INFINITY;
    cases.push(inf);
    let mut rep = rng.vec(n, 1.0);
    for (i, v) in [(1, -3.0), (2, 3.0), (257, 3.0), (258, -3.0)] {
        rep[i] = v;
    }
    cases.push(rep);
    let mut halves: Vec<f32> = (0..n).map(|i| (i % 255) as f32 - 127.0 + 0.5).collect();
    halves[0] = -127.0;
    cases.push(halves);
    // Subnormal maxima: iscale overflows to ±∞, so iscale·x is ±∞ or NaN.
    let mut tiny = rng.vec(n, 1e-40);
    tiny[5] = 0.0;
    cases.push(tiny);
    let mut zeros = rng.vec(n, 1e-3);
    zeros[256..512].fill(0.0);
    zeros[300] = -0.0;
    cases.push(zeros);
    let q = quantiser(DType::Q8K).expect("a NEON Q8_K quantiser");
    for (c, x) in cases.iter().enumerate() {
        let mut want = vec![0u8; DType::Q8K.row_size(n).unwrap()];
        ggml_core::quant::quantize_row(DType::Q8K, x, &mut want).unwrap();
        let mut got = vec![0xAAu8; want.len()];
        q(x, &mut got);
        assert_eq!(got, want, "case {c}");
    }
}
