//! The Q, K and V products with the RoPE + KV-cache store in their epilogue
//! (`fuse_qkv_rope`): one `qmm` launch writes the norm, the three products, the roped Q
//! and K and both cache rows with exactly the bits of the two fused launches it replaces
//! (products, then `rope_store`) and of the unfused kernels, over SmolLM2's head layout,
//! decode batches of 1..7 tokens, partial rotation, every cache type and the model's
//! allocation (the roped K over the Q product); a bad row index fails as set_rows does;
//! NeoX and YaRN ropes, and the switch off, keep two launches.

// Not every helper of the shared module is needed here.
#[allow(dead_code)]
mod common;

use common::{f32_bytes, gpu, place_and_upload, read_back, Lcg};
use ggml_core::{Backend, BackendErrorKind, Context, DType, RopeMode, RopeParams, Tensor};
use ggml_cuda::{CudaBackend, CudaTuning, KernelId};
use ggml_test_kit::quantize_rows;
use rstest::rstest;

/// A decode step's attention inputs: norm, Q/K/V products, ropes, cache stores.
#[derive(Clone, Copy, Debug)]
struct Step {
    /// Embedding width (the products' K).
    e: usize,
    /// Head dimension, Q heads, KV heads, tokens.
    d: usize,
    hq: usize,
    hk: usize,
    n: usize,
    rope: RopeParams,
    cache: DType,
    weights: DType,
    /// Where the allocator puts the roped outputs.
    alias: Alias,
}

/// Placements of the roped Q and K over bytes the allocator found dead.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Alias {
    /// Their own bytes.
    None,
    /// The roped K over the Q product.
    KOverQ,
    /// The roped Q over the norm's output and the roped K over the mul's (the harness's
    /// allocation of SmolLM2).
    OverNorm,
    /// Only the roped Q over the norm's output.
    QOverRms,
    /// Only the roped K over the mul's output.
    KOverMul,
}

/// Every node's bytes after the step (or the error of the synchronisation: its kind and
/// node), and the launches of qmm and rope_store.
type Outcome = (Result<Vec<Vec<u8>>, (BackendErrorKind, String)>, [u64; 2]);

fn run(be: &CudaBackend, s: Step, idx: &[i32], tuning: CudaTuning) -> Outcome {
    let Step {
        e,
        d,
        hq,
        hk,
        n,
        rope,
        cache,
        weights,
        alias,
    } = s;
    let mut st = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 40];
    let mut ctx = Context::new(&mut st);
    let mut r = Lcg(d as u64 * 131 + n as u64 * 7 + hq as u64);
    let mut inputs = Vec::new();
    let x = ctx.new_tensor(DType::F32, [e, n, 1, 1]).unwrap();
    inputs.push((x, f32_bytes(&r.vec(e * n))));
    let g = ctx.new_tensor(DType::F32, [e, 1, 1, 1]).unwrap();
    inputs.push((g, f32_bytes(&r.vec(e))));
    let mut w = |ctx: &mut Context<'_>, m: usize| {
        let t = ctx.new_tensor(weights, [e, m, 1, 1]).unwrap();
        inputs.push((t, quantize_rows(weights, &r.vec(e * m), e)));
        t
    };
    let (wq, wk, wv) = (
        w(&mut ctx, d * hq),
        w(&mut ctx, d * hk),
        w(&mut ctx, d * hk),
    );
    let pos = ctx.new_tensor(DType::I32, [n, 1, 1, 1]).unwrap();
    let rows = ctx.new_tensor(DType::I32, [n, 1, 1, 1]).unwrap();
    let kcache = ctx.new_tensor(cache, [d * hk, 64, 1, 1]).unwrap();
    let vcache = ctx.new_tensor(cache, [d * hk, 64, 1, 1]).unwrap();
    let positions: Vec<i32> = (0..n as i32).map(|i| 700 + 29 * i).collect();
    inputs.push((
        pos,
        positions.iter().flat_map(|p| p.to_le_bytes()).collect(),
    ));
    inputs.push((rows, idx.iter().flat_map(|p| p.to_le_bytes()).collect()));
    let rn = ctx.rms_norm(x, 1e-5).unwrap();
    let cur = ctx.mul(rn, g).unwrap();
    let q = ctx.mul_mat(wq, cur).unwrap();
    let k = ctx.mul_mat(wk, cur).unwrap();
    let v = ctx.mul_mat(wv, cur).unwrap();
    let q3 = ctx.reshape(q, [d, hq, n, 1]).unwrap();
    let k3 = ctx.reshape(k, [d, hk, n, 1]).unwrap();
    let qr = ctx.rope(q3, pos, rope).unwrap();
    let kr = ctx.rope(k3, pos, rope).unwrap();
    let kf = ctx.reshape(kr, [d * hk, n, 1, 1]).unwrap();
    let kw = ctx.set_rows(kcache, kf, rows).unwrap();
    ctx.set_name(kw, "k_cache_write-0").unwrap();
    ctx.set_rows(vcache, v, rows).unwrap();

    be.set_tuning(tuning);
    let (buf, nodes) = place_and_upload(be, &mut ctx, &inputs, 0x5a);
    let q_at = match alias {
        Alias::OverNorm | Alias::QOverRms => Some(rn),
        _ => None,
    };
    let k_at = match alias {
        Alias::KOverQ => Some(q),
        Alias::OverNorm | Alias::KOverMul => Some(cur),
        _ => None,
    };
    if let Some(t) = q_at {
        let at = ctx.tensors()[t.index()].data;
        ctx.tensors_mut()[qr.index()].data = at;
    }
    if let Some(t) = k_at {
        let at = ctx.tensors()[t.index()].data;
        ctx.tensors_mut()[kr.index()].data = at;
        ctx.tensors_mut()[kf.index()].data = at;
    }
    let ts = ctx.tensors();
    let kinds = [KernelId::Qmm, KernelId::RopeStore];
    let before = be.kernel_stats();
    be.graph_compute(ts, &nodes).unwrap();
    let res = be
        .synchronize()
        .map_err(|e| (e.kind, e.tensor.as_str().to_string()));
    let after = be.kernel_stats();
    be.set_tuning(CudaTuning::default());
    let launches = kinds.map(|k| after.launches_of(k) - before.launches_of(k));
    let outs = res.map(|()| read_back(be, ts, &nodes));
    be.free_buffer(buf.id).unwrap();
    (outs, launches)
}

/// The products and the rope + store as two fused launches.
fn two_launches() -> CudaTuning {
    CudaTuning {
        fuse_qkv_rope: false,
        ..CudaTuning::default()
    }
}

fn smollm2() -> RopeParams {
    RopeParams::llama(64, 100000.0)
}

fn neox(mut p: RopeParams) -> RopeParams {
    p.mode = RopeMode::Neox;
    p
}

fn yarn(mut p: RopeParams) -> RopeParams {
    p.ext_factor = 1.0;
    p.freq_scale = 0.25;
    p.n_ctx_orig = 4096;
    p
}

fn step(d: usize, hq: usize, hk: usize, n: usize, rope: RopeParams, cache: DType) -> Step {
    Step {
        e: 128,
        d,
        hq,
        hk,
        n,
        rope,
        cache,
        weights: DType::Q4_1,
        alias: Alias::None,
    }
}

/// Fused into one launch, the bits of the two launches and of every kernel unfused.
#[rstest]
#[case::smollm2_one_token(step(64, 9, 3, 1, smollm2(), DType::F16))]
#[case::smollm2_seven_tokens(step(64, 9, 3, 7, smollm2(), DType::F16))]
// SmolLM2's width: blocks of 5 warps, the last idle during the norm of 1 to 4 tokens
// makes the CTA's RoPE table (cos and sin of each output); with 5 or more tokens it
// computes a norm column and the epilogue computes them itself.
#[case::smollm2_width_one_token(Step { e: 576, ..step(64, 9, 3, 1, smollm2(), DType::F16) })]
#[case::smollm2_width_four_tokens(Step { e: 576, ..step(64, 9, 3, 4, smollm2(), DType::F16) })]
#[case::smollm2_width_five_tokens(Step { e: 576, ..step(64, 9, 3, 5, smollm2(), DType::F16) })]
#[case::partial_rotation_f32_cache(step(64, 2, 2, 3, RopeParams::llama(32, 10000.0), DType::F32))]
#[case::bf16_cache_q8_0(Step { weights: DType::Q8_0, ..step(32, 4, 2, 2, RopeParams::llama(32, 10000.0), DType::BF16) })]
#[case::q5_0_heads_of_sixteen(Step { weights: DType::Q5_0, ..step(16, 8, 2, 1, RopeParams::llama(16, 10000.0), DType::F16) })]
fn one_launch_gives_the_bits_of_two(#[case] s: Step) {
    let be = gpu();
    let idx: Vec<i32> = (0..s.n as i32).map(|i| 11 + 3 * i).collect();
    let (fused, fl) = run(&be, s, &idx, CudaTuning::default());
    let (two, tl) = run(&be, s, &idx, two_launches());
    let (plain, _) = run(&be, s, &idx, CudaTuning::default().without_fusions());
    assert_eq!(fl, [1, 0], "one qmm, no rope_store");
    assert_eq!(tl, [1, 1], "qmm and rope_store");
    let (fused, two, plain) = (fused.unwrap(), two.unwrap(), plain.unwrap());
    assert_eq!(fused.len(), 9, "norm, mul, 3 products, 2 ropes, 2 stores");
    for (i, ((f, t), p)) in fused.iter().zip(&two).zip(&plain).enumerate() {
        assert!(f == t, "node {i}: one launch and two differ");
        assert!(f == p, "node {i}: fused and unfused differ");
    }
}

/// The allocator's placements: a roped output over bytes dead after the run (the Q
/// product, the norm's outputs). One launch leaves a dead output unwritten (its bytes
/// past the roped output keep what they held) and gives every other node the bits of two
/// launches. Several tokens with the roped K over the Q product: rope_store's own byte
/// rule (a write over a read only with one token) keeps the Q rope apart. The mul's
/// output dead and the norm's live: the kernel writes both or neither, so two launches.
#[rstest]
#[case::k_over_q(Alias::KOverQ, 1, [1, 0])]
#[case::k_over_q_three_tokens(Alias::KOverQ, 3, [1, 1])]
#[case::over_the_norm(Alias::OverNorm, 1, [1, 0])]
#[case::over_the_norm_five_tokens(Alias::OverNorm, 5, [1, 0])]
#[case::q_over_the_norm_only(Alias::QOverRms, 2, [1, 0])]
#[case::k_over_the_mul_only(Alias::KOverMul, 1, [1, 1])]
fn roped_outputs_over_dead_bytes(
    #[case] alias: Alias,
    #[case] n: usize,
    #[case] launches: [u64; 2],
) {
    let be = gpu();
    let s = Step {
        alias,
        ..step(64, 2, 1, n, smollm2(), DType::F16)
    };
    let idx: Vec<i32> = (0..n as i32).map(|i| 40 + i).collect();
    let (fused, fl) = run(&be, s, &idx, CudaTuning::default());
    let (two, _) = run(&be, s, &idx, two_launches());
    assert_eq!(fl, launches, "launches of qmm and rope_store");
    let (fused, two) = (fused.unwrap(), two.unwrap());
    // Nodes: rms, mul, Q, K, V, Q rope, K rope, K store, V store; the dead ones hold a
    // roped output in their first bytes.
    let (q_bytes, k_bytes) = (64 * 2 * n * 4, 64 * n * 4);
    let dead: &[(usize, usize)] = match alias {
        Alias::KOverQ => &[(2, k_bytes)],
        Alias::OverNorm => &[(0, q_bytes), (1, k_bytes)],
        Alias::QOverRms => &[(0, q_bytes)],
        _ => &[],
    };
    for (i, (f, t)) in fused.iter().zip(&two).enumerate() {
        match dead.iter().find(|(d, _)| *d == i) {
            Some(&(_, held)) => assert!(f[..held] == t[..held], "node {i}: the roped output"),
            None => assert!(f == t, "node {i}: one launch and two differ"),
        }
    }
}

/// Ropes the epilogue does not do (NeoX pairs, YaRN's ramp) and the switch off: two
/// launches, the same bits.
#[rstest]
#[case::neox(neox(smollm2()), CudaTuning::default())]
#[case::yarn(yarn(smollm2()), CudaTuning::default())]
#[case::switched_off(smollm2(), two_launches())]
#[case::rope_store_off(smollm2(), CudaTuning { fuse_rope_store: false, ..CudaTuning::default() })]
fn other_ropes_keep_two_launches(#[case] rope: RopeParams, #[case] tuning: CudaTuning) {
    let be = gpu();
    let s = step(64, 9, 3, 2, rope, DType::F16);
    let idx = [5, 6];
    let (got, launches) = run(&be, s, &idx, tuning);
    let (plain, _) = run(&be, s, &idx, CudaTuning::default().without_fusions());
    assert_eq!(launches[0], 1, "the products are one qmm");
    assert_eq!(
        launches[1],
        u64::from(tuning.fuse_rope_store),
        "the rope + store stays its own launch"
    );
    assert!(got.unwrap() == plain.unwrap());
}

/// A row index outside the cache is the set_rows error, naming the K store, in one
/// launch as in two; the next good step runs.
#[rstest]
#[case::past_the_rows(64)]
#[case::negative(-1)]
fn bad_rows_fail_as_set_rows_does(#[case] bad: i32) {
    let be = gpu();
    let s = step(64, 9, 3, 3, smollm2(), DType::F16);
    for tuning in [CudaTuning::default(), two_launches()] {
        let (res, _) = run(&be, s, &[4, bad, 9], tuning);
        let (kind, node) = res.unwrap_err();
        assert_eq!(kind, BackendErrorKind::BadData);
        assert_eq!(node, "k_cache_write-0", "{tuning}");
    }
    let (res, _) = run(&be, s, &[1, 2, 3], CudaTuning::default());
    assert!(res.is_ok());
}

/// Ropes and stores that read the products under another token split (2 product columns
/// seen as 4 tokens of half the rows) are not the products' rows and columns: no single
/// launch, and the bits of the kernels unfused.
#[test]
fn a_reshape_that_moves_tokens_is_not_fused() {
    let be = gpu();
    let build = |ctx: &mut Context<'_>| {
        let (e, d, n) = (128, 64, 2);
        let mut r = Lcg(77);
        let mut inputs = Vec::new();
        let x = ctx.new_tensor(DType::F32, [e, n, 1, 1]).unwrap();
        inputs.push((x, f32_bytes(&r.vec(e * n))));
        let g = ctx.new_tensor(DType::F32, [e, 1, 1, 1]).unwrap();
        inputs.push((g, f32_bytes(&r.vec(e))));
        let mut w = |ctx: &mut Context<'_>, m: usize| {
            let t = ctx.new_tensor(DType::Q8_0, [e, m, 1, 1]).unwrap();
            inputs.push((t, quantize_rows(DType::Q8_0, &r.vec(e * m), e)));
            t
        };
        let (wq, wk, wv) = (w(ctx, 4 * d), w(ctx, 2 * d), w(ctx, 2 * d));
        let pos = ctx.new_tensor(DType::I32, [2 * n, 1, 1, 1]).unwrap();
        let rows = ctx.new_tensor(DType::I32, [2 * n, 1, 1, 1]).unwrap();
        let kcache = ctx.new_tensor(DType::F16, [d, 32, 1, 1]).unwrap();
        let vcache = ctx.new_tensor(DType::F16, [d, 32, 1, 1]).unwrap();
        inputs.push((
            pos,
            [3i32, 4, 5, 6]
                .iter()
                .flat_map(|p| p.to_le_bytes())
                .collect(),
        ));
        inputs.push((
            rows,
            [1i32, 2, 3, 4]
                .iter()
                .flat_map(|p| p.to_le_bytes())
                .collect(),
        ));
        let rn = ctx.rms_norm(x, 1e-5).unwrap();
        let cur = ctx.mul(rn, g).unwrap();
        let q = ctx.mul_mat(wq, cur).unwrap();
        let k = ctx.mul_mat(wk, cur).unwrap();
        let v = ctx.mul_mat(wv, cur).unwrap();
        let q3 = ctx.reshape(q, [d, 2, 2 * n, 1]).unwrap();
        let k3 = ctx.reshape(k, [d, 1, 2 * n, 1]).unwrap();
        let v2 = ctx.reshape(v, [d, 2 * n, 1, 1]).unwrap();
        let rope = smollm2();
        ctx.rope(q3, pos, rope).unwrap();
        let kr = ctx.rope(k3, pos, rope).unwrap();
        let kf = ctx.reshape(kr, [d, 2 * n, 1, 1]).unwrap();
        ctx.set_rows(kcache, kf, rows).unwrap();
        ctx.set_rows(vcache, v2, rows).unwrap();
        inputs
    };
    let run = |tuning: CudaTuning| {
        let mut st = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 40];
        let mut ctx = Context::new(&mut st);
        let inputs = build(&mut ctx);
        be.set_tuning(tuning);
        let (buf, nodes) = place_and_upload(&be, &mut ctx, &inputs, 0);
        let ts = ctx.tensors();
        let before = be.kernel_stats().launches_of(KernelId::RopeStore);
        be.graph_compute(ts, &nodes).unwrap();
        be.synchronize().unwrap();
        let rope_stores = be.kernel_stats().launches_of(KernelId::RopeStore) - before;
        let outs = read_back(&be, ts, &nodes);
        be.free_buffer(buf.id).unwrap();
        be.set_tuning(CudaTuning::default());
        (outs, rope_stores)
    };
    let (fused, rope_stores) = run(CudaTuning::default());
    let (plain, _) = run(CudaTuning::default().without_fusions());
    assert_eq!(rope_stores, 1, "the rope + store stays its own launch");
    assert!(fused == plain);
}
