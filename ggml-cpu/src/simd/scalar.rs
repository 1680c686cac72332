//! The portable level: the reference primitives themselves.

use ggml_core::DType;

use super::{as_f32, as_u16, Kernels, MmTile};
use crate::isa::Isa;
use crate::reference as r;

// The reference's own primitives serve as they are.
use r::{dot_f32, exp_shift_sum, max, sum_sq};

pub(crate) static KERNELS: Kernels = kernels_table!(
    Isa::Scalar,
    heads: None,
    quantize: quantize,
    mm: mm,
    pack: pack,
    unpacked: super::no_unpacked,
);

fn dots_f16(q: &[u16], k: &[u16], stride: usize, out: &mut [f32]) {
    let d = q.len();
    for (j, o) in out.iter_mut().enumerate() {
        *o = r::dot_f16(q, &k[j * stride..j * stride + d]);
    }
}

fn axpy_f16_rows(accs: &mut [&mut [f32]], ws: &[&[f32]], v: &[u16], stride: usize) {
    for (acc, w) in accs.iter_mut().zip(ws) {
        let d = acc.len();
        for (j, &wj) in w.iter().enumerate() {
            axpy_f16(acc, wj, &v[j * stride..j * stride + d]);
        }
    }
}

/// The portable level uses the standard Q8_0/Q8_1 layout.
pub(crate) fn pack(_w: DType) -> Option<super::Packer> {
    None
}

pub(crate) fn silu(x: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = r::silu(v);
    }
}

pub(crate) fn swiglu(a: &[f32], b: &[f32], out: &mut [f32]) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = r::silu(x) * y;
    }
}

pub(crate) fn f32_to_f16(x: &[f32], out: &mut [u16]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = r::f32_to_f16(v);
    }
}

#[inline(always)]
pub(crate) fn axpy_f32(acc: &mut [f32], w: f32, v: &[f32]) {
    for (a, &x) in acc.iter_mut().zip(v) {
        *a += w * x;
    }
}

#[inline(always)]
pub(crate) fn axpy_f16(acc: &mut [f32], w: f32, v: &[u16]) {
    for (a, &x) in acc.iter_mut().zip(v) {
        *a += w * r::f16_to_f32(x);
    }
}

pub(crate) fn quantize(d: DType, x: &[f32], out: &mut [u8]) {
    crate::quant::quantize_row(d, x, out);
}

pub(crate) fn mm(w: DType) -> Option<MmTile> {
    Some(match w {
        DType::F32 => tile_f32,
        DType::F16 => tile_f16,
        DType::BF16 => tile_bf16,
        d if crate::ops::mul_mat::quant_supported(d) => tile_quant,
        _ => return None,
    })
}

fn tile_f32(_w: DType, k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]) {
    for (ri, ar) in a.iter().enumerate() {
        for (ci, br) in b.iter().enumerate() {
            out[ri * 4 + ci] = r::dot_f32(&as_f32(ar)[..k], &as_f32(br)[..k]);
        }
    }
}

fn tile_f16(_w: DType, k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]) {
    for (ri, ar) in a.iter().enumerate() {
        for (ci, br) in b.iter().enumerate() {
            out[ri * 4 + ci] = r::dot_f16(&as_u16(ar)[..k], &as_u16(br)[..k]);
        }
    }
}

/// Shared by every level: BF16 weights are rare.
pub(crate) fn tile_bf16(_w: DType, k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]) {
    for (ri, ar) in a.iter().enumerate() {
        for (ci, br) in b.iter().enumerate() {
            out[ri * 4 + ci] = r::dot_bf16(&as_u16(ar)[..k], &as_u16(br)[..k]);
        }
    }
}

/// Reference quantised dots (inlined so that callers with target features vectorise them).
#[inline(always)]
pub(crate) fn tile_quant(w: DType, k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]) {
    for (ri, ar) in a.iter().enumerate() {
        for (ci, br) in b.iter().enumerate() {
            out[ri * 4 + ci] = r::vec_dot_quant_inline(w, ar, br, k);
        }
    }
}
