//! AVX2 + FMA + F16C level (FMA is never used for f32 arithmetic: results must match
//! machines without it).

use std::arch::x86_64::*;

use ggml_core::DType;

use super::{Kernels, MmTile};
use crate::isa::Isa;
use crate::reference as r;

mod gemv;

pub(crate) static KERNELS: Kernels = Kernels {
    gemv: gemv::gemv,
    panel,
    ..kernels_table!(
        Isa::Avx2,
        heads: None,
        quantize: quantize,
        mm: mm,
        pack: pack,
        unpacked: unpacked,
    )
};

// Q8_0 quants stay signed: `maddubs` would saturate on `q + 128`.
x86_quant!("avx2,fma,f16c", dot_u, dot_s, 0);
x86_kpanel_avx2!("avx2,fma,f16c");

/// `acc` plus the dots of each lane's 4 u8 of `x` with its 4 i8 of `y` (u8 ≤ 31 here, so
/// `maddubs` never saturates).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_u(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
    _mm256_add_epi32(
        acc,
        _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1)),
    )
}

/// As [`dot_u`] for i8 `x` (y is never -128: activations are clamped to ±127).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_s(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
    // SAFETY: same features.
    unsafe { dot_u(acc, _mm256_abs_epi8(x), _mm256_sign_epi8(y, x)) }
}

pub(crate) fn mm(w: DType) -> Option<MmTile> {
    Some(match w {
        DType::F32 => tile_f32,
        DType::F16 => tile_f16,
        DType::BF16 => super::scalar::tile_bf16,
        d if crate::ops::mul_mat::quant_supported(d) => tile_quant,
        _ => return None,
    })
}

// Table entries over the kernels below. Installed only when AVX2, FMA and F16C were detected.
safe_common!();

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ld_f32(p: *const f32) -> __m256 {
    // SAFETY: 8 readable floats at p (caller).
    unsafe { _mm256_loadu_ps(p) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ld_f16(p: *const u16) -> __m256 {
    // SAFETY: 8 readable f16 at p (caller).
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes16(a0: __m256, a1: __m256) -> [f32; 16] {
    let mut l = [0f32; 16];
    // SAFETY: 16 floats of room.
    unsafe {
        _mm256_storeu_ps(l.as_mut_ptr(), a0);
        _mm256_storeu_ps(l.as_mut_ptr().add(8), a1);
    }
    l
}

macro_rules! dot_impl {
    ($name:ident, $t:ty, $ld:ident, $conv:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name(x: &[$t], y: &[$t]) -> f32 {
            let n = x.len().min(y.len());
            let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            while i + 16 <= n {
                // SAFETY: i + 16 <= n elements in both rows.
                unsafe {
                    let (px, py) = (x.as_ptr().add(i), y.as_ptr().add(i));
                    a0 = _mm256_add_ps(a0, _mm256_mul_ps($ld(px), $ld(py)));
                    a1 = _mm256_add_ps(a1, _mm256_mul_ps($ld(px.add(8)), $ld(py.add(8))));
                }
                i += 16;
            }
            // SAFETY: same features.
            let mut l = unsafe { lanes16(a0, a1) };
            for j in i..n {
                l[j - i] += $conv(x[j]) * $conv(y[j]);
            }
            r::tree16(l)
        }
    };
}

dot_impl!(dot_f32_imp, f32, ld_f32, |v: f32| v);
dot_impl!(dot_f16_imp, u16, ld_f16, r::f16_to_f32);

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sum_sq_imp(x: &[f32]) -> f32 {
    let n = x.len();
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: 16 floats at i.
        unsafe {
            let (v0, v1) = (ld_f32(x.as_ptr().add(i)), ld_f32(x.as_ptr().add(i + 8)));
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(v0, v0));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(v1, v1));
        }
        i += 16;
    }
    // SAFETY: same features.
    let mut l = unsafe { lanes16(a0, a1) };
    for j in i..n {
        l[j - i] += x[j] * x[j];
    }
    r::tree16(l)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn max_imp(x: &[f32]) -> f32 {
    let n = x.len();
    let (mut a0, mut a1) = (
        _mm256_set1_ps(f32::NEG_INFINITY),
        _mm256_set1_ps(f32::NEG_INFINITY),
    );
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: 16 floats at i. maxps(x, m) = x > m ? x : m, as reference::fmax.
        unsafe {
            a0 = _mm256_max_ps(ld_f32(x.as_ptr().add(i)), a0);
            a1 = _mm256_max_ps(ld_f32(x.as_ptr().add(i + 8)), a1);
        }
        i += 16;
    }
    // SAFETY: same features.
    let mut l = unsafe { lanes16(a0, a1) };
    for j in i..n {
        l[j - i] = r::fmax(x[j], l[j - i]);
    }
    r::tree16_max(l)
}

x86_exp! {
    feature: "avx2,fma,f16c", vector: __m256, exp: exp8, silu: silu8, set1: _mm256_set1_ps,
    max: _mm256_max_ps, min: _mm256_min_ps, add: _mm256_add_ps, sub: _mm256_sub_ps,
    mul: _mm256_mul_ps, div: _mm256_div_ps, xor: _mm256_xor_ps, add_i32: _mm256_add_epi32,
    sub_i32: _mm256_sub_epi32, set1_i32: _mm256_set1_epi32, srai_i32: _mm256_srai_epi32,
    slli_i32: _mm256_slli_epi32, to_bits: _mm256_castps_si256, from_bits: _mm256_castsi256_ps,
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp_shift_sum_imp(x: &mut [f32], m: f32) -> f32 {
    let n = x.len();
    let mv = _mm256_set1_ps(m);
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: 16 floats at i.
        unsafe {
            let p = x.as_mut_ptr().add(i);
            let e0 = exp8(_mm256_sub_ps(ld_f32(p), mv));
            let e1 = exp8(_mm256_sub_ps(ld_f32(p.add(8)), mv));
            _mm256_storeu_ps(p, e0);
            _mm256_storeu_ps(p.add(8), e1);
            a0 = _mm256_add_ps(a0, e0);
            a1 = _mm256_add_ps(a1, e1);
        }
        i += 16;
    }
    // SAFETY: same features.
    let mut l = unsafe { lanes16(a0, a1) };
    for j in i..n {
        x[j] = r::exp(x[j] - m);
        l[j - i] += x[j];
    }
    r::tree16(l)
}

x86_elementwise! {
    feature: "avx2,fma,f16c", lanes: 8, silu: silu8, store: _mm256_storeu_ps,
    mul: _mm256_mul_ps, add: _mm256_add_ps, set1: _mm256_set1_ps, to_f16: _mm256_cvtps_ph,
    store_f16: _mm_storeu_si128, f16_vector: __m128i,
}

// The attention dots are written apart from avx512.rs's on purpose (issue 36 item 4): the
// reference reduces 16 f32 lanes by a fixed tree, which AVX2 holds in two registers and
// reduces 4 dots at a time (`tree16_x4`, 128-bit permutes), while AVX-512 holds it in one and
// reduces 16 dots at once (`tree16_x16`, a 4x4 transpose). Shared code over the width would
// have to pick one blocking and lose the other's. The elementwise kernels are shared
// (x86_elementwise.rs).

/// Reduces the 16-lane accumulators (lanes 0-7 in `lo`, 8-15 in `hi`) of 4 dots, each
/// exactly as [`r::tree16`]: `l += l+8`, `l += l+4`, `l += l+2`, `l0 + l1`, the same
/// additions of the same operands.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tree16_x4(lo: &[__m256; 4], hi: &[__m256; 4]) -> [f32; 4] {
    let s = [
        _mm256_add_ps(lo[0], hi[0]),
        _mm256_add_ps(lo[1], hi[1]),
        _mm256_add_ps(lo[2], hi[2]),
        _mm256_add_ps(lo[3], hi[3]),
    ];
    // l += l+4: dots 2p (low 128 bits) and 2p+1 (high 128 bits) in u[p].
    let u = [
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(s[0], s[1]),
            _mm256_permute2f128_ps::<0x31>(s[0], s[1]),
        ),
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(s[2], s[3]),
            _mm256_permute2f128_ps::<0x31>(s[2], s[3]),
        ),
    ];
    // l += l+2: the low 128 bits hold dots 0 (lanes 0-1) and 2 (2-3), the high 1 and 3.
    let v = _mm256_add_ps(
        _mm256_shuffle_ps::<0x44>(u[0], u[1]),
        _mm256_shuffle_ps::<0xEE>(u[0], u[1]),
    );
    // l0 + l1: lanes 0, 1, 4, 5 hold dots 0, 2, 1, 3.
    let t = _mm256_add_ps(
        _mm256_shuffle_ps::<0x88>(v, v),
        _mm256_shuffle_ps::<0xDD>(v, v),
    );
    let mut l = [0f32; 8];
    // SAFETY: 8 floats of room.
    unsafe { _mm256_storeu_ps(l.as_mut_ptr(), t) };
    [l[0], l[4], l[1], l[5]]
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots_f16_imp(q: &[u16], k: &[u16], stride: usize, out: &mut [f32]) {
    let (d, n) = (q.len(), out.len());
    assert!(
        k.len() >= super::rows_span(n, stride, d),
        "key rows out of bounds"
    );
    if !d.is_multiple_of(16) {
        for (j, o) in out.iter_mut().enumerate() {
            // SAFETY: same features.
            *o = unsafe { dot_f16_imp(q, &k[j * stride..j * stride + d]) };
        }
        return;
    }
    let kp = k.as_ptr();
    let mut j0 = 0;
    while j0 < n {
        let nk = (n - j0).min(4);
        // Rows past the run repeat its last row; their sums are not stored.
        let rows = [0, 1, 2, 3].map(|t| kp.wrapping_add((j0 + t.min(nk - 1)) * stride));
        let (mut lo, mut hi) = ([_mm256_setzero_ps(); 4], [_mm256_setzero_ps(); 4]);
        let mut i = 0;
        while i < d {
            // SAFETY: 16 values at i in the query and in every row (bounds asserted, d a
            // multiple of 16).
            unsafe {
                let (q0, q1) = (ld_f16(q.as_ptr().add(i)), ld_f16(q.as_ptr().add(i + 8)));
                for t in 0..4 {
                    lo[t] = _mm256_add_ps(lo[t], _mm256_mul_ps(q0, ld_f16(rows[t].add(i))));
                    hi[t] = _mm256_add_ps(hi[t], _mm256_mul_ps(q1, ld_f16(rows[t].add(i + 8))));
                }
            }
            i += 16;
        }
        // SAFETY: same features.
        let sums = unsafe { tree16_x4(&lo, &hi) };
        out[j0..j0 + nk].copy_from_slice(&sums[..nk]);
        j0 += nk;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_f16_rows_imp(accs: &mut [&mut [f32]], ws: &[&[f32]], v: &[u16], stride: usize) {
    for (acc, w) in accs.iter_mut().zip(ws) {
        // SAFETY: same features.
        unsafe { axpy_f16_row_imp(acc, w, v, stride) };
    }
}

/// One head of [`axpy_f16_rows_imp`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_f16_row_imp(acc: &mut [f32], w: &[f32], v: &[u16], stride: usize) {
    let (d, n) = (acc.len(), w.len());
    assert!(
        v.len() >= super::rows_span(n, stride, d),
        "value rows out of bounds"
    );
    // Up to eight registers of the accumulator stay in registers across all rows.
    let mut c0 = 0;
    while c0 + 8 <= d {
        let parts = ((d - c0) / 8).min(8);
        let mut regs = [_mm256_setzero_ps(); 8];
        let a = &mut regs[..parts];
        // SAFETY (loads and stores below): 8·parts values at c0 in the accumulator and in
        // every value row (bounds asserted).
        for (p, ap) in a.iter_mut().enumerate() {
            *ap = unsafe { ld_f32(acc.as_ptr().add(c0 + 8 * p)) };
        }
        for (j, &wj) in w.iter().enumerate() {
            let wv = _mm256_set1_ps(wj);
            let row = v.as_ptr().wrapping_add(j * stride + c0);
            for (p, ap) in a.iter_mut().enumerate() {
                *ap = _mm256_add_ps(*ap, _mm256_mul_ps(wv, unsafe { ld_f16(row.add(8 * p)) }));
            }
        }
        for (p, ap) in a.iter().enumerate() {
            unsafe { _mm256_storeu_ps(acc.as_mut_ptr().add(c0 + 8 * p), *ap) };
        }
        c0 += 8 * parts;
    }
    for (c, x) in acc.iter_mut().enumerate().skip(c0) {
        for (j, &wj) in w.iter().enumerate() {
            *x += wj * r::f16_to_f32(v[j * stride + c]);
        }
    }
}

macro_rules! float_tile {
    ($name:ident, $t:ty, $ld:ident, $dot:ident) => {
        /// Up to 4 weight rows against each activation row, 16 lanes per dot.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name(_w: DType, k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]) {
            let ts = std::mem::size_of::<$t>();
            for ar in a {
                assert!(ar.len() >= k * ts && ar.as_ptr() as usize % ts == 0);
            }
            for (ci, br) in b.iter().enumerate() {
                assert!(br.len() >= k * ts && br.as_ptr() as usize % ts == 0);
                let y = br.as_ptr() as *const $t;
                if a.len() == 4 {
                    let x = [0, 1, 2, 3].map(|i| a[i].as_ptr() as *const $t);
                    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
                    let mut i = 0;
                    while i + 16 <= k {
                        // SAFETY: 16 elements at i in every row (lengths asserted).
                        unsafe {
                            let (y0, y1) = ($ld(y.add(i)), $ld(y.add(i + 8)));
                            for ri in 0..4 {
                                acc[ri][0] =
                                    _mm256_add_ps(acc[ri][0], _mm256_mul_ps($ld(x[ri].add(i)), y0));
                                acc[ri][1] = _mm256_add_ps(
                                    acc[ri][1],
                                    _mm256_mul_ps($ld(x[ri].add(i + 8)), y1),
                                );
                            }
                        }
                        i += 16;
                    }
                    for ri in 0..4 {
                        // SAFETY: same features; the tail is read within the asserted lengths.
                        unsafe {
                            let mut l = lanes16(acc[ri][0], acc[ri][1]);
                            let xs = std::slice::from_raw_parts(x[ri], k);
                            let ys = std::slice::from_raw_parts(y, k);
                            for j in i..k {
                                l[j - i] += to_f32(xs[j]) * to_f32(ys[j]);
                            }
                            out[ri * 4 + ci] = r::tree16(l);
                        }
                    }
                } else {
                    for (ri, ar) in a.iter().enumerate() {
                        // SAFETY: aligned rows of k elements (asserted).
                        unsafe {
                            let xs = std::slice::from_raw_parts(ar.as_ptr() as *const $t, k);
                            let ys = std::slice::from_raw_parts(y, k);
                            out[ri * 4 + ci] = $dot(xs, ys);
                        }
                    }
                }
            }
        }
    };
}

trait ToF32: Copy {
    fn to(self) -> f32;
}
impl ToF32 for f32 {
    #[inline(always)]
    fn to(self) -> f32 {
        self
    }
}
impl ToF32 for u16 {
    #[inline(always)]
    fn to(self) -> f32 {
        r::f16_to_f32(self)
    }
}
#[inline(always)]
fn to_f32<T: ToF32>(v: T) -> f32 {
    v.to()
}

float_tile!(tile_f32_imp, f32, ld_f32, dot_f32_imp);
float_tile!(tile_f16_imp, u16, ld_f16, dot_f16_imp);
