// K-quant (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) mul_mat tiles for x86, instantiated by
// `x86_quant!` (so by `avx2.rs` and by `avx512.rs`'s VNNI level, which shares this AVX2
// body: `vpdpbusd` sums 4 products into an i32 where the formats need a scale per 16, so
// `maddubs` + `madd` by the scales is as short there).
//
// The reference (`reference::block_value`): per super-block of 256 values the exact
// integers `sumi = Σ_g scale_g·Σ_{16} q·y` and `summins = Σ_g min_g·bsum_g` over its 16
// groups, then `(dx·dy)·sumi`, minus `(dminx·dy)·summins` for the formats with mins;
// block j accumulates into lane j mod 8, and the lanes combine by `reference::tree8`.
//
// Here each weight super-block is unpacked once per row into 8 chunks of 32 u8 quants
// without the format's offset (Q3_K's 4, Q6_K's 32), the 16 group scales as i16, and 16
// i16 "aux" terms: the mins, or `offset·scale_g`. For each activation row, `maddubs`
// then `madd` by the chunk's scales leave 8 i32 partial sums of `Σ_g scale_g·Σ u·y`, and
// one `madd` of the aux terms with the Q8_K `bsums` gives the min sum, or the offset's
// share `offset·Σ_g scale_g·bsum_g`, which is subtracted. The integer sums are exact in
// any order; the partial sums of 8 super-blocks are reduced into one vector (block t in
// lane t), and the float formula runs lane-wise with the reference's operations.
//
// The offset trick reads `bsums`: every Q8_K quantiser (ggml-core's, and this level's)
// writes them as the group sums of `qs`, so `Σ (u − off)·y = Σ u·y − off·bsum` exactly.

/// Format tags of the K-quant tiles (const generic parameters).
pub(crate) const KQ2: u8 = 2;
pub(crate) const KQ3: u8 = 3;
pub(crate) const KQ4: u8 = 4;
pub(crate) const KQ5: u8 = 5;
pub(crate) const KQ6: u8 = 6;

/// Bytes of a Q8_K activation block: f32 `d`, 256 i8 `qs`, 16 i16 `bsums`.
pub(crate) const Q8K_BYTES: usize = 292;

/// Bytes of a super-block of format `f`.
pub(crate) const fn kq_bytes(f: u8) -> usize {
    match f {
        KQ2 => 84,
        KQ3 => 110,
        KQ4 => 144,
        KQ5 => 176,
        _ => 210,
    }
}

/// Byte offset of the f16 super-block scale `d` of format `f`.
pub(crate) const fn kq_d_at(f: u8) -> usize {
    match f {
        KQ2 => 80,
        KQ3 => 108,
        KQ6 => 208,
        _ => 0,
    }
}

/// Byte offset of the f16 min scale `dmin` of a format with mins.
pub(crate) const fn kq_dmin_at(f: u8) -> usize {
    match f {
        KQ2 => 82,
        _ => 2,
    }
}

/// Whether format `f` has mins (`x = d·scale·q − dmin·min`).
pub(crate) const fn kq_has_min(f: u8) -> bool {
    matches!(f, KQ2 | KQ4 | KQ5)
}

/// Q4_K/Q5_K's 12 packed 6-bit scales and mins (`reference`'s `scale_min_k4`) as 16
/// bytes: the 8 scales, then the 8 mins (ggml's `utmp` shuffle).
#[inline(always)]
pub(crate) fn k4_scales(sc: &[u8]) -> [u8; 16] {
    const KM1: u32 = 0x3f3f_3f3f;
    const KM2: u32 = 0x0f0f_0f0f;
    const KM3: u32 = 0x0303_0303;
    let w = |i: usize| u32::from_le_bytes([sc[4 * i], sc[4 * i + 1], sc[4 * i + 2], sc[4 * i + 3]]);
    let (u0, u1, u2) = (w(0), w(1), w(2));
    let words = [
        u0 & KM1,
        (u2 & KM2) | (((u0 >> 6) & KM3) << 4),
        u1 & KM1,
        ((u2 >> 4) & KM2) | (((u1 >> 6) & KM3) << 4),
    ];
    let mut out = [0u8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// Q3_K's 12 packed 6-bit scales as the 16 group scales plus 32 (`reference`'s
/// unpacking before its `- 32`).
#[inline(always)]
pub(crate) fn k3_scales(sc: &[u8]) -> [u8; 16] {
    const KM1: u32 = 0x0303_0303;
    const KM2: u32 = 0x0f0f_0f0f;
    let w = |i: usize| u32::from_le_bytes([sc[4 * i], sc[4 * i + 1], sc[4 * i + 2], sc[4 * i + 3]]);
    let (a0, a1, tmp) = (w(0), w(1), w(2));
    let words = [
        (a0 & KM2) | ((tmp & KM1) << 4),
        (a1 & KM2) | (((tmp >> 2) & KM1) << 4),
        ((a0 >> 4) & KM2) | (((tmp >> 4) & KM1) << 4),
        ((a1 >> 4) & KM2) | (((tmp >> 6) & KM1) << 4),
    ];
    let mut out = [0u8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// Dispatches a tile call by its shape `(a.len(), b.len())` to the fixed-shape tile
/// `$gen::<$pre.. NR, NC, $post..>` (full tiles keep their accumulators in registers),
/// and edge tiles to 1 × 1 tiles; every shape performs the same operations per output.
/// Shared by the legacy-quant (`gen`) and K-quant (`kq_tile_gen`) tiles.
macro_rules! by_tile_shape {
    ($gen:ident [$($pre:tt)*] [$($post:tt)*], $k:expr, $a:expr, $b:expr, $out:expr) => {
        match ($a.len(), $b.len()) {
            (4, 4) => $gen::<$($pre)* 4, 4, $($post)*>($k, $a, $b, $out, 0, 0),
            (4, 2) => $gen::<$($pre)* 4, 2, $($post)*>($k, $a, $b, $out, 0, 0),
            (4, 1) => $gen::<$($pre)* 4, 1, $($post)*>($k, $a, $b, $out, 0, 0),
            (2, 4) => $gen::<$($pre)* 2, 4, $($post)*>($k, $a, $b, $out, 0, 0),
            (1, 4) => $gen::<$($pre)* 1, 4, $($post)*>($k, $a, $b, $out, 0, 0),
            (nr, nc) => {
                for r in 0..nr.min(4) {
                    for c in 0..nc.min(4) {
                        let (ar, br) = (&$a[r..r + 1], &$b[c..c + 1]);
                        $gen::<$($pre)* 1, 1, $($post)*>($k, ar, br, $out, r, c);
                    }
                }
            }
        }
    };
}

macro_rules! x86_kquant {
    ($feat:literal) => {
        use crate::simd::x86_kquant::{
            k3_scales, k4_scales, kq_bytes, kq_d_at, kq_dmin_at, kq_has_min, KQ2, KQ3, KQ4, KQ5,
            KQ6, Q8K_BYTES,
        };

        /// A weight super-block unpacked for the integer dots.
        struct KqBlock {
            /// Chunk c: the 32 quants of values 32c.. as u8, without the format's offset.
            q: [__m256i; 8],
            /// Chunk c: group 2c's scale in i16 lanes 0..8, group 2c + 1's in lanes 8..16.
            sc: [__m256i; 8],
            /// The 16 group mins (formats with mins) or `offset·scale_g` (Q3_K, Q6_K), i16.
            aux: __m256i,
        }

        /// Bytes `from..from + 8` of `v` as 16 i16 lanes (sign-extended if `SIGNED`), each
        /// twice: `[b0, b0, b1, b1, ..]`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn kq_dup8<const SIGNED: bool>(v: __m128i, from: i8) -> __m256i {
            let idx = _mm_add_epi8(
                _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                _mm_set1_epi8(from),
            );
            let b = _mm_shuffle_epi8(v, idx);
            if SIGNED {
                _mm256_cvtepi8_epi16(b)
            } else {
                _mm256_cvtepu8_epi16(b)
            }
        }

        /// The chunk scale vectors of [`KqBlock::sc`] from 16 group scales (bytes, i8 if
        /// `SIGNED`): chunk c takes dwords 2c, 2c + 1 of the duplicated scales.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn kq_scales16<const SIGNED: bool>(s: __m128i) -> [__m256i; 8] {
            // SAFETY: same features.
            let dup = unsafe { [kq_dup8::<SIGNED>(s, 0), kq_dup8::<SIGNED>(s, 8)] };
            let mut out = [_mm256_setzero_si256(); 8];
            for (c, o) in out.iter_mut().enumerate() {
                let g = (2 * c % 8) as i32;
                let idx = _mm256_setr_epi32(g, g, g, g, g + 1, g + 1, g + 1, g + 1);
                *o = _mm256_permutevar8x32_epi32(dup[c / 4], idx);
            }
            out
        }

        /// The chunk scale vectors of [`KqBlock::sc`] for one scale per chunk (Q4_K, Q5_K),
        /// from the scales duplicated by [`kq_dup8`]: chunk c is dword c everywhere.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn kq_scales32(dup: __m256i) -> [__m256i; 8] {
            let mut out = [_mm256_setzero_si256(); 8];
            for (c, o) in out.iter_mut().enumerate() {
                *o = _mm256_permutevar8x32_epi32(dup, _mm256_set1_epi32(c as i32));
            }
            out
        }

        /// Bits `from..from + n` of every byte of `v` moved to bits `to..to + n`, the other
        /// bits cleared (one 16-bit shift: the bits it carries across a byte boundary
        /// are cleared for any `from + n, to + n <= 8`).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn kq_bits(v: __m256i, from: i32, to: i32, n: i32) -> __m256i {
            let moved = if from <= to {
                _mm256_sll_epi16(v, _mm_cvtsi32_si128(to - from))
            } else {
                _mm256_srl_epi16(v, _mm_cvtsi32_si128(from - to))
            };
            _mm256_and_si256(moved, _mm256_set1_epi8((((1 << n) - 1) << to) as i8))
        }

        /// Q2_K: scales (low nibble) and mins (high nibble) per group at 0, 2-bit quants
        /// at 16 (value 128h + 32j + l in bits 2j of byte 32h + l).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn kq_unpack_q2(p: *const u8) -> KqBlock {
            let m4 = _mm_set1_epi8(15);
            // SAFETY: a Q2_K block (84 bytes) at p.
            let (s, v) = unsafe {
                (
                    _mm_loadu_si128(p as *const __m128i),
                    [
                        _mm256_loadu_si256(p.add(16) as *const __m256i),
                        _mm256_loadu_si256(p.add(48) as *const __m256i),
                    ],
                )
            };
            let mut q = [_mm256_setzero_si256(); 8];
            for (c, qc) in q.iter_mut().enumerate() {
                // SAFETY: same features.
                *qc = unsafe { kq_bits(v[c / 4], 2 * (c as i32 % 4), 0, 2) };
            }
            KqBlock {
                q,
                // SAFETY: same features.
                sc: unsafe { kq_scales16::<false>(_mm_and_si128(s, m4)) },
                aux: _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m4)),
            }
        }

        /// Q3_K: high-bit mask at 0 (bit 4h + j of byte l), 2-bit quants at 32 (as Q2_K),
        /// packed scales at 96; `u = q + 4`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn kq_unpack_q3(p: *const u8) -> KqBlock {
            // SAFETY: a Q3_K block (110 bytes) at p.
            let (hm, v, sc) = unsafe {
                (
                    _mm256_loadu_si256(p as *const __m256i),
                    [
                        _mm256_loadu_si256(p.add(32) as *const __m256i),
                        _mm256_loadu_si256(p.add(64) as *const __m256i),
                    ],
                    k3_scales(std::slice::from_raw_parts(p.add(96), 12)),
                )
            };
            let mut q = [_mm256_setzero_si256(); 8];
            for (c, qc) in q.iter_mut().enumerate() {
                // SAFETY: same features.
                *qc = unsafe {
                    let lo = kq_bits(v[c / 4], 2 * (c as i32 % 4), 0, 2);
                    _mm256_or_si256(lo, kq_bits(hm, c as i32, 2, 1))
                };
            }
            // SAFETY: 16 bytes.
            let sc = unsafe { _mm_loadu_si128(sc.as_ptr() as *const __m128i) };
            let sc = _mm_sub_epi8(sc, _mm_set1_epi8(32));
            KqBlock {
                q,
                // SAFETY: same features.
                sc: unsafe { kq_scales16::<true>(sc) },
                aux: _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc), 2),
            }
        }

        /// Q4_K (`HIGH` false: nibbles at 16) and Q5_K (nibbles at 48, fifth bits at 16:
        /// bit j of byte l for value 32j + l); packed scales and mins at 4. Value 32j + l
        /// is the low (j even) or high nibble of byte 32(j/2) + l.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn kq_unpack_q45<const HIGH: bool>(p: *const u8) -> KqBlock {
            let m4 = _mm256_set1_epi8(15);
            let qs_at = if HIGH { 48 } else { 16 };
            // SAFETY: a Q4_K (144 bytes) or Q5_K (176 bytes) block at p.
            let (sm, qh) = unsafe {
                let sm = k4_scales(std::slice::from_raw_parts(p.add(4), 12));
                (
                    _mm_loadu_si128(sm.as_ptr() as *const __m128i),
                    if HIGH {
                        _mm256_loadu_si256(p.add(16) as *const __m256i)
                    } else {
                        _mm256_setzero_si256()
                    },
                )
            };
            let mut q = [_mm256_setzero_si256(); 8];
            for i in 0..4 {
                // SAFETY: 32 bytes of the block's quants.
                let v = unsafe { _mm256_loadu_si256(p.add(qs_at + 32 * i) as *const __m256i) };
                q[2 * i] = _mm256_and_si256(v, m4);
                q[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            }
            if HIGH {
                for (j, qj) in q.iter_mut().enumerate() {
                    // SAFETY: same features.
                    *qj = _mm256_or_si256(*qj, unsafe { kq_bits(qh, j as i32, 4, 1) });
                }
            }
            // SAFETY: same features.
            unsafe {
                KqBlock {
                    q,
                    sc: kq_scales32(kq_dup8::<false>(sm, 0)),
                    aux: kq_dup8::<false>(sm, 8),
                }
            }
        }

        /// Q6_K: low nibbles at 0, high 2 bits at 128, i8 scales at 192; value
        /// 128h + 32k + l has the low (k < 2) or high nibble of byte 64h + 32(k & 1) + l
        /// and bits 2k of byte 128 + 32h + l; `u = q + 32`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn kq_unpack_q6(p: *const u8) -> KqBlock {
            let m4 = _mm256_set1_epi8(15);
            let mut q = [_mm256_setzero_si256(); 8];
            for h in 0..2 {
                // SAFETY: a Q6_K block (210 bytes) at p.
                let (l0, l1, hh) = unsafe {
                    (
                        _mm256_loadu_si256(p.add(64 * h) as *const __m256i),
                        _mm256_loadu_si256(p.add(64 * h + 32) as *const __m256i),
                        _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i),
                    )
                };
                let lo = [
                    _mm256_and_si256(l0, m4),
                    _mm256_and_si256(l1, m4),
                    _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                    _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                ];
                for (kk, &lk) in lo.iter().enumerate() {
                    // SAFETY: same features.
                    let hb = unsafe { kq_bits(hh, 2 * kk as i32, 4, 2) };
                    q[4 * h + kk] = _mm256_or_si256(lk, hb);
                }
            }
            // SAFETY: 16 scale bytes at 192.
            let sc = unsafe { _mm_loadu_si128(p.add(192) as *const __m128i) };
            KqBlock {
                q,
                // SAFETY: same features.
                sc: unsafe { kq_scales16::<true>(sc) },
                aux: _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc), 5),
            }
        }

        /// Unpacks a super-block of format `F` at p.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn kq_unpack<const F: u8>(p: *const u8) -> KqBlock {
            // SAFETY: a block of format F at p; same features.
            unsafe {
                match F {
                    KQ2 => kq_unpack_q2(p),
                    KQ3 => kq_unpack_q3(p),
                    KQ4 => kq_unpack_q45::<false>(p),
                    KQ5 => kq_unpack_q45::<true>(p),
                    _ => kq_unpack_q6(p),
                }
            }
        }

        /// The integer dot of an unpacked super-block with the Q8_K block at `y`, as 8
        /// i32 partial sums of `sumi` and (formats with mins) of `summins`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn kq_dot<const F: u8>(x: &KqBlock, y: *const u8) -> (__m256i, __m256i) {
            let mut s = [_mm256_setzero_si256(); 2];
            // SAFETY: a Q8_K block at y: quants at 4, bsums at 260.
            let bs = unsafe {
                for c in 0..8 {
                    let yc = _mm256_loadu_si256(y.add(4 + 32 * c) as *const __m256i);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(x.q[c], yc), x.sc[c]);
                    s[c % 2] = _mm256_add_epi32(s[c % 2], p);
                }
                _mm256_loadu_si256(y.add(260) as *const __m256i)
            };
            let s = _mm256_add_epi32(s[0], s[1]);
            let a = _mm256_madd_epi16(x.aux, bs);
            if kq_has_min(F) {
                (s, a)
            } else {
                (_mm256_sub_epi32(s, a), a)
            }
        }

        /// Lane t: the sum of the 8 lanes of `v[t]`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn kq_hsum8(v: &[__m256i; 8]) -> __m256i {
            let h01 = _mm256_hadd_epi32(v[0], v[1]);
            let h23 = _mm256_hadd_epi32(v[2], v[3]);
            let h45 = _mm256_hadd_epi32(v[4], v[5]);
            let h67 = _mm256_hadd_epi32(v[6], v[7]);
            // Lanes: [v0, v1, v2, v3 sums of lanes 0..4 | the same of lanes 4..8].
            let lo = _mm256_hadd_epi32(h01, h23);
            let hi = _mm256_hadd_epi32(h45, h67);
            _mm256_add_epi32(
                _mm256_permute2x128_si256(lo, hi, 0x20),
                _mm256_permute2x128_si256(lo, hi, 0x31),
            )
        }

        /// Unpacks a weight row of `k` values of format `F` into `out`
        /// (`unpacked_row_bytes(w, k)` bytes): every super-block's [`KqBlock`] (256
        /// quant bytes, the 8 chunk scale vectors, the aux vector), then the blocks' `d`
        /// and then their `dmin` (0 without mins) as f32, each list zero-padded to a
        /// multiple of 8. [`kq_utile`] reads it.
        #[target_feature(enable = $feat)]
        unsafe fn kq_unpack_row<const F: u8>(k: usize, row: &[u8], out: &mut [u8]) {
            let (xb, nb) = (kq_bytes(F), k / 256);
            let npad = 8 * nb.div_ceil(8);
            let ub = crate::simd::UNPACK_KQ_BLOCK;
            assert!(row.len() >= nb * xb);
            assert!(out.len() >= nb * ub + 8 * npad);
            let (blocks, scales) = out.split_at_mut(nb * ub);
            let (d, dmin) = scales[..8 * npad].split_at_mut(4 * npad);
            d.fill(0);
            dmin.fill(0);
            for j in 0..nb {
                // SAFETY: block j < nb of the row and UNPACK_KQ_BLOCK bytes of room for
                // it (lengths asserted); same features.
                unsafe {
                    let p = row.as_ptr().add(j * xb);
                    let x = kq_unpack::<F>(p);
                    let o = blocks.as_mut_ptr().add(j * ub);
                    for (c, v) in x.q.iter().enumerate() {
                        _mm256_storeu_si256(o.add(32 * c) as *mut __m256i, *v);
                    }
                    for (c, v) in x.sc.iter().enumerate() {
                        _mm256_storeu_si256(o.add(256 + 32 * c) as *mut __m256i, *v);
                    }
                    _mm256_storeu_si256(o.add(512) as *mut __m256i, x.aux);
                    let h = |at: usize| {
                        crate::reference::f16_to_f32((p.add(at) as *const u16).read_unaligned())
                    };
                    d[4 * j..4 * j + 4].copy_from_slice(&h(kq_d_at(F)).to_le_bytes());
                    if kq_has_min(F) {
                        dmin[4 * j..4 * j + 4].copy_from_slice(&h(kq_dmin_at(F)).to_le_bytes());
                    }
                }
            }
        }

        /// `NR` weight rows of format `F` against `NC` Q8_K activation rows, into
        /// `out[(r0 + r)·4 + c0 + c]`: raw rows (`PRE` false; each call unpacks them) or
        /// rows from [`kq_unpack_row`] (`PRE`), the same operands either way. In a last
        /// group of fewer than 8 super-blocks the missing lanes add `(0·0)·0 = +0`, which
        /// leaves them as the reference does (a lane that starts at +0 never holds −0).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn kq_tile_gen<const F: u8, const NR: usize, const NC: usize, const PRE: bool>(
            k: usize,
            a: &[&[u8]],
            b: &[&[u8]],
            out: &mut [f32; 16],
            r0: usize,
            c0: usize,
        ) {
            let xb = kq_bytes(F);
            let nb = k / 256;
            let npad = 8 * nb.div_ceil(8);
            let ub = crate::simd::UNPACK_KQ_BLOCK;
            for r in 0..NR {
                if PRE {
                    assert!(a[r].len() >= nb * ub + 8 * npad);
                } else {
                    assert!(a[r].len() >= nb * xb);
                }
            }
            for c in 0..NC {
                assert!(b[c].len() >= nb * Q8K_BYTES);
            }
            let zi = _mm256_setzero_si256();
            let mut acc = [[_mm256_setzero_ps(); NC]; NR];
            for g in 0..nb.div_ceil(8) {
                let cnt = (nb - 8 * g).min(8);
                let mut dy = [_mm256_setzero_ps(); NC];
                for c in 0..NC {
                    let mut d = [0f32; 8];
                    for (t, dt) in d.iter_mut().enumerate().take(cnt) {
                        // SAFETY: block 8g + t < nb of the row (length asserted above).
                        *dt = unsafe {
                            (b[c].as_ptr().add((8 * g + t) * Q8K_BYTES) as *const f32)
                                .read_unaligned()
                        };
                    }
                    // SAFETY: 8 floats.
                    dy[c] = unsafe { _mm256_loadu_ps(d.as_ptr()) };
                }
                for r in 0..NR {
                    let mut si = [[zi; 8]; NC];
                    let mut mi = [[zi; 8]; NC];
                    for t in 0..cnt {
                        // SAFETY: block 8g + t < nb of every row (lengths asserted above);
                        // same features.
                        unsafe {
                            let x = if PRE {
                                let o = a[r].as_ptr().add((8 * g + t) * ub);
                                let ld =
                                    |at: usize| _mm256_loadu_si256(o.add(at) as *const __m256i);
                                KqBlock {
                                    q: core::array::from_fn(|c| ld(32 * c)),
                                    sc: core::array::from_fn(|c| ld(256 + 32 * c)),
                                    aux: ld(512),
                                }
                            } else {
                                kq_unpack::<F>(a[r].as_ptr().add((8 * g + t) * xb))
                            };
                            for c in 0..NC {
                                let y = b[c].as_ptr().add((8 * g + t) * Q8K_BYTES);
                                (si[c][t], mi[c][t]) = kq_dot::<F>(&x, y);
                            }
                        }
                    }
                    // SAFETY: same features; the `cnt` blocks' f16 words, or 8 f32 of the
                    // padded lists (missing blocks are 0 in both).
                    let (dx, dm) = unsafe {
                        if PRE {
                            let s = a[r].as_ptr().add(nb * ub) as *const f32;
                            (
                                _mm256_loadu_ps(s.add(8 * g)),
                                _mm256_loadu_ps(s.add(npad + 8 * g)),
                            )
                        } else {
                            let p = a[r].as_ptr().add(8 * g * xb);
                            (
                                _mm256_cvtph_ps(block_words(p, xb, kq_d_at(F), cnt)),
                                if kq_has_min(F) {
                                    _mm256_cvtph_ps(block_words(p, xb, kq_dmin_at(F), cnt))
                                } else {
                                    _mm256_setzero_ps()
                                },
                            )
                        }
                    };
                    for c in 0..NC {
                        // SAFETY: same features.
                        let sumi = _mm256_cvtepi32_ps(unsafe { kq_hsum8(&si[c]) });
                        let mut v = _mm256_mul_ps(_mm256_mul_ps(dx, dy[c]), sumi);
                        if kq_has_min(F) {
                            // SAFETY: same features.
                            let summ = _mm256_cvtepi32_ps(unsafe { kq_hsum8(&mi[c]) });
                            v = _mm256_sub_ps(v, _mm256_mul_ps(_mm256_mul_ps(dm, dy[c]), summ));
                        }
                        acc[r][c] = _mm256_add_ps(acc[r][c], v);
                    }
                }
            }
            // SAFETY: same features.
            unsafe { store_tile(&acc, out, r0, c0) };
        }

        /// The K-quant tile of format `F` on raw (`PRE` false) or unpacked rows:
        /// dispatches to a tile of fixed shape (as the legacy-quant tiles); every shape
        /// performs the same operations per output.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn kq_shapes<const F: u8, const PRE: bool>(
            k: usize,
            a: &[&[u8]],
            b: &[&[u8]],
            out: &mut [f32; 16],
        ) {
            // SAFETY: same features; shapes match the slices.
            unsafe { by_tile_shape!(kq_tile_gen [F,] [PRE], k, a, b, out) }
        }

        /// The K-quant tile of format `F` on raw weight rows.
        #[target_feature(enable = $feat)]
        unsafe fn kq_tile<const F: u8>(k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]) {
            // SAFETY: same features.
            unsafe { kq_shapes::<F, false>(k, a, b, out) }
        }

        /// The K-quant tile of format `F` on rows from [`kq_unpack_row`].
        #[target_feature(enable = $feat)]
        unsafe fn kq_utile<const F: u8>(k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]) {
            // SAFETY: same features.
            unsafe { kq_shapes::<F, true>(k, a, b, out) }
        }

        /// The K-quant tiles; other dtypes go to the reference.
        #[target_feature(enable = $feat)]
        unsafe fn tile_kquant_imp(
            w: DType,
            k: usize,
            a: &[&[u8]],
            b: &[&[u8]],
            out: &mut [f32; 16],
        ) {
            // SAFETY: same features.
            unsafe {
                match w {
                    DType::Q2K => kq_tile::<KQ2>(k, a, b, out),
                    DType::Q3K => kq_tile::<KQ3>(k, a, b, out),
                    DType::Q4K => kq_tile::<KQ4>(k, a, b, out),
                    DType::Q5K => kq_tile::<KQ5>(k, a, b, out),
                    DType::Q6K => kq_tile::<KQ6>(k, a, b, out),
                    _ => crate::simd::scalar::tile_quant(w, k, a, b, out),
                }
            }
        }
    };
}
