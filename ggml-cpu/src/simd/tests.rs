//! Every kernel table against the scalar reference, bit for bit.

use ggml_core::DType;
use rstest::rstest;

use ggml_test_kit::bytes::bits;
use ggml_test_kit::{xorshift_dot_blocks, Xorshift, QUANT_DTYPES};

use super::{all_tables, Kernels};
use crate::reference as r;

/// Every available level runs its own table (a level mapped to another's kernels would
/// pass every comparison below without testing its own).
#[test]
fn each_level_has_its_table() {
    for isa in crate::isa::Isa::available() {
        assert_eq!(Kernels::get(isa).isa, isa);
    }
    assert_eq!(all_tables().len(), crate::isa::Isa::available().len());
}

const SIZES: [usize; 9] = [0, 1, 7, 15, 16, 17, 64, 100, 576];

#[rstest]
fn f32_reductions_match_reference(#[values(1, 2)] seed: u64) {
    let mut rng = Xorshift::new(seed);
    for k in all_tables() {
        for n in SIZES {
            let (x, y) = (rng.vec(n, 3.0), rng.vec(n, 3.0));
            assert_eq!(
                (k.dot_f32)(&x, &y).to_bits(),
                r::dot_f32(&x, &y).to_bits(),
                "{:?} dot {n}",
                k.isa
            );
            assert_eq!(
                (k.sum_sq)(&x).to_bits(),
                r::sum_sq(&x).to_bits(),
                "{:?} sum_sq {n}",
                k.isa
            );
            assert_eq!(
                (k.max)(&x).to_bits(),
                r::max(&x).to_bits(),
                "{:?} max {n}",
                k.isa
            );
            let (xh, yh): (Vec<u16>, Vec<u16>) = (
                x.iter().map(|&v| r::f32_to_f16(v)).collect(),
                y.iter().map(|&v| r::f32_to_f16(v)).collect(),
            );
            assert_eq!(
                {
                    let mut o = [0f32];
                    (k.dots_f16)(&xh, &yh, n, &mut o);
                    o[0].to_bits()
                },
                r::dot_f16(&xh, &yh).to_bits(),
                "{:?} dot_f16 {n}",
                k.isa
            );
            let mut h = vec![0u16; n];
            (k.f32_to_f16)(&x, &mut h);
            assert_eq!(h, xh, "{:?} f32_to_f16 {n}", k.isa);
        }
    }
}

#[rstest]
fn exp_family_matches_reference(#[values(1, 2, 3)] seed: u64) {
    let mut rng = Xorshift::new(seed);
    let mut x = rng.vec(1000, 120.0);
    x.extend([
        0.0,
        -0.0,
        f32::NEG_INFINITY,
        f32::INFINITY,
        -87.0,
        -103.9,
        -150.0,
        88.7,
        89.5,
        1e-30,
        -1e-30,
    ]);
    let y = rng.vec(x.len(), 2.0);
    for k in all_tables() {
        let m = rng.f();
        let mut e1 = x.clone();
        let mut e2 = x.clone();
        let s1 = (k.exp_shift_sum)(&mut e1, m);
        let s2 = r::exp_shift_sum(&mut e2, m);
        assert_eq!(bits(&e1), bits(&e2), "{:?} exp", k.isa);
        assert_eq!(s1.to_bits(), s2.to_bits(), "{:?} exp sum", k.isa);
        let mut o1 = vec![0f32; x.len()];
        (k.silu)(&x, &mut o1);
        let o2: Vec<f32> = x.iter().map(|&v| r::silu(v)).collect();
        assert_eq!(bits(&o1), bits(&o2), "{:?} silu", k.isa);
        (k.swiglu)(&x, &y, &mut o1);
        let o2: Vec<f32> = x.iter().zip(&y).map(|(&a, &b)| r::silu(a) * b).collect();
        assert_eq!(bits(&o1), bits(&o2), "{:?} swiglu", k.isa);
        let mut acc1 = y.clone();
        let mut acc2 = y.clone();
        (k.axpy_f32)(&mut acc1, 0.37, &x);
        super::scalar::axpy_f32(&mut acc2, 0.37, &x);
        assert_eq!(bits(&acc1), bits(&acc2), "{:?} axpy", k.isa);
        let xh: Vec<u16> = y.iter().map(|&v| r::f32_to_f16(v)).collect();
        (k.axpy_f16_rows)(&mut [&mut acc1[..]], &[&[-1.5]], &xh, 0);
        super::scalar::axpy_f16(&mut acc2, -1.5, &xh);
        assert_eq!(bits(&acc1), bits(&acc2), "{:?} axpy_f16", k.isa);
    }
}

/// The multi-row attention kernels against one `dot_f16` / `axpy_f16` per row, with row
/// lengths that are and are not multiples of 16 (and above the 256 that NEON's query copy
/// holds) and runs shorter and longer than 16 rows.
#[rstest]
fn attention_row_kernels_match_reference(
    #[values(1, 7, 16, 17, 64, 100, 256, 272)] d: usize,
    #[values(0, 1, 5, 16, 17, 40)] n: usize,
) {
    let mut rng = Xorshift::new((d * 100 + n) as u64);
    let stride = d + 3;
    let half = |x: Vec<f32>| -> Vec<u16> { x.iter().map(|&v| r::f32_to_f16(v)).collect() };
    let q = half(rng.vec(d, 2.0));
    let rows = half(rng.vec(n.max(1) * stride, 2.0));
    // Up to 6 query heads sharing the value rows (the kernels take them 4 at a time).
    let ws: Vec<Vec<f32>> = (0..6).map(|_| rng.vec(n, 1.0)).collect();
    let acc0s: Vec<Vec<f32>> = (0..6).map(|_| rng.vec(d, 1.0)).collect();
    let want: Vec<f32> = (0..n)
        .map(|j| r::dot_f16(&q, &rows[j * stride..j * stride + d]))
        .collect();
    let want_accs: Vec<Vec<f32>> = acc0s
        .iter()
        .zip(&ws)
        .map(|(acc0, w)| {
            let mut a = acc0.clone();
            for (j, &wj) in w.iter().enumerate() {
                super::scalar::axpy_f16(&mut a, wj, &rows[j * stride..j * stride + d]);
            }
            a
        })
        .collect();
    for k in all_tables() {
        let mut out = vec![f32::NAN; n];
        (k.dots_f16)(&q, &rows, stride, &mut out);
        assert_eq!(bits(&out), bits(&want), "{:?} dots_f16 d={d} n={n}", k.isa);
        if let Some(heads_fn) = k.dots_f16_heads {
            // Up to 6 queries against the same rows (the kernel takes them 4 at a time).
            let qs: Vec<Vec<u16>> = (0..6).map(|_| half(rng.vec(d, 2.0))).collect();
            for heads in 1..=6 {
                let mut outs = vec![vec![f32::NAN; n]; heads];
                let mut om: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
                let qr: Vec<&[u16]> = qs[..heads].iter().map(|q| q.as_slice()).collect();
                heads_fn(&qr, &rows, stride, &mut om);
                for (h, (o, q)) in outs.iter().zip(&qs).enumerate() {
                    let want: Vec<f32> = (0..n)
                        .map(|j| r::dot_f16(q, &rows[j * stride..j * stride + d]))
                        .collect();
                    assert_eq!(
                        bits(o),
                        bits(&want),
                        "{:?} dots_f16_heads d={d} n={n}, query {h} of {heads}",
                        k.isa
                    );
                }
            }
        }
        for heads in [1, 2, 3, 4, 5, 6] {
            let mut accs = acc0s[..heads].to_vec();
            let mut am: Vec<&mut [f32]> = accs.iter_mut().map(|a| a.as_mut_slice()).collect();
            let wr: Vec<&[f32]> = ws[..heads].iter().map(|w| w.as_slice()).collect();
            (k.axpy_f16_rows)(&mut am, &wr, &rows, stride);
            for (h, (a, want)) in accs.iter().zip(&want_accs).enumerate() {
                assert_eq!(
                    bits(a),
                    bits(want),
                    "{:?} axpy_f16_rows d={d} n={n} head {h} of {heads}",
                    k.isa
                );
            }
        }
    }
}

#[test]
fn exp_is_accurate() {
    let mut worst = 0f64;
    let mut x = -103.0f32;
    while x < 88.7 {
        let e = r::exp(x) as f64;
        let t = (x as f64).exp();
        if t > f32::MIN_POSITIVE as f64 {
            worst = worst.max(((e - t) / t).abs());
        }
        x += 0.0137;
    }
    assert!(worst < 3e-7, "relative error {worst}");
    assert_eq!(r::exp(f32::NEG_INFINITY), 0.0);
    assert_eq!(r::exp(0.0), 1.0);
    assert!(r::exp(f32::NAN).is_nan());
    assert_eq!(r::exp(100.0), f32::INFINITY);
}

fn check_tile(k: &Kernels, w: DType, kk: usize, nr: usize, nc: usize, rng: &mut Xorshift) {
    let nb = kk / w.block_size();
    let a: Vec<Vec<u8>> = (0..nr).map(|_| xorshift_dot_blocks(w, nb, rng)).collect();
    let y: Vec<Vec<f32>> = (0..nc).map(|_| rng.vec(kk, 2.0)).collect();
    check_tile_on(k, w, kk, &a, &y);
}

/// The tile of level `k` for weight rows `a` and activation rows `y` (`kk` values each)
/// against the reference, bit for bit.
fn check_tile_on(k: &Kernels, w: DType, kk: usize, a: &[Vec<u8>], y: &[Vec<f32>]) {
    let (nr, nc) = (a.len(), y.len());
    let vdt = w.vec_dot_type();
    let std: Vec<Vec<u8>> = y
        .iter()
        .map(|v| {
            let mut o = vec![0u8; vdt.row_size(kk).unwrap()];
            ggml_core::quant::quantize_row(vdt, v, &mut o).unwrap();
            o
        })
        .collect();
    let b: Vec<Vec<u8>> = match (k.pack)(w) {
        Some(p) => y
            .iter()
            .map(|v| {
                let mut o = vec![0xAAu8; (p.row_bytes)(kk)];
                (p.pack)(v, &mut o);
                o
            })
            .collect(),
        None => std.clone(),
    };
    let ar: Vec<&[u8]> = a.iter().map(|v| v.as_slice()).collect();
    let br: Vec<&[u8]> = b.iter().map(|v| v.as_slice()).collect();
    let mut out = [f32::NAN; 16];
    ((k.mm)(w).expect("tile"))(w, kk, &ar, &br, &mut out);
    let mut outs = vec![("tile", out)];
    // The same rows unpacked first (where the level does that) must give the same bits.
    if let Some(u) = (k.unpacked)(w) {
        let un: Vec<Vec<u8>> = a
            .iter()
            .map(|row| {
                let mut o = vec![0xAAu8; crate::simd::unpacked_row_bytes(w, kk)];
                (u.unpack)(w, kk, row, &mut o);
                o
            })
            .collect();
        let ur: Vec<&[u8]> = un.iter().map(|v| v.as_slice()).collect();
        let mut out = [f32::NAN; 16];
        (u.tile)(w, kk, &ur, &br, &mut out);
        outs.push(("unpacked tile", out));
    }
    // The matrix × vector kernel, one column at a time.
    if let Some(g) = (k.gemv)(w) {
        let mut out = [f32::NAN; 16];
        for (ci, v) in y.iter().enumerate() {
            let mut packed = vec![0xAAu8; (g.pack.row_bytes)(kk)];
            (g.pack.pack)(v, &mut packed);
            let mut o = [f32::NAN; 4];
            (g.rows)(kk, &ar, &packed, &mut o);
            for ri in 0..nr {
                out[ri * 4 + ci] = o[ri];
            }
        }
        outs.push(("gemv", out));
    }
    if let Some(po) = panel_products(k, w, kk, a, &std) {
        let mut out = [f32::NAN; 16];
        for (ri, row) in po.iter().enumerate() {
            out[ri * 4..ri * 4 + nc].copy_from_slice(row);
        }
        outs.push(("panel tile", out));
    }
    for (what, out) in outs {
        for ri in 0..nr {
            for ci in 0..nc {
                let want = r::vec_dot_quant(w, &a[ri], &std[ci], kk);
                assert_eq!(
                    out[ri * 4 + ci].to_bits(),
                    want.to_bits(),
                    "{:?} {w} k={kk} {what} {nr}x{nc} at ({ri},{ci}): {} vs {want}",
                    k.isa,
                    out[ri * 4 + ci]
                );
            }
        }
    }
}

/// The products of weight rows `a` (dtype `w`, `kk` values) with the Q8_K activation rows
/// `std` by level `k`'s panel tiles, `[row][column]`; `None` where the level has none.
/// Rows run 4 at a time (a short last group repeats row 0), columns 2 panels at a time.
fn panel_products(
    k: &Kernels,
    w: DType,
    kk: usize,
    a: &[Vec<u8>],
    std: &[Vec<u8>],
) -> Option<Vec<Vec<f32>>> {
    use super::panel::{kp_row_bytes, panel_bytes, scatter_column, PANEL_ROWS};
    let pn = (k.panel)(w)?;
    let cols = pn.cols;
    let npanels = std.len().div_ceil(cols);
    let pb = panel_bytes(w, kk, cols);
    // Unwritten columns of a last panel hold a pattern; their results are not read.
    let mut panels = vec![0x5Au8; npanels * pb];
    for (c, row) in std.iter().enumerate() {
        // SAFETY: panel c / cols lies inside `panels`, written by this thread only.
        unsafe {
            let at = panels.as_mut_ptr().add(c / cols * pb);
            scatter_column(w, row, kk, cols, c % cols, at)
        };
    }
    let un: Vec<Vec<u8>> = a
        .iter()
        .map(|row| {
            let mut o = vec![0xAAu8; kp_row_bytes(w, kk)];
            (pn.unpack)(w, kk, row, &mut o);
            o
        })
        .collect();
    let mut res = vec![vec![f32::NAN; std.len()]; a.len()];
    for r0 in (0..a.len()).step_by(PANEL_ROWS) {
        let rows: [&[u8]; PANEL_ROWS] =
            std::array::from_fn(|r| un.get(r0 + r).unwrap_or(&un[r0]).as_slice());
        for p0 in (0..npanels).step_by(2) {
            let np = (npanels - p0).min(2);
            let ps: Vec<&[u8]> = (p0..p0 + np)
                .map(|p| &panels[p * pb..(p + 1) * pb])
                .collect();
            let mut out = [f32::NAN; 128];
            (pn.tile)(w, kk, &rows, &ps, &mut out);
            for r in 0..PANEL_ROWS.min(a.len() - r0) {
                for p in 0..np {
                    for c in 0..cols {
                        let col = (p0 + p) * cols + c;
                        if col < std.len() {
                            res[r0 + r][col] = out[(p * cols + c) * 4 + r];
                        }
                    }
                }
            }
        }
    }
    Some(res)
}

/// The panel tiles on many columns (1, 2 and 3 panels, partial last panels) and rows
/// (partial last groups) against the reference, bit for bit.
#[rstest]
fn panel_tiles_match_reference(#[values(0, 1, 2, 3, 4, 5, 6, 7, 8, 9)] wi: usize) {
    let w = QUANT_DTYPES[wi];
    let mut rng = Xorshift::new(wi as u64 + 123);
    let vdt = w.vec_dot_type();
    // K-quants: 1, 3, 9 and 19 super-blocks; legacy: 1, 9, 20 and 25 blocks.
    let shapes = if w.block_size() == 256 {
        [(256, 4, 16), (768, 5, 17), (2304, 3, 32), (4864, 7, 45)]
    } else {
        [(32, 4, 16), (288, 5, 17), (640, 3, 32), (800, 7, 45)]
    };
    for k in all_tables() {
        if (k.panel)(w).is_none() {
            continue;
        }
        for (kk, nr, nc) in shapes {
            let nb = kk / w.block_size();
            let a: Vec<Vec<u8>> = (0..nr)
                .map(|_| xorshift_dot_blocks(w, nb, &mut rng))
                .collect();
            let std: Vec<Vec<u8>> = (0..nc)
                .map(|_| {
                    let mut o = vec![0u8; vdt.row_size(kk).unwrap()];
                    ggml_core::quant::quantize_row(vdt, &rng.vec(kk, 2.0), &mut o).unwrap();
                    o
                })
                .collect();
            let got = panel_products(k, w, kk, &a, &std).unwrap();
            for (ri, row) in a.iter().enumerate() {
                for (ci, col) in std.iter().enumerate() {
                    let want = r::vec_dot_quant(w, row, col, kk);
                    assert_eq!(
                        got[ri][ci].to_bits(),
                        want.to_bits(),
                        "{:?} {w} k={kk} panel {nr}x{nc} at ({ri},{ci}): {} vs {want}",
                        k.isa,
                        got[ri][ci]
                    );
                }
            }
        }
    }
}

#[rstest]
fn quant_tiles_match_reference(#[values(0, 1, 2, 3, 4, 5, 6, 7, 8, 9)] wi: usize) {
    let w = QUANT_DTYPES[wi];
    let mut rng = Xorshift::new(wi as u64 + 7);
    // K-quants: 1, 3, 8 + 1 and 2·8 + 3 super-blocks (the x86 tiles take 8 at a time).
    let sizes: &[usize] = if w.block_size() == 32 {
        &[32, 96, 256, 288, 576, 800]
    } else {
        &[256, 768, 2304, 4864]
    };
    for k in all_tables() {
        for &kk in sizes {
            for (nr, nc) in [
                (1, 1),
                (4, 1),
                (1, 4),
                (4, 4),
                (3, 2),
                (4, 2),
                (2, 4),
                (3, 4),
                (4, 3),
            ] {
                check_tile(k, w, kk, nr, nc, &mut rng);
            }
        }
    }
}

/// Quantised tiles (4 × 4, unpacked and panel) at the integer extremes: every quant,
/// scale and min byte at one pattern (all bits set: the largest quants and scales, Q6_K's
/// and Q3_K's most negative scales), activations at their largest magnitudes, so any
/// saturating or overflowing integer step shows.
#[rstest]
fn quant_tiles_match_reference_at_extremes(
    #[values(
        DType::Q2K,
        DType::Q3K,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0
    )]
    w: DType,
) {
    let mut rng = Xorshift::new(99);
    let kk = 2304;
    let ts = w.type_size();
    for fill in [0x00u8, 0xFF, 0x80, 0x7F, 0xAA, 0x55] {
        let mut a = Vec::new();
        for _ in 0..4 {
            // Random blocks give finite f16 scales at their offsets; every other byte
            // takes the pattern.
            let mut row = xorshift_dot_blocks(w, kk / w.block_size(), &mut rng);
            let f16_bytes: &[usize] = match w {
                DType::Q2K => &[80, 81, 82, 83],
                DType::Q3K => &[108, 109],
                DType::Q6K => &[208, 209],
                DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[0, 1],
                _ => &[0, 1, 2, 3],
            };
            for b in row.chunks_exact_mut(ts) {
                let keep: Vec<u8> = f16_bytes.iter().map(|&o| b[o]).collect();
                b.fill(fill);
                for (&o, &v) in f16_bytes.iter().zip(&keep) {
                    b[o] = v;
                }
            }
            a.push(row);
        }
        let y: Vec<Vec<f32>> = [1.0f32, -1.0]
            .iter()
            .flat_map(|&s| {
                [
                    vec![s; kk],
                    (0..kk).map(|i| if i % 3 == 0 { -s } else { s }).collect(),
                ]
            })
            .collect();
        for k in all_tables() {
            check_tile_on(k, w, kk, &a, &y);
            check_tile_on(k, w, kk, &a[..1], &y[..1]);
        }
    }
}

#[rstest]
fn quant_gemv_matches_reference(#[values(0, 1, 2, 3, 4, 5, 6, 7, 8, 9)] wi: usize) {
    let w = QUANT_DTYPES[wi];
    let mut rng = Xorshift::new(wi as u64 + 70);
    let vdt = w.vec_dot_type();
    for k in all_tables() {
        let Some(g) = (k.gemv)(w) else { continue };
        for kk in [
            32, 96, 160, 192, 224, 256, 288, 416, 512, 576, 640, 800, 960, 1536,
        ] {
            if kk % w.block_size() != 0 {
                continue;
            }
            let nb = kk / w.block_size();
            for nr in 1..=4 {
                let a: Vec<Vec<u8>> = (0..nr)
                    .map(|_| xorshift_dot_blocks(w, nb, &mut rng))
                    .collect();
                let y = rng.vec(kk, 2.0);
                let mut std = vec![0u8; vdt.row_size(kk).unwrap()];
                ggml_core::quant::quantize_row(vdt, &y, &mut std).unwrap();
                let mut packed = vec![0xAAu8; (g.pack.row_bytes)(kk)];
                (g.pack.pack)(&y, &mut packed);
                let ar: Vec<&[u8]> = a.iter().map(|v| v.as_slice()).collect();
                let mut out = [f32::NAN; 4];
                (g.rows)(kk, &ar, &packed, &mut out);
                for (ri, row) in a.iter().enumerate() {
                    let want = r::vec_dot_quant(w, row, &std, kk);
                    assert_eq!(
                        out[ri].to_bits(),
                        want.to_bits(),
                        "{:?} {w} k={kk} gemv {nr} rows, row {ri}: {} vs {want}",
                        k.isa,
                        out[ri]
                    );
                }
            }
        }
    }
}

/// A last group with fewer than 8 blocks: the lanes of the missing blocks must add
/// nothing, even where the row's last block has an infinite scale (the reference then
/// gives ±inf; a missing lane computed from that scale would turn it into NaN). The
/// infinite row runs beside finite ones (kernels that put rows in lanes must keep them
/// apart) and alone.
#[test]
fn gemv_partial_groups_add_nothing_for_missing_blocks() {
    let mut rng = Xorshift::new(71);
    for w in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
    ] {
        let vdt = w.vec_dot_type();
        for k in all_tables() {
            let Some(g) = (k.gemv)(w) else { continue };
            for kk in [32, 64, 96, 128, 160, 192, 224, 576, 640, 800] {
                let nb = kk / 32;
                let y: Vec<f32> = (0..kk).map(|i| 1.0 + (i % 5) as f32).collect();
                let mut std = vec![0u8; vdt.row_size(kk).unwrap()];
                ggml_core::quant::quantize_row(vdt, &y, &mut std).unwrap();
                let mut packed = vec![0u8; (g.pack.row_bytes)(kk)];
                (g.pack.pack)(&y, &mut packed);
                for (nr, inf_row) in [(1, 0), (4, 0), (4, 1), (4, 3), (3, 2)] {
                    let mut rows: Vec<Vec<u8>> = (0..nr)
                        .map(|_| xorshift_dot_blocks(w, nb, &mut rng))
                        .collect();
                    let last = (nb - 1) * w.type_size();
                    rows[inf_row][last..last + 2].copy_from_slice(&0x7C00u16.to_le_bytes());
                    let ar: Vec<&[u8]> = rows.iter().map(|v| v.as_slice()).collect();
                    let mut out = [f32::NAN; 4];
                    (g.rows)(kk, &ar, &packed, &mut out);
                    for (ri, row) in rows.iter().enumerate() {
                        let want = r::vec_dot_quant(w, row, &std, kk);
                        if ri == inf_row {
                            assert!(want.is_infinite(), "{w} k={kk}: the reference gives {want}");
                        }
                        assert_eq!(
                            out[ri].to_bits(),
                            want.to_bits(),
                            "{:?} {w} k={kk}, {nr} rows, row {ri} (row {inf_row} infinite)",
                            k.isa
                        );
                    }
                }
            }
        }
    }
}

#[rstest]
fn float_tiles_match_reference(#[values(DType::F32, DType::F16, DType::BF16)] w: DType) {
    let mut rng = Xorshift::new(11);
    for k in all_tables() {
        for kk in [1, 15, 16, 33, 64, 100] {
            for (nr, nc) in [(1, 1), (4, 1), (4, 3), (2, 4)] {
                let mk = |rng: &mut Xorshift| -> Vec<u8> {
                    let v = rng.vec(kk, 2.0);
                    match w {
                        DType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                        DType::F16 => v
                            .iter()
                            .flat_map(|&x| r::f32_to_f16(x).to_le_bytes())
                            .collect(),
                        _ => v
                            .iter()
                            .flat_map(|&x| r::f32_to_bf16(x).to_le_bytes())
                            .collect(),
                    }
                };
                // Allocate as u32 to guarantee alignment.
                let a: Vec<Vec<u32>> = (0..nr).map(|_| to_words(mk(&mut rng))).collect();
                let b: Vec<Vec<u32>> = (0..nc).map(|_| to_words(mk(&mut rng))).collect();
                let n = kk * w.type_size();
                let ar: Vec<&[u8]> = a.iter().map(|v| &bytemuck_bytes(v)[..n]).collect();
                let br: Vec<&[u8]> = b.iter().map(|v| &bytemuck_bytes(v)[..n]).collect();
                let mut out = [0f32; 16];
                ((k.mm)(w).unwrap())(w, kk, &ar, &br, &mut out);
                let mut want = [0f32; 16];
                (super::scalar::KERNELS.mm)(w).unwrap()(w, kk, &ar, &br, &mut want);
                assert_eq!(bits(&out), bits(&want), "{:?} {w} k={kk} {nr}x{nc}", k.isa);
            }
        }
    }
}

fn to_words(b: Vec<u8>) -> Vec<u32> {
    let mut w = vec![0u32; b.len().div_ceil(4)];
    for (i, x) in b.iter().enumerate() {
        w[i / 4] |= u32::from(*x) << (8 * (i % 4));
    }
    w
}

fn bytemuck_bytes(w: &[u32]) -> &[u8] {
    // SAFETY: u32 has no padding and u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(w.as_ptr() as *const u8, w.len() * 4) }
}

#[test]
fn reference_dots_are_close_to_f64() {
    let mut rng = Xorshift::new(5);
    let (x, y) = (rng.vec(1000, 1.0), rng.vec(1000, 1.0));
    let exact: f64 = x.iter().zip(&y).map(|(&a, &b)| a as f64 * b as f64).sum();
    assert!((r::dot_f32(&x, &y) as f64 - exact).abs() < 1e-4);
    let ss: f64 = x.iter().map(|&a| a as f64 * a as f64).sum();
    assert!((r::sum_sq(&x) as f64 - ss).abs() / ss < 1e-6);
    // Quantised block dots against dequantised values.
    let w = DType::Q4_1;
    let a = xorshift_dot_blocks(w, 4, &mut rng);
    let b = xorshift_dot_blocks(DType::Q8_1, 4, &mut rng);
    let mut exact = 0f64;
    for j in 0..4 {
        let (xb, yb) = (&a[j * 20..], &b[j * 36..]);
        let (d, m) = (
            r::f16_to_f32(u16::from_le_bytes([xb[0], xb[1]])),
            r::f16_to_f32(u16::from_le_bytes([xb[2], xb[3]])),
        );
        let (dy, sy) = (
            r::f16_to_f32(u16::from_le_bytes([yb[0], yb[1]])),
            r::f16_to_f32(u16::from_le_bytes([yb[2], yb[3]])),
        );
        for l in 0..32 {
            let q = if l < 16 {
                xb[4 + l] & 15
            } else {
                xb[4 + l - 16] >> 4
            };
            exact += (d as f64 * q as f64) * (dy as f64 * (yb[4 + l] as i8) as f64);
        }
        exact += m as f64 * sy as f64;
    }
    let got = r::vec_dot_quant(w, &a, &b, 128) as f64;
    assert!(
        (got - exact).abs() <= 1e-5 * exact.abs().max(1.0),
        "{got} vs {exact}"
    );
}

#[rstest]
fn activation_quantisers_match_core(
    #[values(DType::Q8_0, DType::Q8_1, DType::Q8K)] d: DType,
    #[values(1, 2, 3)] seed: u64,
) {
    let mut rng = Xorshift::new(seed);
    let n = 512;
    let mut inputs = vec![rng.vec(n, 3.0), vec![0.0; n], rng.vec(n, 1e-30)];
    // Ties: amax 127 makes the scale exactly 1, so x.5 values round half away from zero.
    let mut ties: Vec<f32> = (0..n).map(|i| (i % 64) as f32 - 31.5).collect();
    for c in ties.chunks_mut(32) {
        c[0] = 127.0;
    }
    inputs.push(ties);
    // Q8_K: the first of equal-magnitude extremes decides the sign of the scale.
    let mut sgn = rng.vec(n, 1.0);
    sgn[3] = -2.0;
    sgn[9] = 2.0;
    inputs.push(sgn);
    if d != DType::Q8K {
        // Subnormal maxima: d = amax/127 is not 0 but 1/d overflows, so x·id is ±∞
        // (and 0·∞ NaN), which C's (int) turns into INT_MIN, an i8 of 0.
        let mut tiny = rng.vec(n, 1e-40);
        tiny[5] = 0.0;
        inputs.push(tiny);
    }
    for x in &inputs {
        let mut want = vec![0u8; d.row_size(n).unwrap()];
        ggml_core::quant::quantize_row(d, x, &mut want).unwrap();
        for k in all_tables() {
            let mut got = vec![0xAAu8; want.len()];
            (k.quantize)(d, x, &mut got);
            assert_eq!(got, want, "{:?} {d}", k.isa);
        }
    }
}
