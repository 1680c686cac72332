//! Fused decode-class runs against the unfused kernels, on cuda-sim (or the GPU under
//! `GGML_RS_REQUIRE_GPU`): RMS norm x weight in the product's prologue, Q/K/V in one
//! launch, gate + up + SwiGLU/GeGLU, and the residual add in the product's epilogue; and
//! prompt-class products that share one quantisation of their activation (made by the
//! norm's kernel after a norm). A
//! fused launch writes every node it replaces, with the bits of the unfused kernels, so
//! every node of every graph here is read back and compared. Runs that cannot be fused
//! (an output over bytes the run reads, a tensor on another device) go node by node.

// Not every helper of the shared module is needed here.
#[allow(dead_code)]
mod common;

use common::{f32_bytes, gpu, place_and_upload, read_back, Lcg};
use ggml_core::{Backend, BackendErrorKind, Context, DType, DataRef, Op, Tensor, TensorId};
use ggml_cuda::{CudaBackend, CudaTuning, KernelId};
use ggml_test_kit::quantize_rows;
use rstest::rstest;

fn storage() -> Vec<Tensor> {
    vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 64]
}

/// Places every non-view tensor of `ctx` in one buffer of `be` filled with `fill` (so an
/// output nobody writes shows), uploads `inputs`, computes every node in id order with
/// `tuning`, and returns the bytes of every node. Also returns the launches it took.
fn run_nodes(
    be: &CudaBackend,
    ctx: &mut Context<'_>,
    inputs: &[(TensorId, Vec<u8>)],
    tuning: CudaTuning,
    fill: u8,
) -> (Vec<Vec<u8>>, u64) {
    be.set_tuning(tuning);
    let (buf, nodes) = place_and_upload(be, ctx, inputs, fill);
    let ts = ctx.tensors();
    let before: u64 = be.kernel_stats().launches.iter().sum();
    be.graph_compute(ts, &nodes).unwrap();
    be.synchronize().unwrap();
    let launches = be.kernel_stats().launches.iter().sum::<u64>() - before;
    let outs = read_back(be, ts, &nodes);
    be.free_buffer(buf.id).unwrap();
    (outs, launches)
}

/// Fused (`tuning`) against unfused: every node's bytes equal, the fused run's buffer
/// filled differently (0xff: NaN) so a node it left unwritten would differ. Returns the
/// launches of both runs.
fn fused_vs_unfused(
    build: impl Fn(&mut Context<'_>) -> Vec<(TensorId, Vec<u8>)>,
    tuning: CudaTuning,
) -> (u64, u64) {
    let be = gpu();
    let mut s1 = storage();
    let mut c1 = Context::new(&mut s1);
    let inputs = build(&mut c1);
    let (plain, n_plain) = run_nodes(&be, &mut c1, &inputs, tuning.without_fusions(), 0);
    let mut s2 = storage();
    let mut c2 = Context::new(&mut s2);
    let inputs = build(&mut c2);
    let (fused, n_fused) = run_nodes(&be, &mut c2, &inputs, tuning, 0xff);
    assert_eq!(plain.len(), fused.len());
    for (i, (a, b)) in plain.iter().zip(&fused).enumerate() {
        assert!(a == b, "node {i}: fused and unfused bytes differ");
    }
    (n_plain, n_fused)
}

/// A llama layer's products as the harness orders them: norm, Q, K, V (Q reshaped into
/// heads and back as the O product's input), O + residual, norm, gate, up, GLU, down +
/// residual; `n` tokens, weights of `dts` (Q, K, V, O, gate, up, down), embedding 256,
/// K/V 64, FFN 512.
fn layer(
    ctx: &mut Context<'_>,
    n: usize,
    dts: [DType; 7],
    geglu: bool,
    seed: u64,
) -> Vec<(TensorId, Vec<u8>)> {
    layer_of(ctx, n, dts, geglu, seed, (256, 64, 512))
}

/// [`layer`] with embedding, K/V and FFN widths `(e, kv, ff)` (`e` a multiple of 64).
fn layer_of(
    ctx: &mut Context<'_>,
    n: usize,
    dts: [DType; 7],
    geglu: bool,
    seed: u64,
    (e, kv, ff): (usize, usize, usize),
) -> Vec<(TensorId, Vec<u8>)> {
    let mut r = Lcg(seed);
    let mut inputs = Vec::new();
    let x = ctx.new_tensor(DType::F32, [e, n, 1, 1]).unwrap();
    inputs.push((x, f32_bytes(&r.vec(e * n))));
    let g1 = ctx.new_tensor(DType::F32, [e, 1, 1, 1]).unwrap();
    let g2 = ctx.new_tensor(DType::F32, [e, 1, 1, 1]).unwrap();
    inputs.push((g1, f32_bytes(&r.vec(e))));
    inputs.push((g2, f32_bytes(&r.vec(e))));
    let mut w = |ctx: &mut Context<'_>, dt: DType, k: usize, m: usize| {
        let t = ctx.new_tensor(dt, [k, m, 1, 1]).unwrap();
        inputs.push((t, quantize_rows(dt, &r.vec(k * m), k)));
        t
    };
    let wq = w(ctx, dts[0], e, e);
    let wk = w(ctx, dts[1], e, kv);
    let wv = w(ctx, dts[2], e, kv);
    let wo = w(ctx, dts[3], e, e);
    let wg = w(ctx, dts[4], e, ff);
    let wu = w(ctx, dts[5], e, ff);
    let wd = w(ctx, dts[6], ff, e);
    let rn = ctx.rms_norm(x, 1e-5).unwrap();
    let cur = ctx.mul(rn, g1).unwrap();
    let q = ctx.mul_mat(wq, cur).unwrap();
    let _k = ctx.mul_mat(wk, cur).unwrap();
    let _v = ctx.mul_mat(wv, cur).unwrap();
    let q3 = ctx.reshape(q, [64, e / 64, n, 1]).unwrap();
    let o = ctx.reshape(q3, [e, n, 1, 1]).unwrap();
    let o = ctx.mul_mat(wo, o).unwrap();
    let h = ctx.add(o, x).unwrap();
    let rn2 = ctx.rms_norm(h, 1e-5).unwrap();
    let cur2 = ctx.mul(rn2, g2).unwrap();
    let gate = ctx.mul_mat(wg, cur2).unwrap();
    let up = ctx.mul_mat(wu, cur2).unwrap();
    let act = if geglu {
        ctx.geglu(gate, up).unwrap()
    } else {
        ctx.swiglu(gate, up).unwrap()
    };
    let d = ctx.mul_mat(wd, act).unwrap();
    ctx.add(h, d).unwrap();
    inputs
}

/// The whole layer in 4 launches with every fusion on, for 1, 3 and 7 tokens, equal
/// dtypes (SmolLM2's Q4_1) and mixed ones (a Q4_K_M-like mix with Q6_K V and down), and
/// GeGLU.
#[rstest]
#[case::q4_1_one_token(1, [DType::Q4_1; 7], false)]
#[case::q4_1_three_tokens(3, [DType::Q4_1; 7], false)]
#[case::mixed_seven_tokens(
    7,
    [DType::Q4K, DType::Q4K, DType::Q6K, DType::Q4K, DType::Q4K, DType::Q4K, DType::Q6K],
    false
)]
#[case::mixed_geglu(
    2,
    [DType::Q8_0, DType::Q5_0, DType::Q2K, DType::Q4_0, DType::Q3K, DType::Q5K, DType::Q5_1],
    true
)]
fn a_layer_fused_is_the_layer_unfused(
    #[case] n: usize,
    #[case] dts: [DType; 7],
    #[case] geglu: bool,
) {
    let (plain, fused) = fused_vs_unfused(
        |ctx| layer(ctx, n, dts, geglu, 7 + n as u64),
        CudaTuning::default(),
    );
    // rms, mul, 3 products, product, add, rms, mul, 2 products, GLU, product, add.
    assert_eq!(plain, 14);
    assert_eq!(fused, 4);
}

/// Decode-class products on the `qmm` variants compiled for their dtype and fused form
/// (`specialize`, on by default) against the generic entry (`no-specialize`): every
/// node's bytes equal; with variants every `qmm` launch of a layer of one dtype runs
/// one, without none does; matrices of several dtypes in one launch run the generic
/// entry.
#[rstest]
#[case::q4_0(DType::Q4_0, false)]
#[case::q4_1(DType::Q4_1, false)]
#[case::q5_0(DType::Q5_0, false)]
#[case::q5_1_geglu(DType::Q5_1, true)]
#[case::q8_0(DType::Q8_0, false)]
#[case::q2_k(DType::Q2K, false)]
#[case::q3_k_geglu(DType::Q3K, true)]
#[case::q4_k(DType::Q4K, false)]
#[case::q5_k(DType::Q5K, false)]
#[case::q6_k(DType::Q6K, false)]
fn qmm_variants_give_the_generic_entrys_bits(#[case] dt: DType, #[case] geglu: bool) {
    let be = gpu();
    let tuning = |s: &str| s.parse::<CudaTuning>().unwrap();
    let mixed = [DType::Q4K, DType::Q4K, DType::Q6K, dt, dt, dt, dt];
    let mut runs = Vec::new();
    for (tuning, dts) in [
        (tuning("no-specialize"), [dt; 7]),
        (tuning("default"), [dt; 7]),
        (tuning("specialize-dtype"), [dt; 7]),
        (tuning("default"), mixed),
        (tuning("specialize-dtype"), mixed),
    ] {
        let mut st = storage();
        let mut ctx = Context::new(&mut st);
        let inputs = layer(&mut ctx, 1, dts, geglu, 13);
        let before = be.kernel_stats();
        let (outs, _) = run_nodes(&be, &mut ctx, &inputs, tuning, 0);
        let after = be.kernel_stats();
        let qmm = after.launches_of(KernelId::Qmm) - before.launches_of(KernelId::Qmm);
        runs.push((outs, after.qmm_variants - before.qmm_variants, qmm));
    }
    assert!(
        runs[0].0 == runs[1].0,
        "form variants and generic entry bytes differ"
    );
    assert!(
        runs[0].0 == runs[2].0,
        "dtype variants and generic entry bytes differ"
    );
    assert!(
        runs[3].0 == runs[4].0,
        "mixed: form and dtype variants differ"
    );
    // Norm + Q, K, V; O + add; norm + gate, up + GLU; down + add.
    assert_eq!((runs[0].1, runs[0].2), (0, 4), "no-specialize");
    assert_eq!((runs[1].1, runs[1].2), (4, 4), "specialize");
    assert_eq!((runs[2].1, runs[2].2), (4, 4), "specialize-dtype");
    // Q, K, V of two dtypes: that launch on the generic entry.
    assert_eq!((runs[3].1, runs[3].2), (3, 4), "mixed Q, K, V");
    assert_eq!(
        (runs[4].1, runs[4].2),
        (3, 4),
        "mixed Q, K, V, dtype variants"
    );
}

/// Runs `nodes` of `ctx` with the backend's tuning, every tensor of `places` at its byte
/// offset in one 16 KiB buffer (placed by hand, overlaps included) and `inputs` uploaded:
/// `out`'s bytes and the launches of `kernel` the run took.
fn run_placed(
    be: &CudaBackend,
    ctx: &mut Context<'_>,
    places: &[(TensorId, u64)],
    inputs: &[(TensorId, Vec<u8>)],
    nodes: &[TensorId],
    out: TensorId,
    kernel: KernelId,
) -> (Vec<u8>, u64) {
    let buf = be.alloc_buffer(16384).unwrap();
    be.buffer_clear(buf.id, 0).unwrap();
    for &(id, at) in places {
        ctx.tensors_mut()[id.index()].data = Some(DataRef {
            buffer: buf.id,
            addr: buf.base + at,
        });
    }
    let ts = ctx.tensors();
    for (id, bytes) in inputs {
        be.set_tensor_async(&ts[id.index()], 0, bytes).unwrap();
    }
    let before = be.kernel_stats().launches_of(kernel);
    be.graph_compute(ts, nodes).unwrap();
    be.synchronize().unwrap();
    let launches = be.kernel_stats().launches_of(kernel) - before;
    let mut bytes = vec![0u8; ts[out.index()].nbytes()];
    be.get_tensor(&ts[out.index()], 0, &mut bytes).unwrap();
    be.free_buffer(buf.id).unwrap();
    (bytes, launches)
}

/// A prompt-sized layer (the tiled class): each norm, its weight and the Q8_1 blocks of
/// the result in one `rms_norm_q8_1`, which Q, K, V (and gate, up) share; the SwiGLU and
/// the Q8_1 blocks of its result in one `swiglu_q8_1`, which down reads; O quantises its
/// own activation; on `qgemm` O and down add the residual in their epilogues (and Q, K,
/// V, or gate and up, are one `qgemm` launch).
/// 7 `quantize_q8_1`, 2 `rms_norm`, 4 binary (MUL, ADD) and a `swiglu` launch become 1
/// `quantize_q8_1`, 2 `rms_norm_q8_1` and a `swiglu_q8_1`, with every node's bytes those
/// of the unfused layer, on `qgemm` and with `no-qgemm` on `qmm`'s tiles (the adds
/// apart). Without `fuse_norm` the norm runs alone and Q, K, V (gate, up) still share one
/// `quantize_q8_1`; without `fuse_glu` the SwiGLU runs alone and down quantises it.
///
/// Embeddings of 8 and 10 Q8_1 blocks (one per warp of `rms_norm_q8_1`) and 40 (32
/// warps, 8 of which take a second block, its loads ahead of the first's quantisation).
/// K and V of 48 rows (a partial row block in the merged launch) and mixed dtypes (each
/// matrix's blocks unpack their own) on `qgemm` too.
#[rstest]
#[case::q4_1_16_tokens(16, [DType::Q4_1; 7], true, (256, 64))]
#[case::q4_1_9_tokens_320(9, [DType::Q4_1; 7], true, (320, 64))]
#[case::q8_0_24_tokens_1280(24, [DType::Q8_0; 7], true, (1280, 64))]
#[case::mixed_33_tokens_kv_48(
    33,
    [DType::Q4K, DType::Q5_0, DType::Q6K, DType::Q8_0, DType::Q3K, DType::Q2K, DType::Q5K],
    true,
    (256, 48)
)]
#[case::mixed_40_tokens_qmm(
    40,
    [DType::Q4K, DType::Q5_0, DType::Q6K, DType::Q8_0, DType::Q3K, DType::Q2K, DType::Q5K],
    false,
    (256, 64)
)]
fn a_prompt_layer_quantises_each_shared_activation_once(
    #[case] n: usize,
    #[case] dts: [DType; 7],
    #[case] qgemm: bool,
    #[case] (e, kv): (usize, usize),
) {
    let layer = |ctx: &mut Context<'_>, n, dts, geglu, seed| {
        layer_of(ctx, n, dts, geglu, seed, (e, kv, 512))
    };
    let tuning = CudaTuning {
        qgemm,
        ..CudaTuning::default()
    };
    let be = gpu();
    let counts = |t: CudaTuning| {
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let inputs = layer(&mut ctx, n, dts, false, 3 + n as u64);
        let stats = be.kernel_stats();
        let (outs, launches) = run_nodes(&be, &mut ctx, &inputs, t, 0);
        let after = be.kernel_stats();
        let of = |k| after.launches_of(k) - stats.launches_of(k);
        let kernels = [
            of(KernelId::QuantizeQ8_1),
            of(KernelId::RmsNorm),
            of(KernelId::RmsNormQ8_1),
            of(KernelId::Binary),
            of(KernelId::Qgemm) + of(KernelId::Qmm),
            of(KernelId::Swiglu),
            of(KernelId::SwigluQ8_1),
        ];
        (outs, launches, kernels)
    };
    let (plain, n_plain, k_plain) = counts(tuning.without_fusions());
    let (fused, n_fused, k_fused) = counts(tuning);
    assert!(plain == fused, "the fused runs changed a node's bytes");
    // The residual adds go into qgemm's epilogue, and Q, K, V (gate, up) into one qgemm
    // launch; qmm's tiles keep them apart.
    let adds = if qgemm { 0 } else { 2 };
    let (products, merged) = if qgemm { (4, 3) } else { (7, 0) };
    assert_eq!(k_plain, [7, 2, 0, 4, 7, 1, 0]);
    assert_eq!(k_fused, [1, 0, 2, adds, products, 0, 1]);
    assert_eq!(n_plain - n_fused, 10 - adds + merged);
    let no_norm = CudaTuning {
        fuse_norm: false,
        ..tuning
    };
    let (alone, _, k_alone) = counts(no_norm);
    assert!(plain == alone, "shared quantisation changed a node's bytes");
    assert_eq!(k_alone, [3, 2, 0, 2 + adds, products, 0, 1]);
    let no_glu = CudaTuning {
        fuse_glu: false,
        ..tuning
    };
    let (apart, _, k_apart) = counts(no_glu);
    assert!(plain == apart, "the SwiGLU alone changed a node's bytes");
    assert_eq!(k_apart, [2, 0, 2, adds, products, 1, 0]);
    // fused_vs_unfused's 0xff fill: no node left unwritten.
    fused_vs_unfused(|ctx| layer(ctx, n, dts, false, 3 + n as u64), tuning);
}

/// The norm's output placed by hand over the norm weight: the unfused kernels, one after
/// the other, make the MUL read the norm's first row as its weight; one fused kernel would
/// read the weight of some rows before and of others after it is overwritten. The run
/// goes node by node, with the unfused bits.
#[test]
fn a_prompt_norm_over_its_weight_runs_node_by_node() {
    let be = gpu();
    let (k, m, n) = (64, 32, 8);
    let mut r = Lcg(5);
    let xv = r.vec(k * n);
    let gv = r.vec(k);
    let wv = quantize_rows(DType::Q4_0, &r.vec(k * m), k);
    let mut results = Vec::new();
    for tuning in [
        CudaTuning::default().without_fusions(),
        CudaTuning::default(),
    ] {
        be.set_tuning(tuning);
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let x = ctx.new_tensor(DType::F32, [k, n, 1, 1]).unwrap();
        let g = ctx.new_tensor(DType::F32, [k, 1, 1, 1]).unwrap();
        let w = ctx.new_tensor(DType::Q4_0, [k, m, 1, 1]).unwrap();
        let rn = ctx.rms_norm(x, 1e-5).unwrap();
        let cur = ctx.mul(rn, g).unwrap();
        let y = ctx.mul_mat(w, cur).unwrap();
        let (out, launches) = run_placed(
            &be,
            &mut ctx,
            &[
                (x, 0),
                (g, 4096),
                (w, 10240),
                (rn, 4096),
                (cur, 8192),
                (y, 12288),
            ],
            &[(x, f32_bytes(&xv)), (g, f32_bytes(&gv)), (w, wv.clone())],
            &[rn, cur, y],
            y,
            KernelId::RmsNorm,
        );
        assert_eq!(launches, 1);
        results.push(out);
    }
    assert_eq!(results[0], results[1]);
}

/// A prompt-class product whose output lies over the activation it shares with the next
/// product (as an allocator may place it if the graph let it): the run goes node by node,
/// so the second product quantises what the unfused one reads, with the unfused bits.
#[test]
fn a_shared_activation_overwritten_by_a_product_is_quantised_again() {
    let be = gpu();
    let (k, m, n) = (64, 64, 8);
    let mut r = Lcg(21);
    let xv = r.vec(k * n);
    let wv = quantize_rows(DType::Q8_0, &r.vec(k * m), k);
    let mut results = Vec::new();
    for tuning in [
        CudaTuning::default().without_fusions(),
        CudaTuning::default(),
    ] {
        be.set_tuning(tuning);
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let x = ctx.new_tensor(DType::F32, [k, n, 1, 1]).unwrap();
        let w = ctx.new_tensor(DType::Q8_0, [k, m, 1, 1]).unwrap();
        let y1 = ctx.mul_mat(w, x).unwrap();
        let y2 = ctx.mul_mat(w, x).unwrap();
        let (out, launches) = run_placed(
            &be,
            &mut ctx,
            &[(x, 0), (w, 4096), (y1, 0), (y2, 12288)],
            &[(x, f32_bytes(&xv)), (w, wv.clone())],
            &[y1, y2],
            y2,
            KernelId::QuantizeQ8_1,
        );
        assert_eq!(launches, 2);
        results.push(out);
    }
    assert_eq!(results[0], results[1]);
}

/// A prompt-class product placed by hand over the residual its ADD reads: unfused, the
/// ADD reads the product's values there; `qgemm`'s epilogue would read the residual's
/// before some blocks wrote over it. The run goes node by node, with the unfused bits.
#[test]
fn a_residual_under_its_product_is_added_node_by_node() {
    let be = gpu();
    let (k, m, n) = (64, 64, 8);
    let mut r = Lcg(33);
    let (xv, rv) = (r.vec(k * n), r.vec(m * n));
    let wv = quantize_rows(DType::Q8_0, &r.vec(k * m), k);
    let mut results = Vec::new();
    for tuning in [
        CudaTuning::default().without_fusions(),
        CudaTuning::default(),
    ] {
        be.set_tuning(tuning);
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let x = ctx.new_tensor(DType::F32, [k, n, 1, 1]).unwrap();
        let res = ctx.new_tensor(DType::F32, [m, n, 1, 1]).unwrap();
        let w = ctx.new_tensor(DType::Q8_0, [k, m, 1, 1]).unwrap();
        let y = ctx.mul_mat(w, x).unwrap();
        let e = ctx.add(y, res).unwrap();
        let (out, launches) = run_placed(
            &be,
            &mut ctx,
            &[(x, 0), (res, 4096), (w, 8192), (y, 4096), (e, 12288)],
            &[(x, f32_bytes(&xv)), (res, f32_bytes(&rv)), (w, wv.clone())],
            &[y, e],
            e,
            KernelId::Binary,
        );
        assert_eq!(launches, 1);
        results.push(out);
    }
    assert_eq!(results[0], results[1]);
}

/// Q's output placed by hand over K's weights: one `qgemm` launch for both would have K's
/// blocks read weights that Q's blocks write at the same time on a GPU, so the products
/// go one launch each, in order, with the unfused bits.
#[test]
fn an_output_over_another_products_weights_is_not_one_launch() {
    let be = gpu();
    let (k, m, n) = (64, 32, 8);
    let mut r = Lcg(41);
    let xv = r.vec(k * n);
    let (wqv, wkv) = (
        quantize_rows(DType::Q8_0, &r.vec(k * m), k),
        quantize_rows(DType::Q8_0, &r.vec(k * m), k),
    );
    let mut results = Vec::new();
    for tuning in [
        CudaTuning::default().without_fusions(),
        CudaTuning::default(),
    ] {
        be.set_tuning(tuning);
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let x = ctx.new_tensor(DType::F32, [k, n, 1, 1]).unwrap();
        let wq = ctx.new_tensor(DType::Q8_0, [k, m, 1, 1]).unwrap();
        let wk = ctx.new_tensor(DType::Q8_0, [k, m, 1, 1]).unwrap();
        let q = ctx.mul_mat(wq, x).unwrap();
        let kk = ctx.mul_mat(wk, x).unwrap();
        let (out, launches) = run_placed(
            &be,
            &mut ctx,
            &[(x, 0), (wq, 4096), (wk, 8192), (q, 8192), (kk, 12288)],
            &[(x, f32_bytes(&xv)), (wq, wqv.clone()), (wk, wkv.clone())],
            &[q, kk],
            kk,
            KernelId::Qgemm,
        );
        assert_eq!(launches, 2);
        results.push(out);
    }
    assert_eq!(results[0], results[1]);
}

/// Widths past one 32-chunk K-tile (embedding 1280, FFN 1536: 40 and 48 chunks, one
/// 64-chunk tile of the decode class): fused equal to unfused, and 64-chunk tiles equal to
/// 32-chunk ones.
#[rstest]
#[case::q4_1_one_token(1, [DType::Q4_1; 7])]
#[case::mixed_two_tokens(
    2,
    [DType::Q4K, DType::Q5_0, DType::Q6K, DType::Q8_0, DType::Q3K, DType::Q2K, DType::Q5K]
)]
fn a_wide_layer_fused_is_the_layer_unfused_in_either_tile(
    #[case] n: usize,
    #[case] dts: [DType; 7],
) {
    let dims = (1280, 128, 1536);
    let (plain, fused) = fused_vs_unfused(
        |ctx| layer_of(ctx, n, dts, false, 11, dims),
        CudaTuning::default(),
    );
    assert_eq!((plain, fused), (14, 4));
    let be = gpu();
    let mut tiles = Vec::new();
    for tc in [32, 64] {
        ggml_cuda::launch::set_qmm_tile(Some(tc));
        let mut st = storage();
        let mut ctx = Context::new(&mut st);
        let inputs = layer_of(&mut ctx, n, dts, false, 11, dims);
        tiles.push(run_nodes(&be, &mut ctx, &inputs, CudaTuning::default(), 0).0);
    }
    ggml_cuda::launch::set_qmm_tile(None);
    assert!(tiles[0] == tiles[1], "32- and 64-chunk tiles differ");
}

/// Each fusion alone (and each left out) gives the unfused bits.
#[rstest]
fn each_switch_alone_keeps_the_bits(
    #[values(
        "no-fuse-qkv,no-fuse-glu,no-fuse-add",
        "no-fuse-norm,no-fuse-glu,no-fuse-add",
        "no-fuse-norm,no-fuse-qkv,no-fuse-add",
        "no-fuse-norm,no-fuse-qkv,no-fuse-glu",
        "no-fuse-norm",
        "no-fuse-qkv",
        "no-fuse-glu",
        "no-fuse-add"
    )]
    switches: &str,
) {
    let tuning: CudaTuning = switches.parse().unwrap();
    let (plain, fused) = fused_vs_unfused(|ctx| layer(ctx, 2, [DType::Q4_1; 7], false, 3), tuning);
    assert_eq!(plain, 14);
    let want = match switches {
        // norm + Q, K, V, O, add, norm + gate, up, GLU, down, add.
        "no-fuse-qkv,no-fuse-glu,no-fuse-add" => 10,
        // Q + K + V, O, add, gate + up, GLU, down, add (norms alone).
        "no-fuse-norm,no-fuse-glu,no-fuse-add" => 11,
        // 3 products, O, add, rms, mul, gate + up + GLU, down, add.
        "no-fuse-norm,no-fuse-qkv,no-fuse-add" => 12,
        // 3 products, O + add, rms, mul, 2 products, GLU, down + add.
        "no-fuse-norm,no-fuse-qkv,no-fuse-glu" => 12,
        "no-fuse-norm" => 8,
        "no-fuse-qkv" => 6,
        "no-fuse-glu" => 5,
        "no-fuse-add" => 6,
        _ => unreachable!(),
    };
    assert_eq!(fused, want, "{switches}");
}

/// The output head: norm x weight and one Q8_0 product of many rows (64 rows per block),
/// fused, against unfused.
#[test]
fn norm_and_output_head() {
    let (plain, fused) = fused_vs_unfused(
        |ctx| {
            let (e, vocab) = (128, 1200);
            let mut r = Lcg(5);
            let x = ctx.new_tensor(DType::F32, [e, 1, 1, 1]).unwrap();
            let g = ctx.new_tensor(DType::F32, [e, 1, 1, 1]).unwrap();
            let w = ctx.new_tensor(DType::Q8_0, [e, vocab, 1, 1]).unwrap();
            let rn = ctx.rms_norm(x, 1e-6).unwrap();
            let cur = ctx.mul(rn, g).unwrap();
            ctx.mul_mat(w, cur).unwrap();
            vec![
                (x, f32_bytes(&r.vec(e))),
                (g, f32_bytes(&r.vec(e))),
                (w, quantize_rows(DType::Q8_0, &r.vec(e * vocab), e)),
            ]
        },
        CudaTuning::default(),
    );
    assert_eq!((plain, fused), (3, 1));
}

/// `q8-window` (Q8_0 blocks through 16-byte loads of the 48 aligned bytes around them)
/// against the narrow loads: every node's bytes equal. Rows of 4 blocks (136 bytes: every
/// offset of a block in its 16 bytes) and of 3 (102 bytes: rows 2-byte aligned), K-tiles
/// shorter than a row (72 chunks), 7 columns; each matrix's last
/// blocks take the narrow loads (their window would pass its end).
#[rstest]
#[case::head_fused(128, 1200, 1, true)]
#[case::rows_of_3_blocks(96, 301, 1, true)]
#[case::two_tiles_a_row(2304, 70, 2, false)]
#[case::seven_columns(608, 50, 7, false)]
fn q8_window_loads_give_the_narrow_loads_bits(
    #[case] e: usize,
    #[case] m: usize,
    #[case] n: usize,
    #[case] norm: bool,
) {
    let build = |ctx: &mut Context<'_>| {
        let mut r = Lcg(17 + e as u64);
        let x = ctx.new_tensor(DType::F32, [e, n, 1, 1]).unwrap();
        let g = ctx.new_tensor(DType::F32, [e, 1, 1, 1]).unwrap();
        let w = ctx.new_tensor(DType::Q8_0, [e, m, 1, 1]).unwrap();
        let cur = if norm {
            let rn = ctx.rms_norm(x, 1e-6).unwrap();
            ctx.mul(rn, g).unwrap()
        } else {
            x
        };
        ctx.mul_mat(w, cur).unwrap();
        vec![
            (x, f32_bytes(&r.vec(e * n))),
            (g, f32_bytes(&r.vec(e))),
            (w, quantize_rows(DType::Q8_0, &r.vec(e * m), e)),
        ]
    };
    let be = gpu();
    let mut runs = Vec::new();
    for q8_window in [false, true] {
        let tuning = CudaTuning {
            q8_window,
            ..CudaTuning::default()
        };
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let inputs = build(&mut ctx);
        runs.push(run_nodes(&be, &mut ctx, &inputs, tuning, 0).0);
    }
    assert!(runs[0] == runs[1], "q8-window changed the bytes");
    be.set_tuning(CudaTuning::default());
}

/// The fused norm's sum of squares at every split of a lane's values into its blocks (16
/// at a time while 20 or more are left, then 16, 8, 4, 2, 1): K/32 from 1 to 44, two
/// columns, fused against unfused.
#[rstest]
fn norm_prologue_at_every_tail_length(
    #[values(
        1, 2, 3, 4, 5, 7, 8, 11, 15, 16, 17, 18, 19, 20, 21, 27, 35, 36, 39, 44
    )]
    chunks: usize,
) {
    let (plain, fused) = fused_vs_unfused(
        |ctx| {
            let (e, m, n) = (32 * chunks, 40, 2);
            let mut r = Lcg(9 + chunks as u64);
            let x = ctx.new_tensor(DType::F32, [e, n, 1, 1]).unwrap();
            let g = ctx.new_tensor(DType::F32, [e, 1, 1, 1]).unwrap();
            let w = ctx.new_tensor(DType::Q8_0, [e, m, 1, 1]).unwrap();
            let rn = ctx.rms_norm(x, 1e-6).unwrap();
            let cur = ctx.mul(rn, g).unwrap();
            ctx.mul_mat(w, cur).unwrap();
            vec![
                (x, f32_bytes(&r.vec(e * n))),
                (g, f32_bytes(&r.vec(e))),
                (w, quantize_rows(DType::Q8_0, &r.vec(e * m), e)),
            ]
        },
        CudaTuning::default(),
    );
    // The norm and the mul run inside the product.
    assert_eq!(plain - fused, 2, "{plain} {fused}");
}

/// Builds norm -> mul -> product by hand with the product's output placed over the
/// norm's input (as a sequential allocator may): the run goes node by node, with the
/// unfused bits.
#[test]
fn overlapping_bytes_run_node_by_node() {
    let be = gpu();
    let (k, m) = (64, 32);
    let mut r = Lcg(9);
    let xv = r.vec(k);
    let gv = r.vec(k);
    let wv = quantize_rows(DType::Q4_0, &r.vec(k * m), k);
    let mut results = Vec::new();
    for tuning in [
        CudaTuning::default().without_fusions(),
        CudaTuning::default(),
    ] {
        be.set_tuning(tuning);
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let x = ctx.new_tensor(DType::F32, [k, 1, 1, 1]).unwrap();
        let g = ctx.new_tensor(DType::F32, [k, 1, 1, 1]).unwrap();
        let w = ctx.new_tensor(DType::Q4_0, [k, m, 1, 1]).unwrap();
        let rn = ctx.rms_norm(x, 1e-5).unwrap();
        let cur = ctx.mul(rn, g).unwrap();
        let y = ctx.mul_mat(w, cur).unwrap();
        let buf = be.alloc_buffer(8192).unwrap();
        be.buffer_clear(buf.id, 0).unwrap();
        // x at 0 and y at 0 too (x is dead once rms_norm read it), the rest apart.
        for (id, at) in [
            (x, 0),
            (g, 1024),
            (w, 2048),
            (rn, 4096),
            (cur, 5120),
            (y, 0),
        ] {
            ctx.tensors_mut()[id.index()].data = Some(DataRef {
                buffer: buf.id,
                addr: buf.base + at,
            });
        }
        let ts = ctx.tensors();
        be.set_tensor_async(&ts[x.index()], 0, &f32_bytes(&xv))
            .unwrap();
        be.set_tensor_async(&ts[g.index()], 0, &f32_bytes(&gv))
            .unwrap();
        be.set_tensor_async(&ts[w.index()], 0, &wv).unwrap();
        let before = be.kernel_stats().launches_of(KernelId::RmsNorm);
        be.graph_compute(ts, &[rn, cur, y]).unwrap();
        be.synchronize().unwrap();
        assert_eq!(be.kernel_stats().launches_of(KernelId::RmsNorm), before + 1);
        let mut out = vec![0u8; 4 * m];
        be.get_tensor(&ts[y.index()], 0, &mut out).unwrap();
        results.push(out);
        be.free_buffer(buf.id).unwrap();
    }
    assert_eq!(results[0], results[1]);
}

/// A product whose weights live on another device is no fused launch: the run goes node
/// by node, which reports the misplaced tensor as the unfused path does.
#[test]
fn weights_on_another_device_are_not_fused() {
    let be = gpu();
    let other = CudaBackend::with_driver(common::driver(), 0, 1).unwrap();
    let (k, m) = (64, 16);
    let mut s = storage();
    let mut ctx = Context::new(&mut s);
    let x = ctx.new_tensor(DType::F32, [k, 1, 1, 1]).unwrap();
    let g = ctx.new_tensor(DType::F32, [k, 1, 1, 1]).unwrap();
    let w = ctx.new_tensor(DType::Q8_0, [k, m, 1, 1]).unwrap();
    let rn = ctx.rms_norm(x, 1e-5).unwrap();
    let cur = ctx.mul(rn, g).unwrap();
    let y = ctx.mul_mat(w, cur).unwrap();
    let buf = be.alloc_buffer(8192).unwrap();
    let far = other.alloc_buffer(4096).unwrap();
    be.buffer_clear(buf.id, 0).unwrap();
    for (id, at) in [(x, 0), (g, 1024), (rn, 2048), (cur, 3072), (y, 4096)] {
        ctx.tensors_mut()[id.index()].data = Some(DataRef {
            buffer: buf.id,
            addr: buf.base + at,
        });
    }
    ctx.tensors_mut()[w.index()].data = Some(DataRef {
        buffer: far.id,
        addr: far.base,
    });
    let ts = ctx.tensors();
    let before = be.kernel_stats();
    let e = be.graph_compute(ts, &[rn, cur, y]).unwrap_err();
    assert_eq!(e.kind, BackendErrorKind::InvalidArgument);
    assert!(
        e.to_string().contains("not in this backend's memory"),
        "{e}"
    );
    // rms_norm and mul ran on their own before the product failed.
    let after = be.kernel_stats();
    assert_eq!(
        after.launches_of(KernelId::RmsNorm),
        before.launches_of(KernelId::RmsNorm) + 1
    );
    assert_eq!(
        after.launches_of(KernelId::Qmm),
        before.launches_of(KernelId::Qmm)
    );
    be.synchronize().unwrap();
    be.free_buffer(buf.id).unwrap();
    other.free_buffer(far.id).unwrap();
}

/// `fused_runs` reports the runs graph_compute fuses, from the nodes alone (no tensor
/// has bytes yet when a scheduler asks), and none with the fusions off.
#[test]
fn fused_runs_are_reported_before_allocation() {
    let be = gpu();
    let mut s = storage();
    let mut ctx = Context::new(&mut s);
    layer(&mut ctx, 1, [DType::Q4_1; 7], false, 1);
    let ts = ctx.tensors();
    let nodes: Vec<TensorId> = (0..ts.len() as u32)
        .map(TensorId)
        .filter(|id| ts[id.index()].op != Op::None)
        .collect();
    let runs = |tuning| {
        be.set_tuning(tuning);
        let mut v = Vec::new();
        be.fused_runs(ts, &nodes, &mut |s, e| v.push((s, e)));
        v
    };
    // rms, mul, Q, K, V | reshape, reshape | O, add | rms, mul, gate, up, swiglu |
    // down, add.
    assert_eq!(
        runs(CudaTuning::default()),
        [(0, 5), (7, 9), (9, 14), (14, 16)]
    );
    assert!(runs(CudaTuning::default().without_fusions()).is_empty());
    assert!(runs(CudaTuning::legacy()).is_empty());
}
