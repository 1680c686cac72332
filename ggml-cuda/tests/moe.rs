//! The mixture-of-experts ops on the GPU (cuda-sim, or the real GPU under
//! `GGML_RS_REQUIRE_GPU`):
//! - DIV, CLAMP, SUM_ROWS and ARGSORT_TOP_K against the CPU backend bit for bit (each is
//!   the same IEEE operations in the same order, or integer compares), and against the
//!   host mirrors in `ggml_cuda::reference`;
//! - MUL_MAT_ID against the CUDA MUL_MAT of each token's expert bit for bit (the kernels
//!   share mul_mat's per-output order, that of the class of the token count); quantised
//!   experts against the host's `reference::mul_mat_q_dot_class` bit for bit, float
//!   experts against the host mirror bit for bit and against the CPU backend by NMSE at
//!   mul_mat's limit (5e-4: the GPU quantises activations to Q8_1 where the CPU uses each
//!   format's own dot type);
//! - a bad expert id is a `BadData` error naming the node, not a read out of bounds;
//! - a whole MoE FFN (router, top-k, weights, experts, combine) against the CPU.

mod common;

use common::{assert_bits, f32_bytes, gpu, run_all, to_f32, Lcg};
use ggml_core::DType::{BF16, F16, F32, Q2K, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0};
use ggml_core::{Backend, BackendErrorKind, Context, DType, DataRef, Tensor, TensorId};
use ggml_cpu::{CpuBackend, CpuBackendOptions};
use ggml_cuda::reference::{self, nmse};
use ggml_test_kit::bytes::i32_bytes;
use ggml_test_kit::quantize_rows;
use rstest::rstest;

/// A graph's inputs and the outputs to read back.
struct Case {
    inputs: Vec<(TensorId, Vec<u8>)>,
    outs: Vec<TensorId>,
}

fn storage() -> Vec<Tensor> {
    vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 64]
}

/// Runs `build` on the CPU backend and on the GPU: the outputs' bytes, CPU first.
fn cpu_and_gpu(build: impl Fn(&mut Context<'_>) -> Case) -> [Vec<Vec<u8>>; 2] {
    let cpu = CpuBackend::new(CpuBackendOptions::with_threads(2)).unwrap();
    let cuda = gpu();
    let mut res = Vec::new();
    for be in [&cpu as &dyn Backend, &cuda] {
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let c = build(&mut ctx);
        res.push(run_all(be, &mut ctx, &c.inputs, &c.outs));
    }
    let g = res.pop().expect("two runs");
    [res.pop().expect("two runs"), g]
}

fn to_i32(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect()
}

/// Asserts equal bits, except that any NaN equals any NaN (the GPU's arithmetic gives its
/// canonical NaN, not the CPU's payload).
fn assert_same_floats(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
        assert!(
            same,
            "{what} #{i}: GPU {g:e} ({:#x}), CPU {w:e} ({:#x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

/// Random values with the edge cases mixed in at fixed places: signed zeros, infinities,
/// NaN with two payloads, subnormals, and values that repeat.
fn with_specials(r: &mut Lcg, n: usize, scale: f32) -> Vec<f32> {
    let mut v: Vec<f32> = r.vec(n).iter().map(|x| x * scale).collect();
    // -0 before +0, so that an order telling them apart would put them the other way.
    let specials = [
        -0.0,
        0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(0xffc0_0123),
        f32::from_bits(3),
        -f32::from_bits(3),
        0.5,
        0.5,
    ];
    for (i, s) in specials.iter().enumerate() {
        let at = (i * 7 + 3) % n.max(1);
        if at < n {
            v[at] = *s;
        }
    }
    v
}

// ---------------------------------------------------------------------------------------
// DIV

/// `a / b` with `b` broadcast: one f32 division per element, rounded to the result dtype
/// to nearest even on both backends, so the bits agree; divisors include ±0, ±inf and
/// NaN.
#[rstest]
#[case::f32_row_broadcast(DType::F32, DType::F32, [37, 5, 3, 1], [37, 1, 1, 1])]
#[case::f32_moe_weights_by_sums(DType::F32, DType::F32, [2, 9, 1, 1], [1, 9, 1, 1])]
#[case::f32_same_shape(DType::F32, DType::F32, [8, 7, 1, 1], [8, 7, 1, 1])]
#[case::f32_dims_2_3(DType::F32, DType::F32, [5, 3, 4, 2], [5, 3, 1, 2])]
#[case::f16_by_f32(DType::F16, DType::F32, [37, 5, 3, 1], [37, 1, 3, 1])]
#[case::bf16_by_f16(DType::BF16, DType::F16, [37, 5, 3, 1], [1, 5, 1, 1])]
fn div_matches_the_cpu_bit_for_bit(
    #[case] a_dtype: DType,
    #[case] b_dtype: DType,
    #[case] a_ne: [usize; 4],
    #[case] b_ne: [usize; 4],
) {
    let (na, nb) = (a_ne.iter().product(), b_ne.iter().product());
    let mut r = Lcg(na as u64 * 3 + nb as u64);
    let av = with_specials(&mut r, na, 4.0);
    let bv = with_specials(&mut r, nb, 2.0);
    let [cpu, gpu] = cpu_and_gpu(|ctx| {
        let a = ctx.new_tensor(a_dtype, a_ne).unwrap();
        let b = ctx.new_tensor(b_dtype, b_ne).unwrap();
        let out = ctx.div(a, b).unwrap();
        Case {
            inputs: vec![
                (a, quantize_rows(a_dtype, &av, a_ne[0])),
                (b, quantize_rows(b_dtype, &bv, b_ne[0])),
            ],
            outs: vec![out],
        }
    });
    let what = format!("{a_dtype} {a_ne:?} / {b_dtype} {b_ne:?}");
    assert_same_floats(&to_f32(a_dtype, &gpu[0]), &to_f32(a_dtype, &cpu[0]), &what);
}

// ---------------------------------------------------------------------------------------
// CLAMP

/// clamp is compares and selects only: every output bit (signed zeros, infinities, NaN
/// payloads) is the CPU's. Contiguous and permuted sources.
#[rstest]
#[case::unit(-1.0, 1.0)]
#[case::moe_sum_floor(half::f16::MIN_POSITIVE.to_f32(), f32::INFINITY)]
#[case::upper_only(f32::NEG_INFINITY, 0.5)]
#[case::signed_zero_bounds(-0.0, 0.0)]
// -0 < +0 is false, so -0 becomes the bound +0 (min.f32 would keep -0).
#[case::zero_upper(-1.0, 0.0)]
#[case::one_point(0.25, 0.25)]
fn clamp_matches_the_cpu_bit_for_bit(
    #[case] lo: f32,
    #[case] hi: f32,
    #[values(false, true)] permuted: bool,
) {
    let storage_ne = [19, 6, 3, 1];
    let n = 19 * 6 * 3;
    let mut r = Lcg(17);
    let mut x = with_specials(&mut r, n, 2.0);
    x[50] = lo;
    x[51] = hi;
    x[52] = -lo;
    let [cpu, gpu] = cpu_and_gpu(|ctx| {
        let x0 = ctx.new_tensor(DType::F32, storage_ne).unwrap();
        let src = if permuted {
            ctx.permute(x0, [1, 0, 2, 3]).unwrap()
        } else {
            x0
        };
        let out = ctx.clamp(src, lo, hi).unwrap();
        Case {
            inputs: vec![(x0, f32_bytes(&x))],
            outs: vec![out],
        }
    });
    let (g, c) = (to_f32(DType::F32, &gpu[0]), to_f32(DType::F32, &cpu[0]));
    for (i, (a, b)) in g.iter().zip(&c).enumerate() {
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "[{lo}, {hi}] #{i}: {a:e} vs {b:e}"
        );
    }
    if !permuted {
        let want: Vec<f32> = x.iter().map(|&v| reference::clamp(v, lo, hi)).collect();
        let wb: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
        let gb: Vec<u32> = g.iter().map(|v| v.to_bits()).collect();
        assert_eq!(gb, wb, "[{lo}, {hi}] vs the host mirror");
    }
}

// ---------------------------------------------------------------------------------------
// SUM_ROWS

/// sum_rows accumulates each row in f64 in index order, as the CPU: the same bits even
/// where magnitudes 1e-8..1e8 make the order matter. Rows of the router's weights (2, 8
/// values), a single value, odd 4-d shapes, a long row, a transposed source, and rows of
/// ±0 only and of +inf and -inf (NaN).
#[rstest]
#[case::moe_top2([2, 9, 1, 1], false)]
#[case::moe_top8([8, 33, 1, 1], false)]
#[case::single_value([1, 5, 2, 1], false)]
#[case::odd_4d([37, 3, 2, 2], false)]
#[case::long_row([1000, 3, 1, 1], false)]
#[case::transposed([6, 40, 1, 1], true)]
fn sum_rows_matches_the_cpu_bit_for_bit(#[case] ne: [usize; 4], #[case] transposed: bool) {
    let n: usize = ne.iter().product();
    let mut r = Lcg(n as u64 + 5);
    let mut x: Vec<f32> = (0..n)
        .map(|_| {
            let e = (r.next() % 17) as i32 - 8;
            r.f() * 10f32.powi(e)
        })
        .collect();
    // Row 0 of the storage: signed zeros; row 1 (when there is one): +inf and -inf.
    let row = if transposed { ne[1] } else { ne[0] };
    for v in x.iter_mut().take(row) {
        *v = -0.0;
    }
    if n >= 2 * row && row >= 2 {
        x[row] = f32::INFINITY;
        x[row + 1] = f32::NEG_INFINITY;
    }
    let [cpu, gpu] = cpu_and_gpu(|ctx| {
        let (x0, src) = if transposed {
            let x0 = ctx.new_tensor(DType::F32, [ne[1], ne[0], 1, 1]).unwrap();
            (x0, ctx.transpose(x0).unwrap())
        } else {
            let x0 = ctx.new_tensor(DType::F32, ne).unwrap();
            (x0, x0)
        };
        let out = ctx.sum_rows(src).unwrap();
        Case {
            inputs: vec![(x0, f32_bytes(&x))],
            outs: vec![out],
        }
    });
    let g = to_f32(DType::F32, &gpu[0]);
    assert_same_floats(&g, &to_f32(DType::F32, &cpu[0]), &format!("{ne:?}"));
    if !transposed {
        let want: Vec<f32> = x.chunks(ne[0]).map(reference::sum_row).collect();
        assert_same_floats(&g, &want, &format!("{ne:?} vs the host mirror"));
    }
}

// ---------------------------------------------------------------------------------------
// ARGSORT_TOP_K

/// Row contents of the argsort cases.
#[derive(Clone, Copy, Debug)]
enum Values {
    /// Distinct random values.
    Random,
    /// Four levels only: most values tie.
    Ties,
    /// Random values with ±0, ±inf, NaNs, subnormals and ties mixed in.
    Specials,
}

/// argsort_top_k gives exactly the CPU's indices: descending, ties (−0 == +0 included) in
/// index order, NaN after every number. Rows of 4..257 values (257: more than one element
/// per thread), k from 1 to n, contiguous and transposed sources, rows over two dims.
#[rstest]
#[case::n4_k2(4, 2, 9, Values::Random)]
#[case::n4_k1_ties(4, 1, 9, Values::Ties)]
#[case::n8_k2_ties(8, 2, 17, Values::Ties)]
#[case::n60_k8_specials(60, 8, 5, Values::Specials)]
#[case::n128_k8(128, 8, 3, Values::Random)]
#[case::n33_all_specials(33, 33, 4, Values::Specials)]
#[case::n257_all_ties(257, 257, 2, Values::Ties)]
fn argsort_top_k_matches_the_cpu_exactly(
    #[case] n: usize,
    #[case] k: usize,
    #[case] rows: usize,
    #[case] values: Values,
    #[values(false, true)] transposed: bool,
) {
    let total = n * rows * 2;
    let mut r = Lcg(n as u64 * 13 + k as u64);
    let x: Vec<f32> = match values {
        Values::Random => r.vec(total),
        Values::Ties => (0..total)
            .map(|_| (r.next() % 4) as f32 * 0.5 - 0.5)
            .collect(),
        Values::Specials => with_specials(&mut r, total, 1.0)
            .chunks(n)
            .flat_map(|c| {
                let mut c = c.to_vec();
                // The same specials in every row, at places that differ per row.
                let shift = (c.len() / 3).max(1);
                c.rotate_left(shift);
                c
            })
            .collect(),
    };
    let ne = [n, rows, 2, 1];
    let [cpu, gpu] = cpu_and_gpu(|ctx| {
        let (x0, src) = if transposed {
            let x0 = ctx.new_tensor(DType::F32, [rows, n, 2, 1]).unwrap();
            (x0, ctx.transpose(x0).unwrap())
        } else {
            let x0 = ctx.new_tensor(DType::F32, ne).unwrap();
            (x0, x0)
        };
        let out = ctx.argsort_top_k(src, k).unwrap();
        Case {
            inputs: vec![(x0, f32_bytes(&x))],
            outs: vec![out],
        }
    });
    let (g, c) = (to_i32(&gpu[0]), to_i32(&cpu[0]));
    assert_eq!(g, c, "n {n} k {k} {values:?} transposed {transposed}");
    if !transposed {
        let mut want = vec![0i32; k * rows * 2];
        for (row, o) in x.chunks(n).zip(want.chunks_mut(k)) {
            reference::argsort_top_k_row(row, o);
        }
        assert_eq!(g, want, "vs the host mirror");
    }
}

// ---------------------------------------------------------------------------------------
// MUL_MAT_ID

const N_AS: usize = 4;
const N_USED: usize = 2;
const TOKENS: usize = 5;

/// ids[e, t]: both slots distinct for even tokens, the same expert twice for odd ones;
/// every expert used, some by several tokens.
fn expert_ids() -> Vec<i32> {
    let mut ids = Vec::new();
    for t in 0..TOKENS {
        let first = ((3 * t + 1) % N_AS) as i32;
        let second = if t % 2 == 0 {
            ((t + 2) % N_AS) as i32
        } else {
            first
        };
        ids.extend([first, second]);
    }
    ids
}

/// K per weight dtype: a tail after the 32-wide lane loop for floats, several chunks of
/// 32 or super-blocks of 256 for the quantised formats.
fn k_of(dtype: DType) -> usize {
    match dtype.block_size() {
        1 => 100,
        32 => 160,
        _ => 256,
    }
}

/// MUL_MAT_ID for every weight dtype of the CUDA mul_mat, with B1 = 1 (the gate and up
/// projections: one activation row per token) and B1 = n_used (the down projection: one
/// per slot), ids with repeats. Each output column (e, t) must be, bit for bit, the CUDA
/// MUL_MAT of expert ids[e, t] with activation row (e mod B1, t), computed in the same
/// graph over token t's B1 rows (the decode class, as the 5 tokens of the MUL_MAT_ID).
/// Quantised: bit for bit the host's order; float: within mul_mat's NMSE limit of the
/// CPU backend.
#[rstest]
fn mul_mat_id_is_the_mul_mat_of_each_tokens_expert(
    #[values(F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K)] dtype: DType,
    #[values(1, N_USED)] b1: usize,
) {
    let (k, m) = (k_of(dtype), 7);
    let mut r = Lcg(k as u64 * 7 + b1 as u64);
    let wv = r.vec(k * m * N_AS);
    let xv = r.vec(k * b1 * TOKENS);
    let ids = expert_ids();
    let [cpu, gpu] = cpu_and_gpu(|ctx| {
        let w = ctx.new_tensor(dtype, [k, m, N_AS, 1]).unwrap();
        let x = ctx.new_tensor(DType::F32, [k, b1, TOKENS, 1]).unwrap();
        let ti = ctx.new_tensor(DType::I32, [N_USED, TOKENS, 1, 1]).unwrap();
        let out = ctx.mul_mat_id(w, x, ti).unwrap();
        let mut outs = vec![out];
        let tw = ctx.tensors()[w.index()];
        let x2 = ctx.reshape(x, [k, b1 * TOKENS, 1, 1]).unwrap();
        for e in 0..N_AS {
            let nb = [tw.nb[0], tw.nb[1], tw.nb[2], tw.nb[2]];
            let we = ctx.view(w, [k, m, 1, 1], nb, e * tw.nb[2]).unwrap();
            for t in 0..TOKENS {
                let xt = ctx.view_2d(x2, k, b1, 4 * k, 4 * k * b1 * t).unwrap();
                outs.push(ctx.mul_mat(we, xt).unwrap());
            }
        }
        Case {
            inputs: vec![
                (w, quantize_rows(dtype, &wv, k)),
                (x, f32_bytes(&xv)),
                (ti, i32_bytes(&ids)),
            ],
            outs,
        }
    });
    let got = to_f32(DType::F32, &gpu[0]);
    for t in 0..TOKENS {
        for e in 0..N_USED {
            let id = ids[t * N_USED + e] as usize;
            let dense = to_f32(DType::F32, &gpu[1 + id * TOKENS + t]);
            let want = &dense[e % b1 * m..(e % b1 + 1) * m];
            let have = &got[(t * N_USED + e) * m..][..m];
            let (hb, wb): (Vec<u32>, Vec<u32>) = (
                have.iter().map(|v| v.to_bits()).collect(),
                want.iter().map(|v| v.to_bits()).collect(),
            );
            assert_eq!(hb, wb, "{dtype} B1 {b1}: token {t} slot {e} (expert {id})");
        }
    }
    if dtype.is_quantized() {
        // Quantised experts: bit for bit the host's order (of the decode class: 5 tokens).
        let wb = quantize_rows(dtype, &wv, k);
        let rs = dtype.row_size(k).unwrap();
        let mut q = vec![0u8; k / 32 * reference::Q8_1_BLOCK];
        for t in 0..TOKENS {
            for e in 0..N_USED {
                let id = ids[t * N_USED + e] as usize;
                let col = t * b1 + e % b1;
                reference::quantize_q8_1(&xv[col * k..(col + 1) * k], &mut q);
                for row in 0..m {
                    let at = (id * m + row) * rs;
                    let want =
                        reference::mul_mat_q_dot_class(TOKENS, dtype, &wb[at..at + rs], &q, k / 32);
                    let have = got[(t * N_USED + e) * m + row];
                    assert_eq!(
                        have.to_bits(),
                        want.unwrap().to_bits(),
                        "{dtype} B1 {b1}: token {t} slot {e} row {row} against the host"
                    );
                }
            }
        }
        return;
    }
    let cpu_out = to_f32(DType::F32, &cpu[0]);
    assert!(
        cpu_out.iter().all(|v| v.is_finite()),
        "CPU result not finite"
    );
    let e = nmse(&got, &cpu_out);
    assert!(e < 5e-4, "{dtype} B1 {b1}: NMSE {e:e} against the CPU");
}

/// Float experts read the activations with any strides: MUL_MAT_ID of a permuted view
/// gives the bits of MUL_MAT_ID of its contiguous copy, and both are bit for bit the host
/// mirror (`reference::mul_mat_f_dot` of each token's expert row and activation row).
#[rstest]
fn mul_mat_id_float_experts_take_strided_activations(
    #[values(DType::F32, DType::F16, DType::BF16)] dtype: DType,
) {
    let (k, m) = (100, 5);
    let mut r = Lcg(41);
    let wv = r.vec(k * m * N_AS);
    let xv = r.vec(k * N_USED * TOKENS);
    let ids = expert_ids();
    let [cpu, gpu] = cpu_and_gpu(|ctx| {
        let w = ctx.new_tensor(dtype, [k, m, N_AS, 1]).unwrap();
        // Storage [TOKENS, k, N_USED]: the view [k, N_USED, TOKENS] has element stride
        // 4 * TOKENS bytes.
        let x0 = ctx.new_tensor(DType::F32, [TOKENS, k, N_USED, 1]).unwrap();
        let x = ctx.permute(x0, [2, 0, 1, 3]).unwrap();
        let xc = ctx.cont(x).unwrap();
        let ti = ctx.new_tensor(DType::I32, [N_USED, TOKENS, 1, 1]).unwrap();
        let strided = ctx.mul_mat_id(w, x, ti).unwrap();
        let dense = ctx.mul_mat_id(w, xc, ti).unwrap();
        Case {
            inputs: vec![
                (w, quantize_rows(dtype, &wv, k)),
                (x0, f32_bytes(&xv)),
                (ti, i32_bytes(&ids)),
            ],
            outs: vec![strided, dense],
        }
    });
    assert_eq!(
        gpu[0], gpu[1],
        "{dtype}: strided and contiguous activations differ"
    );
    let wf = to_f32(dtype, &quantize_rows(dtype, &wv, k));
    let mut want = vec![0f32; m * N_USED * TOKENS];
    for t in 0..TOKENS {
        for e in 0..N_USED {
            let id = ids[t * N_USED + e] as usize;
            // x[kk, e, t] is storage element [t, kk, e] of [TOKENS, k, N_USED].
            let act: Vec<f32> = (0..k).map(|kk| xv[t + TOKENS * (kk + k * e)]).collect();
            for row in 0..m {
                let w = &wf[(id * m + row) * k..][..k];
                want[(t * N_USED + e) * m + row] = reference::mul_mat_f_dot(dtype, w, &act);
            }
        }
    }
    assert_bits(&to_f32(DType::F32, &gpu[0]), &want, &format!("{dtype}"));
    let e = nmse(&to_f32(DType::F32, &gpu[0]), &to_f32(DType::F32, &cpu[0]));
    assert!(e < 5e-4, "{dtype}: NMSE {e:e} against the CPU");
}

/// An expert id outside 0..n_as (n_as itself, or negative) is reported by the next
/// synchronize as BadData naming MUL_MAT_ID and the node, for float and quantised
/// experts; the backend works normally afterwards.
#[rstest]
fn mul_mat_id_bad_expert_id_is_bad_data(
    #[values(DType::F16, DType::Q4_0)] dtype: DType,
    #[values(N_AS as i32, -1)] bad: i32,
) {
    let be = gpu();
    let k = 64;
    let mut s = storage();
    let mut ctx = Context::new(&mut s);
    let w = ctx.new_tensor(dtype, [k, 8, N_AS, 1]).unwrap();
    let x = ctx.new_tensor(DType::F32, [k, 1, 3, 1]).unwrap();
    let ti = ctx.new_tensor(DType::I32, [N_USED, 3, 1, 1]).unwrap();
    let out = ctx.mul_mat_id(w, x, ti).unwrap();
    ctx.set_name(out, "ffn_moe_up").unwrap();
    let n = ctx.len();
    let buf = be.alloc_buffer(64 * 1024).unwrap();
    for j in 0..n {
        ctx.tensors_mut()[j].data = Some(DataRef {
            buffer: buf.id,
            addr: buf.base + 8192 * j as u64,
        });
    }
    be.buffer_clear(buf.id, 0).unwrap();
    let ts = ctx.tensors();
    let ids = [0, 1, 2, bad, 3, 0];
    be.set_tensor_async(&ts[ti.index()], 0, &i32_bytes(&ids))
        .unwrap();
    be.graph_compute(ts, &[out]).unwrap();
    let e = be.synchronize().unwrap_err();
    assert_eq!(e.kind, BackendErrorKind::BadData);
    let text = e.to_string();
    assert!(
        text.contains("MUL_MAT_ID") && text.contains("ffn_moe_up") && text.contains("expert id"),
        "{text}"
    );
    be.synchronize().unwrap();
    // The same graph with good ids runs clean.
    be.set_tensor_async(&ts[ti.index()], 0, &i32_bytes(&[0, 1, 2, 3, 3, 0]))
        .unwrap();
    be.graph_compute(ts, &[out]).unwrap();
    be.synchronize().unwrap();
    be.free_buffer(buf.id).unwrap();
}

// ---------------------------------------------------------------------------------------
// The MoE FFN

/// llama.cpp's MoE FFN for llama (Mixtral) as the harness builds it: router logits,
/// soft_max, top-2 of 8 experts, their probabilities gathered, summed, clamped and
/// divided, Q4_0 gate/up and Q8_0 down experts through mul_mat_id, swiglu, weighted and
/// summed over the two slots. The chosen experts are the CPU's exactly (the logits are
/// spaced well apart, so the GPU's soft_max rounding cannot swap two of them), the
/// normalised weights within f32 rounding, the FFN output within mul_mat's limit.
#[test]
fn moe_ffn_matches_the_cpu() {
    let (n_embd, n_ff, n_expert, n_used, n_tok) = (64, 96, 8, 2, 6);
    let mut r = Lcg(99);
    // Per token a permutation of 8 levels 0.4 apart, plus small noise.
    let mut logits = Vec::new();
    for t in 0..n_tok {
        for e in 0..n_expert {
            let level = ((e * 5 + t * 3) % n_expert) as f32;
            logits.push(0.4 * level + 0.01 * r.f());
        }
    }
    let x = r.vec(n_embd * n_tok);
    let up = r.vec(n_embd * n_ff * n_expert);
    let gate = r.vec(n_embd * n_ff * n_expert);
    let down = r.vec(n_ff * n_embd * n_expert);
    let [cpu, gpu] = cpu_and_gpu(|ctx| {
        let tl = ctx.new_tensor(DType::F32, [n_expert, n_tok, 1, 1]).unwrap();
        let tx = ctx.new_tensor(DType::F32, [n_embd, n_tok, 1, 1]).unwrap();
        let tu = ctx
            .new_tensor(DType::Q4_0, [n_embd, n_ff, n_expert, 1])
            .unwrap();
        let tg = ctx
            .new_tensor(DType::Q4_0, [n_embd, n_ff, n_expert, 1])
            .unwrap();
        let td = ctx
            .new_tensor(DType::Q8_0, [n_ff, n_embd, n_expert, 1])
            .unwrap();
        // Router.
        let probs = ctx.soft_max(tl, None, 1.0, 0.0).unwrap();
        let ids = ctx.argsort_top_k(probs, n_used).unwrap();
        let per_expert = ctx.reshape(probs, [1, n_expert, n_tok, 1]).unwrap();
        let w = ctx.get_rows(per_expert, ids).unwrap();
        let w = ctx.reshape(w, [n_used, n_tok, 1, 1]).unwrap();
        let sum = ctx.sum_rows(w).unwrap();
        let sum = ctx
            .clamp(sum, half::f16::MIN_POSITIVE.to_f32(), f32::INFINITY)
            .unwrap();
        let wn = ctx.div(w, sum).unwrap();
        let weights = ctx.reshape(wn, [1, n_used, n_tok, 1]).unwrap();
        // Experts.
        let cur = ctx.reshape(tx, [n_embd, 1, n_tok, 1]).unwrap();
        let u = ctx.mul_mat_id(tu, cur, ids).unwrap();
        let g = ctx.mul_mat_id(tg, cur, ids).unwrap();
        let h = ctx.swiglu(g, u).unwrap();
        let d = ctx.mul_mat_id(td, h, ids).unwrap();
        // Combine: weighted, then slot 0 + slot 1.
        let e = ctx.mul(d, weights).unwrap();
        let te = ctx.tensors()[e.index()];
        let e0 = ctx.view_2d(e, n_embd, n_tok, te.nb[2], 0).unwrap();
        let e1 = ctx.view_2d(e, n_embd, n_tok, te.nb[2], te.nb[1]).unwrap();
        let out = ctx.add(e0, e1).unwrap();
        Case {
            inputs: vec![
                (tl, f32_bytes(&logits)),
                (tx, f32_bytes(&x)),
                (tu, quantize_rows(DType::Q4_0, &up, n_embd)),
                (tg, quantize_rows(DType::Q4_0, &gate, n_embd)),
                (td, quantize_rows(DType::Q8_0, &down, n_ff)),
            ],
            outs: vec![ids, wn, out],
        }
    });
    assert_eq!(to_i32(&gpu[0]), to_i32(&cpu[0]), "chosen experts");
    let (gw, cw) = (to_f32(DType::F32, &gpu[1]), to_f32(DType::F32, &cpu[1]));
    let ew = nmse(&gw, &cw);
    assert!(ew < 1e-10, "router weights: NMSE {ew:e}");
    for pair in gw.chunks(n_used) {
        let s: f32 = pair.iter().sum();
        assert!((s - 1.0).abs() < 1e-6, "weights of a token sum to {s}");
    }
    let (go, co) = (to_f32(DType::F32, &gpu[2]), to_f32(DType::F32, &cpu[2]));
    let eo = nmse(&go, &co);
    assert!(eo < 5e-4, "FFN output: NMSE {eo:e}");
}

/// MUL_MAT_ID over a prompt-sized batch (9 tokens: the activations are quantised once,
/// as the tiled MUL_MAT does, not in each block): bit for bit the host's order.
#[rstest]
fn mul_mat_id_of_a_prompt_batch_is_the_host_order(
    #[values(DType::Q4_1, DType::Q8_0, DType::Q6K)] dtype: DType,
    #[values(1, N_USED)] b1: usize,
) {
    let (k, m, tokens) = (256, 7, 9);
    let mut r = Lcg(k as u64 + b1 as u64 + 77);
    let wv = r.vec(k * m * N_AS);
    let xv = r.vec(k * b1 * tokens);
    let ids: Vec<i32> = (0..tokens * N_USED)
        .map(|i| ((i * 5 + i / N_USED) % N_AS) as i32)
        .collect();
    let be = gpu();
    let mut s = storage();
    let mut ctx = Context::new(&mut s);
    let w = ctx.new_tensor(dtype, [k, m, N_AS, 1]).unwrap();
    let x = ctx.new_tensor(DType::F32, [k, b1, tokens, 1]).unwrap();
    let ti = ctx.new_tensor(DType::I32, [N_USED, tokens, 1, 1]).unwrap();
    let out = ctx.mul_mat_id(w, x, ti).unwrap();
    let wb = quantize_rows(dtype, &wv, k);
    let got = to_f32(
        DType::F32,
        &run_all(
            &be,
            &mut ctx,
            &[(w, wb.clone()), (x, f32_bytes(&xv)), (ti, i32_bytes(&ids))],
            &[out],
        )[0],
    );
    let rs = dtype.row_size(k).unwrap();
    let mut q = vec![0u8; k / 32 * reference::Q8_1_BLOCK];
    for t in 0..tokens {
        for e in 0..N_USED {
            let id = ids[t * N_USED + e] as usize;
            let col = t * b1 + e % b1;
            reference::quantize_q8_1(&xv[col * k..(col + 1) * k], &mut q);
            for row in 0..m {
                let at = (id * m + row) * rs;
                let want =
                    reference::mul_mat_q_dot_class(tokens, dtype, &wb[at..at + rs], &q, k / 32)
                        .unwrap();
                let have = got[(t * N_USED + e) * m + row];
                assert_eq!(
                    have.to_bits(),
                    want.to_bits(),
                    "{dtype} B1 {b1}: token {t} slot {e} row {row}"
                );
            }
        }
    }
    assert!(
        be.kernel_stats()
            .launches_of(ggml_cuda::KernelId::QuantizeQ8_1)
            >= 1
    );
}
