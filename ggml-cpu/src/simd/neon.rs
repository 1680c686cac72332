//! AArch64 NEON level: f32 reductions in four 4-lane registers (lanes 0-3, 4-7, 8-11,
//! 12-15, exactly the reference's 16 lanes); everything else is the portable code, which
//! the compiler vectorises with NEON (a baseline feature of aarch64).

use std::arch::aarch64::*;

use super::Kernels;
use crate::isa::Isa;
use crate::reference as r;

pub(crate) static KERNELS: Kernels = Kernels {
    isa: Isa::Neon,
    dot_f32,
    sum_sq,
    ..super::scalar::KERNELS
};

fn lanes(a: [float32x4_t; 4]) -> [f32; 16] {
    let mut l = [0f32; 16];
    for (i, v) in a.iter().enumerate() {
        // SAFETY: 4 floats of room at 4i; NEON is baseline on aarch64.
        unsafe { vst1q_f32(l.as_mut_ptr().add(4 * i), *v) };
    }
    l
}

fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    // SAFETY: NEON is baseline on aarch64.
    let mut a = [unsafe { vdupq_n_f32(0.0) }; 4];
    let mut i = 0;
    while i + 16 <= n {
        for (k, acc) in a.iter_mut().enumerate() {
            // SAFETY: 4 floats at i + 4k in both rows; separate multiply and add.
            unsafe {
                let p = vmulq_f32(
                    vld1q_f32(x.as_ptr().add(i + 4 * k)),
                    vld1q_f32(y.as_ptr().add(i + 4 * k)),
                );
                *acc = vaddq_f32(*acc, p);
            }
        }
        i += 16;
    }
    let mut l = lanes(a);
    for j in i..n {
        l[j - i] += x[j] * y[j];
    }
    r::tree16(l)
}

fn sum_sq(x: &[f32]) -> f32 {
    let n = x.len();
    // SAFETY: NEON is baseline on aarch64.
    let mut a = [unsafe { vdupq_n_f32(0.0) }; 4];
    let mut i = 0;
    while i + 16 <= n {
        for (k, acc) in a.iter_mut().enumerate() {
            // SAFETY: 4 floats at i + 4k.
            unsafe {
                let v = vld1q_f32(x.as_ptr().add(i + 4 * k));
                *acc = vaddq_f32(*acc, vmulq_f32(v, v));
            }
        }
        i += 16;
    }
    let mut l = lanes(a);
    for j in i..n {
        l[j - i] += x[j] * x[j];
    }
    r::tree16(l)
}
