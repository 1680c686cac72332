//! The mixture-of-experts ops on the GPU (cuda-sim, or the real GPU under
//! `GGML_RS_REQUIRE_GPU`): DIV, CLAMP, SUM_ROWS and ARGSORT_TOP_K against the CPU
//! backend bit for bit (each is the same IEEE operations in the same order, or integer
//! compares), and against the host mirrors in `ggml_cuda::reference`.

mod common;

use common::{f32_bytes, gpu, run_all, to_f32, Rng};
use ggml_core::quant::quantize_row;
use ggml_core::{Backend, Context, DType, Tensor, TensorId};
use ggml_cpu::{CpuBackend, CpuBackendOptions};
use ggml_cuda::reference;
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

/// `values` stored as `dtype` (f32, f16, bf16 or a quantised type: rows of `row` values).
fn bytes_of(dtype: DType, values: &[f32], row: usize) -> Vec<u8> {
    let per_row = dtype.row_size(row).expect("row fits the dtype's blocks");
    let mut out = vec![0u8; per_row * values.len() / row];
    for (src, dst) in values.chunks(row).zip(out.chunks_mut(per_row)) {
        quantize_row(dtype, src, dst).expect("quantisable row");
    }
    out
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
fn with_specials(r: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
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
    let mut r = Rng(na as u64 * 3 + nb as u64);
    let av = with_specials(&mut r, na, 4.0);
    let bv = with_specials(&mut r, nb, 2.0);
    let [cpu, gpu] = cpu_and_gpu(|ctx| {
        let a = ctx.new_tensor(a_dtype, a_ne).unwrap();
        let b = ctx.new_tensor(b_dtype, b_ne).unwrap();
        let out = ctx.div(a, b).unwrap();
        Case {
            inputs: vec![
                (a, bytes_of(a_dtype, &av, a_ne[0])),
                (b, bytes_of(b_dtype, &bv, b_ne[0])),
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
    let mut r = Rng(17);
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
    let mut r = Rng(n as u64 + 5);
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
    let mut r = Rng(n as u64 * 13 + k as u64);
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
