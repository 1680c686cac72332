//! Host-side reference computations that mirror the PTX kernels step by step.
//!
//! They define what the kernels compute in the same reduction order and with the same
//! float operations (so the only differences on a GPU come from `ex2.approx`-based
//! exponentials), and they are what the GPU tests compare against. They are also the
//! executable documentation of the chunk formats in `kernels/quant.ptx`.

// Index loops mirror the lane/byte indexing of the PTX they document.
#![allow(clippy::needless_range_loop)]

use ggml_core::DType;
use half::{bf16, f16};

pub mod arith;
mod rope;

pub use rope::{rope_row, sincos, yarn_corr_dims, RopeConsts};

/// Lanes per warp: the fixed number of partial sums of every reduction.
pub const LANES: usize = 32;

/// An f16 stored as its little-endian bits, as f32.
pub fn f16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// f32 to f16 bits, rounding to nearest even (PTX `cvt.rn.f16.f32`).
pub fn f32_to_f16(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// A bf16 stored as its bits, as f32.
pub fn bf16_to_f32(bits: u16) -> f32 {
    bf16::from_bits(bits).to_f32()
}

/// f32 to bf16 bits, rounding to nearest even (PTX `cvt.rn.bf16.f32`).
pub fn f32_to_bf16(x: f32) -> u16 {
    bf16::from_f32(x).to_bits()
}

/// The operation of the `binary` kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    /// `add.rn.f32`.
    Add,
    /// `mul.rn.f32`.
    Mul,
    /// `div.rn.f32`.
    Div,
}

/// One element of the `binary` kernel: `a op b` in f32 (the operands already read as
/// f32), one IEEE operation, NaN canonical. The caller rounds it to the destination type.
pub fn binary(op: BinaryOp, a: f32, b: f32) -> f32 {
    match op {
        BinaryOp::Add => arith::add(a, b),
        BinaryOp::Mul => arith::mul(a, b),
        BinaryOp::Div => arith::div(a, b),
    }
}

/// One element of the `scale` kernel: `x * s` (`mul.rn.f32`).
pub fn scale(x: f32, s: f32) -> f32 {
    arith::mul(x, s)
}

fn rd16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn rd32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// One 32-value chunk of a quantised row, as `q_unpack` in `quant.ptx` returns it:
/// `value_i = fma(dw, (sc_i * (u_i - z)) as f32, fma(-dm, m_i as f32, mw))` with
/// `sc_i = sc[i / 16]`, `m_i = m[i / 16]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Chunk {
    /// The 32 unsigned quants.
    pub u: [u8; 32],
    /// Zero point subtracted from every quant.
    pub z: i32,
    /// Integer scales of values 0..16 and 16..32.
    pub sc: [i32; 2],
    /// Float scale.
    pub dw: f32,
    /// Float offset.
    pub mw: f32,
    /// Integer mins of values 0..16 and 16..32 (Q2_K; 0 for the other formats).
    pub m: [i32; 2],
    /// Float scale of the mins (Q2_K; 0 for the other formats).
    pub dm: f32,
}

/// Whether the quantised mul_mat and get_rows kernels handle `dtype`.
pub fn is_kernel_quant(dtype: DType) -> bool {
    dtype.is_weight_quant()
}

/// Chunk `j` (values `32j..32j+32`) of the quantised row `row`, or `None` for a dtype the
/// kernels do not handle or a row too short.
pub fn unpack_chunk(dtype: DType, row: &[u8], j: usize) -> Option<Chunk> {
    let mut c = Chunk {
        u: [0; 32],
        z: 0,
        sc: [1, 1],
        dw: 0.0,
        mw: 0.0,
        m: [0, 0],
        dm: 0.0,
    };
    let nibbles = |c: &mut Chunk, qs: &[u8], qh: u32| {
        for i in 0..16 {
            c.u[i] = (qs[i] & 0x0F) | ((((qh >> i) & 1) as u8) << 4);
            c.u[i + 16] = (qs[i] >> 4) | ((((qh >> (i + 16)) & 1) as u8) << 4);
        }
    };
    match dtype {
        DType::Q4_0 => {
            let b = row.get(18 * j..18 * j + 18)?;
            c.dw = f16_to_f32(rd16(b, 0));
            c.z = 8;
            nibbles(&mut c, &b[2..18], 0);
        }
        DType::Q4_1 => {
            let b = row.get(20 * j..20 * j + 20)?;
            c.dw = f16_to_f32(rd16(b, 0));
            c.mw = f16_to_f32(rd16(b, 2));
            nibbles(&mut c, &b[4..20], 0);
        }
        DType::Q5_0 => {
            let b = row.get(22 * j..22 * j + 22)?;
            c.dw = f16_to_f32(rd16(b, 0));
            c.z = 16;
            nibbles(&mut c, &b[6..22], rd32(b, 2));
        }
        DType::Q5_1 => {
            let b = row.get(24 * j..24 * j + 24)?;
            c.dw = f16_to_f32(rd16(b, 0));
            c.mw = f16_to_f32(rd16(b, 2));
            nibbles(&mut c, &b[8..24], rd32(b, 4));
        }
        DType::Q8_0 => {
            let b = row.get(34 * j..34 * j + 34)?;
            c.dw = f16_to_f32(rd16(b, 0));
            c.z = 128;
            for i in 0..32 {
                c.u[i] = b[2 + i] ^ 0x80;
            }
        }
        DType::Q2K => {
            let (sb, s) = (j / 8, j % 8);
            let b = row.get(84 * sb..84 * sb + 84)?;
            let (n, t) = (s / 4, s % 4);
            let (s0, s1) = (b[2 * s], b[2 * s + 1]);
            c.dw = f16_to_f32(rd16(b, 80));
            c.dm = f16_to_f32(rd16(b, 82));
            c.sc = [(s0 & 0x0F) as i32, (s1 & 0x0F) as i32];
            c.m = [(s0 >> 4) as i32, (s1 >> 4) as i32];
            let qs = &b[16 + 32 * n..48 + 32 * n];
            for i in 0..32 {
                c.u[i] = (qs[i] >> (2 * t)) & 3;
            }
        }
        DType::Q3K => {
            let (sb, s) = (j / 8, j % 8);
            let b = row.get(110 * sb..110 * sb + 110)?;
            let (n, t) = (s / 4, s % 4);
            let (hmask, qs, scales) = (&b[0..32], &b[32 + 32 * n..64 + 32 * n], &b[96..108]);
            let scale = |k: usize| {
                let lo = (scales[k % 8] >> (4 * (k / 8))) & 0x0F;
                let hi = (scales[8 + k % 4] >> (2 * (k / 4))) & 3;
                (lo | (hi << 4)) as i32 - 32
            };
            c.dw = f16_to_f32(rd16(b, 108));
            c.z = 4;
            c.sc = [scale(2 * s), scale(2 * s + 1)];
            for i in 0..32 {
                c.u[i] = ((qs[i] >> (2 * t)) & 3) | (((hmask[i] >> s) & 1) << 2);
            }
        }
        DType::Q4K | DType::Q5K => {
            let (sb, s) = (j / 8, j % 8);
            let (bs, qs_at) = if dtype == DType::Q4K {
                (144, 16)
            } else {
                (176, 48)
            };
            let b = row.get(bs * sb..bs * sb + bs)?;
            let d = f16_to_f32(rd16(b, 0));
            let dmin = f16_to_f32(rd16(b, 2));
            let q = &b[4..16];
            let (sc, m) = if s < 4 {
                (q[s] & 63, q[s + 4] & 63)
            } else {
                (
                    (q[s + 4] & 0xF) | ((q[s - 4] >> 6) << 4),
                    (q[s + 4] >> 4) | ((q[s] >> 6) << 4),
                )
            };
            c.dw = d;
            c.sc = [sc as i32, sc as i32];
            c.mw = -(dmin * m as f32);
            let qs = &b[qs_at + 32 * (s / 2)..qs_at + 32 * (s / 2) + 32];
            let shift = 4 * (s % 2);
            for i in 0..32 {
                c.u[i] = (qs[i] >> shift) & 0x0F;
                if dtype == DType::Q5K {
                    c.u[i] |= ((b[16 + i] >> s) & 1) << 4;
                }
            }
        }
        DType::Q6K => {
            let (sb, s) = (j / 8, j % 8);
            let b = row.get(210 * sb..210 * sb + 210)?;
            let (n, t) = (s / 4, s % 4);
            let ql = &b[64 * n + 32 * (t & 1)..64 * n + 32 * (t & 1) + 32];
            let qh = &b[128 + 32 * n..128 + 32 * n + 32];
            let scales = &b[192..208];
            c.dw = f16_to_f32(rd16(b, 208));
            c.z = 32;
            c.sc = [
                scales[8 * n + 2 * t] as i8 as i32,
                scales[8 * n + 2 * t + 1] as i8 as i32,
            ];
            for i in 0..32 {
                c.u[i] = ((ql[i] >> (4 * (t / 2))) & 0x0F) | (((qh[i] >> (2 * t)) & 3) << 4);
            }
        }
        _ => return None,
    }
    Some(c)
}

impl Chunk {
    /// Value `i` dequantised exactly as `get_rows_q` does.
    pub fn value(&self, i: usize) -> f32 {
        let q = self.sc[i / 16] * (self.u[i] as i32 - self.z);
        let mw = (-self.dm).mul_add(self.m[i / 16] as f32, self.mw);
        self.dw.mul_add(q as f32, mw)
    }
}

/// Dequantises `out.len()` values of a row of `dtype` (float types and the quantised
/// types of [`is_kernel_quant`]) as the get_rows kernels do. Returns `None` for other
/// dtypes or a short row.
pub fn dequantize_row(dtype: DType, row: &[u8], out: &mut [f32]) -> Option<()> {
    match dtype {
        DType::F32 => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = f32::from_le_bytes(row.get(4 * i..4 * i + 4)?.try_into().ok()?);
            }
        }
        DType::F16 | DType::BF16 => {
            for (i, o) in out.iter_mut().enumerate() {
                let bits = rd16(row.get(2 * i..2 * i + 2)?, 0);
                *o = if dtype == DType::F16 {
                    f16_to_f32(bits)
                } else {
                    bf16_to_f32(bits)
                };
            }
        }
        _ => {
            if out.len() % 32 != 0 {
                return None;
            }
            for (j, chunk) in out.chunks_mut(32).enumerate() {
                let c = unpack_chunk(dtype, row, j)?;
                for (i, o) in chunk.iter_mut().enumerate() {
                    *o = c.value(i);
                }
            }
        }
    }
    Some(())
}

/// Bytes of one Q8_1 block.
pub const Q8_1_BLOCK: usize = 36;

/// Quantises `x` (a multiple of 32 values) to Q8_1 blocks as `quantize_q8_1` does:
/// `d = amax / 127`, `q = round_half_away(x * (1/d))` (ggml's `roundf`), `s = d * Σq`, d and
/// s stored as f16. Step by step as the kernel: amax by `max.f32` (NaN skipped), the
/// rounding as truncation (`cvt.rzi`, saturating) plus a step away from zero where the
/// dropped fraction is at least one half, and the sum of the q wrapping at 32 bits, so
/// the bytes agree even for infinite or NaN inputs.
pub fn quantize_q8_1(x: &[f32], out: &mut [u8]) {
    use arith::{div, max, mul, rzi_s32, sub};
    for (blk, o) in x.chunks(32).zip(out.chunks_mut(Q8_1_BLOCK)) {
        let amax = blk.iter().map(|v| v.abs()).reduce(max).unwrap_or(0.0);
        let d = div(amax, 127.0);
        let id = if d == 0.0 { 0.0 } else { div(1.0, d) };
        let mut sum = 0i32;
        for (i, &v) in blk.iter().enumerate() {
            let y = mul(v, id);
            let t = rzi_s32(y);
            let away = if y.is_sign_negative() { -1 } else { 1 };
            let q = if sub(y, t as f32).abs() >= 0.5 {
                t.wrapping_add(away)
            } else {
                t
            };
            sum = sum.wrapping_add(q);
            o[4 + i] = q as u8;
        }
        let s = mul(d, sum as f32);
        o[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        o[2..4].copy_from_slice(&f32_to_f16(s).to_le_bytes());
    }
}

/// `acc` plus the contribution of chunk `c` times the Q8_1 block `a` (36 bytes), exactly
/// as `q8_fma` in `quant.ptx`.
pub fn chunk_fma(c: &Chunk, a: &[u8], acc: f32) -> f32 {
    let mut half = [0i32; 2];
    let mut asum = [0i32; 2];
    for (i, &u) in c.u.iter().enumerate() {
        half[i / 16] += (u as i32 - c.z) * (a[4 + i] as i8 as i32);
        asum[i / 16] += a[4 + i] as i8 as i32;
    }
    let sumi = c.sc[0]
        .wrapping_mul(half[0])
        .wrapping_add(c.sc[1].wrapping_mul(half[1]));
    let da = f16_to_f32(rd16(a, 0));
    let sa = f16_to_f32(rd16(a, 2));
    let acc = (c.dw * da).mul_add(sumi as f32, acc);
    let acc = c.mw.mul_add(sa, acc);
    if c.dm != 0.0 {
        let mi = c.m[0]
            .wrapping_mul(asum[0])
            .wrapping_add(c.m[1].wrapping_mul(asum[1]));
        (-(c.dm * da)).mul_add(mi as f32, acc)
    } else {
        acc
    }
}

/// The butterfly `shfl.xor` tree over 32 lane partials (offsets 16, 8, 4, 2, 1), as every
/// kernel combines its partials. Returns lane 0's result (all lanes agree).
pub fn butterfly_sum(p: [f32; LANES]) -> f32 {
    butterfly(p)
}

/// The butterfly `shfl.xor` tree over `N` lane partials (a power of two; offsets N/2,
/// ..., 2, 1), each lane adding its partner's value to its own. Lane 0's result.
fn butterfly<const N: usize>(mut p: [f32; N]) -> f32 {
    let mut off = N / 2;
    while off > 0 {
        let prev = p;
        for (l, v) in p.iter_mut().enumerate() {
            *v = prev[l] + prev[l ^ off];
        }
        off /= 2;
    }
    p[0]
}

/// One output element of the tiled class of the current quantised products (`qmm` with
/// [`MMQ_MIN_N`](crate::MMQ_MIN_N) columns or more, `qgemm`, and their fused forms):
/// weight row `w` of `dtype` times the Q8_1 row `a`, over `nchunks` chunks of 32, as ONE
/// sequential chain: `acc = 0`, then [`chunk_fma`] for chunk 0, 1, 2, ... in this order.
pub fn mul_mat_q_dot(dtype: DType, w: &[u8], a: &[u8], nchunks: usize) -> Option<f32> {
    let mut acc = 0.0f32;
    for j in 0..nchunks {
        let c = unpack_chunk(dtype, w, j)?;
        let ab = a.get(Q8_1_BLOCK * j..Q8_1_BLOCK * (j + 1))?;
        acc = chunk_fma(&c, ab, acc);
    }
    Some(acc)
}

/// One output element of the decode class of the current quantised products (`qmm` with
/// fewer than [`MMQ_MIN_N`](crate::MMQ_MIN_N) columns, MUL_MAT_ID, and their fused
/// forms): as [`mul_mat_q_dot`], but chunk `j` feeds partial `j mod 8` (each a chain in
/// chunk order), and the 8 partials meet in the butterfly over lane distances 4, 2, 1:
/// `((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7))`.
pub fn mul_mat_q_dot_lanes(dtype: DType, w: &[u8], a: &[u8], nchunks: usize) -> Option<f32> {
    let mut p = [0.0f32; crate::launch::QMM_DECODE_LANES];
    for j in 0..nchunks {
        let c = unpack_chunk(dtype, w, j)?;
        let ab = a.get(Q8_1_BLOCK * j..Q8_1_BLOCK * (j + 1))?;
        let l = j % p.len();
        p[l] = chunk_fma(&c, ab, p[l]);
    }
    Some(butterfly(p))
}

/// One output element of a quantised product of `n` columns: [`mul_mat_q_dot_lanes`]
/// in the decode class (`n` below [`MMQ_MIN_N`](crate::MMQ_MIN_N)), else
/// [`mul_mat_q_dot`].
pub fn mul_mat_q_dot_class(
    n: usize,
    dtype: DType,
    w: &[u8],
    a: &[u8],
    nchunks: usize,
) -> Option<f32> {
    match crate::mul_mat_class(n) {
        crate::MulMatClass::Mmvq => mul_mat_q_dot_lanes(dtype, w, a, nchunks),
        crate::MulMatClass::Mmq => mul_mat_q_dot(dtype, w, a, nchunks),
    }
}

/// One output element of the first-generation quantised kernels (`mmvq`, `mmq`,
/// `mmvq_id`, run with `CudaTuning::legacy_products`): chunk `j` feeds the partial of lane
/// `j mod 32`, and the 32 partials meet in the butterfly tree.
pub fn mul_mat_q_dot_legacy(dtype: DType, w: &[u8], a: &[u8], nchunks: usize) -> Option<f32> {
    let mut lanes = [0.0f32; LANES];
    for j in 0..nchunks {
        let c = unpack_chunk(dtype, w, j)?;
        let ab = a.get(Q8_1_BLOCK * j..Q8_1_BLOCK * (j + 1))?;
        lanes[j % LANES] = chunk_fma(&c, ab, lanes[j % LANES]);
    }
    Some(butterfly_sum(lanes))
}

/// One output element of `mul_mat_f` with weights of type `weight` (F32, F16 or BF16),
/// given as f32 values `a`: `Σ a_k b_k` with lane `k mod 32` partials; for f16 (bf16)
/// weights each `b_k` is first rounded to f16 (bf16).
pub fn mul_mat_f_dot(weight: DType, a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    for (k, (&x, &y)) in a.iter().zip(b).enumerate() {
        let y = match weight {
            DType::F16 => f16_to_f32(f32_to_f16(y)),
            DType::BF16 => bf16_to_f32(f32_to_bf16(y)),
            _ => y,
        };
        lanes[k % LANES] = x.mul_add(y, lanes[k % LANES]);
    }
    butterfly_sum(lanes)
}

/// `rms_norm` of one row in the kernel's order.
pub fn rms_norm_row(x: &[f32], eps: f32, out: &mut [f32]) {
    let mut lanes = [0.0f32; LANES];
    for (i, &v) in x.iter().enumerate() {
        lanes[i % LANES] = v.mul_add(v, lanes[i % LANES]);
    }
    let mean = butterfly_sum(lanes) / x.len() as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * scale;
    }
}

/// `clamp` as the kernel computes it: `m = x < hi ? x : hi`, then `m > lo ? m : lo`, and
/// NaN passed through unchanged (ggml's `MIN`/`MAX` macros, NaN kept).
pub fn clamp(x: f32, lo: f32, hi: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let m = if x < hi { x } else { hi };
    if m > lo {
        m
    } else {
        lo
    }
}

/// `sum_rows` of one row as the kernel computes it: an f64 accumulator from +0, each
/// value added in index order, one rounding to f32 at the end (ggml's CPU order).
pub fn sum_row(x: &[f32]) -> f32 {
    let mut acc = 0f64;
    for &v in x {
        acc += f64::from(v);
    }
    acc as f32
}

/// The u32 key of `x` in `argsort_top_k`: its unsigned order is the op's order (larger
/// key first): NaN (any sign or payload) is 0, below every number; `-0` and `+0` share
/// one key; otherwise the bits with the sign flipped (x >= 0) or all bits flipped (x < 0).
pub fn top_k_key(x: f32) -> u32 {
    if x.is_nan() {
        return 0;
    }
    let b = if x == 0.0 { 0 } else { x.to_bits() };
    if b >> 31 == 1 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// `argsort_top_k` of one row as the kernel computes it: element `i` has the 64-bit sort
/// key `(top_k_key(x_i) << 32) | (u32::MAX - i)`, its rank is the number of larger sort
/// keys, and `out[rank] = i` for the ranks below `out.len()`.
pub fn argsort_top_k_row(x: &[f32], out: &mut [i32]) {
    let key = |i: usize| ((top_k_key(x[i]) as u64) << 32) | (u32::MAX - i as u32) as u64;
    for i in 0..x.len() {
        let ki = key(i);
        let rank = (0..x.len()).filter(|&j| key(j) > ki).count();
        if rank < out.len() {
            out[rank] = i as i32;
        }
    }
}

/// `ex2.approx.f32` as this reference models it: the correctly rounded 2^x (what cuda-sim
/// gives with its approx check off). A GPU may return a result up to 2 ulp away (the PTX
/// ISA's bound; cuda-sim's approx check moves to that bound), so results that go through
/// it are compared by NMSE, and bit for bit only against cuda-sim without the check.
pub fn ex2_approx(x: f32) -> f32 {
    (x as f64).exp2() as f32
}

/// `lg2.approx.f32` as modelled here: the correctly rounded log2 (see [`ex2_approx`]).
pub fn lg2_approx(x: f32) -> f32 {
    (x as f64).log2() as f32
}

/// log2(e) as the kernels write it (0f3FB8AA3B).
const LOG2E: f32 = f32::from_bits(0x3FB8_AA3B);

/// One FLASH_ATTN_EXT for the tiled kernel `flash_attn_dec` to follow (any number of
/// queries): queries `q`
/// `[d, n_q, h, ne3]`, keys `k` `[d, n_kv, h_kv, ne3]` and values `v`
/// `[dv, n_kv, h_kv, ne3]` as f32 (f16 K/V already widened), the mask `[n_kv, n_q]`, all
/// contiguous.
#[derive(Clone, Copy, Debug)]
pub struct AttnDecode<'a> {
    /// Queries.
    pub q: &'a [f32],
    /// Keys.
    pub k: &'a [f32],
    /// Values.
    pub v: &'a [f32],
    /// Mask values (row `iq` at `iq * n_kv`), or none.
    pub mask: Option<&'a [f32]>,
    /// Head size of q and k.
    pub d: usize,
    /// Head size of v.
    pub dv: usize,
    /// KV positions.
    pub n_kv: usize,
    /// Queries.
    pub n_q: usize,
    /// Query heads.
    pub h: usize,
    /// KV heads (dividing `h`).
    pub h_kv: usize,
    /// Batches in dimension 3.
    pub ne3: usize,
    /// Whether K is f16 (the kernel then rounds q to f16).
    pub k_f16: bool,
    /// Factor of q.k.
    pub scale: f32,
    /// Logit soft-capping (0 = off).
    pub softcap: f32,
    /// ALiBi maximum bias (0 = off).
    pub max_bias: f32,
}

/// The output `[dv, h, n_q, ne3]` of `flash_attn_dec`, operation for operation in the
/// kernel's order (see the kernel's header in `kernels/flash_attn.ptx`), with `.approx`
/// instructions as [`ex2_approx`] and [`lg2_approx`].
pub fn flash_attn_decode(p: &AttnDecode<'_>) -> Vec<f32> {
    const TILE: usize = 128;
    const QUARTER: usize = 32;
    let (d, dv, n_kv, n_q, h) = (p.d, p.dv, p.n_kv, p.n_q, p.h);
    let gqa = h / p.h_kv;
    let tiles = n_kv.div_ceil(TILE).max(1);
    let n_head_log2 = 1usize << (usize::BITS - 1 - h.max(1).leading_zeros());
    let m0 = 2f32.powf(-p.max_bias / n_head_log2 as f32);
    let m1 = 2f32.powf(-(p.max_bias / 2.0) / n_head_log2 as f32);
    let mut out = vec![0f32; dv * h * n_q * p.ne3];
    for i3 in 0..p.ne3 {
        for iq in 0..n_q {
            for hh in 0..h {
                let hk = hh / gqa;
                let q: Vec<f32> = p.q[d * (iq + n_q * (hh + h * i3))..][..d]
                    .iter()
                    .map(|&x| match p.k_f16 {
                        true => f16_to_f32(f32_to_f16(x)),
                        false => x,
                    })
                    .collect();
                let slope = if p.max_bias > 0.0 {
                    let (base, e) = match hh < n_head_log2 {
                        true => (m0, hh + 1),
                        false => (m1, 2 * (hh - n_head_log2) + 1),
                    };
                    ex2_approx(lg2_approx(base) * e as f32)
                } else {
                    1.0
                };
                let kv_row = |j: usize| j + n_kv * (hk + p.h_kv * i3);
                // Each tile's (m, s, a); m = -inf for a tile without live positions.
                let mut parts: Vec<AttnPartial> = Vec::with_capacity(tiles);
                for tile in 0..tiles {
                    let live = |t: usize| tile * TILE + t < n_kv;
                    let mut sc = [f32::NEG_INFINITY; TILE];
                    for (t, s) in sc.iter_mut().enumerate().filter(|(t, _)| live(*t)) {
                        let j = tile * TILE + t;
                        let mv = p.mask.map_or(0.0, |m| m[iq * n_kv + j]);
                        if mv == f32::NEG_INFINITY {
                            continue;
                        }
                        let kr = &p.k[d * kv_row(j)..][..d];
                        let mut x = 0f32;
                        for (a, b) in q.iter().zip(kr) {
                            x = a.mul_add(*b, x);
                        }
                        x *= p.scale;
                        if p.softcap > 0.0 {
                            let y = x / p.softcap;
                            let e = ex2_approx(y.abs() * f32::from_bits(0xC038_AA3B));
                            let th = (1.0 - e) / (1.0 + e);
                            x = p.softcap * if y < 0.0 { -th } else { th };
                        }
                        *s = x + slope * mv;
                    }
                    let m = sc.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
                    let pj: Vec<Option<f32>> = sc
                        .iter()
                        .map(|&s| (s != f32::NEG_INFINITY).then(|| ex2_approx((s - m) * LOG2E)))
                        .collect();
                    let mut a = vec![0f32; dv];
                    let mut s = 0f32;
                    for c in 0..TILE / QUARTER {
                        let mut ac = vec![0f32; dv];
                        let mut sc = 0f32;
                        for t in c * QUARTER..(c + 1) * QUARTER {
                            let Some(pt) = pj[t] else { continue };
                            let vr = &p.v[dv * kv_row(tile * TILE + t)..][..dv];
                            for (x, y) in ac.iter_mut().zip(vr) {
                                *x = pt.mul_add(*y, *x);
                            }
                            sc += pt;
                        }
                        if c == 0 {
                            (a, s) = (ac, sc);
                        } else {
                            for (x, y) in a.iter_mut().zip(&ac) {
                                *x += y;
                            }
                            s += sc;
                        }
                    }
                    parts.push(AttnPartial { m, l: s, o: a });
                }
                combine_in_order(&parts, &mut out[dv * (hh + h * (iq + n_q * i3))..][..dv]);
            }
        }
    }
    out
}

/// The output `[dv, h, n_q, ne3]` of `flash_attn_mma` (f16 K and V, D = Dv, no
/// soft-capping or ALiBi: `p.softcap` and `p.max_bias` must be 0), operation for operation
/// in the kernel's order (see the kernel's header in `kernels/fattn_mma.ptx`): each
/// `mma.sync` element as `model` computes it (cuda-sim's [`MmaModel::SM90`] by default),
/// `.approx` instructions as [`ex2_approx`], the KV chunks combined in order. `p.k` and
/// `p.v` hold f16 values.
///
/// [`MmaModel::SM90`]: cuda_sim::tensor::MmaModel::SM90
pub fn flash_attn_mma(p: &AttnDecode<'_>, model: &cuda_sim::tensor::MmaModel) -> Vec<f32> {
    assert!(p.softcap == 0.0 && p.max_bias == 0.0 && p.d == p.dv && p.d % 16 == 0);
    let (d, n_kv, n_q, h) = (p.d, p.n_kv, p.n_q, p.h);
    let gqa = h / p.h_kv;
    let tiles = n_kv.div_ceil(MMA_TILE);
    let chunks = tiles.div_ceil(crate::launch::FA_MMA_CHUNK_TILES).max(1);
    let mut out = vec![0f32; d * h * n_q * p.ne3];
    for i3 in 0..p.ne3 {
        for hk in 0..p.h_kv {
            let first = n_kv * (hk + p.h_kv * i3);
            let k16: Vec<u16> = p.k[d * first..d * (first + n_kv)]
                .iter()
                .map(|&x| f32_to_f16(x))
                .collect();
            // V transposed (positions past n_kv zero): column e is an mma's B column.
            let mut vt = vec![0u16; d * tiles * MMA_TILE];
            for j in 0..n_kv {
                for e in 0..d {
                    vt[e * tiles * MMA_TILE + j] = f32_to_f16(p.v[d * (first + j) + e]);
                }
            }
            let kv = MmaKv {
                k16: &k16,
                vt: &vt,
                tiles,
                n_kv,
                d,
            };
            for iq in 0..n_q {
                for hh in hk * gqa..(hk + 1) * gqa {
                    let q16: Vec<u16> = p.q[d * (iq + n_q * (hh + h * i3))..][..d]
                        .iter()
                        .map(|&x| f32_to_f16(x))
                        .collect();
                    let mask = p.mask.map(|m| &m[iq * n_kv..(iq + 1) * n_kv]);
                    let parts: Vec<AttnPartial> = (0..chunks)
                        .map(|c| mma_chunk(&kv, &q16, mask, p.scale, c, model))
                        .collect();
                    // One live chunk gives its own o * (1 / l) exactly.
                    combine_in_order(&parts, &mut out[d * (hh + h * (iq + n_q * i3))..][..d]);
                }
            }
        }
    }
    out
}

/// KV positions per tile of `flash_attn_mma`.
const MMA_TILE: usize = crate::launch::FA_MMA_TILE;

/// One KV head's keys and values as [`flash_attn_mma`] reads them.
struct MmaKv<'a> {
    /// f16 keys, row j at `d * j`.
    k16: &'a [u16],
    /// f16 values transposed: `vt[e * tiles * 64 + j]`.
    vt: &'a [u16],
    tiles: usize,
    n_kv: usize,
    d: usize,
}

/// One query row's online-softmax state over part of the KV range (a tile of
/// `flash_attn_dec`, a chunk of `flash_attn_mma`): max, sum of weights, weighted values.
struct AttnPartial {
    m: f32,
    l: f32,
    o: Vec<f32>,
}

/// The tiled attention kernels' combine of a row's partials, in their order: M = max m;
/// for each partial with m > -inf, f = ex2.approx((m - M) log2 e), L = fma(l, f, L),
/// o = fma(o_p, f, o) from 0; `row` = o * (1 / L), or +0 when L = 0.
fn combine_in_order(parts: &[AttnPartial], row: &mut [f32]) {
    let big = parts.iter().fold(f32::NEG_INFINITY, |a, p| a.max(p.m));
    let (mut l, mut o) = (0f32, vec![0f32; row.len()]);
    for p in parts.iter().filter(|p| p.m != f32::NEG_INFINITY) {
        let f = ex2_approx((p.m - big) * LOG2E);
        l = p.l.mul_add(f, l);
        for (x, y) in o.iter_mut().zip(&p.o) {
            *x = y.mul_add(f, *x);
        }
    }
    let inv = if l == 0.0 { 0.0 } else { 1.0 / l };
    for (r, x) in row.iter_mut().zip(&o) {
        *r = x * inv;
    }
}

/// The (m, l, o) of one query row over the tiles of KV chunk `chunk`, from a fresh state.
fn mma_chunk(
    kv: &MmaKv<'_>,
    q16: &[u16],
    mask: Option<&[f32]>,
    scale: f32,
    chunk: usize,
    model: &cuda_sim::tensor::MmaModel,
) -> AttnPartial {
    use cuda_sim::tensor::HalfInput;
    let d = kv.d;
    let mma =
        |c: f32, a: &[u16], b: &[u16]| f32::from_bits(model.dot(HalfInput::F16, c.to_bits(), a, b));
    let per = crate::launch::FA_MMA_CHUNK_TILES;
    let (mut m, mut l, mut o) = (f32::NEG_INFINITY, 0f32, vec![0f32; d]);
    for tile in chunk * per..((chunk + 1) * per).min(kv.tiles) {
        let mut s = [f32::NEG_INFINITY; MMA_TILE];
        for (t, sj) in s.iter_mut().enumerate() {
            let j = tile * MMA_TILE + t;
            if j >= kv.n_kv {
                continue;
            }
            let kj = &kv.k16[d * j..d * (j + 1)];
            let mut acc = 0f32;
            for st in 0..d / 16 {
                acc = mma(acc, &q16[16 * st..16 * st + 16], &kj[16 * st..16 * st + 16]);
            }
            *sj = acc * scale + mask.map_or(0.0, |mk| mk[j]);
        }
        let x = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let big = m.max(x);
        let u = if big == f32::NEG_INFINITY { 0.0 } else { big };
        let c = ex2_approx((m - u) * LOG2E);
        m = big;
        let pj: Vec<f32> = s.iter().map(|&sj| ex2_approx((sj - u) * LOG2E)).collect();
        // Lane k's 16 values (positions 8n + 2k, 8n + 2k + 1) by a pairwise tree.
        let lane = |k: usize| {
            let mut v: Vec<f32> = (0..MMA_TILE / 8)
                .flat_map(|n| [pj[8 * n + 2 * k], pj[8 * n + 2 * k + 1]])
                .collect();
            while v.len() > 1 {
                v = v.chunks(2).map(|w| w[0] + w[1]).collect();
            }
            v[0]
        };
        l = l.mul_add(c, (lane(0) + lane(1)) + (lane(2) + lane(3)));
        let p16: Vec<u16> = pj.iter().map(|&x| f32_to_f16(x)).collect();
        for (e, oe) in o.iter_mut().enumerate() {
            *oe *= c;
            let col = &kv.vt[e * kv.tiles * MMA_TILE + tile * MMA_TILE..][..MMA_TILE];
            for kk in 0..MMA_TILE / 16 {
                *oe = mma(
                    *oe,
                    &p16[16 * kk..16 * kk + 16],
                    &col[16 * kk..16 * kk + 16],
                );
            }
        }
    }
    AttnPartial { m, l, o }
}

/// Normalised mean squared error `Σ(a−b)² / Σb²` (llama.cpp's test-backend-ops metric),
/// with `b` the reference. 0 when both are all zeros.
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let d = x as f64 - y as f64;
        num += d * d;
        den += y as f64 * y as f64;
    }
    if num == 0.0 {
        0.0
    } else {
        num / den
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ggml_test_kit::{lcg_quant_rows, Lcg, QUANT_DTYPES};

    /// ggml's own dequantisation loops (ggml-quants.c), written independently of
    /// `unpack_chunk` (Q2_K, Q3_K and Q5_K: ggml-core's port of them), for cross-checking the
    /// chunk interpretation.
    fn ggml_dequant(dtype: DType, row: &[u8], n: usize) -> Vec<f32> {
        let mut y = vec![0f32; n];
        match dtype {
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => {
                let ts = dtype.type_size();
                for (i, blk) in row.chunks(ts).enumerate() {
                    let d = f16_to_f32(rd16(blk, 0));
                    let y = &mut y[32 * i..32 * i + 32];
                    match dtype {
                        DType::Q4_0 => {
                            for j in 0..16 {
                                y[j] = ((blk[2 + j] & 0xF) as i32 - 8) as f32 * d;
                                y[j + 16] = ((blk[2 + j] >> 4) as i32 - 8) as f32 * d;
                            }
                        }
                        DType::Q4_1 => {
                            let m = f16_to_f32(rd16(blk, 2));
                            for j in 0..16 {
                                y[j] = (blk[4 + j] & 0xF) as f32 * d + m;
                                y[j + 16] = (blk[4 + j] >> 4) as f32 * d + m;
                            }
                        }
                        DType::Q5_0 | DType::Q5_1 => {
                            let (qh_at, qs_at, m) = if dtype == DType::Q5_0 {
                                (2, 6, None)
                            } else {
                                (4, 8, Some(f16_to_f32(rd16(blk, 2))))
                            };
                            let qh = rd32(blk, qh_at);
                            for j in 0..16 {
                                let xh0 = (((qh >> j) << 4) & 0x10) as u8;
                                let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
                                let x0 = ((blk[qs_at + j] & 0x0F) | xh0) as i32;
                                let x1 = ((blk[qs_at + j] >> 4) | xh1) as i32;
                                match m {
                                    None => {
                                        y[j] = (x0 - 16) as f32 * d;
                                        y[j + 16] = (x1 - 16) as f32 * d;
                                    }
                                    Some(m) => {
                                        y[j] = x0 as f32 * d + m;
                                        y[j + 16] = x1 as f32 * d + m;
                                    }
                                }
                            }
                        }
                        _ => {
                            for j in 0..32 {
                                y[j] = blk[2 + j] as i8 as f32 * d;
                            }
                        }
                    }
                }
            }
            DType::Q4K => {
                for (i, blk) in row.chunks(144).enumerate() {
                    let d = f16_to_f32(rd16(blk, 0));
                    let dmin = f16_to_f32(rd16(blk, 2));
                    let sc = &blk[4..16];
                    let get = |j: usize| {
                        if j < 4 {
                            (sc[j] & 63, sc[j + 4] & 63)
                        } else {
                            (
                                (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4),
                                (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4),
                            )
                        }
                    };
                    let mut out = 256 * i;
                    let mut q = 16;
                    let mut is = 0;
                    for _ in 0..4 {
                        let (s1, m1) = get(is);
                        let (s2, m2) = get(is + 1);
                        let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
                        let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
                        for l in 0..32 {
                            y[out + l] = d1 * (blk[q + l] & 0xF) as f32 - m1;
                        }
                        for l in 0..32 {
                            y[out + 32 + l] = d2 * (blk[q + l] >> 4) as f32 - m2;
                        }
                        out += 64;
                        q += 32;
                        is += 2;
                    }
                }
            }
            DType::Q6K => {
                for (i, blk) in row.chunks(210).enumerate() {
                    let d = f16_to_f32(rd16(blk, 208));
                    for n in 0..2 {
                        let (ql, qh, sc) = (64 * n, 128 + 32 * n, 192 + 8 * n);
                        let y = &mut y[256 * i + 128 * n..256 * i + 128 * n + 128];
                        for l in 0..32 {
                            let is = l / 16;
                            let q1 = ((blk[ql + l] & 0xF) | ((blk[qh + l] & 3) << 4)) as i32 - 32;
                            let q2 = ((blk[ql + l + 32] & 0xF) | (((blk[qh + l] >> 2) & 3) << 4))
                                as i32
                                - 32;
                            let q3 =
                                ((blk[ql + l] >> 4) | (((blk[qh + l] >> 4) & 3) << 4)) as i32 - 32;
                            let q4 = ((blk[ql + l + 32] >> 4) | (((blk[qh + l] >> 6) & 3) << 4))
                                as i32
                                - 32;
                            let s = |k: usize| blk[sc + is + k] as i8 as f32;
                            y[l] = d * s(0) * q1 as f32;
                            y[l + 32] = d * s(2) * q2 as f32;
                            y[l + 64] = d * s(4) * q3 as f32;
                            y[l + 96] = d * s(6) * q4 as f32;
                        }
                    }
                }
            }
            // ggml-core's port of ggml's dequantize_row_*.
            _ => ggml_core::quant::dequantize_row(dtype, row, &mut y).unwrap(),
        }
        y
    }

    #[test]
    fn chunks_match_ggml_dequantisation() {
        let mut rng = Lcg(7);
        for dt in QUANT_DTYPES {
            let row = lcg_quant_rows(dt, 512, &mut rng, 0.01);
            let want = ggml_dequant(dt, &row, 512);
            let mut got = vec![0f32; 512];
            dequantize_row(dt, &row, &mut got).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let tol = 1e-6 * w.abs().max(1e-3);
                assert!((g - w).abs() <= tol, "{dt} value {i}: {g} vs {w}");
            }
        }
    }

    #[test]
    fn q8_1_quantisation() {
        let mut rng = Lcg(3);
        let x: Vec<f32> = (0..64).map(|_| rng.f() * 3.0).collect();
        let mut q = vec![0u8; 2 * Q8_1_BLOCK];
        quantize_q8_1(&x, &mut q);
        for (b, blk) in q.chunks(Q8_1_BLOCK).enumerate() {
            let d = f16_to_f32(rd16(blk, 0));
            let s = f16_to_f32(rd16(blk, 2));
            let sum: i32 = blk[4..].iter().map(|&v| v as i8 as i32).sum();
            assert!((s - d * sum as f32).abs() <= 1e-3 * s.abs().max(1.0));
            for i in 0..32 {
                let v = blk[4 + i] as i8 as f32 * d;
                assert!((v - x[32 * b + i]).abs() <= d * 0.51 + 1e-3);
            }
        }
        let zeros = [0f32; 32];
        let mut qz = [0xAAu8; Q8_1_BLOCK];
        quantize_q8_1(&zeros, &mut qz);
        assert!(qz.iter().all(|&v| v == 0));
    }

    #[test]
    fn q8_1_rounds_ties_away_from_zero_as_ggml() {
        // amax 127 makes d = 1, so x * (1/d) is x: ties at every half.
        let mut x = [0f32; 32];
        x[0] = 127.0;
        for (i, v) in x.iter_mut().enumerate().skip(1) {
            *v = (i as f32 - 16.0) + 0.5;
        }
        let mut ours = [0u8; Q8_1_BLOCK];
        quantize_q8_1(&x, &mut ours);
        let mut ggml = [0u8; Q8_1_BLOCK];
        ggml_core::quant::quantize_row(DType::Q8_1, &x, &mut ggml).unwrap();
        assert_eq!(ours, ggml);
        assert_eq!(ours[4 + 16] as i8, 1, "0.5 rounds to 1");
        assert_eq!(ours[4 + 15] as i8, -1, "-0.5 rounds to -1");
        assert_eq!(ours[4 + 18] as i8, 3, "2.5 rounds to 3");
    }

    #[test]
    fn quantised_dot_matches_dequantised_dot() {
        let mut rng = Lcg(11);
        let k = 512;
        let x: Vec<f32> = (0..k).map(|_| rng.f()).collect();
        let mut xq = vec![0u8; k / 32 * Q8_1_BLOCK];
        quantize_q8_1(&x, &mut xq);
        let mut xd = vec![0f32; k];
        for (j, blk) in xq.chunks(Q8_1_BLOCK).enumerate() {
            let d = f16_to_f32(rd16(blk, 0));
            for i in 0..32 {
                xd[32 * j + i] = blk[4 + i] as i8 as f32 * d;
            }
        }
        for dt in QUANT_DTYPES {
            let w = lcg_quant_rows(dt, k, &mut rng, 0.01);
            let mut wd = vec![0f32; k];
            dequantize_row(dt, &w, &mut wd).unwrap();
            let exact: f64 = wd.iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum();
            let got = mul_mat_q_dot(dt, &w, &xq, k / 32).unwrap() as f64;
            let legacy = mul_mat_q_dot_legacy(dt, &w, &xq, k / 32).unwrap() as f64;
            let scale: f64 = wd
                .iter()
                .zip(&xd)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            // The min terms use s = f16(d * Σq), hence the small tolerance.
            for (order, v) in [("sequential", got), ("legacy", legacy)] {
                assert!(
                    (v - exact).abs() <= 2e-3 * scale + 1e-6,
                    "{dt} {order}: {v} vs {exact}"
                );
            }
        }
    }

    /// A Q8_0 row of `nchunks` chunks and its Q8_1 activation: chunk 0 contributes t0 =
    /// 16 * 32 * 127 * 127 = 8258048 (f32 ulp 0.5), each chunk of `small` 0.25 (sumi 128 at
    /// d = 1/512), the others 0.
    fn tie_row(nchunks: usize, small: &[usize]) -> (Vec<u8>, Vec<u8>) {
        let mut w = vec![0u8; nchunks * 34];
        let mut x = vec![0f32; 32 * nchunks];
        for j in 0..nchunks {
            w[34 * j..34 * j + 2].copy_from_slice(&f32_to_f16(1.0).to_le_bytes());
        }
        w[2..34].fill(127);
        x[..32].fill(127.0 * 16.0);
        for &j in small {
            w[34 * j + 2] = 1;
            w[34 * j + 3] = 1;
            x[32 * j] = 127.0 / 512.0;
            x[32 * j + 1] = 1.0 / 512.0;
        }
        let mut xq = vec![0u8; nchunks * Q8_1_BLOCK];
        quantize_q8_1(&x, &mut xq);
        (w, xq)
    }

    #[test]
    fn sequential_dot_adds_chunks_in_index_order() {
        // In index order each 0.25 is a tie that rounds back to t0; any other order adds
        // 0.25 + 0.25 first and ends at t0 + 0.5.
        let (w, xq) = tie_row(3, &[1, 2]);
        let got = mul_mat_q_dot(DType::Q8_0, &w, &xq, 3).unwrap();
        assert_eq!(got, 8258048.0);
        let reordered = 8258048.0f32 + (0.25f32 + 0.25);
        assert_eq!(reordered, 8258048.5);
        // A row too short for its chunks has no dot.
        assert!(mul_mat_q_dot(DType::Q8_0, &w[..60], &xq, 3).is_none());
    }

    #[test]
    fn lanes_dot_feeds_partial_j_mod_8() {
        // 16 chunks, chunks 1 and 9 of 0.25: sequentially each is a tie that rounds back
        // to t0; in the decode class both land in partial 1 (0.5), which the butterfly
        // adds to t0 exactly.
        let (w, xq) = tie_row(16, &[1, 9]);
        assert_eq!(mul_mat_q_dot(DType::Q8_0, &w, &xq, 16).unwrap(), 8258048.0);
        assert_eq!(
            mul_mat_q_dot_lanes(DType::Q8_0, &w, &xq, 16).unwrap(),
            8258048.5
        );
        assert_eq!(
            mul_mat_q_dot_class(1, DType::Q8_0, &w, &xq, 16).unwrap(),
            8258048.5
        );
        assert_eq!(
            mul_mat_q_dot_class(8, DType::Q8_0, &w, &xq, 16).unwrap(),
            8258048.0
        );
        assert!(mul_mat_q_dot_lanes(DType::Q8_0, &w[..60], &xq, 3).is_none());
    }

    #[test]
    fn butterfly_is_a_sum_and_lane_symmetric() {
        let mut p = [0f32; LANES];
        for (i, v) in p.iter_mut().enumerate() {
            *v = i as f32;
        }
        assert_eq!(butterfly_sum(p), (0..32).sum::<i32>() as f32);
        let mut rng = Lcg(5);
        let x: Vec<f32> = (0..1000).map(|_| rng.f()).collect();
        let ones = vec![1f32; 1000];
        let s = mul_mat_f_dot(DType::F32, &x, &ones) as f64;
        let exact: f64 = x.iter().map(|&v| v as f64).sum();
        assert!((s - exact).abs() < 1e-4);
    }

    #[test]
    fn reduction_order_ignores_padding() {
        // Zero padding past K changes nothing (element i always feeds lane i mod 32).
        let mut rng = Lcg(9);
        let a: Vec<f32> = (0..100).map(|_| rng.f()).collect();
        let b: Vec<f32> = (0..100).map(|_| rng.f()).collect();
        let mut ap = a.clone();
        let mut bp = b.clone();
        ap.resize(160, 0.0);
        bp.resize(160, 0.0);
        assert_eq!(
            mul_mat_f_dot(DType::F32, &a, &b).to_bits(),
            mul_mat_f_dot(DType::F32, &ap, &bp).to_bits()
        );
    }

    #[test]
    fn float_dot_rounds_activations_to_the_weight_type() {
        // 1 + 2^-8 is exact in f16 but a tie in bf16 (rounds to even: 1).
        let (a, b) = ([1.0f32], [1.0f32 + 1.0 / 256.0]);
        assert_eq!(mul_mat_f_dot(DType::F32, &a, &b), b[0]);
        assert_eq!(mul_mat_f_dot(DType::F16, &a, &b), b[0]);
        assert_eq!(mul_mat_f_dot(DType::BF16, &a, &b), 1.0);
        let c = [1.0f32 + 1.0 / 4096.0];
        assert_eq!(mul_mat_f_dot(DType::F16, &a, &c), 1.0);
    }

    #[test]
    fn top_k_keys_order_as_the_op() {
        // Descending, -0 == +0, NaN (any sign or payload) last and equal.
        let ordered = [
            f32::INFINITY,
            f32::MAX,
            1.0,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            0.0,
            -f32::from_bits(1),
            -1.0,
            f32::MIN,
            f32::NEG_INFINITY,
        ];
        for w in ordered.windows(2) {
            assert!(top_k_key(w[0]) > top_k_key(w[1]), "{} vs {}", w[0], w[1]);
        }
        assert_eq!(top_k_key(-0.0), top_k_key(0.0));
        for nan in [f32::NAN, -f32::NAN, f32::from_bits(0x7f80_0001)] {
            assert_eq!(top_k_key(nan), 0);
            assert!(top_k_key(f32::NEG_INFINITY) > 0);
        }
        let x = [1.0, f32::NAN, 3.0, -0.0, 3.0, 0.0, f32::NAN, -2.0];
        let mut out = [0i32; 8];
        argsort_top_k_row(&x, &mut out);
        assert_eq!(out, [2, 4, 0, 3, 5, 7, 1, 6]);
        let mut top2 = [0i32; 2];
        argsort_top_k_row(&x, &mut top2);
        assert_eq!(top2, [2, 4]);
    }

    #[test]
    fn sum_row_is_f64_in_order() {
        // In f32 the 1.0 would vanish; in f64 it survives until the final rounding.
        assert_eq!(sum_row(&[1e8, 1.0, -1e8]), 1.0);
        assert_eq!(sum_row(&[]), 0.0);
        assert_eq!(sum_row(&[-0.0]).to_bits(), 0f32.to_bits());
    }

    #[test]
    fn clamp_as_the_macros_and_keeps_nan() {
        assert_eq!(clamp(2.0, -1.0, 1.0), 1.0);
        assert_eq!(clamp(-0.0, 0.0, 1.0).to_bits(), 0f32.to_bits());
        assert_eq!(clamp(0.0, -0.0, 1.0).to_bits(), (-0f32).to_bits());
        let nan = f32::from_bits(0x7fc0_1234);
        assert_eq!(clamp(nan, 0.0, 1.0).to_bits(), nan.to_bits());
    }

    #[test]
    fn rms_norm_and_nmse() {
        let x = [3.0f32, 4.0];
        let mut out = [0f32; 2];
        rms_norm_row(&x, 0.0, &mut out);
        let r = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / r).abs() < 1e-6 && (out[1] - 4.0 / r).abs() < 1e-6);
        assert_eq!(nmse(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!((nmse(&[1.1], &[1.0]) - 0.01).abs() < 1e-6);
        assert_eq!(bf16_to_f32(f32_to_bf16(1.5)), 1.5);
    }
}
