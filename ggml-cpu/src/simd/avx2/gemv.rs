//! Matrix × vector kernels of the AVX2 level (one activation column: generation) for the
//! legacy formats Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0, on raw weight rows.
//!
//! The activation row is packed in [`QuantOrder::Paired`] order: per group of 8 blocks,
//! vector 2i holds elements 0..16 of blocks i and i + 4 (one 128-bit half each) and
//! vector 2i + 1 their elements 16..32. A weight register is loaded the same way, block i
//! in the low half and block i + 4 in the high half, so no quant is ever moved across
//! lanes. A nibble format's low nibbles meet vector 2i and its high nibbles vector
//! 2i + 1: two `maddubs` whose i16 sums add without overflow (at most 4 · 31 · 127), one
//! `madd` by 1 to i32, leaving 4 partial dots of block i in the low half and 4 of block
//! i + 4 in the high half. Q8_0 runs each half through its own sign trick and `madd`
//! (two `maddubs` sums of ±128 · 127 pairs would overflow i16). Three `hadd`s then leave
//! block t's exact integer dot in lane t of one register; from there the float formula
//! and the lane accumulation are those of `reference::block_value` (lane t accumulates
//! blocks j ≡ t mod 8, `reference::tree8` at the end), so the bits are the reference's.
//!
//! [`QuantOrder::Paired`]: crate::simd::x86_quant::QuantOrder::Paired

use std::arch::x86_64::*;

use ggml_core::DType;

use crate::simd::{packed_row_bytes, Gemv, Packer, PACK_GROUP};

const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;

/// Bytes per block of format `f`.
const fn block_bytes(f: u8) -> usize {
    match f {
        Q4_0 => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        _ => 34,
    }
}

/// Where a block's quants start: the 16 nibble bytes, or Q8_0's 32 bytes.
const fn quant_at(f: u8) -> usize {
    match f {
        Q4_0 | Q8_0 => 2,
        Q4_1 => 4,
        Q5_0 => 6,
        _ => 8,
    }
}

/// Where a Q5 block's 32 fifth bits start.
const fn qh_at(f: u8) -> usize {
    if f == Q5_0 {
        2
    } else {
        4
    }
}

/// Whether format `f` has a minimum `m` (after `d`).
const fn has_min(f: u8) -> bool {
    matches!(f, Q4_1 | Q5_1)
}

/// log2 of the offset format `f` subtracts from its unsigned quants (0: none).
const fn bias_shift(f: u8) -> i32 {
    match f {
        Q4_0 => 3,
        Q5_0 => 4,
        _ => 0,
    }
}

/// The 16 bytes at `lo` in the low half and, if `with_hi`, the 16 at `hi` in the high
/// half (else zeros).
///
/// # Safety
/// 16 readable bytes at `lo`, and at `hi` if `with_hi`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn halves(lo: *const u8, hi: *const u8, with_hi: bool) -> __m256i {
    // SAFETY: caller's contract.
    unsafe {
        let l = _mm_loadu_si128(lo as *const __m128i);
        if with_hi {
            _mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(l),
                _mm_loadu_si128(hi as *const __m128i),
            )
        } else {
            _mm256_zextsi128_si256(l)
        }
    }
}

/// The fifth bits of the Q5 blocks at `a` (low half) and, if `with_b`, at `b` (high
/// half) as 16 where set: elements 0..16 of each block, then elements 16..32.
///
/// # Safety
/// A Q5 block of format `F` at `a`, and at `b` if `with_b`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fifth_bits<const F: u8>(a: *const u8, b: *const u8, with_b: bool) -> (__m256i, __m256i) {
    // SAFETY: caller's contract.
    let qh = |p: *const u8| unsafe { (p.add(qh_at(F)) as *const i32).read_unaligned() };
    let v = _mm256_setr_epi32(qh(a), 0, 0, 0, if with_b { qh(b) } else { 0 }, 0, 0, 0);
    // Byte e of a half takes byte e / 8 of its `qh` (elements 0..16) or byte 2 + e / 8
    // (elements 16..32), then keeps bit e % 8 of it.
    let lo_idx = _mm256_setr_epi64x(0, 0x0101_0101_0101_0101, 0, 0x0101_0101_0101_0101);
    let hi_idx = _mm256_setr_epi64x(
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let sixteen = _mm256_set1_epi8(16);
    let pick = |idx: __m256i| {
        let b = _mm256_shuffle_epi8(v, idx);
        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit), sixteen)
    };
    (pick(lo_idx), pick(hi_idx))
}

/// The partial dots of the block pair at `a` and (if `with_b`) `b` against the activation
/// vectors at `y` (vectors 2i and 2i + 1 of a group): 4 i32 of block `a` in the low half,
/// 4 of block `b` (or zeros) in the high half.
///
/// # Safety
/// A block of format `F` at `a`, and at `b` if `with_b`; 64 readable bytes at `y`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pair_dots<const F: u8>(
    a: *const u8,
    b: *const u8,
    with_b: bool,
    y: *const u8,
) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    // SAFETY: caller's contract (the halves read lie inside the blocks).
    unsafe {
        let ylo = _mm256_loadu_si256(y as *const __m256i);
        let yhi = _mm256_loadu_si256(y.add(32) as *const __m256i);
        if F == Q8_0 {
            let xl = halves(a.add(2), b.wrapping_add(2), with_b);
            let xh = halves(a.add(18), b.wrapping_add(18), with_b);
            let dl = _mm256_maddubs_epi16(_mm256_abs_epi8(xl), _mm256_sign_epi8(ylo, xl));
            let dh = _mm256_maddubs_epi16(_mm256_abs_epi8(xh), _mm256_sign_epi8(yhi, xh));
            return _mm256_add_epi32(_mm256_madd_epi16(dl, ones), _mm256_madd_epi16(dh, ones));
        }
        let m4 = _mm256_set1_epi8(15);
        let q = halves(a.add(quant_at(F)), b.wrapping_add(quant_at(F)), with_b);
        let mut lo = _mm256_and_si256(q, m4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
        if matches!(F, Q5_0 | Q5_1) {
            let (bl, bh) = fifth_bits::<F>(a, b, with_b);
            lo = _mm256_or_si256(lo, bl);
            hi = _mm256_or_si256(hi, bh);
        }
        let s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, ylo), _mm256_maddubs_epi16(hi, yhi));
        _mm256_madd_epi16(s, ones)
    }
}

/// The `d` (and `m`) of the first `cnt` blocks at `x` as f32, lane t for block t (lanes
/// t ≥ `cnt` hold the last block's).
///
/// # Safety
/// `cnt` (1 to 8) blocks of format `F` at `x`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales<const F: u8>(x: *const u8, cnt: usize) -> (__m256, __m256) {
    // The f16 words are put together in general registers (integer ports, idle here)
    // rather than inserted into a vector one by one (the shuffle ports already carry the
    // pair inserts and the hadds). Missing blocks repeat the last block: no branch per
    // block.
    // SAFETY: block min(t, cnt - 1) < cnt at x (caller).
    let block = |t: usize| unsafe { x.add(t.min(cnt - 1) * block_bytes(F)) };
    if !has_min(F) {
        // SAFETY: a block's first 2 bytes (its `d`).
        let d = |t: usize| i64::from(unsafe { (block(t) as *const u16).read_unaligned() });
        let lo = d(0) | d(1) << 16 | d(2) << 32 | d(3) << 48;
        let hi = d(4) | d(5) << 16 | d(6) << 32 | d(7) << 48;
        return (_mm256_cvtph_ps(_mm_set_epi64x(hi, lo)), _mm256_setzero_ps());
    }
    // `d` and `m` are adjacent: one 32-bit load per block gives both, and a byte shuffle
    // per 4 blocks parts them (half the loads, shifts and ors of two 16-bit gathers).
    // SAFETY: a block's first 4 bytes (its `d` and `m`).
    let dm = |t: usize| i64::from(unsafe { (block(t) as *const u32).read_unaligned() });
    let part = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    // [d0 d1 d2 d3 m0 m1 m2 m3] and the same of blocks 4..8.
    let q0 = _mm_shuffle_epi8(
        _mm_set_epi64x(dm(2) | dm(3) << 32, dm(0) | dm(1) << 32),
        part,
    );
    let q1 = _mm_shuffle_epi8(
        _mm_set_epi64x(dm(6) | dm(7) << 32, dm(4) | dm(5) << 32),
        part,
    );
    (
        _mm256_cvtph_ps(_mm_unpacklo_epi64(q0, q1)),
        _mm256_cvtph_ps(_mm_unpackhi_epi64(q0, q1)),
    )
}

/// The 8 block values of one weight row's group at `x` (its first `N` blocks; lane t:
/// block t, garbage for missing blocks) against the packed activation group at `yp`.
///
/// `N` is a constant so that a short last group is compiled for its own length: with a
/// run-time count, 2 blocks (the last group at K = 576) cost more than a whole group
/// (a branch per pair and a clamped address per scale word).
///
/// # Safety
/// `N` (1 to 8) blocks of format `F` at `x`; a packed group ([`PACK_GROUP`] bytes) at
/// `yp`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group<const F: u8, const N: usize>(x: *const u8, yp: *const u8) -> __m256 {
    let xb = block_bytes(F);
    // SAFETY: caller's contract: blocks below N exist, the others are never read.
    unsafe {
        let mut p = [_mm256_setzero_si256(); 4];
        for (i, pi) in p.iter_mut().enumerate() {
            if i < N {
                let (a, b) = (x.add(i * xb), x.wrapping_add((i + 4) * xb));
                *pi = pair_dots::<F>(a, b, i + 4 < N, yp.add(64 * i));
            }
        }
        let mut s = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        if bias_shift(F) > 0 {
            // Σ (u − 2^b)·y = Σ u·y − 2^b·Σy.
            let sy = _mm256_loadu_si256(yp.add(320) as *const __m256i);
            s = _mm256_sub_epi32(s, _mm256_sll_epi32(sy, _mm_cvtsi32_si128(bias_shift(F))));
        }
        let (dx, mx) = scales::<F>(x, N);
        let dy = _mm256_loadu_ps(yp.add(256) as *const f32);
        let v = _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(s));
        if has_min(F) {
            let sy = _mm256_loadu_ps(yp.add(288) as *const f32);
            _mm256_add_ps(v, _mm256_mul_ps(mx, sy))
        } else {
            v
        }
    }
}

/// `NR` weight rows of format `F` against one activation row packed by
/// [`super::pack_paired`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemv_gen<const F: u8, const NR: usize>(
    k: usize,
    a: &[&[u8]],
    y: &[u8],
    out: &mut [f32; 4],
) {
    let xb = block_bytes(F);
    let nb = k / 32;
    let ng = nb.div_ceil(8);
    assert!(a.len() >= NR && a[..NR].iter().all(|r| r.len() >= nb * xb));
    assert!(y.len() >= ng * PACK_GROUP);
    let mut acc = [_mm256_setzero_ps(); NR];
    let full = nb / 8;
    for g in 0..full {
        let yp = y.as_ptr().wrapping_add(g * PACK_GROUP);
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let x = a[r].as_ptr().wrapping_add(8 * g * xb);
            // SAFETY: group g of the row and of the packed row (lengths asserted above);
            // same features.
            *acc_r = _mm256_add_ps(*acc_r, unsafe { group::<F, 8>(x, yp) });
        }
    }
    // A last group of fewer than 8 blocks, outside the loop so that the loop stays small.
    let cnt = nb - 8 * full;
    if cnt > 0 {
        let yp = y.as_ptr().wrapping_add(full * PACK_GROUP);
        // Lanes of missing blocks keep their value exactly.
        let live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
            _mm256_set1_epi32(cnt as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        ));
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let x = a[r].as_ptr().wrapping_add(8 * full * xb);
            // SAFETY: the last `cnt` blocks of the row and the last group of the packed
            // row (lengths asserted above); same features.
            let v = unsafe {
                match cnt {
                    1 => group::<F, 1>(x, yp),
                    2 => group::<F, 2>(x, yp),
                    3 => group::<F, 3>(x, yp),
                    4 => group::<F, 4>(x, yp),
                    5 => group::<F, 5>(x, yp),
                    6 => group::<F, 6>(x, yp),
                    _ => group::<F, 7>(x, yp),
                }
            };
            *acc_r = _mm256_blendv_ps(*acc_r, _mm256_add_ps(*acc_r, v), live);
        }
    }
    for (o, acc_r) in out.iter_mut().zip(acc) {
        let mut l = [0f32; 8];
        // SAFETY: 8 floats of room.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), acc_r) };
        *o = crate::reference::tree8(l);
    }
}

/// `out[r] = dot(a[r], y)` for 1 to 4 rows of format `F`.
fn gemv_rows<const F: u8>(k: usize, a: &[&[u8]], y: &[u8], out: &mut [f32; 4]) {
    // SAFETY: this table is installed only where AVX2, FMA and F16C were detected.
    unsafe {
        match a.len() {
            4 => gemv_gen::<F, 4>(k, a, y, out),
            3 => gemv_gen::<F, 3>(k, a, y, out),
            2 => gemv_gen::<F, 2>(k, a, y, out),
            1 => gemv_gen::<F, 1>(k, a, y, out),
            n => panic!("a gemv call takes 1 to 4 rows, not {n}"),
        }
    }
}

/// The matrix × vector kernel of weight format `w`, where this level has one.
pub(crate) fn gemv(w: DType) -> Option<Gemv> {
    let rows = match w {
        DType::Q4_0 => gemv_rows::<Q4_0>,
        DType::Q4_1 => gemv_rows::<Q4_1>,
        DType::Q5_0 => gemv_rows::<Q5_0>,
        DType::Q5_1 => gemv_rows::<Q5_1>,
        DType::Q8_0 => gemv_rows::<Q8_0>,
        _ => return None,
    };
    Some(Gemv {
        pack: Packer {
            row_bytes: packed_row_bytes,
            pack: super::pack_paired,
        },
        rows,
    })
}
