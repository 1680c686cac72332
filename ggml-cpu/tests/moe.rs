//! The mixture-of-experts ops (MUL_MAT_ID, ARGSORT_TOP_K, SUM_ROWS, DIV, CLAMP) and ARGMAX on every
//! ISA level and thread counts 1-4, bit-identical to the scalar reference; routing
//! independence of MUL_MAT_ID; bad expert ids as errors.

// rstest tables take one parameter per column.
#![allow(clippy::too_many_arguments)]
// Errors of ggml-core carry names inline (no allocator there).
#![allow(clippy::result_large_err)]

mod common;

use common::{backends, check, f32s, place, Spec};
use ggml_core::DType::{BF16, F16, F32, Q2K, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0};
use ggml_core::{Backend, BackendErrorKind, Context, DType, Tensor, TensorId};
use ggml_cpu::{CpuBackend, CpuBackendOptions};
use ggml_test_kit::bytes::{f32_bytes, i32_bytes};
use ggml_test_kit::{xorshift_quant_blocks, Xorshift, WEIGHT_DTYPES};
use proptest::prelude::*;
use rstest::{fixture, rstest};
use std::sync::OnceLock;

const THREADS: [usize; 4] = [1, 2, 3, 4];

/// f16's smallest normal, 2^-14: llama.cpp's lower clamp of the expert weight sum.
const F16_MIN_NORMAL: f32 = 1.0 / 16384.0;

#[fixture]
fn bes() -> &'static [CpuBackend] {
    static B: OnceLock<Vec<CpuBackend>> = OnceLock::new();
    B.get_or_init(|| backends(&THREADS))
}

/// The smallest row length of a weight dtype, times `mult`.
fn k_of(w: DType, mult: usize) -> usize {
    w.block_size().max(32) * mult
}

/// How the experts of a token are chosen.
#[derive(Clone, Copy, Debug)]
enum Route {
    /// `n_used` distinct experts (what top-k gives).
    Distinct,
    /// Any experts, repeats allowed.
    Repeats,
    /// Every token the same expert in every slot.
    Same,
}

fn route(kind: Route, n_as: usize, n_used: usize, n_tok: usize, seed: u64) -> Vec<i32> {
    let mut rng = Xorshift::new(seed);
    let mut ids = Vec::with_capacity(n_used * n_tok);
    for _ in 0..n_tok {
        match kind {
            Route::Distinct => {
                let mut all: Vec<i32> = (0..n_as as i32).collect();
                for i in 0..n_used {
                    let j = i + (rng.next() as usize) % (n_as - i);
                    all.swap(i, j);
                }
                ids.extend_from_slice(&all[..n_used]);
            }
            Route::Repeats => ids.extend((0..n_used).map(|_| (rng.next() % n_as as u64) as i32)),
            Route::Same => ids.extend(std::iter::repeat_n((n_as - 1) as i32, n_used)),
        }
    }
    ids
}

/// `(M, n_as, n_used, B1, T, route)`: weight rows, experts, slots per token, rows of b
/// per token, tokens, routing.
type Shape = (usize, usize, usize, usize, usize, Route);

fn mmid(w: DType, kmult: usize, shape: Shape, seed: u64) -> impl Fn(&mut Context<'_>) -> Spec {
    let (m, n_as, n_used, b1, n_tok, r) = shape;
    let k = k_of(w, kmult);
    let ids_v = route(r, n_as, n_used, n_tok, seed);
    move |ctx| {
        let a = ctx.new_tensor(w, [k, m, n_as, 1]).unwrap();
        let b = ctx.new_tensor(DType::F32, [k, b1, n_tok, 1]).unwrap();
        let ids = ctx.new_tensor(DType::I32, [n_used, n_tok, 1, 1]).unwrap();
        let mut s = Spec::new(ctx.mul_mat_id(a, b, ids).unwrap());
        s.ints.push((ids, ids_v.clone()));
        s
    }
}

#[rstest]
#[case::top2_of_4((13, 4, 2, 1, 7, Route::Distinct))]
#[case::b1_is_n_used((9, 4, 2, 2, 5, Route::Distinct))]
#[case::one_used((11, 3, 1, 1, 9, Route::Distinct))]
#[case::repeated_ids((7, 4, 3, 1, 6, Route::Repeats))]
#[case::all_experts((5, 3, 3, 3, 4, Route::Distinct))]
#[case::b1_divides_n_used((6, 5, 4, 2, 3, Route::Repeats))]
#[case::one_token((37, 4, 2, 1, 1, Route::Distinct))]
#[case::one_token_b1_is_n_used((21, 4, 2, 2, 1, Route::Repeats))]
#[case::one_token_same_expert((18, 4, 2, 1, 1, Route::Same))]
// One token over several chunks per thread: each thread's own run, then stealing.
#[case::one_token_many_chunks((300, 4, 2, 1, 1, Route::Distinct))]
#[case::all_tokens_one_expert((10, 4, 2, 2, 19, Route::Same))]
// Experts with more than 16 pairs and more than 64 weight rows: several chunks each way.
#[case::many_chunks((70, 3, 2, 1, 37, Route::Distinct))]
// Weight rows unpacked once per chunk (experts of at least 8 pairs) over more than one
// chunk of 128 pairs; and experts on both sides of 8 pairs in one product.
#[case::unpacked_chunks((9, 2, 1, 1, 300, Route::Distinct))]
#[case::unpacked_and_tiled((9, 4, 3, 1, 9, Route::Repeats))]
// Experts of at least 16 pairs on panel tiles (levels that have them): over more than one
// chunk of 256 pairs; and beside experts of fewer pairs on the other tiles, with a row of
// b per slot.
#[case::panel_chunks((9, 2, 1, 1, 600, Route::Repeats))]
#[case::panels_beside_tiles((13, 5, 2, 2, 40, Route::Repeats))]
fn mul_mat_id(
    bes: &[CpuBackend],
    #[case] shape: Shape,
    #[values(F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K)] w: DType,
) {
    // Odd row lengths where the dtype allows them.
    let kmult = if w.is_quantized() { 1 } else { 3 };
    let seed = shape.0 as u64 * 31 + shape.4 as u64;
    check(bes, seed, mmid(w, kmult, shape, seed));
}

/// Float weights of an odd row length (K = 19 and 97, F16 rows at odd addresses).
#[rstest]
fn mul_mat_id_odd_k(
    bes: &[CpuBackend],
    #[values(DType::F32, DType::F16, DType::BF16)] w: DType,
    #[values(19, 97)] k: usize,
) {
    let ids_v = route(Route::Repeats, 3, 2, 5, 9);
    check(bes, 40, |ctx| {
        let a = ctx.new_tensor(w, [k, 7, 3, 1]).unwrap();
        let b = ctx.new_tensor(DType::F32, [k, 2, 5, 1]).unwrap();
        let ids = ctx.new_tensor(DType::I32, [2, 5, 1, 1]).unwrap();
        let mut s = Spec::new(ctx.mul_mat_id(a, b, ids).unwrap());
        s.ints.push((ids, ids_v.clone()));
        s
    });
}

/// Operands that are views: each expert's first rows (tensor-parallel slices, so the
/// expert stride is not `M` rows), float weights whose rows are not dense (gathered),
/// `b` with a row stride past its row and `ids` with a row stride past `n_used`.
#[rstest]
fn mul_mat_id_views(
    bes: &[CpuBackend],
    #[values(DType::F32, DType::F16, DType::Q4_1, DType::Q8_0, DType::Q6K)] w: DType,
) {
    let k = k_of(w, 2);
    let rs = w.row_size(k).unwrap();
    let ids_v = route(Route::Repeats, 4, 4, 6, 3);
    check(bes, 41, |ctx| {
        let a = ctx.new_tensor(w, [k, 12, 4, 1]).unwrap();
        let a_rows = ctx
            .view(
                a,
                [k, 5, 4, 1],
                [w.type_size(), rs, 12 * rs, 48 * rs],
                3 * rs,
            )
            .unwrap();
        let b = ctx.new_tensor(DType::F32, [k + 8, 2, 6, 1]).unwrap();
        let bv = ctx
            .view(
                b,
                [k, 2, 6, 1],
                [4, 4 * (k + 8), 8 * (k + 8), 48 * (k + 8)],
                16,
            )
            .unwrap();
        // ids rows of 4 taken from rows of 6.
        let ids = ctx.new_tensor(DType::I32, [6, 6, 1, 1]).unwrap();
        let idv = ctx.view(ids, [4, 6, 1, 1], [4, 24, 144, 144], 8).unwrap();
        let mut s = Spec::new(ctx.mul_mat_id(a_rows, bv, idv).unwrap());
        let mut all = vec![-7i32; 36];
        for t in 0..6 {
            all[t * 6 + 2..t * 6 + 6].copy_from_slice(&ids_v[t * 4..t * 4 + 4]);
        }
        s.ints.push((ids, all));
        s
    });
    if !w.is_quantized() {
        // Rows not dense: K along dimension 1 of the stored tensor.
        let ids_v = route(Route::Distinct, 3, 2, 4, 4);
        check(bes, 42, |ctx| {
            // Stored [n_as, K, M]: seen as [K, M, n_as] with nb0 = 3 elements.
            let a = ctx.new_tensor(w, [3, 40, 6, 1]).unwrap();
            let ap = ctx.permute(a, [2, 0, 1, 3]).unwrap();
            let b = ctx.new_tensor(DType::F32, [40, 1, 4, 1]).unwrap();
            let ids = ctx.new_tensor(DType::I32, [2, 4, 1, 1]).unwrap();
            let mut s = Spec::new(ctx.mul_mat_id(ap, b, ids).unwrap());
            s.ints.push((ids, ids_v.clone()));
            s
        });
    }
}

/// Runs the one-node graph `out` of `ctx` on `be` with `data` for leaves (by tensor
/// index, missing ones zero); the output bytes, or the error.
fn run_node(
    be: &CpuBackend,
    ctx: &Context<'_>,
    out: TensorId,
    data: &[(TensorId, Vec<u8>)],
) -> Result<Vec<u8>, ggml_core::BackendError> {
    let (tensors, buf) = place(ctx, be);
    for (id, bytes) in data {
        be.set_tensor_async(&tensors[id.index()], 0, bytes).unwrap();
    }
    let r = be
        .graph_compute(&tensors, &[out])
        .and_then(|_| be.synchronize());
    let mut got = vec![0u8; tensors[out.index()].nbytes()];
    if r.is_ok() {
        be.get_tensor(&tensors[out.index()], 0, &mut got).unwrap();
    }
    be.free_buffer(buf).unwrap();
    r.map(|_| got)
}

/// An id outside `0..n_as` (or negative) is a BadData error of the backend, on every
/// level and thread count, and the backend keeps working afterwards. The backends are
/// this test's own: a backend's error goes to whoever synchronises it first, and
/// `cargo test` runs the cases side by side in one process.
#[rstest]
#[case(&[0, 1, 2, 4, 1, 0])]
#[case(&[0, 1, -1, 2, 3, 3])]
#[case(&[7, 7, 7, 7, 7, 7])]
#[case(&[0, 0, 0, 0, 0, i32::MIN])]
fn mul_mat_id_bad_id_is_an_error(#[case] ids_v: &[i32]) {
    let bes = backends(&THREADS);
    let mut storage = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 8];
    let mut ctx = Context::new(&mut storage);
    let a = ctx.new_tensor(DType::Q8_0, [64, 8, 4, 1]).unwrap();
    let b = ctx.new_tensor(DType::F32, [64, 1, 3, 1]).unwrap();
    let ids = ctx.new_tensor(DType::I32, [2, 3, 1, 1]).unwrap();
    let out = ctx.mul_mat_id(a, b, ids).unwrap();
    for be in &bes {
        let e = run_node(be, &ctx, out, &[(ids, i32_bytes(ids_v))]).unwrap_err();
        assert_eq!(e.kind, BackendErrorKind::BadData, "{e}");
        assert_eq!(e.op, Some("MUL_MAT_ID"));
        let ok = run_node(be, &ctx, out, &[(ids, i32_bytes(&[0, 1, 2, 3, 3, 0]))]);
        assert!(ok.is_ok(), "{:?}", ok.err());
    }
}

/// Unsupported combinations are refused up front, naming the op.
#[test]
fn mul_mat_id_supports() {
    let be = &bes()[0];
    let mut storage = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 8];
    let mut ctx = Context::new(&mut storage);
    let a = ctx.new_tensor(DType::Q4_1, [64, 8, 4, 1]).unwrap();
    let b = ctx.new_tensor(DType::F32, [64, 1, 3, 1]).unwrap();
    let ids = ctx.new_tensor(DType::I32, [2, 3, 1, 1]).unwrap();
    let out = ctx.mul_mat_id(a, b, ids).unwrap();
    let (mut tensors, _) = place(&ctx, be);
    assert!(be.supports_op(&tensors, out));
    tensors[a.index()].dtype = DType::Q8_1;
    assert!(!be.supports_op(&tensors, out));
}

/// Output column `(e, t)` of a batch, as f32 bits.
fn column(out: &[u8], m: usize, n_used: usize, e: usize, t: usize) -> Vec<u32> {
    let o = f32s(out);
    o[(t * n_used + e) * m..][..m]
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// A token's MUL_MAT_ID result is the same bits whether computed alone or in a batch
    /// whose other tokens are routed any way, and for any thread count.
    #[test]
    fn mul_mat_id_token_alone_or_in_batch(
        wi in 0..WEIGHT_DTYPES.len(),
        n_tok in 2usize..24,
        n_used in 1usize..4,
        b1_is_n_used: bool,
        seed: u64,
        threads in 1usize..5,
    ) {
        let w = WEIGHT_DTYPES[wi];
        let (k, m, n_as) = (k_of(w, 1), 19, 4);
        let b1 = if b1_is_n_used { n_used } else { 1 };
        let mut rng = Xorshift::new(seed);
        let j = (rng.next() as usize) % n_tok;
        let ids_v = route(Route::Repeats, n_as, n_used, n_tok, seed ^ 1);
        let wt = Tensor::contiguous(w, [k, m, n_as, 1]).unwrap();
        let a_bytes = match w {
            DType::F32 => f32_bytes(&(0..k * m * n_as).map(|_| rng.f()).collect::<Vec<_>>()),
            DType::F16 => (0..k * m * n_as)
                .flat_map(|_| half::f16::from_f32(rng.f()).to_bits().to_le_bytes())
                .collect(),
            DType::BF16 => (0..k * m * n_as)
                .flat_map(|_| half::bf16::from_f32(rng.f()).to_bits().to_le_bytes())
                .collect(),
            _ => xorshift_quant_blocks(w, wt.nbytes() / w.type_size(), &mut rng),
        };
        let b_vals: Vec<f32> = (0..k * b1 * n_tok).map(|_| rng.f() * 3.0).collect();
        let be = CpuBackend::new(CpuBackendOptions::with_threads(threads)).unwrap();
        let run = |n: usize, ids: &[i32], b: &[f32]| -> Vec<u8> {
            let mut storage = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 8];
            let mut ctx = Context::new(&mut storage);
            let ta = ctx.new_tensor(w, [k, m, n_as, 1]).unwrap();
            let tb = ctx.new_tensor(DType::F32, [k, b1, n, 1]).unwrap();
            let ti = ctx.new_tensor(DType::I32, [n_used, n, 1, 1]).unwrap();
            let out = ctx.mul_mat_id(ta, tb, ti).unwrap();
            let data = [(ta, a_bytes.clone()), (tb, f32_bytes(b)), (ti, i32_bytes(ids))];
            run_node(&be, &ctx, out, &data).unwrap()
        };
        let batch = run(n_tok, &ids_v, &b_vals);
        let alone = run(
            1,
            &ids_v[j * n_used..(j + 1) * n_used],
            &b_vals[j * k * b1..(j + 1) * k * b1],
        );
        // The other tokens rerouted.
        let mut other = route(Route::Repeats, n_as, n_used, n_tok, seed ^ 2);
        other[j * n_used..(j + 1) * n_used].copy_from_slice(&ids_v[j * n_used..(j + 1) * n_used]);
        let rerouted = run(n_tok, &other, &b_vals);
        for e in 0..n_used {
            let want = column(&alone, m, n_used, e, 0);
            prop_assert_eq!(&column(&batch, m, n_used, e, j), &want, "batch, slot {}", e);
            prop_assert_eq!(&column(&rerouted, m, n_used, e, j), &want, "rerouted, slot {}", e);
        }
    }
}

#[rstest]
#[case([4, 7, 1, 1], 2)]
#[case([4, 512, 1, 1], 2)]
#[case([8, 5, 3, 1], 8)]
#[case([1, 3, 1, 1], 1)]
#[case([33, 6, 2, 2], 5)]
#[case([1000, 3, 1, 1], 7)]
#[case([1000, 2, 1, 1], 1000)]
fn argsort_top_k(bes: &[CpuBackend], #[case] ne: [usize; 4], #[case] k: usize) {
    let n: usize = ne.iter().product();
    let mut rng = Xorshift::new(5);
    // Few distinct values (many ties), both zeros, infinities and NaNs.
    let vals: Vec<f32> = (0..n)
        .map(|i| match rng.next() % 16 {
            0 => f32::NAN,
            1 => -0.0,
            2 => 0.0,
            3 => f32::INFINITY,
            4 => f32::NEG_INFINITY,
            5 if i % 2 == 0 => -f32::NAN,
            _ => ((rng.next() % 7) as f32 - 3.0) * 0.25,
        })
        .collect();
    check(bes, 50, |ctx| {
        let x = ctx.new_tensor(DType::F32, ne).unwrap();
        let mut s = Spec::new(ctx.argsort_top_k(x, k).unwrap());
        s.floats.push((x, vals.clone()));
        s
    });
    // Distinct random values too.
    check(bes, 51, |ctx| {
        let x = ctx.new_tensor(DType::F32, ne).unwrap();
        Spec::new(ctx.argsort_top_k(x, k).unwrap())
    });
}

/// Ties keep index order and NaN goes last, on every level and thread count.
#[rstest]
#[case(&[1.0, 3.0, 3.0, 2.0, 3.0], 3, &[1, 2, 4])]
#[case(&[f32::NAN, 1.0, f32::NAN, -5.0], 4, &[1, 3, 0, 2])]
#[case(&[-0.0, 0.0, -0.0, -1.0], 3, &[0, 1, 2])]
#[case(&[f32::NEG_INFINITY, f32::NAN, f32::INFINITY, 2.0], 3, &[2, 3, 0])]
#[case(&[0.5, 0.5, 0.5, 0.5], 2, &[0, 1])]
fn argsort_top_k_ties_and_nan(
    bes: &[CpuBackend],
    #[case] x: &'static [f32],
    #[case] k: usize,
    #[case] want: &'static [i32],
) {
    let got = check(bes, 52, |ctx| {
        let t = ctx.new_tensor(DType::F32, [x.len(), 1, 1, 1]).unwrap();
        let mut s = Spec::new(ctx.argsort_top_k(t, k).unwrap());
        s.floats.push((t, x.to_vec()));
        s
    });
    assert_eq!(got, i32_bytes(want));
}

#[rstest]
#[case([1, 1, 1, 1])]
#[case([2, 9, 1, 1])]
#[case([4, 512, 1, 1])]
#[case([37, 5, 3, 2])]
#[case([577, 3, 1, 1])]
fn sum_rows(bes: &[CpuBackend], #[case] ne: [usize; 4]) {
    check(bes, 60, |ctx| {
        let x = ctx.new_tensor(DType::F32, ne).unwrap();
        Spec::new(ctx.sum_rows(x).unwrap())
    });
    // Of a transposed view, and of values whose f32 sum would round differently.
    check(bes, 61, |ctx| {
        let x = ctx.new_tensor(DType::F32, [ne[1], ne[0], 1, 1]).unwrap();
        let t = ctx.transpose(x).unwrap();
        Spec::new(ctx.sum_rows(t).unwrap())
    });
    let n: usize = ne.iter().product();
    let vals: Vec<f32> = (0..n)
        .map(|i| match i % 4 {
            0 => 1e8,
            1 => 1.0,
            2 => -1e8,
            _ => 3.0e-8 * i as f32,
        })
        .collect();
    check(bes, 62, |ctx| {
        let x = ctx.new_tensor(DType::F32, ne).unwrap();
        let mut s = Spec::new(ctx.sum_rows(x).unwrap());
        s.floats.push((x, vals.clone()));
        s
    });
}

/// ARGMAX of random rows, of rows full of ties (values from a set of 5) and of a
/// transposed view, on every level and thread count.
#[rstest]
#[case([1, 1, 1, 1])]
#[case([7, 3, 1, 1])]
#[case([8, 2, 1, 1])]
#[case([37, 5, 3, 2])]
#[case([1000, 2, 1, 1])]
#[case([49152, 1, 1, 1])]
fn argmax(bes: &[CpuBackend], #[case] ne: [usize; 4]) {
    check(bes, 70, |ctx| {
        let x = ctx.new_tensor(DType::F32, ne).unwrap();
        Spec::new(ctx.argmax(x).unwrap())
    });
    let n: usize = ne.iter().product();
    let mut rng = Xorshift::new(71);
    let tied: Vec<f32> = (0..n).map(|_| (rng.next() % 5) as f32 - 2.0).collect();
    check(bes, 72, |ctx| {
        let x = ctx.new_tensor(DType::F32, ne).unwrap();
        let mut s = Spec::new(ctx.argmax(x).unwrap());
        s.floats.push((x, tied.clone()));
        s
    });
    check(bes, 73, |ctx| {
        let x = ctx.new_tensor(DType::F32, [ne[1], ne[0], 1, 1]).unwrap();
        let t = ctx.transpose(x).unwrap();
        let mut s = Spec::new(ctx.argmax(t).unwrap());
        s.floats.push((x, tied[..ne[0] * ne[1]].to_vec()));
        s
    });
}

/// Greedy sampling's scan: ties keep the lowest index (across the kernel's lanes too),
/// `-0 == +0`, a NaN never wins, a NaN first element gives 0, infinities are values.
#[rstest]
#[case(&[1.0, 3.0, 3.0, 2.0, 3.0], 1)]
#[case(&[f32::NAN, 5.0, 7.0], 0)]
#[case(&[1.0, f32::NAN, 7.0, 7.0], 2)]
#[case(&[-0.0, 0.0, -0.0], 0)]
#[case(&[0.0, -0.0, 0.0], 0)]
#[case(&[-1.0, -0.0, 0.0], 1)]
#[case(&[f32::NEG_INFINITY; 19], 0)]
#[case(&[f32::NAN; 11], 0)]
#[case(&[f32::NEG_INFINITY, f32::NAN, f32::NEG_INFINITY], 0)]
#[case(&[-3.0, f32::NAN, f32::NAN, f32::NAN, f32::NAN, f32::NAN, f32::NAN, f32::NAN, f32::NAN, -4.0], 0)]
#[case(&[0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0], 1)]
#[case(&[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0], 17)]
#[case(&[2.0, f32::INFINITY, f32::NAN, f32::INFINITY], 1)]
#[case(&[f32::MAX, f32::INFINITY], 1)]
#[case(&[4.0], 0)]
#[case(&[f32::NAN], 0)]
fn argmax_ties_and_nan(bes: &[CpuBackend], #[case] x: &'static [f32], #[case] want: i32) {
    assert_eq!(ggml_cpu::reference::argmax_row(x), want);
    let got = check(bes, 74, |ctx| {
        let t = ctx.new_tensor(DType::F32, [x.len(), 1, 1, 1]).unwrap();
        let mut s = Spec::new(ctx.argmax(t).unwrap());
        s.floats.push((t, x.to_vec()));
        s
    });
    assert_eq!(got, i32_bytes(&[want]));
}

/// The f64 sum: `1e8 + 1 - 1e8` is 1 (f32 running sums give 0), `[1, 2^-30]` rounds to 1.
#[test]
fn sum_rows_accumulates_in_f64() {
    let got = check(bes(), 63, |ctx| {
        let x = ctx.new_tensor(DType::F32, [3, 2, 1, 1]).unwrap();
        let mut s = Spec::new(ctx.sum_rows(x).unwrap());
        s.floats
            .push((x, vec![1e8, 1.0, -1e8, 1.0, 2f32.powi(-30), 0.0]));
        s
    });
    assert_eq!(f32s(&got), vec![1.0, 1.0]);
}

#[rstest]
#[case([7, 1, 1, 1], [7, 1, 1, 1])]
#[case([33, 5, 2, 3], [33, 5, 2, 3])]
#[case([33, 5, 2, 3], [1, 1, 1, 1])]
#[case([2, 512, 1, 1], [1, 512, 1, 1])]
#[case([16, 4, 6, 1], [1, 4, 3, 1])]
#[case([40, 3, 1, 2], [20, 1, 1, 2])]
fn div_broadcast(
    bes: &[CpuBackend],
    #[case] a: [usize; 4],
    #[case] b: [usize; 4],
    #[values(DType::F32, DType::F16)] dt: DType,
) {
    check(bes, 70, |ctx| {
        let x = ctx.new_tensor(dt, a).unwrap();
        let y = ctx.new_tensor(DType::F32, b).unwrap();
        Spec::new(ctx.div(x, y).unwrap())
    });
}

/// Division by zeros, infinities and NaN, and a permuted numerator.
#[test]
fn div_edges_and_views() {
    let num = [1.0, -1.0, 0.0, f32::INFINITY, f32::NAN, 3.0, -0.0, 1e-40];
    let den = [0.0, -0.0, 0.0, f32::INFINITY, 2.0, f32::NAN, 5.0, 1e30];
    let got = check(bes(), 71, |ctx| {
        let x = ctx.new_tensor(DType::F32, [8, 1, 1, 1]).unwrap();
        let y = ctx.new_tensor(DType::F32, [8, 1, 1, 1]).unwrap();
        let mut s = Spec::new(ctx.div(x, y).unwrap());
        s.floats.push((x, num.to_vec()));
        s.floats.push((y, den.to_vec()));
        s
    });
    let got = f32s(&got);
    for i in 0..8 {
        let want = num[i] / den[i];
        assert!(
            got[i].to_bits() == want.to_bits() || (got[i].is_nan() && want.is_nan()),
            "{} / {}: {}",
            num[i],
            den[i],
            got[i]
        );
    }
    check(bes(), 72, |ctx| {
        let x = ctx.new_tensor(DType::F32, [6, 17, 3, 1]).unwrap();
        let p = ctx.permute(x, [1, 0, 2, 3]).unwrap();
        let y = ctx.new_tensor(DType::F32, [17, 1, 3, 1]).unwrap();
        Spec::new(ctx.div(p, y).unwrap())
    });
}

#[rstest]
#[case(-0.5, 0.5)]
#[case(F16_MIN_NORMAL, f32::INFINITY)]
#[case(f32::NEG_INFINITY, 0.0)]
#[case(0.0, 0.0)]
#[case(-0.0, 0.0)]
#[case(1.0, 1.0)]
fn clamp(
    bes: &[CpuBackend],
    #[case] lo: f32,
    #[case] hi: f32,
    #[values([1, 1, 1, 1], [1, 512, 1, 1], [37, 5, 2, 1])] ne: [usize; 4],
) {
    let n: usize = ne.iter().product();
    let edges = [
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        0.5,
        -0.5,
        F16_MIN_NORMAL,
        1e-45,
    ];
    let vals: Vec<f32> = (0..n)
        .map(|i| match edges.get(i % 13) {
            Some(&e) => e,
            None => ((i * 7919) % 400) as f32 / 100.0 - 2.0,
        })
        .collect();
    let got = check(bes, 80, |ctx| {
        let x = ctx.new_tensor(DType::F32, ne).unwrap();
        let mut s = Spec::new(ctx.clamp(x, lo, hi).unwrap());
        s.floats.push((x, vals.clone()));
        s
    });
    for (&v, g) in vals.iter().zip(f32s(&got)) {
        if v.is_nan() {
            assert!(g.is_nan(), "clamp(NaN) = {g}");
        } else {
            assert!(g >= lo && g <= hi, "clamp({v}) = {g}");
        }
    }
    // Of a transposed view.
    check(bes, 81, |ctx| {
        let x = ctx.new_tensor(DType::F32, [5, 9, 1, 1]).unwrap();
        let t = ctx.transpose(x).unwrap();
        Spec::new(ctx.clamp(t, lo, hi).unwrap())
    });
}

/// The router of llama.cpp's MoE FFN as the harness builds it (softmax, top-k, gathered
/// weights, sum, clamp, div) and the three expert products, node by node against the
/// reference.
#[rstest]
#[case(1)]
#[case(16)]
fn moe_router_chain(bes: &[CpuBackend], #[case] n_tok: usize) {
    let (n_as, nu) = (4, 2);
    check(bes, 90, |ctx| {
        let probs = ctx.new_tensor(DType::F32, [n_as, n_tok, 1, 1]).unwrap();
        let ids = ctx.argsort_top_k(probs, nu).unwrap();
        Spec::new(ids)
    });
    check(bes, 91, |ctx| {
        let w = ctx.new_tensor(DType::F32, [nu, n_tok, 1, 1]).unwrap();
        let sum = ctx.sum_rows(w).unwrap();
        Spec::new(sum)
    });
    check(bes, 92, |ctx| {
        let w = ctx.new_tensor(DType::F32, [nu, n_tok, 1, 1]).unwrap();
        let sum = ctx.new_tensor(DType::F32, [1, n_tok, 1, 1]).unwrap();
        Spec::new(ctx.div(w, sum).unwrap())
    });
    // ffn_down: b holds one row per chosen expert (B1 == n_used).
    let ids_v = route(Route::Distinct, n_as, nu, n_tok, 11);
    check(bes, 93, |ctx| {
        let a = ctx.new_tensor(DType::Q4_1, [96, 64, n_as, 1]).unwrap();
        let b = ctx.new_tensor(DType::F32, [96, nu, n_tok, 1]).unwrap();
        let ids = ctx.new_tensor(DType::I32, [nu, n_tok, 1, 1]).unwrap();
        let mut s = Spec::new(ctx.mul_mat_id(a, b, ids).unwrap());
        s.ints.push((ids, ids_v.clone()));
        s
    });
}
