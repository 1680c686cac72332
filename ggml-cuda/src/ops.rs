//! Which ops the CUDA backend runs (`check`) and how each is launched (`run`).

use std::sync::atomic::Ordering;

use ggml_core::{
    BackendError, BackendErrorKind, BackendResult, DType, Op, RopeMode, Tensor, TensorId,
};

use crate::backend::{CudaBackend, State};
use crate::driver::Api;
use crate::kernels::KernelId;
use crate::launch::{self, Args, LaunchDims, MulMatClass, MMQ_MIN_N};
use crate::qmm;

mod products;
use crate::reference::{is_kernel_quant, Q8_1_BLOCK};

/// Element type code of the elementwise kernels: 0 f32, 1 f16, 2 bf16, 3 i32.
fn tcode(d: DType) -> Option<u32> {
    match d {
        DType::F32 => Some(0),
        DType::F16 => Some(1),
        DType::BF16 => Some(2),
        DType::I32 => Some(3),
        _ => None,
    }
}

fn float_code(d: DType) -> Option<u32> {
    tcode(d).filter(|&c| c != 3)
}

/// Weight dtypes of `mul_mat_f` (the others go through Q8_1 and the quantised kernels).
fn is_float_weight(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

fn fits_u32(t: &Tensor) -> bool {
    t.ne.iter().all(|&n| n <= u32::MAX as usize) && t.nelements() <= u32::MAX as usize
}

fn src(tensors: &[Tensor], t: &Tensor, i: usize) -> Result<Tensor, &'static str> {
    let id = t.src[i].ok_or("missing source operand")?;
    tensors
        .get(id.index())
        .copied()
        .ok_or("source id out of range")
}

fn unit_stride(t: &Tensor) -> bool {
    t.ne[0] <= 1 || t.nb[0] == t.dtype.type_size()
}

/// Whether the backend runs `node`; the error says why not.
pub(crate) fn check(tensors: &[Tensor], node: TensorId) -> Result<(), &'static str> {
    let t = tensors.get(node.index()).ok_or("node id out of range")?;
    if t.op.is_view() || t.op == Op::None {
        return Ok(());
    }
    if !fits_u32(t) {
        return Err("dimensions beyond 2^32 elements");
    }
    match t.op {
        Op::GetRows => {
            let a = src(tensors, t, 0)?;
            let idx = src(tensors, t, 1)?;
            let ok_dtype = float_code(a.dtype).is_some() || is_kernel_quant(a.dtype);
            if !ok_dtype || idx.dtype != DType::I32 || t.dtype != DType::F32 || !unit_stride(t) {
                return Err("get_rows: source dtype without a CUDA kernel");
            }
            launch::get_rows(a.dtype.is_quantized(), t.ne[0], t.ne[1], t.ne[2] * t.ne[3])
                .map(|_| ())
                .ok_or("get_rows: grid too large")
        }
        Op::Add | Op::Mul | Op::Div => {
            let a = src(tensors, t, 0)?;
            let b = src(tensors, t, 1)?;
            if float_code(a.dtype).is_none()
                || float_code(b.dtype).is_none()
                || float_code(t.dtype).is_none()
            {
                return Err("add/mul/div: dtypes must be f32, f16 or bf16");
            }
            Ok(())
        }
        Op::Clamp { .. } => {
            let a = src(tensors, t, 0)?;
            (a.dtype == DType::F32 && t.dtype == DType::F32)
                .then_some(())
                .ok_or("clamp: f32 only")
        }
        Op::SumRows => {
            let a = src(tensors, t, 0)?;
            if a.dtype != DType::F32 || t.dtype != DType::F32 || t.ne[0] != 1 {
                return Err("sum_rows: f32 rows to an f32 column");
            }
            if a.ne[1..] != t.ne[1..] || !fits_u32(&a) {
                return Err("sum_rows: result shape must be [1, a.ne[1], a.ne[2], a.ne[3]]");
            }
            launch::sum_rows(t.nrows())
                .map(|_| ())
                .ok_or("sum_rows: too many rows")
        }
        Op::Argmax => {
            let a = src(tensors, t, 0)?;
            if a.dtype != DType::F32 || t.dtype != DType::I32 || t.ne[0] != 1 || a.ne[0] == 0 {
                return Err("argmax: f32 rows of at least one value to an i32 column");
            }
            if a.ne[1..] != t.ne[1..] || !fits_u32(&a) {
                return Err("argmax: result shape must be [1, a.ne[1], a.ne[2], a.ne[3]]");
            }
            launch::argmax(t.nrows())
                .map(|_| ())
                .ok_or("argmax: too many rows")
        }
        Op::ArgsortTopK { k } => {
            let a = src(tensors, t, 0)?;
            let k = k as usize;
            if a.dtype != DType::F32 || t.dtype != DType::I32 || !unit_stride(t) {
                return Err("argsort_top_k: f32 rows to i32 indices with unit element stride");
            }
            if k == 0 || k > a.ne[0] || t.ne[0] != k || a.ne[1..] != t.ne[1..] || !fits_u32(&a) {
                return Err("argsort_top_k: result must be [k, a.ne[1..]] with 1 <= k <= n");
            }
            launch::argsort_top_k(a.ne[0], t.nrows())
                .map(|_| ())
                .ok_or("argsort_top_k: rows longer than 6144 values (the keys fill shared memory)")
        }
        Op::MulMatId => {
            let a = src(tensors, t, 0)?;
            let b = src(tensors, t, 1)?;
            let ids = src(tensors, t, 2)?;
            if b.dtype != DType::F32
                || ids.dtype != DType::I32
                || t.dtype != DType::F32
                || !unit_stride(t)
                || !unit_stride(&a)
            {
                return Err(
                    "mul_mat_id: f32 activations and output, i32 ids, weight rows contiguous",
                );
            }
            let shapes_ok = a.ne[0] == b.ne[0]
                && a.ne[2] > 0
                && a.ne[3] == 1
                && b.ne[1] > 0
                && b.ne[3] == 1
                && ids.ne[2] == 1
                && ids.ne[3] == 1
                && ids.ne[0] % b.ne[1] == 0
                && b.ne[2] == ids.ne[1]
                && t.ne == [a.ne[1], ids.ne[0], ids.ne[1], 1];
            if !shapes_ok {
                return Err(
                    "mul_mat_id: as [K, M, n_as], b [K, B1, T], ids [n_used, T], n_used % B1 == 0",
                );
            }
            if !fits_u32(&a) || !fits_u32(&b) || !fits_u32(&ids) {
                return Err("mul_mat_id: operands beyond 2^32 elements");
            }
            let grid = launch::mul_mat_id(t.ne[0], t.ne[1], t.ne[2]);
            if is_float_weight(a.dtype) {
                return grid
                    .map(|_| ())
                    .ok_or("mul_mat_id: grid too large (n_used or T > 65535)");
            }
            if !is_kernel_quant(a.dtype) {
                return Err("mul_mat_id: weight dtype without a CUDA kernel");
            }
            if !unit_stride(&b) {
                return Err(
                    "mul_mat_id: quantised weights need activations with unit element stride",
                );
            }
            grid.and(launch::quantize_q8_1(b.ne[0], b.ne[1], b.ne[2]))
                .map(|_| ())
                .ok_or("mul_mat_id: grid too large (n_used or T > 65535)")
        }
        Op::Scale { .. } => {
            let a = src(tensors, t, 0)?;
            if float_code(a.dtype).is_none() || a.dtype != t.dtype {
                return Err("scale: dtype must be f32, f16 or bf16");
            }
            Ok(())
        }
        Op::Silu | Op::Swiglu | Op::Gelu | Op::Geglu => {
            let n_src = if matches!(t.op, Op::Silu | Op::Gelu) {
                1
            } else {
                2
            };
            for i in 0..n_src {
                if src(tensors, t, i)?.dtype != DType::F32 {
                    return Err("silu/swiglu/gelu/geglu: f32 only");
                }
            }
            (t.dtype == DType::F32)
                .then_some(())
                .ok_or("silu/swiglu/gelu/geglu: f32 only")
        }
        Op::RmsNorm { .. } => {
            let a = src(tensors, t, 0)?;
            if a.dtype != DType::F32 || !unit_stride(&a) || !unit_stride(t) {
                return Err("rms_norm: f32 rows with unit element stride");
            }
            launch::warp_per_row(t.nrows())
                .map(|_| ())
                .ok_or("rms_norm: too many rows")
        }
        Op::SoftMax { .. } => {
            let a = src(tensors, t, 0)?;
            if a.dtype != DType::F32 || !unit_stride(&a) || !unit_stride(t) {
                return Err("soft_max: f32 rows with unit element stride");
            }
            if let Some(m) = t.src[1] {
                let m = tensors.get(m.index()).ok_or("mask id out of range")?;
                if !matches!(m.dtype, DType::F32 | DType::F16) || !unit_stride(m) {
                    return Err("soft_max: mask must be f32/f16 with unit element stride");
                }
            }
            launch::warp_per_row(t.nrows())
                .map(|_| ())
                .ok_or("soft_max: too many rows")
        }
        Op::Rope(_) => {
            let a = src(tensors, t, 0)?;
            if !matches!(a.dtype, DType::F32 | DType::F16) || a.dtype != t.dtype {
                return Err("rope: f32 or f16");
            }
            launch::rope(t.ne)
                .map(|_| ())
                .ok_or("rope: head too large or grid too large")
        }
        Op::Cpy => {
            let a = src(tensors, t, 0)?;
            if float_code(a.dtype).is_none() || float_code(t.dtype).is_none() {
                return Err("cpy: only f32/f16/bf16 conversions (no quantising copies)");
            }
            Ok(())
        }
        Op::SetRows => {
            let a = src(tensors, t, 0)?;
            let idx = src(tensors, t, 1)?;
            if a.dtype != DType::F32 || idx.dtype != DType::I32 || float_code(t.dtype).is_none() {
                return Err("set_rows: f32 rows into f32, f16 or bf16");
            }
            if !unit_stride(t) {
                return Err("set_rows: destination rows must be contiguous");
            }
            launch::get_rows(false, t.ne[0], a.ne[1], 1)
                .map(|_| ())
                .ok_or("set_rows: grid too large")
        }
        Op::Cont => {
            let a = src(tensors, t, 0)?;
            let same = tcode(a.dtype).is_some() && a.dtype == t.dtype;
            let cast = float_code(a.dtype).is_some() && float_code(t.dtype).is_some();
            (same || cast)
                .then_some(())
                .ok_or("cont: f32, f16, bf16 or i32, or a cast between f32, f16 and bf16")
        }
        Op::Concat { .. } => {
            let a = src(tensors, t, 0)?;
            let b = src(tensors, t, 1)?;
            (tcode(a.dtype).is_some() && a.dtype == b.dtype && a.dtype == t.dtype)
                .then_some(())
                .ok_or("concat: f32, f16, bf16 or i32 only")
        }
        Op::MulMat => {
            let a = src(tensors, t, 0)?;
            let b = src(tensors, t, 1)?;
            if b.dtype != DType::F32 || t.dtype != DType::F32 || !unit_stride(t) || !unit_stride(&a)
            {
                return Err("mul_mat: f32 activations and output, weight rows contiguous");
            }
            if !fits_u32(&a) || !fits_u32(&b) {
                return Err("mul_mat: operands beyond 2^32 elements");
            }
            let batch = t.ne[2] * t.ne[3];
            if is_float_weight(a.dtype) {
                return launch::mul_mat(None, t.ne[0], t.ne[1], batch)
                    .map(|_| ())
                    .ok_or("mul_mat: grid too large (N > 65535)");
            }
            if !is_kernel_quant(a.dtype) {
                return Err("mul_mat: weight dtype without a CUDA kernel");
            }
            if !unit_stride(&b) {
                return Err("mul_mat: quantised weights need activations with unit element stride");
            }
            let class = launch::mul_mat_class(t.ne[1]);
            launch::mul_mat(Some(class), t.ne[0], t.ne[1], batch)
                .and(launch::quantize_q8_1(b.ne[0], b.ne[1], batch))
                .map(|_| ())
                .ok_or("mul_mat: grid too large")
        }
        Op::FlashAttnExt { .. } => {
            let q = src(tensors, t, 0)?;
            let k = src(tensors, t, 1)?;
            let v = src(tensors, t, 2)?;
            if q.dtype != DType::F32 || !unit_stride(&q) || !t.is_contiguous() {
                return Err("flash_attn_ext: f32 q with unit stride, contiguous output");
            }
            for x in [&k, &v] {
                if !matches!(x.dtype, DType::F32 | DType::F16) || !unit_stride(x) {
                    return Err("flash_attn_ext: k/v must be f32/f16 with unit element stride");
                }
            }
            if let Some(m) = t.src[3] {
                let m = tensors.get(m.index()).ok_or("mask id out of range")?;
                if !matches!(m.dtype, DType::F32 | DType::F16) || !unit_stride(m) {
                    return Err("flash_attn_ext: mask must be f32/f16 with unit element stride");
                }
            }
            launch::flash_attn(q.ne[0], v.ne[0], q.ne[2], q.ne[1], q.ne[3])
                .ok_or("flash_attn_ext: head size above 256 or grid too large")?;
            if q.ne[1] < MMQ_MIN_N {
                let (d, dv, h, n_q, ne3) = (q.ne[0], v.ne[0], q.ne[2], q.ne[1], q.ne[3]);
                launch::flash_attn_dec(d, dv, h, k.ne[2], n_q, k.ne[1], ne3)
                    .ok_or("flash_attn_ext: decode grid too large")?;
            }
            Ok(())
        }
        _ => Err("op has no CUDA kernel"),
    }
}

/// ALiBi bases as ggml computes them: (m0, m1, n_head_log2).
fn alibi(max_bias: f32, n_head: usize) -> (f32, f32, u32) {
    let n_head_log2 = 1u32 << (usize::BITS - 1 - n_head.max(1).leading_zeros());
    let m0 = 2f32.powf(-max_bias / n_head_log2 as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32);
    (m0, m1, n_head_log2)
}

struct Ctx<'a> {
    be: &'a CudaBackend,
    st: &'a mut State,
    tensors: &'a [Tensor],
    node: &'a Tensor,
}

impl Ctx<'_> {
    fn op(&self) -> &'static str {
        self.node.op.name()
    }

    fn fail(&self, kind: BackendErrorKind, detail: &'static str) -> BackendError {
        self.be.err(kind, detail).at(self.op(), self.node.name)
    }

    fn src(&self, i: usize) -> BackendResult<Tensor> {
        self.src_of(self.node, i)
    }

    /// Operand `i` of `t`.
    fn src_of(&self, t: &Tensor, i: usize) -> BackendResult<Tensor> {
        src(self.tensors, t, i).map_err(|d| self.fail(BackendErrorKind::InvalidArgument, d))
    }

    /// Device address of `t` with its whole byte span checked against its buffer.
    fn addr(&self, t: &Tensor) -> BackendResult<u64> {
        self.be
            .tensor_range(self.st, t, 0, t.nbytes())
            .map_err(|e| e.at(self.op(), self.node.name))
    }

    fn launch(&mut self, k: KernelId, d: LaunchDims, args: &mut Args) -> BackendResult<()> {
        let dev = &self.be.dev;
        let f = dev.kernels.get(k);
        let fail = |e: crate::driver::CuError| self.be.cu(e).at(self.op(), self.node.name);
        if d.shared > launch::DEFAULT_MAX_SHARED {
            // launch::flash_attn keeps the request within the device limit.
            self.be
                .api()
                .func_set_max_dynamic_shared(f, d.shared)
                .map_err(fail)?;
        }
        // The argument list matches the kernel's .param list as documented in its PTX
        // header (cuda-sim checks it at every launch); every pointer argument was
        // range-checked.
        // While recording, each launch carries its index in the record as its tag, so
        // cuda-sim's profile of it can be joined with the record.
        let tag = self.st.recorded.as_ref().map(|r| r.len() as u64);
        if tag.is_some() {
            self.be.api().set_launch_tag(self.be.stream, tag);
        }
        self.be
            .api()
            .launch(f, &d, self.be.stream, args)
            .map_err(fail)?;
        self.be.launches[k as usize].fetch_add(1, Ordering::Relaxed);
        if self.st.recorded.is_some() {
            let weights = match self.node.op {
                Op::MulMat | Op::MulMatId => self.node.src[0]
                    .and_then(|s| self.tensors.get(s.index()))
                    .map(|w| w.dtype.name()),
                _ => None,
            };
            let macs = crate::replay::node_macs(self.tensors, self.node, k);
            self.st
                .record(k, (self.op(), weights), self.node.name, d, macs, args);
        }
        Ok(())
    }
}

impl Ctx<'_> {
    /// Launches `qmm` for `call`.
    fn launch_qmm(&mut self, call: &qmm::Call) -> BackendResult<()> {
        let d = dims(call.dims(), self)?;
        let mut a = call.args().ok_or_else(|| {
            self.fail(
                BackendErrorKind::UnsupportedOp,
                "shape outside the kernel's launch limits",
            )
        })?;
        self.launch(KernelId::Qmm, d, &mut a)
    }
}

fn dims(d: Option<LaunchDims>, c: &Ctx<'_>) -> BackendResult<LaunchDims> {
    d.ok_or_else(|| {
        c.fail(
            BackendErrorKind::UnsupportedOp,
            "shape outside the kernel's launch limits",
        )
    })
}

fn strides(a: &mut Args, nb: &[usize]) {
    for &s in nb {
        a.usize(s);
    }
}

/// Enqueues the kernels of `id` on the backend's stream.
pub(crate) fn run(
    be: &CudaBackend,
    st: &mut State,
    tensors: &[Tensor],
    id: TensorId,
) -> BackendResult<()> {
    let node = tensors
        .get(id.index())
        .ok_or_else(|| be.err(BackendErrorKind::InvalidArgument, "node id out of range"))?;
    if node.op.is_view() || node.op == Op::None || node.nelements() == 0 {
        return Ok(());
    }
    check(tensors, id).map_err(|d| {
        be.err(BackendErrorKind::UnsupportedOp, d)
            .at(node.op.name(), node.name)
    })?;
    let mut c = Ctx {
        be,
        st,
        tensors,
        node,
    };
    let t = *node;
    let mut a = Args::new();
    match t.op {
        Op::GetRows => {
            let err_word = be.err_slot(c.st, t.op.name(), t.name);
            let s = c.src(0)?;
            let idx = c.src(1)?;
            let quant = s.dtype.is_quantized();
            let d = dims(
                launch::get_rows(quant, t.ne[0], t.ne[1], t.ne[2] * t.ne[3]),
                &c,
            )?;
            a.u64(c.addr(&s)?)
                .u64(c.addr(&idx)?)
                .u64(c.addr(&t)?)
                .u64(err_word);
            if quant {
                a.u32(s.dtype.ggml_id()).u32((t.ne[0] / 32) as u32);
            } else {
                a.u32(float_code(s.dtype).unwrap_or(0)).u32(t.ne[0] as u32);
            }
            a.u32(s.ne[1] as u32)
                .u32(s.ne[2] as u32)
                .u32(s.ne[3] as u32);
            if quant {
                strides(&mut a, &s.nb[1..]);
            } else {
                strides(&mut a, &s.nb);
            }
            strides(&mut a, &idx.nb[..3]);
            strides(&mut a, &t.nb[1..]);
            let k = if quant {
                KernelId::GetRowsQ
            } else {
                KernelId::GetRowsF
            };
            c.launch(k, d, &mut a)
        }
        Op::Add | Op::Mul | Op::Div => {
            let x = c.src(0)?;
            let y = c.src(1)?;
            let d = dims(launch::elementwise(t.nelements()), &c)?;
            a.u64(c.addr(&x)?).u64(c.addr(&y)?).u64(c.addr(&t)?);
            a.u32(match t.op {
                Op::Add => 0,
                Op::Mul => 1,
                _ => 2,
            });
            for dt in [x.dtype, y.dtype, t.dtype] {
                a.u32(float_code(dt).unwrap_or(0));
            }
            a.u32(t.nelements() as u32);
            for i in 0..3 {
                a.u32(x.ne[i] as u32);
            }
            for i in 0..4 {
                a.u32(y.ne[i] as u32);
            }
            strides(&mut a, &x.nb);
            strides(&mut a, &y.nb);
            strides(&mut a, &t.nb);
            c.launch(KernelId::Binary, d, &mut a)
        }
        Op::Scale { scale } => {
            let x = c.src(0)?;
            let d = dims(launch::elementwise(t.nelements()), &c)?;
            a.u64(c.addr(&x)?)
                .u64(c.addr(&t)?)
                .u32(float_code(t.dtype).unwrap_or(0))
                .f32(scale);
            a.u32(t.nelements() as u32)
                .u32(t.ne[0] as u32)
                .u32(t.ne[1] as u32)
                .u32(t.ne[2] as u32);
            strides(&mut a, &x.nb);
            strides(&mut a, &t.nb);
            c.launch(KernelId::Scale, d, &mut a)
        }
        Op::Clamp { min, max } => {
            let x = c.src(0)?;
            let d = dims(launch::elementwise(t.nelements()), &c)?;
            a.u64(c.addr(&x)?).u64(c.addr(&t)?).f32(min).f32(max);
            a.u32(t.nelements() as u32)
                .u32(t.ne[0] as u32)
                .u32(t.ne[1] as u32)
                .u32(t.ne[2] as u32);
            strides(&mut a, &x.nb);
            strides(&mut a, &t.nb);
            c.launch(KernelId::Clamp, d, &mut a)
        }
        Op::SumRows => {
            let x = c.src(0)?;
            let d = dims(launch::sum_rows(t.nrows()), &c)?;
            a.u64(c.addr(&x)?).u64(c.addr(&t)?);
            a.u32(x.ne[0] as u32)
                .u32(t.nrows() as u32)
                .u32(t.ne[1] as u32)
                .u32(t.ne[2] as u32);
            strides(&mut a, &x.nb);
            strides(&mut a, &t.nb[1..]);
            c.launch(KernelId::SumRows, d, &mut a)
        }
        Op::Argmax => {
            let x = c.src(0)?;
            let d = dims(launch::argmax(t.nrows()), &c)?;
            a.u64(c.addr(&x)?).u64(c.addr(&t)?);
            a.u32(x.ne[0] as u32)
                .u32(t.ne[1] as u32)
                .u32(t.ne[2] as u32);
            strides(&mut a, &x.nb);
            strides(&mut a, &t.nb[1..]);
            c.launch(KernelId::Argmax, d, &mut a)
        }
        Op::ArgsortTopK { k } => {
            let x = c.src(0)?;
            let d = dims(launch::argsort_top_k(x.ne[0], t.nrows()), &c)?;
            a.u64(c.addr(&x)?).u64(c.addr(&t)?);
            a.u32(x.ne[0] as u32)
                .u32(k)
                .u32(t.ne[1] as u32)
                .u32(t.ne[2] as u32);
            strides(&mut a, &x.nb);
            strides(&mut a, &t.nb[1..]);
            c.launch(KernelId::ArgsortTopK, d, &mut a)
        }
        Op::Silu | Op::Swiglu | Op::Gelu | Op::Geglu => {
            let d = dims(launch::elementwise(t.nelements()), &c)?;
            let x = c.src(0)?;
            a.u64(c.addr(&x)?);
            let y = if matches!(t.op, Op::Swiglu | Op::Geglu) {
                Some(c.src(1)?)
            } else {
                None
            };
            if let Some(y) = &y {
                a.u64(c.addr(y)?);
            }
            a.u64(c.addr(&t)?);
            a.u32(t.nelements() as u32)
                .u32(t.ne[0] as u32)
                .u32(t.ne[1] as u32)
                .u32(t.ne[2] as u32);
            strides(&mut a, &x.nb);
            if let Some(y) = &y {
                strides(&mut a, &y.nb);
            }
            strides(&mut a, &t.nb);
            let k = match t.op {
                Op::Silu => KernelId::Silu,
                Op::Swiglu => KernelId::Swiglu,
                Op::Gelu => KernelId::Gelu,
                _ => KernelId::Geglu,
            };
            c.launch(k, d, &mut a)
        }
        Op::RmsNorm { eps } => {
            let x = c.src(0)?;
            let d = dims(launch::warp_per_row(t.nrows()), &c)?;
            a.u64(c.addr(&x)?).u64(c.addr(&t)?);
            a.u32(t.ne[0] as u32)
                .u32(t.nrows() as u32)
                .u32(t.ne[1] as u32)
                .u32(t.ne[2] as u32)
                .f32(eps);
            strides(&mut a, &x.nb[1..]);
            strides(&mut a, &t.nb[1..]);
            c.launch(KernelId::RmsNorm, d, &mut a)
        }
        Op::SoftMax { scale, max_bias } => {
            let x = c.src(0)?;
            let mask = match t.src[1] {
                Some(_) => Some(c.src(1)?),
                None => None,
            };
            let d = dims(launch::warp_per_row(t.nrows()), &c)?;
            let (m0, m1, nhl2) = alibi(max_bias, x.ne[2]);
            a.u64(c.addr(&x)?);
            a.u64(match &mask {
                Some(m) => c.addr(m)?,
                None => 0,
            });
            a.u64(c.addr(&t)?);
            a.u32(match &mask {
                Some(m) if m.dtype == DType::F16 => 1,
                Some(_) => 0,
                None => 2,
            });
            a.u32(t.ne[0] as u32)
                .u32(t.nrows() as u32)
                .u32(t.ne[1] as u32)
                .u32(t.ne[2] as u32);
            a.f32(scale).f32(max_bias).f32(m0).f32(m1).u32(nhl2);
            let (mne, mnb) = match &mask {
                Some(m) => ([m.ne[2], m.ne[3]], [m.nb[1], m.nb[2], m.nb[3]]),
                None => ([1, 1], [0, 0, 0]),
            };
            a.u32(mne[0] as u32).u32(mne[1] as u32);
            strides(&mut a, &x.nb[1..]);
            strides(&mut a, &mnb);
            strides(&mut a, &t.nb[1..]);
            c.launch(KernelId::SoftMax, d, &mut a)
        }
        Op::Rope(p) => {
            let x = c.src(0)?;
            let pos = c.src(1)?;
            let d = dims(launch::rope(t.ne), &c)?;
            // The same constants the host mirror takes (reference::rope_row).
            let rc = crate::reference::RopeConsts::new(&p);
            a.u64(c.addr(&x)?).u64(c.addr(&pos)?).u64(c.addr(&t)?);
            a.u32(float_code(t.dtype).unwrap_or(0))
                .u32(t.ne[0] as u32)
                .u32(p.n_dims);
            a.u32(match p.mode {
                RopeMode::Normal => 0,
                RopeMode::Neox => 2,
            });
            a.f32(rc.theta_scale)
                .f32(rc.freq_scale)
                .f32(rc.ext_factor)
                .f32(rc.mscale)
                .f32(rc.corr[0])
                .f32(rc.corr[1]);
            strides(&mut a, &x.nb);
            a.usize(pos.nb[0]);
            strides(&mut a, &t.nb);
            c.launch(KernelId::Rope, d, &mut a)
        }
        Op::Cpy | Op::Cont => {
            let x = c.src(0)?;
            if x.nelements() != t.nelements() {
                return Err(c.fail(BackendErrorKind::InvalidArgument, "element counts differ"));
            }
            let d = dims(launch::elementwise(t.nelements()), &c)?;
            a.u64(c.addr(&x)?).u64(c.addr(&t)?);
            a.u32(tcode(x.dtype).unwrap_or(0))
                .u32(tcode(t.dtype).unwrap_or(0))
                .u32(t.nelements() as u32);
            a.u32(x.ne[0] as u32)
                .u32(x.ne[1] as u32)
                .u32(x.ne[2] as u32);
            strides(&mut a, &x.nb);
            a.u32(t.ne[0] as u32)
                .u32(t.ne[1] as u32)
                .u32(t.ne[2] as u32);
            strides(&mut a, &t.nb);
            c.launch(KernelId::Cpy, d, &mut a)
        }
        Op::SetRows => {
            let err_word = be.err_slot(c.st, t.op.name(), t.name);
            let s = c.src(0)?;
            let idx = c.src(1)?;
            // The row grid of get_rows fits: one block row per source row.
            let d = dims(launch::get_rows(false, t.ne[0], s.ne[1], 1), &c)?;
            a.u64(c.addr(&s)?)
                .u64(c.addr(&idx)?)
                .u64(c.addr(&t)?)
                .u64(err_word);
            a.u32(float_code(t.dtype).unwrap_or(0))
                .u32(t.ne[0] as u32)
                .u32(t.ne[1] as u32);
            strides(&mut a, &s.nb[..2]);
            strides(&mut a, &idx.nb[..1]);
            strides(&mut a, &t.nb[1..2]);
            c.launch(KernelId::SetRows, d, &mut a)
        }
        Op::Concat { dim } => {
            let x = c.src(0)?;
            let y = c.src(1)?;
            let d = dims(launch::elementwise(t.nelements()), &c)?;
            a.u64(c.addr(&x)?).u64(c.addr(&y)?).u64(c.addr(&t)?);
            a.u32(t.dtype.type_size() as u32)
                .u32(dim as u32)
                .u32(x.ne[dim as usize] as u32);
            a.u32(t.nelements() as u32)
                .u32(t.ne[0] as u32)
                .u32(t.ne[1] as u32)
                .u32(t.ne[2] as u32);
            strides(&mut a, &x.nb);
            strides(&mut a, &y.nb);
            strides(&mut a, &t.nb);
            c.launch(KernelId::Concat, d, &mut a)
        }
        Op::MulMat => mul_mat(&mut c, &t),
        Op::MulMatId => mul_mat_id(&mut c, &t),
        Op::FlashAttnExt {
            scale,
            max_bias,
            softcap,
        } => {
            let q = c.src(0)?;
            let k = c.src(1)?;
            let v = c.src(2)?;
            let mask = match t.src[3] {
                Some(_) => Some(c.src(3)?),
                None => None,
            };
            if q.ne[1] < MMQ_MIN_N && !c.st.tuning.legacy_decode_attn {
                let p = AttnArgs {
                    scale,
                    max_bias,
                    softcap,
                };
                return flash_attn_dec(&mut c, &t, [&q, &k, &v], mask.as_ref(), p);
            }
            let d = dims(
                launch::flash_attn(q.ne[0], v.ne[0], q.ne[2], q.ne[1], q.ne[3]),
                &c,
            )?;
            let (m0, m1, nhl2) = alibi(max_bias, q.ne[2]);
            a.u64(c.addr(&q)?).u64(c.addr(&k)?).u64(c.addr(&v)?);
            a.u64(match &mask {
                Some(m) => c.addr(m)?,
                None => 0,
            });
            a.u64(c.addr(&t)?);
            a.u32(float_code(k.dtype).unwrap_or(0))
                .u32(float_code(v.dtype).unwrap_or(0));
            a.u32(match &mask {
                Some(m) if m.dtype == DType::F16 => 1,
                Some(_) => 0,
                None => 2,
            });
            a.u32(q.ne[0] as u32)
                .u32(v.ne[0] as u32)
                .u32(k.ne[1] as u32)
                .u32(q.ne[1] as u32);
            a.u32(q.ne[2] as u32)
                .u32((q.ne[2] / k.ne[2]) as u32)
                .u32(d.block.1);
            a.f32(scale)
                .f32(softcap)
                .f32(max_bias)
                .f32(m0)
                .f32(m1)
                .u32(nhl2);
            strides(&mut a, &q.nb[1..]);
            strides(&mut a, &k.nb[1..]);
            strides(&mut a, &v.nb[1..]);
            a.usize(mask.map_or(0, |m| m.nb[1]));
            c.launch(KernelId::FlashAttnExt, d, &mut a)
        }
        _ => Err(c.fail(BackendErrorKind::UnsupportedOp, "op has no CUDA kernel")),
    }
}

/// The scalar parameters of FLASH_ATTN_EXT.
struct AttnArgs {
    scale: f32,
    max_bias: f32,
    softcap: f32,
}

/// Whether every row of `t` starts 16-byte aligned at `addr` and holds whole 16-byte
/// chunks (8 values of 2 bytes, or 2 x 4 of 4 bytes): then `flash_attn_dec` reads it
/// with vector loads.
fn rows_vectorisable(t: &Tensor, addr: u64) -> bool {
    addr % 16 == 0 && t.ne[0] % 8 == 0 && t.nb[1..].iter().all(|s| s % 16 == 0)
}

/// FLASH_ATTN_EXT for fewer than [`MMQ_MIN_N`] queries: `flash_attn_dec`, the KV range in
/// fixed tiles over blocks, K and V read once per KV head, partials combined in tile
/// order by the last block (see `kernels/flash_attn.ptx`).
fn flash_attn_dec(
    c: &mut Ctx<'_>,
    t: &Tensor,
    [q, k, v]: [&Tensor; 3],
    mask: Option<&Tensor>,
    p: AttnArgs,
) -> BackendResult<()> {
    let (d, dv, h, n_q, ne3) = (q.ne[0], v.ne[0], q.ne[2], q.ne[1], q.ne[3]);
    let (n_kv, h_kv) = (k.ne[1], k.ne[2]);
    let geo = launch::flash_attn_dec(d, dv, h, h_kv, n_q, n_kv, ne3).ok_or_else(|| {
        c.fail(
            BackendErrorKind::UnsupportedOp,
            "shape outside the kernel's launch limits",
        )
    })?;
    let (qa, ka, va, ta) = (c.addr(q)?, c.addr(k)?, c.addr(v)?, c.addr(t)?);
    let ma = match mask {
        Some(m) => c.addr(m)?,
        None => 0,
    };
    let (part, ctr) = c.be.attn_workspace(c.st, geo.part_bytes, geo.counters)?;
    let (m0, m1, nhl2) = alibi(p.max_bias, h);
    let mut a = Args::new();
    a.u64(qa).u64(ka).u64(va).u64(ma).u64(ta).u64(part).u64(ctr);
    a.u32(float_code(k.dtype).unwrap_or(0))
        .u32(float_code(v.dtype).unwrap_or(0));
    a.u32(match mask {
        Some(m) if m.dtype == DType::F16 => 1,
        Some(_) => 0,
        None => 2,
    });
    a.u32(d as u32)
        .u32(dv as u32)
        .u32(n_kv as u32)
        .u32(n_q as u32)
        .u32(h as u32)
        .u32((h / h_kv) as u32)
        .u32(geo.groups)
        .u32(geo.tiles);
    a.u32(rows_vectorisable(k, ka) as u32)
        .u32(rows_vectorisable(v, va) as u32);
    a.f32(p.scale)
        .f32(p.softcap)
        .f32(p.max_bias)
        .f32(m0)
        .f32(m1)
        .u32(nhl2);
    strides(&mut a, &q.nb[1..]);
    strides(&mut a, &k.nb[1..]);
    strides(&mut a, &v.nb[1..]);
    a.usize(mask.map_or(0, |m| m.nb[1]));
    c.launch(KernelId::FlashAttnDec, geo.dims, &mut a)
}

/// Enqueues the fused launch that computes `nodes` (a run [`fusion::plan`] matched).
///
/// [`fusion::plan`]: crate::fusion::plan
pub(crate) fn run_fused(
    be: &CudaBackend,
    st: &mut State,
    tensors: &[Tensor],
    nodes: &[TensorId],
    fusion: crate::fusion::Fusion,
) -> BackendResult<()> {
    let recorded = st.recorded.as_ref().map(Vec::len);
    match fusion {
        crate::fusion::Fusion::RopeStore(roles) => rope_store(be, st, tensors, nodes, roles),
        crate::fusion::Fusion::Products(r) => products::run_products(be, st, tensors, nodes, r),
    }?;
    // A run that went as one launch is recorded as the run: op timing's key for it and
    // the multiply-adds of all its nodes (a run that fell back to its nodes keeps theirs).
    if let (Some(before), Some(rec)) = (recorded, st.recorded.as_mut()) {
        if rec.len() == before + 1 {
            let l = &mut rec[before];
            l.op = fusion.key(tensors, nodes);
            l.macs = nodes
                .iter()
                .filter_map(|id| tensors.get(id.index()))
                .map(|t| crate::replay::node_macs(tensors, t, l.kernel))
                .sum();
        }
    }
    Ok(())
}

/// `rope_store`: the ropes and cache stores of a run `fusion::plan` matched (see
/// `fusion/rope_store.rs`), in one launch that writes every node of the run.
fn rope_store(
    be: &CudaBackend,
    st: &mut State,
    tensors: &[Tensor],
    nodes: &[TensorId],
    roles: crate::fusion::RopeStore,
) -> BackendResult<()> {
    let parts = crate::fusion::RopeStoreParts::of(tensors, nodes, 0, roles).ok_or_else(|| {
        be.err(
            BackendErrorKind::InvalidArgument,
            "rope_store: the fused run lost its nodes",
        )
    })?;
    let (k, xk) = parts.k;
    let (ks, _) = parts.k_store;
    let Op::Rope(p) = k.op else {
        return Err(be.err(
            BackendErrorKind::InvalidArgument,
            "rope_store: K is no rope",
        ));
    };
    let errk = be.err_slot(st, ks.op.name(), ks.name);
    let errv = match &parts.v_store {
        Some((vs, _)) => be.err_slot(st, vs.op.name(), vs.name),
        None => 0,
    };
    let mut c = Ctx {
        be,
        st,
        tensors,
        node: &ks,
    };
    let (d, hk, n) = (k.ne[0], k.ne[1], k.ne[2]);
    let hq = parts.q.as_ref().map_or(0, |(q, _)| q.ne[1]);
    let nv = parts.v_store.as_ref().map_or(0, |(_, v)| v.ne[0]);
    let dims = dims(launch::rope_store(d, hq, hk, nv, n), &c)?;
    let mut a = Args::new();
    match &parts.q {
        Some((q, xq)) => a.u64(c.addr(xq)?).u64(c.addr(q)?),
        None => a.u64(0).u64(0),
    };
    a.u64(c.addr(&xk)?)
        .u64(c.addr(&k)?)
        .u64(c.addr(&parts.pos)?);
    match &parts.v_store {
        Some((_, v)) => a.u64(c.addr(v)?),
        None => a.u64(0),
    };
    a.u64(c.addr(&parts.idx)?).u64(c.addr(&ks)?);
    match &parts.v_store {
        Some((vs, _)) => a.u64(c.addr(vs)?),
        None => a.u64(0),
    };
    a.u64(errk).u64(errv);
    a.u32(d as u32).u32(p.n_dims);
    a.u32(match p.mode {
        RopeMode::Normal => 0,
        RopeMode::Neox => 2,
    });
    a.u32(hq as u32).u32(hk as u32).u32(nv as u32);
    a.u32(float_code(ks.dtype).unwrap_or(0));
    let (tv, rows_v, nbvc1) = match &parts.v_store {
        Some((vs, _)) => (float_code(vs.dtype).unwrap_or(0), vs.ne[1], vs.nb[1]),
        None => (0, 0, 0),
    };
    a.u32(tv).u32(ks.ne[1] as u32).u32(rows_v as u32);
    // The same constants as the rope kernel and the host mirror (reference::rope_row).
    let rc = crate::reference::RopeConsts::new(&p);
    for x in [
        rc.theta_scale,
        rc.freq_scale,
        rc.ext_factor,
        rc.mscale,
        rc.corr[0],
        rc.corr[1],
    ] {
        a.f32(x);
    }
    let (nbxq, nbq) = match &parts.q {
        Some((q, xq)) => ([xq.nb[1], xq.nb[2]], [q.nb[1], q.nb[2]]),
        None => ([0, 0], [0, 0]),
    };
    strides(&mut a, &nbxq);
    strides(&mut a, &nbq);
    strides(&mut a, &xk.nb[1..3]);
    strides(&mut a, &k.nb[1..3]);
    a.usize(parts.pos.nb[0]);
    a.usize(parts.v_store.as_ref().map_or(0, |(_, v)| v.nb[1]));
    a.usize(parts.idx.nb[0]);
    a.usize(ks.nb[1]).usize(nbvc1);
    c.launch(KernelId::RopeStore, dims, &mut a)
}

/// Bytes of scratch that [`run`] asks for node `id` (the Q8_1 activations of a quantised
/// product), so that `graph_compute` can size the scratch for a whole split before it
/// launches or captures anything. Must cover every `scratch` request of `run` and
/// `run_fused` (a shortfall fails the split's CUDA graph capture).
pub(crate) fn scratch_need(tensors: &[Tensor], id: TensorId) -> usize {
    let Some(t) = tensors.get(id.index()) else {
        return 0;
    };
    let (Ok(w), Ok(x)) = (src(tensors, t, 0), src(tensors, t, 1)) else {
        return 0;
    };
    if is_float_weight(w.dtype) || !is_kernel_quant(w.dtype) {
        return 0;
    }
    let row = w.ne[0] / 32 * Q8_1_BLOCK;
    match t.op {
        // qnb[2] * b3 of mul_mat.
        Op::MulMat => row * t.ne[1] * t.ne[2] * t.ne[3],
        // qnb[2] of mul_mat_id: [K/32 blocks, B1, T].
        Op::MulMatId => row * x.ne[1] * t.ne[2],
        _ => 0,
    }
}

fn mul_mat(c: &mut Ctx<'_>, t: &Tensor) -> BackendResult<()> {
    let w = c.src(0)?;
    let x = c.src(1)?;
    let (m, n, b2, b3) = (t.ne[0], t.ne[1], t.ne[2], t.ne[3]);
    let (r2, r3) = ((b2 / w.ne[2]) as u32, (b3 / w.ne[3]) as u32);
    let batch = b2 * b3;
    let (wa, xa, ta) = (c.addr(&w)?, c.addr(&x)?, c.addr(t)?);
    if is_float_weight(w.dtype) {
        let d = dims(launch::mul_mat(None, m, n, batch), c)?;
        let mut a = Args::new();
        a.u64(wa)
            .u64(xa)
            .u64(ta)
            .u32(float_code(w.dtype).unwrap_or(0));
        a.u32(w.ne[0] as u32)
            .u32(m as u32)
            .u32(b2 as u32)
            .u32(r2)
            .u32(r3);
        strides(&mut a, &w.nb[1..]);
        strides(&mut a, &x.nb);
        strides(&mut a, &t.nb[1..]);
        return c.launch(KernelId::MulMatF, d, &mut a);
    }
    let class = launch::mul_mat_class(n);
    if !c.st.tuning.legacy_products {
        // The tiled class takes the activations quantised once by quantize_q8_1 (a
        // block of it would quantise all its columns again, once per block of rows);
        // the matrix-vector class quantises them in each block's prologue.
        let (xq, nbx, prequant) = match class {
            MulMatClass::Mmq => {
                let (scratch, qnb) = quantize_to_scratch(c, &x, xa, [n, b2, b3])?;
                (scratch, qnb, true)
            }
            MulMatClass::Mmvq => (xa, [x.nb[1], x.nb[2], x.nb[3]], false),
        };
        let call = qmm::Call {
            x: xq,
            nbx,
            prequant,
            k: w.ne[0],
            n,
            b2,
            r2: r2 as usize,
            r3: r3 as usize,
            ny: n.div_ceil(launch::qmm_columns(n)),
            nz: batch,
            mats: one_matrix(&w, wa, m, t, ta),
            nbwb: [w.nb[2], w.nb[3]],
            nbdb: [t.nb[2], t.nb[3]],
            norm: None,
            epi: qmm::Epilogue::None,
            ids: None,
        };
        check_weight_alignment(c, &w, wa)?;
        c.launch_qmm(&call)?;
        c.be.count_class(class);
        return Ok(());
    }
    // First generation: quantise the activations to Q8_1 in scratch, then the dp4a
    // kernel.
    let k = w.ne[0];
    let nchunks = k / 32;
    let (scratch, qnb) = quantize_to_scratch(c, &x, xa, [n, b2, b3])?;

    let d = dims(launch::mul_mat(Some(class), m, n, batch), c)?;
    let mut a = Args::new();
    a.u64(wa)
        .u64(scratch)
        .u64(ta)
        .u32(w.dtype.ggml_id())
        .u32(nchunks as u32);
    a.u32(m as u32).u32(n as u32).u32(b2 as u32).u32(r2).u32(r3);
    strides(&mut a, &w.nb[1..]);
    strides(&mut a, &qnb);
    strides(&mut a, &t.nb[1..]);
    let kid = match class {
        MulMatClass::Mmvq => KernelId::Mmvq,
        MulMatClass::Mmq => KernelId::Mmq,
    };
    c.launch(kid, d, &mut a)?;
    c.be.count_class(class);
    Ok(())
}

/// Quantises the f32 activations `x` (at `xa`, rows of K = `x.ne[0]` values, `rows`
/// = [N, B2, B3] of them) to Q8_1 in scratch with `quantize_q8_1`: the scratch address
/// and its byte strides of dims 1..3.
fn quantize_to_scratch(
    c: &mut Ctx<'_>,
    x: &Tensor,
    xa: u64,
    [n, b2, b3]: [usize; 3],
) -> BackendResult<(u64, [usize; 3])> {
    let k = x.ne[0];
    let nchunks = k / 32;
    let row = nchunks * Q8_1_BLOCK;
    let qnb = [row, row * n, row * n * b2];
    let scratch = c.be.scratch(c.st, qnb[2] * b3)?;
    let dq = dims(launch::quantize_q8_1(k, n, b2 * b3), c)?;
    let mut a = Args::new();
    a.u64(xa).u64(scratch).u32(nchunks as u32).u32(b2 as u32);
    strides(&mut a, &x.nb[1..]);
    strides(&mut a, &qnb);
    c.launch(KernelId::QuantizeQ8_1, dq, &mut a)?;
    Ok((scratch, qnb))
}

/// The matrices of a product call with one weight matrix: the `m` rows of `w` (at
/// `wa`) into `t` (at `ta`).
fn one_matrix(w: &Tensor, wa: u64, m: usize, t: &Tensor, ta: u64) -> [Option<qmm::Matrix>; 3] {
    let mat = qmm::Matrix {
        w: wa,
        dtype: w.dtype,
        m,
        nbw: w.nb[1],
        d: ta,
        nbd: t.nb[1],
    };
    [Some(mat), None, None]
}

/// `qmm` reads weight rows with loads as wide as their block size allows: their address
/// and strides must be multiples of it (GGUF and every ggml allocator align far more).
fn check_weight_alignment(c: &Ctx<'_>, w: &Tensor, addr: u64) -> BackendResult<()> {
    let a = qmm::weight_alignment(w.dtype);
    let ok = addr % a as u64 == 0 && w.nb[1..].iter().all(|s| s % a == 0);
    if ok {
        Ok(())
    } else {
        Err(c.fail(
            BackendErrorKind::InvalidArgument,
            "quantised weight rows are not aligned to their block size (up to 16 bytes)",
        ))
    }
}

/// MUL_MAT_ID: for quantised experts the activation rows are quantised to Q8_1 as
/// mul_mat does (one row per (e mod B1, t)), then `mmvq_id`; float experts go straight
/// to `mul_mat_f_id`. Both compute every output with mul_mat's own per-row dot, so a
/// token's result is the mul_mat of its expert bit for bit. Each warp reads its id and
/// checks it against n_as on the GPU: a bad id sets this launch's error word (no
/// read outside the experts, nothing written for it) and the next `synchronize` returns
/// `BadData` naming the node. That costs one load and compare per warp, and no host
/// round trip.
fn mul_mat_id(c: &mut Ctx<'_>, t: &Tensor) -> BackendResult<()> {
    let w = c.src(0)?;
    let x = c.src(1)?;
    let ids = c.src(2)?;
    let (m, n_used, tokens) = (t.ne[0], t.ne[1], t.ne[2]);
    let (b1, n_as) = (x.ne[1], w.ne[2]);
    let d = dims(launch::mul_mat_id(m, n_used, tokens), c)?;
    let (wa, xa, ia, ta) = (c.addr(&w)?, c.addr(&x)?, c.addr(&ids)?, c.addr(t)?);
    let err_word = c.be.err_slot(c.st, t.op.name(), t.name);
    if is_float_weight(w.dtype) {
        let mut a = Args::new();
        a.u64(wa).u64(xa).u64(ia).u64(ta).u64(err_word);
        a.u32(float_code(w.dtype).unwrap_or(0))
            .u32(w.ne[0] as u32)
            .u32(m as u32)
            .u32(n_as as u32)
            .u32(b1 as u32);
        strides(&mut a, &w.nb[1..3]);
        strides(&mut a, &x.nb[..3]);
        strides(&mut a, &ids.nb[..2]);
        strides(&mut a, &t.nb[1..3]);
        return c.launch(KernelId::MulMatFId, d, &mut a);
    }
    if !c.st.tuning.legacy_products {
        // From MMQ_MIN_N tokens on, quantise the activation rows once (as the tiled
        // MUL_MAT does) rather than in each block of rows of each slot.
        let (xq, nbx, prequant) = if tokens >= launch::MMQ_MIN_N {
            let (scratch, qnb) = quantize_to_scratch(c, &x, xa, [b1, tokens, 1])?;
            (scratch, qnb, true)
        } else {
            (xa, [x.nb[1], x.nb[2], 0], false)
        };
        let call = qmm::Call {
            x: xq,
            nbx,
            prequant,
            k: w.ne[0],
            n: 1,
            b2: b1,
            r2: 1,
            r3: 1,
            ny: n_used,
            nz: tokens,
            mats: one_matrix(&w, wa, m, t, ta),
            nbwb: [w.nb[2], 0],
            nbdb: [t.nb[2], 0],
            norm: None,
            epi: qmm::Epilogue::None,
            ids: Some(qmm::Ids {
                ids: ia,
                nb: [ids.nb[0], ids.nb[1]],
                n_as,
                err: err_word,
            }),
        };
        check_weight_alignment(c, &w, wa)?;
        return c.launch_qmm(&call);
    }
    // First generation: activations to Q8_1 in scratch: [K/32 blocks, B1, T].
    let k = w.ne[0];
    let nchunks = k / 32;
    let row = nchunks * Q8_1_BLOCK;
    let qnb = [row, row * b1, row * b1 * tokens];
    let scratch = c.be.scratch(c.st, qnb[2])?;
    let dq = dims(launch::quantize_q8_1(k, b1, tokens), c)?;
    let mut a = Args::new();
    a.u64(xa)
        .u64(scratch)
        .u32(nchunks as u32)
        .u32(tokens as u32);
    strides(&mut a, &x.nb[1..]);
    strides(&mut a, &qnb);
    c.launch(KernelId::QuantizeQ8_1, dq, &mut a)?;

    let mut a = Args::new();
    a.u64(wa).u64(scratch).u64(ia).u64(ta).u64(err_word);
    a.u32(w.dtype.ggml_id())
        .u32(nchunks as u32)
        .u32(m as u32)
        .u32(n_as as u32)
        .u32(b1 as u32);
    strides(&mut a, &w.nb[1..3]);
    strides(&mut a, &qnb[..2]);
    strides(&mut a, &ids.nb[..2]);
    strides(&mut a, &t.nb[1..3]);
    c.launch(KernelId::MmvqId, d, &mut a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ggml_core::{AttnParams, Context, RopeParams};

    fn storage() -> Vec<Tensor> {
        vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 64]
    }

    #[test]
    fn supports_the_llama_ops() {
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let emb = ctx.new_tensor(DType::Q8_0, [576, 100, 1, 1]).unwrap();
        let ids = ctx.new_tensor(DType::I32, [5, 1, 1, 1]).unwrap();
        let x = ctx.get_rows(emb, ids).unwrap();
        let n = ctx.rms_norm(x, 1e-5).unwrap();
        let g = ctx.new_tensor(DType::F32, [576, 1, 1, 1]).unwrap();
        let n = ctx.mul(n, g).unwrap();
        let wq = ctx.new_tensor(DType::Q4_1, [576, 576, 1, 1]).unwrap();
        let q = ctx.mul_mat(wq, n).unwrap();
        let q3 = ctx.reshape(q, [64, 9, 5, 1]).unwrap();
        let pos = ctx.new_tensor(DType::I32, [5, 1, 1, 1]).unwrap();
        let qr = ctx.rope(q3, pos, RopeParams::llama(64, 100000.0)).unwrap();
        let qp = ctx.permute(qr, [0, 2, 1, 3]).unwrap();
        let k = ctx.new_tensor(DType::F16, [64, 32, 3, 1]).unwrap();
        let v = ctx.new_tensor(DType::F16, [64, 32, 3, 1]).unwrap();
        let m = ctx.new_tensor(DType::F16, [32, 5, 1, 1]).unwrap();
        let fa = ctx
            .flash_attn_ext(qp, k, v, Some(m), AttnParams::scaled(0.125))
            .unwrap();
        let up = ctx.new_tensor(DType::Q5_0, [576, 1536, 1, 1]).unwrap();
        let u = ctx.mul_mat(up, n).unwrap();
        let sw = ctx.swiglu(u, u).unwrap();
        let ge = ctx.gelu(u).unwrap();
        let gg = ctx.geglu(u, u).unwrap();
        let kq = ctx.mul_mat(k, qp).unwrap();
        let wb = ctx.new_tensor(DType::BF16, [576, 64, 1, 1]).unwrap();
        let yb = ctx.mul_mat(wb, n).unwrap();
        let sm = ctx.soft_max(kq, None, 0.125, 0.0).unwrap();
        let out = ctx.get_rows(up, ids);
        let ts = ctx.tensors();
        for id in [x, n, q, q3, qr, qp, fa, u, sw, ge, gg, kq, sm, yb] {
            assert_eq!(check(ts, id), Ok(()), "{:?}", ts[id.index()].op);
        }
        assert!(out.is_ok());
    }

    #[test]
    fn rejects_what_has_no_kernel() {
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let x = ctx.new_tensor(DType::F32, [256, 2, 1, 1]).unwrap();
        let w = ctx.new_tensor(DType::Q2K, [256, 4, 1, 1]).unwrap();
        let xt = ctx.new_tensor(DType::F32, [2, 256, 1, 1]).unwrap();
        let xt = ctx.permute(xt, [1, 0, 2, 3]).unwrap();
        // quantize_q8_1 reads activations with unit element stride only.
        let y = ctx.mul_mat(w, xt).unwrap();
        let q8 = ctx.new_tensor(DType::Q8_0, [256, 2, 1, 1]).unwrap();
        let c = ctx.cpy(x, q8).unwrap();
        // Q8_1 is an activation format: q_unpack has no branch for it.
        let w8 = ctx.new_tensor(DType::Q8_1, [256, 4, 1, 1]).unwrap();
        let y8 = ctx.mul_mat(w8, x).unwrap();
        let ts = ctx.tensors();
        assert!(check(ts, y).is_err());
        assert!(check(ts, c).is_err());
        assert!(check(ts, y8).is_err());
    }

    #[test]
    fn supports_the_moe_ops() {
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let cur = ctx.new_tensor(DType::F32, [576, 1, 5, 1]).unwrap();
        let logits = ctx.new_tensor(DType::F32, [8, 5, 1, 1]).unwrap();
        let ids = ctx.argsort_top_k(logits, 2).unwrap();
        let w = ctx.new_tensor(DType::F32, [2, 5, 1, 1]).unwrap();
        let sum = ctx.sum_rows(w).unwrap();
        let sum = ctx.clamp(sum, 6.1e-5, f32::INFINITY).unwrap();
        let wn = ctx.div(w, sum).unwrap();
        let h = ctx.new_tensor(DType::F32, [1536, 2, 5, 1]).unwrap();
        let mut nodes = vec![ids, sum, wn];
        for dt in [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::Q4_1,
            DType::Q5_0,
        ] {
            let up = ctx.new_tensor(dt, [576, 1536, 8, 1]).unwrap();
            let down = ctx.new_tensor(dt, [1536, 576, 8, 1]).unwrap();
            nodes.push(ctx.mul_mat_id(up, cur, ids).unwrap());
            nodes.push(ctx.mul_mat_id(down, h, ids).unwrap());
        }
        // Rows of up to ARGSORT_MAX_N values fit the kernel's shared keys; longer do not.
        let long = ctx.new_tensor(DType::F32, [6144, 2, 1, 1]).unwrap();
        nodes.push(ctx.argsort_top_k(long, 8).unwrap());
        let too_long = ctx.new_tensor(DType::F32, [6145, 2, 1, 1]).unwrap();
        let bad_sort = ctx.argsort_top_k(too_long, 8).unwrap();
        // Q8_1 is an activation format: no weight kernel.
        let w81 = ctx.new_tensor(DType::Q8_1, [576, 64, 8, 1]).unwrap();
        let bad_w = ctx.mul_mat_id(w81, cur, ids).unwrap();
        let ts = ctx.tensors();
        for id in nodes {
            assert_eq!(check(ts, id), Ok(()), "{:?}", ts[id.index()].op);
        }
        assert!(check(ts, bad_sort).is_err());
        assert!(check(ts, bad_w).is_err());
    }

    #[test]
    fn mul_mat_id_quantised_needs_unit_stride_activations() {
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let ids = ctx.new_tensor(DType::I32, [2, 5, 1, 1]).unwrap();
        let x0 = ctx.new_tensor(DType::F32, [5, 64, 1, 1]).unwrap();
        // [64, 1, 5] with element stride 20 bytes: a permuted view of [5, 64].
        let x = ctx.permute(x0, [2, 0, 1, 3]).unwrap();
        let wq = ctx.new_tensor(DType::Q4_0, [64, 16, 8, 1]).unwrap();
        let wf = ctx.new_tensor(DType::F16, [64, 16, 8, 1]).unwrap();
        let yq = ctx.mul_mat_id(wq, x, ids).unwrap();
        let yf = ctx.mul_mat_id(wf, x, ids).unwrap();
        let ts = ctx.tensors();
        assert_eq!(ts[x.index()].ne, [64, 1, 5, 1]);
        assert!(check(ts, yq).is_err());
        assert_eq!(check(ts, yf), Ok(()));
    }

    #[test]
    fn alibi_matches_ggml() {
        let (m0, m1, n) = alibi(8.0, 12);
        assert_eq!(n, 8);
        assert_eq!(m0, 2f32.powf(-1.0));
        assert_eq!(m1, 2f32.powf(-0.5));
    }
}
