//! Every op × dtype × shape on every ISA level and thread count 1-3, bit-identical to
//! the scalar reference.

// rstest tables take one parameter per column.
#![allow(clippy::too_many_arguments)]

mod common;

use common::{backends, check, f32s, Spec};
use ggml_core::DType::{Q2K, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8K, Q8_0, Q8_1};
use ggml_core::{AttnParams, Context, DType, RopeMode, RopeParams};
use ggml_cpu::CpuBackend;
use rstest::{fixture, rstest};
use std::sync::OnceLock;

const THREADS: [usize; 3] = [1, 2, 3];

#[fixture]
fn bes() -> &'static [CpuBackend] {
    static B: OnceLock<Vec<CpuBackend>> = OnceLock::new();
    B.get_or_init(|| backends(&THREADS))
}

fn f(dt: DType, ne: [usize; 4]) -> impl Fn(&mut Context<'_>) -> ggml_core::TensorId {
    move |ctx| ctx.new_tensor(dt, ne).unwrap()
}

#[rstest]
#[case([7, 1, 1, 1], [7, 1, 1, 1])]
#[case([33, 5, 2, 3], [33, 5, 2, 3])]
#[case([33, 5, 2, 3], [33, 1, 1, 1])]
#[case([16, 4, 6, 1], [1, 4, 3, 1])]
#[case([40, 3, 1, 2], [20, 1, 1, 2])]
// Gemma 3's q/k norm weight: one row of 256 on [256, heads, tokens].
#[case([256, 4, 7, 1], [256, 1, 1, 1])]
// Fewer rows than threads (generation): rows cut into pieces of columns.
#[case([577, 1, 1, 1], [577, 1, 1, 1])]
#[case([300, 2, 1, 1], [1, 1, 1, 1])]
fn add_mul_broadcast(
    bes: &[CpuBackend],
    #[case] a: [usize; 4],
    #[case] b: [usize; 4],
    #[values(DType::F32, DType::F16)] dt: DType,
    #[values(true, false)] add: bool,
) {
    check(bes, 1, |ctx| {
        let x = f(dt, a)(ctx);
        let y = f(DType::F32, b)(ctx);
        Spec::new(if add { ctx.add(x, y) } else { ctx.mul(x, y) }.unwrap())
    });
}

#[rstest]
fn elementwise_on_permuted_views(bes: &[CpuBackend], #[values(0, 1, 2, 3, 4, 5)] op: usize) {
    check(bes, 2, |ctx| {
        let x = f(DType::F32, [6, 17, 3, 1])(ctx);
        let p = ctx.permute(x, [1, 0, 2, 3]).unwrap(); // [17, 6, 3]
        let y = f(DType::F32, [17, 6, 3, 1])(ctx);
        Spec::new(match op {
            0 => ctx.scale(p, 0.3).unwrap(),
            1 => ctx.silu(p).unwrap(),
            2 => ctx.swiglu(p, y).unwrap(),
            4 => ctx.gelu(p).unwrap(),
            5 => ctx.geglu(p, y).unwrap(),
            _ => ctx.add(y, p).unwrap(),
        })
    });
}

#[rstest]
fn unary(
    bes: &[CpuBackend],
    #[values([1, 1, 1, 1], [5, 3, 1, 1], [64, 7, 2, 1], [577, 2, 1, 1], [2048, 1, 1, 1])] ne: [usize;
        4],
) {
    check(bes, 3, |ctx| {
        let x = f(DType::F32, ne)(ctx);
        Spec::new(ctx.silu(x).unwrap())
    });
    check(bes, 4, |ctx| {
        let x = f(DType::F32, ne)(ctx);
        let y = f(DType::F32, ne)(ctx);
        Spec::new(ctx.swiglu(x, y).unwrap())
    });
    check(bes, 5, |ctx| {
        let x = f(DType::F16, ne)(ctx);
        Spec::new(ctx.scale(x, -1.7).unwrap())
    });
    check(bes, 22, |ctx| {
        let x = f(DType::F32, ne)(ctx);
        Spec::new(ctx.gelu(x).unwrap())
    });
    check(bes, 23, |ctx| {
        let x = f(DType::F32, ne)(ctx);
        let y = f(DType::F32, ne)(ctx);
        Spec::new(ctx.geglu(x, y).unwrap())
    });
}

/// gelu and geglu over a wide range of gates: both sides of the +-10 bounds, the bounds
/// themselves, values that round to f16 10, infinities; rows long enough for several of
/// the kernel's 64-value chunks plus a tail.
#[rstest]
fn gelu_geglu_wide_range(
    bes: &[CpuBackend],
    #[values([1, 1, 1, 1], [150, 3, 2, 1])] ne: [usize; 4],
) {
    let n: usize = ne.iter().product();
    let edges = [
        -10.0,
        10.0,
        -10.000001,
        9.999999,
        9.999,
        -9.999,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        65519.0,
    ];
    let gate: Vec<f32> = (0..n)
        .map(|i| match edges.get(i % 97) {
            Some(&e) => e,
            None => ((i * 7919) % 2400) as f32 / 100.0 - 12.0,
        })
        .collect();
    let up: Vec<f32> = (0..n)
        .map(|i| ((i * 31) % 50) as f32 / 10.0 - 2.5)
        .collect();
    check(bes, 24, |ctx| {
        let x = f(DType::F32, ne)(ctx);
        let mut s = Spec::new(ctx.gelu(x).unwrap());
        s.floats.push((x, gate.clone()));
        s
    });
    check(bes, 25, |ctx| {
        let x = f(DType::F32, ne)(ctx);
        let y = f(DType::F32, ne)(ctx);
        let mut s = Spec::new(ctx.geglu(x, y).unwrap());
        s.floats.push((x, gate.clone()));
        s.floats.push((y, up.clone()));
        s
    });
}

#[rstest]
fn rms_norm(
    bes: &[CpuBackend],
    #[values(
        [1, 1, 1, 1],
        [15, 3, 1, 1],
        [576, 5, 2, 1],
        [100, 1, 3, 2],
        [256, 4, 7, 1]
    )]
    ne: [usize; 4],
) {
    check(bes, 6, |ctx| {
        let x = f(DType::F32, ne)(ctx);
        Spec::new(ctx.rms_norm(x, 1e-5).unwrap())
    });
}

#[test]
fn rms_norm_of_transposed_view() {
    let bes = bes();
    check(bes, 7, |ctx| {
        let x = f(DType::F32, [9, 21, 1, 1])(ctx);
        let t = ctx.transpose(x).unwrap();
        Spec::new(ctx.rms_norm(t, 1e-6).unwrap())
    });
}

#[rstest]
#[case([17, 3, 1, 1], None)]
#[case([64, 7, 3, 1], Some(DType::F32))]
#[case([64, 7, 3, 1], Some(DType::F16))]
#[case([33, 5, 4, 2], Some(DType::F16))]
fn soft_max(
    bes: &[CpuBackend],
    #[case] ne: [usize; 4],
    #[case] mask: Option<DType>,
    #[values(0.0, 8.0)] max_bias: f32,
) {
    check(bes, 8, |ctx| {
        let x = f(DType::F32, ne)(ctx);
        let mut spec_floats = vec![];
        let m = mask.map(|dt| {
            let m = ctx.new_tensor(dt, [ne[0], ne[1] + 2, 1, 1]).unwrap();
            // Causal-style mask with -inf.
            let vals: Vec<f32> = (0..ne[0] * (ne[1] + 2))
                .map(|i| {
                    if i % ne[0] > i / ne[0] + 3 {
                        f32::NEG_INFINITY
                    } else {
                        0.1 * (i % 5) as f32
                    }
                })
                .collect();
            spec_floats.push((m, vals));
            m
        });
        let mut s = Spec::new(ctx.soft_max(x, m, 0.7, max_bias).unwrap());
        s.floats = spec_floats;
        s
    });
}

#[rstest]
fn rope(
    bes: &[CpuBackend],
    #[values(RopeMode::Normal, RopeMode::Neox)] mode: RopeMode,
    #[values(DType::F32, DType::F16)] dt: DType,
    #[values(false, true)] yarn: bool,
) {
    check(bes, 9, |ctx| {
        let x = f(dt, [64, 3, 5, 1])(ctx);
        let pos = ctx.new_tensor(DType::I32, [5, 1, 1, 1]).unwrap();
        let mut p = RopeParams::llama(48, 10000.0);
        p.mode = mode;
        if yarn {
            p.ext_factor = 1.0;
            p.freq_scale = 0.25;
            p.n_ctx_orig = 4096;
        }
        let mut s = Spec::new(ctx.rope(x, pos, p).unwrap());
        s.ints.push((pos, vec![0, 1, 7, 100, 4095]));
        s
    });
}

/// NeoX rope over whole heads of 256 (Gemma 3: base 10000 for local layers, 1e6 for
/// global ones), positions up to 32767.
#[rstest]
fn rope_neox_head_256(
    bes: &[CpuBackend],
    #[values(10000.0, 1e6)] base: f32,
    #[values(DType::F32, DType::F16)] dt: DType,
) {
    check(bes, 26, |ctx| {
        let x = f(dt, [256, 4, 6, 1])(ctx);
        let pos = ctx.new_tensor(DType::I32, [6, 1, 1, 1]).unwrap();
        let mut p = RopeParams::llama(256, base);
        p.mode = RopeMode::Neox;
        let mut s = Spec::new(ctx.rope(x, pos, p).unwrap());
        s.ints.push((pos, vec![0, 1, 7, 100, 4095, 32767]));
        s
    });
}

#[test]
fn rope_of_strided_view() {
    // Q of a fused QKV tensor: a view with row stride larger than the row.
    check(bes(), 10, |ctx| {
        let qkv = f(DType::F32, [192, 4, 1, 1])(ctx); // 4 tokens of q|k|v (64 each)
        let q = ctx
            .view(qkv, [32, 2, 4, 1], [4, 128, 768, 3072], 0)
            .unwrap();
        let pos = ctx.new_tensor(DType::I32, [4, 1, 1, 1]).unwrap();
        let mut s = Spec::new(ctx.rope(q, pos, RopeParams::llama(32, 100000.0)).unwrap());
        s.ints.push((pos, vec![3, 2, 1, 0]));
        s
    });
}

#[rstest]
#[case(64, 1, 1)]
#[case(64, 37, 1)]
#[case(33, 5, 2)]
#[case(576, 4, 1)]
fn mul_mat_float(
    bes: &[CpuBackend],
    #[case] k: usize,
    #[case] n: usize,
    #[case] batch: usize,
    #[values(DType::F32, DType::F16, DType::BF16)] w: DType,
) {
    check(bes, 11, |ctx| {
        let a = f(w, [k, 9, batch, 1])(ctx);
        let b = f(DType::F32, [k, n, batch * 3, 1])(ctx); // GQA broadcast r2 = 3
        Spec::new(ctx.mul_mat(a, b).unwrap())
    });
}

#[rstest]
fn mul_mat_quant(
    bes: &[CpuBackend],
    #[values(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K)] w: DType,
    #[values(1, 5, 37)] n: usize,
) {
    let k = if w.block_size() == 32 { 288 } else { 512 };
    check(bes, 12, |ctx| {
        let a = f(w, [k, 11, 1, 1])(ctx);
        let b = f(DType::F32, [k, n, 1, 1])(ctx);
        Spec::new(ctx.mul_mat(a, b).unwrap())
    });
}

/// K-quant products with enough columns for the panel tiles: matrices broadcast over
/// the batch (r2 = 2), partial last panels and row groups, activations that are a
/// transposed view (converted row by row).
#[rstest]
fn mul_mat_kquant_panels(
    bes: &[CpuBackend],
    #[values(Q2K, Q3K, Q4K, Q5K, Q6K)] w: DType,
    #[values(16, 33)] n: usize,
) {
    check(bes, 17, |ctx| {
        let a = f(w, [768, 11, 2, 1])(ctx);
        let b = f(DType::F32, [768, n, 4, 1])(ctx);
        Spec::new(ctx.mul_mat(a, b).unwrap())
    });
    check(bes, 18, |ctx| {
        let a = f(w, [256, 6, 1, 1])(ctx);
        let b = f(DType::F32, [n, 256, 1, 1])(ctx);
        let bt = ctx.transpose(b).unwrap();
        Spec::new(ctx.mul_mat(a, bt).unwrap())
    });
}

#[test]
fn mul_mat_non_contiguous_operands() {
    // KQ with a permuted K view (rows dense) and a permuted Q.
    check(bes(), 13, |ctx| {
        let k = f(DType::F16, [32, 3, 10, 1])(ctx); // [d, heads, tokens]
        let kp = ctx.permute(k, [0, 2, 1, 3]).unwrap(); // [d, tokens, heads]
        let q = f(DType::F32, [32, 6, 5, 1])(ctx); // [d, heads(6), q tokens]
        let qp = ctx.permute(q, [0, 2, 1, 3]).unwrap(); // [d, 5, 6]
        Spec::new(ctx.mul_mat(kp, qp).unwrap())
    });
    // Float weights whose rows are not dense (dims 2,3 moved to 0,1): gathered first.
    check(bes(), 14, |ctx| {
        let w = f(DType::F32, [3, 2, 24, 5])(ctx);
        let wp = ctx.permute(w, [2, 3, 0, 1]).unwrap(); // [24, 5, 3, 2], nb0 = 24
        let x = f(DType::F32, [24, 4, 3, 2])(ctx);
        Spec::new(ctx.mul_mat(wp, x).unwrap())
    });
}

/// The same output row computed inside a 1-row call and inside a 37-row call (and with
/// other thread counts) has identical bits.
#[rstest]
fn mul_mat_row_count_independence(
    #[values(DType::Q4_1, DType::Q8_0, DType::F16, DType::F32, DType::Q4K)] w: DType,
) {
    let k = 512;
    let full = check(bes(), 15, |ctx| {
        let a = f(w, [k, 13, 1, 1])(ctx);
        let b = f(DType::F32, [k, 37, 1, 1])(ctx);
        Spec::new(ctx.mul_mat(a, b).unwrap())
    });
    // Row 20 alone, with the same random inputs: view row 20 of b.
    let one = check(bes(), 15, |ctx| {
        let a = f(w, [k, 13, 1, 1])(ctx);
        let b = f(DType::F32, [k, 37, 1, 1])(ctx);
        let b20 = ctx.view_2d(b, k, 1, 4 * k, 20 * 4 * k).unwrap();
        Spec::new(ctx.mul_mat(a, b20).unwrap())
    });
    let (full, one) = (f32s(&full), f32s(&one));
    assert_eq!(one.len(), 13);
    for m in 0..13 {
        assert_eq!(one[m].to_bits(), full[20 * 13 + m].to_bits(), "row {m}");
    }
}

#[rstest]
fn get_rows(bes: &[CpuBackend], #[values(DType::F32, DType::F16, DType::BF16)] dt: DType) {
    check(bes, 16, |ctx| {
        let a = f(dt, [24, 10, 2, 1])(ctx);
        let idx = ctx.new_tensor(DType::I32, [4, 2, 1, 1]).unwrap();
        let mut s = Spec::new(ctx.get_rows(a, idx).unwrap());
        s.ints.push((idx, vec![9, 0, 3, 3, 1, 2, 8, 7]));
        s
    });
}

#[rstest]
#[case::kv_cache(DType::F16, 40, &[7, 8, 9, 10, 11])]
#[case::scattered(DType::F32, 12, &[11, 0, 5])]
#[case::bf16(DType::BF16, 9, &[3])]
#[case::duplicates_last_wins(DType::F16, 6, &[2, 4, 2, 5])]
fn set_rows(
    bes: &[CpuBackend],
    #[case] dt: DType,
    #[case] rows: usize,
    #[case] at: &'static [i32],
) {
    check(bes, 20, |ctx| {
        let cache = f(dt, [24, rows, 1, 1])(ctx);
        let src = f(DType::F32, [24, at.len(), 1, 1])(ctx);
        let idx = ctx.new_tensor(DType::I32, [at.len(), 1, 1, 1]).unwrap();
        let mut s = Spec::new(ctx.set_rows(cache, src, idx).unwrap());
        s.ints.push((idx, at.to_vec()));
        s
    });
}

#[rstest]
fn cpy_and_cont(
    bes: &[CpuBackend],
    #[values(DType::F32, DType::F16, DType::BF16)] from: DType,
    #[values(DType::F32, DType::F16, DType::BF16)] to: DType,
) {
    // Into a view of a KV-cache-like tensor, from a permuted source.
    check(bes, 17, |ctx| {
        let x = f(from, [8, 3, 5, 1])(ctx);
        let xp = ctx.permute(x, [0, 2, 1, 3]).unwrap(); // [8, 5, 3]
        let cache = f(to, [8, 5, 3, 2])(ctx);
        let v = ctx
            .view(
                cache,
                [8, 5, 3, 1],
                [
                    to.type_size(),
                    8 * to.type_size(),
                    40 * to.type_size(),
                    120 * to.type_size(),
                ],
                120 * to.type_size(),
            )
            .unwrap();
        Spec::new(ctx.cpy(xp, v).unwrap())
    });
    check(bes, 18, |ctx| {
        let x = f(from, [8, 3, 5, 1])(ctx);
        let t = ctx.transpose(x).unwrap();
        Spec::new(ctx.cont(t).unwrap())
    });
    // Cast of a strided view (ggml_cast).
    check(bes, 21, |ctx| {
        let x = f(from, [8, 3, 5, 1])(ctx);
        let t = ctx.transpose(x).unwrap();
        Spec::new(ctx.cont_as(t, to).unwrap())
    });
    // Reshaping copy: different shapes, same element count.
    check(bes, 19, |ctx| {
        let x = f(from, [6, 4, 1, 1])(ctx);
        let y = f(to, [8, 3, 1, 1])(ctx);
        Spec::new(ctx.cpy(x, y).unwrap())
    });
}

#[rstest]
fn concat(
    bes: &[CpuBackend],
    #[values(0, 1, 2, 3)] dim: usize,
    #[values(DType::F32, DType::F16, DType::I32)] dt: DType,
) {
    check(bes, 20, |ctx| {
        let mut na = [5, 3, 2, 2];
        let mut nb = na;
        na[dim] = 2;
        nb[dim] = 3;
        let a = f(dt, na)(ctx);
        let b = f(dt, nb)(ctx);
        Spec::new(ctx.concat(a, b, dim).unwrap())
    });
}

/// Operands that are strided views (a transpose: elements not adjacent in a row).
#[rstest]
fn concat_of_strided_views(#[values(0, 1)] dim: usize) {
    check(bes(), 20, |ctx| {
        let x = f(DType::F32, [3, 4, 1, 1])(ctx);
        let a = ctx.transpose(x).unwrap();
        let b = f(DType::F32, [4, 3, 1, 1])(ctx);
        Spec::new(ctx.concat(a, b, dim).unwrap())
    });
}

/// Masks for [`flash_attn`]: none, causal (the last `n_q` positions unveiled one per
/// query), or causal with holes (every 5th position, one whole query row and the first
/// `2·iq` positions of query `iq` masked too).
#[derive(Clone, Copy, Debug)]
enum AttnMask {
    None,
    Causal,
    Holes,
}

#[rstest]
#[case(64, 1, 7, 9, 3, AttnMask::Causal)]
#[case(64, 5, 32, 9, 3, AttnMask::Causal)]
#[case(32, 3, 17, 4, 4, AttnMask::None)]
#[case(48, 2, 20, 6, 2, AttnMask::Causal)]
#[case(64, 24, 70, 6, 2, AttnMask::Causal)]
#[case(40, 9, 53, 2, 1, AttnMask::Holes)]
// Gemma 3 (1B): head size 256, 4 query heads on 1 KV head (GQA 4).
#[case(256, 5, 40, 4, 1, AttnMask::Causal)]
// Generation: one query, its heads cut between threads.
#[case(256, 1, 40, 4, 1, AttnMask::Causal)]
#[case(64, 2, 30, 16, 2, AttnMask::Holes)]
// 8 query heads per KV head (the most whose sums run together), and 10 (one at a time).
#[case(80, 3, 21, 16, 2, AttnMask::Holes)]
#[case(32, 3, 20, 10, 1, AttnMask::Holes)]
fn flash_attn(
    bes: &[CpuBackend],
    #[case] d: usize,
    #[case] n_q: usize,
    #[case] n_kv: usize,
    #[case] h: usize,
    #[case] h_kv: usize,
    #[case] mask: AttnMask,
    #[values(DType::F16, DType::F32)] kv: DType,
    #[values(0.0, 5.0)] softcap: f32,
    #[values(0.0, 8.0)] max_bias: f32,
) {
    check(bes, 21, |ctx| {
        let q = f(DType::F32, [d, n_q, h, 1])(ctx);
        let k = f(kv, [d, n_kv, h_kv, 1])(ctx);
        let v = f(kv, [d, n_kv, h_kv, 1])(ctx);
        let mut floats = vec![];
        let m = (!matches!(mask, AttnMask::None)).then(|| {
            let m = ctx.new_tensor(DType::F16, [n_kv, n_q + 1, 1, 1]).unwrap();
            let vals: Vec<f32> = (0..n_kv * (n_q + 1))
                .map(|i| {
                    let (j, iq) = (i % n_kv, i / n_kv);
                    let hole =
                        matches!(mask, AttnMask::Holes) && (j % 5 == 3 || iq == 1 || j < 2 * iq);
                    if j > n_kv - n_q + iq || hole {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
                .collect();
            floats.push((m, vals));
            m
        });
        let mut p = AttnParams::scaled(1.0 / (d as f32).sqrt());
        p.softcap = softcap;
        p.max_bias = max_bias;
        let mut s = Spec::new(ctx.flash_attn_ext(q, k, v, m, p).unwrap());
        s.floats = floats;
        s
    });
}

/// Padding the KV length with masked positions leaves the result bit-identical.
#[test]
fn flash_attn_padding_invariance() {
    let (d, n_q, n_kv, pad) = (64, 3, 10, 6);
    let run = |len: usize| {
        f32s(&check(bes(), 22, |ctx| {
            let q = f(DType::F32, [d, n_q, 3, 1])(ctx);
            let kf = f(DType::F16, [d, n_kv + pad, 1, 1])(ctx);
            let vf = f(DType::F16, [d, n_kv + pad, 1, 1])(ctx);
            let k = ctx
                .view(kf, [d, len, 1, 1], [2, 2 * d, 2 * d * len, 2 * d * len], 0)
                .unwrap();
            let v = ctx
                .view(vf, [d, len, 1, 1], [2, 2 * d, 2 * d * len, 2 * d * len], 0)
                .unwrap();
            let m = ctx.new_tensor(DType::F32, [len, n_q, 1, 1]).unwrap();
            let vals: Vec<f32> = (0..len * n_q)
                .map(|i| {
                    if i % len >= n_kv || i % len == 2 {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
                .collect();
            let mut s = Spec::new(
                ctx.flash_attn_ext(q, k, v, Some(m), AttnParams::scaled(0.125))
                    .unwrap(),
            );
            s.floats.push((m, vals));
            s
        }))
    };
    let (a, b) = (run(n_kv), run(n_kv + pad));
    assert_eq!(
        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

#[rstest]
fn get_rows_quantised(
    bes: &[CpuBackend],
    #[values(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2K, Q3K, Q4K, Q5K, Q6K, Q8K)] dt: DType,
) {
    check(bes, 23, |ctx| {
        let a = f(dt, [256, 6, 1, 1])(ctx);
        let idx = ctx.new_tensor(DType::I32, [3, 1, 1, 1]).unwrap();
        let mut s = Spec::new(ctx.get_rows(a, idx).unwrap());
        s.ints.push((idx, vec![5, 0, 5]));
        s
    });
}

#[rstest]
fn cpy_to_quantised(
    bes: &[CpuBackend],
    #[values(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K)] dt: DType,
) {
    check(bes, 24, |ctx| {
        let x = f(DType::F32, [256, 3, 1, 1])(ctx);
        let y = f(dt, [256, 3, 1, 1])(ctx);
        Spec::new(ctx.cpy(x, y).unwrap())
    });
    // CONT of a quantised tensor's row view copies bytes.
    check(bes, 25, |ctx| {
        let x = f(dt, [256, 4, 2, 1])(ctx);
        let rs = dt.row_size(256).unwrap();
        let v = ctx
            .view(
                x,
                [256, 2, 2, 1],
                [dt.type_size(), 2 * rs, 4 * rs, 8 * rs],
                rs,
            )
            .unwrap();
        Spec::new(ctx.cont(v).unwrap())
    });
}

/// Products of one activation convert it once (the executor keeps the converted
/// activations in its scratch for the next product with the same weight dtype), and a
/// node that writes into the activations in between makes the next product convert them
/// again: `y1 = W1 x`, then `x <- x2` (a CPY into x), then `y2 = W2 x` and `y3 = W3 x`
/// must be the products with x2, on every level and thread count, for one column (the
/// matrix × vector layout) and for 20 (the panels).
#[rstest]
fn products_after_a_write_into_their_activations_see_the_new_values(
    bes: &[CpuBackend],
    #[values(1, 20)] n: usize,
) {
    use ggml_core::Backend;
    use ggml_cpu::reference::{self, HostTensor};
    let (k, m) = (256, 12);
    let mut storage = vec![ggml_core::Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 16];
    let mut ctx = Context::new(&mut storage);
    let w: Vec<_> = (0..3).map(|_| f(Q4_1, [k, m, 1, 1])(&mut ctx)).collect();
    let x = f(DType::F32, [k, n, 1, 1])(&mut ctx);
    let x2 = f(DType::F32, [k, n, 1, 1])(&mut ctx);
    let y1 = ctx.mul_mat(w[0], x).unwrap();
    let written = ctx.cpy(x2, x).unwrap();
    let y2 = ctx.mul_mat(w[1], written).unwrap();
    let y3 = ctx.mul_mat(w[2], written).unwrap();
    let mut rng = ggml_test_kit::Xorshift::new(23);
    let mut leaves: Vec<(ggml_core::TensorId, Vec<u8>)> = Vec::new();
    for &t in &w {
        let blocks = ctx.get(t).unwrap().nbytes() / Q4_1.type_size();
        leaves.push((
            t,
            ggml_test_kit::xorshift_quant_blocks(Q4_1, blocks, &mut rng),
        ));
    }
    for t in [x, x2] {
        let v: Vec<u8> = (0..k * n)
            .flat_map(|_| (rng.f() * 2.0).to_le_bytes())
            .collect();
        leaves.push((t, v));
    }
    let bytes = |t: ggml_core::TensorId| &leaves.iter().find(|(l, _)| *l == t).unwrap().1;
    let want = |y: ggml_core::TensorId, wt: ggml_core::TensorId, act: ggml_core::TensorId| {
        let node = *ctx.get(y).unwrap();
        let srcs = [
            HostTensor {
                desc: ctx.get(wt).unwrap(),
                bytes: bytes(wt),
            },
            HostTensor {
                desc: ctx.get(x).unwrap(),
                bytes: bytes(act),
            },
        ];
        let mut out = vec![0u8; node.nbytes()];
        reference::compute(&node, &srcs, &mut out).unwrap();
        out
    };
    let wants = [want(y1, w[0], x), want(y2, w[1], x2), want(y3, w[2], x2)];
    let olds = [want(y1, w[0], x), want(y2, w[1], x), want(y3, w[2], x)];
    for be in bes {
        let (tensors, buf) = common::place(&ctx, be);
        for (t, b) in &leaves {
            be.set_tensor_async(&tensors[t.index()], 0, b).unwrap();
        }
        be.graph_compute(&tensors, &[y1, written, y2, y3]).unwrap();
        be.synchronize().unwrap();
        for (i, (y, want)) in [y1, y2, y3].iter().zip(&wants).enumerate() {
            let mut got = vec![0u8; want.len()];
            be.get_tensor(&tensors[y.index()], 0, &mut got).unwrap();
            assert!(
                &got == want,
                "isa {} threads {} n {n}: product {} differs from the reference (equals the product with the old x: {})",
                be.isa(),
                be.n_threads(),
                y.index(),
                got == *olds.get(i).expect("three products")
            );
        }
        be.free_buffer(buf).unwrap();
    }
}
