//! The attention kernels against their references, which follow each kernel operation
//! for operation: the tiled FMA kernel `flash_attn_dec` (every decode batch, and prompts
//! with `no-mma-attn` or what the tensor-core kernel lacks) against
//! `reference::flash_attn_decode`, and `flash_attn_mma` (prompt batches of 8 queries or
//! more, f16 K/V of head size 64 or 128, on f16 tensor cores) against
//! `reference::flash_attn_mma` with cuda-sim's mma model.
//!
//! On cuda-sim this binary turns the approx check off, so `ex2.approx`/`lg2.approx` are
//! correctly rounded and f16 `mma` follows the model, as the references compute them, and
//! every comparison is bit for bit. On a GPU (`GGML_RS_REQUIRE_GPU`) the approximate
//! instructions may differ by their ISA bound, so results are compared by NMSE there
//! (and against the reference with the approx check on in `gpu.rs`). The invariance
//! tests (padding, number of queries, repeated launches) are bit for bit on both.
#![allow(clippy::too_many_arguments)]

use ggml_core::{AttnParams, Context, DType, Tensor, TensorId};
use ggml_cuda::cuda_sim::tensor::MmaModel;
use ggml_cuda::reference::{self, nmse, AttnDecode};
use ggml_cuda::{launch, CudaBackend, CudaTuning, KernelId};

mod common;
use common::{driver, f32_bytes, run_all, Lcg};
use ggml_test_kit::bytes::bits;

/// cuda-sim with every check but the approx one (see the module doc), prompts on the
/// tiled FMA kernel ([`dec_tuning`]).
fn backend() -> CudaBackend {
    let be = mma_backend();
    be.set_tuning(dec_tuning());
    be
}

/// As [`backend`] with the default tuning: prompts on the tensor-core kernel.
fn mma_backend() -> CudaBackend {
    if driver() == ggml_cuda::DriverKind::Sim {
        let mut cfg = ggml_cuda::cuda_sim::driver::SimConfig::from_env().expect("CUDA_SIM_*");
        cfg.checks.approx_at_bound = false;
        ggml_cuda::cuda_sim::driver::Driver::configure_global(cfg).expect("one configuration");
    }
    common::gpu()
}

/// The default tuning but every batch on `flash_attn_dec`: prompts (`no-mma-attn`) and
/// decodes (`no-row-attn`).
fn dec_tuning() -> CudaTuning {
    CudaTuning {
        mma_attn: false,
        row_attn: false,
        ..CudaTuning::default()
    }
}

/// The `flash_attn_row` entry of head size `d`.
fn row_kernel(d: usize) -> KernelId {
    match d {
        64 => KernelId::FlashAttnRow64,
        128 => KernelId::FlashAttnRow128,
        256 => KernelId::FlashAttnRow256,
        _ => panic!("no flash_attn_row entry for head size {d}"),
    }
}

/// The bits of `x` with every NaN as the canonical one.
fn canonical_bits(x: &[f32]) -> Vec<u32> {
    x.iter()
        .map(|v| match v.is_nan() {
            true => f32::NAN.to_bits(),
            false => v.to_bits(),
        })
        .collect()
}

/// Runs decode problem `p` on `flash_attn_row` (the default for decode batches): one
/// launch of it, none of `flash_attn_dec`, and the bits `flash_attn_dec` gave (`want`),
/// NaN payloads aside, on either driver: the two kernels compute the same operations in
/// the same order. Leaves `be` on [`dec_tuning`].
fn assert_row_kernel_agrees(be: &CudaBackend, p: &Problem, want: &[f32]) {
    be.set_tuning(CudaTuning {
        row_attn: true,
        ..dec_tuning()
    });
    let mut got = Vec::new();
    let dec = launches(be, KernelId::FlashAttnDec, || {
        assert_eq!(
            launches(be, row_kernel(p.d), || got = p.run(be)),
            1,
            "one flash_attn_row launch"
        );
    });
    be.set_tuning(dec_tuning());
    assert_eq!(dec, 0, "no flash_attn_dec launch");
    if let Some(i) = canonical_bits(&got)
        .iter()
        .zip(canonical_bits(want))
        .position(|(a, b)| *a != b)
    {
        panic!(
            "flash_attn_row vs flash_attn_dec: element {i}: {} vs {}",
            got[i], want[i]
        );
    }
}

fn exact() -> bool {
    driver() == ggml_cuda::DriverKind::Sim
}

fn f16_round(x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| reference::f16_to_f32(reference::f32_to_f16(v)))
        .collect()
}

fn bytes_of(dt: DType, v: &[f32]) -> Vec<u8> {
    match dt {
        DType::F16 => v
            .iter()
            .flat_map(|x| reference::f32_to_f16(*x).to_le_bytes())
            .collect(),
        _ => f32_bytes(v),
    }
}

/// One attention problem: contiguous values as the reference reads them.
#[derive(Clone)]
struct Problem {
    d: usize,
    dv: usize,
    n_kv: usize,
    n_q: usize,
    h: usize,
    h_kv: usize,
    ne3: usize,
    kv: DType,
    mask: Option<DType>,
    /// `[d, n_q, h, ne3]`.
    q: Vec<f32>,
    /// `[d, n_kv, h_kv, ne3]`, already representable in `kv`.
    k: Vec<f32>,
    /// `[dv, n_kv, h_kv, ne3]`.
    v: Vec<f32>,
    /// `[n_kv, n_q]`.
    m: Vec<f32>,
    params: AttnParams,
}

impl Problem {
    /// Random q, K, V; the mask lets query `iq` see positions `lo(iq)..used + iq` where
    /// `lo` is `used + iq - window` for a sliding window (0 without).
    #[allow(clippy::too_many_arguments)]
    fn new(
        seed: u64,
        (d, dv): (usize, usize),
        (h, h_kv): (usize, usize),
        n_q: usize,
        n_kv: usize,
        used: usize,
        window: Option<usize>,
        ne3: usize,
        kv: DType,
        mask: Option<DType>,
        params: AttnParams,
    ) -> Problem {
        let mut r = Lcg(seed);
        let q = r.vec(d * n_q * h * ne3);
        let round = |v: Vec<f32>| if kv == DType::F16 { f16_round(&v) } else { v };
        let k = round(r.vec(d * n_kv * h_kv * ne3));
        let v = round(r.vec(dv * n_kv * h_kv * ne3));
        let mut m = vec![f32::NEG_INFINITY; n_kv * n_q];
        for iq in 0..n_q {
            let hi = (used + iq).min(n_kv);
            let lo = window.map_or(0, |w| hi.saturating_sub(w));
            for j in lo..hi {
                // Some ALiBi-like finite values too, so the mask's addition is exercised.
                m[iq * n_kv + j] = if j % 7 == 3 { -0.5 } else { 0.0 };
            }
        }
        Problem {
            d,
            dv,
            n_kv,
            n_q,
            h,
            h_kv,
            ne3,
            kv,
            mask,
            q,
            k,
            v,
            m,
            params,
        }
    }

    /// The same problem over `n_kv` positions (at least the current ones): the new
    /// positions get random K/V (from `seed`) and a masked (-inf) mask.
    fn padded(&self, n_kv: usize, seed: u64) -> Problem {
        let mut p = self.clone();
        p.n_kv = n_kv;
        let mut r = Lcg(seed);
        let mut widen = |x: &[f32], width: usize| {
            let mut y = f16_round(&r.vec(width * n_kv * self.h_kv));
            for hk in 0..self.h_kv {
                for j in 0..self.n_kv {
                    let (from, to) = (width * (j + self.n_kv * hk), width * (j + n_kv * hk));
                    y[to..to + width].copy_from_slice(&x[from..from + width]);
                }
            }
            y
        };
        p.k = widen(&self.k, self.d);
        p.v = widen(&self.v, self.dv);
        p.m = vec![f32::NEG_INFINITY; n_kv * self.n_q];
        for iq in 0..self.n_q {
            p.m[iq * n_kv..iq * n_kv + self.n_kv]
                .copy_from_slice(&self.m[iq * self.n_kv..(iq + 1) * self.n_kv]);
        }
        p
    }

    /// Queries `from..from + count` alone (one i3).
    fn queries(&self, from: usize, count: usize) -> Problem {
        let mut p = self.clone();
        p.n_q = count;
        p.q = (0..self.h)
            .flat_map(|hh| self.q[self.d * (from + self.n_q * hh)..][..self.d * count].to_vec())
            .collect();
        p.m = self.m[from * self.n_kv..(from + count) * self.n_kv].to_vec();
        p
    }

    fn reference(&self) -> Vec<f32> {
        reference::flash_attn_decode(&self.args())
    }

    /// What `flash_attn_mma` computes (cuda-sim's default mma model).
    fn reference_mma(&self) -> Vec<f32> {
        reference::flash_attn_mma(&self.args(), &MmaModel::default())
    }

    fn args(&self) -> AttnDecode<'_> {
        AttnDecode {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            mask: self.mask.map(|_| &self.m[..]),
            d: self.d,
            dv: self.dv,
            n_kv: self.n_kv,
            n_q: self.n_q,
            h: self.h,
            h_kv: self.h_kv,
            ne3: self.ne3,
            k_f16: self.kv == DType::F16,
            scale: self.params.scale,
            softcap: self.params.softcap,
            max_bias: self.params.max_bias,
        }
    }

    /// Runs the op: q stored `[d, h, n_q, ne3]` and permuted as a model graph does; K and
    /// V as head views of one cache row per position (the KV cache layout). Returns the
    /// output `[dv, h, n_q, ne3]`.
    fn run(&self, be: &CudaBackend) -> Vec<f32> {
        let (d, dv, n_kv, n_q, h, h_kv, ne3) = (
            self.d, self.dv, self.n_kv, self.n_q, self.h, self.h_kv, self.ne3,
        );
        let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 16];
        let mut ctx = Context::new(&mut s);
        let tq = ctx.new_tensor(DType::F32, [d, h, n_q, ne3]).unwrap();
        let qp = ctx.permute(tq, [0, 2, 1, 3]).unwrap();
        let es = self.kv.type_size();
        let cache = |ctx: &mut Context<'_>, width: usize| -> (TensorId, TensorId) {
            let c = ctx
                .new_tensor(self.kv, [width * h_kv, n_kv, ne3, 1])
                .unwrap();
            let row = width * h_kv * es;
            let view = ctx
                .view(
                    c,
                    [width, n_kv, h_kv, ne3],
                    [es, row, width * es, row * n_kv],
                    0,
                )
                .unwrap();
            (c, view)
        };
        let (kc, kview) = cache(&mut ctx, d);
        let (vc, vview) = cache(&mut ctx, dv);
        let tm = self
            .mask
            .map(|dt| ctx.new_tensor(dt, [n_kv, n_q, 1, 1]).unwrap());
        let o = ctx
            .flash_attn_ext(qp, kview, vview, tm, self.params)
            .unwrap();
        // q: [d, h, n_q, ne3] from the reference's [d, n_q, h, ne3].
        let mut qs = vec![0f32; self.q.len()];
        for i3 in 0..ne3 {
            for iq in 0..n_q {
                for hh in 0..h {
                    let from = d * (iq + n_q * (hh + h * i3));
                    let to = d * (hh + h * (iq + n_q * i3));
                    qs[to..to + d].copy_from_slice(&self.q[from..from + d]);
                }
            }
        }
        // K/V: cache rows [width * h_kv] per (position, i3).
        let interleave = |x: &[f32], width: usize| {
            let mut c = vec![0f32; x.len()];
            for i3 in 0..ne3 {
                for hk in 0..h_kv {
                    for j in 0..n_kv {
                        let from = width * (j + n_kv * (hk + h_kv * i3));
                        let to = width * (hk + h_kv * (j + n_kv * i3));
                        c[to..to + width].copy_from_slice(&x[from..from + width]);
                    }
                }
            }
            c
        };
        let mut inputs = vec![
            (tq, f32_bytes(&qs)),
            (kc, bytes_of(self.kv, &interleave(&self.k, d))),
            (vc, bytes_of(self.kv, &interleave(&self.v, dv))),
        ];
        if let (Some(tm), Some(dt)) = (tm, self.mask) {
            inputs.push((tm, bytes_of(dt, &self.m)));
        }
        let out = run_all(be, &mut ctx, &inputs, &[o]).pop().unwrap();
        common::to_f32(DType::F32, &out)
    }
}

/// A SmolLM2-shaped problem (D 64, 9 heads over 3, f16 K/V and mask, scale 1/8, one
/// i3): `n_q` queries over `n_kv` cells of which the first `used` (plus the query's
/// index) are seen.
fn smol(seed: u64, n_q: usize, n_kv: usize, used: usize) -> Problem {
    Problem::new(
        seed,
        (64, 64),
        SMOL,
        n_q,
        n_kv,
        used,
        None,
        1,
        DType::F16,
        Some(DType::F16),
        AttnParams::scaled(0.125),
    )
}

fn assert_matches(got: &[f32], want: &[f32], what: &str) {
    if exact() {
        let bad = got
            .iter()
            .zip(want)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        if let Some(i) = bad {
            panic!("{what}: element {i}: {} vs reference {}", got[i], want[i]);
        }
    } else {
        let e = nmse(got, want);
        assert!(e < 1e-7, "{what}: NMSE {e:e}");
    }
}

const SMOL: (usize, usize) = (9, 3);
const GEMMA: (usize, usize) = (4, 1);

/// The tiled kernel against its reference over the shapes and features the op has:
/// SmolLM2 (D 64, 9 heads over 3) and Gemma 3 (D 256, 4 heads over 1, sliding window)
/// at 1..7 queries (decode batches) and 9..40 (prompts, causal from an empty or a filled
/// cache), f32 and f16 K/V and masks, no mask, ALiBi, soft-capping, several i3, head
/// sizes that are not multiples of 8 (scalar loads), many tiles.
#[rstest::rstest]
#[case::smollm2_one_token(
    64,
    SMOL,
    1,
    256,
    37,
    None,
    1,
    DType::F16,
    Some(DType::F16),
    0.125,
    0.0,
    0.0
)]
#[case::smollm2_three_tokens(
    64,
    SMOL,
    3,
    256,
    130,
    None,
    1,
    DType::F16,
    Some(DType::F16),
    0.125,
    0.0,
    0.0
)]
#[case::smollm2_seven_tokens(
    64,
    SMOL,
    7,
    512,
    300,
    None,
    1,
    DType::F16,
    Some(DType::F16),
    0.125,
    0.0,
    0.0
)]
// One tile (n_kv <= 128): the block is its own combine, no partials, no count.
#[case::smollm2_one_tile(
    64,
    SMOL,
    1,
    128,
    37,
    None,
    1,
    DType::F16,
    Some(DType::F16),
    0.125,
    0.0,
    0.0
)]
#[case::one_tile_three_tokens_gqa1(64, (6, 6), 3, 100, 60, None, 2, DType::F16, Some(DType::F16), 0.125, 0.0, 0.0)]
#[case::one_tile_softcap_alibi_f32(64, (6, 6), 2, 128, 128, None, 1, DType::F32, None, 0.125, 30.0, 8.0)]
#[case::gemma3_window(256, GEMMA, 1, 512, 400, Some(128), 1, DType::F16, Some(DType::F16), 1.0 / 16.0, 0.0, 0.0)]
#[case::gemma3_five_tokens(256, GEMMA, 5, 512, 200, Some(64), 1, DType::F16, Some(DType::F16), 1.0 / 16.0, 0.0, 0.0)]
#[case::f32_kv_f32_mask_batched(128, (8, 2), 2, 300, 290, None, 2, DType::F32, Some(DType::F32), 0.088, 0.0, 0.0)]
#[case::alibi_softcap_no_mask(64, (6, 6), 2, 200, 200, None, 1, DType::F16, None, 0.125, 30.0, 8.0)]
#[case::no_mask(64, SMOL, 2, 200, 200, None, 1, DType::F16, None, 0.125, 0.0, 0.0)]
#[case::one_head_per_kv_head(64, (6, 6), 2, 200, 150, None, 1, DType::F16, Some(DType::F16), 0.125, 0.0, 0.0)]
#[case::one_head_per_kv_head_no_mask(64, (6, 6), 2, 200, 200, None, 1, DType::F16, None, 0.125, 0.0, 0.0)]
#[case::softcap_no_mask(64, SMOL, 2, 200, 200, None, 1, DType::F16, None, 0.125, 30.0, 0.0)]
#[case::alibi_masked(
    64,
    SMOL,
    2,
    200,
    150,
    None,
    1,
    DType::F16,
    Some(DType::F16),
    0.125,
    0.0,
    8.0
)]
#[case::odd_head_size(36, (4, 2), 3, 150, 140, None, 1, DType::F16, Some(DType::F16), 0.17, 0.0, 0.0)]
#[case::odd_head_size_f32(20, (2, 1), 1, 70, 70, None, 1, DType::F32, Some(DType::F16), 0.2, 20.0, 0.0)]
#[case::head_size_eight_one_v_thread(8, (2, 1), 3, 40, 37, None, 1, DType::F16, Some(DType::F16), 0.35, 0.0, 0.0)]
#[case::q_rows_not_16_byte_multiples(18, (3, 1), 1, 40, 33, None, 1, DType::F16, Some(DType::F32), 0.3, 0.0, 0.0)]
#[case::smollm2_prompt_after_a_chunk(
    64,
    SMOL,
    24,
    256,
    100,
    None,
    1,
    DType::F16,
    Some(DType::F16),
    0.125,
    0.0,
    0.0
)]
#[case::smollm2_prompt_from_empty(
    64,
    SMOL,
    40,
    64,
    1,
    None,
    1,
    DType::F16,
    Some(DType::F16),
    0.125,
    0.0,
    0.0
)]
#[case::gemma3_prompt_window(256, GEMMA, 12, 512, 300, Some(64), 1, DType::F16, Some(DType::F16), 1.0 / 16.0, 0.0, 0.0)]
#[case::prompt_odd_head_f32_softcap(36, (4, 2), 9, 150, 100, None, 2, DType::F32, Some(DType::F32), 0.17, 20.0, 0.0)]
#[case::many_tiles(
    64,
    SMOL,
    1,
    1100,
    1050,
    None,
    1,
    DType::F16,
    Some(DType::F16),
    0.125,
    0.0,
    0.0
)]
fn tiled_attention_matches_its_reference(
    #[case] d: usize,
    #[case] heads: (usize, usize),
    #[case] n_q: usize,
    #[case] n_kv: usize,
    #[case] used: usize,
    #[case] window: Option<usize>,
    #[case] ne3: usize,
    #[case] kv: DType,
    #[case] mask: Option<DType>,
    #[case] scale: f32,
    #[case] softcap: f32,
    #[case] max_bias: f32,
) {
    let be = backend();
    let params = AttnParams {
        scale,
        max_bias,
        softcap,
    };
    let p = Problem::new(
        d as u64 + n_kv as u64,
        (d, d),
        heads,
        n_q,
        n_kv,
        used,
        window,
        ne3,
        kv,
        mask,
        params,
    );
    let before = be.kernel_stats();
    let got = p.run(&be);
    let after = be.kernel_stats();
    assert_eq!(
        after.launches_of(KernelId::FlashAttnDec) - before.launches_of(KernelId::FlashAttnDec),
        1
    );
    assert_eq!(
        after.launches_of(KernelId::FlashAttnExt),
        before.launches_of(KernelId::FlashAttnExt)
    );
    // Rows kept in groups of up to 8 however few blocks that gives: the same bits.
    be.set_tuning(CudaTuning {
        attn_row_split: false,
        ..dec_tuning()
    });
    let grouped = p.run(&be);
    // Each tuning launched the grid launch::flash_attn_dec gives it.
    for split in [false, true] {
        be.set_tuning(CudaTuning {
            attn_row_split: split,
            ..dec_tuning()
        });
        let launched = grids_of(&be, KernelId::FlashAttnDec, || {
            p.run(&be);
        });
        let geo = launch::flash_attn_dec(d, d, heads.0, heads.1, n_q, n_kv, ne3, split).unwrap();
        assert_eq!(launched, [geo.dims.grid], "attn_row_split {split}");
    }
    // The first kernel computes the same attention (another reduction order); it runs
    // before the checks so that a failure says whether it agrees with the reference.
    be.set_tuning(CudaTuning {
        legacy_decode_attn: true,
        legacy_prompt_attn: true,
        ..dec_tuning()
    });
    let old = p.run(&be);
    be.set_tuning(dec_tuning());
    let want = p.reference();
    let what = format!(
        "tiled attention (the first kernel vs the reference: NMSE {:e})",
        nmse(&old, &want)
    );
    assert_matches(&got, &want, &what);
    assert_eq!(bits(&grouped), bits(&got), "no-attn-row-split");
    let e = nmse(&old, &got);
    assert!(e < 1e-9, "legacy kernel vs tiled kernel: NMSE {e:e}");
}

/// The decode kernel with one query row a block against the reference and against
/// `flash_attn_dec`, whose arithmetic it unrolls: bit for bit (on a GPU, the same bits as
/// `flash_attn_dec` and the reference within its NMSE). SmolLM2 (D 64, 9 heads over 3) and
/// Gemma 3 (D 256, 4 over 1, sliding window) at 1..7 queries, D 128 over two i3 with an
/// f32 mask, no mask, one tile (the block is its own combine) at n_kv 1, 65, 97 and 128,
/// partial quarters and tiles, many tiles.
#[rstest::rstest]
#[case::smollm2_position_64(64, SMOL, 1, 65, 65, None, 1, Some(DType::F16))]
#[case::smollm2_one_position(64, SMOL, 1, 1, 1, None, 1, Some(DType::F16))]
#[case::smollm2_partial_quarter(64, SMOL, 1, 97, 90, None, 1, Some(DType::F16))]
#[case::smollm2_one_full_tile(64, SMOL, 1, 128, 128, None, 1, Some(DType::F16))]
#[case::smollm2_two_tiles(64, SMOL, 1, 256, 37, None, 1, Some(DType::F16))]
#[case::smollm2_three_tokens(64, SMOL, 3, 256, 130, None, 1, Some(DType::F16))]
#[case::smollm2_seven_tokens(64, SMOL, 7, 512, 300, None, 1, Some(DType::F16))]
#[case::smollm2_many_tiles(64, SMOL, 1, 1100, 1050, None, 1, Some(DType::F16))]
#[case::no_mask(64, SMOL, 2, 200, 200, None, 1, None)]
#[case::one_head_per_kv_head(64, (6, 6), 2, 200, 150, None, 1, Some(DType::F16))]
#[case::head_size_128_f32_mask_two_i3(128, (8, 2), 2, 300, 290, None, 2, Some(DType::F32))]
#[case::head_size_128_one_tile(128, (4, 4), 3, 66, 66, None, 1, None)]
#[case::gemma3_window(256, GEMMA, 1, 512, 400, Some(128), 1, Some(DType::F16))]
#[case::gemma3_five_tokens(256, GEMMA, 5, 512, 200, Some(64), 1, Some(DType::F16))]
#[case::gemma3_one_tile(256, GEMMA, 1, 100, 100, None, 1, Some(DType::F16))]
fn row_attention_matches_its_reference_and_the_tiled_kernel(
    #[case] d: usize,
    #[case] heads: (usize, usize),
    #[case] n_q: usize,
    #[case] n_kv: usize,
    #[case] used: usize,
    #[case] window: Option<usize>,
    #[case] ne3: usize,
    #[case] mask: Option<DType>,
) {
    let be = backend();
    let scale = 1.0 / (d as f32).sqrt();
    let p = Problem::new(
        7 * d as u64 + n_kv as u64,
        (d, d),
        heads,
        n_q,
        n_kv,
        used,
        window,
        ne3,
        DType::F16,
        mask,
        AttnParams::scaled(scale),
    );
    let tiled = p.run(&be);
    be.set_tuning(CudaTuning::default());
    let mut got = Vec::new();
    let launched = grids_of(&be, row_kernel(d), || got = p.run(&be));
    let geo = launch::flash_attn_row(d, heads.0, n_q, n_kv, ne3).unwrap();
    assert_eq!(launched, [geo.dims.grid]);
    assert_matches(&got, &p.reference(), "flash_attn_row");
    assert_row_kernel_agrees(&be, &p, &tiled);
    // A second launch: the combine's counters are back at 0.
    be.set_tuning(CudaTuning::default());
    assert_eq!(bits(&p.run(&be)), bits(&got), "second launch");
}

/// What `flash_attn_row` lacks goes to `flash_attn_dec`, bit for bit its reference: f32
/// K/V, soft-capping, ALiBi, a head size without an entry; and every decode batch with
/// `no-row-attn`.
#[rstest::rstest]
#[case::f32_kv(64, DType::F32, 0.0, 0.0, true)]
#[case::softcap(64, DType::F16, 30.0, 0.0, true)]
#[case::alibi(64, DType::F16, 0.0, 8.0, true)]
#[case::head_size_80(80, DType::F16, 0.0, 0.0, true)]
#[case::switched_off(64, DType::F16, 0.0, 0.0, false)]
fn decode_attention_the_row_kernel_lacks_runs_on_the_tiled_kernel(
    #[case] d: usize,
    #[case] kv: DType,
    #[case] softcap: f32,
    #[case] max_bias: f32,
    #[case] row_attn: bool,
) {
    let be = backend();
    be.set_tuning(CudaTuning {
        row_attn,
        ..CudaTuning::default()
    });
    let p = Problem::new(
        41,
        (d, d),
        (6, 2),
        2,
        150,
        140,
        None,
        1,
        kv,
        Some(DType::F16),
        AttnParams {
            scale: 0.1,
            max_bias,
            softcap,
        },
    );
    let mut got = Vec::new();
    let row = launches(&be, KernelId::FlashAttnRow64, || {
        assert_eq!(
            launches(&be, KernelId::FlashAttnDec, || got = p.run(&be)),
            1
        );
    });
    be.set_tuning(dec_tuning());
    assert_eq!(row, 0);
    assert_matches(&got, &p.reference(), "flash_attn_dec");
}

/// On `flash_attn_row` too, padding the KV range with masked cells leaves every bit as
/// it was, and so does running 7 queries together or one by one.
#[test]
fn row_attention_ignores_padding_and_batching() {
    let be = backend();
    be.set_tuning(CudaTuning::default());
    let (d, n_q) = (64, 7);
    let base = Problem::new(
        17,
        (d, d),
        SMOL,
        n_q,
        200,
        150,
        None,
        1,
        DType::F16,
        Some(DType::F16),
        AttnParams::scaled(0.125),
    );
    let mut got = Vec::new();
    assert_eq!(
        launches(&be, KernelId::FlashAttnRow64, || got = base.run(&be)),
        1
    );
    assert_matches(&got, &base.reference(), "n_kv 200");
    for n_kv in [256, 300, 1024] {
        assert_eq!(
            bits(&base.padded(n_kv, 5).run(&be)),
            bits(&got),
            "n_kv {n_kv}"
        );
    }
    let (h, dv) = (base.h, base.dv);
    for iq in [0, 3, 6] {
        assert_eq!(
            bits(&base.queries(iq, 1).run(&be)),
            bits(&got[iq * h * dv..(iq + 1) * h * dv]),
            "query {iq} alone"
        );
    }
}

/// Padding the KV range with masked cells (the n_kv buckets of a model, or any amount)
/// leaves every bit of the result as it was; so does running the launch again (the
/// counters are back at 0) and running the queries one by one or five at a time instead of
/// 12 together: a prompt's rows have the bits of decodes of the same queries.
#[test]
fn attention_ignores_padding_batching_and_reruns() {
    let be = backend();
    let (d, n_q, used) = (64, 12, 200);
    let params = AttnParams::scaled(0.125);
    let base = Problem::new(
        3,
        (d, d),
        SMOL,
        n_q,
        256,
        used,
        None,
        1,
        DType::F16,
        Some(DType::F16),
        params,
    );
    let want = base.run(&be);
    assert_matches(&want, &base.reference(), "n_kv 256");
    assert_eq!(bits(&base.run(&be)), bits(&want), "second launch");
    // The same cells in a longer KV range: 512 (the next bucket) and 300 (a partial tile).
    for n_kv in [512, 300, 1024] {
        assert_eq!(
            bits(&base.padded(n_kv, 99).run(&be)),
            bits(&want),
            "n_kv {n_kv}"
        );
    }
    // Each query alone, and queries 5..10 together: the rows of the 12-query result,
    // bit for bit.
    let (h, dv) = (base.h, base.dv);
    for iq in 0..n_q {
        assert_eq!(
            bits(&base.queries(iq, 1).run(&be)),
            bits(&want[iq * h * dv..(iq + 1) * h * dv]),
            "query {iq} alone"
        );
    }
    assert_eq!(
        bits(&base.queries(5, 5).run(&be)),
        bits(&want[5 * h * dv..10 * h * dv]),
        "queries 5..10"
    );
}

/// Each legacy switch puts the first kernel back for its batch sizes only: under 8
/// queries for `legacy_decode_attn`, from 8 on for `legacy_prompt_attn`.
#[rstest::rstest]
#[case::decode_switch(true, false)]
#[case::prompt_switch(false, true)]
#[case::both(true, true)]
fn each_legacy_attention_switch_covers_its_batches(#[case] decode: bool, #[case] prompt: bool) {
    let be = backend();
    be.set_tuning(CudaTuning {
        legacy_decode_attn: decode,
        legacy_prompt_attn: prompt,
        ..dec_tuning()
    });
    for (n_q, legacy) in [(3, decode), (7, decode), (8, prompt), (20, prompt)] {
        let p = smol(5, n_q, 160, 100);
        let before = be.kernel_stats();
        p.run(&be);
        let after = be.kernel_stats();
        let ran = |k: KernelId| after.launches_of(k) - before.launches_of(k);
        let (ext, dec) = if legacy { (1, 0) } else { (0, 1) };
        assert_eq!(
            (ran(KernelId::FlashAttnExt), ran(KernelId::FlashAttnDec)),
            (ext, dec),
            "{n_q} queries"
        );
    }
}

/// A query whose every position is masked gets zeros, as from the first kernel, and
/// tiles no query sees load nothing (here all but one of 16).
#[test]
fn fully_masked_rows_and_tiles() {
    let be = backend();
    let mut p = smol(5, 2, 2048, 50);
    // Query 1 sees nothing.
    p.m[p.n_kv..].fill(f32::NEG_INFINITY);
    let got = p.run(&be);
    assert_matches(&got, &p.reference(), "masked rows");
    let row = 9 * 64;
    assert!(
        got[row..].iter().all(|&x| x.to_bits() == 0),
        "zeros for query 1"
    );
    assert!(got[..row].iter().any(|&x| x != 0.0));
    assert_row_kernel_agrees(&be, &p, &got);
}

/// Bit for bit on cuda-sim but for NaN payloads; on a GPU, NaN in the same places.
fn assert_matches_but_nan_payloads(got: &[f32], want: &[f32]) {
    let canon = |x: f32| {
        if x.is_nan() {
            f32::NAN.to_bits()
        } else {
            x.to_bits()
        }
    };
    let bad = got
        .iter()
        .zip(want)
        .position(|(a, b)| canon(*a) != canon(*b));
    if exact() {
        assert_eq!(
            bad,
            None,
            "first difference: {:?}",
            bad.map(|i| (got[i], want[i]))
        );
    } else {
        let nan = |v: &[f32]| v.iter().map(|x| x.is_nan()).collect::<Vec<_>>();
        assert_eq!(nan(got), nan(want));
    }
}

/// Which of SmolLM2's 9 heads of query `iq` have a NaN among their 64 outputs.
fn nan_heads(got: &[f32], iq: usize) -> Vec<bool> {
    (0..9)
        .map(|hh| got[64 * (hh + 9 * iq)..][..64].iter().any(|x| x.is_nan()))
        .collect()
}

/// One tile in which no query sees anything (the single empty tile's own combine): zeros,
/// as the reference gives, including for a second query that sees only part of it.
#[test]
fn a_single_empty_tile_gives_zeros() {
    let be = backend();
    let mut p = smol(6, 2, 128, 40);
    p.m.fill(f32::NEG_INFINITY);
    let got = p.run(&be);
    assert_matches(&got, &p.reference(), "single empty tile");
    assert!(got.iter().all(|&x| x.to_bits() == 0), "+0 everywhere");
    assert_row_kernel_agrees(&be, &p, &got);
}

/// Non-finite inputs in a single tile follow the reference as with many tiles: an
/// infinite key element (a +inf score makes the tile's m +inf and its factor NaN) and a
/// NaN value element.
#[test]
fn non_finite_inputs_in_a_single_tile_follow_the_reference() {
    let be = backend();
    let mut p = smol(12, 1, 128, 100);
    p.k[30 * 64 + 3] = f32::INFINITY;
    // One query: head h's row is q[64h..]; head 0 scores +inf there, head 1 -inf.
    p.q[3] = 0.5;
    p.q[64 + 3] = -0.5;
    p.v[(128 + 20) * 64 + 10] = f32::NAN;
    let got = p.run(&be);
    assert_matches_but_nan_payloads(&got, &p.reference());
    let nan_heads = nan_heads(&got, 0);
    // Heads 3-5 read the NaN value; head 0 scores +inf (m = +inf: NaN), head 1 -inf
    // (the position drops out: finite).
    assert!(nan_heads[3..6].iter().all(|&b| b), "{nan_heads:?}");
    assert!(nan_heads[0] && !nan_heads[1], "{nan_heads:?}");
    assert!(!nan_heads[6..].contains(&true), "{nan_heads:?}");
    assert_row_kernel_agrees(&be, &p, &got);
}

/// A query row with a NaN element scores NaN at every position, so its tile maximum is
/// NaN: a single tile's own combine then follows the combine's arithmetic (M = max(-inf,
/// NaN) = -inf: zeros), as the reference does; also when every position of the tile is
/// live, so that no skipped position's -inf takes part in the maximum, and over two
/// tiles (the combine skips a tile whose maximum is NaN as it skips an empty one).
#[rstest::rstest]
#[case::partial_tile(128, 90)]
#[case::full_tile(128, 128)]
#[case::two_tiles(256, 200)]
fn a_nan_query_row_in_a_single_tile_follows_the_reference(
    #[case] n_kv: usize,
    #[case] used: usize,
) {
    let be = backend();
    let mut p = smol(13, 1, n_kv, used);
    // Head 2 of query 0: a NaN in its query row.
    p.q[2 * 64 + 5] = f32::NAN;
    let got = p.run(&be);
    assert_matches_but_nan_payloads(&got, &p.reference());
    let head2 = &got[2 * 64..3 * 64];
    assert!(head2.iter().all(|x| x.to_bits() == 0), "{head2:?}");
    assert!(!nan_heads(&got, 0).contains(&true));
    assert_row_kernel_agrees(&be, &p, &got);
}

/// A tile whose every score is NaN (a NaN in each of its keys) has the maximum of no
/// score, -inf, in the combine, so it drops out there as an empty tile does and the
/// other tile gives the output, as in the reference (NaN payloads aside).
#[test]
fn a_tile_of_nan_scores_drops_out_of_the_combine() {
    let be = backend();
    let mut p = smol(14, 1, 256, 256);
    // KV head 0, positions 0..127 (tile 0): a NaN in every key.
    for j in 0..128 {
        p.k[64 * j + 7] = f32::NAN;
    }
    let got = p.run(&be);
    assert_matches_but_nan_payloads(&got, &p.reference());
    assert!(!nan_heads(&got, 0).contains(&true));
    assert_row_kernel_agrees(&be, &p, &got);
}

/// Non-finite inputs take the same path as the reference: an infinite key element in
/// tile 5 of 9 (the combine reads tiles four at a time; for a head whose score is +inf
/// that tile's m is +inf, its factor NaN and the others' 0) and a NaN value element in
/// tile 1 of the other KV head. NaN payloads aside, the outputs match bit for bit.
#[test]
fn non_finite_keys_and_values_follow_the_reference() {
    let be = backend();
    let mut p = smol(11, 2, 1100, 1050);
    // Key of position 700 (tile 5) of KV head 0: +inf in one element.
    p.k[700 * 64 + 3] = f32::INFINITY;
    // Value of position 200 (tile 1) of KV head 1: NaN in one element.
    p.v[(1100 + 200) * 64 + 10] = f32::NAN;
    let got = p.run(&be);
    let want = p.reference();
    // Output [dv, h, n_q]: heads 0-2 read KV head 0 (the infinite key), 3-5 KV head 1
    // (the NaN value; query 0 sees positions below 1050, so both queries see 200).
    for iq in 0..2 {
        let n = nan_heads(&got, iq);
        // The key's score is +inf for some heads (NaN out) and -inf for others (the
        // position drops out, finite out); the NaN value reaches every head reading it.
        assert!(n[..3].contains(&true) && n[..3].contains(&false), "{n:?}");
        assert!(
            n[3..6].iter().all(|&b| b) && !n[6..].contains(&true),
            "{n:?}"
        );
    }
    assert_matches_but_nan_payloads(&got, &want);
    assert_row_kernel_agrees(&be, &p, &got);
}

/// Launches of `k` while `f` runs.
fn launches(be: &CudaBackend, k: KernelId, f: impl FnOnce()) -> u64 {
    let before = be.kernel_stats().launches_of(k);
    f();
    be.kernel_stats().launches_of(k) - before
}

/// The grids of the launches of `k` while `f` runs, in order.
fn grids_of(be: &CudaBackend, k: KernelId, f: impl FnOnce()) -> Vec<(u32, u32, u32)> {
    be.record_launches(true);
    f();
    let grids = be
        .take_recorded_launches()
        .into_iter()
        .filter(|l| l.kernel == k)
        .map(|l| l.dims.grid)
        .collect();
    be.record_launches(false);
    grids
}

/// The tensor-core kernel against its reference: SmolLM2's heads (D 64, 9 over 3) on a
/// prompt from an empty cache and after a chunk, at the 8-query threshold, with a sliding
/// window, without a mask, a partial last tile (n_kv 100) and many tiles, one head per KV
/// head over two i3, and head size 128 (its one-stage pipeline). Each launches
/// `flash_attn_mma` once and `flash_attn_dec` never; the FMA kernel's result (another
/// class, the same attention) stays within an NMSE of 1e-6 of it.
#[rstest::rstest]
#[case::smollm2_prompt_from_empty(64, SMOL, 40, 64, 1, None, 1, Some(DType::F16))]
#[case::smollm2_prompt_after_a_chunk(64, SMOL, 24, 256, 100, None, 1, Some(DType::F16))]
#[case::eight_queries(64, SMOL, 8, 128, 60, None, 1, Some(DType::F16))]
#[case::sliding_window(64, SMOL, 33, 320, 200, Some(70), 1, Some(DType::F16))]
#[case::no_mask(64, SMOL, 12, 200, 200, None, 1, None)]
#[case::partial_tile(64, SMOL, 9, 100, 80, None, 1, Some(DType::F16))]
#[case::many_tiles(64, SMOL, 9, 1100, 1050, None, 1, Some(DType::F16))]
#[case::one_head_per_kv_head_two_i3(64, (6, 6), 17, 130, 100, None, 2, Some(DType::F16))]
#[case::head_size_128(128, (8, 2), 20, 300, 250, None, 1, Some(DType::F16))]
#[case::head_size_128_no_mask(128, (4, 4), 9, 66, 66, None, 2, None)]
fn mma_attention_matches_its_reference(
    #[case] d: usize,
    #[case] heads: (usize, usize),
    #[case] n_q: usize,
    #[case] n_kv: usize,
    #[case] used: usize,
    #[case] window: Option<usize>,
    #[case] ne3: usize,
    #[case] mask: Option<DType>,
) {
    let be = mma_backend();
    let scale = 1.0 / (d as f32).sqrt();
    let p = Problem::new(
        d as u64 * 7 + n_q as u64,
        (d, d),
        heads,
        n_q,
        n_kv,
        used,
        window,
        ne3,
        DType::F16,
        mask,
        AttnParams::scaled(scale),
    );
    let kernel = if d == 64 {
        KernelId::FlashAttnMma64
    } else {
        KernelId::FlashAttnMma128
    };
    let mut got = Vec::new();
    let dec = launches(&be, KernelId::FlashAttnDec, || {
        assert_eq!(launches(&be, kernel, || got = p.run(&be)), 1);
    });
    assert_eq!(dec, 0);
    be.set_tuning(dec_tuning());
    let fma = p.run(&be);
    be.set_tuning(CudaTuning::default());
    let want = p.reference_mma();
    let what = format!(
        "mma attention (the FMA kernel vs this reference: NMSE {:e})",
        nmse(&fma, &want)
    );
    assert_matches(&got, &want, &what);
    let e = nmse(&got, &fma);
    assert!(e < 1e-6, "tensor-core vs FMA kernel: NMSE {e:e}");
}

/// Padding the KV range with masked cells leaves every bit of the tensor-core kernel's
/// result as it was, as do a second launch and any prompt-sized subset of the queries
/// (8 and 20 of 40, starting inside a block's and a warp's rows): a row's bits do not
/// depend on which rows share its warp or block, or on which tiles a warp skips.
#[test]
fn mma_attention_ignores_padding_batching_and_reruns() {
    let be = mma_backend();
    let (d, n_q, used) = (64, 40, 150);
    let base = Problem::new(
        21,
        (d, d),
        SMOL,
        n_q,
        192,
        used,
        None,
        1,
        DType::F16,
        Some(DType::F16),
        AttnParams::scaled(0.125),
    );
    let want = base.run(&be);
    assert_matches(&want, &base.reference_mma(), "n_kv 192");
    assert_eq!(bits(&base.run(&be)), bits(&want), "second launch");
    for n_kv in [256, 300, 1024] {
        assert_eq!(
            bits(&base.padded(n_kv, 5).run(&be)),
            bits(&want),
            "n_kv {n_kv}"
        );
    }
    let (h, dv) = (base.h, base.dv);
    for (from, count) in [(5, 8), (13, 20), (32, 8)] {
        assert_eq!(
            bits(&base.queries(from, count).run(&be)),
            bits(&want[from * h * dv..(from + count) * h * dv]),
            "queries {from}..{}",
            from + count
        );
    }
}

/// What the tensor-core kernel lacks goes to `flash_attn_dec`, bit for bit its
/// reference: f32 K/V, soft-capping, ALiBi, an f32 mask, a head size other than 64 or
/// 128, an odd n_kv; and with `no-mma-attn` every prompt; fewer than 8 queries always.
#[rstest::rstest]
#[case::f32_kv(64, 12, 128, DType::F32, Some(DType::F16), 0.0, 0.0, true)]
#[case::softcap(64, 12, 128, DType::F16, Some(DType::F16), 30.0, 0.0, true)]
#[case::alibi(64, 12, 128, DType::F16, Some(DType::F16), 0.0, 8.0, true)]
#[case::f32_mask(64, 12, 128, DType::F16, Some(DType::F32), 0.0, 0.0, true)]
#[case::head_size_80(80, 12, 128, DType::F16, Some(DType::F16), 0.0, 0.0, true)]
#[case::odd_n_kv(64, 12, 127, DType::F16, Some(DType::F16), 0.0, 0.0, true)]
#[case::switched_off(64, 12, 128, DType::F16, Some(DType::F16), 0.0, 0.0, false)]
#[case::seven_queries(64, 7, 128, DType::F16, Some(DType::F16), 0.0, 0.0, true)]
fn attention_the_mma_kernel_lacks_runs_on_the_fma_kernel(
    #[case] d: usize,
    #[case] n_q: usize,
    #[case] n_kv: usize,
    #[case] kv: DType,
    #[case] mask: Option<DType>,
    #[case] softcap: f32,
    #[case] max_bias: f32,
    #[case] mma_attn: bool,
) {
    let be = mma_backend();
    // Decode batches (seven queries) on flash_attn_dec too, not flash_attn_row.
    be.set_tuning(CudaTuning {
        mma_attn,
        row_attn: false,
        ..CudaTuning::default()
    });
    let p = Problem::new(
        31,
        (d, d),
        (6, 2),
        n_q,
        n_kv,
        n_kv - 20,
        None,
        1,
        kv,
        mask,
        AttnParams {
            scale: 0.1,
            max_bias,
            softcap,
        },
    );
    let mut got = Vec::new();
    let mma = launches(&be, KernelId::FlashAttnMma64, || {
        assert_eq!(
            launches(&be, KernelId::FlashAttnDec, || got = p.run(&be)),
            1
        );
    });
    be.set_tuning(CudaTuning::default());
    assert_eq!(mma, 0);
    assert_matches(&got, &p.reference(), "flash_attn_dec");
}

/// Rows that see nothing get +0 from the tensor-core kernel (l = 0), as from the FMA
/// kernel, while the rows beside them in the same warp are computed: with one KV chunk
/// (128 positions: out = o / l directly) and with three (the combine skips chunks that saw
/// nothing, so a row that saw nothing anywhere is 0, not NaN).
#[rstest::rstest]
#[case::one_chunk(128)]
#[case::three_chunks(320)]
fn mma_attention_gives_zeros_for_fully_masked_rows(#[case] n_kv: usize) {
    let be = mma_backend();
    let mut p = smol(8, 10, n_kv, 60);
    // Queries 3 and 4 see nothing (rows 9..15 of the first warp).
    p.m[3 * n_kv..5 * n_kv].fill(f32::NEG_INFINITY);
    let got = p.run(&be);
    assert_matches(&got, &p.reference_mma(), "masked rows");
    let row = 9 * 64;
    assert!(got[3 * row..5 * row].iter().all(|&x| x.to_bits() == 0));
    assert!(got[..3 * row].iter().all(|&x| x != 0.0));
    assert!(got[5 * row..].iter().any(|&x| x != 0.0));
}
