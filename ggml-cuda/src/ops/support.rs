//! Which ops the CUDA backend runs, and why not when it does not.

use ggml_core::{DType, Op, Tensor, TensorId};

use super::{fits_u32, float_code, is_float_weight, src, tcode, unit_stride};
use crate::launch;
use crate::reference::is_kernel_quant;

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
            // Both kernels must fit: which one runs depends on the tuning and the batch.
            let (d, dv, h, n_q, ne3) = (q.ne[0], v.ne[0], q.ne[2], q.ne[1], q.ne[3]);
            for split in [false, true] {
                launch::flash_attn_dec(d, dv, h, k.ne[2], n_q, k.ne[1], ne3, split)
                    .ok_or("flash_attn_ext: tiled attention's grid too large")?;
            }
            Ok(())
        }
        _ => Err("op has no CUDA kernel"),
    }
}
