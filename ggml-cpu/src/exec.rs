//! Graph execution: validation, data resolution, scratch planning, and the per-thread
//! node loop over the pool.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ggml_core::{BackendError, BackendErrorKind, DType, Name, Op, Tensor, TensorId, MAX_DIMS};

use crate::memory::{resolve, Region, Registry};
use crate::op_timing::OpClock;
use crate::ops;
use crate::pool::{Pool, ThreadCtx};
use crate::reference::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::runs::{RunSlot, Runs};
use crate::simd::Kernels;

/// Result of a kernel: an error kind and a fixed explanation.
pub(crate) type KResult = Result<(), (BackendErrorKind, &'static str)>;

/// A tensor as a kernel sees it: dtype, shape, byte strides and the address of element 0.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TView {
    pub dtype: DType,
    pub ne: [usize; MAX_DIMS],
    pub nb: [usize; MAX_DIMS],
    pub ptr: *mut u8,
}

impl TView {
    const EMPTY: TView = TView {
        dtype: DType::F32,
        ne: [0; MAX_DIMS],
        nb: [0; MAX_DIMS],
        ptr: std::ptr::null_mut(),
    };

    pub fn nrows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// `(i1, i2, i3)` of row `r` in row-major order.
    pub fn row_index(&self, r: usize) -> (usize, usize, usize) {
        (
            r % self.ne[1],
            (r / self.ne[1]) % self.ne[2],
            r / (self.ne[1] * self.ne[2]),
        )
    }

    /// Address of element `(0, i1, i2, i3)` (not dereferenced).
    pub fn row_ptr(&self, i1: usize, i2: usize, i3: usize) -> *mut u8 {
        self.ptr
            .wrapping_add(i1 * self.nb[1] + i2 * self.nb[2] + i3 * self.nb[3])
    }

    /// Whether dimension 0 is dense.
    pub fn rows_dense(&self) -> bool {
        self.ne[0] <= 1 || self.nb[0] == self.dtype.type_size()
    }

    /// Row `(i1, i2, i3)` as f32 if it is a dense, aligned F32 row.
    ///
    /// # Safety
    /// The row must lie in resolved tensor memory that nobody writes while the slice lives.
    pub unsafe fn row_f32<'a>(&self, i1: usize, i2: usize, i3: usize) -> Option<&'a [f32]> {
        let p = self.row_ptr(i1, i2, i3);
        if self.dtype != DType::F32 || !self.rows_dense() || !(p as usize).is_multiple_of(4) {
            return None;
        }
        // SAFETY: dense aligned F32 row inside resolved memory (caller's contract).
        Some(unsafe { std::slice::from_raw_parts(p as *const f32, self.ne[0]) })
    }

    /// Row `(i1, i2, i3)` as a mutable f32 slice if it is a dense, aligned F32 row.
    ///
    /// # Safety
    /// The row must lie in resolved tensor memory that only this thread accesses while the
    /// slice lives.
    pub unsafe fn row_f32_mut<'a>(&self, i1: usize, i2: usize, i3: usize) -> Option<&'a mut [f32]> {
        let p = self.row_ptr(i1, i2, i3);
        if self.dtype != DType::F32 || !self.rows_dense() || !(p as usize).is_multiple_of(4) {
            return None;
        }
        // SAFETY: as `row_f32`, with exclusive access (caller's contract).
        Some(unsafe { std::slice::from_raw_parts_mut(p as *mut f32, self.ne[0]) })
    }

    /// Reads element `i0` of a row starting at `row` as f32 (F32, F16, BF16, I32).
    ///
    /// # Safety
    /// The element must lie in resolved tensor memory.
    #[inline]
    pub unsafe fn get(&self, row: *const u8, i0: usize) -> f32 {
        let p = row.wrapping_add(i0 * self.nb[0]);
        // SAFETY: in resolved memory (caller's contract); unaligned reads are allowed.
        unsafe {
            match self.dtype {
                DType::F32 => (p as *const f32).read_unaligned(),
                DType::F16 => f16_to_f32((p as *const u16).read_unaligned()),
                DType::BF16 => bf16_to_f32((p as *const u16).read_unaligned()),
                DType::I32 => (p as *const i32).read_unaligned() as f32,
                _ => f32::NAN,
            }
        }
    }

    /// Writes element `i0` of a row starting at `row` from f32 (F32, F16, BF16, I32).
    ///
    /// # Safety
    /// The element must lie in resolved tensor memory this thread may write.
    #[inline]
    pub unsafe fn set(&self, row: *mut u8, i0: usize, v: f32) {
        let p = row.wrapping_add(i0 * self.nb[0]);
        // SAFETY: in resolved writable memory (caller's contract).
        unsafe {
            match self.dtype {
                DType::F32 => (p as *mut f32).write_unaligned(v),
                DType::F16 => (p as *mut u16).write_unaligned(f32_to_f16(v)),
                DType::BF16 => (p as *mut u16).write_unaligned(f32_to_bf16(v)),
                DType::I32 => (p as *mut i32).write_unaligned(v as i32),
                _ => {}
            }
        }
    }

    /// Reads row `(i1, i2, i3)` into `out` (`ne[0]` values) as f32, dequantising.
    ///
    /// # Safety
    /// The row must lie in resolved tensor memory nobody writes meanwhile.
    pub unsafe fn read_row(&self, i1: usize, i2: usize, i3: usize, out: &mut [f32]) {
        let row = self.row_ptr(i1, i2, i3);
        let n = self.ne[0];
        if self.dtype.is_quantized() {
            let rs = self.dtype.row_size(n).unwrap_or(0);
            // SAFETY: quantised rows are dense (checked by `supports`).
            let bytes = unsafe { std::slice::from_raw_parts(row as *const u8, rs) };
            crate::quant::dequantize_row(self.dtype, bytes, &mut out[..n]);
        } else if let Some(s) = unsafe { self.row_f32(i1, i2, i3) } {
            out[..n].copy_from_slice(s);
        } else if self.dtype == DType::F16 && self.rows_dense() && (row as usize).is_multiple_of(2)
        {
            // SAFETY: a dense, aligned F16 row of n values (caller's contract).
            let h = unsafe { std::slice::from_raw_parts(row as *const u16, n) };
            for (o, &x) in out[..n].iter_mut().zip(h) {
                *o = f16_to_f32(x);
            }
        } else {
            for (i0, o) in out[..n].iter_mut().enumerate() {
                // SAFETY: element of the row.
                *o = unsafe { self.get(row, i0) };
            }
        }
    }

    /// Writes `src` (`ne[0]` values) as row `(i1, i2, i3)`, converting from f32.
    ///
    /// # Safety
    /// The row must lie in resolved writable memory only this thread accesses.
    pub unsafe fn write_row(&self, i1: usize, i2: usize, i3: usize, src: &[f32]) {
        let row = self.row_ptr(i1, i2, i3);
        // SAFETY: forwarded.
        if let Some(d) = unsafe { self.row_f32_mut(i1, i2, i3) } {
            d.copy_from_slice(&src[..self.ne[0]]);
            return;
        }
        for (i0, &v) in src[..self.ne[0]].iter().enumerate() {
            // SAFETY: element of the row.
            unsafe { self.set(row, i0, v) };
        }
    }

    /// First byte and one past the last byte spanned.
    pub fn span(&self) -> (usize, usize) {
        let mut t = Tensor::contiguous(DType::F32, [1, 1, 1, 1]).expect("1 element");
        t.dtype = self.dtype;
        t.ne = self.ne;
        t.nb = self.nb;
        let start = self.ptr as usize;
        (start, start + t.nbytes())
    }
}

/// What a kernel sees of the node it computes.
pub(crate) struct NodeCtx<'a> {
    pub k: &'static Kernels,
    pub node: &'a Tensor,
    pub dst: TView,
    pub src: [TView; 4],
    /// Whether source `i` shares bytes with the destination.
    pub alias: [bool; 4],
    /// Shared scratch for the node (e.g. quantised activations).
    pub wdata: *mut u8,
    /// This thread's scratch, `tsize` bytes, 64-byte aligned.
    tdata: *mut u8,
    tsize: usize,
    /// A work counter reset to 0 before each phase.
    pub chunk: &'a AtomicUsize,
    /// The phase's chunk runs, one per thread: another way to share work than `chunk`.
    pub runs: Runs<'a>,
    /// MUL_MAT: the shared scratch already holds this node's activations converted for
    /// its weights (an earlier product of the same activations and weight dtype left them
    /// there, see [`ConvertedActivations`]), so phase 0 has nothing to do.
    pub converted: bool,
}

/// What the shared scratch holds after a MUL_MAT with quantised weights: its activations
/// converted to the weights' dot type (rows or panels), which depend only on the
/// activation view and the weight dtype. The next product of the same activations and
/// weight dtype (Q, K and V of one norm; gate and up) finds them there and skips its
/// conversion, unless a node in between wrote the activations or used the shared
/// scratch. Every thread walks the same nodes, so all of them decide alike.
#[derive(Clone, Copy, PartialEq, Eq)]
struct ConvertedActivations {
    at: usize,
    ne: [usize; MAX_DIMS],
    nb: [usize; MAX_DIMS],
    dtype: DType,
    weights: DType,
    /// The activations' bytes (`TView::span`), which no node may write in between.
    span: (usize, usize),
}

impl ConvertedActivations {
    /// The key of a MUL_MAT node whose phase 0 converts only its activations (quantised
    /// weights: nothing gathered), `None` for every other node.
    fn of(t: &Tensor, src: &[TView; 4]) -> Option<ConvertedActivations> {
        (t.op == Op::MulMat && src[0].dtype.is_weight_quant()).then(|| ConvertedActivations {
            at: src[1].ptr as usize,
            ne: src[1].ne,
            nb: src[1].nb,
            dtype: src[1].dtype,
            weights: src[0].dtype,
            span: src[1].span(),
        })
    }

    /// The shared scratch's state over `node`, which `held` was before it: whether the
    /// node's activations are already converted there, and what it holds after the node.
    fn step(
        held: Option<ConvertedActivations>,
        node: &Tensor,
        src: &[TView; 4],
        dst: TView,
    ) -> (bool, Option<ConvertedActivations>) {
        match ConvertedActivations::of(node, src) {
            Some(key) => (held == Some(key), Some(key)),
            None => (false, held.filter(|c| c.survives(node, dst))),
        }
    }

    /// Whether `node`, which is no MUL_MAT with this key, leaves the converted
    /// activations in place: it uses no shared scratch and does not write the
    /// activations' bytes (a view of them, or an in-place op on them).
    fn survives(&self, node: &Tensor, dst: TView) -> bool {
        let (act, written) = (self.span, dst.span());
        let uses_scratch = matches!(node.op, Op::MulMat | Op::MulMatId);
        !uses_scratch && (written.1 <= act.0 || act.1 <= written.0)
    }
}

impl NodeCtx<'_> {
    /// This thread's scratch as f32 values. Call at most once per phase.
    #[allow(clippy::mut_from_ref)]
    pub fn scratch_f32(&self) -> &mut [f32] {
        // SAFETY: each thread's area is disjoint from the others' and from `wdata`, is
        // 64-byte aligned, and kernels take it once per phase, so no two live mutable
        // slices overlap.
        unsafe { std::slice::from_raw_parts_mut(self.tdata as *mut f32, self.tsize / 4) }
    }

    /// This thread's scratch as bytes. Call at most once per phase, instead of
    /// [`NodeCtx::scratch_f32`].
    #[allow(clippy::mut_from_ref)]
    pub fn scratch_bytes(&self) -> &mut [u8] {
        // SAFETY: as `scratch_f32`.
        unsafe { std::slice::from_raw_parts_mut(self.tdata, self.tsize) }
    }

    /// The rows `[start, end)` of `n` that thread `ith` of `nth` handles.
    pub fn split(n: usize, ith: usize, nth: usize) -> (usize, usize) {
        (n * ith / nth, n * (ith + 1) / nth)
    }
}

/// Whether the backend can run `node`, or why not.
pub(crate) fn supports(tensors: &[Tensor], node: TensorId) -> Result<(), &'static str> {
    let t = tensors.get(node.index()).ok_or("unknown tensor")?;
    let src = |i: usize| -> Result<&Tensor, &'static str> {
        t.src[i]
            .and_then(|s| tensors.get(s.index()))
            .ok_or("missing operand")
    };
    let float = |d: DType| d.is_float();
    let f32_or_f16 = |d: DType| matches!(d, DType::F32 | DType::F16);
    let ok = |c: bool, why: &'static str| if c { Ok(()) } else { Err(why) };
    match t.op {
        Op::None | Op::View | Op::Reshape | Op::Permute { .. } | Op::Transpose => Ok(()),
        Op::GetRows => {
            let a = src(0)?;
            ok(
                src(1)?.dtype == DType::I32
                    && (float(a.dtype) || crate::quant::can_dequantize(a.dtype))
                    && (!a.dtype.is_quantized() || a.rows_contiguous()),
                "get_rows: unsupported dtype",
            )
        }
        Op::Add | Op::Mul | Op::Div => ok(
            float(src(0)?.dtype) && float(src(1)?.dtype) && float(t.dtype),
            "add/mul/div: float dtypes only",
        ),
        Op::Clamp { .. } => ok(
            src(0)?.dtype == DType::F32 && t.dtype == DType::F32,
            "clamp: f32 only",
        ),
        Op::SumRows => ok(
            src(0)?.dtype == DType::F32 && t.dtype == DType::F32 && t.ne[0] == 1,
            "sum_rows: f32 only",
        ),
        Op::Argmax => ok(
            src(0)?.dtype == DType::F32
                && src(0)?.ne[0] > 0
                && t.dtype == DType::I32
                && t.ne[0] == 1,
            "argmax: f32 rows to an i32 column",
        ),
        Op::ArgsortTopK { k } => {
            let a = src(0)?;
            ok(
                a.dtype == DType::F32
                    && t.dtype == DType::I32
                    && (1..=a.ne[0]).contains(&(k as usize))
                    && t.ne[0] == k as usize,
                "argsort_top_k: f32 rows, 1 <= k <= n, i32 result",
            )
        }
        Op::Scale { .. } => ok(float(src(0)?.dtype) && float(t.dtype), "scale: float only"),
        Op::RmsNorm { .. } | Op::Silu | Op::Gelu => ok(src(0)?.dtype == DType::F32, "f32 only"),
        Op::Swiglu | Op::Geglu => ok(
            src(0)?.dtype == DType::F32 && src(1)?.dtype == DType::F32,
            "swiglu/geglu: f32 only",
        ),
        Op::MulMat => {
            let (a, b) = (src(0)?, src(1)?);
            let w_ok = match a.dtype {
                DType::F32 | DType::F16 | DType::BF16 => true,
                d => ops::mul_mat::quant_supported(d) && a.rows_contiguous(),
            };
            ok(
                w_ok && b.dtype == DType::F32,
                "mul_mat: unsupported weight dtype",
            )
        }
        Op::Rope(_) => ok(
            f32_or_f16(src(0)?.dtype) && src(1)?.dtype == DType::I32,
            "rope: f32/f16 with i32 positions",
        ),
        Op::SoftMax { .. } => {
            let m_ok = match t.src[1] {
                Some(_) => f32_or_f16(src(1)?.dtype),
                None => true,
            };
            ok(
                src(0)?.dtype == DType::F32 && m_ok,
                "soft_max: f32 with f32/f16 mask",
            )
        }
        Op::Cpy => {
            let (a, b) = (src(0)?, src(1)?);
            let dst_ok =
                float(b.dtype) || (crate::quant::can_quantize(b.dtype) && b.is_contiguous());
            ok(float(a.dtype) && dst_ok, "cpy: unsupported dtypes")
        }
        Op::SetRows => ok(
            src(0)?.dtype == DType::F32
                && src(1)?.dtype == DType::I32
                && matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16)
                && t.nb[0] == t.dtype.type_size(),
            "set_rows: f32 rows into f32/f16/bf16",
        ),
        Op::Cont => {
            let a = src(0)?;
            ok(
                float(a.dtype) || a.dtype == DType::I32 || a.rows_contiguous(),
                "cont: quantised rows must be dense",
            )
        }
        Op::Concat { .. } => ok(!src(0)?.dtype.is_quantized(), "concat: scalar dtypes only"),
        Op::MulMatId => {
            let (a, b, ids) = (src(0)?, src(1)?, src(2)?);
            let w_ok = match a.dtype {
                DType::F32 | DType::F16 | DType::BF16 => true,
                d => ops::mul_mat::quant_supported(d) && a.rows_contiguous(),
            };
            let shapes_ok = a.ne[0] == b.ne[0]
                && a.ne[2] > 0
                && a.ne[3] == 1
                && b.ne[1] > 0
                && b.ne[3] == 1
                && ids.ne[2] == 1
                && ids.ne[3] == 1
                && ids.ne[0] % b.ne[1] == 0
                && t.ne == [a.ne[1], ids.ne[0], ids.ne[1], 1]
                && b.ne[2] == ids.ne[1]
                && a.ne[2] <= i32::MAX as usize
                && ids.ne[0] * ids.ne[1] <= u32::MAX as usize;
            ok(
                w_ok && b.dtype == DType::F32
                    && ids.dtype == DType::I32
                    && ids.rows_contiguous()
                    && t.dtype == DType::F32
                    && shapes_ok,
                "mul_mat_id: weights as mul_mat, f32 b [K, B1, T], i32 ids [n_used, T] with contiguous rows",
            )
        }
        Op::FlashAttnExt { .. } => {
            let m_ok = match t.src[3] {
                Some(_) => f32_or_f16(src(3)?.dtype),
                None => true,
            };
            ok(
                src(0)?.dtype == DType::F32
                    && f32_or_f16(src(1)?.dtype)
                    && f32_or_f16(src(2)?.dtype)
                    && m_ok,
                "flash_attn_ext: f32 q, f16/f32 k and v",
            )
        }
    }
}

/// Whether the node runs a kernel (views and leaves do not).
fn runs(t: &Tensor) -> bool {
    !(t.op == Op::None || t.op.is_view())
}

/// Executes graphs on the queue thread.
pub(crate) struct Executor {
    kernels: &'static Kernels,
    name: Name,
    scratch: Option<Region>,
    views: Vec<TView>,
    regions: Vec<Arc<Region>>,
    clock: Arc<OpClock>,
    /// One chunk run per thread (see [`crate::runs`]).
    runs: Vec<RunSlot>,
}

// SAFETY: the raw pointers in `views` are only used on the thread that owns the executor
// and by pool threads during `compute`, which keeps the regions alive.
unsafe impl Send for Executor {}

struct Shared<'a> {
    tensors: &'a [Tensor],
    nodes: &'a [TensorId],
    views: &'a [TView],
    kernels: &'static Kernels,
    scratch: *mut u8,
    wsize: usize,
    tsize: usize,
    counters: [AtomicUsize; 2],
    runs: &'a [RunSlot],
    /// First phase in which an error occurred (usize::MAX: none).
    fail_phase: AtomicUsize,
    error: Mutex<Option<(usize, BackendErrorKind, &'static str)>>,
    /// With op timing on: thread 0's time of each node that ran, `(index in nodes, ms)`.
    node_ms: Option<Mutex<Vec<(usize, f64)>>>,
}

// SAFETY: `scratch` is partitioned between threads (see NodeCtx); the views point into
// regions kept alive by the executor for the duration of the job.
unsafe impl Sync for Shared<'_> {}

impl Executor {
    pub(crate) fn new(kernels: &'static Kernels, name: Name, clock: Arc<OpClock>) -> Executor {
        Executor {
            kernels,
            name,
            scratch: None,
            views: Vec::new(),
            regions: Vec::new(),
            clock,
            runs: Vec::new(),
        }
    }

    fn err(&self, kind: BackendErrorKind, detail: &'static str, t: &Tensor) -> BackendError {
        BackendError::new(kind, self.name, detail).at(t.op.name(), t.name)
    }

    /// Computes `nodes` of `tensors` with the pool; returns the first error.
    pub(crate) fn compute(
        &mut self,
        pool: &Pool,
        registry: &Registry,
        tensors: &[Tensor],
        nodes: &[TensorId],
    ) -> Result<(), BackendError> {
        let nth = pool.n_threads();
        // 1. Validate every node before running any.
        for &id in nodes {
            let t = tensors.get(id.index()).ok_or_else(|| {
                BackendError::new(
                    BackendErrorKind::InvalidArgument,
                    self.name,
                    "node id out of range",
                )
            })?;
            if let Err(why) = supports(tensors, id) {
                return Err(self.err(BackendErrorKind::UnsupportedOp, why, t));
            }
        }
        // 2. Resolve the bytes of every node that runs and of its operands.
        self.views.clear();
        self.views.resize(tensors.len(), TView::EMPTY);
        self.regions.clear();
        let mut wsize = 0usize;
        let mut tsize = 0usize;
        for &id in nodes {
            let t = &tensors[id.index()];
            if !runs(t) {
                continue;
            }
            for s in std::iter::once(Some(id))
                .chain(t.src.iter().copied())
                .flatten()
            {
                let st = &tensors[s.index()];
                if !self.views[s.index()].ptr.is_null() {
                    continue;
                }
                // A view without data of its own reads its root's bytes at view_offs.
                let view_data = || {
                    let root = tensors.get(st.view_src?.index())?.data?;
                    Some(ggml_core::DataRef {
                        buffer: root.buffer,
                        addr: root.addr.checked_add(st.view_offs as u64)?,
                    })
                };
                let d = st.data.or_else(view_data).ok_or_else(|| {
                    self.err(BackendErrorKind::InvalidArgument, "tensor has no data", st)
                })?;
                let (region, ptr) = resolve(registry, d, st.nbytes())
                    .map_err(|why| self.err(BackendErrorKind::InvalidArgument, why, st))?;
                if s == id && !region.writable() {
                    return Err(self.err(
                        BackendErrorKind::InvalidArgument,
                        "destination is read-only",
                        st,
                    ));
                }
                if !self.regions.iter().any(|r| Arc::ptr_eq(r, &region)) {
                    self.regions.push(region);
                }
                self.views[s.index()] = TView {
                    dtype: st.dtype,
                    ne: st.ne,
                    nb: st.nb,
                    ptr,
                };
            }
            let (w, th) = ops::scratch_size(t, tensors, nth);
            wsize = wsize.max(w);
            tsize = tsize.max(th);
        }
        let round = |n: usize| n.div_ceil(64) * 64;
        let (wsize, tsize) = (round(wsize), round(tsize.max(64)));
        let need = wsize + tsize * nth;
        if self.scratch.as_ref().is_none_or(|s| s.len() < need) {
            self.scratch = Some(Region::alloc(need.next_power_of_two()).ok_or_else(|| {
                BackendError::new(
                    BackendErrorKind::OutOfMemory,
                    self.name,
                    "scratch allocation failed",
                )
            })?);
        }
        let scratch = self.scratch.as_ref().expect("allocated above");
        self.runs.resize_with(nth, RunSlot::default);
        self.runs.iter_mut().for_each(RunSlot::reset);
        let shared = Shared {
            tensors,
            nodes,
            views: &self.views,
            kernels: self.kernels,
            scratch: scratch.ptr_at(scratch.base(), need).expect("scratch fits"),
            wsize,
            tsize,
            counters: [AtomicUsize::new(0), AtomicUsize::new(0)],
            runs: &self.runs[..nth],
            fail_phase: AtomicUsize::new(usize::MAX),
            error: Mutex::new(None),
            node_ms: self.clock.is_on().then(|| Mutex::new(Vec::new())),
        };
        // 3. Run: every thread walks the nodes; a barrier ends each phase of each node.
        pool.run(&|th| run_nodes(&shared, th));
        self.regions.clear();
        if let Some(times) = shared.node_ms {
            let times = times.into_inner().unwrap_or_else(|e| e.into_inner());
            let mut sums = self.clock.lock();
            for (ni, ms) in times {
                if let Some(key) = ggml_core::OpTime::key_of(tensors, nodes[ni]) {
                    let t = sums.entry(key).or_default();
                    t.0 += 1;
                    t.1 += ms;
                }
            }
        }
        let e = shared
            .error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match e {
            Some((node, kind, why)) => Err(self.err(kind, why, &tensors[nodes[node].index()])),
            None => Ok(()),
        }
    }
}

fn run_nodes(s: &Shared<'_>, th: &ThreadCtx<'_>) {
    // Op timing: thread 0 reads the clock after each node's last barrier.
    let mut clock =
        (th.ith == 0 && s.node_ms.is_some()).then(|| (std::time::Instant::now(), Vec::new()));
    run_nodes_timed(s, th, &mut clock);
    if let (Some((_, times)), Some(all)) = (clock, &s.node_ms) {
        all.lock().unwrap_or_else(|e| e.into_inner()).extend(times);
    }
}

fn run_nodes_timed(
    s: &Shared<'_>,
    th: &ThreadCtx<'_>,
    clock: &mut Option<(std::time::Instant, Vec<(usize, f64)>)>,
) {
    let mut phase = 0usize;
    let mut in_scratch: Option<ConvertedActivations> = None;
    for (ni, &id) in s.nodes.iter().enumerate() {
        let t = &s.tensors[id.index()];
        if !runs(t) {
            continue;
        }
        let mut src = [TView::EMPTY; 4];
        let mut alias = [false; 4];
        let dst = s.views[id.index()];
        let dspan = dst.span();
        for (i, sid) in t.src.iter().enumerate() {
            if let Some(sid) = sid {
                src[i] = s.views[sid.index()];
                let sp = src[i].span();
                alias[i] = sp.0 < dspan.1 && dspan.0 < sp.1;
            }
        }
        let converted;
        (converted, in_scratch) = ConvertedActivations::step(in_scratch, t, &src, dst);
        let ctx = NodeCtx {
            k: s.kernels,
            node: t,
            dst,
            src,
            alias,
            converted,
            wdata: s.scratch,
            // SAFETY: inside the scratch allocation (wsize + tsize * nth bytes).
            tdata: unsafe { s.scratch.add(s.wsize + th.ith * s.tsize) },
            tsize: s.tsize,
            chunk: &s.counters[0],
            runs: Runs::new(s.runs, 0),
        };
        for p in 0..ops::phases(t) {
            let ctx = NodeCtx {
                chunk: &s.counters[phase % 2],
                runs: Runs::new(s.runs, phase),
                ..ctx
            };
            if th.ith == 0 {
                s.counters[(phase + 1) % 2].store(0, Ordering::Relaxed);
            }
            ctx.runs.reset_next(th.ith);
            if s.fail_phase.load(Ordering::Relaxed) == usize::MAX {
                let r = catch_unwind(AssertUnwindSafe(|| ops::run(&ctx, th, p))).unwrap_or(Err((
                    BackendErrorKind::Device,
                    "kernel panicked (bug in ggml-cpu)",
                )));
                if let Err((kind, why)) = r {
                    let mut e = s.error.lock().unwrap_or_else(|e| e.into_inner());
                    if e.is_none() {
                        *e = Some((ni, kind, why));
                    }
                    s.fail_phase.fetch_min(phase, Ordering::Relaxed);
                }
            }
            th.barrier();
            // Errors of this phase or earlier are visible to all after the barrier; stop
            // consistently on all threads.
            if s.fail_phase.load(Ordering::Relaxed) <= phase {
                return;
            }
            phase += 1;
        }
        if let Some((since, times)) = clock {
            let now = std::time::Instant::now();
            times.push((ni, (now - *since).as_secs_f64() * 1e3));
            *since = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dense view of `ne` f32 (or `dtype`) values at the fake address `at`.
    fn view(dtype: DType, ne: [usize; MAX_DIMS], at: usize) -> TView {
        let t = Tensor::contiguous(dtype, ne).unwrap();
        TView {
            dtype,
            ne,
            nb: t.nb,
            ptr: at as *mut u8,
        }
    }

    fn node(op: Op) -> Tensor {
        let mut t = Tensor::contiguous(DType::F32, [8, 4, 1, 1]).unwrap();
        t.op = op;
        t
    }

    const X: usize = 0x10000;

    /// The sources of a product of weights `w` ([64, 8]) and activations at `at`.
    fn product(w: DType, at: usize) -> [TView; 4] {
        [
            view(w, [64, 8, 1, 1], 0x90000),
            view(DType::F32, [64, 4, 1, 1], at),
            TView::EMPTY,
            TView::EMPTY,
        ]
    }

    /// Walks `nodes` (op, sources, destination) as the executor does; whether each skips
    /// its conversion.
    fn walk(nodes: &[(Op, [TView; 4], TView)]) -> Vec<bool> {
        let mut held = None;
        nodes
            .iter()
            .map(|(op, src, dst)| {
                let skip;
                (skip, held) = ConvertedActivations::step(held, &node(*op), src, *dst);
                skip
            })
            .collect()
    }

    #[test]
    fn products_of_one_activation_convert_it_once() {
        let out = |i: usize| view(DType::F32, [8, 4, 1, 1], 0x40000 + i * 0x1000);
        let between = (Op::Add, [TView::EMPTY; 4], out(9));
        let q = (Op::MulMat, product(DType::Q4_1, X), out(0));
        let k = (Op::MulMat, product(DType::Q4_1, X), out(1));
        // Q, K and V of one norm, a node that writes elsewhere between them: converted
        // once.
        assert_eq!(walk(&[q, between, k, k]), [false, false, true, true]);
        // Another weight dtype needs its own conversion (Q8_0's dot type differs).
        let v8 = (Op::MulMat, product(DType::Q8_0, X), out(2));
        assert_eq!(walk(&[q, v8, k]), [false, false, false]);
        // Another product in between overwrites the scratch.
        let other = (Op::MulMat, product(DType::Q4_1, 0x20000), out(3));
        assert_eq!(walk(&[q, other, k]), [false, false, false]);
        // MUL_MAT_ID uses the scratch too.
        let moe = (Op::MulMatId, [TView::EMPTY; 4], out(4));
        assert_eq!(walk(&[q, moe, k]), [false, false, false]);
        // Float weights gather into the scratch and convert nothing: never reused.
        let f16 = (Op::MulMat, product(DType::F16, X), out(5));
        assert_eq!(walk(&[f16, f16]), [false, false]);
    }

    #[test]
    fn a_write_into_the_activations_forces_a_new_conversion() {
        let q = (Op::MulMat, product(DType::Q4_1, X), out_at(0x40000));
        // Its last byte: the activations span 64 * 4 f32 from X.
        let last = (
            Op::Add,
            [TView::EMPTY; 4],
            view(DType::F32, [1, 1, 1, 1], X + 1020),
        );
        let before = (
            Op::Add,
            [TView::EMPTY; 4],
            view(DType::F32, [4, 1, 1, 1], X - 16),
        );
        let after = (
            Op::Add,
            [TView::EMPTY; 4],
            view(DType::F32, [4, 1, 1, 1], X + 1024),
        );
        assert_eq!(walk(&[q, last, q]), [false, false, false]);
        assert_eq!(walk(&[q, before, after, q]), [false, false, false, true]);
    }

    fn out_at(at: usize) -> TView {
        view(DType::F32, [8, 4, 1, 1], at)
    }
}
