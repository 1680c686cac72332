//! AVX-512 (F, BW, VL, DQ) levels: 16-lane f32 kernels in one zmm register (exactly the
//! reference's 16 lanes), quantised tiles from the AVX2 level or, with VNNI, `vpdpbusd`.

use std::arch::x86_64::*;

use ggml_core::DType;

use super::{Kernels, MmTile};
use crate::isa::Isa;
use crate::reference as r;

pub(crate) static KERNELS: Kernels = Kernels {
    gemv: super::avx2::KERNELS.gemv,
    panel: super::avx2::KERNELS.panel,
    ..kernels_table!(
        Isa::Avx512,
        heads: Some(dots_f16_heads),
        quantize: super::avx2::KERNELS.quantize,
        mm: mm,
        pack: super::avx2::KERNELS.pack,
        unpacked: super::avx2::KERNELS.unpacked,
    )
};

pub(crate) static KERNELS_VNNI: Kernels = Kernels {
    isa: Isa::Avx512Vnni,
    quantize: vnni::quantize,
    mm: mm_vnni,
    pack: vnni::pack,
    gemv: vnni::gemv,
    unpacked: vnni::unpacked,
    panel: vnni::panel,
    ..KERNELS
};

fn mm(w: DType) -> Option<MmTile> {
    match w {
        DType::F32 => Some(tile_f32),
        DType::F16 => Some(tile_f16),
        _ => (super::avx2::KERNELS.mm)(w),
    }
}

fn mm_vnni(w: DType) -> Option<MmTile> {
    match w {
        DType::F32 | DType::F16 | DType::BF16 => mm(w),
        d if crate::ops::mul_mat::quant_supported(d) => Some(vnni::tile_quant),
        _ => None,
    }
}

mod vnni {
    use std::arch::x86_64::*;

    use ggml_core::DType;

    x86_quant!(
        "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni",
        dot_u,
        dot_s,
        128
    );
    x86_kpanel!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni");

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
    unsafe fn dot_u(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, x, y)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
    unsafe fn dot_s(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, _mm256_abs_epi8(x), _mm256_sign_epi8(y, x))
    }

    // Matrix × vector kernels. The activation row is packed in block order
    // (`pack_natural`), so a weight block needs no transposition: two blocks fill a zmm
    // register, one `vpdpbusd` leaves 8 partial sums per block, and three levels of
    // pairwise adds gather block t's exact integer dot into lane t. From there the float
    // formula and the lane accumulation are those of the tiles (`reference::block_value`,
    // lane t accumulating blocks j ≡ t mod 8, `reference::tree8`).

    /// Weight formats with a gemv kernel. Q8_0's needs no permute for its quants (two
    /// blocks' 64 quants are two loads), so it is 1.6× the transposing tile at K = 576 on
    /// data in L2 (1.32 against 2.09 ns per block and row on Zen 4); earlier tries that
    /// gathered the quants with permutes gained 4 % and were dropped.
    const FMT_Q4_0: u8 = 0;
    const FMT_Q4_1: u8 = 1;
    const FMT_Q5_0: u8 = 2;
    const FMT_Q8_0: u8 = 3;

    /// Bytes per block of a format.
    const fn block_bytes(fmt: u8) -> usize {
        match fmt {
            FMT_Q4_0 => 18,
            FMT_Q5_0 => 22,
            FMT_Q8_0 => 34,
            _ => 20,
        }
    }

    /// Where a block's 16 nibble bytes start (after `d`, and `m` or `qh`).
    const fn quant_off(fmt: u8) -> usize {
        match fmt {
            FMT_Q4_0 => 2,
            FMT_Q5_0 => 6,
            _ => 4,
        }
    }

    /// Where the 128-byte window of half h (blocks 4h .. 4h + 3) of a whole group
    /// starts: the group's start, or its last 128 bytes (so no load leaves the group).
    const fn half_base(fmt: u8, h: usize) -> usize {
        if h == 0 {
            0
        } else {
            8 * block_bytes(fmt) - 128
        }
    }

    /// The block dots of 8 blocks, lane t for block t, from 4 registers holding 16 partial
    /// sums each (blocks 2i and 2i + 1 in register i, 8 lanes each).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
    fn reduce8(p: [__m512i; 4]) -> __m256i {
        let ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        let half = |a: __m512i, b: __m512i| {
            _mm512_add_epi32(
                _mm512_permutex2var_epi32(a, ie, b),
                _mm512_permutex2var_epi32(a, io, b),
            )
        };
        let r = half(half(p[0], p[1]), half(p[2], p[3]));
        _mm512_cvtepi64_epi32(_mm512_add_epi32(r, _mm512_srli_epi64(r, 32)))
    }

    /// The block dots of 8 blocks, lane t for block t, from 2 registers holding 4 partial
    /// sums per block (blocks 4h .. 4h + 3 in register h, 4 lanes each).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
    fn join_halves(acc: [__m512i; 2]) -> __m256i {
        let ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        let r = _mm512_add_epi32(
            _mm512_permutex2var_epi32(acc[0], ie, acc[1]),
            _mm512_permutex2var_epi32(acc[0], io, acc[1]),
        );
        _mm512_cvtepi64_epi32(_mm512_add_epi32(r, _mm512_srli_epi64(r, 32)))
    }

    /// Byte mask of the first `n` bytes (at most 64).
    #[inline]
    fn first_bytes(n: usize) -> u64 {
        if n >= 64 {
            !0
        } else {
            (1u64 << n) - 1
        }
    }

    /// 64 bytes at `x + off`; with `FULL` false only those below `lim` are read (the rest
    /// are zero).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
    unsafe fn ld512<const FULL: bool>(x: *const u8, off: usize, lim: usize) -> __m512i {
        // SAFETY: readable bytes (caller: all 64, or those below lim).
        unsafe {
            if FULL {
                _mm512_loadu_si512(x.add(off) as *const __m512i)
            } else {
                let m = first_bytes(lim.saturating_sub(off));
                _mm512_maskz_loadu_epi8(m, x.wrapping_add(off) as *const i8)
            }
        }
    }

    /// The f16 scales `d` (and for Q4_1 the mins `m`) of the 8 blocks at `x` as f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
    unsafe fn scales<const FMT: u8, const FULL: bool>(
        x: *const u8,
        lim: usize,
    ) -> (__m256, __m256) {
        // SAFETY: 8 blocks of the format at x, or `lim` bytes of them (caller); every
        // load stays inside them.
        unsafe {
            match FMT {
                FMT_Q4_1 => {
                    // (d, m) pairs are the dwords 5t of the group.
                    let idx =
                        _mm512_setr_epi32(0, 5, 10, 15, 16, 21, 26, 31, 0, 0, 0, 0, 0, 0, 0, 0);
                    let l0 = ld512::<FULL>(x, 0, lim);
                    let l1 = ld512::<FULL>(x, 80, lim);
                    let dm = _mm512_castsi512_si256(_mm512_permutex2var_epi32(l0, idx, l1));
                    (
                        _mm256_cvtph_ps(_mm256_cvtepi32_epi16(dm)),
                        _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(dm, 16))),
                    )
                }
                _ => {
                    // d is the word 9t of the group.
                    let idx = _mm512_setr_epi32(
                        9 << 16,
                        27 << 16 | 18,
                        45 << 16 | 36,
                        63 << 16 | 54,
                        0,
                        0,
                        0,
                        0,
                        0,
                        0,
                        0,
                        0,
                        0,
                        0,
                        0,
                        0,
                    );
                    let l0 = ld512::<FULL>(x, 0, lim);
                    let l1 = ld512::<FULL>(x, 64, lim);
                    let d = _mm512_castsi512_si128(_mm512_permutex2var_epi16(l0, idx, l1));
                    (_mm256_cvtph_ps(d), _mm256_setzero_ps())
                }
            }
        }
    }

    /// Word indices (into two 32-word registers) that gather the 16 quant bytes of
    /// blocks 4h .. 4h + 3 of a whole group into one register, block after block; the
    /// registers hold the group's 128 bytes from [`half_base`].
    const fn quant_words(fmt: u8, h: usize) -> [i16; 32] {
        let xb = block_bytes(fmt);
        let mut idx = [0i16; 32];
        let mut w = 0;
        while w < 32 {
            let byte = (4 * h + w / 8) * xb + quant_off(fmt) + 2 * (w % 8) - half_base(fmt, h);
            idx[w] = (byte / 2) as i16;
            w += 1;
        }
        idx
    }

    /// Halves of a group that hold blocks: both for a whole group, else those below
    /// `lim` bytes.
    #[inline]
    const fn halves<const FULL: bool>(fmt: u8, lim: usize) -> usize {
        if FULL || lim > 4 * block_bytes(fmt) {
            2
        } else {
            1
        }
    }

    /// The exact integer dots of the 8 blocks of a group at `x` (lane t: block t, quants
    /// as unsigned nibbles) against the activation quants `ylo`/`yhi` (elements 0..16 and
    /// 16..32 of blocks 4h .. 4h + 3 in register h, block after block). With `FULL` false
    /// only the `lim` bytes at `x` are read: the lanes of the missing blocks are garbage.
    ///
    /// Two word permutes gather each half's 64 quant bytes from 128-byte windows, so a
    /// `vpdpbusd` covers 4 blocks' low (or high) nibbles. A partial group (the row's
    /// last) reads its windows with masked loads and skips a half without blocks.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
    unsafe fn dots<const FMT: u8, const FULL: bool>(
        x: *const u8,
        lim: usize,
        ylo: &[__m512i; 2],
        yhi: &[__m512i; 2],
    ) -> __m256i {
        let nib = _mm512_set1_epi8(15);
        let mut acc = [_mm512_setzero_si512(); 2];
        for (h, a) in acc.iter_mut().enumerate().take(halves::<FULL>(FMT, lim)) {
            let base = half_base(FMT, h);
            let idx = const { [quant_words(FMT, 0), quant_words(FMT, 1)] }[h];
            // SAFETY: bytes [base, base + 128) lie in the group at x (caller: a whole
            // group, at least 144 bytes), or only those below lim are read; the index
            // array has 32 words.
            let q = unsafe {
                let w0 = ld512::<FULL>(x, base, lim);
                let w1 = ld512::<FULL>(x, base + 64, lim);
                let iv = _mm512_loadu_si512(idx.as_ptr() as *const __m512i);
                _mm512_permutex2var_epi16(w0, iv, w1)
            };
            let lo = _mm512_and_si512(q, nib);
            let hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), nib);
            *a = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(*a, lo, ylo[h]), hi, yhi[h]);
        }
        join_halves(acc)
    }

    /// The 8 block values (lane t: block t) of one weight row's group at `x` against the
    /// activation group (`ylo`/`yhi` as for [`dots`], `dy`, `sy`, `Σy`); with `FULL`
    /// false only the `lim` bytes at `x` are read and the lanes of missing blocks are
    /// garbage.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
    unsafe fn group<const FMT: u8, const FULL: bool>(
        x: *const u8,
        lim: usize,
        ylo: &[__m512i; 2],
        yhi: &[__m512i; 2],
        dy: __m256,
        sy: __m256,
        syi: __m256i,
    ) -> __m256 {
        // SAFETY: a whole group at x, or lim bytes of it (caller).
        let ((dx, mx), mut s) = unsafe {
            (
                scales::<FMT, FULL>(x, lim),
                dots::<FMT, FULL>(x, lim, ylo, yhi),
            )
        };
        if FMT == FMT_Q4_0 {
            s = _mm256_sub_epi32(s, _mm256_slli_epi32(syi, 3));
        }
        let v = _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(s));
        if FMT == FMT_Q4_1 {
            _mm256_add_ps(v, _mm256_mul_ps(mx, sy))
        } else {
            v
        }
    }

    /// `NR` weight rows (Q4_0, Q4_1, Q5_0 or Q8_0) against one activation row packed by
    /// `pack_natural`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
    unsafe fn gemv_gen<const FMT: u8, const NR: usize>(
        k: usize,
        a: &[&[u8]],
        y: &[u8],
        out: &mut [f32; 4],
    ) {
        let xb = block_bytes(FMT);
        let nb = k / 32;
        let ng = nb.div_ceil(8);
        assert!(a.len() >= NR && a[..NR].iter().all(|r| r.len() >= nb * xb));
        assert!(y.len() >= ng * crate::simd::PACK_GROUP);
        let mut acc = [_mm256_setzero_ps(); NR];
        for g in 0..ng {
            let cnt = (nb - 8 * g).min(8);
            // SAFETY: group g of the packed row (length asserted above).
            let (yv, dy, sy, syi) = unsafe {
                let yp = y.as_ptr().add(g * crate::simd::PACK_GROUP);
                (
                    [
                        _mm512_loadu_si512(yp as *const __m512i),
                        _mm512_loadu_si512(yp.add(64) as *const __m512i),
                        _mm512_loadu_si512(yp.add(128) as *const __m512i),
                        _mm512_loadu_si512(yp.add(192) as *const __m512i),
                    ],
                    _mm256_loadu_ps(yp.add(256) as *const f32),
                    _mm256_loadu_ps(yp.add(288) as *const f32),
                    _mm256_loadu_si256(yp.add(320) as *const __m256i),
                )
            };
            // Elements 0..16 and 16..32 of blocks 0..4 and 4..8, for `dots` and
            // `q5_group`: the 128-bit lanes of the natural layout (block t in bytes
            // 32t .. 32t + 32).
            const LO: i32 = 0b10_00_10_00;
            const HI: i32 = 0b11_01_11_01;
            let ylo = [
                _mm512_shuffle_i64x2(yv[0], yv[1], LO),
                _mm512_shuffle_i64x2(yv[2], yv[3], LO),
            ];
            let yhi = [
                _mm512_shuffle_i64x2(yv[0], yv[1], HI),
                _mm512_shuffle_i64x2(yv[2], yv[3], HI),
            ];
            for r in 0..NR {
                // SAFETY: group g of the row: 8 whole blocks, or the last `cnt` blocks
                // (lengths asserted above); same features.
                unsafe {
                    let x = a[r].as_ptr().add(8 * g * xb);
                    acc[r] = if cnt == 8 {
                        let v = row_group::<FMT, true>(x, 0, &yv, &ylo, &yhi, dy, sy, syi);
                        _mm256_add_ps(acc[r], v)
                    } else {
                        let v = row_group::<FMT, false>(x, cnt * xb, &yv, &ylo, &yhi, dy, sy, syi);
                        _mm256_mask_add_ps(acc[r], (1u8 << cnt) - 1, acc[r], v)
                    };
                }
            }
        }
        for r in 0..NR {
            let mut l = [0f32; 8];
            // SAFETY: 8 floats of room.
            unsafe { _mm256_storeu_ps(l.as_mut_ptr(), acc[r]) };
            out[r] = crate::reference::tree8(l);
        }
    }

    macro_rules! gemv_rows {
        ($name:ident, $fmt:expr) => {
            fn $name(k: usize, a: &[&[u8]], y: &[u8], out: &mut [f32; 4]) {
                // SAFETY: this table is installed only when its features were detected.
                unsafe {
                    match a.len() {
                        4 => gemv_gen::<{ $fmt }, 4>(k, a, y, out),
                        3 => gemv_gen::<{ $fmt }, 3>(k, a, y, out),
                        2 => gemv_gen::<{ $fmt }, 2>(k, a, y, out),
                        1 => gemv_gen::<{ $fmt }, 1>(k, a, y, out),
                        _ => {}
                    }
                }
            }
        };
    }
    /// Word indices, into half h's window of a Q5_0 group (from [`half_base`]), of the 4
    /// blocks' `qh` low words then high words (words 0..8) and their `d` (words 8..12).
    const fn q5_bit_words(h: usize) -> [i16; 32] {
        let (xb, base) = (block_bytes(FMT_Q5_0), half_base(FMT_Q5_0, h));
        let mut idx = [0i16; 32];
        let mut w = 0;
        while w < 32 {
            let byte = if w < 8 {
                (4 * h + w % 4) * xb + 2 + 2 * (w / 4)
            } else if w < 12 {
                (4 * h + w - 8) * xb
            } else {
                base
            };
            idx[w] = ((byte - base) / 2) as i16;
            w += 1;
        }
        idx
    }

    /// The 8 block values (lane t: block t) of one Q5_0 weight row's group at `x` against
    /// the packed activation group (`ylo`/`yhi` as for [`dots`]); with `FULL` false
    /// only the `lim` bytes at `x` are read and the missing blocks are zero.
    ///
    /// As [`dots`], with each block's fifth bits turned into a byte mask (`qh` is
    /// that mask already: bit j for element j) that adds 16 to the nibbles; `16·Σy`
    /// comes off the exact integer dot afterwards.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
    unsafe fn q5_group<const FULL: bool>(
        x: *const u8,
        lim: usize,
        ylo: &[__m512i; 2],
        yhi: &[__m512i; 2],
        dy: __m256,
        syi: __m256i,
    ) -> __m256 {
        let nib = _mm512_set1_epi8(15);
        let five = _mm512_set1_epi8(16);
        let mut acc = [_mm512_setzero_si512(); 2];
        let mut d = [_mm_setzero_si128(); 2];
        for (h, a) in acc
            .iter_mut()
            .enumerate()
            .take(halves::<FULL>(FMT_Q5_0, lim))
        {
            let quants = const { [quant_words(FMT_Q5_0, 0), quant_words(FMT_Q5_0, 1)] }[h];
            let bits = const { [q5_bit_words(0), q5_bit_words(1)] }[h];
            let base = half_base(FMT_Q5_0, h);
            // SAFETY: the group's bytes at x: whole (FULL: both windows lie in its 176
            // bytes), or the `lim` bytes below which `ld512` reads; 32 words per index.
            let (q, hb) = unsafe {
                let w0 = ld512::<FULL>(x, base, lim);
                let w1 = ld512::<FULL>(x, base + 64, lim);
                let iq = _mm512_loadu_si512(quants.as_ptr() as *const __m512i);
                let ib = _mm512_loadu_si512(bits.as_ptr() as *const __m512i);
                (
                    _mm512_permutex2var_epi16(w0, iq, w1),
                    _mm512_permutex2var_epi16(w0, ib, w1),
                )
            };
            let hb128 = _mm512_castsi512_si128(hb);
            let (klo, khi) = (
                _cvtu64_mask64(_mm_cvtsi128_si64(hb128) as u64),
                _cvtu64_mask64(_mm_extract_epi64::<1>(hb128) as u64),
            );
            d[h] = _mm512_extracti32x4_epi32::<1>(hb);
            let lo = _mm512_and_si512(q, nib);
            let lo = _mm512_mask_add_epi8(lo, klo, lo, five);
            let hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), nib);
            let hi = _mm512_mask_add_epi8(hi, khi, hi, five);
            *a = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(*a, lo, ylo[h]), hi, yhi[h]);
        }
        let s = _mm256_sub_epi32(join_halves(acc), _mm256_slli_epi32(syi, 4));
        let dx = _mm256_cvtph_ps(_mm_unpacklo_epi64(d[0], d[1]));
        _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(s))
    }

    /// The 8 block values (lane t: block t) of one weight row's group at `x` against the
    /// packed activation group: `yv` in the natural layout, `ylo`/`yhi` as for [`dots`],
    /// `dy`, `sy`, `Σy`. With `FULL` false only the `lim` bytes at `x` are read and the
    /// lanes of missing blocks are garbage.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn row_group<const FMT: u8, const FULL: bool>(
        x: *const u8,
        lim: usize,
        yv: &[__m512i; 4],
        ylo: &[__m512i; 2],
        yhi: &[__m512i; 2],
        dy: __m256,
        sy: __m256,
        syi: __m256i,
    ) -> __m256 {
        // SAFETY: a whole group at x, or lim bytes of it (caller); the caller enabled
        // these functions' features.
        unsafe {
            // Each arm names its format, so that no format's kernel is instantiated
            // with another's (the nibble index tables exist only for nibble formats).
            match FMT {
                FMT_Q4_0 => group::<FMT_Q4_0, FULL>(x, lim, ylo, yhi, dy, sy, syi),
                FMT_Q4_1 => group::<FMT_Q4_1, FULL>(x, lim, ylo, yhi, dy, sy, syi),
                FMT_Q5_0 => q5_group::<FULL>(x, lim, ylo, yhi, dy, syi),
                _ => q8_group::<FULL>(x, lim, yv, dy, syi),
            }
        }
    }

    /// Word indices gathering the `d` of blocks 0..4 of a Q8_0 group from its first 128
    /// bytes into words 0..4, and of blocks 4..8 from the next 128 into words 4..8.
    const Q8_D_WORDS: [i16; 32] = {
        let mut idx = [0i16; 32];
        let mut t = 0;
        while t < 8 {
            idx[t] = ((34 * t - 128 * (t / 4)) / 2) as i16;
            t += 1;
        }
        idx
    };

    /// The 8 block values (lane t: block t) of one Q8_0 weight row's group at `x` against
    /// the packed activation group (`yv`: blocks 2i and 2i + 1 in register i); with
    /// `FULL` false only the `lim` bytes at `x` are read and the lanes of missing blocks
    /// are garbage.
    ///
    /// Two blocks' 64 quants fill a register straight from memory (no permute); they are
    /// made unsigned by flipping their top bit (`q + 128`) for `vpdpbusd`, and `128·Σy`
    /// comes off the exact integer dot afterwards.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
    unsafe fn q8_group<const FULL: bool>(
        x: *const u8,
        lim: usize,
        yv: &[__m512i; 4],
        dy: __m256,
        syi: __m256i,
    ) -> __m256 {
        let top = _mm512_set1_epi8(-128);
        let z = _mm512_setzero_si512();
        let np = if FULL { 4 } else { lim.div_ceil(68) };
        let mut p = [z; 4];
        for (i, pi) in p.iter_mut().enumerate().take(np) {
            let (b0, b1) = (68 * i + 2, 68 * i + 36);
            // SAFETY: blocks 2i and 2i + 1 of the group at x, or the bytes of them below
            // lim (caller).
            let q = unsafe {
                if FULL {
                    let lo = _mm256_loadu_si256(x.add(b0) as *const __m256i);
                    let hi = _mm256_loadu_si256(x.add(b1) as *const __m256i);
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
                } else {
                    let m = |off: usize| first_bytes(lim.saturating_sub(off)) as u32;
                    let lo = _mm256_maskz_loadu_epi8(m(b0), x.wrapping_add(b0) as *const i8);
                    let hi = _mm256_maskz_loadu_epi8(m(b1), x.wrapping_add(b1) as *const i8);
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
                }
            };
            *pi = _mm512_dpbusd_epi32(z, _mm512_xor_si512(q, top), yv[i]);
        }
        // SAFETY: the `d` words lie in bytes [0, 256) of the group; the loads read what
        // the caller allows.
        let d = unsafe {
            let iv = _mm512_loadu_si512(Q8_D_WORDS.as_ptr() as *const __m512i);
            let a =
                _mm512_permutex2var_epi16(ld512::<FULL>(x, 0, lim), iv, ld512::<FULL>(x, 64, lim));
            let b = if FULL || lim > 136 {
                _mm512_permutex2var_epi16(
                    ld512::<FULL>(x, 128, lim),
                    iv,
                    ld512::<FULL>(x, 192, lim),
                )
            } else {
                z
            };
            _mm512_castsi512_si128(_mm512_mask_blend_epi16(0xF0, a, b))
        };
        let s = _mm256_sub_epi32(reduce8(p), _mm256_slli_epi32(syi, 7));
        let dx = _mm256_cvtph_ps(d);
        _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(s))
    }

    gemv_rows!(gemv_q4_0, FMT_Q4_0);
    gemv_rows!(gemv_q4_1, FMT_Q4_1);
    gemv_rows!(gemv_q5_0, FMT_Q5_0);
    gemv_rows!(gemv_q8_0, FMT_Q8_0);

    pub(crate) fn gemv(w: DType) -> Option<crate::simd::Gemv> {
        let rows: crate::simd::GemvRows = match w {
            DType::Q4_0 => gemv_q4_0,
            DType::Q4_1 => gemv_q4_1,
            DType::Q5_0 => gemv_q5_0,
            DType::Q8_0 => gemv_q8_0,
            _ => return None,
        };
        Some(crate::simd::Gemv {
            pack: crate::simd::Packer {
                row_bytes: crate::simd::packed_row_bytes,
                pack: pack_natural,
            },
            rows,
        })
    }
}

// Table entries over the kernels below. Installed only when AVX-512 F/BW/VL/DQ (and
// AVX2, FMA, F16C) were detected.
safe_common!();
safe! {
    fn dots_f16_heads(qs: &[&[u16]], k: &[u16], stride: usize, outs: &mut [&mut [f32]]) = dots_f16_heads_imp;
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn ld_f32(p: *const f32) -> __m512 {
    // SAFETY: 16 readable floats at p (caller).
    unsafe { _mm512_loadu_ps(p) }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn ld_f16(p: *const u16) -> __m512 {
    // SAFETY: 16 readable f16 at p (caller).
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn lanes16(a: __m512) -> [f32; 16] {
    let mut l = [0f32; 16];
    // SAFETY: 16 floats of room.
    unsafe { _mm512_storeu_ps(l.as_mut_ptr(), a) };
    l
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

macro_rules! dot_impl {
    ($name:ident, $t:ty, $ld:ident) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
        unsafe fn $name(x: &[$t], y: &[$t]) -> f32 {
            let n = x.len().min(y.len());
            let mut a = _mm512_setzero_ps();
            let mut i = 0;
            while i + 16 <= n {
                // SAFETY: 16 elements at i in both rows.
                unsafe {
                    a = _mm512_add_ps(
                        a,
                        _mm512_mul_ps($ld(x.as_ptr().add(i)), $ld(y.as_ptr().add(i))),
                    );
                }
                i += 16;
            }
            // SAFETY: same features.
            let mut l = unsafe { lanes16(a) };
            for j in i..n {
                l[j - i] += x[j].to() * y[j].to();
            }
            r::tree16(l)
        }
    };
}

dot_impl!(dot_f32_imp, f32, ld_f32);
dot_impl!(dot_f16_imp, u16, ld_f16);

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn sum_sq_imp(x: &[f32]) -> f32 {
    let n = x.len();
    let mut a = _mm512_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: 16 floats at i.
        unsafe {
            let v = ld_f32(x.as_ptr().add(i));
            a = _mm512_add_ps(a, _mm512_mul_ps(v, v));
        }
        i += 16;
    }
    // SAFETY: same features.
    let mut l = unsafe { lanes16(a) };
    for j in i..n {
        l[j - i] += x[j] * x[j];
    }
    r::tree16(l)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn max_imp(x: &[f32]) -> f32 {
    let n = x.len();
    let mut a = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: 16 floats at i. vmaxps(x, m) = x > m ? x : m, as reference::fmax.
        unsafe { a = _mm512_max_ps(ld_f32(x.as_ptr().add(i)), a) };
        i += 16;
    }
    // SAFETY: same features.
    let mut l = unsafe { lanes16(a) };
    for j in i..n {
        l[j - i] = r::fmax(x[j], l[j - i]);
    }
    r::tree16_max(l)
}

x86_exp! {
    feature: "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c", vector: __m512, exp: exp16,
    silu: silu16, set1: _mm512_set1_ps, max: _mm512_max_ps, min: _mm512_min_ps,
    add: _mm512_add_ps, sub: _mm512_sub_ps, mul: _mm512_mul_ps, div: _mm512_div_ps,
    xor: _mm512_xor_ps, add_i32: _mm512_add_epi32, sub_i32: _mm512_sub_epi32,
    set1_i32: _mm512_set1_epi32, srai_i32: _mm512_srai_epi32, slli_i32: _mm512_slli_epi32,
    to_bits: _mm512_castps_si512, from_bits: _mm512_castsi512_ps,
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn exp_shift_sum_imp(x: &mut [f32], m: f32) -> f32 {
    let n = x.len();
    let mv = _mm512_set1_ps(m);
    let mut a = _mm512_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: 16 floats at i.
        unsafe {
            let p = x.as_mut_ptr().add(i);
            let e = exp16(_mm512_sub_ps(ld_f32(p), mv));
            _mm512_storeu_ps(p, e);
            a = _mm512_add_ps(a, e);
        }
        i += 16;
    }
    // SAFETY: same features.
    let mut l = unsafe { lanes16(a) };
    for j in i..n {
        x[j] = r::exp(x[j] - m);
        l[j - i] += x[j];
    }
    r::tree16(l)
}

x86_elementwise! {
    feature: "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c", lanes: 16, silu: silu16,
    store: _mm512_storeu_ps, mul: _mm512_mul_ps, add: _mm512_add_ps, set1: _mm512_set1_ps,
    to_f16: _mm512_cvtps_ph, store_f16: _mm256_storeu_si256, f16_vector: __m256i,
}

/// Reduces 16 accumulators at once, each exactly as [`r::tree16`] (`l += l+8`,
/// `l += l+4`, `l += l+2`, `l0 + l1`, the same additions of the same operands); the sum of
/// `a[t]` ends in lane `t`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn tree16_x16(a: &[__m512; 16]) -> __m512 {
    // l += l+8, for accumulators 2m (low 256 bits) and 2m+1 (high 256 bits).
    let mut s8 = [_mm512_setzero_ps(); 8];
    for (m, s) in s8.iter_mut().enumerate() {
        let (x, y) = (a[2 * m], a[2 * m + 1]);
        *s = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(x, y),
            _mm512_shuffle_f32x4::<0xEE>(x, y),
        );
    }
    // l += l+4: 128-bit chunk c of s4[p] holds accumulator 4p+c.
    let mut s4 = [_mm512_setzero_ps(); 4];
    for (p, s) in s4.iter_mut().enumerate() {
        let (x, y) = (s8[2 * p], s8[2 * p + 1]);
        *s = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(x, y),
            _mm512_shuffle_f32x4::<0xDD>(x, y),
        );
    }
    // l += l+2: chunk c of s2[q] holds accumulators 8q+c (lanes 0-1) and 8q+4+c (2-3).
    let mut s2 = [_mm512_setzero_ps(); 2];
    for (q, s) in s2.iter_mut().enumerate() {
        let (x, y) = (s4[2 * q], s4[2 * q + 1]);
        *s = _mm512_add_ps(
            _mm512_shuffle_ps::<0x44>(x, y),
            _mm512_shuffle_ps::<0xEE>(x, y),
        );
    }
    // l0 + l1: chunk c holds accumulators c, 4+c, 8+c, 12+c.
    let (x, y) = (s2[0], s2[1]);
    let t = _mm512_add_ps(
        _mm512_shuffle_ps::<0x88>(x, y),
        _mm512_shuffle_ps::<0xDD>(x, y),
    );
    // Lane 4c+u holds accumulator 4u+c: transpose the 4x4.
    let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(idx, t)
}

/// 16 f16 values at `p`, or the first `n < 16` of them and zeros.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn ld_f16_part(p: *const u16, n: usize) -> __m512 {
    let m: __mmask16 = if n >= 16 { 0xffff } else { (1u16 << n) - 1 };
    // SAFETY: the first `n` values at p are readable (caller); the rest are not touched.
    unsafe { _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p as *const i16)) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn dots_f16_imp(q: &[u16], k: &[u16], stride: usize, out: &mut [f32]) {
    let (d, n) = (q.len(), out.len());
    assert!(
        k.len() >= super::rows_span(n, stride, d),
        "key rows out of bounds"
    );
    let kp = k.as_ptr();
    let mut j0 = 0;
    while j0 < n {
        let nk = (n - j0).min(16);
        // Rows past the run repeat its last row; their sums are not stored.
        let rows: [*const u16; 16] =
            core::array::from_fn(|t| kp.wrapping_add((j0 + t.min(nk - 1)) * stride));
        let mut acc = [_mm512_setzero_ps(); 16];
        let mut i = 0;
        while i < d {
            // Lanes past `d` load zeros: `+0` leaves a lane that started at `+0` unchanged,
            // as the reference, which adds nothing there.
            let w = d - i;
            // SAFETY: `w` values at i in the query and in every row (bounds asserted).
            unsafe {
                let qv = ld_f16_part(q.as_ptr().add(i), w);
                for (a, r) in acc.iter_mut().zip(rows.iter()) {
                    *a = _mm512_add_ps(*a, _mm512_mul_ps(qv, ld_f16_part(r.add(i), w)));
                }
            }
            i += 16;
        }
        // SAFETY: same features; `nk` floats of room at j0.
        unsafe {
            let sums = tree16_x16(&acc);
            let m: __mmask16 = if nk == 16 { 0xffff } else { (1u16 << nk) - 1 };
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(j0), m, sums);
        }
        j0 += nk;
    }
}

/// [`dots_f16_imp`] for several queries against the same key rows: `NQ` queries × `16 /
/// NQ` keys a register block (4 × 4, 2 × 8 or 1 × 16), so that each key value is loaded
/// and converted once for up to 4 queries (with one query per call, prompt attention
/// re-read every key row from L2 for every head). Every score has the same lanes and
/// tree as `dots_f16`'s.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn dots_f16_heads_imp(qs: &[&[u16]], k: &[u16], stride: usize, outs: &mut [&mut [f32]]) {
    let (Some(q0), Some(o0)) = (qs.first(), outs.first()) else {
        return;
    };
    let (d, n) = (q0.len(), o0.len());
    assert!(qs.len() == outs.len(), "one output per query");
    assert!(
        qs.iter().all(|q| q.len() == d) && outs.iter().all(|o| o.len() == n),
        "queries and outputs of equal lengths"
    );
    assert!(
        k.len() >= super::rows_span(n, stride, d),
        "key rows out of bounds"
    );
    let (mut qs, mut outs) = (qs, outs);
    while !qs.is_empty() {
        // 4 queries a block while there are; then 2, then 1.
        let nq = [0, 1, 2, 2, 4][qs.len().min(4)];
        let (q, qrest) = qs.split_at(nq);
        let (o, orest) = std::mem::take(&mut outs).split_at_mut(nq);
        // SAFETY: same features; lengths asserted above.
        unsafe {
            match nq {
                4 => dots_f16_block::<4, 4>(q, k.as_ptr(), stride, o),
                2 => dots_f16_block::<2, 8>(q, k.as_ptr(), stride, o),
                _ => dots_f16_block::<1, 16>(q, k.as_ptr(), stride, o),
            }
        }
        (qs, outs) = (qrest, orest);
    }
}

/// `outs[q][j] = dot_f16(qs[q], row j)` for `NQ` queries, `KB` key rows a register block
/// (`NQ · KB = 16` accumulators, reduced together by `tree16_x16`).
///
/// # Safety
/// Every query has `d` values, every output `n`, and the `n` rows of `d` values `stride`
/// apart from `k` are readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn dots_f16_block<const NQ: usize, const KB: usize>(
    qs: &[&[u16]],
    k: *const u16,
    stride: usize,
    outs: &mut [&mut [f32]],
) {
    let (d, n) = (qs[0].len(), outs[0].len());
    let qp: [*const u16; NQ] = core::array::from_fn(|t| qs[t].as_ptr());
    let mut j0 = 0;
    while j0 < n {
        let nk = (n - j0).min(KB);
        // Rows past the run repeat its last row; their sums are not stored.
        let rows: [*const u16; KB] =
            core::array::from_fn(|t| k.wrapping_add((j0 + t.min(nk - 1)) * stride));
        // Accumulator KB·query + key.
        let mut acc = [_mm512_setzero_ps(); 16];
        let mut i = 0;
        while i < d {
            // Lanes past `d` load zeros, as in `dots_f16_imp`.
            let w = d - i;
            // SAFETY: `w` values at i in every query and row (caller's contract).
            unsafe {
                let kv: [__m512; KB] = core::array::from_fn(|t| ld_f16_part(rows[t].add(i), w));
                for (aq, q) in acc.chunks_exact_mut(KB).zip(qp) {
                    let qv = ld_f16_part(q.add(i), w);
                    for (a, kv) in aq.iter_mut().zip(kv) {
                        *a = _mm512_add_ps(*a, _mm512_mul_ps(qv, kv));
                    }
                }
            }
            i += 16;
        }
        let mut sums = [0f32; 16];
        // SAFETY: same features; 16 floats of room.
        unsafe { _mm512_storeu_ps(sums.as_mut_ptr(), tree16_x16(&acc)) };
        for (t, out) in outs.iter_mut().enumerate() {
            out[j0..j0 + nk].copy_from_slice(&sums[KB * t..KB * t + nk]);
        }
        j0 += nk;
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn axpy_f16_rows_imp(accs: &mut [&mut [f32]], ws: &[&[f32]], v: &[u16], stride: usize) {
    let (Some(a0), Some(w0)) = (accs.first(), ws.first()) else {
        return;
    };
    let (d, n) = (a0.len(), w0.len());
    assert!(accs.len() == ws.len(), "one weight row per head");
    assert!(
        accs.iter().all(|a| a.len() == d) && ws.iter().all(|w| w.len() == n),
        "heads of equal lengths"
    );
    assert!(
        v.len() >= super::rows_span(n, stride, d),
        "value rows out of bounds"
    );
    // Up to 4 heads and 64 values a time: each row is converted once for the heads,
    // and their accumulator registers are independent chains of adds (one head alone
    // waits on the add latency: a lane's sum runs through the rows in order).
    for (accs, ws) in accs.chunks_mut(4).zip(ws.chunks(4)) {
        let mut c0 = 0;
        while c0 < d {
            let width = (d - c0).min(64);
            let masks: [__mmask16; 4] = core::array::from_fn(|p| {
                let left = width.saturating_sub(16 * p);
                if left >= 16 {
                    0xffff
                } else {
                    (1u16 << left) - 1
                }
            });
            let mut a = [std::ptr::null_mut::<f32>(); 4];
            let mut w = [std::ptr::null::<f32>(); 4];
            for (h, (acc, wh)) in accs.iter_mut().zip(ws).enumerate() {
                a[h] = acc.as_mut_ptr().wrapping_add(c0);
                w[h] = wh.as_ptr();
            }
            let r = v.as_ptr().wrapping_add(c0);
            macro_rules! go {
                ($($h:literal, $p:literal);*) => {
                    match (accs.len(), width.div_ceil(16)) {
                        $(($h, $p) => axpy_f16_block::<$h, $p>(a, masks, w, n, r, stride),)*
                        _ => unreachable!("1 to 4 heads, 1 to 4 registers"),
                    }
                };
            }
            // SAFETY: `width` values at c0 of every accumulator and value row, `n` weights
            // per head (all asserted); same features.
            unsafe {
                go!(1, 1; 1, 2; 1, 3; 1, 4; 2, 1; 2, 2; 2, 3; 2, 4;
                    3, 1; 3, 2; 3, 3; 3, 4; 4, 1; 4, 2; 4, 3; 4, 4)
            };
            c0 += width;
        }
    }
}

/// For heads `h < H`: `acc[h][..16 P] += w[h][j] · v[j·stride ..][..16 P]` for rows
/// `j < n` in order (lanes beyond `masks` untouched), every accumulator in a register
/// throughout (counts known at compile time; a slice of them went through the stack, a
/// store and a reload per row), each row converted once for all heads.
///
/// # Safety
/// For `h < H`: the masked lanes of `16 P` values at `acc[h]` and at every row
/// `v + j·stride` (`j < n`) are valid, and `w[h]` has `n` readable values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn axpy_f16_block<const H: usize, const P: usize>(
    acc: [*mut f32; 4],
    masks: [__mmask16; 4],
    w: [*const f32; 4],
    n: usize,
    v: *const u16,
    stride: usize,
) {
    let mut a = [[_mm512_setzero_ps(); P]; H];
    for (h, ah) in a.iter_mut().enumerate() {
        for (p, ap) in ah.iter_mut().enumerate() {
            // SAFETY: caller's contract; masked lanes are not touched.
            *ap = unsafe { _mm512_maskz_loadu_ps(masks[p], acc[h].add(16 * p)) };
        }
    }
    for j in 0..n {
        let row = v.wrapping_add(j * stride);
        let mut x = [_mm512_setzero_ps(); P];
        for (p, xp) in x.iter_mut().enumerate() {
            // SAFETY: caller's contract.
            *xp = unsafe {
                _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                    masks[p],
                    row.add(16 * p) as *const i16,
                ))
            };
        }
        for (h, ah) in a.iter_mut().enumerate() {
            // SAFETY: caller's contract.
            let wv = _mm512_set1_ps(unsafe { *w[h].add(j) });
            for (ap, xp) in ah.iter_mut().zip(&x) {
                *ap = _mm512_add_ps(*ap, _mm512_mul_ps(wv, *xp));
            }
        }
    }
    for (h, ah) in a.iter().enumerate() {
        for (p, ap) in ah.iter().enumerate() {
            // SAFETY: caller's contract.
            unsafe { _mm512_mask_storeu_ps(acc[h].add(16 * p), masks[p], *ap) };
        }
    }
}

macro_rules! float_tile {
    ($name:ident, $t:ty, $ld:ident, $dot:ident) => {
        /// Up to 4 weight rows against each activation row, one zmm (16 lanes) per dot.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
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
                    let mut acc = [_mm512_setzero_ps(); 4];
                    let mut i = 0;
                    while i + 16 <= k {
                        // SAFETY: 16 elements at i in every row (lengths asserted).
                        unsafe {
                            let yv = $ld(y.add(i));
                            for ri in 0..4 {
                                acc[ri] =
                                    _mm512_add_ps(acc[ri], _mm512_mul_ps($ld(x[ri].add(i)), yv));
                            }
                        }
                        i += 16;
                    }
                    for ri in 0..4 {
                        // SAFETY: same features; the tail is read within the asserted lengths.
                        unsafe {
                            let mut l = lanes16(acc[ri]);
                            let xs = std::slice::from_raw_parts(x[ri], k);
                            let ys = std::slice::from_raw_parts(y, k);
                            for j in i..k {
                                l[j - i] += xs[j].to() * ys[j].to();
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

float_tile!(tile_f32_imp, f32, ld_f32, dot_f32_imp);
float_tile!(tile_f16_imp, u16, ld_f16, dot_f16_imp);
