//! The RoPE + KV-cache store fusion (`fuse_rope_store`): the fused launch writes the
//! roped Q and K and both cache rows with exactly the bits of the rope and set_rows
//! kernels, over normal and NeoX RoPE, partial rotation, YaRN, every cache type, decode
//! batches of 1..7 tokens and prompts of 12 and 40, SmolLM2's and Gemma 3's head layouts;
//! bad row indices fail
//! as set_rows does; with its switch off nothing fuses.

use ggml_core::{
    Backend, BackendErrorKind, Context, DType, DataRef, Op, RopeMode, RopeParams, Tensor, TensorId,
};
use ggml_cuda::{CudaBackend, CudaTuning, KernelId};

mod common;
use common::{f32_bytes, gpu, Lcg};

/// One decode step's attention inputs as a model graph orders them.
#[derive(Clone, Copy, Debug)]
struct Step {
    d: usize,
    hq: usize,
    hk: usize,
    n: usize,
    rope: RopeParams,
    cache: DType,
    with_v: bool,
    /// The roped K in the bytes of Q's source, as the allocator places it.
    k_over_xq: bool,
}

/// The bytes of the roped Q, roped K and both caches after the step, or the error of
/// the synchronisation, and the launches of Rope, SetRows and RopeStore.
type Outcome = (Result<Vec<Vec<u8>>, (BackendErrorKind, String)>, [u64; 3]);

fn run(be: &CudaBackend, s: Step, idx: &[i32], tuning: CudaTuning) -> Outcome {
    let Step {
        d,
        hq,
        hk,
        n,
        rope,
        cache,
        with_v,
        k_over_xq,
    } = s;
    let mut st = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 32];
    let mut ctx = Context::new(&mut st);
    let qc = ctx.new_tensor(DType::F32, [d * hq, n, 1, 1]).unwrap();
    let kc = ctx.new_tensor(DType::F32, [d * hk, n, 1, 1]).unwrap();
    let vc = ctx.new_tensor(DType::F32, [d * hk, n, 1, 1]).unwrap();
    let pos = ctx.new_tensor(DType::I32, [n, 1, 1, 1]).unwrap();
    let rows = ctx.new_tensor(DType::I32, [n, 1, 1, 1]).unwrap();
    let kcache = ctx.new_tensor(cache, [d * hk, 256, 1, 1]).unwrap();
    let vcache = ctx.new_tensor(cache, [d * hk, 256, 1, 1]).unwrap();
    let q = ctx.reshape(qc, [d, hq, n, 1]).unwrap();
    let k = ctx.reshape(kc, [d, hk, n, 1]).unwrap();
    let qr = ctx.rope(q, pos, rope).unwrap();
    let kr = ctx.rope(k, pos, rope).unwrap();
    let kf = ctx.reshape(kr, [d * hk, n, 1, 1]).unwrap();
    let kw = ctx.set_rows(kcache, kf, rows).unwrap();
    ctx.set_name(kw, "k_cache_write-0").unwrap();
    let vw = with_v.then(|| ctx.set_rows(vcache, vc, rows).unwrap());

    let mut r = Lcg(d as u64 * 31 + n as u64);
    let cache_bytes = |r: &mut Lcg| -> Vec<u8> {
        let v = r.vec(d * hk * 256);
        match cache {
            DType::F32 => f32_bytes(&v),
            DType::F16 => v
                .iter()
                .flat_map(|x| ggml_cuda::reference::f32_to_f16(*x).to_le_bytes())
                .collect(),
            _ => v
                .iter()
                .flat_map(|x| ggml_cuda::reference::f32_to_bf16(*x).to_le_bytes())
                .collect(),
        }
    };
    let positions: Vec<i32> = (0..n as i32).map(|i| 1000 + 37 * i).collect();
    let inputs = [
        (qc, f32_bytes(&r.vec(d * hq * n))),
        (kc, f32_bytes(&r.vec(d * hk * n))),
        (vc, f32_bytes(&r.vec(d * hk * n))),
        (
            pos,
            positions.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ),
        (rows, idx.iter().flat_map(|x| x.to_le_bytes()).collect()),
        (kcache, cache_bytes(&mut r)),
        (vcache, cache_bytes(&mut r)),
    ];

    // Allocate, upload, compute every node in id order (the order built above).
    let n_t = ctx.len();
    let mut offs = vec![0usize; n_t];
    let mut total = 0;
    for (i, t) in ctx.tensors().iter().enumerate() {
        if t.view_src.is_none() {
            offs[i] = total;
            total += t.nbytes().div_ceil(256) * 256;
        }
    }
    let buf = be.alloc_buffer(total).unwrap();
    for i in 0..n_t {
        let t = ctx.tensors()[i];
        let (root, extra) = t.view_src.map_or((i, 0), |r| (r.index(), t.view_offs));
        ctx.tensors_mut()[i].data = Some(DataRef {
            buffer: buf.id,
            addr: buf.base + (offs[root] + extra) as u64,
        });
    }
    if k_over_xq {
        let at = ctx.tensors()[qc.index()].data;
        ctx.tensors_mut()[kr.index()].data = at;
        ctx.tensors_mut()[kf.index()].data = at;
    }
    let ts = ctx.tensors();
    for (id, bytes) in &inputs {
        be.set_tensor_async(&ts[id.index()], 0, bytes).unwrap();
    }
    let nodes: Vec<TensorId> = (0..n_t as u32)
        .map(TensorId)
        .filter(|id| ts[id.index()].op != Op::None)
        .collect();
    be.set_tuning(tuning);
    let before = be.kernel_stats();
    be.graph_compute(ts, &nodes).unwrap();
    let res = be
        .synchronize()
        .map_err(|e| (e.kind, e.tensor.as_str().to_string()));
    let after = be.kernel_stats();
    be.set_tuning(CudaTuning::default());
    let launches = [KernelId::Rope, KernelId::SetRows, KernelId::RopeStore]
        .map(|k| after.launches_of(k) - before.launches_of(k));
    let outs = res.map(|()| {
        let mut outs = Vec::new();
        for id in [Some(qr), Some(kr), Some(kcache), vw.map(|_| vcache)]
            .into_iter()
            .flatten()
        {
            let t = ts[id.index()];
            let mut b = vec![0u8; t.nbytes()];
            be.get_tensor(&t, 0, &mut b).unwrap();
            outs.push(b);
        }
        outs
    });
    be.free_buffer(buf.id).unwrap();
    (outs, launches)
}

fn unfused() -> CudaTuning {
    CudaTuning {
        fuse_rope_store: false,
        ..CudaTuning::default()
    }
}

fn neox(mut p: RopeParams) -> RopeParams {
    p.mode = RopeMode::Neox;
    p
}

fn yarn(mut p: RopeParams) -> RopeParams {
    p.ext_factor = 1.0;
    p.freq_scale = 0.25;
    p.attn_factor = 1.0;
    p.n_ctx_orig = 4096;
    p
}

#[rstest::rstest]
#[case::smollm2_one_token(64, 9, 3, 1, RopeParams::llama(64, 100000.0), DType::F16, true)]
#[case::smollm2_seven_tokens(64, 9, 3, 7, RopeParams::llama(64, 100000.0), DType::F16, true)]
#[case::smollm2_prompt_40(64, 9, 3, 40, RopeParams::llama(64, 100000.0), DType::F16, true)]
#[case::gemma3_neox(256, 4, 1, 1, neox(RopeParams::llama(256, 1e6)), DType::F16, true)]
#[case::gemma3_neox_prompt_12(256, 4, 1, 12, neox(RopeParams::llama(256, 1e6)), DType::F16, true)]
#[case::gemma3_neox_five(256, 4, 1, 5, neox(RopeParams::llama(256, 10000.0)), DType::F16, true)]
#[case::partial_rotation_f32_cache(64, 2, 2, 3, RopeParams::llama(32, 10000.0), DType::F32, true)]
#[case::partial_neox_bf16_cache(
    128,
    4,
    2,
    2,
    neox(RopeParams::llama(96, 10000.0)),
    DType::BF16,
    true
)]
#[case::yarn(64, 4, 2, 2, yarn(RopeParams::llama(64, 10000.0)), DType::F16, true)]
#[case::without_v(64, 9, 3, 1, RopeParams::llama(64, 100000.0), DType::F16, false)]
// One pair per head: the kernel's division by ne0/2 = 1 (its magic number is 0).
#[case::one_pair_heads(2, 3, 2, 2, RopeParams::llama(2, 10000.0), DType::F32, true)]
// 34 heads of 8 pairs and 24 V pairs: 296 tasks on 10 warps, the last one partial.
#[case::many_small_heads(16, 31, 3, 1, RopeParams::llama(16, 10000.0), DType::F16, true)]
fn fused_rope_and_store_give_the_unfused_bits(
    #[case] d: usize,
    #[case] hq: usize,
    #[case] hk: usize,
    #[case] n: usize,
    #[case] rope: RopeParams,
    #[case] cache: DType,
    #[case] with_v: bool,
) {
    let be = gpu();
    let s = Step {
        d,
        hq,
        hk,
        n,
        rope,
        cache,
        with_v,
        k_over_xq: false,
    };
    let idx: Vec<i32> = (0..n as i32).map(|i| 17 + 5 * i).collect();
    let (fused, fl) = run(&be, s, &idx, CudaTuning::default());
    let (plain, pl) = run(&be, s, &idx, unfused());
    let stores = 1 + with_v as u64;
    assert_eq!(fl, [0, 0, 1], "one fused launch");
    assert_eq!(pl, [2, stores, 0], "two ropes and the stores");
    let (fused, plain) = (fused.unwrap(), plain.unwrap());
    for (i, (f, p)) in fused.iter().zip(&plain).enumerate() {
        assert!(
            f == p,
            "output {i} (Qrope, Krope, K cache, V cache) differs"
        );
    }
}

/// A row index outside the cache is the set_rows error, naming the K store, fused or not,
/// and the rest of the step still runs.
#[rstest::rstest]
#[case::past_the_rows(256)]
#[case::negative(-1)]
fn bad_rows_fail_as_set_rows_does(#[case] bad: i32) {
    let be = gpu();
    let s = Step {
        d: 64,
        hq: 9,
        hk: 3,
        n: 3,
        rope: RopeParams::llama(64, 10000.0),
        cache: DType::F16,
        with_v: true,
        k_over_xq: false,
    };
    let idx = [4, bad, 9];
    for tuning in [CudaTuning::default(), unfused()] {
        let (res, _) = run(&be, s, &idx, tuning);
        let (kind, node) = res.unwrap_err();
        assert_eq!(kind, BackendErrorKind::BadData);
        assert_eq!(node, "k_cache_write-0", "{tuning}");
    }
    // The error was read and cleared: a good step runs after it.
    let (res, _) = run(&be, s, &[1, 2, 3], CudaTuning::default());
    assert!(res.is_ok());
}

/// The model's allocation: the roped K takes the bytes of Q's source. One token still
/// fuses everything (its block reads all inputs before writing) and gives the unfused
/// bits; two tokens or more (a prompt) fuse only K's rope and the stores.
#[rstest::rstest]
#[case::one_token(1, [0, 0, 1])]
#[case::two_tokens(2, [1, 0, 1])]
#[case::sixteen_tokens(16, [1, 0, 1])]
fn roped_k_over_the_q_source(#[case] n: usize, #[case] launches: [u64; 3]) {
    let be = gpu();
    let s = Step {
        d: 64,
        hq: 9,
        hk: 3,
        n,
        rope: RopeParams::llama(64, 100000.0),
        cache: DType::F16,
        with_v: true,
        k_over_xq: true,
    };
    let idx: Vec<i32> = (0..n as i32).map(|i| 40 + i).collect();
    let (fused, fl) = run(&be, s, &idx, CudaTuning::default());
    let (plain, _) = run(&be, s, &idx, unfused());
    assert_eq!(fl, launches, "launches of rope, set_rows, rope_store");
    assert!(fused.unwrap() == plain.unwrap());
}
