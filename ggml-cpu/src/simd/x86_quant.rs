// Quantised mul_mat tiles and activation quantisers for x86, instantiated by `avx2.rs`
// (maddubs + madd integer dots) and `avx512.rs` (VNNI `vpdpbusd` on 256-bit vectors).
//
// Tile structure: blocks are processed 8 at a time. Each weight row's 8 blocks are
// unpacked once into 32 u8/i8 values per block; for every (weight row, activation row)
// pair the 8 exact integer block dots are reduced into one vector (block t in lane t),
// converted to f32, and the format's float formula is applied lane-wise with the same
// operations as `reference::block_value`; lane t accumulates blocks j ≡ t (mod 8), and
// the 8 lanes are combined by `reference::tree8`. The K-quant tiles are in
// `x86_kquant.rs`.

/// How a packed activation group (`simd::PACK_GROUP` bytes, 8 blocks) orders its 256
/// bytes of quants (`x86_quant!`'s `pack_act_imp`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum QuantOrder {
    /// Dword i of block t in lane t of vector i: the tiles'.
    Transposed,
    /// Block after block, 32 bytes each: the AVX-512 matrix × vector kernels'.
    Natural,
    /// Vector 2i holds elements 0..16 of blocks i and i + 4 (one 128-bit half each),
    /// vector 2i + 1 their elements 16..32: the AVX2 matrix × vector kernels'.
    Paired,
}

macro_rules! x86_quant {
    ($feat:literal, $dot_u:ident, $dot_s:ident, $q8_bias:expr) => {
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn unpack_nibbles(p: *const u8) -> __m256i {
            // SAFETY: 16 readable bytes at p (inside the block).
            let q = unsafe { _mm_loadu_si128(p as *const __m128i) };
            let m = _mm_set1_epi8(15);
            let lo = _mm_and_si128(q, m);
            let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
            _mm256_set_m128i(hi, lo)
        }

        /// The f16 words at byte `at` of `cnt` (at most 8) blocks of `xb` bytes from `p`,
        /// zero past them, straight into a register: 8 short stores and a wide reload
        /// stalled on store forwarding.
        ///
        /// # Safety
        /// The `cnt` words are readable.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn block_words(p: *const u8, xb: usize, at: usize, cnt: usize) -> __m128i {
            let w = |t: usize| -> i16 {
                if t < cnt {
                    // SAFETY: caller's contract.
                    unsafe { (p.add(t * xb + at) as *const i16).read_unaligned() }
                } else {
                    0
                }
            };
            _mm_setr_epi16(w(0), w(1), w(2), w(3), w(4), w(5), w(6), w(7))
        }

        /// Byte e is 16 where bit e of the 32-bit word at p is set, else 0.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn bits32(p: *const u8) -> __m256i {
            // SAFETY: 4 readable bytes at p (inside the block).
            let x = unsafe { (p as *const i32).read_unaligned() };
            let shuf = _mm256_set_epi64x(
                0x0303_0303_0303_0303,
                0x0202_0202_0202_0202,
                0x0101_0101_0101_0101,
                0,
            );
            let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x), shuf);
            let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
            let set = _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
            _mm256_and_si256(set, _mm256_set1_epi8(16))
        }

        // Unpacked weight blocks: 32 u8 quants without their format's offset (Q4_0's 8
        // and Q5_0's 16 are subtracted as `bias · Σy` afterwards), and Q8_0's as
        // `unpack_q8_0` says.

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn unpack_q4_0(p: *const u8) -> __m256i {
            // SAFETY: a Q4_0 block at p.
            unsafe { unpack_nibbles(p.add(2)) }
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn unpack_q4_1(p: *const u8) -> __m256i {
            // SAFETY: a Q4_1 block at p.
            unsafe { unpack_nibbles(p.add(4)) }
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn unpack_q5_0(p: *const u8) -> __m256i {
            // SAFETY: a Q5_0 block at p.
            unsafe { _mm256_or_si256(unpack_nibbles(p.add(6)), bits32(p.add(2))) }
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn unpack_q5_1(p: *const u8) -> __m256i {
            // SAFETY: a Q5_1 block at p.
            unsafe { _mm256_or_si256(unpack_nibbles(p.add(8)), bits32(p.add(4))) }
        }

        /// A Q8_0 block's quants: raw i8 (`$q8_bias` 0, for [`dot_q8`]'s signed dot), or
        /// offset to u8 by flipping the top bit (`$q8_bias` 128: `q + 128`, subtracted as
        /// `128·Σy` afterwards), where the level's unsigned dot does not saturate.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn unpack_q8_0(p: *const u8) -> __m256i {
            // SAFETY: a Q8_0 block at p.
            let q = unsafe { _mm256_loadu_si256(p.add(2) as *const __m256i) };
            if $q8_bias == 0 {
                q
            } else {
                _mm256_xor_si256(q, _mm256_set1_epi8(-128))
            }
        }

        /// The dot step of Q8_0's quants as [`unpack_q8_0`] leaves them.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn dot_q8(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
            // SAFETY: same features.
            unsafe {
                if $q8_bias == 0 {
                    $dot_s(acc, x, y)
                } else {
                    $dot_u(acc, x, y)
                }
            }
        }

        /// Transposes 8 × 8 dwords: afterwards `v[i]` lane t holds dword i of input t.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn transpose8(v: &mut [__m256i; 8]) {
            let t0 = _mm256_unpacklo_epi32(v[0], v[1]);
            let t1 = _mm256_unpackhi_epi32(v[0], v[1]);
            let t2 = _mm256_unpacklo_epi32(v[2], v[3]);
            let t3 = _mm256_unpackhi_epi32(v[2], v[3]);
            let t4 = _mm256_unpacklo_epi32(v[4], v[5]);
            let t5 = _mm256_unpackhi_epi32(v[4], v[5]);
            let t6 = _mm256_unpacklo_epi32(v[6], v[7]);
            let t7 = _mm256_unpackhi_epi32(v[6], v[7]);
            let u0 = _mm256_unpacklo_epi64(t0, t2);
            let u1 = _mm256_unpackhi_epi64(t0, t2);
            let u2 = _mm256_unpacklo_epi64(t1, t3);
            let u3 = _mm256_unpackhi_epi64(t1, t3);
            let u4 = _mm256_unpacklo_epi64(t4, t6);
            let u5 = _mm256_unpackhi_epi64(t4, t6);
            let u6 = _mm256_unpacklo_epi64(t5, t7);
            let u7 = _mm256_unpackhi_epi64(t5, t7);
            v[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
            v[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
            v[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
            v[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
            v[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
            v[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
            v[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
            v[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
        }

        quant_tile!(q4_0, $feat, 18, unpack_q4_0, 8, $dot_u, false);
        quant_tile!(q4_1, $feat, 20, unpack_q4_1, 0, $dot_u, true);
        quant_tile!(q5_0, $feat, 22, unpack_q5_0, 16, $dot_u, false);
        quant_tile!(q5_1, $feat, 24, unpack_q5_1, 0, $dot_u, true);
        quant_tile!(q8_0, $feat, 34, unpack_q8_0, $q8_bias, dot_q8, false);

        x86_kquant!($feat);

        pub(crate) fn tile_quant(
            w: DType,
            k: usize,
            a: &[&[u8]],
            b: &[&[u8]],
            out: &mut [f32; 16],
        ) {
            // SAFETY: this table is installed only when its features were detected.
            unsafe {
                match w {
                    DType::Q4_0 => q4_0::tile(k, a, b, out),
                    DType::Q4_1 => q4_1::tile(k, a, b, out),
                    DType::Q5_0 => q5_0::tile(k, a, b, out),
                    DType::Q5_1 => q5_1::tile(k, a, b, out),
                    DType::Q8_0 => q8_0::tile(k, a, b, out),
                    _ => tile_kquant_imp(w, k, a, b, out),
                }
            }
        }

        /// Weight rows unpacked once for all the activation columns of a chunk (the
        /// legacy formats but Q8_0, and the K-quants), with the tile that reads them.
        pub(crate) fn unpacked(w: DType) -> Option<crate::simd::Unpacked> {
            fn unpack(w: DType, k: usize, row: &[u8], out: &mut [u8]) {
                // SAFETY: this table is installed only when its features were detected.
                unsafe {
                    match w {
                        DType::Q4_0 => q4_0::unpack_row(k, row, out),
                        DType::Q4_1 => q4_1::unpack_row(k, row, out),
                        DType::Q5_0 => q5_0::unpack_row(k, row, out),
                        DType::Q5_1 => q5_1::unpack_row(k, row, out),
                        DType::Q8_0 => q8_0::unpack_row(k, row, out),
                        DType::Q2K => kq_unpack_row::<KQ2>(k, row, out),
                        DType::Q3K => kq_unpack_row::<KQ3>(k, row, out),
                        DType::Q4K => kq_unpack_row::<KQ4>(k, row, out),
                        DType::Q5K => kq_unpack_row::<KQ5>(k, row, out),
                        DType::Q6K => kq_unpack_row::<KQ6>(k, row, out),
                        _ => unreachable!("only offered for the formats above"),
                    }
                }
            }
            fn tile(w: DType, k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]) {
                // SAFETY: this table is installed only when its features were detected.
                unsafe {
                    match w {
                        DType::Q4_0 => q4_0::utile(k, a, b, out),
                        DType::Q4_1 => q4_1::utile(k, a, b, out),
                        DType::Q5_0 => q5_0::utile(k, a, b, out),
                        DType::Q5_1 => q5_1::utile(k, a, b, out),
                        DType::Q8_0 => q8_0::utile(k, a, b, out),
                        DType::Q2K => kq_utile::<KQ2>(k, a, b, out),
                        DType::Q3K => kq_utile::<KQ3>(k, a, b, out),
                        DType::Q4K => kq_utile::<KQ4>(k, a, b, out),
                        DType::Q5K => kq_utile::<KQ5>(k, a, b, out),
                        DType::Q6K => kq_utile::<KQ6>(k, a, b, out),
                        _ => unreachable!("only offered for the formats above"),
                    }
                }
            }
            // Q8_0 only where its quants are offset to unsigned: raw, they need no
            // unpacking, and the copy made the signed tiles 8–11 % slower (criterion,
            // 512 × 576 × 1536 and 512 × 14336 × 4096).
            let q8 = $q8_bias != 0 && w == DType::Q8_0;
            (q8 || matches!(
                w,
                DType::Q4_0
                    | DType::Q4_1
                    | DType::Q5_0
                    | DType::Q5_1
                    | DType::Q2K
                    | DType::Q3K
                    | DType::Q4K
                    | DType::Q5K
                    | DType::Q6K
            ))
            .then_some(crate::simd::Unpacked { unpack, tile })
        }

        /// Each accumulator's 8 lanes summed as the reference sums them (`tree8`) into the
        /// tile's outputs at row `r0 + r`, column `c0 + c`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn store_tile<const NR: usize, const NC: usize>(
            acc: &[[__m256; NC]; NR],
            out: &mut [f32; 16],
            r0: usize,
            c0: usize,
        ) {
            // Eight accumulators at a time, transposed so that vector i holds their lane
            // i: the adds of `tree8` then run lane-wise, accumulator t in lane t.
            let n = NR * NC;
            let mut i = 0;
            while i < n {
                let m = (n - i).min(8);
                let mut v = [_mm256_setzero_si256(); 8];
                for (t, vt) in v.iter_mut().enumerate().take(m) {
                    *vt = _mm256_castps_si256(acc[(i + t) / NC][(i + t) % NC]);
                }
                // SAFETY: same features.
                unsafe { transpose8(&mut v) };
                let l = |j: usize| _mm256_castsi256_ps(v[j]);
                let s0 = _mm256_add_ps(l(0), l(4));
                let s1 = _mm256_add_ps(l(1), l(5));
                let s2 = _mm256_add_ps(l(2), l(6));
                let s3 = _mm256_add_ps(l(3), l(7));
                let sum = _mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s1, s3));
                let mut lanes = [0f32; 8];
                // SAFETY: 8 floats of room.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
                for (t, &x) in lanes.iter().enumerate().take(m) {
                    let (r, c) = ((i + t) / NC, (i + t) % NC);
                    out[(r0 + r) * 4 + c0 + c] = x;
                }
                i += 8;
            }
        }

        /// Horizontal max of 8 lanes (order-free for non-NaN values).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn hmax8(m: __m256) -> f32 {
            let m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
            let m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0x4E));
            let m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0xB1));
            _mm256_cvtss_f32(m)
        }

        /// `roundf` (half away from zero) of integral-range values, exactly.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn round_away(t: __m256) -> __m256 {
            let sign = _mm256_set1_ps(-0.0);
            let tr = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(t, tr));
            let ge = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5), _CMP_GE_OQ);
            let one = _mm256_or_ps(_mm256_and_ps(t, sign), _mm256_set1_ps(1.0));
            _mm256_add_ps(tr, _mm256_and_ps(ge, one))
        }

        /// Packs 4 × 8 i32 (each in i8 range) into 32 i8 in order.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn pack32(v: [__m256i; 4]) -> __m256i {
            let a = _mm256_packs_epi32(v[0], v[1]);
            let b = _mm256_packs_epi32(v[2], v[3]);
            let c = _mm256_packs_epi16(a, b);
            _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
        }

        /// One block of 32 values as ggml's Q8_0/Q8_1 reference quantisers: the f32 scale
        /// `d` (before f16 rounding), the 32 i8 quants, and their sum.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn q8_block(xb: &[f32]) -> (f32, __m256i, i32) {
            assert!(xb.len() >= 32);
            let sign = _mm256_set1_ps(-0.0);
            // SAFETY: 32 floats in xb (asserted).
            let v = unsafe {
                [
                    _mm256_loadu_ps(xb.as_ptr()),
                    _mm256_loadu_ps(xb.as_ptr().add(8)),
                    _mm256_loadu_ps(xb.as_ptr().add(16)),
                    _mm256_loadu_ps(xb.as_ptr().add(24)),
                ]
            };
            let m01 = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
            let m23 = _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]));
            // SAFETY: same features.
            let amax = unsafe { hmax8(_mm256_max_ps(m01, m23)) };
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let idv = _mm256_set1_ps(id);
            let mut qi = [_mm256_setzero_si256(); 4];
            let indefinite = _mm256_set1_epi32(i32::MIN);
            for i in 0..4 {
                // SAFETY: same features.
                let q = _mm256_cvtps_epi32(unsafe { round_away(_mm256_mul_ps(v[i], idv)) });
                // Out of range (x·id infinite when 1/d overflows) or NaN: C's (int) gives
                // INT_MIN, whose low byte, the reference's i8, is 0 (the packs below would
                // saturate it to -128).
                qi[i] = _mm256_andnot_si256(_mm256_cmpeq_epi32(q, indefinite), q);
            }
            let s = _mm256_add_epi32(
                _mm256_add_epi32(qi[0], qi[1]),
                _mm256_add_epi32(qi[2], qi[3]),
            );
            let mut l = [0i32; 8];
            // SAFETY: 8 i32 of room; same features.
            unsafe { _mm256_storeu_si256(l.as_mut_ptr() as *mut __m256i, s) };
            // SAFETY: same features.
            (d, unsafe { pack32(qi) }, l.iter().sum())
        }

        /// Q8_0 (`with_sum` false) or Q8_1 blocks, as ggml's reference quantisers.
        #[target_feature(enable = $feat)]
        unsafe fn quantize_q8_01(x: &[f32], out: &mut [u8], with_sum: bool) {
            let (bs, qoff) = if with_sum { (36, 4) } else { (34, 2) };
            for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(bs)) {
                // SAFETY: same features.
                let (d, q, sum) = unsafe { q8_block(xb) };
                ob[0..2].copy_from_slice(&crate::reference::f32_to_f16(d).to_le_bytes());
                if with_sum {
                    let s = crate::reference::f32_to_f16(sum as f32 * d);
                    ob[2..4].copy_from_slice(&s.to_le_bytes());
                }
                // SAFETY: 32 bytes of room at qoff.
                unsafe { _mm256_storeu_si256(ob.as_mut_ptr().add(qoff) as *mut __m256i, q) };
            }
        }

        /// Packs an activation row for the legacy-quant kernels ([`super::PACK_GROUP`]
        /// bytes per 8 blocks): the Q8_0/Q8_1 quants in `order` (the tiles': transposed,
        /// so that dword i of block t is lane t of vector i), then per block the f32
        /// values of the f16-rounded `d` and `s = d·Σq` (as the reference reads them) and
        /// `Σq` as i32. Missing blocks of the last group are zero.
        #[target_feature(enable = $feat)]
        unsafe fn pack_act_imp(
            x: &[f32],
            out: &mut [u8],
            order: crate::simd::x86_quant::QuantOrder,
        ) {
            use crate::reference::{f16_to_f32, f32_to_f16};
            use crate::simd::x86_quant::QuantOrder;
            let nb = x.len() / 32;
            assert!(out.len() >= nb.div_ceil(8) * crate::simd::PACK_GROUP);
            for (g, og) in out
                .chunks_exact_mut(crate::simd::PACK_GROUP)
                .take(nb.div_ceil(8))
                .enumerate()
            {
                let mut q = [_mm256_setzero_si256(); 8];
                let (mut d, mut s, mut sy) = ([0f32; 8], [0f32; 8], [0i32; 8]);
                for t in 0..(nb - 8 * g).min(8) {
                    let j = 8 * g + t;
                    // SAFETY: same features.
                    let (dd, qq, sum) = unsafe { q8_block(&x[32 * j..32 * j + 32]) };
                    q[t] = qq;
                    d[t] = f16_to_f32(f32_to_f16(dd));
                    s[t] = f16_to_f32(f32_to_f16(sum as f32 * dd));
                    sy[t] = sum;
                }
                // SAFETY: same features; the group has 352 bytes of room (asserted).
                unsafe {
                    match order {
                        QuantOrder::Transposed => transpose8(&mut q),
                        QuantOrder::Natural => {}
                        QuantOrder::Paired => {
                            let b = q;
                            for i in 0..4 {
                                q[2 * i] = _mm256_permute2x128_si256::<0x20>(b[i], b[i + 4]);
                                q[2 * i + 1] = _mm256_permute2x128_si256::<0x31>(b[i], b[i + 4]);
                            }
                        }
                    }
                    let p = og.as_mut_ptr();
                    for (i, v) in q.iter().enumerate() {
                        _mm256_storeu_si256(p.add(32 * i) as *mut __m256i, *v);
                    }
                    _mm256_storeu_ps(p.add(256) as *mut f32, _mm256_loadu_ps(d.as_ptr()));
                    _mm256_storeu_ps(p.add(288) as *mut f32, _mm256_loadu_ps(s.as_ptr()));
                    _mm256_storeu_si256(
                        p.add(320) as *mut __m256i,
                        _mm256_loadu_si256(sy.as_ptr() as *const __m256i),
                    );
                }
            }
        }

        pub(crate) fn pack(w: DType) -> Option<crate::simd::Packer> {
            fn pack_act(x: &[f32], out: &mut [u8]) {
                // SAFETY: this table is installed only when its features were detected.
                unsafe { pack_act_imp(x, out, crate::simd::x86_quant::QuantOrder::Transposed) }
            }
            matches!(
                w,
                DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0
            )
            .then_some(crate::simd::Packer {
                row_bytes: crate::simd::packed_row_bytes,
                pack: pack_act,
            })
        }

        /// Packs an activation row like [`pack`]'s packer, with the quants of each block
        /// in order instead of transposed.
        #[allow(dead_code)] // only levels with a gemv kernel use it
        pub(crate) fn pack_natural(x: &[f32], out: &mut [u8]) {
            // SAFETY: this table is installed only when its features were detected.
            unsafe { pack_act_imp(x, out, crate::simd::x86_quant::QuantOrder::Natural) }
        }

        /// Packs an activation row like [`pack`]'s packer, with the quants in
        /// [`QuantOrder::Paired`] order.
        #[allow(dead_code)] // only the AVX2 matrix × vector kernels use it
        pub(crate) fn pack_paired(x: &[f32], out: &mut [u8]) {
            // SAFETY: this table is installed only when its features were detected.
            unsafe { pack_act_imp(x, out, crate::simd::x86_quant::QuantOrder::Paired) }
        }

        /// Q8_K blocks, as ggml's `quantize_row_q8_K_ref`.
        #[target_feature(enable = $feat)]
        unsafe fn quantize_q8k(x: &[f32], out: &mut [u8]) {
            let sign = _mm256_set1_ps(-0.0);
            for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact_mut(292)) {
                let mut m = _mm256_setzero_ps();
                for c in xb.chunks_exact(8) {
                    // SAFETY: 8 floats.
                    m = _mm256_max_ps(
                        m,
                        _mm256_andnot_ps(sign, unsafe { _mm256_loadu_ps(c.as_ptr()) }),
                    );
                }
                // SAFETY: same features.
                let amax = unsafe { hmax8(m) };
                if amax == 0.0 {
                    ob.fill(0);
                    continue;
                }
                let max = xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
                let iscale = -127.0 / max;
                let iv = _mm256_set1_ps(iscale);
                let cap = _mm256_set1_epi32(127);
                for g in 0..8 {
                    let mut qi = [_mm256_setzero_si256(); 4];
                    for i in 0..4 {
                        // SAFETY: 8 floats at 32g + 8i.
                        let v = unsafe { _mm256_loadu_ps(xb.as_ptr().add(32 * g + 8 * i)) };
                        qi[i] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(iv, v)), cap);
                    }
                    for h in 0..2 {
                        let s = _mm256_add_epi32(qi[2 * h], qi[2 * h + 1]);
                        let mut l = [0i32; 8];
                        // SAFETY: 8 i32 of room.
                        unsafe { _mm256_storeu_si256(l.as_mut_ptr() as *mut __m256i, s) };
                        let bsum = l.iter().sum::<i32>() as i16;
                        let at = 260 + 2 * (2 * g + h);
                        ob[at..at + 2].copy_from_slice(&bsum.to_le_bytes());
                    }
                    // SAFETY: same features; 32 bytes of room.
                    unsafe {
                        let packed = pack32(qi);
                        _mm256_storeu_si256(
                            ob.as_mut_ptr().add(4 + 32 * g) as *mut __m256i,
                            packed,
                        );
                    }
                }
                ob[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
            }
        }

        pub(crate) fn quantize(d: DType, x: &[f32], out: &mut [u8]) {
            // SAFETY: this table is installed only when its features were detected.
            unsafe {
                match d {
                    DType::Q8_0 => quantize_q8_01(x, out, false),
                    DType::Q8_1 => quantize_q8_01(x, out, true),
                    DType::Q8K => quantize_q8k(x, out),
                    _ => crate::simd::scalar::quantize(d, x, out),
                }
            }
        }
    };
}

macro_rules! quant_tile {
    ($m:ident, $feat:literal, $xb:expr, $unpack:ident, $bias:expr, $dot:ident, $min:expr) => {
        /// The tiles of one legacy format (blocks of `$xb` bytes).
        mod $m {
            use super::*;

            /// Group `g` of a weight row as the tile multiplies it: the 8 blocks'
            /// unpacked quants transposed like the activations (missing blocks of the
            /// last group are zero), and the blocks' `d` and `m` (0 without a minimum)
            /// as f32.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn group(row: &[u8], g: usize, nb: usize) -> ([__m256i; 8], __m256, __m256) {
                let cnt = (nb - 8 * g).min(8);
                let mut x = [_mm256_setzero_si256(); 8];
                for (t, xt) in x.iter_mut().enumerate().take(cnt) {
                    // SAFETY: block 8g + t < nb of the row (the callers assert the
                    // row's length).
                    *xt = unsafe { $unpack(row.as_ptr().add((8 * g + t) * $xb)) };
                }
                let p = row.as_ptr().wrapping_add(8 * g * $xb);
                // SAFETY (the words): blocks 8g .. 8g + cnt of the row (as above).
                // SAFETY: same features.
                unsafe {
                    transpose8(&mut x);
                    (
                        x,
                        _mm256_cvtph_ps(block_words(p, $xb, 0, cnt)),
                        if $min {
                            _mm256_cvtph_ps(block_words(p, $xb, 2, cnt))
                        } else {
                            _mm256_setzero_ps()
                        },
                    )
                }
            }

            /// Unpacks a weight row of `k` values into `out` (`unpacked_row_bytes(w, k)`
            /// bytes): per group, the 256 bytes of [`group`]'s quants, then its 8 `d` and
            /// 8 `m` as f32. [`utile`] reads it.
            #[allow(dead_code)] // Q8_0's is offered only with unsigned quants
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn unpack_row(k: usize, row: &[u8], out: &mut [u8]) {
                let nb = k / 32;
                let ng = nb.div_ceil(8);
                assert!(row.len() >= nb * $xb);
                assert!(out.len() >= ng * crate::simd::UNPACK_GROUP);
                for g in 0..ng {
                    // SAFETY: same features; the group has UNPACK_GROUP bytes of room
                    // (asserted).
                    unsafe {
                        let (x, dx, mx) = group(row, g, nb);
                        let o = out.as_mut_ptr().add(g * crate::simd::UNPACK_GROUP);
                        for (i, v) in x.iter().enumerate() {
                            _mm256_storeu_si256(o.add(32 * i) as *mut __m256i, *v);
                        }
                        _mm256_storeu_ps(o.add(256) as *mut f32, dx);
                        _mm256_storeu_ps(o.add(288) as *mut f32, mx);
                    }
                }
            }

            /// Group `g` of a weight row as [`group`] gives it: from the raw row, or
            /// (`PRE`) from a row of [`unpack_row`].
            ///
            /// # Safety
            /// The row holds group `g` (of `nb` blocks) in its layout.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn row_group<const PRE: bool>(
                row: &[u8],
                g: usize,
                nb: usize,
            ) -> ([__m256i; 8], __m256, __m256) {
                // SAFETY: caller's contract; same features.
                unsafe {
                    if PRE {
                        let p = row.as_ptr().add(g * crate::simd::UNPACK_GROUP);
                        let mut x = [_mm256_setzero_si256(); 8];
                        for (i, v) in x.iter_mut().enumerate() {
                            *v = _mm256_loadu_si256(p.add(32 * i) as *const __m256i);
                        }
                        (
                            x,
                            _mm256_loadu_ps(p.add(256) as *const f32),
                            _mm256_loadu_ps(p.add(288) as *const f32),
                        )
                    } else {
                        group(row, g, nb)
                    }
                }
            }

            /// One group's value against one packed activation group at `yp`: 8 integer
            /// dot steps leave block t's exact dot in lane t, `bias·Σy` is subtracted,
            /// then the format's float formula runs lane-wise as `reference::block_value`.
            ///
            /// # Safety
            /// A packed activation group (`PACK_GROUP` bytes) at `yp`.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn col<const SPLIT: bool>(
                x: &[__m256i; 8],
                dx: __m256,
                mx: __m256,
                yp: *const u8,
            ) -> __m256 {
                // SAFETY: caller's contract; same features.
                unsafe {
                    // With `SPLIT`, two chains of dot steps (exact integer sums, any
                    // order): in a one-column tile one row's groups follow each other and
                    // the chain's latency shows; in wider tiles the extra registers spill.
                    let mut s2 = [_mm256_setzero_si256(); 2];
                    for (i, xi) in x.iter().enumerate() {
                        let y = _mm256_loadu_si256(yp.add(32 * i) as *const __m256i);
                        let h = if SPLIT { i % 2 } else { 0 };
                        s2[h] = $dot(s2[h], *xi, y);
                    }
                    let mut s = if SPLIT {
                        _mm256_add_epi32(s2[0], s2[1])
                    } else {
                        s2[0]
                    };
                    if $bias != 0 {
                        // bias · Σy as a shift: the biases are powers of two.
                        let sy = _mm256_loadu_si256(yp.add(320) as *const __m256i);
                        s = _mm256_sub_epi32(
                            s,
                            _mm256_slli_epi32(sy, ($bias as u32).trailing_zeros() as i32),
                        );
                    }
                    let dy = _mm256_loadu_ps(yp.add(256) as *const f32);
                    let v = _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(s));
                    if $min {
                        let sy = _mm256_loadu_ps(yp.add(288) as *const f32);
                        _mm256_add_ps(v, _mm256_mul_ps(mx, sy))
                    } else {
                        v
                    }
                }
            }

            /// `NR` weight rows against `NC` packed activation rows: raw rows (`PRE`
            /// false; each call unpacks them) or rows from [`unpack_row`] (`PRE`). Per
            /// group of 8 blocks, 8 integer dot steps leave block t's exact dot in lane
            /// t with no horizontal reduction; then `bias·Σy` is subtracted and the
            /// format's float formula runs lane-wise exactly as
            /// `reference::block_value`. Both sources give the same operands, so the
            /// same bits.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn gen<const NR: usize, const NC: usize, const PRE: bool>(
                k: usize,
                a: &[&[u8]],
                b: &[&[u8]],
                out: &mut [f32; 16],
                r0: usize,
                c0: usize,
            ) {
                let nb = k / 32;
                let ng = nb.div_ceil(8);
                let zero = _mm256_setzero_ps();
                let mut acc = [[zero; NC]; NR];
                for r in 0..NR {
                    if PRE {
                        assert!(a[r].len() >= ng * crate::simd::UNPACK_GROUP);
                    } else {
                        assert!(a[r].len() >= nb * $xb);
                    }
                }
                for c in 0..NC {
                    assert!(b[c].len() >= ng * crate::simd::PACK_GROUP);
                }
                let yp = |c: usize, g: usize| -> *const u8 {
                    b[c].as_ptr().wrapping_add(g * crate::simd::PACK_GROUP)
                };
                if NC == 1 {
                    // One column: row by row, so that a row's accumulator is a register.
                    for (r, acc_r) in acc.iter_mut().enumerate() {
                        let mut ar = [zero; NC];
                        for g in 0..ng {
                            // SAFETY: group g of the row and of the packed column (lengths
                            // asserted above); same features.
                            unsafe {
                                let (x, dx, mx) = row_group::<PRE>(a[r], g, nb);
                                ar[0] = _mm256_add_ps(ar[0], col::<true>(&x, dx, mx, yp(0, g)));
                            }
                        }
                        *acc_r = ar;
                    }
                } else {
                    // Several columns: group by group, each row's group unpacked once for
                    // all of them. Either order adds each output's groups in order.
                    for g in 0..ng {
                        for r in 0..NR {
                            // SAFETY: as above.
                            unsafe {
                                let (x, dx, mx) = row_group::<PRE>(a[r], g, nb);
                                for c in 0..NC {
                                    let v = col::<false>(&x, dx, mx, yp(c, g));
                                    acc[r][c] = _mm256_add_ps(acc[r][c], v);
                                }
                            }
                        }
                    }
                }
                // SAFETY: same features.
                unsafe { store_tile(&acc, out, r0, c0) };
            }

            /// Dispatches to a tile of fixed shape (full tiles keep their accumulators
            /// in registers); every shape performs the same operations per output
            /// element.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn shapes<const PRE: bool>(
                k: usize,
                a: &[&[u8]],
                b: &[&[u8]],
                out: &mut [f32; 16],
            ) {
                // SAFETY: same features; shapes match the slices.
                unsafe { by_tile_shape!(gen [] [PRE], k, a, b, out) }
            }

            /// The tile on raw weight rows.
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn tile(k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]) {
                // SAFETY: same features.
                unsafe { shapes::<false>(k, a, b, out) }
            }

            /// The tile on rows from [`unpack_row`].
            #[allow(dead_code)] // Q8_0's is offered only with unsigned quants
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn utile(k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]) {
                // SAFETY: same features.
                unsafe { shapes::<true>(k, a, b, out) }
            }
        }
    };
}
