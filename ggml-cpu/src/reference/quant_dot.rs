//! Quantised dot products: the exact integer dot of a block and the fixed float formula
//! of each format, blocks combined in 8 lanes.

use ggml_core::DType;

use super::{rd_f16, tree8, QLANES};

/// Bytes of a block of the dot type `DType::vec_dot_type` of `w`.
fn dot_block_bytes(w: DType) -> usize {
    w.vec_dot_type().type_size()
}

/// The integer dot of one block and the fixed float formula of the format.
///
/// `x`: one block of weights of dtype `w`; `y`: one block of `w.vec_dot_type()`. With
/// `dx, mx` the weight block's f16 scale and min, `dy, sy` the activation block's scale
/// and `d·Σq`, `sumi` the exact integer dot:
/// - Q4_0, Q5_0, Q8_0: `(dx·dy)·sumi`
/// - Q4_1, Q5_1: `(dx·dy)·sumi + mx·sy`
/// - Q3_K, Q6_K: `(dx·dy)·sumi` where `sumi = Σ_g scale_g · Σ_{16} q·y`
/// - Q2_K, Q4_K, Q5_K: `(dx·dy)·sumi − (dminx·dy)·Σ_g min_g·bsum_g`
#[inline(always)]
pub fn block_value(w: DType, x: &[u8], y: &[u8]) -> f32 {
    match w {
        DType::Q4_0 => {
            let sumi: i32 = (0..16)
                .map(|l| {
                    let q = x[2 + l];
                    (i32::from(q & 15) - 8) * i32::from(y[2 + l] as i8)
                        + (i32::from(q >> 4) - 8) * i32::from(y[2 + l + 16] as i8)
                })
                .sum();
            (rd_f16(x, 0) * rd_f16(y, 0)) * sumi as f32
        }
        DType::Q4_1 => {
            let sumi: i32 = (0..16)
                .map(|l| {
                    let q = x[4 + l];
                    i32::from(q & 15) * i32::from(y[4 + l] as i8)
                        + i32::from(q >> 4) * i32::from(y[4 + l + 16] as i8)
                })
                .sum();
            (rd_f16(x, 0) * rd_f16(y, 0)) * sumi as f32 + rd_f16(x, 2) * rd_f16(y, 2)
        }
        DType::Q5_0 => {
            let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
            let sumi: i32 = (0..16)
                .map(|l| {
                    let q = x[6 + l];
                    let lo = i32::from(q & 15) | (((qh >> l) & 1) << 4) as i32;
                    let hi = i32::from(q >> 4) | (((qh >> (l + 16)) & 1) << 4) as i32;
                    (lo - 16) * i32::from(y[2 + l] as i8)
                        + (hi - 16) * i32::from(y[2 + l + 16] as i8)
                })
                .sum();
            (rd_f16(x, 0) * rd_f16(y, 0)) * sumi as f32
        }
        DType::Q5_1 => {
            let qh = u32::from_le_bytes([x[4], x[5], x[6], x[7]]);
            let sumi: i32 = (0..16)
                .map(|l| {
                    let q = x[8 + l];
                    let lo = i32::from(q & 15) | (((qh >> l) & 1) << 4) as i32;
                    let hi = i32::from(q >> 4) | (((qh >> (l + 16)) & 1) << 4) as i32;
                    lo * i32::from(y[4 + l] as i8) + hi * i32::from(y[4 + l + 16] as i8)
                })
                .sum();
            (rd_f16(x, 0) * rd_f16(y, 0)) * sumi as f32 + rd_f16(x, 2) * rd_f16(y, 2)
        }
        DType::Q8_0 => {
            let sumi: i32 = (0..32)
                .map(|l| i32::from(x[2 + l] as i8) * i32::from(y[2 + l] as i8))
                .sum();
            (rd_f16(x, 0) * rd_f16(y, 0)) * sumi as f32
        }
        DType::Q2K | DType::Q3K | DType::Q4K | DType::Q5K | DType::Q6K => {
            let k = unpack_kquant(w, x);
            let dy = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
            let qy = &y[4..260];
            let mut sumi = 0i32;
            let mut summins = 0i32;
            for g in 0..16 {
                let s: i32 = (0..16)
                    .map(|l| i32::from(k.q[16 * g + l]) * i32::from(qy[16 * g + l] as i8))
                    .sum();
                sumi += k.scale[g] * s;
                let bsum = i16::from_le_bytes([y[260 + 2 * g], y[261 + 2 * g]]);
                summins += k.min[g] * i32::from(bsum);
            }
            let d = k.d * dy;
            if k.has_min {
                d * sumi as f32 - (k.dmin * dy) * summins as f32
            } else {
                d * sumi as f32
            }
        }
        _ => 0.0,
    }
}

/// A k-quant super-block unpacked to signed 8-bit values and integer scales per group
/// of 16 values (`x_e = d·scale_{e/16}·q_e − dmin·min_{e/16}`).
pub struct KBlock {
    /// The 256 quants with their format's offset applied.
    pub q: [i8; 256],
    /// Integer scale of each group of 16.
    pub scale: [i32; 16],
    /// Integer min of each group of 16 (0 for formats without mins).
    pub min: [i32; 16],
    /// The super-block scale `d`.
    pub d: f32,
    /// The super-block min scale `dmin` (0 without mins).
    pub dmin: f32,
    /// Whether the format has mins (Q2_K, Q4_K, Q5_K).
    pub has_min: bool,
}

/// The 6-bit scale and min of 32-value chunk `j` of a Q4_K/Q5_K super-block's packed
/// `scales` (ggml's `get_scale_min_k4`).
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8]) -> (i32, i32) {
    if j < 4 {
        (i32::from(q[j] & 63), i32::from(q[j + 4] & 63))
    } else {
        (
            i32::from((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)),
            i32::from((q[j + 4] >> 4) | ((q[j] >> 6) << 4)),
        )
    }
}

/// Unpacks one super-block of a k-quant format (layouts as ggml's `block_q*_K`).
#[inline(always)]
pub fn unpack_kquant(w: DType, x: &[u8]) -> KBlock {
    let mut k = KBlock {
        q: [0; 256],
        scale: [0; 16],
        min: [0; 16],
        d: 0.0,
        dmin: 0.0,
        has_min: false,
    };
    match w {
        DType::Q2K => {
            let (sc, qs) = (&x[0..16], &x[16..80]);
            k.d = rd_f16(x, 80);
            k.dmin = rd_f16(x, 82);
            k.has_min = true;
            for e in 0..256 {
                let (half, j, l) = (e / 128, (e % 128) / 32, e % 32);
                k.q[e] = ((qs[32 * half + l] >> (2 * j)) & 3) as i8;
            }
            for (g, &b) in sc.iter().enumerate() {
                k.scale[g] = i32::from(b & 15);
                k.min[g] = i32::from(b >> 4);
            }
        }
        DType::Q3K => {
            let (hm, qs, sc) = (&x[0..32], &x[32..96], &x[96..108]);
            k.d = rd_f16(x, 108);
            for e in 0..256 {
                let (half, j, l) = (e / 128, (e % 128) / 32, e % 32);
                let q = ((qs[32 * half + l] >> (2 * j)) & 3) as i8;
                let h = hm[l] & (1 << (4 * half + j)) != 0;
                k.q[e] = q - if h { 0 } else { 4 };
            }
            let a = |i: usize| {
                u32::from_le_bytes([sc[4 * i], sc[4 * i + 1], sc[4 * i + 2], sc[4 * i + 3]])
            };
            let (a0, a1, tmp) = (a(0), a(1), a(2));
            const KM1: u32 = 0x0303_0303;
            const KM2: u32 = 0x0f0f_0f0f;
            let aux = [
                (a0 & KM2) | ((tmp & KM1) << 4),
                (a1 & KM2) | (((tmp >> 2) & KM1) << 4),
                ((a0 >> 4) & KM2) | (((tmp >> 4) & KM1) << 4),
                ((a1 >> 4) & KM2) | (((tmp >> 6) & KM1) << 4),
            ];
            for g in 0..16 {
                let b = aux[g / 4].to_le_bytes()[g % 4] as i8;
                k.scale[g] = i32::from(b) - 32;
            }
        }
        DType::Q4K | DType::Q5K => {
            k.d = rd_f16(x, 0);
            k.dmin = rd_f16(x, 2);
            k.has_min = true;
            let sc = &x[4..16];
            let (qh, qs) = if w == DType::Q5K {
                (Some(&x[16..48]), &x[48..176])
            } else {
                (None, &x[16..144])
            };
            for e in 0..256 {
                let (j, l) = (e / 32, e % 32);
                let b = qs[32 * (j / 2) + l];
                let mut q = if j % 2 == 0 { b & 15 } else { b >> 4 };
                if let Some(qh) = qh {
                    q |= ((qh[l] >> j) & 1) << 4;
                }
                k.q[e] = q as i8;
            }
            for j in 0..8 {
                let (s, m) = scale_min_k4(j, sc);
                k.scale[2 * j] = s;
                k.scale[2 * j + 1] = s;
                k.min[2 * j] = m;
                k.min[2 * j + 1] = m;
            }
        }
        DType::Q6K => {
            let (ql, qh, sc) = (&x[0..128], &x[128..192], &x[192..208]);
            k.d = rd_f16(x, 208);
            for e in 0..256 {
                let (half, w2) = (e / 128, e % 128);
                let (kk, l) = (w2 / 32, w2 % 32);
                let b = ql[64 * half + l + 32 * (kk & 1)];
                let nib = if kk < 2 { b & 15 } else { b >> 4 };
                let h = (qh[32 * half + l] >> (2 * kk)) & 3;
                k.q[e] = (nib | (h << 4)) as i8 - 32;
            }
            for (s, &b) in k.scale.iter_mut().zip(sc) {
                *s = i32::from(b as i8);
            }
        }
        _ => {}
    }
    k
}

/// Dot of a weight row `x` (dtype `w`, quantised) with an activation row `y` already
/// quantised to `w.vec_dot_type()`, over `k` values: [`block_value`] per block, block `j`
/// into lane `j % 8`, lanes combined by [`tree8`].
pub fn vec_dot_quant(w: DType, x: &[u8], y: &[u8], k: usize) -> f32 {
    vec_dot_quant_inline(w, x, y, k)
}

/// [`vec_dot_quant`], always inlined (SIMD levels instantiate it with their features).
#[inline(always)]
pub(crate) fn vec_dot_quant_inline(w: DType, x: &[u8], y: &[u8], k: usize) -> f32 {
    let (xb, yb) = (w.type_size(), dot_block_bytes(w));
    let nb = k / w.block_size();
    let mut acc = [0f32; QLANES];
    for j in 0..nb {
        acc[j % QLANES] += block_value(w, &x[j * xb..(j + 1) * xb], &y[j * yb..(j + 1) * yb]);
    }
    tree8(acc)
}
