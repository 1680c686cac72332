// Outer-product K-quant tiles for AVX-512 VNNI, instantiated by `x86_kpanel!` inside a
// module that also holds `x86_kquant!`'s unpacking (`kq_unpack`).
//
// The reference (`reference::block_value`) per super-block j of 256 values: the exact
// integers `sumi = Σ_g scale_g·Σ_{16} q·y` and `summins = Σ_g min_g·bsum_g`, then
// `(dx·dy)·sumi`, minus `(dminx·dy)·summins` for the formats with mins, added to lane
// j mod 8; the lanes combine by `reference::tree8`.
//
// Here the 16 lanes of a register are 16 activation columns (a panel, `simd::panel`):
// every step broadcasts one dword of a weight row's unpacked quants (u8, no offset) and
// runs one `vpdpbusd` against the same dword of 16 columns, so a group's partial dot of
// 16 columns takes 4 (8 for Q4_K/Q5_K's groups of 32) instructions, and its scale one
// `vpmulld`. The aux terms (mins, or `offset·scale_g` for Q3_K/Q6_K) meet the group sums
// in 8 `vpdpwssd`. The integers are exact in any order; the float formula then runs
// per column with the reference's operations, each super-block into its own register
// of 8 lane registers, and `tree8` becomes vertical adds.

macro_rules! x86_kpanel {
    ($feat:literal) => {
        use crate::simd::panel::{
            kp_row_bytes, Panel, KP_AUX_AT, KP_DMIN_AT, KP_D_AT, KP_SB_BYTES, KP_SCALES_AT,
            PANEL_BSUM_AT, PANEL_D_AT, PANEL_ROWS, PANEL_SB_BYTES,
        };

        /// Unpacks a weight row of `k` values of format `F` for the panel tiles
        /// (`simd::panel::KP_SB_BYTES` per super-block).
        #[target_feature(enable = $feat)]
        unsafe fn kp_unpack_row<const F: u8>(k: usize, row: &[u8], out: &mut [u8]) {
            let (xb, nb) = (kq_bytes(F), k / 256);
            assert!(row.len() >= nb * xb && out.len() >= kp_row_bytes(k));
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

        /// Reads the i32 at `p` broadcast to 16 lanes.
        #[inline(always)]
        unsafe fn kp_bcast(p: *const u8) -> __m512i {
            // SAFETY: 4 readable bytes at p (caller).
            _mm512_set1_epi32(unsafe { (p as *const i32).read_unaligned() })
        }

        /// The 4 unpacked weight rows `w` of format `F` against the `NP` panels `y`, each
        /// of `nb` super-blocks, into `out[(r·2 + p)·16 + c]`.
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
            // Dwords of quants per scale group: 16 values, or 32 for Q4_K/Q5_K.
            let steps = if matches!(F, KQ4 | KQ5) { 8 } else { 4 };
            let zi = _mm512_setzero_si512();
            let mut lanes = [[[_mm512_setzero_ps(); NP]; PANEL_ROWS]; 8];
            for j in 0..nb {
                // SAFETY: super-block j < nb of every row and panel (lengths asserted);
                // same features.
                unsafe {
                    let wp: [*const u8; PANEL_ROWS] =
                        core::array::from_fn(|r| w[r].as_ptr().add(j * KP_SB_BYTES));
                    let yp: [*const u8; NP] =
                        core::array::from_fn(|p| y[p].as_ptr().add(j * PANEL_SB_BYTES));
                    let mut s = [[zi; NP]; PANEL_ROWS];
                    for g in 0..64 / steps {
                        let mut a = [[zi; NP]; PANEL_ROWS];
                        for t in 0..steps {
                            let v = g * steps + t;
                            let act: [__m512i; NP] = core::array::from_fn(|p| {
                                _mm512_loadu_si512(yp[p].add(64 * v) as *const _)
                            });
                            for r in 0..PANEL_ROWS {
                                let q = kp_bcast(wp[r].add(4 * v));
                                for p in 0..NP {
                                    a[r][p] = _mm512_dpbusd_epi32(a[r][p], q, act[p]);
                                }
                            }
                        }
                        // Q4_K/Q5_K: groups 2g and 2g + 1 share their chunk's scale.
                        let gi = if steps == 8 { 2 * g } else { g };
                        for r in 0..PANEL_ROWS {
                            let sc = kp_bcast(wp[r].add(KP_SCALES_AT + 4 * gi));
                            for p in 0..NP {
                                s[r][p] =
                                    _mm512_add_epi32(s[r][p], _mm512_mullo_epi32(a[r][p], sc));
                            }
                        }
                    }
                    let mut m = [[zi; NP]; PANEL_ROWS];
                    for i in 0..8 {
                        let bs: [__m512i; NP] = core::array::from_fn(|p| {
                            _mm512_loadu_si512(yp[p].add(PANEL_BSUM_AT + 64 * i) as *const _)
                        });
                        for r in 0..PANEL_ROWS {
                            let ax = kp_bcast(wp[r].add(KP_AUX_AT + 4 * i));
                            for p in 0..NP {
                                m[r][p] = _mm512_dpwssd_epi32(m[r][p], ax, bs[p]);
                            }
                        }
                    }
                    let dy: [__m512; NP] = core::array::from_fn(|p| {
                        _mm512_loadu_ps(yp[p].add(PANEL_D_AT) as *const f32)
                    });
                    let lane = &mut lanes[j % 8];
                    for r in 0..PANEL_ROWS {
                        let dx =
                            _mm512_set1_ps((wp[r].add(KP_D_AT) as *const f32).read_unaligned());
                        let dm =
                            _mm512_set1_ps((wp[r].add(KP_DMIN_AT) as *const f32).read_unaligned());
                        for p in 0..NP {
                            let v = if kq_has_min(F) {
                                let t = _mm512_mul_ps(
                                    _mm512_mul_ps(dx, dy[p]),
                                    _mm512_cvtepi32_ps(s[r][p]),
                                );
                                let u = _mm512_mul_ps(
                                    _mm512_mul_ps(dm, dy[p]),
                                    _mm512_cvtepi32_ps(m[r][p]),
                                );
                                _mm512_sub_ps(t, u)
                            } else {
                                let si = _mm512_sub_epi32(s[r][p], m[r][p]);
                                _mm512_mul_ps(_mm512_mul_ps(dx, dy[p]), _mm512_cvtepi32_ps(si))
                            };
                            lane[r][p] = _mm512_add_ps(lane[r][p], v);
                        }
                    }
                }
            }
            for r in 0..PANEL_ROWS {
                for p in 0..NP {
                    // `reference::tree8`, lane-wise.
                    let l = |t: usize| lanes[t][r][p];
                    let a = [
                        _mm512_add_ps(l(0), l(4)),
                        _mm512_add_ps(l(1), l(5)),
                        _mm512_add_ps(l(2), l(6)),
                        _mm512_add_ps(l(3), l(7)),
                    ];
                    let b = [_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3])];
                    let o = out[(r * 2 + p) * 16..].as_mut_ptr();
                    // SAFETY: 16 floats of out at (r·2 + p)·16 ≤ 112.
                    unsafe { _mm512_storeu_ps(o, _mm512_add_ps(b[0], b[1])) };
                }
            }
        }

        /// The panel tile of format `F`: 1 or 2 panels.
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

        /// [`kp_unpack_row`] by dtype.
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
                    _ => panic!("no panel tiles for {w}"),
                }
            }
        }

        /// [`kp_tile`] by dtype.
        fn kp_tile_dyn(
            w: DType,
            k: usize,
            rows: &[&[u8]; PANEL_ROWS],
            panels: &[&[u8]],
            out: &mut [f32; 128],
        ) {
            // SAFETY: as `kp_unpack`.
            unsafe {
                match w {
                    DType::Q2K => kp_tile::<KQ2>(k, rows, panels, out),
                    DType::Q3K => kp_tile::<KQ3>(k, rows, panels, out),
                    DType::Q4K => kp_tile::<KQ4>(k, rows, panels, out),
                    DType::Q5K => kp_tile::<KQ5>(k, rows, panels, out),
                    DType::Q6K => kp_tile::<KQ6>(k, rows, panels, out),
                    _ => panic!("no panel tiles for {w}"),
                }
            }
        }

        /// The level's panel tiles: the K-quants.
        pub(crate) fn panel(w: DType) -> Option<Panel> {
            matches!(
                w,
                DType::Q2K | DType::Q3K | DType::Q4K | DType::Q5K | DType::Q6K
            )
            .then_some(Panel {
                unpack: kp_unpack,
                tile: kp_tile_dyn,
            })
        }
    };
}
