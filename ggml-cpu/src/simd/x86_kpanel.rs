// Outer-product tiles on activation panels (`simd::panel`) for x86: `x86_kpanel!` (AVX-512
// VNNI, 16 columns) and `x86_kpanel_avx2!` (AVX2, 8 columns), each instantiated inside a
// module that also holds `x86_kquant!`'s unpacking (`kq_unpack`).
//
// The reference (`reference::block_value`) per (super-)block j: exact integer dots, then
// the format's float formula (K-quants: `(dx·dy)·sumi`, minus `(dminx·dy)·summins` for
// the formats with mins; legacy: `(dx·dy)·sumi`, plus `mx·sy` for Q4_1/Q5_1), added to
// lane j mod 8; the lanes combine by `reference::tree8`.
//
// Here the lanes of a register are activation columns: every step broadcasts one dword of
// a weight row's unpacked quants (u8, no offset) and runs it against the same dword of
// every column of a panel. On AVX-512 VNNI a step is one `vpdpbusd`, and a group's sum
// meets its scale in one `vpmulld`; on AVX2 a step is `vpmaddubsw` + an i16 add, the i16
// sums run over as many steps as the format's largest quant allows without overflow
// (`span`), and one `vpmaddwd` by the scale (or by 1) widens them to i32. The aux terms
// (mins, or `offset·scale_g` for Q3_K/Q6_K) meet the Q8_K group sums in pairs of i16; a
// legacy format's offset is a shift and a subtraction of the column's quant sum. The
// integers are exact in any order; the float formula then runs per column with the
// reference's operations, each block into its own lane register, and `tree8` becomes
// vertical adds. The tile bodies (`x86_panel_tiles!`) are shared; each level supplies its
// vector types and the few operations that differ.

macro_rules! x86_panel_unpack {
    ($feat:literal) => {
        use crate::simd::panel::{
            KP_AUX_AT, KP_DMIN_AT, KP_D_AT, KP_SB_BYTES, KP_SCALES_AT, LW_BLOCK_BYTES, LW_D_AT,
            LW_M_AT,
        };

        /// Unpacks a weight row of `k` values of format `F` for the panel tiles
        /// (`simd::panel::KP_SB_BYTES` per super-block).
        #[target_feature(enable = $feat)]
        unsafe fn kp_unpack_row<const F: u8>(k: usize, row: &[u8], out: &mut [u8]) {
            let (xb, nb) = (kq_bytes(F), k / 256);
            assert!(row.len() >= nb * xb && out.len() >= nb * KP_SB_BYTES);
            for j in 0..nb {
                // SAFETY: block j < nb of the row and KP_SB_BYTES of room for it (lengths
                // asserted); same features.
                unsafe {
                    let p = row.as_ptr().add(j * xb);
                    let x = kq_unpack::<F>(p);
                    let o = out.as_mut_ptr().add(j * KP_SB_BYTES);
                    for (c, v) in x.q.iter().enumerate() {
                        _mm256_storeu_si256(o.add(32 * c) as *mut __m256i, *v);
                    }
                    // Chunk c's scale vector holds group 2c's scale in i16 lane 0 and
                    // group 2c + 1's in lane 8.
                    let s = o.add(KP_SCALES_AT) as *mut i32;
                    for (c, v) in x.sc.iter().enumerate() {
                        let lo = _mm256_castsi256_si128(*v);
                        let hi = _mm256_extracti128_si256::<1>(*v);
                        s.add(2 * c)
                            .write_unaligned(i32::from(_mm_extract_epi16::<0>(lo) as i16));
                        s.add(2 * c + 1)
                            .write_unaligned(i32::from(_mm_extract_epi16::<0>(hi) as i16));
                    }
                    _mm256_storeu_si256(o.add(KP_AUX_AT) as *mut __m256i, x.aux);
                    let h = |at: usize| {
                        crate::reference::f16_to_f32((p.add(at) as *const u16).read_unaligned())
                    };
                    let dmin = if kq_has_min(F) { h(kq_dmin_at(F)) } else { 0.0 };
                    (o.add(KP_D_AT) as *mut f32).write_unaligned(h(kq_d_at(F)));
                    (o.add(KP_DMIN_AT) as *mut f32).write_unaligned(dmin);
                }
            }
        }

        /// Unpacks a weight row of `k` values of legacy format `w` for the panel tiles
        /// (`simd::panel::LW_BLOCK_BYTES` per block): the 32 quants as u8 in value order,
        /// without the format's offset (Q4_0's 8, Q5_0's 16, Q8_0's −128), then `d` and `m`.
        #[target_feature(enable = $feat)]
        unsafe fn lp_unpack_row(w: DType, k: usize, row: &[u8], out: &mut [u8]) {
            let (xb, nb) = (w.type_size(), k / 32);
            assert!(row.len() >= nb * xb && out.len() >= nb * LW_BLOCK_BYTES);
            let m4 = _mm_set1_epi8(15);
            for j in 0..nb {
                // SAFETY: block j < nb of the row and LW_BLOCK_BYTES of room for it (lengths
                // asserted); same features.
                unsafe {
                    let p = row.as_ptr().add(j * xb);
                    let o = out.as_mut_ptr().add(j * LW_BLOCK_BYTES);
                    let nibbles = |at: usize| {
                        let v = _mm_loadu_si128(p.add(at) as *const __m128i);
                        let lo = _mm_and_si128(v, m4);
                        let hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
                        _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi)
                    };
                    // Bit l of `qh` is the fifth bit of value l: byte l takes byte l / 8 of
                    // `qh`, and 16 where its bit l % 8 is set.
                    let fifth = |at: usize| {
                        let qh = (p.add(at) as *const i32).read_unaligned();
                        let idx = _mm256_setr_epi64x(
                            0,
                            0x0101_0101_0101_0101,
                            0x0202_0202_0202_0202,
                            0x0303_0303_0303_0303,
                        );
                        let b = _mm256_shuffle_epi8(_mm256_set1_epi32(qh), idx);
                        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
                        let set = _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
                        _mm256_and_si256(set, _mm256_set1_epi8(16))
                    };
                    let (q, m) = match w {
                        DType::Q4_0 => (nibbles(2), 0.0),
                        DType::Q4_1 => (nibbles(4), rd_f16p(p, 2)),
                        DType::Q5_0 => (_mm256_or_si256(nibbles(6), fifth(2)), 0.0),
                        DType::Q5_1 => (_mm256_or_si256(nibbles(8), fifth(4)), rd_f16p(p, 2)),
                        DType::Q8_0 => {
                            let v = _mm256_loadu_si256(p.add(2) as *const __m256i);
                            (_mm256_xor_si256(v, _mm256_set1_epi8(-128)), 0.0)
                        }
                        _ => panic!("no legacy panel tiles for {w}"),
                    };
                    _mm256_storeu_si256(o as *mut __m256i, q);
                    (o.add(LW_D_AT) as *mut f32).write_unaligned(rd_f16p(p, 0));
                    (o.add(LW_M_AT) as *mut f32).write_unaligned(m);
                }
            }
        }

        /// The f16 at byte `at` of `p`, as f32.
        #[inline(always)]
        unsafe fn rd_f16p(p: *const u8, at: usize) -> f32 {
            // SAFETY: 2 readable bytes at p + at (caller).
            crate::reference::f16_to_f32(unsafe { (p.add(at) as *const u16).read_unaligned() })
        }

        /// [`kp_unpack_row`] and [`lp_unpack_row`] by dtype.
        fn kp_unpack(w: DType, k: usize, row: &[u8], out: &mut [u8]) {
            // SAFETY: the table holding this entry is installed only where the level's
            // features were detected.
            unsafe {
                match w {
                    DType::Q2K => kp_unpack_row::<KQ2>(k, row, out),
                    DType::Q3K => kp_unpack_row::<KQ3>(k, row, out),
                    DType::Q4K => kp_unpack_row::<KQ4>(k, row, out),
                    DType::Q5K => kp_unpack_row::<KQ5>(k, row, out),
                    DType::Q6K => kp_unpack_row::<KQ6>(k, row, out),
                    _ => lp_unpack_row(w, k, row, out),
                }
            }
        }
    };
}

/// The panel tiles over a level's vector operations, which the invoking macro defines:
/// the types `VI` (i32 lanes) and `VF` (f32 lanes) of `COLS` lanes, `vi_zero`, `vi_load`,
/// `bcast32`, `dot_step` (a step of u8 × i8 dots into the group accumulator), `widen_scaled`
/// (a group accumulator times the i32/i16 scale at a pointer, as i32), `widen` (the same
/// times 1), `madd_acc` (i16 pairs dot, accumulated), `vi_add`, `vi_sub`, `vi_shl`, `vi_cvt`,
/// `vf_zero`, `vf_load`, `vf_set1`, `vf_add`, `vf_sub`, `vf_mul`, `kp_store` (the rows'
/// `lanes_tree8` and the transposed store), `span(umax, group)` (dwords summed before widening), and
/// `Q8_0_PANELS`.
macro_rules! x86_panel_tiles {
    ($feat:literal) => {
        use crate::simd::panel::{
            kpanel_bsum_at, kpanel_d_at, kpanel_sb_bytes, lpanel_block_bytes, lpanel_d_at,
            lpanel_s_at, lpanel_sum_at, Panel, PANEL_ROWS,
        };
        x86_panel_unpack!($feat);

        /// `reference::tree8` of 8 lane registers, lane-wise: ((l0 + l4) + (l2 + l6)) +
        /// ((l1 + l5) + (l3 + l7)).
        #[inline(always)]
        unsafe fn lanes_tree8(l: [VF; 8]) -> VF {
            // SAFETY: the level's features (caller).
            unsafe {
                let a = [
                    vf_add(l[0], l[4]),
                    vf_add(l[1], l[5]),
                    vf_add(l[2], l[6]),
                    vf_add(l[3], l[7]),
                ];
                vf_add(vf_add(a[0], a[2]), vf_add(a[1], a[3]))
            }
        }

        const PANEL_SB_BYTES: usize = kpanel_sb_bytes(COLS);
        const PANEL_D_AT: usize = kpanel_d_at(COLS);
        const PANEL_BSUM_AT: usize = kpanel_bsum_at(COLS);
        const LP_BLOCK_BYTES: usize = lpanel_block_bytes(COLS);
        const LP_D_AT: usize = lpanel_d_at(COLS);
        const LP_S_AT: usize = lpanel_s_at(COLS);
        const LP_SUM_AT: usize = lpanel_sum_at(COLS);

        /// The largest unpacked quant (no offset) of K-quant format `f`, and the dwords of
        /// its scale groups (16 values; Q4_K and Q5_K: 32).
        const fn kq_umax_group(f: u8) -> (usize, usize) {
            match f {
                KQ2 => (3, 4),
                KQ3 => (7, 4),
                KQ4 => (15, 8),
                KQ5 => (31, 8),
                _ => (63, 4),
            }
        }

        /// The reference's 8 lane sums of every row and panel of a tile, `lanes[t][r][p]`
        /// for blocks j ≡ t (mod 8). A lane is written by its first block (`0 + v`, the
        /// reference's first add, so `-0` still turns into `+0`) instead of being zeroed
        /// before the blocks: zeroing 8 · 4 · NP registers in memory every call was a
        /// memset of 2 KiB (4 KiB with AVX-512), about a tenth of an AVX2 tile at K = 576.
        struct Lanes<const NP: usize> {
            sums: core::mem::MaybeUninit<[[[VF; NP]; PANEL_ROWS]; 8]>,
        }

        impl<const NP: usize> Lanes<NP> {
            #[inline]
            fn new() -> Self {
                Self {
                    sums: core::mem::MaybeUninit::uninit(),
                }
            }

            /// Lane `j % 8` of row `r`, panel `p` plus the value `v` of block `j`.
            ///
            /// # Safety
            /// Blocks come in order from 0, each (r, p) once per block; the level's
            /// features.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn add(&mut self, j: usize, r: usize, p: usize, v: VF) {
                let at = (self.sums.as_mut_ptr() as *mut VF)
                    .wrapping_add((j % 8 * PANEL_ROWS + r) * NP + p);
                // SAFETY: `at` lies in `sums` (j % 8 < 8, r < PANEL_ROWS, p < NP); blocks
                // below 8 write their lane before any later block reads it (caller).
                unsafe {
                    let prev = if j < 8 { vf_zero() } else { at.read() };
                    at.write(vf_add(prev, v));
                }
            }

            /// The sums after `nb` blocks: lanes no block reached are zero.
            ///
            /// # Safety
            /// [`Lanes::add`] ran for every (r, p) of blocks `0..nb`; the level's features.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn finish(&mut self, nb: usize) -> &[[[VF; NP]; PANEL_ROWS]; 8] {
                let base = self.sums.as_mut_ptr() as *mut VF;
                for l in nb.min(8)..8 {
                    for i in 0..PANEL_ROWS * NP {
                        // SAFETY: inside `sums`.
                        unsafe { base.add(l * PANEL_ROWS * NP + i).write(vf_zero()) };
                    }
                }
                // SAFETY: lanes below min(nb, 8) were written by `add` (caller), the rest
                // just now.
                unsafe { self.sums.assume_init_ref() }
            }
        }

        /// The 4 unpacked weight rows `w` of format `F` against the `NP` panels `y`, each
        /// of `nb` super-blocks, into `out[(p·COLS + c)·4 + r]`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn kp_tile_gen<const F: u8, const NP: usize>(
            nb: usize,
            w: &[&[u8]; PANEL_ROWS],
            y: &[&[u8]],
            out: &mut [f32; 128],
        ) {
            assert!(y.len() == NP);
            for r in w {
                assert!(r.len() >= nb * KP_SB_BYTES);
            }
            for p in y {
                assert!(p.len() >= nb * PANEL_SB_BYTES);
            }
            let (umax, group) = kq_umax_group(F);
            let steps = span(umax, group);
            let mut lanes = Lanes::<NP>::new();
            for j in 0..nb {
                // SAFETY: super-block j < nb of every row and panel (lengths asserted);
                // same features.
                unsafe {
                    let wp: [*const u8; PANEL_ROWS] =
                        core::array::from_fn(|r| w[r].as_ptr().add(j * KP_SB_BYTES));
                    let yp: [*const u8; NP] =
                        core::array::from_fn(|p| y[p].as_ptr().add(j * PANEL_SB_BYTES));
                    let mut s = [[vi_zero(); NP]; PANEL_ROWS];
                    for g in 0..64 / steps {
                        let mut a = [[vi_zero(); NP]; PANEL_ROWS];
                        for t in 0..steps {
                            let v = g * steps + t;
                            let act: [VI; NP] =
                                core::array::from_fn(|p| vi_load(yp[p].add(4 * COLS * v)));
                            for r in 0..PANEL_ROWS {
                                let q = bcast32(wp[r].add(4 * v));
                                for p in 0..NP {
                                    a[r][p] = dot_step(a[r][p], q, act[p]);
                                }
                            }
                        }
                        // The scale of the group of 16 the steps lie in (stored per 16,
                        // Q4_K's and Q5_K's twice).
                        let gi = g * steps / 4;
                        for r in 0..PANEL_ROWS {
                            let sc = wp[r].add(KP_SCALES_AT + 4 * gi);
                            for p in 0..NP {
                                s[r][p] = vi_add(s[r][p], widen_scaled(a[r][p], sc));
                            }
                        }
                    }
                    let mut m = [[vi_zero(); NP]; PANEL_ROWS];
                    for i in 0..8 {
                        let bs: [VI; NP] = core::array::from_fn(|p| {
                            vi_load(yp[p].add(PANEL_BSUM_AT + 4 * COLS * i))
                        });
                        for r in 0..PANEL_ROWS {
                            let ax = bcast32(wp[r].add(KP_AUX_AT + 4 * i));
                            for p in 0..NP {
                                m[r][p] = madd_acc(m[r][p], ax, bs[p]);
                            }
                        }
                    }
                    let dy: [VF; NP] = core::array::from_fn(|p| vf_load(yp[p].add(PANEL_D_AT)));
                    for r in 0..PANEL_ROWS {
                        let dx = vf_set1(wp[r].add(KP_D_AT));
                        let dm = vf_set1(wp[r].add(KP_DMIN_AT));
                        for p in 0..NP {
                            let v = if kq_has_min(F) {
                                let t = vf_mul(vf_mul(dx, dy[p]), vi_cvt(s[r][p]));
                                let u = vf_mul(vf_mul(dm, dy[p]), vi_cvt(m[r][p]));
                                vf_sub(t, u)
                            } else {
                                let si = vi_sub(s[r][p], m[r][p]);
                                vf_mul(vf_mul(dx, dy[p]), vi_cvt(si))
                            };
                            lanes.add(j, r, p, v);
                        }
                    }
                }
            }
            // SAFETY: same features.
            unsafe { kp_store(lanes.finish(nb), out) };
        }

        /// The 4 unpacked weight rows `w` of a legacy format against the `NP` panels `y`,
        /// each of `nb` blocks, into `out[(p·COLS + c)·4 + r]`. `SHIFT`: log2 of the
        /// format's offset (0: none); `MIN`: the formats with `m` (Q4_1, Q5_1); `UMAX`:
        /// the largest unpacked quant.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn lp_tile_gen<
            const SHIFT: u32,
            const MIN: bool,
            const UMAX: usize,
            const NP: usize,
        >(
            nb: usize,
            w: &[&[u8]; PANEL_ROWS],
            y: &[&[u8]],
            out: &mut [f32; 128],
        ) {
            assert!(y.len() == NP);
            for r in w {
                assert!(r.len() >= nb * LW_BLOCK_BYTES);
            }
            for p in y {
                assert!(p.len() >= nb * LP_BLOCK_BYTES);
            }
            let steps = span(UMAX, 8);
            let mut lanes = Lanes::<NP>::new();
            for j in 0..nb {
                // SAFETY: block j < nb of every row and panel (lengths asserted); same
                // features.
                unsafe {
                    let wp: [*const u8; PANEL_ROWS] =
                        core::array::from_fn(|r| w[r].as_ptr().add(j * LW_BLOCK_BYTES));
                    let yp: [*const u8; NP] =
                        core::array::from_fn(|p| y[p].as_ptr().add(j * LP_BLOCK_BYTES));
                    let mut s = [[vi_zero(); NP]; PANEL_ROWS];
                    for g in 0..8 / steps {
                        let mut a = [[vi_zero(); NP]; PANEL_ROWS];
                        for t in 0..steps {
                            let v = g * steps + t;
                            let act: [VI; NP] =
                                core::array::from_fn(|p| vi_load(yp[p].add(4 * COLS * v)));
                            for r in 0..PANEL_ROWS {
                                let q = bcast32(wp[r].add(4 * v));
                                for p in 0..NP {
                                    a[r][p] = dot_step(a[r][p], q, act[p]);
                                }
                            }
                        }
                        for r in 0..PANEL_ROWS {
                            for p in 0..NP {
                                s[r][p] = vi_add(s[r][p], widen(a[r][p]));
                            }
                        }
                    }
                    // Σ (u − off)·y = Σ u·y − off·Σ y.
                    if SHIFT > 0 {
                        let off: [VI; NP] =
                            core::array::from_fn(|p| vi_shl(vi_load(yp[p].add(LP_SUM_AT)), SHIFT));
                        for r in 0..PANEL_ROWS {
                            for p in 0..NP {
                                s[r][p] = vi_sub(s[r][p], off[p]);
                            }
                        }
                    }
                    let dy: [VF; NP] = core::array::from_fn(|p| vf_load(yp[p].add(LP_D_AT)));
                    let sy: [VF; NP] = core::array::from_fn(|p| vf_load(yp[p].add(LP_S_AT)));
                    for r in 0..PANEL_ROWS {
                        let dx = vf_set1(wp[r].add(LW_D_AT));
                        let mx = vf_set1(wp[r].add(LW_M_AT));
                        for p in 0..NP {
                            let mut v = vf_mul(vf_mul(dx, dy[p]), vi_cvt(s[r][p]));
                            if MIN {
                                v = vf_add(v, vf_mul(mx, sy[p]));
                            }
                            lanes.add(j, r, p, v);
                        }
                    }
                }
            }
            // SAFETY: same features.
            unsafe { kp_store(lanes.finish(nb), out) };
        }

        /// The K-quant panel tile of format `F`: 1 or 2 panels.
        #[target_feature(enable = $feat)]
        unsafe fn kp_tile<const F: u8>(
            k: usize,
            w: &[&[u8]; PANEL_ROWS],
            y: &[&[u8]],
            out: &mut [f32; 128],
        ) {
            // SAFETY: same features.
            unsafe {
                match y.len() {
                    1 => kp_tile_gen::<F, 1>(k / 256, w, y, out),
                    2 => kp_tile_gen::<F, 2>(k / 256, w, y, out),
                    n => panic!("a panel tile takes 1 or 2 panels, not {n}"),
                }
            }
        }

        /// The legacy panel tile of format (`SHIFT`, `MIN`, `UMAX`): 1 or 2 panels.
        #[target_feature(enable = $feat)]
        unsafe fn lp_tile<const SHIFT: u32, const MIN: bool, const UMAX: usize>(
            k: usize,
            w: &[&[u8]; PANEL_ROWS],
            y: &[&[u8]],
            out: &mut [f32; 128],
        ) {
            // SAFETY: same features.
            unsafe {
                match y.len() {
                    1 => lp_tile_gen::<SHIFT, MIN, UMAX, 1>(k / 32, w, y, out),
                    2 => lp_tile_gen::<SHIFT, MIN, UMAX, 2>(k / 32, w, y, out),
                    n => panic!("a panel tile takes 1 or 2 panels, not {n}"),
                }
            }
        }

        /// [`kp_tile`] and [`lp_tile`] by dtype.
        fn kp_tile_dyn(
            w: DType,
            k: usize,
            rows: &[&[u8]; PANEL_ROWS],
            panels: &[&[u8]],
            out: &mut [f32; 128],
        ) {
            // SAFETY: the table holding this entry is installed only where the level's
            // features were detected.
            unsafe {
                match w {
                    DType::Q2K => kp_tile::<KQ2>(k, rows, panels, out),
                    DType::Q3K => kp_tile::<KQ3>(k, rows, panels, out),
                    DType::Q4K => kp_tile::<KQ4>(k, rows, panels, out),
                    DType::Q5K => kp_tile::<KQ5>(k, rows, panels, out),
                    DType::Q6K => kp_tile::<KQ6>(k, rows, panels, out),
                    DType::Q4_0 => lp_tile::<3, false, 15>(k, rows, panels, out),
                    DType::Q4_1 => lp_tile::<0, true, 15>(k, rows, panels, out),
                    DType::Q5_0 => lp_tile::<4, false, 31>(k, rows, panels, out),
                    DType::Q5_1 => lp_tile::<0, true, 31>(k, rows, panels, out),
                    DType::Q8_0 if Q8_0_PANELS => lp_tile::<7, false, 255>(k, rows, panels, out),
                    _ => panic!("no panel tiles for {w}"),
                }
            }
        }

        /// The level's panel tiles: the K-quants and the legacy formats (Q8_0 where
        /// `Q8_0_PANELS`).
        pub(crate) fn panel(w: DType) -> Option<Panel> {
            let fits = match w {
                DType::Q2K | DType::Q3K | DType::Q4K | DType::Q5K | DType::Q6K => true,
                DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 => true,
                DType::Q8_0 => Q8_0_PANELS,
                _ => false,
            };
            fits.then_some(Panel {
                cols: COLS,
                unpack: kp_unpack,
                tile: kp_tile_dyn,
            })
        }
    };
}

/// The AVX-512 VNNI panel tiles: 16 columns (a zmm register), `vpdpbusd` steps.
macro_rules! x86_kpanel {
    ($feat:literal) => {
        /// Columns per panel: the 16 lanes of a zmm register.
        const COLS: usize = 16;
        /// Q8_0's `q + 128` is a valid `vpdpbusd` operand.
        const Q8_0_PANELS: bool = true;
        type VI = __m512i;
        type VF = __m512;

        /// `vpdpbusd` sums in i32, so a whole group runs before its scale.
        const fn span(_umax: usize, group: usize) -> usize {
            group
        }

        #[inline(always)]
        fn vi_zero() -> VI {
            // SAFETY: the level's features (the only callers run with them).
            unsafe { _mm512_setzero_si512() }
        }

        #[inline(always)]
        unsafe fn vi_load(p: *const u8) -> VI {
            // SAFETY: 64 readable bytes at p (caller).
            unsafe { _mm512_loadu_si512(p as *const _) }
        }

        /// The i32 at `p` broadcast to every lane.
        #[inline(always)]
        unsafe fn bcast32(p: *const u8) -> VI {
            // SAFETY: 4 readable bytes at p (caller).
            unsafe { _mm512_set1_epi32((p as *const i32).read_unaligned()) }
        }

        #[inline(always)]
        unsafe fn dot_step(a: VI, q: VI, act: VI) -> VI {
            // SAFETY: the level's features (caller).
            unsafe { _mm512_dpbusd_epi32(a, q, act) }
        }

        #[inline(always)]
        unsafe fn widen_scaled(a: VI, scale: *const u8) -> VI {
            // SAFETY: an i32 scale at `scale` (caller).
            unsafe { _mm512_mullo_epi32(a, bcast32(scale)) }
        }

        #[inline(always)]
        fn widen(a: VI) -> VI {
            a
        }

        #[inline(always)]
        unsafe fn madd_acc(m: VI, ax: VI, bs: VI) -> VI {
            // SAFETY: the level's features (caller).
            unsafe { _mm512_dpwssd_epi32(m, ax, bs) }
        }

        #[inline(always)]
        unsafe fn vi_add(a: VI, b: VI) -> VI {
            // SAFETY: the level's features (caller).
            unsafe { _mm512_add_epi32(a, b) }
        }

        #[inline(always)]
        unsafe fn vi_sub(a: VI, b: VI) -> VI {
            // SAFETY: the level's features (caller).
            unsafe { _mm512_sub_epi32(a, b) }
        }

        #[inline(always)]
        unsafe fn vi_shl(a: VI, n: u32) -> VI {
            // SAFETY: the level's features (caller).
            unsafe { _mm512_sll_epi32(a, _mm_cvtsi32_si128(n as i32)) }
        }

        #[inline(always)]
        unsafe fn vi_cvt(a: VI) -> VF {
            // SAFETY: the level's features (caller).
            unsafe { _mm512_cvtepi32_ps(a) }
        }

        #[inline(always)]
        fn vf_zero() -> VF {
            // SAFETY: the level's features (the only callers run with them).
            unsafe { _mm512_setzero_ps() }
        }

        #[inline(always)]
        unsafe fn vf_load(p: *const u8) -> VF {
            // SAFETY: 64 readable bytes at p (caller).
            unsafe { _mm512_loadu_ps(p as *const f32) }
        }

        /// The f32 at `p` broadcast to every lane.
        #[inline(always)]
        unsafe fn vf_set1(p: *const u8) -> VF {
            // SAFETY: 4 readable bytes at p (caller).
            unsafe { _mm512_set1_ps((p as *const f32).read_unaligned()) }
        }

        #[inline(always)]
        unsafe fn vf_add(a: VF, b: VF) -> VF {
            // SAFETY: the level's features (caller).
            unsafe { _mm512_add_ps(a, b) }
        }

        #[inline(always)]
        unsafe fn vf_sub(a: VF, b: VF) -> VF {
            // SAFETY: the level's features (caller).
            unsafe { _mm512_sub_ps(a, b) }
        }

        #[inline(always)]
        unsafe fn vf_mul(a: VF, b: VF) -> VF {
            // SAFETY: the level's features (caller).
            unsafe { _mm512_mul_ps(a, b) }
        }

        /// `reference::tree8` of every row's and panel's 8 lane registers, lane-wise, into
        /// `out[(p·16 + c)·4 + r]` (each column's 4 rows adjacent, as in the destination).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn kp_store<const NP: usize>(
            lanes: &[[[__m512; NP]; PANEL_ROWS]; 8],
            out: &mut [f32; 128],
        ) {
            for p in 0..NP {
                let row: [__m512; PANEL_ROWS] = core::array::from_fn(|r| {
                    // SAFETY: the level's features (this function's).
                    unsafe { lanes_tree8(core::array::from_fn(|t| lanes[t][r][p])) }
                });
                // Transposed: within each 128-bit block first (c_k's block L is column
                // 4L + k), then the blocks (o_L: columns 4L..4L + 4).
                let t0 = _mm512_unpacklo_ps(row[0], row[1]);
                let t1 = _mm512_unpackhi_ps(row[0], row[1]);
                let t2 = _mm512_unpacklo_ps(row[2], row[3]);
                let t3 = _mm512_unpackhi_ps(row[2], row[3]);
                let c0 = _mm512_shuffle_ps::<0x44>(t0, t2);
                let c1 = _mm512_shuffle_ps::<0xEE>(t0, t2);
                let c2 = _mm512_shuffle_ps::<0x44>(t1, t3);
                let c3 = _mm512_shuffle_ps::<0xEE>(t1, t3);
                let u0 = _mm512_shuffle_f32x4::<0x44>(c0, c1);
                let u1 = _mm512_shuffle_f32x4::<0xEE>(c0, c1);
                let u2 = _mm512_shuffle_f32x4::<0x44>(c2, c3);
                let u3 = _mm512_shuffle_f32x4::<0xEE>(c2, c3);
                let o = [
                    _mm512_shuffle_f32x4::<0x88>(u0, u2),
                    _mm512_shuffle_f32x4::<0xDD>(u0, u2),
                    _mm512_shuffle_f32x4::<0x88>(u1, u3),
                    _mm512_shuffle_f32x4::<0xDD>(u1, u3),
                ];
                for (l, v) in o.iter().enumerate() {
                    // SAFETY: 16 floats of out at 64p + 16l ≤ 112.
                    unsafe { _mm512_storeu_ps(out[64 * p + 16 * l..].as_mut_ptr(), *v) };
                }
            }
        }

        x86_panel_tiles!($feat);
    };
}

/// The AVX2 panel tiles: 8 columns (a ymm register). Without VNNI a step is a
/// `vpmaddubsw` (u8 weights × i8 activations, pairs summed into i16) and an i16 add.
/// Q8_0 weights (u = q + 128 would saturate `vpmaddubsw`) have no AVX2 panel tiles.
macro_rules! x86_kpanel_avx2 {
    ($feat:literal) => {
        /// Columns per panel: the 8 lanes of a ymm register.
        const COLS: usize = 8;
        const Q8_0_PANELS: bool = false;
        type VI = __m256i;
        type VF = __m256;

        /// Dwords of quants summed in i16 lanes before widening, for a largest weight
        /// quant `umax`: each lane gathers 2 products of at most `umax·128` per step, and
        /// `2·steps·umax·128` stays below 2^15 (at most a group: 16 values, 32 for
        /// Q4_K/Q5_K). Never below 1 (Q8_0, which no step count fits, has no tiles here).
        const fn span(umax: usize, group: usize) -> usize {
            let mut s = group;
            while s > 1 && 2 * s * umax * 128 > 32767 {
                s /= 2;
            }
            s
        }

        #[inline(always)]
        fn vi_zero() -> VI {
            // SAFETY: the level's features (the only callers run with them).
            unsafe { _mm256_setzero_si256() }
        }

        #[inline(always)]
        unsafe fn vi_load(p: *const u8) -> VI {
            // SAFETY: 32 readable bytes at p (caller).
            unsafe { _mm256_loadu_si256(p as *const _) }
        }

        /// The i32 at `p` broadcast to every lane.
        #[inline(always)]
        unsafe fn bcast32(p: *const u8) -> VI {
            // SAFETY: 4 readable bytes at p (caller).
            unsafe { _mm256_set1_epi32((p as *const i32).read_unaligned()) }
        }

        #[inline(always)]
        unsafe fn dot_step(a: VI, q: VI, act: VI) -> VI {
            // SAFETY: the level's features (caller).
            unsafe { _mm256_add_epi16(a, _mm256_maddubs_epi16(q, act)) }
        }

        /// The i16 sums times the scale at `scale` (an i32 whose low half is the i16),
        /// pairs added into i32.
        #[inline(always)]
        unsafe fn widen_scaled(a: VI, scale: *const u8) -> VI {
            // SAFETY: 2 readable bytes at `scale` (caller).
            unsafe {
                _mm256_madd_epi16(a, _mm256_set1_epi16((scale as *const i16).read_unaligned()))
            }
        }

        #[inline(always)]
        unsafe fn widen(a: VI) -> VI {
            // SAFETY: the level's features (caller).
            unsafe { _mm256_madd_epi16(a, _mm256_set1_epi16(1)) }
        }

        #[inline(always)]
        unsafe fn madd_acc(m: VI, ax: VI, bs: VI) -> VI {
            // SAFETY: the level's features (caller).
            unsafe { _mm256_add_epi32(m, _mm256_madd_epi16(ax, bs)) }
        }

        #[inline(always)]
        unsafe fn vi_add(a: VI, b: VI) -> VI {
            // SAFETY: the level's features (caller).
            unsafe { _mm256_add_epi32(a, b) }
        }

        #[inline(always)]
        unsafe fn vi_sub(a: VI, b: VI) -> VI {
            // SAFETY: the level's features (caller).
            unsafe { _mm256_sub_epi32(a, b) }
        }

        #[inline(always)]
        unsafe fn vi_shl(a: VI, n: u32) -> VI {
            // SAFETY: the level's features (caller).
            unsafe { _mm256_sll_epi32(a, _mm_cvtsi32_si128(n as i32)) }
        }

        #[inline(always)]
        unsafe fn vi_cvt(a: VI) -> VF {
            // SAFETY: the level's features (caller).
            unsafe { _mm256_cvtepi32_ps(a) }
        }

        #[inline(always)]
        fn vf_zero() -> VF {
            // SAFETY: the level's features (the only callers run with them).
            unsafe { _mm256_setzero_ps() }
        }

        #[inline(always)]
        unsafe fn vf_load(p: *const u8) -> VF {
            // SAFETY: 32 readable bytes at p (caller).
            unsafe { _mm256_loadu_ps(p as *const f32) }
        }

        /// The f32 at `p` broadcast to every lane.
        #[inline(always)]
        unsafe fn vf_set1(p: *const u8) -> VF {
            // SAFETY: 4 readable bytes at p (caller).
            unsafe { _mm256_set1_ps((p as *const f32).read_unaligned()) }
        }

        #[inline(always)]
        unsafe fn vf_add(a: VF, b: VF) -> VF {
            // SAFETY: the level's features (caller).
            unsafe { _mm256_add_ps(a, b) }
        }

        #[inline(always)]
        unsafe fn vf_sub(a: VF, b: VF) -> VF {
            // SAFETY: the level's features (caller).
            unsafe { _mm256_sub_ps(a, b) }
        }

        #[inline(always)]
        unsafe fn vf_mul(a: VF, b: VF) -> VF {
            // SAFETY: the level's features (caller).
            unsafe { _mm256_mul_ps(a, b) }
        }

        /// `reference::tree8` of every row's and panel's 8 lane registers, lane-wise, into
        /// `out[(p·8 + c)·4 + r]` (each column's 4 rows adjacent, as in the destination).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn kp_store<const NP: usize>(
            lanes: &[[[__m256; NP]; PANEL_ROWS]; 8],
            out: &mut [f32; 128],
        ) {
            for p in 0..NP {
                let row: [__m256; PANEL_ROWS] = core::array::from_fn(|r| {
                    // SAFETY: the level's features (this function's).
                    unsafe { lanes_tree8(core::array::from_fn(|t| lanes[t][r][p])) }
                });
                // Transposed within each 128-bit half (c_k's half L is column 4L + k),
                // then the halves paired (o_l: columns 2l, 2l + 1).
                let t0 = _mm256_unpacklo_ps(row[0], row[1]);
                let t1 = _mm256_unpackhi_ps(row[0], row[1]);
                let t2 = _mm256_unpacklo_ps(row[2], row[3]);
                let t3 = _mm256_unpackhi_ps(row[2], row[3]);
                let c0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                let c1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
                let c2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                let c3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
                let o = [
                    _mm256_permute2f128_ps::<0x20>(c0, c1),
                    _mm256_permute2f128_ps::<0x20>(c2, c3),
                    _mm256_permute2f128_ps::<0x31>(c0, c1),
                    _mm256_permute2f128_ps::<0x31>(c2, c3),
                ];
                for (l, v) in o.iter().enumerate() {
                    // SAFETY: 8 floats of out at 32p + 8l ≤ 56.
                    unsafe { _mm256_storeu_ps(out[32 * p + 8 * l..].as_mut_ptr(), *v) };
                }
            }
        }

        x86_panel_tiles!($feat);
    };
}
