//! Seeded bytes of quantised tensors: random quants with small finite scales (random
//! bytes would put NaN and infinity in the f16 scales).

use ggml_core::DType;

use crate::rng::{Lcg, Xorshift};

/// The f16 bits of `x`, little-endian, at `at` of `block`.
fn put_f16(block: &mut [u8], at: usize, x: f32) {
    block[at..at + 2].copy_from_slice(&half::f16::from_f32(x).to_bits().to_le_bytes());
}

/// Offsets of the f16 scales (and mins) in a block of `dtype`.
fn f16_scales(dtype: DType) -> &'static [usize] {
    match dtype {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K | DType::Q8_1 => &[0, 2],
        DType::Q2K => &[80, 82],
        DType::Q3K => &[108],
        DType::Q6K => &[208],
        _ => &[],
    }
}

/// `n_blocks` blocks of `dtype` from `rng`: every byte random, then each block's f16
/// scales uniform in [-0.05, 0.05) (Q8_K: its f32 scale), block by block.
pub fn xorshift_quant_blocks(dtype: DType, n_blocks: usize, rng: &mut Xorshift) -> Vec<u8> {
    let ts = dtype.type_size();
    let mut out: Vec<u8> = (0..n_blocks * ts).map(|_| rng.next() as u8).collect();
    let scales = f16_scales(dtype);
    for b in out.chunks_exact_mut(ts) {
        for &o in scales {
            put_f16(b, o, rng.f() * 0.05);
        }
        if dtype == DType::Q8K {
            b[0..4].copy_from_slice(&(rng.f() * 0.05).to_le_bytes());
        }
    }
    out
}

/// [`xorshift_quant_blocks`] as a quantiser of activations would write them: the 8-bit
/// quants of Q8_0, Q8_1 and Q8_K never -128 (ggml's quantisers clamp to ±127; -128 is
/// made -127), and Q8_K's sums of 16 quants filled in. Draws the same values from `rng`.
pub fn xorshift_dot_blocks(dtype: DType, n_blocks: usize, rng: &mut Xorshift) -> Vec<u8> {
    let mut out = xorshift_quant_blocks(dtype, n_blocks, rng);
    let unclamp = |q: &mut u8| {
        if *q == 0x80 {
            *q = 0x81;
        }
    };
    for b in out.chunks_exact_mut(dtype.type_size()) {
        match dtype {
            DType::Q8_0 => b[2..].iter_mut().for_each(unclamp),
            DType::Q8_1 => b[4..].iter_mut().for_each(unclamp),
            DType::Q8K => {
                let mut sums = [0i16; 16];
                for (i, q) in b[4..260].iter_mut().enumerate() {
                    unclamp(q);
                    sums[i / 16] += i16::from(*q as i8);
                }
                for (g, s) in sums.iter().enumerate() {
                    b[260 + 2 * g..262 + 2 * g].copy_from_slice(&s.to_le_bytes());
                }
            }
            _ => {}
        }
    }
    out
}

/// `n` values of `dtype` (whole blocks) from `rng`: random bytes, then each block's
/// scales positive and small, mins small (the CUDA tests' weights). The scale `d` of
/// Q4_0, Q5_0 and Q8_0 is `0.01 + d_spread * f` (f uniform in [-1, 1)); the other
/// formats' scales are fixed here.
pub fn lcg_quant_rows(dtype: DType, n: usize, rng: &mut Lcg, d_spread: f32) -> Vec<u8> {
    let ts = dtype.type_size();
    let mut row = rng.bytes(n / dtype.block_size() * ts);
    for blk in row.chunks_mut(ts) {
        match dtype {
            DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => put_f16(blk, 0, 0.01 + d_spread * rng.f()),
            DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K => {
                put_f16(blk, 0, 0.01 + 0.005 * rng.f());
                put_f16(blk, 2, 0.02 * rng.f());
            }
            DType::Q2K => {
                put_f16(blk, 80, 0.01 + 0.005 * rng.f());
                put_f16(blk, 82, 0.02 * rng.f());
            }
            DType::Q3K => put_f16(blk, 108, 0.002 + 0.001 * rng.f()),
            DType::Q6K => put_f16(blk, 208, 0.001 + 0.0005 * rng.f()),
            _ => {}
        }
    }
    row
}

/// `values` stored as `dtype` in rows of `row` values, each row by ggml-core's
/// [`quantize_row`](ggml_core::quant::quantize_row) (floats: converted, to nearest even).
/// Panics when `row` does not fit the dtype's blocks or `values` is not whole rows.
pub fn quantize_rows(dtype: DType, values: &[f32], row: usize) -> Vec<u8> {
    let per_row = dtype.row_size(row).expect("row fits the dtype's blocks");
    assert_eq!(
        values.len() % row,
        0,
        "{} values are not whole rows of {row}",
        values.len()
    );
    let mut out = vec![0u8; per_row * (values.len() / row)];
    for (src, dst) in values.chunks(row).zip(out.chunks_mut(per_row)) {
        ggml_core::quant::quantize_row(dtype, src, dst).expect("quantisable row");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::QUANT_DTYPES;

    fn scales_finite(dtype: DType, bytes: &[u8]) {
        for b in bytes.chunks_exact(dtype.type_size()) {
            for &o in f16_scales(dtype) {
                let v = half::f16::from_bits(u16::from_le_bytes([b[o], b[o + 1]]));
                assert!(v.to_f32().abs() <= 0.05, "{dtype}: scale {v}");
            }
        }
    }

    #[test]
    fn quantised_rows_are_ggml_cores() {
        let v = Lcg(2).vec(3 * 256);
        for dt in [DType::F32, DType::F16, DType::Q4_0, DType::Q6K] {
            let row = dt.block_size().max(64);
            let got = quantize_rows(dt, &v, row);
            let per_row = dt.row_size(row).unwrap();
            assert_eq!(got.len() % per_row, 0);
            let mut want = vec![0u8; per_row];
            ggml_core::quant::quantize_row(dt, &v[..row], &mut want).unwrap();
            assert_eq!(got[..per_row], want, "{dt}");
        }
    }

    #[test]
    fn scales_are_small_and_finite() {
        for dt in QUANT_DTYPES {
            let b = xorshift_quant_blocks(dt, 3, &mut Xorshift::new(1));
            assert_eq!(b.len(), 3 * dt.type_size());
            scales_finite(dt, &b);
            let r = lcg_quant_rows(dt, 2 * dt.block_size(), &mut Lcg(1), 0.005);
            assert_eq!(r.len(), 2 * dt.type_size());
            scales_finite(dt, &r);
        }
    }

    #[test]
    fn dot_blocks_draw_the_same_values_and_never_hold_minus_128() {
        for dt in [DType::Q8_0, DType::Q8_1, DType::Q8K, DType::Q4_0] {
            let (mut a, mut b) = (Xorshift::new(9), Xorshift::new(9));
            let raw = xorshift_quant_blocks(dt, 64, &mut a);
            let dot = xorshift_dot_blocks(dt, 64, &mut b);
            assert_eq!(a.next(), b.next(), "{dt}: same draws");
            let quants = match dt {
                DType::Q8_0 => 2..dt.type_size(),
                DType::Q8_1 | DType::Q8K => 4..4 + dt.block_size(),
                _ => {
                    assert_eq!(raw, dot);
                    continue;
                }
            };
            assert!(raw.contains(&0x80), "{dt}: the case is exercised");
            for blk in dot.chunks_exact(dt.type_size()) {
                assert!(!blk[quants.clone()].contains(&0x80), "{dt}");
            }
            if dt == DType::Q8K {
                for blk in dot.chunks_exact(dt.type_size()) {
                    let q = &blk[4..260];
                    let s0: i16 = q[..16].iter().map(|&v| i16::from(v as i8)).sum();
                    assert_eq!(blk[260..262], s0.to_le_bytes());
                }
            }
        }
    }
}
