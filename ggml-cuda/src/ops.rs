//! How each op the CUDA backend runs is launched (`run`, `run_fused`); which ops it runs
//! is [`support`], matrix products are [`matmul`].

use std::sync::atomic::Ordering;

use ggml_core::{
    BackendError, BackendErrorKind, BackendResult, DType, Op, RopeMode, Tensor, TensorId,
};

use crate::backend::{CudaBackend, State};
use crate::driver::Api;
use crate::kernels::KernelId;
use crate::launch::{self, Args, LaunchDims, MMQ_MIN_N};
use crate::qmm;

mod matmul;
mod products;
mod shared_act;
mod support;

pub(crate) use matmul::scratch_need;
pub(crate) use support::check;

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

/// A mask's element type as the softmax and attention kernels take it: 0 f32, 1 f16, 2
/// no mask.
fn mask_code(mask: Option<&Tensor>) -> u32 {
    match mask {
        Some(m) if m.dtype == DType::F16 => 1,
        Some(_) => 0,
        None => 2,
    }
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
        let f = self.be.dev.kernels.get(k);
        self.launch_function(k, f, d, args)
    }

    /// Launches `f`, kernel `k`'s entry or a variant of it (same parameters).
    fn launch_function(
        &mut self,
        k: KernelId,
        f: crate::driver::Func,
        d: LaunchDims,
        args: &mut Args,
    ) -> BackendResult<()> {
        let dev = &self.be.dev;
        // Its module keeps the wait only on sm_90 and newer (kernels::entry_waits_for_grid).
        let d = LaunchDims {
            programmatic: self.st.tuning.pdl && dev.kernels.waits_for_grid(k),
            ..d
        };
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
                .record((k, f), (self.op(), weights), self.node.name, d, macs, args);
        }
        Ok(())
    }
}

impl Ctx<'_> {
    /// Launches `qmm` for `call`.
    fn launch_qmm(&mut self, call: &qmm::Call) -> BackendResult<()> {
        let t = self.st.tuning;
        let d = dims(call.dims_with(t.decode_lanes), self)?;
        let mut a = call.args_with(t.q8_window, t.decode_lanes).ok_or_else(|| {
            self.fail(
                BackendErrorKind::UnsupportedOp,
                "shape outside the kernel's launch limits",
            )
        })?;
        let granularity = t.specialize.then_some(match t.specialize_form {
            true => crate::qmm_variant::Granularity::Form,
            false => crate::qmm_variant::Granularity::Dtype,
        });
        match call.variant_with(t.q8_window, t.decode_lanes, granularity) {
            Some(v) => {
                let f = self
                    .be
                    .dev
                    .qmm_variant(v)
                    .map_err(|e| self.be.cu(e).at(self.op(), self.node.name))?;
                self.launch_function(KernelId::Qmm, f, d, &mut a)?;
                self.be.class_launches[crate::backend::QMM_VARIANT_SLOT]
                    .fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            None => self.launch(KernelId::Qmm, d, &mut a),
        }
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
            a.u32(mask_code(mask.as_ref()));
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
        Op::MulMat => matmul::mul_mat(&mut c, &t),
        Op::MulMatId => matmul::mul_mat_id(&mut c, &t),
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
            let legacy = if q.ne[1] < MMQ_MIN_N {
                c.st.tuning.legacy_decode_attn
            } else {
                c.st.tuning.legacy_prompt_attn
            };
            if !legacy {
                let p = AttnArgs {
                    scale,
                    max_bias,
                    softcap,
                };
                if q.ne[1] >= MMQ_MIN_N && c.st.tuning.mma_attn {
                    if let Some(kernel) = mma_attn_kernel(&c, [&q, &k, &v], mask.as_ref(), &p)? {
                        return flash_attn_mma(&mut c, &t, kernel, [&q, &k, &v], mask.as_ref(), p);
                    }
                }
                if q.ne[1] < MMQ_MIN_N && c.st.tuning.row_attn {
                    if let Some(kernel) = row_attn_kernel(&c, [&q, &k, &v], mask.as_ref(), &p)? {
                        return flash_attn_row(&mut c, &t, kernel, [&q, &k, &v], mask.as_ref(), p);
                    }
                }
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
            a.u32(mask_code(mask.as_ref()));
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

/// The error of an attention shape a kernel's launch cannot cover.
fn outside_launch_limits(c: &Ctx<'_>) -> BackendError {
    c.fail(
        BackendErrorKind::UnsupportedOp,
        "shape outside the kernel's launch limits",
    )
}

/// Device addresses of an attention's q, K, V, mask (0 without one) and output.
fn attn_addrs(
    c: &Ctx<'_>,
    t: &Tensor,
    [q, k, v]: [&Tensor; 3],
    mask: Option<&Tensor>,
) -> BackendResult<[u64; 5]> {
    let ma = match mask {
        Some(m) => c.addr(m)?,
        None => 0,
    };
    Ok([c.addr(q)?, c.addr(k)?, c.addr(v)?, ma, c.addr(t)?])
}

/// Whether `t` is f32 with unit element stride and each of its rows starts `align`-byte
/// aligned.
fn f32_rows_aligned(c: &Ctx<'_>, t: &Tensor, align: usize) -> BackendResult<bool> {
    Ok(t.dtype == DType::F32
        && t.nb[0] == 4
        && c.addr(t)? % align as u64 == 0
        && t.nb[1..].iter().all(|s| s % align == 0))
}

/// Whether `t` is f16 with unit element stride and rows of whole 16-byte chunks, each
/// 16-byte aligned ([`rows_vectorisable`]).
fn f16_rows_vectorisable(c: &Ctx<'_>, t: &Tensor) -> BackendResult<bool> {
    Ok(t.dtype == DType::F16 && t.nb[0] == 2 && rows_vectorisable(t, c.addr(t)?))
}

/// The scratch of an attention whose KV range is cut into `parts` (tiles or chunks)
/// combined by the last block: the partials' (m, l) pairs (`pairs_bytes`), then their
/// value sums, and the counters; all 0 (no workspace) with one part, its own combine.
/// Returns the pairs', the sums' and the counters' addresses.
fn attn_partials(
    c: &mut Ctx<'_>,
    parts: u32,
    part_bytes: usize,
    pairs_bytes: usize,
    counters: usize,
) -> BackendResult<(u64, u64, u64)> {
    if parts == 1 {
        return Ok((0, 0, 0));
    }
    let (part, ctr) = c.be.attn_workspace(c.st, part_bytes, counters)?;
    Ok((part, part + pairs_bytes as u64, ctr))
}

/// The `flash_attn_mma` entry for an attention, or `None` when it needs what only
/// `flash_attn_dec` has: K and V other than f16, a head size other than 64 or 128 (or
/// Dv != D), soft-capping, ALiBi, an f32 mask, an odd n_kv, or rows the kernel's vector
/// loads cannot read (q pairs 8-byte, K/V rows 16-byte, mask pairs 4-byte aligned).
fn mma_attn_kernel(
    c: &Ctx<'_>,
    [q, k, v]: [&Tensor; 3],
    mask: Option<&Tensor>,
    p: &AttnArgs,
) -> BackendResult<Option<KernelId>> {
    let kernel = match (q.ne[0], v.ne[0]) {
        (64, 64) => KernelId::FlashAttnMma64,
        (128, 128) => KernelId::FlashAttnMma128,
        _ => return Ok(None),
    };
    let q_pairs = f32_rows_aligned(c, q, 8)?;
    let kv_rows = |x: &Tensor| f16_rows_vectorisable(c, x);
    let mask_pairs = match mask {
        None => true,
        Some(m) => m.dtype == DType::F16 && m.nb[0] == 2 && m.nb[1] % 4 == 0 && c.addr(m)? % 4 == 0,
    };
    let plain = p.softcap == 0.0 && p.max_bias == 0.0 && k.ne[1] % 2 == 0;
    Ok((q_pairs && kv_rows(k)? && kv_rows(v)? && mask_pairs && plain).then_some(kernel))
}

/// The `flash_attn_row` entry for a decode attention, or `None` when it needs what only
/// `flash_attn_dec` has: K and V other than f16, a head size other than 64, 128 or 256
/// (or Dv != D), soft-capping, ALiBi, K/V row strides of 2^32 bytes or more, or rows the
/// kernel's vector loads cannot read (q and K/V rows 16-byte aligned, mask values
/// aligned to their size).
fn row_attn_kernel(
    c: &Ctx<'_>,
    [q, k, v]: [&Tensor; 3],
    mask: Option<&Tensor>,
    p: &AttnArgs,
) -> BackendResult<Option<KernelId>> {
    let kernel = match (q.ne[0], v.ne[0]) {
        (64, 64) => KernelId::FlashAttnRow64,
        (128, 128) => KernelId::FlashAttnRow128,
        (256, 256) => KernelId::FlashAttnRow256,
        _ => return Ok(None),
    };
    let q_rows = f32_rows_aligned(c, q, 16)?;
    let kv_rows = |x: &Tensor| Ok(u32::try_from(x.nb[1]).is_ok() && f16_rows_vectorisable(c, x)?);
    let mask_values = match mask {
        None => true,
        Some(m) => {
            let size = match m.dtype {
                DType::F16 => 2,
                DType::F32 => 4,
                _ => return Ok(None),
            };
            m.nb[0] == size && m.nb[1] % size == 0 && c.addr(m)? % size as u64 == 0
        }
    };
    let plain = p.softcap == 0.0 && p.max_bias == 0.0;
    Ok((q_rows && kv_rows(k)? && kv_rows(v)? && mask_values && plain).then_some(kernel))
}

/// FLASH_ATTN_EXT of a decode batch: `flash_attn_row` (see `kernels/fattn_row.ptx`), one
/// block per (KV tile, query row), the arithmetic of `flash_attn_dec` unrolled, so the
/// same bits.
fn flash_attn_row(
    c: &mut Ctx<'_>,
    t: &Tensor,
    kernel: KernelId,
    [q, k, v]: [&Tensor; 3],
    mask: Option<&Tensor>,
    p: AttnArgs,
) -> BackendResult<()> {
    let (d, h, n_q, ne3) = (q.ne[0], q.ne[2], q.ne[1], q.ne[3]);
    let (n_kv, h_kv) = (k.ne[1], k.ne[2]);
    let gqa = h / h_kv;
    let geo =
        launch::flash_attn_row(d, h, n_q, n_kv, ne3).ok_or_else(|| outside_launch_limits(c))?;
    let [qa, ka, va, ma, ta] = attn_addrs(c, t, [q, k, v], mask)?;
    let (part, apart, ctr) =
        attn_partials(c, geo.tiles, geo.part_bytes, geo.ms_bytes, geo.counters)?;
    let mut a = Args::new();
    a.u64(qa).u64(ka).u64(va).u64(ma).u64(ta);
    a.u64(part).u64(apart).u64(ctr);
    a.u32(n_kv as u32)
        .u32(n_q as u32)
        .u32(h as u32)
        .u32(gqa as u32)
        .u32(geo.tiles);
    a.u32(mask_code(mask));
    a.u32(launch::div_magic(gqa as u32))
        .u32(launch::div_magic(n_q as u32));
    a.f32(p.scale);
    strides(&mut a, &q.nb[1..]);
    // row_attn_kernel checked that the position strides fit 32 bits.
    a.u32(k.nb[1] as u32);
    strides(&mut a, &k.nb[2..]);
    a.u32(v.nb[1] as u32);
    strides(&mut a, &v.nb[2..]);
    a.usize(mask.map_or(0, |m| m.nb[1]));
    c.launch(kernel, geo.dims, &mut a)
}

/// FLASH_ATTN_EXT of a prompt batch on f16 tensor cores: `flash_attn_mma` (see
/// `kernels/fattn_mma.ptx`), 64 query rows of one KV head a block, K/V tiles of 64
/// positions shared by its 4 warps. Each row's arithmetic depends on KV positions only,
/// so every prompt batch gives a query the same bits (not those of a decode: another
/// kernel class).
fn flash_attn_mma(
    c: &mut Ctx<'_>,
    t: &Tensor,
    kernel: KernelId,
    [q, k, v]: [&Tensor; 3],
    mask: Option<&Tensor>,
    p: AttnArgs,
) -> BackendResult<()> {
    let (d, h, n_q, ne3) = (q.ne[0], q.ne[2], q.ne[1], q.ne[3]);
    let (n_kv, h_kv) = (k.ne[1], k.ne[2]);
    let gqa = h / h_kv;
    let geo = launch::flash_attn_mma(d, gqa, h_kv, n_q, n_kv, ne3)
        .ok_or_else(|| outside_launch_limits(c))?;
    let [qa, ka, va, ma, ta] = attn_addrs(c, t, [q, k, v], mask)?;
    let (part, opart, ctr) =
        attn_partials(c, geo.chunks, geo.part_bytes, geo.ml_bytes, geo.counters)?;
    let mut a = Args::new();
    a.u64(qa).u64(ka).u64(va).u64(ma).u64(ta);
    a.u64(part).u64(opart).u64(ctr);
    a.u32(n_kv as u32)
        .u32(n_q as u32)
        .u32(h as u32)
        .u32(gqa as u32)
        .u32((n_q * gqa) as u32)
        .u32(n_kv.div_ceil(launch::FA_MMA_TILE) as u32)
        .u32(mask.is_some() as u32)
        .u32(launch::div_magic(gqa as u32))
        .u32(geo.chunks)
        .u32(launch::div_magic(geo.chunks))
        .u32(geo.row_blocks);
    a.f32(p.scale);
    strides(&mut a, &q.nb[1..]);
    strides(&mut a, &k.nb[1..]);
    strides(&mut a, &v.nb[1..]);
    a.usize(mask.map_or(0, |m| m.nb[1]));
    c.launch(kernel, geo.dims, &mut a)
}

/// FLASH_ATTN_EXT for any number of queries: `flash_attn_dec`, the KV range in fixed
/// tiles over blocks, K and V of a tile read once for up to 8 query rows of a KV head,
/// partials combined in tile order by the last block (see `kernels/flash_attn.ptx`).
/// Each row's arithmetic depends on KV positions only, so a prompt's rows have the bits
/// a decode of the same query would.
fn flash_attn_dec(
    c: &mut Ctx<'_>,
    t: &Tensor,
    [q, k, v]: [&Tensor; 3],
    mask: Option<&Tensor>,
    p: AttnArgs,
) -> BackendResult<()> {
    let (d, dv, h, n_q, ne3) = (q.ne[0], v.ne[0], q.ne[2], q.ne[1], q.ne[3]);
    let (n_kv, h_kv) = (k.ne[1], k.ne[2]);
    let split = c.st.tuning.attn_row_split;
    let geo = launch::flash_attn_dec(d, dv, h, h_kv, n_q, n_kv, ne3, split)
        .ok_or_else(|| outside_launch_limits(c))?;
    let [qa, ka, va, ma, ta] = attn_addrs(c, t, [q, k, v], mask)?;
    let (part, ctr) = c.be.attn_workspace(c.st, geo.part_bytes, geo.counters)?;
    let (m0, m1, nhl2) = alibi(p.max_bias, h);
    let mut a = Args::new();
    a.u64(qa).u64(ka).u64(va).u64(ma).u64(ta).u64(part).u64(ctr);
    a.u32(float_code(k.dtype).unwrap_or(0))
        .u32(float_code(v.dtype).unwrap_or(0));
    a.u32(mask_code(mask));
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
    let g = dv.div_ceil(8) as u32;
    for divisor in [(h / h_kv) as u32, dv as u32, d as u32, geo.groups, g] {
        a.u32(launch::div_magic(divisor));
    }
    a.u32(launch::FA_DEC_THREADS / g).u32(geo.rows_per_group);
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
        crate::fusion::Fusion::ProductsRope(r) => {
            products::run_products_rope(be, st, tensors, nodes, r)
        }
        crate::fusion::Fusion::SharedAct(r) => {
            shared_act::run_shared_act(be, st, tensors, nodes, r)
        }
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
pub(crate) fn rope_store(
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
    a.u32(launch::div_magic(d as u32))
        .u32(launch::div_magic(d as u32 / 2));
    c.launch(KernelId::RopeStore, dims, &mut a)
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
