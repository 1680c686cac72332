//! What the GPU test files share: a seeded generator and a runner that computes a graph
//! on any backend.
//!
//! With `GGML_RS_KERNEL_RESULTS=FILE`, every output the runner reads back from a CUDA
//! backend is appended to FILE as `TEST#N SHA256 BYTES KIND` (N counts the outputs of one
//! test), so a run on cuda-sim and a run on a GPU can be compared bit for bit, kernel
//! test by kernel test (`cargo xtask gpu-test` does). KIND is `approx` when a kernel that
//! ran for the graph computing the output contains an `.approx` instruction (directly or
//! in a function it calls: [`KernelId::uses_approx`], read off the PTX), so the GPU may
//! differ from cuda-sim there; `exact` otherwise, where the two must agree bit for bit.
//! The kernels that ran are the difference of [`CudaBackend::kernel_stats`] before and
//! after the graph.

use ggml_core::{Backend, BufferInfo, Context, DType, DataRef, Op, Tensor, TensorId};
use ggml_cuda::reference;
use ggml_cuda::{CudaBackend, DriverKind, KernelId};
pub use ggml_test_kit::bytes::f32_bytes;
pub use ggml_test_kit::Lcg;

/// The driver under test: libcuda where a GPU is required (`GGML_RS_REQUIRE_GPU`, as
/// `cargo xtask gpu-test` sets), cuda-sim otherwise.
pub fn driver() -> DriverKind {
    if std::env::var_os("GGML_RS_REQUIRE_GPU").is_some() {
        DriverKind::Cuda
    } else {
        DriverKind::Sim
    }
}

/// Device 0 of [`driver`].
pub fn gpu() -> CudaBackend {
    let kind = driver();
    CudaBackend::with_driver(kind, 0, 0)
        .unwrap_or_else(|e| panic!("no {} device 0: {e}", kind.prefix()))
}

/// `bytes` of a tensor of `dtype` (f32, f16 or bf16) as f32 values.
// Not every test binary that includes this module reads values back as f32.
#[allow(dead_code)]
pub fn to_f32(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| reference::f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|c| reference::bf16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        d => panic!("no f32 view of {d}"),
    }
}

/// Allocates every non-view tensor of `ctx` in one buffer of `be` filled with `fill`,
/// points views at their roots and uploads `inputs`. Returns the buffer and the nodes
/// (tensors with an op) in id order.
pub fn place_and_upload(
    be: &dyn Backend,
    ctx: &mut Context<'_>,
    inputs: &[(TensorId, Vec<u8>)],
    fill: u8,
) -> (BufferInfo, Vec<TensorId>) {
    let n = ctx.len();
    let mut offs = vec![0usize; n];
    let mut total = 0usize;
    for (i, t) in ctx.tensors().iter().enumerate() {
        if t.view_src.is_none() {
            offs[i] = total;
            total += t.nbytes().div_ceil(256) * 256 + 256;
        }
    }
    let buf = be.alloc_buffer(total).unwrap();
    be.buffer_clear(buf.id, fill).unwrap();
    for i in 0..n {
        let t = ctx.tensors()[i];
        let (root, extra) = match t.view_src {
            Some(r) => (r.index(), t.view_offs),
            None => (i, 0),
        };
        ctx.tensors_mut()[i].data = Some(DataRef {
            buffer: buf.id,
            addr: buf.base + (offs[root] + extra) as u64,
        });
    }
    let ts = ctx.tensors();
    for (id, bytes) in inputs {
        be.set_tensor_async(&ts[id.index()], 0, bytes).unwrap();
    }
    let nodes: Vec<TensorId> = (0..n as u32)
        .map(TensorId)
        .filter(|id| ts[id.index()].op != Op::None)
        .collect();
    (buf, nodes)
}

/// The bytes of every node of `nodes` that is not a view, in order.
// Only the test binaries that compare whole graphs node by node read them all.
#[allow(dead_code)]
pub fn read_back(be: &dyn Backend, ts: &[Tensor], nodes: &[TensorId]) -> Vec<Vec<u8>> {
    nodes
        .iter()
        .filter(|id| !ts[id.index()].op.is_view())
        .map(|id| {
            let t = ts[id.index()];
            let mut b = vec![0u8; t.nbytes()];
            be.get_tensor(&t, 0, &mut b).unwrap();
            b
        })
        .collect()
}

/// Allocates every non-view tensor of `ctx` in one zeroed buffer of `be`, points views
/// at their roots, uploads `inputs`, computes every node in id order and returns `out`'s
/// bytes.
// Not every test binary that includes this module reads a single output.
#[allow(dead_code)]
pub fn run(
    be: &dyn Backend,
    ctx: &mut Context<'_>,
    inputs: &[(TensorId, Vec<u8>)],
    out: TensorId,
) -> Vec<u8> {
    run_all(be, ctx, inputs, &[out]).pop().expect("one output")
}

/// [`run`] returning the bytes of each of `outs`, in order.
pub fn run_all(
    be: &dyn Backend,
    ctx: &mut Context<'_>,
    inputs: &[(TensorId, Vec<u8>)],
    outs: &[TensorId],
) -> Vec<Vec<u8>> {
    let (buf, nodes) = place_and_upload(be, ctx, inputs, 0);
    let ts = ctx.tensors();
    for &id in &nodes {
        assert!(
            be.supports_op(ts, id),
            "{} does not support {:?}",
            be.name(),
            ts[id.index()].op
        );
    }
    let cuda = be.as_any().downcast_ref::<CudaBackend>();
    let before = cuda.map(CudaBackend::kernel_stats);
    be.graph_compute(ts, &nodes).unwrap();
    be.synchronize().unwrap();
    let approx = match (cuda, before) {
        (Some(c), Some(before)) => Some(ran_approx(&before, &c.kernel_stats())),
        _ => None,
    };
    let mut results = Vec::new();
    for out in outs {
        let t = ts[out.index()];
        let mut res = vec![0u8; t.nbytes()];
        be.get_tensor(&t, 0, &mut res).unwrap();
        if let Some(approx) = approx {
            record(&res, approx);
        }
        results.push(res);
    }
    be.free_buffer(buf.id).unwrap();
    results
}

thread_local! {
    static OUTPUTS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Whether a kernel launched between the two readings of the counters uses `.approx`.
fn ran_approx(before: &ggml_cuda::KernelStats, after: &ggml_cuda::KernelStats) -> bool {
    KernelId::ALL
        .into_iter()
        .any(|k| after.launches_of(k) > before.launches_of(k) && k.uses_approx())
}

/// Asserts `got` and `want` are the same f32 bits, naming the first elements that differ.
// Not every test binary that includes this module compares bits.
#[allow(dead_code)]
pub fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let bad: Vec<usize> = (0..got.len())
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .collect();
    let show: Vec<String> = bad
        .iter()
        .take(4)
        .map(|&i| {
            format!(
                "#{i}: {:e} ({:#010x}) vs {:e} ({:#010x})",
                got[i],
                got[i].to_bits(),
                want[i],
                want[i].to_bits()
            )
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: {} of {} elements differ from the host mirror: {}",
        bad.len(),
        got.len(),
        show.join(", ")
    );
}

/// Appends `bytes`' digest to `$GGML_RS_KERNEL_RESULTS`, if set, with `approx` or
/// `exact`.
fn record(bytes: &[u8], approx: bool) {
    use sha2::{Digest, Sha256};
    use std::io::Write;
    let Some(path) = std::env::var_os("GGML_RS_KERNEL_RESULTS") else {
        return;
    };
    let n = OUTPUTS.with(|c| {
        let n = c.get();
        c.set(n + 1);
        n
    });
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed")
        .replace(' ', "_");
    let digest: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    // One write per line with O_APPEND: lines from parallel test processes do not mix.
    let kind = if approx { "approx" } else { "exact" };
    let line = format!("{test}#{n} {digest} {} {kind}\n", bytes.len());
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("GGML_RS_KERNEL_RESULTS={path:?}: {e}"));
    f.write_all(line.as_bytes())
        .unwrap_or_else(|e| panic!("GGML_RS_KERNEL_RESULTS={path:?}: {e}"));
}
