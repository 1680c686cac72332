//! ADD, MUL, DIV (with broadcasting), SCALE, CLAMP, SILU, SWIGLU, GELU, GEGLU.

use std::sync::OnceLock;

use ggml_core::Op;

use crate::exec::{KResult, NodeCtx};
use crate::pool::ThreadCtx;
use crate::reference as r;
use crate::simd::Kernels;

/// Columns per piece when rows are cut between threads (a multiple of every vector width).
const PIECE_ALIGN: usize = 64;

pub(crate) fn run(c: &NodeCtx<'_>, th: &ThreadCtx<'_>) -> KResult {
    let dst = c.dst;
    let n = dst.ne[0];
    // Fewer rows than threads (generation): the rows are cut into pieces of columns,
    // which needs rows the threads can write in place and sources no thread writes.
    let in_place = !c.alias.iter().any(|&a| a)
        && dst.dtype == ggml_core::DType::F32
        && dst.rows_dense()
        && (dst.ptr as usize).is_multiple_of(4)
        && dst.nb[1..].iter().all(|s| s.is_multiple_of(4));
    let pieces = if in_place && dst.nrows() < th.nth {
        th.nth.min(n.div_ceil(PIECE_ALIGN)).max(1)
    } else {
        1
    };
    let per = n.div_ceil(pieces).div_ceil(PIECE_ALIGN) * PIECE_ALIGN;
    // Units are (row, piece): whole rows split between threads, or the pieces of all
    // rows dealt out in turn.
    let (u0, u1, step) = match pieces {
        1 => {
            let (r0, r1) = NodeCtx::split(dst.nrows(), th.ith, th.nth);
            (r0, r1, 1)
        }
        _ => (th.ith, dst.nrows() * pieces, th.nth),
    };
    let sc = c.scratch_f32();
    let (xa, rest) = sc.split_at_mut(n);
    let (xb, rest) = rest.split_at_mut(n);
    let xo = &mut rest[..n];
    let a = c.src[0];
    let b = c.src[1];
    let binary = matches!(
        c.node.op,
        Op::Add | Op::Mul | Op::Div | Op::Swiglu | Op::Geglu
    );
    for u in (u0..u1).step_by(step) {
        let (r, piece) = (u / pieces, u % pieces);
        let (c0, c1) = ((piece * per).min(n), ((piece + 1) * per).min(n));
        if c0 == c1 {
            continue;
        }
        let (i1, i2, i3) = dst.row_index(r);
        // SAFETY (all row accesses below): rows of resolved tensors; this thread alone
        // writes columns c0..c1 of dst row r, and sources that share bytes with dst are
        // copied first (only whole rows, one thread each, do that).
        let av: &[f32] = match (c.alias[0], unsafe { a.row_f32(i1, i2, i3) }) {
            (false, Some(s)) => s,
            _ => {
                unsafe { a.read_row(i1, i2, i3, xa) };
                xa
            }
        };
        let bv: &[f32] = if binary {
            let (j1, j2, j3) = (i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]);
            match (c.alias[1], b.ne[0] == n, unsafe { b.row_f32(j1, j2, j3) }) {
                (false, true, Some(s)) => s,
                (_, true, _) => {
                    unsafe { b.read_row(j1, j2, j3, xb) };
                    xb
                }
                _ => {
                    let row = b.row_ptr(j1, j2, j3);
                    for (i0, v) in xb.iter_mut().enumerate().take(c1).skip(c0) {
                        *v = unsafe { b.get(row, i0 % b.ne[0]) };
                    }
                    xb
                }
            }
        } else {
            &[]
        };
        let bv = if binary { &bv[c0..c1] } else { bv };
        if pieces > 1 {
            // Only this piece of the row: other threads write the rest of it.
            let p = (dst.row_ptr(i1, i2, i3) as *mut f32).wrapping_add(c0);
            let out = unsafe { std::slice::from_raw_parts_mut(p, c1 - c0) };
            apply(c, &av[c0..c1], bv, out)?;
            continue;
        }
        let direct = unsafe { dst.row_f32_mut(i1, i2, i3) };
        let is_direct = direct.is_some();
        let out: &mut [f32] = match direct {
            Some(d) => d,
            None => &mut xo[..],
        };
        apply(c, av, bv, out)?;
        if !is_direct {
            unsafe { dst.write_row(i1, i2, i3, xo) };
        }
    }
    Ok(())
}

/// `out = op(av, bv)` for the node's op, element by element.
fn apply(c: &NodeCtx<'_>, av: &[f32], bv: &[f32], out: &mut [f32]) -> KResult {
    match c.node.op {
        Op::Add => {
            for ((o, &x), &y) in out.iter_mut().zip(av).zip(bv) {
                *o = x + y;
            }
        }
        Op::Mul => {
            for ((o, &x), &y) in out.iter_mut().zip(av).zip(bv) {
                *o = x * y;
            }
        }
        Op::Div => {
            for ((o, &x), &y) in out.iter_mut().zip(av).zip(bv) {
                *o = x / y;
            }
        }
        Op::Clamp { min, max } => clamp_row(av, min, max, out),
        Op::Scale { scale } => {
            for (o, &x) in out.iter_mut().zip(av) {
                *o = x * scale;
            }
        }
        Op::Silu => (c.k.silu)(av, out),
        Op::Swiglu => (c.k.swiglu)(av, bv, out),
        Op::Gelu => gelu_row(c.k, av, None, out),
        Op::Geglu => gelu_row(c.k, av, Some(bv), out),
        _ => {
            return Err((
                ggml_core::BackendErrorKind::UnsupportedOp,
                "not elementwise",
            ))
        }
    }
    Ok(())
}

/// `out_i = reference::clamp(x_i, lo, hi)`, written as compares and selects the
/// compiler turns into vector min/max and blends.
fn clamp_row(x: &[f32], lo: f32, hi: f32, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        let m = if v < hi { v } else { hi };
        let m = if m > lo { m } else { lo };
        *o = if v.is_nan() { v } else { m };
    }
}

/// ggml's `ggml_table_gelu_f16`, widened to f32: entry `h` is
/// `f16_to_f32(reference::gelu_f16(h))`. Built once, on first use (65536 `tanhf`).
fn gelu_table() -> &'static [f32] {
    static TABLE: OnceLock<Box<[f32]>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|h| r::f16_to_f32(r::gelu_f16(h)))
            .collect()
    })
}

/// `out_i = gelu(x_i)`, or `gelu(x_i) · g_i` with `g`: [`reference::gelu`](r::gelu) and
/// [`reference::geglu`](r::geglu) bit for bit, through the table. `x` is rounded to f16
/// by the ISA level's converter (the same rounding as the reference's), a chunk at a
/// time.
pub(crate) fn gelu_row(k: &Kernels, x: &[f32], g: Option<&[f32]>, out: &mut [f32]) {
    const CHUNK: usize = 64;
    let table = gelu_table();
    let mut h = [0u16; CHUNK];
    for (c, (xc, oc)) in x.chunks(CHUNK).zip(out.chunks_mut(CHUNK)).enumerate() {
        let h = &mut h[..xc.len()];
        (k.f32_to_f16)(xc, h);
        match g {
            None => {
                for ((o, &v), &hv) in oc.iter_mut().zip(xc).zip(h.iter()) {
                    *o = if v <= -10.0 {
                        0.0
                    } else if v >= 10.0 {
                        v
                    } else {
                        table[hv as usize]
                    };
                }
            }
            Some(g) => {
                let gc = &g[c * CHUNK..c * CHUNK + xc.len()];
                for (((o, &v), &hv), &w) in oc.iter_mut().zip(xc).zip(h.iter()).zip(gc) {
                    *o = if v <= -10.0 {
                        0.0
                    } else if v >= 10.0 {
                        v * w
                    } else {
                        table[hv as usize] * w
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every f16 value, values between f16 neighbours (rounding ties and near-ties),
    /// the +-10 bounds and their f32 neighbours, infinities and NaN.
    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (0..=u16::MAX).map(r::f16_to_f32).collect();
        for h in 0..0x7bffu16 {
            let (a, b) = (r::f16_to_f32(h), r::f16_to_f32(h + 1));
            let mid = (a + b) / 2.0; // exact: a tie, rounds to even
            for m in [mid, -mid] {
                v.extend([
                    m,
                    f32::from_bits(m.to_bits() - 1),
                    f32::from_bits(m.to_bits() + 1),
                ]);
            }
        }
        for b in [10f32, -10.0] {
            v.extend([
                b,
                f32::from_bits(b.to_bits() - 1),
                f32::from_bits(b.to_bits() + 1),
            ]);
        }
        v.extend([
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e30,
            -1e30,
            65520.0,
            -65520.0,
        ]);
        v
    }

    #[test]
    fn gelu_table_is_the_reference_formula_bit_for_bit() {
        let t = gelu_table();
        for h in 0..=u16::MAX {
            let want = r::f16_to_f32(r::f32_to_f16(r::gelu_f32(r::f16_to_f32(h))));
            if want.is_nan() {
                assert!(t[h as usize].is_nan(), "entry {h:#06x}");
            } else {
                assert_eq!(t[h as usize].to_bits(), want.to_bits(), "entry {h:#06x}");
            }
        }
    }

    /// The table is llama.cpp's `ggml_table_gelu_f16`: FNV-1a (64-bit) of its 65536
    /// entries as little-endian f16 bits, NaN entries written as 0x7e00, equals the
    /// digest of what llama.cpp's `ggml_gelu` gives on an F16 tensor holding every f16
    /// bit pattern (that op reads the table directly), computed with llama-cpp-python
    /// 0.3.36's ggml built for x86-64 with `-march=native` (AVX2, FMA), glibc. Rust's
    /// `f32::tanh` is the C library's `tanhf`: on a host whose libm rounds `tanhf`
    /// differently this fails, and there llama.cpp's own table differs the same way.
    #[test]
    fn gelu_table_is_llama_cpps() {
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        let mut nans = 0;
        for h in 0..=u16::MAX {
            let mut v = r::gelu_f16(h);
            if (v & 0x7c00) == 0x7c00 && (v & 0x3ff) != 0 {
                v = 0x7e00;
                nans += 1;
            }
            for b in v.to_le_bytes() {
                hash = (hash ^ b as u64).wrapping_mul(0x0100_0000_01b3);
            }
        }
        // 2046 NaN inputs, and -inf (0.5·(-inf)·(1 + tanh(-inf)) = -inf·0).
        assert_eq!(nans, 2047);
        assert_eq!(hash, 0xd101_f521_207d_200c);
        assert_eq!(r::gelu_f16(0xbfff), 0xa9d3);
    }

    /// The fast path equals the reference bit for bit (NaN: NaN, payload unspecified)
    /// on every ISA level, gelu and geglu, over all f16 inputs and the edges.
    #[test]
    fn gelu_geglu_rows_match_the_reference_on_every_isa() {
        let x = inputs();
        let g: Vec<f32> = (0..x.len())
            .map(|i| match i % 7 {
                0 => f32::NAN,
                1 => -0.0,
                2 => f32::INFINITY,
                _ => (i % 1000) as f32 / 250.0 - 2.0,
            })
            .collect();
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        for k in crate::simd::all_tables() {
            let mut o = vec![0f32; x.len()];
            gelu_row(k, &x, None, &mut o);
            for (i, (&v, &got)) in x.iter().zip(&o).enumerate() {
                assert!(
                    same(got, r::gelu(v)),
                    "{:?} gelu({v:e}) #{i}: {got:e}",
                    k.isa
                );
            }
            gelu_row(k, &x, Some(&g), &mut o);
            for (i, ((&v, &w), &got)) in x.iter().zip(&g).zip(&o).enumerate() {
                let want = r::geglu(v, w);
                assert!(
                    same(got, want),
                    "{:?} geglu({v:e}, {w:e}) #{i}: {got:e}",
                    k.isa
                );
            }
        }
    }
}
