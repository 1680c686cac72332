//! Shared helpers: build a one-op graph, place it in a CPU buffer, fill random inputs,
//! run it on a backend and compare with `ggml_cpu::reference`.
#![allow(dead_code)]

use std::collections::HashMap;

use ggml_core::{Backend, Context, DType, DataRef, Op, Tensor, TensorId};
use ggml_cpu::reference::{self, HostTensor};
use ggml_cpu::{CpuBackend, CpuBackendOptions, Isa};
pub use ggml_test_kit::bytes::f32s;
use ggml_test_kit::{xorshift_quant_blocks, Xorshift};

/// What a test case builds: the output node and explicit integer inputs.
pub struct Spec {
    pub out: TensorId,
    pub ints: Vec<(TensorId, Vec<i32>)>,
    /// Extra f32 inputs set explicitly (masks with -inf, say).
    pub floats: Vec<(TensorId, Vec<f32>)>,
}

impl Spec {
    pub fn new(out: TensorId) -> Spec {
        Spec {
            out,
            ints: vec![],
            floats: vec![],
        }
    }
}

pub fn backends(threads: &[usize]) -> Vec<CpuBackend> {
    let mut v = vec![];
    for isa in Isa::available() {
        for &n in threads {
            v.push(
                CpuBackend::new(CpuBackendOptions {
                    n_threads: n,
                    isa: Some(isa),
                    ..CpuBackendOptions::default()
                })
                .unwrap(),
            );
        }
    }
    v
}

/// Random contents for a leaf.
fn fill(t: &Tensor, rng: &mut Xorshift) -> Vec<u8> {
    let n = t.nbytes();
    match t.dtype {
        DType::F32 => {
            let mut v = vec![0u8; n];
            for c in v.chunks_exact_mut(4) {
                c.copy_from_slice(&(rng.f() * 2.0).to_le_bytes());
            }
            v
        }
        DType::F16 => {
            let mut v = vec![0u8; n];
            for c in v.chunks_exact_mut(2) {
                c.copy_from_slice(&half::f16::from_f32(rng.f() * 2.0).to_bits().to_le_bytes());
            }
            v
        }
        DType::BF16 => {
            let mut v = vec![0u8; n];
            for c in v.chunks_exact_mut(2) {
                c.copy_from_slice(&half::bf16::from_f32(rng.f() * 2.0).to_bits().to_le_bytes());
            }
            v
        }
        DType::I32 => vec![0u8; n],
        d => {
            assert!(t.is_contiguous());
            xorshift_quant_blocks(d, n / d.type_size(), rng)
        }
    }
}

/// Runs `build`'s op on every backend and checks the output bytes equal the reference's.
/// Returns the output bytes.
pub fn check(
    backends: &[CpuBackend],
    seed: u64,
    build: impl Fn(&mut Context<'_>) -> Spec,
) -> Vec<u8> {
    let mut storage = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 64];
    let mut ctx = Context::new(&mut storage);
    let spec = build(&mut ctx);
    let mut rng = Xorshift::new(seed);
    // Leaf data.
    let mut data: HashMap<usize, Vec<u8>> = HashMap::new();
    for (i, t) in ctx.tensors().iter().enumerate() {
        if t.op == Op::None && t.view_src.is_none() {
            data.insert(i, fill(t, &mut rng));
        }
    }
    for (id, vals) in &spec.ints {
        data.insert(
            id.index(),
            vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
        );
    }
    for (id, vals) in &spec.floats {
        let t = ctx.get(*id).unwrap();
        let b: Vec<u8> = match t.dtype {
            DType::F16 => vals
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
                .collect(),
            _ => vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        data.insert(id.index(), b);
    }
    let out = *ctx.get(spec.out).unwrap();
    let root = |t: &Tensor, id: usize| -> (usize, usize) {
        match t.view_src {
            Some(r) => (r.index(), t.view_offs),
            None => (id, 0),
        }
    };
    // Reference.
    let srcs: Vec<HostTensor<'_>> = out
        .src
        .iter()
        .flatten()
        .map(|s| {
            let t = ctx.get(*s).unwrap();
            let (r, off) = root(t, s.index());
            HostTensor {
                desc: t,
                bytes: &data[&r][off..],
            }
        })
        .collect();
    let (oroot, ooff) = root(&out, spec.out.index());
    // CPY and SET_ROWS write into their destination's bytes: compare all of them.
    let writes_into = matches!(out.op, Op::Cpy | Op::SetRows);
    let out_len = if writes_into {
        ctx.get(TensorId(oroot as u32)).unwrap().nbytes()
    } else {
        out.nbytes()
    };
    let mut want = vec![0u8; out_len];
    if out.op == Op::SetRows {
        // SET_ROWS leaves the rows it does not name as they were.
        want.copy_from_slice(&data[&oroot]);
        reference::compute(&out, &srcs, &mut want[ooff..]).unwrap();
    } else if out.op == Op::Cpy {
        want.copy_from_slice(&data[&oroot]);
        let mut tmp = vec![0u8; out.nbytes()];
        reference::compute(&out, &srcs, &mut tmp).unwrap();
        want[ooff..ooff + tmp.len()].copy_from_slice(&tmp);
    } else {
        reference::compute(&out, &srcs, &mut want).unwrap();
    }
    drop(srcs);
    for be in backends {
        let (storage2, offsets) = place(&ctx, be);
        let tensors = &storage2;
        for (&i, bytes) in &data {
            be.set_tensor_async(&tensors[i], 0, bytes).unwrap();
        }
        be.graph_compute(tensors, &[spec.out]).unwrap();
        be.synchronize().unwrap_or_else(|e| panic!("{e}"));
        let mut got = vec![0u8; out_len];
        let target = if writes_into {
            &tensors[oroot]
        } else {
            &tensors[spec.out.index()]
        };
        be.get_tensor(target, 0, &mut got).unwrap();
        assert!(
            got == want,
            "{} isa {} threads {}: output differs from the reference ({} {:?}); first diff at byte {:?}",
            out.op.name(),
            be.isa(),
            be.n_threads(),
            out.dtype,
            out.ne,
            got.iter().zip(&want).position(|(a, b)| a != b)
        );
        be.free_buffer(offsets).unwrap();
    }
    want
}

/// Allocates one buffer for every non-view tensor and sets `data` of all tensors.
pub fn place(ctx: &Context<'_>, be: &CpuBackend) -> (Vec<Tensor>, ggml_core::BufferId) {
    let mut tensors = ctx.tensors().to_vec();
    let mut offs = vec![0usize; tensors.len()];
    let mut total = 0usize;
    for (i, t) in tensors.iter().enumerate() {
        if t.view_src.is_none() {
            offs[i] = total;
            total += t.nbytes().div_ceil(64) * 64 + 64;
        }
    }
    let buf = be.alloc_buffer(total.max(64)).unwrap();
    for i in 0..tensors.len() {
        let t = tensors[i];
        let addr = match t.view_src {
            Some(r) => buf.base + (offs[r.index()] + t.view_offs) as u64,
            None => buf.base + offs[i] as u64,
        };
        tensors[i].data = Some(DataRef {
            buffer: buf.id,
            addr,
        });
    }
    (tensors, buf.id)
}
