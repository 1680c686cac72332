// Quantised mul_mat tiles and activation quantisers for x86, instantiated by `avx2.rs`
// (maddubs + madd integer dots) and `avx512.rs` (VNNI `vpdpbusd` on 256-bit vectors).
//
// Tile structure: blocks are processed 8 at a time. Each weight row's 8 blocks are
// unpacked once into 32 u8/i8 values per block; for every (weight row, activation row)
// pair the 8 exact integer block dots are reduced into one vector (block t in lane t),
// converted to f32, and the format's float formula is applied lane-wise with the same
// operations as `reference::block_value`; lane t accumulates blocks j ≡ t (mod 8), and
// the 8 lanes are combined by `reference::tree8`.

macro_rules! x86_quant {
    ($feat:literal, $dot_u:ident, $dot_s:ident) => {
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

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn unpack_q4_0(p: *const u8) -> __m256i {
            // SAFETY: a Q4_0 block at p.
            _mm256_sub_epi8(unsafe { unpack_nibbles(p.add(2)) }, _mm256_set1_epi8(8))
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
            let q = unsafe { _mm256_or_si256(unpack_nibbles(p.add(6)), bits32(p.add(2))) };
            _mm256_sub_epi8(q, _mm256_set1_epi8(16))
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn unpack_q5_1(p: *const u8) -> __m256i {
            // SAFETY: a Q5_1 block at p.
            unsafe { _mm256_or_si256(unpack_nibbles(p.add(8)), bits32(p.add(4))) }
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn unpack_q8_0(p: *const u8) -> __m256i {
            // SAFETY: a Q8_0 block at p.
            unsafe { _mm256_loadu_si256(p.add(2) as *const __m256i) }
        }

        /// Lane t of the result = sum of the 8 lanes of `p[t]`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn reduce8(p: &[__m256i; 8]) -> __m256i {
            let h01 = _mm256_hadd_epi32(p[0], p[1]);
            let h23 = _mm256_hadd_epi32(p[2], p[3]);
            let h45 = _mm256_hadd_epi32(p[4], p[5]);
            let h67 = _mm256_hadd_epi32(p[6], p[7]);
            let q0 = _mm256_hadd_epi32(h01, h23);
            let q1 = _mm256_hadd_epi32(h45, h67);
            let lo = _mm256_permute2x128_si256(q0, q1, 0x20);
            let hi = _mm256_permute2x128_si256(q0, q1, 0x31);
            _mm256_add_epi32(lo, hi)
        }

        quant_tile!(tile_q4_0_imp, tile_q4_0_gen, $feat, 18, 34, 2, unpack_q4_0, $dot_s, false);
        quant_tile!(tile_q4_1_imp, tile_q4_1_gen, $feat, 20, 36, 4, unpack_q4_1, $dot_u, true);
        quant_tile!(tile_q5_0_imp, tile_q5_0_gen, $feat, 22, 34, 2, unpack_q5_0, $dot_s, false);
        quant_tile!(tile_q5_1_imp, tile_q5_1_gen, $feat, 24, 36, 4, unpack_q5_1, $dot_u, true);
        quant_tile!(tile_q8_0_imp, tile_q8_0_gen, $feat, 34, 34, 2, unpack_q8_0, $dot_s, false);

        /// K-quants: the reference code compiled with this level's features (its
        /// integer loops vectorise; its float operations are the reference's).
        #[target_feature(enable = $feat)]
        unsafe fn tile_kquant_imp(
            w: DType,
            k: usize,
            a: &[&[u8]],
            b: &[&[u8]],
            out: &mut [f32; 16],
        ) {
            crate::simd::scalar::tile_quant(w, k, a, b, out)
        }

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
                    DType::Q4_0 => tile_q4_0_imp(k, a, b, out),
                    DType::Q4_1 => tile_q4_1_imp(k, a, b, out),
                    DType::Q5_0 => tile_q5_0_imp(k, a, b, out),
                    DType::Q5_1 => tile_q5_1_imp(k, a, b, out),
                    DType::Q8_0 => tile_q8_0_imp(k, a, b, out),
                    _ => tile_kquant_imp(w, k, a, b, out),
                }
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

        /// Q8_0 (`with_sum` false) or Q8_1 blocks, as ggml's reference quantisers.
        #[target_feature(enable = $feat)]
        unsafe fn quantize_q8_01(x: &[f32], out: &mut [u8], with_sum: bool) {
            let (bs, qoff) = if with_sum { (36, 4) } else { (34, 2) };
            let sign = _mm256_set1_ps(-0.0);
            for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(bs)) {
                // SAFETY: 32 floats in xb.
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
                for i in 0..4 {
                    // SAFETY: same features.
                    qi[i] = _mm256_cvtps_epi32(unsafe { round_away(_mm256_mul_ps(v[i], idv)) });
                }
                ob[0..2].copy_from_slice(&crate::reference::f32_to_f16(d).to_le_bytes());
                if with_sum {
                    let s = _mm256_add_epi32(
                        _mm256_add_epi32(qi[0], qi[1]),
                        _mm256_add_epi32(qi[2], qi[3]),
                    );
                    let mut l = [0i32; 8];
                    // SAFETY: 8 i32 of room.
                    unsafe { _mm256_storeu_si256(l.as_mut_ptr() as *mut __m256i, s) };
                    let sum: i32 = l.iter().sum();
                    ob[2..4].copy_from_slice(
                        &crate::reference::f32_to_f16(sum as f32 * d).to_le_bytes(),
                    );
                }
                // SAFETY: same features; 32 bytes of room at qoff.
                unsafe {
                    let packed = pack32(qi);
                    _mm256_storeu_si256(ob.as_mut_ptr().add(qoff) as *mut __m256i, packed);
                }
            }
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
    ($name:ident, $gen:ident, $feat:literal, $xb:expr, $yb:expr, $yoff:expr, $unpack:ident, $dot:ident, $min:expr) => {
        quant_tile_body!($gen, $feat, $xb, $yb, $yoff, $unpack, $dot, $min);

        /// Dispatches to a tile of fixed shape (full tiles keep everything in registers);
        /// every shape performs the same operations per output element.
        #[target_feature(enable = $feat)]
        unsafe fn $name(k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]) {
            // SAFETY: same features; shapes match the slices.
            unsafe {
                match (a.len(), b.len()) {
                    (4, 4) => $gen::<4, 4>(k, a, b, out, 0, 0),
                    (4, 2) => $gen::<4, 2>(k, a, b, out, 0, 0),
                    (4, 1) => $gen::<4, 1>(k, a, b, out, 0, 0),
                    (2, 4) => $gen::<2, 4>(k, a, b, out, 0, 0),
                    (1, 4) => $gen::<1, 4>(k, a, b, out, 0, 0),
                    (nr, nc) => {
                        for r in 0..nr.min(4) {
                            for c in 0..nc.min(4) {
                                $gen::<1, 1>(k, &a[r..r + 1], &b[c..c + 1], out, r, c);
                            }
                        }
                    }
                }
            }
        }
    };
}

macro_rules! quant_tile_body {
    ($gen:ident, $feat:literal, $xb:expr, $yb:expr, $yoff:expr, $unpack:ident, $dot:ident, $min:expr) => {
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn $gen<const NR: usize, const NC: usize>(
            k: usize,
            a: &[&[u8]],
            b: &[&[u8]],
            out: &mut [f32; 16],
            r0: usize,
            c0: usize,
        ) {
            let nb = k / 32;
            let (nr, nc) = (NR, NC);
            let zero = _mm256_setzero_ps();
            let mut acc = [[zero; NC]; NR];
            let mut xs = [[_mm256_setzero_si256(); 8]; NR];
            let mut j = 0;
            while j < nb {
                let cnt = (nb - j).min(8);
                let mut dx = [zero; NR];
                let mut mx = [zero; NR];
                for r in 0..nr {
                    assert!(a[r].len() >= nb * $xb);
                    let mut d16 = [0u16; 8];
                    let mut m16 = [0u16; 8];
                    for t in 0..cnt {
                        // SAFETY: block j + t < nb of the row (length asserted above).
                        unsafe {
                            let p = a[r].as_ptr().add((j + t) * $xb);
                            d16[t] = (p as *const u16).read_unaligned();
                            if $min {
                                m16[t] = (p.add(2) as *const u16).read_unaligned();
                            }
                            xs[r][t] = $unpack(p);
                        }
                    }
                    // SAFETY: 8 u16 each.
                    unsafe {
                        dx[r] = _mm256_cvtph_ps(_mm_loadu_si128(d16.as_ptr() as *const __m128i));
                        if $min {
                            mx[r] =
                                _mm256_cvtph_ps(_mm_loadu_si128(m16.as_ptr() as *const __m128i));
                        }
                    }
                }
                let mut dy = [zero; NC];
                let mut sy = [zero; NC];
                for c in 0..nc {
                    assert!(b[c].len() >= nb * $yb);
                    let mut d16 = [0u16; 8];
                    let mut s16 = [0u16; 8];
                    for t in 0..cnt {
                        // SAFETY: block j + t < nb of the row (length asserted above).
                        unsafe {
                            let p = b[c].as_ptr().add((j + t) * $yb);
                            d16[t] = (p as *const u16).read_unaligned();
                            if $min {
                                s16[t] = (p.add(2) as *const u16).read_unaligned();
                            }
                        }
                    }
                    // SAFETY: 8 u16 each.
                    unsafe {
                        dy[c] = _mm256_cvtph_ps(_mm_loadu_si128(d16.as_ptr() as *const __m128i));
                        if $min {
                            sy[c] =
                                _mm256_cvtph_ps(_mm_loadu_si128(s16.as_ptr() as *const __m128i));
                        }
                    }
                }
                for r in 0..nr {
                    for c in 0..nc {
                        let mut p = [_mm256_setzero_si256(); 8];
                        // SAFETY: blocks j..j+cnt of the activation row (asserted above);
                        // same features.
                        unsafe {
                            let yb = b[c].as_ptr().add(j * $yb + $yoff);
                            if cnt == 8 {
                                for t in 0..8 {
                                    let y = _mm256_loadu_si256(yb.add(t * $yb) as *const __m256i);
                                    p[t] = $dot(xs[r][t], y);
                                }
                            } else {
                                for t in 0..cnt {
                                    let y = _mm256_loadu_si256(yb.add(t * $yb) as *const __m256i);
                                    p[t] = $dot(xs[r][t], y);
                                }
                            }
                            let s = reduce8(&p);
                            let mut v =
                                _mm256_mul_ps(_mm256_mul_ps(dx[r], dy[c]), _mm256_cvtepi32_ps(s));
                            if $min {
                                v = _mm256_add_ps(v, _mm256_mul_ps(mx[r], sy[c]));
                            }
                            acc[r][c] = _mm256_add_ps(acc[r][c], v);
                        }
                    }
                }
                j += 8;
            }
            for r in 0..nr {
                for c in 0..nc {
                    let mut l = [0f32; 8];
                    // SAFETY: 8 floats of room.
                    unsafe { _mm256_storeu_ps(l.as_mut_ptr(), acc[r][c]) };
                    out[(r0 + r) * 4 + c0 + c] = crate::reference::tree8(l);
                }
            }
        }
    };
}
