//! ARGMAX on the GPU (cuda-sim, or the real GPU under `GGML_RS_REQUIRE_GPU`) against the
//! CPU backend and the scalar reference (`ggml_cpu::reference::argmax_row`, greedy
//! sampling's scan) exactly: ties keep the lowest index across threads, warps and the
//! block, `-0 == +0`, NaN never wins, a NaN first value gives 0.

mod common;

use common::{f32_bytes, gpu, run_all, Lcg};
use ggml_core::{Backend, Context, DType, Tensor, TensorId};
use ggml_cpu::reference::argmax_row;
use ggml_cpu::{CpuBackend, CpuBackendOptions};
use rstest::rstest;

fn to_i32(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect()
}

/// ARGMAX of `x` (shape `ne`, or the transpose of an `[ne1, ne0]` tensor) on the CPU
/// backend and on the GPU: `[cpu, gpu]`.
fn cpu_and_gpu(x: &[f32], ne: [usize; 4], transposed: bool) -> [Vec<i32>; 2] {
    let cpu = CpuBackend::new(CpuBackendOptions::with_threads(2)).unwrap();
    let cuda = gpu();
    let mut res = Vec::new();
    for be in [&cpu as &dyn Backend, &cuda] {
        let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 8];
        let mut ctx = Context::new(&mut s);
        let (x0, src) = if transposed {
            let x0 = ctx.new_tensor(DType::F32, [ne[1], ne[0], 1, 1]).unwrap();
            (x0, ctx.transpose(x0).unwrap())
        } else {
            let x0 = ctx.new_tensor(DType::F32, ne).unwrap();
            (x0, x0)
        };
        let out: TensorId = ctx.argmax(src).unwrap();
        let n0 = ctx.get(x0).unwrap().nelements();
        let got = run_all(be, &mut ctx, &[(x0, f32_bytes(&x[..n0]))], &[out]);
        res.push(to_i32(&got[0]));
    }
    let g = res.pop().expect("two runs");
    [res.pop().expect("two runs"), g]
}

/// Row contents.
#[derive(Clone, Copy, Debug)]
enum Values {
    /// Random values (distinct in practice).
    Random,
    /// Five levels only: the maximum ties many times, across threads and warps.
    Ties,
    /// Random values with NaNs, ±0, ±inf mixed in; row 0 starts with NaN.
    Specials,
}

fn values(kind: Values, n: usize, row: usize, seed: u64) -> Vec<f32> {
    let mut r = Lcg(seed);
    match kind {
        Values::Random => r.vec(n),
        Values::Ties => (0..n).map(|_| (r.next() % 5) as f32 - 2.0).collect(),
        Values::Specials => {
            let mut x: Vec<f32> = (0..n)
                .map(|_| match r.next() % 8 {
                    0 => f32::NAN,
                    1 => -0.0,
                    2 => 0.0,
                    3 => f32::NEG_INFINITY,
                    _ => (r.next() % 3) as f32 - 1.0,
                })
                .collect();
            x[0] = f32::NAN;
            if n > row + 1 {
                x[row] = 0.0;
            }
            x
        }
    }
}

/// The GPU gives the CPU's index and the scan's, row by row: rows shorter than a warp,
/// of one element per thread, longer than the block (257, 1000) and of the vocabulary's
/// length (49152), several rows over dims 1..3, and a transposed (strided) source.
#[rstest]
#[case::one_value([1, 3, 1, 1], Values::Random)]
#[case::short_ties([7, 4, 1, 1], Values::Ties)]
#[case::warp([32, 2, 1, 1], Values::Specials)]
#[case::block_plus_one([257, 3, 1, 1], Values::Ties)]
#[case::rows_over_dims([100, 3, 2, 2], Values::Specials)]
#[case::long_ties([1000, 2, 1, 1], Values::Ties)]
#[case::vocab([49152, 1, 1, 1], Values::Random)]
#[case::vocab_ties([49152, 1, 1, 1], Values::Ties)]
fn argmax_matches_the_cpu_exactly(
    #[case] ne: [usize; 4],
    #[case] kind: Values,
    #[values(false, true)] transposed: bool,
) {
    let n: usize = ne.iter().product();
    let x = values(kind, n, ne[0], n as u64 + 11);
    let [cpu, gpu] = cpu_and_gpu(&x, ne, transposed);
    assert_eq!(gpu, cpu, "{ne:?} {kind:?} transposed {transposed}");
    if !transposed {
        let want: Vec<i32> = x.chunks(ne[0]).map(argmax_row).collect();
        assert_eq!(gpu, want, "{ne:?} {kind:?} vs the scan");
    }
}

/// Hand-made rows, each with the scan's answer: ties across warps and threads keep the
/// lowest index, zeros of both signs tie, NaN never wins, a NaN first value gives 0, a
/// row of -inf gives 0.
#[rstest]
#[case::tie_lowest(&[1.0, 3.0, 3.0, 2.0, 3.0], 1)]
#[case::nan_first(&[f32::NAN, 5.0, 7.0], 0)]
#[case::nan_skipped(&[1.0, f32::NAN, 7.0, 7.0], 2)]
#[case::signed_zeros(&[-0.0, 0.0, -0.0], 0)]
#[case::zero_over_minus_one(&[-1.0, -0.0, 0.0], 1)]
#[case::all_nan(&[f32::NAN; 11], 0)]
#[case::neg_inf_and_nan(&[f32::NEG_INFINITY, f32::NAN, f32::NEG_INFINITY], 0)]
#[case::inf(&[2.0, f32::INFINITY, f32::NAN, f32::INFINITY], 1)]
fn argmax_ties_and_nan(#[case] x: &'static [f32], #[case] want: i32) {
    assert_eq!(argmax_row(x), want);
    let [cpu, gpu] = cpu_and_gpu(x, [x.len(), 1, 1, 1], false);
    assert_eq!((cpu[0], gpu[0]), (want, want));
}

/// Long rows built so that the maximum sits in several threads and warps at once: the
/// lowest of its indices wins whichever thread, warp or combine step sees it first; and a
/// row of -inf with a NaN first value.
#[rstest]
#[case::late_warps(2000, &[1999, 1500, 700])]
#[case::same_thread(2000, &[1800, 1544, 1288])]
#[case::lane_zero_last(600, &[512, 256])]
#[case::warp_seven_first(2048, &[224, 2047, 0])]
fn argmax_lowest_index_across_the_block(#[case] n: usize, #[case] at: &'static [usize]) {
    let mut r = Lcg(n as u64);
    let mut x: Vec<f32> = (0..n).map(|_| r.f()).collect();
    for &i in at {
        x[i] = 5.0;
    }
    let want = *at.iter().min().unwrap() as i32;
    let [cpu, gpu] = cpu_and_gpu(&x, [n, 1, 1, 1], false);
    assert_eq!((argmax_row(&x), cpu[0], gpu[0]), (want, want, want));
    let mut neg = vec![f32::NEG_INFINITY; n];
    neg[0] = f32::NAN;
    let [cpu, gpu] = cpu_and_gpu(&neg, [n, 1, 1, 1], false);
    assert_eq!((cpu[0], gpu[0]), (0, 0));
}
