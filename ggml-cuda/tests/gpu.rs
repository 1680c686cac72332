//! Every kernel against host references: bit for bit where the kernel has no `.approx`
//! instruction (the mirrors in `ggml_cuda::reference` do its float operations in its
//! order; the quantised products' per-output order is `reference::mul_mat_q_dot_class`'s), by
//! NMSE where it has (silu, swiglu, soft_max, flash attention: 1e-7, 5e-4), plus
//! bit-identity checks of invariant 2, copies and events.
//!
//! One test, two drivers: the tests run on cuda-sim's emulated GPU (kernels in its PTX
//! interpreter with memcheck, racecheck, synccheck and initcheck on) unless
//! `GGML_RS_REQUIRE_GPU` is set (as `cargo xtask gpu-test` does): then they run on the
//! real GPU through libcuda and fail if there is none. Nothing is skipped.
#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use ggml_core::DType::{Q2K, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0};
use ggml_core::{
    AttnParams, Backend, BackendErrorKind, Context, DType, DataRef, EventRef, RopeMode, RopeParams,
    Tensor,
};
use ggml_cuda::reference::{self, nmse, BinaryOp, Q8_1_BLOCK};
use ggml_cuda::{CudaBackend, CudaTuning};

mod common;
use common::{assert_bits, driver, f32_bytes, gpu, run, run_all, Lcg};
use ggml_test_kit::bytes::{bf16_bytes, f16_bytes, i32_bytes};
use ggml_test_kit::lcg_quant_rows;

fn to_f32(b: &[u8]) -> Vec<f32> {
    common::to_f32(DType::F32, b)
}

fn storage() -> Vec<Tensor> {
    vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 32]
}

#[test]
fn get_rows_all_dtypes() {
    let be = gpu();
    let mut rng = Lcg(1);
    for dt in [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q8_0,
        DType::Q2K,
        DType::Q3K,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
    ] {
        let (k, rows) = (512, 10);
        let data = match dt {
            DType::F32 => f32_bytes(&rng.vec(k * rows)),
            DType::F16 => f16_bytes(&rng.vec(k * rows)),
            DType::BF16 => bf16_bytes(&rng.vec(k * rows)),
            _ => lcg_quant_rows(dt, k * rows, &mut rng, 0.005),
        };
        let idx = [3i32, 0, 9, 3];
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let a = ctx.new_tensor(dt, [k, rows, 1, 1]).unwrap();
        let i = ctx.new_tensor(DType::I32, [4, 1, 1, 1]).unwrap();
        let o = ctx.get_rows(a, i).unwrap();
        let got = to_f32(&run(
            &be,
            &mut ctx,
            &[(a, data.clone()), (i, i32_bytes(&idx))],
            o,
        ));
        let rs = dt.row_size(k).unwrap();
        let mut want = vec![0f32; 4 * k];
        for (r, &ix) in idx.iter().enumerate() {
            let row = &data[ix as usize * rs..(ix as usize + 1) * rs];
            reference::dequantize_row(dt, row, &mut want[r * k..(r + 1) * k]).unwrap();
        }
        assert_bits(&got, &want, &format!("get_rows {dt}"));
    }
}

#[test]
fn set_rows_writes_named_rows_exactly() {
    let be = gpu();
    let mut rng = Lcg(2);
    let (n, rows) = (64, 12);
    let cache = rng.vec(n * rows);
    let src = rng.vec(n * 3);
    let idx = [7i32, 0, 11];
    let mut s = storage();
    let mut ctx = Context::new(&mut s);
    let c = ctx.new_tensor(DType::F16, [n, rows, 1, 1]).unwrap();
    let x = ctx.new_tensor(DType::F32, [n, 3, 1, 1]).unwrap();
    let i = ctx.new_tensor(DType::I32, [3, 1, 1, 1]).unwrap();
    let o = ctx.set_rows(c, x, i).unwrap();
    let got = run(
        &be,
        &mut ctx,
        &[
            (c, f16_bytes(&cache)),
            (x, f32_bytes(&src)),
            (i, i32_bytes(&idx)),
        ],
        o,
    );
    let mut want = cache.clone();
    for (r, &ix) in idx.iter().enumerate() {
        want[ix as usize * n..(ix as usize + 1) * n].copy_from_slice(&src[r * n..(r + 1) * n]);
    }
    // Same rounding (to nearest even) as the CPU's f32 -> f16.
    assert_eq!(got, f16_bytes(&want));
}

#[test]
fn get_rows_bad_index_is_bad_data() {
    let be = gpu();
    let mut s = storage();
    let mut ctx = Context::new(&mut s);
    let a = ctx.new_tensor(DType::F32, [32, 4, 1, 1]).unwrap();
    let i = ctx.new_tensor(DType::I32, [1, 1, 1, 1]).unwrap();
    let o = ctx.get_rows(a, i).unwrap();
    let n = ctx.len();
    let buf = be.alloc_buffer(4096).unwrap();
    for j in 0..n {
        ctx.tensors_mut()[j].data = Some(DataRef {
            buffer: buf.id,
            addr: buf.base + 1024 * j as u64,
        });
    }
    let ts = ctx.tensors();
    be.set_tensor_async(&ts[i.index()], 0, &i32_bytes(&[4]))
        .unwrap();
    be.graph_compute(ts, &[o]).unwrap();
    let e = be.synchronize().unwrap_err();
    assert_eq!(e.kind, BackendErrorKind::BadData);
    assert!(e.to_string().contains("GET_ROWS"), "{e}");
    be.synchronize().unwrap();
}

/// A bad index in SET_ROWS is reported as SET_ROWS with its node's name, even after a
/// GET_ROWS that was fine in the same synchronisation interval.
#[test]
fn set_rows_bad_index_names_the_op_and_node() {
    let be = gpu();
    let mut s = storage();
    let mut ctx = Context::new(&mut s);
    let a = ctx.new_tensor(DType::F32, [32, 4, 1, 1]).unwrap();
    let i = ctx.new_tensor(DType::I32, [1, 1, 1, 1]).unwrap();
    let g = ctx.get_rows(a, i).unwrap();
    let cache = ctx.new_tensor(DType::F32, [32, 4, 1, 1]).unwrap();
    let bad = ctx.new_tensor(DType::I32, [1, 1, 1, 1]).unwrap();
    let w = ctx.set_rows(cache, g, bad).unwrap();
    ctx.set_name(w, "kv_write").unwrap();
    let n = ctx.len();
    let buf = be.alloc_buffer(8192).unwrap();
    for j in 0..n {
        let off = match ctx.tensors()[j].view_src {
            Some(r) => 1024 * r.index() as u64,
            None => 1024 * j as u64,
        };
        ctx.tensors_mut()[j].data = Some(DataRef {
            buffer: buf.id,
            addr: buf.base + off,
        });
    }
    let ts = ctx.tensors();
    be.set_tensor_async(&ts[a.index()], 0, &f32_bytes(&[1.0; 128]))
        .unwrap();
    be.set_tensor_async(&ts[i.index()], 0, &i32_bytes(&[2]))
        .unwrap();
    be.set_tensor_async(&ts[bad.index()], 0, &i32_bytes(&[9]))
        .unwrap();
    be.graph_compute(ts, &[g, w]).unwrap();
    let e = be.synchronize().unwrap_err();
    assert_eq!(e.kind, BackendErrorKind::BadData);
    let text = e.to_string();
    assert!(
        text.contains("SET_ROWS") && text.contains("kv_write"),
        "{text}"
    );
    be.synchronize().unwrap();
}

/// rms_norm, mul by a broadcast row, add, scale (f32), and scale of an f16 tensor: the
/// exact kernels of a block's norm, bit for bit against the host mirrors.
#[test]
fn norm_mul_add_scale_bit_for_bit() {
    let be = gpu();
    let mut rng = Lcg(12);
    let (x, g, y) = (rng.vec(576 * 6), rng.vec(576), rng.vec(576 * 6));
    let h: Vec<f32> = rng.vec(300).iter().map(|v| v * 1000.0).collect();
    let mut s = storage();
    let mut ctx = Context::new(&mut s);
    let tx = ctx.new_tensor(DType::F32, [576, 3, 2, 1]).unwrap();
    let tg = ctx.new_tensor(DType::F32, [576, 1, 1, 1]).unwrap();
    let ty = ctx.new_tensor(DType::F32, [576, 3, 2, 1]).unwrap();
    let th = ctx.new_tensor(DType::F16, [100, 3, 1, 1]).unwrap();
    let n = ctx.rms_norm(tx, 1e-5).unwrap();
    let m = ctx.mul(n, tg).unwrap();
    let ad = ctx.add(m, ty).unwrap();
    let sc = ctx.scale(ad, 0.3).unwrap();
    let sh = ctx.scale(th, 0.3).unwrap();
    let got = run_all(
        &be,
        &mut ctx,
        &[
            (tx, f32_bytes(&x)),
            (tg, f32_bytes(&g)),
            (ty, f32_bytes(&y)),
            (th, f16_bytes(&h)),
        ],
        &[n, ad, sc, sh],
    );
    let mut norm = vec![0f32; x.len()];
    for (row, out) in x.chunks(576).zip(norm.chunks_mut(576)) {
        reference::rms_norm_row(row, 1e-5, out);
    }
    assert_bits(&to_f32(&got[0]), &norm, "rms_norm");
    let added: Vec<f32> = (0..x.len())
        .map(|i| {
            let m = reference::binary(BinaryOp::Mul, norm[i], g[i % 576]);
            reference::binary(BinaryOp::Add, m, y[i])
        })
        .collect();
    assert_bits(&to_f32(&got[1]), &added, "mul, add");
    let scaled: Vec<f32> = added.iter().map(|&v| reference::scale(v, 0.3)).collect();
    assert_bits(&to_f32(&got[2]), &scaled, "scale f32");
    let half: Vec<f32> = h
        .iter()
        .map(|&v| {
            let stored = reference::f16_to_f32(reference::f32_to_f16(v));
            reference::f16_to_f32(reference::f32_to_f16(reference::scale(stored, 0.3)))
        })
        .collect();
    assert_bits(&common::to_f32(DType::F16, &got[3]), &half, "scale f16");
}

#[test]
fn binary_unary_norm() {
    let be = gpu();
    let mut rng = Lcg(2);
    let (x, g, y) = (rng.vec(576 * 6), rng.vec(576), rng.vec(576 * 6));
    let mut s = storage();
    let mut ctx = Context::new(&mut s);
    let tx = ctx.new_tensor(DType::F32, [576, 3, 2, 1]).unwrap();
    let tg = ctx.new_tensor(DType::F32, [576, 1, 1, 1]).unwrap();
    let ty = ctx.new_tensor(DType::F32, [576, 3, 2, 1]).unwrap();
    let n = ctx.rms_norm(tx, 1e-5).unwrap();
    let m = ctx.mul(n, tg).unwrap();
    let ad = ctx.add(m, ty).unwrap();
    let sc = ctx.scale(ad, 0.5).unwrap();
    let sw = ctx.swiglu(sc, ty).unwrap();
    let si = ctx.silu(sw).unwrap();
    let got = to_f32(&run(
        &be,
        &mut ctx,
        &[
            (tx, f32_bytes(&x)),
            (tg, f32_bytes(&g)),
            (ty, f32_bytes(&y)),
        ],
        si,
    ));
    let mut want = vec![0f32; x.len()];
    for r in 0..6 {
        reference::rms_norm_row(
            &x[r * 576..(r + 1) * 576],
            1e-5,
            &mut want[r * 576..(r + 1) * 576],
        );
    }
    let silu = |v: f32| v / (1.0 + (-v).exp());
    for (i, w) in want.iter_mut().enumerate() {
        let v = (*w * g[i % 576] + y[i]) * 0.5;
        *w = silu(silu(v) * y[i]);
    }
    assert!(nmse(&got, &want) < 1e-7, "{}", nmse(&got, &want));
}

/// The host's MUL_MAT of quantised weight rows `w` ([k, m] per matrix, `a2 * a3`
/// matrices, contiguous) and f32 activations `x` ([k, n, b2, b3], contiguous), in the
/// per-output order of the kernel class of `n` columns: out [m, n, b2, b3].
fn mul_mat_q_ref(
    dt: DType,
    w: &[u8],
    x: &[f32],
    [k, m, n]: [usize; 3],
    [a2, a3]: [usize; 2],
    [b2, b3]: [usize; 2],
) -> Vec<f32> {
    let rs = dt.row_size(k).unwrap();
    let mut out = vec![0f32; m * n * b2 * b3];
    let mut q = vec![0u8; k / 32 * Q8_1_BLOCK];
    for i3 in 0..b3 {
        for i2 in 0..b2 {
            let wm = (i3 / (b3 / a3)) * a2 + i2 / (b2 / a2);
            for col in 0..n {
                let xc = ((i3 * b2 + i2) * n + col) * k;
                reference::quantize_q8_1(&x[xc..xc + k], &mut q);
                for row in 0..m {
                    let at = (wm * m + row) * rs;
                    let o = ((i3 * b2 + i2) * n + col) * m + row;
                    out[o] =
                        reference::mul_mat_q_dot_class(n, dt, &w[at..at + rs], &q, k / 32).unwrap();
                }
            }
        }
    }
    out
}

/// Every quantised weight dtype, K from one chunk to SmolLM2's FFN width (1536: two
/// 32-chunk K-tiles of the tiled class, one 64-chunk tile below 8 columns) and 4352 (three
/// 64-chunk tiles, the last of 8), M (37 or 13) not a multiple of any block's rows, N =
/// 1..7 (one column tile: the decode class, 8 partials per output) and 8, 17 (8-column
/// tiles, the last partial: the tiled class, one sequential chain): bit for bit the host's
/// order of each class, which depends on the class and not on the columns within it.
#[rstest::rstest]
fn mul_mat_quantised_follows_its_class_order(
    #[values(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K)] dt: DType,
) {
    let be = gpu();
    let mut rng = Lcg(3 + dt.ggml_id() as u64);
    for k in [32, 256, 576, 1536, 4352] {
        if k % dt.block_size() != 0 {
            continue;
        }
        let m = if k >= 1536 { 13 } else { 37 };
        let ns: &[usize] = match k {
            256 => &[1, 2, 3, 4, 5, 6, 7, 8, 17],
            4352 => &[1, 7],
            _ => &[1, 7, 17],
        };
        let w = lcg_quant_rows(dt, k * m, &mut rng, 0.005);
        let x = rng.vec(k * 17);
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let tw = ctx.new_tensor(dt, [k, m, 1, 1]).unwrap();
        let tx = ctx.new_tensor(DType::F32, [k, 17, 1, 1]).unwrap();
        let mut outs = Vec::new();
        for &n in ns {
            let xn = ctx.view_2d(tx, k, n, 4 * k, 0).unwrap();
            outs.push(ctx.mul_mat(tw, xn).unwrap());
        }
        let got = common::run_all(
            &be,
            &mut ctx,
            &[(tw, w.clone()), (tx, f32_bytes(&x))],
            &outs,
        );
        for (&n, g) in ns.iter().zip(&got) {
            let want = mul_mat_q_ref(dt, &w, &x[..k * n], [k, m, n], [1, 1], [1, 1]);
            assert_bits(&to_f32(g), &want, &format!("{dt} K {k} N {n}"));
        }
    }
    let st = be.kernel_stats();
    assert!(st.mmq >= 1 && st.mmvq >= 3, "{st:?}");
    // Only the tiled class quantises its activations in a launch of its own.
    assert_eq!(
        st.launches_of(ggml_cuda::KernelId::QuantizeQ8_1),
        st.mmq,
        "{st:?}"
    );
}

/// The `no-decode-lanes` tuning: a decode-class product (N = 1 and 3, K = 1536: 48
/// chunks, 6 a lane) chains every chunk on one thread, the tiled class's order
/// (`reference::mul_mat_q_dot`), and the default gives the 8 lanes' order; the two differ
/// on this data, so each check can fail.
#[rstest::rstest]
fn decode_lanes_off_chains_every_chunk(#[values(Q4_1, Q8_0, Q4K)] dt: DType) {
    let be = gpu();
    let (k, m) = (1536, 13);
    let mut rng = Lcg(17 + dt.ggml_id() as u64);
    let w = lcg_quant_rows(dt, k * m, &mut rng, 0.005);
    let x = rng.vec(k * 3);
    let run_with = |tuning: CudaTuning, n: usize| {
        be.set_tuning(tuning);
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let tw = ctx.new_tensor(dt, [k, m, 1, 1]).unwrap();
        let tx = ctx.new_tensor(DType::F32, [k, n, 1, 1]).unwrap();
        let out = ctx.mul_mat(tw, tx).unwrap();
        to_f32(&run(
            &be,
            &mut ctx,
            &[(tw, w.clone()), (tx, f32_bytes(&x[..k * n]))],
            out,
        ))
    };
    let chain_tuning: CudaTuning = "no-decode-lanes".parse().unwrap();
    for n in [1, 3] {
        let rs = dt.row_size(k).unwrap();
        let mut chain = vec![0f32; m * n];
        let mut lanes = vec![0f32; m * n];
        let mut q = vec![0u8; k / 32 * Q8_1_BLOCK];
        for col in 0..n {
            reference::quantize_q8_1(&x[col * k..(col + 1) * k], &mut q);
            for row in 0..m {
                let wr = &w[row * rs..(row + 1) * rs];
                chain[col * m + row] = reference::mul_mat_q_dot(dt, wr, &q, k / 32).unwrap();
                lanes[col * m + row] = reference::mul_mat_q_dot_lanes(dt, wr, &q, k / 32).unwrap();
            }
        }
        assert_ne!(
            chain.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            lanes.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{dt} N {n}: the two orders agree on this data"
        );
        let off = run_with(chain_tuning, n);
        assert_bits(&off, &chain, &format!("{dt} N {n}, no-decode-lanes"));
        let on = run_with(CudaTuning::default(), n);
        assert_bits(&on, &lanes, &format!("{dt} N {n}, default"));
    }
}

/// `qgemm` (2-D products of 8 columns or more, 32 x 32 register tiles over 8-chunk
/// K-tiles) for every quantised dtype, with partial tiles in every direction: M = 70 (two
/// full row tiles and 6 rows), N = 8 and 45 (a column tile of 8, one full and 13), K of
/// 19 chunks (K-tiles of 8, 8, 3) or, for the K-quants, 40 (8 x 5) and 8 (one tile), the
/// activations a view whose columns lie further apart than their length. Bit for bit the
/// host's sequential order and `qmm`'s 8-column tiles (`no-qgemm`); a batched product
/// stays on `qmm`.
#[rstest::rstest]
fn qgemm_tiles_give_the_sequential_order_and_qmm_bits(
    #[values(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K)] dt: DType,
) {
    let be = gpu();
    let mut rng = Lcg(77 + dt.ggml_id() as u64);
    let ks: &[usize] = if dt.block_size() == 256 {
        &[1280, 256]
    } else {
        &[608]
    };
    let m = 70;
    for &k in ks {
        let w = lcg_quant_rows(dt, k * m, &mut rng, 0.005);
        // 45 columns, 2 * k apart (the second half of each is never read).
        let x = rng.vec(2 * k * 45);
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let tw = ctx.new_tensor(dt, [k, m, 1, 1]).unwrap();
        let tx = ctx.new_tensor(DType::F32, [2 * k, 45, 1, 1]).unwrap();
        let mut outs = Vec::new();
        for n in [8, 45] {
            let xn = ctx.view_2d(tx, k, n, 8 * k, 0).unwrap();
            outs.push(ctx.mul_mat(tw, xn).unwrap());
        }
        let inputs = [(tw, w.clone()), (tx, f32_bytes(&x))];
        let before = be.kernel_stats();
        let got = common::run_all(&be, &mut ctx, &inputs, &outs);
        let ran = |k: ggml_cuda::KernelId| be.kernel_stats().launches_of(k) - before.launches_of(k);
        assert_eq!(ran(ggml_cuda::KernelId::Qgemm), 2, "{dt} K {k}");
        assert_eq!(ran(ggml_cuda::KernelId::Qmm), 0, "{dt} K {k}");
        be.set_tuning(CudaTuning {
            qgemm: false,
            ..CudaTuning::default()
        });
        let on_qmm = common::run_all(&be, &mut ctx, &inputs, &outs);
        be.set_tuning(CudaTuning::default());
        let dense: Vec<f32> = x.chunks(2 * k).flat_map(|c| c[..k].to_vec()).collect();
        let want = mul_mat_q_ref(dt, &w, &dense, [k, m, 45], [1, 1], [1, 1]);
        for ((n, g), q) in [8, 45].into_iter().zip(&got).zip(&on_qmm) {
            let what = format!("{dt} K {k} N {n}");
            assert_bits(&to_f32(g), &want[..m * n], &what);
            assert_bits(&to_f32(g), &to_f32(q), &format!("{what}: qgemm vs qmm"));
        }
    }
    // A batch of two matrices keeps qmm's tiles.
    let k = ks[0];
    let w = lcg_quant_rows(dt, k * m * 2, &mut rng, 0.005);
    let x = rng.vec(k * 9 * 2);
    let mut s = storage();
    let mut ctx = Context::new(&mut s);
    let tw = ctx.new_tensor(dt, [k, m, 2, 1]).unwrap();
    let tx = ctx.new_tensor(DType::F32, [k, 9, 2, 1]).unwrap();
    let out = ctx.mul_mat(tw, tx).unwrap();
    let before = be.kernel_stats();
    let got = run(&be, &mut ctx, &[(tw, w.clone()), (tx, f32_bytes(&x))], out);
    let after = be.kernel_stats();
    assert_eq!(
        after.launches_of(ggml_cuda::KernelId::Qgemm),
        before.launches_of(ggml_cuda::KernelId::Qgemm)
    );
    let want = mul_mat_q_ref(dt, &w, &x, [k, m, 9], [2, 1], [2, 1]);
    assert_bits(&to_f32(&got), &want, &format!("{dt} K {k}, two batches"));
}

/// Batched products with broadcast weights (r2 = 2, r3 = 3) and activation columns
/// further apart than their length, in both classes: bit for bit the host's order.
#[rstest::rstest]
#[case::q4_1_decode(DType::Q4_1, 3)]
#[case::q6_k_decode(DType::Q6K, 1)]
#[case::q8_0_tiled(DType::Q8_0, 9)]
#[case::q5_0_tiled(DType::Q5_0, 8)]
fn mul_mat_quantised_broadcast_batches(#[case] dt: DType, #[case] n: usize) {
    let be = gpu();
    let mut rng = Lcg(5);
    let (k, m) = (256, 11);
    let (a2, a3, b2, b3) = (2, 1, 4, 3);
    let w = lcg_quant_rows(dt, k * m * a2 * a3, &mut rng, 0.005);
    // x: [k, n, b2, b3] inside a [2k, ...] parent (column stride 2k values).
    let xp = rng.vec(2 * k * n * b2 * b3);
    let mut x = Vec::with_capacity(k * n * b2 * b3);
    for c in xp.chunks(2 * k) {
        x.extend_from_slice(&c[..k]);
    }
    let mut s = storage();
    let mut ctx = Context::new(&mut s);
    let tw = ctx.new_tensor(dt, [k, m, a2, a3]).unwrap();
    let tp = ctx.new_tensor(DType::F32, [2 * k, n, b2, b3]).unwrap();
    let nb = ctx.tensors()[tp.index()].nb;
    let tx = ctx.view(tp, [k, n, b2, b3], nb, 0).unwrap();
    let out = ctx.mul_mat(tw, tx).unwrap();
    let got = to_f32(&run(
        &be,
        &mut ctx,
        &[(tw, w.clone()), (tp, f32_bytes(&xp))],
        out,
    ));
    let want = mul_mat_q_ref(dt, &w, &x, [k, m, n], [a2, a3], [b2, b3]);
    assert_bits(&got, &want, &format!("{dt} N {n}"));
}

#[test]
fn mul_mat_float_with_broadcast() {
    let be = gpu();
    let mut rng = Lcg(4);
    for dt in [DType::F32, DType::F16, DType::BF16] {
        let (k, m, n) = (64, 32, 5);
        let a = rng.vec(k * m * 3);
        let b = rng.vec(k * n * 9);
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let ta = ctx.new_tensor(dt, [k, m, 3, 1]).unwrap();
        let tb = ctx.new_tensor(DType::F32, [k, n, 9, 1]).unwrap();
        let o = ctx.mul_mat(ta, tb).unwrap();
        let ab = match dt {
            DType::F32 => f32_bytes(&a),
            DType::F16 => f16_bytes(&a),
            _ => bf16_bytes(&a),
        };
        let got = to_f32(&run(&be, &mut ctx, &[(ta, ab), (tb, f32_bytes(&b))], o));
        let mut want = vec![0f32; m * n * 9];
        for h in 0..9 {
            for col in 0..n {
                for row in 0..m {
                    let ar: Vec<f32> = a[(h / 3) * k * m + row * k..][..k]
                        .iter()
                        .map(|&v| match dt {
                            DType::F16 => reference::f16_to_f32(reference::f32_to_f16(v)),
                            DType::BF16 => reference::bf16_to_f32(reference::f32_to_bf16(v)),
                            _ => v,
                        })
                        .collect();
                    let br = &b[h * k * n + col * k..][..k];
                    want[h * m * n + col * m + row] = reference::mul_mat_f_dot(dt, &ar, br);
                }
            }
        }
        assert_bits(&got, &want, &format!("mul_mat {dt}"));
    }
}

#[test]
fn rope_normal_and_neox() {
    let be = gpu();
    let mut rng = Lcg(5);
    let ne = [64, 9, 7];
    let x = rng.vec(64 * 9 * 7);
    let pos = [0i32, 1, 2, 100, 1000, 4000, 7];
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let tx = ctx.new_tensor(DType::F32, [64, 9, 7, 1]).unwrap();
        let tp = ctx.new_tensor(DType::I32, [7, 1, 1, 1]).unwrap();
        let mut p = RopeParams::llama(48, 100000.0);
        p.mode = mode;
        let o = ctx.rope(tx, tp, p).unwrap();
        let got = to_f32(&run(
            &be,
            &mut ctx,
            &[(tx, f32_bytes(&x)), (tp, i32_bytes(&pos))],
            o,
        ));
        let c = reference::RopeConsts::new(&p);
        let mut want = vec![0f32; x.len()];
        for (r, (row, out)) in x.chunks(ne[0]).zip(want.chunks_mut(ne[0])).enumerate() {
            reference::rope_row(row, pos[r / ne[1]], &c, out);
        }
        assert_bits(&got, &want, &format!("rope {mode:?}"));
    }
}

#[test]
fn soft_max_with_f16_mask() {
    let be = gpu();
    let mut rng = Lcg(6);
    let (n, rows) = (100, 6);
    let x = rng.vec(n * rows);
    let mask: Vec<f32> = (0..n * rows)
        .map(|i| {
            if i % n > 60 + i / n {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    let mut s = storage();
    let mut ctx = Context::new(&mut s);
    let tx = ctx.new_tensor(DType::F32, [n, rows, 1, 1]).unwrap();
    let tm = ctx.new_tensor(DType::F16, [n, rows, 1, 1]).unwrap();
    let o = ctx.soft_max(tx, Some(tm), 0.7, 0.0).unwrap();
    let got = to_f32(&run(
        &be,
        &mut ctx,
        &[(tx, f32_bytes(&x)), (tm, f16_bytes(&mask))],
        o,
    ));
    let mut want = vec![0f32; n * rows];
    for r in 0..rows {
        let v: Vec<f64> = (0..n)
            .map(|i| x[r * n + i] as f64 * 0.7 + mask[r * n + i] as f64)
            .collect();
        let mx = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = v.iter().map(|&y| (y - mx).exp()).sum();
        for i in 0..n {
            want[r * n + i] = ((v[i] - mx).exp() / sum) as f32;
        }
    }
    assert!(nmse(&got, &want) < 1e-7, "{}", nmse(&got, &want));
}

#[test]
fn cpy_cont_concat() {
    let be = gpu();
    let mut rng = Lcg(7);
    let x = rng.vec(8 * 6 * 4);
    let mut s = storage();
    let mut ctx = Context::new(&mut s);
    let tx = ctx.new_tensor(DType::F32, [8, 6, 4, 1]).unwrap();
    let h = ctx.new_tensor(DType::F16, [8, 6, 4, 1]).unwrap();
    let b = ctx.new_tensor(DType::BF16, [8, 6, 4, 1]).unwrap();
    let back = ctx.new_tensor(DType::F32, [8, 6, 4, 1]).unwrap();
    let c1 = ctx.cpy(tx, h).unwrap();
    let c2 = ctx.cpy(c1, b).unwrap();
    let c3 = ctx.cpy(c2, back).unwrap();
    let p = ctx.permute(c3, [1, 0, 2, 3]).unwrap();
    let ct = ctx.cont(p).unwrap();
    let cc = ctx.concat(ct, ct, 2).unwrap();
    let got = to_f32(&run(&be, &mut ctx, &[(tx, f32_bytes(&x))], cc));
    let r = |v: f32| {
        reference::bf16_to_f32(reference::f32_to_bf16(reference::f16_to_f32(
            reference::f32_to_f16(v),
        )))
    };
    let mut want = Vec::new();
    for _ in 0..2 {
        for i2 in 0..4 {
            for i0 in 0..8 {
                for i1 in 0..6 {
                    want.push(r(x[i2 * 48 + i1 * 8 + i0]));
                }
            }
        }
    }
    assert_eq!(got, want);
}

fn attn_ref(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: &[f32],
    d: usize,
    nkv: usize,
    nq: usize,
    h: usize,
    hkv: usize,
    scale: f32,
    softcap: f32,
) -> Vec<f32> {
    let mut out = vec![0f32; d * h * nq];
    for iq in 0..nq {
        for hh in 0..h {
            let hk = hh / (h / hkv);
            // f16 keys: the kernel rounds q to f16 for q.k, as ggml does.
            let qr: Vec<f32> = q[(hh * nq + iq) * d..][..d]
                .iter()
                .map(|&x| reference::f16_to_f32(reference::f32_to_f16(x)))
                .collect();
            let mut sc = vec![f64::NEG_INFINITY; nkv];
            for (j, s) in sc.iter_mut().enumerate() {
                let m = mask[iq * nkv + j];
                if m == f32::NEG_INFINITY {
                    continue;
                }
                let kr = &k[(hk * nkv + j) * d..][..d];
                let mut x = qr
                    .iter()
                    .zip(kr)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>()
                    * scale as f64;
                if softcap > 0.0 {
                    x = softcap as f64 * (x / softcap as f64).tanh();
                }
                *s = x + m as f64;
            }
            let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = sc.iter().map(|&s| (s - mx).exp()).sum();
            for dd in 0..d {
                let acc: f64 = (0..nkv)
                    .map(|j| (sc[j] - mx).exp() * v[(hk * nkv + j) * d + dd] as f64)
                    .sum();
                out[(iq * h + hh) * d + dd] = (acc / sum) as f32;
            }
        }
    }
    out
}

/// Head size, query rows, KV length, query heads and KV heads of an attention test.
#[derive(Clone, Copy)]
struct AttnShape {
    d: usize,
    nq: usize,
    nkv: usize,
    h: usize,
    hkv: usize,
}

/// flash_attn_ext on the GPU: `q` as `[d, nq, h]` (head-major, as `attn_ref` reads it),
/// f16 K/V `[d, nkv, hkv]`, f16 mask `[nkv, nq]`.
fn flash_attn_on_gpu(
    be: &CudaBackend,
    shape: AttnShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: &[f32],
    params: AttnParams,
) -> Vec<f32> {
    let AttnShape { d, nq, nkv, h, hkv } = shape;
    let mut s = storage();
    let mut ctx = Context::new(&mut s);
    let tq = ctx.new_tensor(DType::F32, [d, h, nq, 1]).unwrap();
    let tqp = ctx.permute(tq, [0, 2, 1, 3]).unwrap();
    let tk = ctx.new_tensor(DType::F16, [d, nkv, hkv, 1]).unwrap();
    let tv = ctx.new_tensor(DType::F16, [d, nkv, hkv, 1]).unwrap();
    let tm = ctx.new_tensor(DType::F16, [nkv, nq, 1, 1]).unwrap();
    let o = ctx.flash_attn_ext(tqp, tk, tv, Some(tm), params).unwrap();
    // q is stored [d, h, nq]: head-major within a token, as the permute expects.
    let mut qs = vec![0f32; d * h * nq];
    for iq in 0..nq {
        for hh in 0..h {
            qs[(iq * h + hh) * d..][..d].copy_from_slice(&q[(hh * nq + iq) * d..][..d]);
        }
    }
    to_f32(&run(
        be,
        &mut ctx,
        &[
            (tq, f32_bytes(&qs)),
            (tk, f16_bytes(k)),
            (tv, f16_bytes(v)),
            (tm, f16_bytes(mask)),
        ],
        o,
    ))
}

#[test]
fn flash_attn_matches_and_ignores_masked_padding() {
    let be = gpu();
    let mut rng = Lcg(8);
    let (d, nq, h, hkv) = (64, 5, 6, 2);
    let mut results = Vec::new();
    // Positions 0..40 are the same in both runs; 40..72 are masked padding.
    let mut r2 = Lcg(9);
    let q: Vec<f32> = (0..d * nq * h).map(|_| r2.f()).collect();
    let kb: Vec<f32> = (0..d * 40 * hkv).map(|_| r2.f()).collect();
    let vb: Vec<f32> = (0..d * 40 * hkv).map(|_| r2.f()).collect();
    for nkv in [40usize, 72] {
        let mut k = vec![0f32; d * nkv * hkv];
        let mut v = vec![0f32; d * nkv * hkv];
        for hk in 0..hkv {
            for j in 0..nkv {
                for dd in 0..d {
                    let at = (hk * nkv + j) * d + dd;
                    if j < 40 {
                        k[at] = kb[(hk * 40 + j) * d + dd];
                        v[at] = vb[(hk * 40 + j) * d + dd];
                    } else {
                        k[at] = rng.f();
                        v[at] = rng.f();
                    }
                }
            }
        }
        let mask: Vec<f32> = (0..nq * nkv)
            .map(|i| {
                if i % nkv >= 40 || i % nkv > 30 + i / nkv {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        // Round K/V to f16 for the reference too.
        let k16: Vec<f32> = k
            .iter()
            .map(|&x| reference::f16_to_f32(reference::f32_to_f16(x)))
            .collect();
        let v16: Vec<f32> = v
            .iter()
            .map(|&x| reference::f16_to_f32(reference::f32_to_f16(x)))
            .collect();
        let shape = AttnShape { d, nq, nkv, h, hkv };
        let got = flash_attn_on_gpu(&be, shape, &q, &k, &v, &mask, AttnParams::scaled(0.125));
        let want = attn_ref(&q, &k16, &v16, &mask, d, nkv, nq, h, hkv, 0.125, 0.0);
        assert!(nmse(&got, &want) < 5e-4, "nkv {nkv}: {}", nmse(&got, &want));
        results.push(got);
    }
    assert_eq!(results[0], results[1], "masked padding changed the result");
}

#[test]
fn copies_and_events_between_virtual_devices() {
    let v = CudaBackend::new_virtual_with(driver(), 0, 2).expect("two instances on device 0");
    let (a, b) = (&v[0], &v[1]);
    let t = Tensor::contiguous(DType::F32, [1024, 1, 1, 1]).unwrap();
    let ba = a.alloc_buffer(4096).unwrap();
    let bb = b.alloc_buffer(4096).unwrap();
    let mut ta = t;
    ta.data = Some(DataRef {
        buffer: ba.id,
        addr: ba.base,
    });
    let mut tb = t;
    tb.data = Some(DataRef {
        buffer: bb.id,
        addr: bb.base,
    });
    let x: Vec<f32> = (0..1024).map(|i| i as f32).collect();
    let mut bytes = f32_bytes(&x);
    a.set_tensor_async(&ta, 0, &bytes).unwrap();
    bytes.fill(0); // the caller may reuse its bytes at once
    assert!(b.cpy_tensor_async(a, &ta, &tb).unwrap());
    let ev = b.event_new().unwrap().unwrap();
    b.event_record(ev).unwrap();
    a.event_wait(EventRef { owner: b, id: ev }).unwrap();
    b.event_synchronize(ev).unwrap();
    let mut out = vec![0u8; 4096];
    b.get_tensor(&tb, 0, &mut out).unwrap();
    assert_eq!(to_f32(&out), x);
    assert!(a.can_wait_on(b));
    b.event_free(ev).unwrap();
    a.free_buffer(ba.id).unwrap();
    b.free_buffer(bb.id).unwrap();
}

/// quantize_q8_1 rounds ties away from zero, as ggml's `roundf` (the CPU backend's
/// activations get the same bytes). Seen through mul_mat with one-hot Q8_0 weight rows of
/// scale 1: output row i is activation i's quantised value times its scale (1 here).
#[test]
fn q8_1_activation_ties_round_away_from_zero() {
    let be = gpu();
    let k = 32;
    let mut x = vec![0f32; k];
    x[0] = 127.0; // amax 127: d = 1, so every x.5 is a tie
    for (i, v) in x.iter_mut().enumerate().skip(1) {
        *v = (i as f32 - 16.0) + 0.5;
    }
    // Q8_0 rows: {d: f16 1.0, qs[32]} with qs one-hot at the row's index.
    let mut w = vec![0u8; k * 34];
    for (r, row) in w.chunks_mut(34).enumerate() {
        row[0..2].copy_from_slice(&reference::f32_to_f16(1.0).to_le_bytes());
        row[2 + r] = 1;
    }
    let mut s = storage();
    let mut ctx = Context::new(&mut s);
    let tw = ctx.new_tensor(DType::Q8_0, [k, k, 1, 1]).unwrap();
    let tx = ctx.new_tensor(DType::F32, [k, 1, 1, 1]).unwrap();
    let y = ctx.mul_mat(tw, tx).unwrap();
    let got = to_f32(&run(&be, &mut ctx, &[(tw, w), (tx, f32_bytes(&x))], y));
    let mut ggml = [0u8; Q8_1_BLOCK];
    ggml_core::quant::quantize_row(DType::Q8_1, &x, &mut ggml).unwrap();
    let want: Vec<f32> = ggml[4..].iter().map(|&q| q as i8 as f32).collect();
    assert_eq!(got, want);
    assert_eq!((got[16], got[15], got[18]), (1.0, -1.0, 3.0));
}

/// Soft-capping with logits well past the cap (Gemma 2 caps attention at 50): the
/// kernel's tanh must be about as good as the CPU's `tanh`, not `tanh.approx` (relative
/// 2^-11, which cuda-sim's approx check applies in full).
#[rstest::rstest]
#[case::cap_30(30.0)]
#[case::cap_50(50.0)]
fn flash_attn_soft_cap_with_large_logits(#[case] softcap: f32) {
    let be = gpu();
    let mut r = Lcg(21);
    let (d, nq, nkv, h, hkv) = (64, 4, 48, 4, 2);
    // q.k * scale spans about -80..80: most scores sit in tanh's flat tails.
    let q: Vec<f32> = (0..d * nq * h).map(|_| 12.0 * r.f()).collect();
    let k: Vec<f32> = (0..d * nkv * hkv).map(|_| r.f()).collect();
    let v: Vec<f32> = (0..d * nkv * hkv).map(|_| r.f()).collect();
    let mask = vec![0f32; nq * nkv];
    let round = |x: &[f32]| -> Vec<f32> {
        x.iter()
            .map(|&x| reference::f16_to_f32(reference::f32_to_f16(x)))
            .collect()
    };
    let params = AttnParams {
        softcap,
        ..AttnParams::scaled(0.125)
    };
    let shape = AttnShape { d, nq, nkv, h, hkv };
    let got = flash_attn_on_gpu(&be, shape, &q, &k, &v, &mask, params);
    let want = attn_ref(
        &q,
        &round(&k),
        &round(&v),
        &mask,
        d,
        nkv,
        nq,
        h,
        hkv,
        0.125,
        softcap,
    );
    // test-backend-ops' limit for this op is 5e-4, which even tanh.approx at its ISA
    // bound meets (measured 2.0e-6 and 3.2e-6 here); the kernel without soft-cap is at
    // about 1e-13, and so is it with the accurate tanh (4e-13, 9e-13).
    let e = nmse(&got, &want);
    assert!(e < 1e-9, "soft-cap {softcap}: NMSE {e:e}");
}

/// One graph that launches every kernel of the crate. On cuda-sim each launch is checked
/// against the kernel's `.param` list (count, order, size and integer/float type of each
/// argument): a mismatch fails the launch. So this test compares, for every kernel, what
/// the launcher packs with what the PTX declares. (Inputs are the zeroed buffer: only
/// the launches matter here; the other tests check the numbers.)
#[test]
fn every_kernel_launches_with_its_parameter_list() {
    let be = gpu();
    let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 80];
    let mut ctx = Context::new(&mut s);
    let k = 256;
    let x = ctx.new_tensor(DType::F32, [k, 8, 1, 1]).unwrap();
    let x1 = ctx.new_tensor(DType::F32, [k, 1, 1, 1]).unwrap();
    let wq = ctx.new_tensor(DType::Q4_0, [k, 16, 1, 1]).unwrap();
    let wf = ctx.new_tensor(DType::F32, [k, 16, 1, 1]).unwrap();
    let idx = ctx.new_tensor(DType::I32, [2, 1, 1, 1]).unwrap();
    let mut outs = vec![
        ctx.mul_mat(wq, x1).unwrap(),
        ctx.mul_mat(wq, x).unwrap(),
        ctx.mul_mat(wf, x).unwrap(),
        ctx.get_rows(wf, idx).unwrap(),
        ctx.get_rows(wq, idx).unwrap(),
        ctx.add(x, x).unwrap(),
        ctx.scale(x, 0.5).unwrap(),
        ctx.silu(x).unwrap(),
        ctx.swiglu(x, x).unwrap(),
        ctx.gelu(x).unwrap(),
        ctx.geglu(x, x).unwrap(),
        ctx.rms_norm(x, 1e-6).unwrap(),
        ctx.soft_max(x, None, 1.0, 0.0).unwrap(),
        ctx.concat(x, x, 1).unwrap(),
    ];
    let h16 = ctx.new_tensor(DType::F16, [k, 8, 1, 1]).unwrap();
    outs.push(ctx.cpy(x, h16).unwrap());
    let cache = ctx.new_tensor(DType::F16, [k, 4, 1, 1]).unwrap();
    let rows = ctx.new_tensor(DType::F32, [k, 2, 1, 1]).unwrap();
    outs.push(ctx.set_rows(cache, rows, idx).unwrap());
    let xr = ctx.new_tensor(DType::F32, [64, 2, 8, 1]).unwrap();
    let pos = ctx.new_tensor(DType::I32, [8, 1, 1, 1]).unwrap();
    outs.push(ctx.rope(xr, pos, RopeParams::llama(64, 10000.0)).unwrap());
    let q = ctx.new_tensor(DType::F32, [64, 4, 2, 1]).unwrap();
    let tk = ctx.new_tensor(DType::F16, [64, 16, 2, 1]).unwrap();
    let tv = ctx.new_tensor(DType::F16, [64, 16, 2, 1]).unwrap();
    let o = ctx
        .flash_attn_ext(q, tk, tv, None, AttnParams::scaled(0.125))
        .unwrap();
    outs.push(o);
    // A decode step's K rope next to its cache store: one fused rope_store launch.
    let xk = ctx.new_tensor(DType::F32, [64, 2, 1, 1]).unwrap();
    let pos1 = ctx.new_tensor(DType::I32, [1, 1, 1, 1]).unwrap();
    let kr = ctx.rope(xk, pos1, RopeParams::llama(64, 10000.0)).unwrap();
    let kf = ctx.reshape(kr, [128, 1, 1, 1]).unwrap();
    let kcache = ctx.new_tensor(DType::F16, [128, 4, 1, 1]).unwrap();
    let row0 = ctx.new_tensor(DType::I32, [1, 1, 1, 1]).unwrap();
    outs.push(ctx.set_rows(kcache, kf, row0).unwrap());
    // 8 queries: the first kernel (flash_attn_ext) in the run with the legacy tunings
    // below, the tensor-core one otherwise (head sizes 64 and 128).
    let q8 = ctx.new_tensor(DType::F32, [64, 8, 2, 1]).unwrap();
    outs.push(
        ctx.flash_attn_ext(q8, tk, tv, None, AttnParams::scaled(0.125))
            .unwrap(),
    );
    let q128 = ctx.new_tensor(DType::F32, [128, 8, 2, 1]).unwrap();
    let tk128 = ctx.new_tensor(DType::F16, [128, 16, 2, 1]).unwrap();
    let tv128 = ctx.new_tensor(DType::F16, [128, 16, 2, 1]).unwrap();
    outs.push(
        ctx.flash_attn_ext(q128, tk128, tv128, None, AttnParams::scaled(0.088))
            .unwrap(),
    );
    // Decode batches: flash_attn_row for head sizes 128 and 256 (the one of 64 is `o`),
    // flash_attn_dec for what flash_attn_row lacks (soft-capping).
    let q2 = ctx.new_tensor(DType::F32, [128, 2, 2, 1]).unwrap();
    outs.push(
        ctx.flash_attn_ext(q2, tk128, tv128, None, AttnParams::scaled(0.088))
            .unwrap(),
    );
    let q256 = ctx.new_tensor(DType::F32, [256, 1, 2, 1]).unwrap();
    let tk256 = ctx.new_tensor(DType::F16, [256, 16, 1, 1]).unwrap();
    outs.push(
        ctx.flash_attn_ext(q256, tk256, tk256, None, AttnParams::scaled(0.0625))
            .unwrap(),
    );
    let capped = AttnParams {
        softcap: 30.0,
        ..AttnParams::scaled(0.125)
    };
    outs.push(ctx.flash_attn_ext(q, tk, tv, None, capped).unwrap());
    // The MoE ops: quantised and float experts, div, clamp, sum_rows, argsort_top_k.
    let logits = ctx.new_tensor(DType::F32, [4, 8, 1, 1]).unwrap();
    let top = ctx.argsort_top_k(logits, 2).unwrap();
    let xe = ctx.reshape(x, [k, 1, 8, 1]).unwrap();
    let eq = ctx.new_tensor(DType::Q4_0, [k, 16, 4, 1]).unwrap();
    let ef = ctx.new_tensor(DType::F16, [k, 16, 4, 1]).unwrap();
    outs.push(ctx.mul_mat_id(eq, xe, top).unwrap());
    outs.push(ctx.mul_mat_id(ef, xe, top).unwrap());
    let sums = ctx.sum_rows(logits).unwrap();
    let sums = ctx.clamp(sums, 1e-6, f32::INFINITY).unwrap();
    outs.push(ctx.div(logits, sums).unwrap());
    // Greedy sampling's argmax over rows.
    outs.push(ctx.argmax(x).unwrap());
    // A prompt's norm and its weight before a tiled-class product: rms_norm_q8_1 (four
    // launches with the first generation, two with the second).
    let gw = ctx.new_tensor(DType::F32, [k, 1, 1, 1]).unwrap();
    let rn = ctx.rms_norm(x, 1e-6).unwrap();
    let cur = ctx.mul(rn, gw).unwrap();
    outs.push(ctx.mul_mat(wq, cur).unwrap());
    // A prompt's SwiGLU before a tiled-class product: swiglu_q8_1 with the second
    // generation (three launches with the first, two with the second).
    let sg = ctx.swiglu(x, x).unwrap();
    outs.push(ctx.mul_mat(wq, sg).unwrap());
    // Once with each generation of quantised products: the first quantises activations
    // in a kernel of its own before each of its 3 products, the second before its
    // tiled-class ones. Two small uploads travel as one batch, scattered by upload_scatter.
    be.set_tuning(CudaTuning {
        legacy_products: true,
        legacy_prompt_attn: true,
        ..CudaTuning::default()
    });
    let inputs = [(idx, vec![0u8; 8]), (pos, vec![0u8; 32])];
    run(&be, &mut ctx, &inputs, o);
    let first = be.kernel_stats().launches.iter().sum::<u64>();
    assert_eq!(first, 42);
    be.set_tuning(CudaTuning::default());
    run(&be, &mut ctx, &inputs, o);
    let st = be.kernel_stats();
    let missing: Vec<_> = ggml_cuda::KernelId::ALL
        .iter()
        .filter(|&&k| st.launches_of(k) == 0)
        .map(|k| k.entry())
        .collect();
    assert!(missing.is_empty(), "never launched: {missing:?}");
    // The second run: one launch less for the decode-class product (its prologue
    // quantises), the same for the tiled one and for MUL_MAT_ID of 8 tokens, two less for
    // the prompt's norm run and one less for its SwiGLU run.
    assert_eq!(
        st.launches.iter().sum::<u64>(),
        first + 38,
        "{st:?} for {outs:?}"
    );
}

/// Op timing sums each kind of op (products by weight type, a fused run as one step of
/// its own kind), starts new sums on each read, stops when turned off, and never changes
/// the bits.
#[test]
fn op_timing_sums_each_kind_and_keeps_the_bits() {
    let be = gpu();
    let mut rng = Lcg(11);
    let (k, m, n) = (256, 24, 3);
    let w = lcg_quant_rows(DType::Q4_0, k * m, &mut rng, 0.005);
    let x = rng.vec(k * n);
    let mut s = storage();
    let mut ctx = Context::new(&mut s);
    let tw = ctx.new_tensor(DType::Q4_0, [k, m, 1, 1]).unwrap();
    let tx = ctx.new_tensor(DType::F32, [k, n, 1, 1]).unwrap();
    let p = ctx.mul_mat(tw, tx).unwrap();
    let q = ctx.mul_mat(tw, tx).unwrap();
    let sum = ctx.add(p, q).unwrap();
    let out = ctx.rms_norm(sum, 1e-5).unwrap();
    let inputs = [(tw, w), (tx, f32_bytes(&x))];
    let untimed = run(&be, &mut ctx, &inputs, out);
    assert!(be.take_op_times().unwrap().is_empty(), "timing is off");

    be.set_op_timing(true).unwrap();
    let timed = run(&be, &mut ctx, &inputs, out);
    assert_eq!(timed, untimed, "timing changed the bits");
    let times = be.take_op_times().unwrap();
    let calls: Vec<(String, u64)> = {
        let mut v: Vec<_> = times.iter().map(|t| (t.to_string(), t.calls)).collect();
        v.sort();
        v
    };
    // The two products read one activation: one fused launch, timed as one.
    let want =
        [("ADD", 1), ("MUL_MAT*2 q4_0", 1), ("RMS_NORM", 1)].map(|(o, c)| (o.to_string(), c));
    assert_eq!(calls, want);
    assert!(times.iter().all(|t| t.ms >= 0.0), "{times:?}");
    assert!(
        times.windows(2).all(|w| w[0].ms >= w[1].ms),
        "longest first: {times:?}"
    );
    assert!(
        be.take_op_times().unwrap().is_empty(),
        "a read starts new sums"
    );

    be.set_op_timing(false).unwrap();
    assert_eq!(run(&be, &mut ctx, &inputs, out), untimed);
    assert!(
        be.take_op_times().unwrap().is_empty(),
        "timing is off again"
    );
}

/// The calibration probes run end to end at their smallest size (on cuda-sim in CI, so a
/// broken probe is found before a GPU is lent; the GPU kit runs them at full size).
#[test]
fn calibration_probes_run() {
    let be = gpu();
    let c = be.calibrate(ggml_cuda::ProbeSize::Tiny).expect("probes");
    let names: Vec<&str> = c.probes.iter().map(|p| p.name).collect();
    assert_eq!(
        names,
        [
            "launch_stream",
            "launch_host",
            "launch_graph_node",
            "launch_graph_host",
            "readback_pinned",
            "dram_read",
            "l2_read",
            "dram_latency",
            "l2_latency",
            "handoff_chain",
            "handoff_base",
            "fma_rate",
            "dp4a_rate",
            "sfu_rate",
            "smem_load",
            "smem_load_32way",
            "mma_f16_rate",
            "mma_s8_rate",
            "mma_f16_numerics",
        ]
    );
    for p in &c.probes {
        assert!(
            p.work > 0.0 && p.seconds > 0.0,
            "{}: {} {}",
            p.name,
            p.work,
            p.seconds
        );
        assert!(p.rate().is_finite(), "{}", p.name);
    }
    // The numerics probe's samples are f32 bits, one per result of every case.
    let numerics = c.probes.last().expect("probes");
    assert_eq!(numerics.samples.len(), numerics.work as usize);
    assert_eq!(numerics.samples.len(), 8 * 128);
    assert!(numerics
        .samples
        .iter()
        .all(|&s| s.fract() == 0.0 && (0.0..=u32::MAX as f64).contains(&s)));
    assert!(numerics.detail.contains("fit:"), "{}", numerics.detail);
    assert_eq!(c.compute_capability, be.compute_capability());
    // Nothing leaked: the probes' buffers were freed.
    assert!(be.synchronize().is_ok());
}

/// Each recorded launch of a pass replays alone between timed events, warm and with L2
/// flushed, and is keyed by its node's op.
#[test]
fn recorded_launches_replay_timed() {
    let be = gpu();
    let mut s = vec![ggml_core::Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 8];
    let mut ctx = Context::new(&mut s);
    let x = ctx.new_tensor(DType::F32, [1000, 3, 1, 1]).unwrap();
    let y = ctx.scale(x, 0.5).unwrap();
    let z = ctx.add(y, x).unwrap();
    ctx.set_name(z, "z").unwrap();
    let buf = be.alloc_buffer(3 * 16384).unwrap();
    for (k, id) in [x, y, z].into_iter().enumerate() {
        ctx.tensors_mut()[id.index()].data = Some(ggml_core::DataRef {
            buffer: buf.id,
            addr: buf.base + 16384 * k as u64,
        });
    }
    let ts = ctx.tensors();
    be.set_tensor_async(&ts[x.index()], 0, &f32_bytes(&Lcg(7).vec(3000)))
        .unwrap();
    be.record_launches(true);
    be.graph_compute(ts, &[y, z]).unwrap();
    let launches = be.take_recorded_launches();
    be.record_launches(false);
    assert!(!be.is_recording_launches());
    let mut first = vec![0u8; 12000];
    be.get_tensor(&ts[z.index()], 0, &mut first).unwrap();
    let kernels: Vec<_> = launches.iter().map(|l| (l.kernel, l.op)).collect();
    assert_eq!(
        kernels,
        [
            (ggml_cuda::KernelId::Scale, ("SCALE", None)),
            (ggml_cuda::KernelId::Binary, ("ADD", None)),
        ]
    );
    assert_eq!(launches[1].node.as_str(), "z");
    let times = be.time_launches(&launches, 2, 1 << 16).unwrap();
    assert_eq!(times.len(), 2);
    for t in &times {
        assert!(t.warm_us > 0.0 && t.cold_us > 0.0, "{t:?}");
    }
    // Replaying these kernels recomputes the same values (no node writes its input).
    let mut out = vec![0u8; 12000];
    be.get_tensor(&ts[z.index()], 0, &mut out).unwrap();
    assert_eq!(out, first);
    be.free_buffer(buf.id).unwrap();
}
