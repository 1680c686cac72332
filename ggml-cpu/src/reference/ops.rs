//! Op references: what each op computes from its operands, with plain loops over
//! element indices.

use ggml_core::{DType, Op, Tensor, MAX_DIMS};

use super::{
    alibi_slope, argmax_row, argsort_top_k_row, bf16_to_f32, clamp, dot_bf16, dot_f16, dot_f32,
    exp, f16_to_f32, f32_to_bf16, f32_to_f16, fmax, geglu, gelu, rd_u16, rms_norm_row, rope_cache,
    rope_row, silu, soft_max_row, sum_row, tree16, tree16_max, vec_dot_quant, LANES,
};

/// A tensor's descriptor with its bytes (element `(0,0,0,0)` at byte 0, strides `nb`).
#[derive(Clone, Copy)]
pub struct HostTensor<'a> {
    /// Shape, strides and dtype (the op fields are ignored).
    pub desc: &'a Tensor,
    /// The bytes.
    pub bytes: &'a [u8],
}

impl HostTensor<'_> {
    /// Element `i` as f32 (F32, F16, BF16; I32 converted).
    pub fn get(&self, i: [usize; MAX_DIMS]) -> f32 {
        let o = self.desc.offset_of(i);
        let b = &self.bytes[o..];
        match self.desc.dtype {
            DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            DType::F16 => f16_to_f32(rd_u16(b, 0)),
            DType::BF16 => bf16_to_f32(rd_u16(b, 0)),
            DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32,
            _ => f32::NAN,
        }
    }

    /// Element `i` of an I32 tensor.
    pub fn get_i32(&self, i: [usize; MAX_DIMS]) -> i32 {
        let o = self.desc.offset_of(i);
        i32::from_le_bytes([
            self.bytes[o],
            self.bytes[o + 1],
            self.bytes[o + 2],
            self.bytes[o + 3],
        ])
    }

    /// Row `(i1, i2, i3)` as f32 values (dequantised for quantised dtypes).
    pub fn row(&self, i1: usize, i2: usize, i3: usize) -> Vec<f32> {
        let ne0 = self.desc.ne[0];
        if self.desc.dtype.is_quantized() {
            let o = self.desc.offset_of([0, i1, i2, i3]);
            let mut out = vec![0f32; ne0];
            dequantize_row(
                self.desc.dtype,
                &self.bytes[o..o + self.desc.row_size()],
                &mut out,
            );
            out
        } else {
            (0..ne0).map(|i0| self.get([i0, i1, i2, i3])).collect()
        }
    }
}

/// Dequantises a row (quantised dtypes, via ggml-core's reference).
pub fn dequantize_row(dtype: DType, x: &[u8], out: &mut [f32]) {
    crate::quant::dequantize_row(dtype, x, out);
}

/// Stores `v` as element `i` of a contiguous tensor of `dtype` and shape `ne` in `out`.
fn put(out: &mut [u8], dtype: DType, ne: [usize; MAX_DIMS], i: [usize; MAX_DIMS], v: f32) {
    let flat = ((i[3] * ne[2] + i[2]) * ne[1] + i[1]) * ne[0] + i[0];
    let ts = dtype.type_size();
    let o = flat * ts;
    match dtype {
        DType::F32 => out[o..o + 4].copy_from_slice(&v.to_le_bytes()),
        DType::F16 => out[o..o + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes()),
        DType::BF16 => out[o..o + 2].copy_from_slice(&f32_to_bf16(v).to_le_bytes()),
        DType::I32 => out[o..o + 4].copy_from_slice(&(v as i32).to_le_bytes()),
        _ => {}
    }
}

fn rows(ne: [usize; MAX_DIMS]) -> impl Iterator<Item = (usize, usize, usize)> {
    (0..ne[3])
        .flat_map(move |i3| (0..ne[2]).flat_map(move |i2| (0..ne[1]).map(move |i1| (i1, i2, i3))))
}

fn index_of(flat: usize, ne: [usize; MAX_DIMS]) -> [usize; MAX_DIMS] {
    let i0 = flat % ne[0];
    let r = flat / ne[0];
    let i1 = r % ne[1];
    let r = r / ne[1];
    [i0, i1, r % ne[2], r / ne[2]]
}

/// Computes `node` from its operands `src` (in the order of `node.src`) into `out`, the
/// node's bytes laid out contiguously in its dtype and shape (for CPY: the bytes of a
/// contiguous destination `b` of the same shape; for SET_ROWS: the destination's current
/// bytes, of which only the named rows are rewritten). Returns an error string for
/// unsupported combinations or bad data (e.g. a row index out of range).
pub fn compute(node: &Tensor, src: &[HostTensor<'_>], out: &mut [u8]) -> Result<(), &'static str> {
    let ne = node.ne;
    let dt = node.dtype;
    match node.op {
        Op::GetRows => {
            let (a, idx) = (src[0], src[1]);
            for (i1, i2, i3) in rows(ne) {
                let r = idx.get_i32([i1, i2, i3, 0]);
                if r < 0 || r as usize >= a.desc.ne[1] {
                    return Err("row index out of range");
                }
                let row = a.row(r as usize, i2, i3 % a.desc.ne[3]);
                for (i0, &v) in row.iter().enumerate() {
                    put(out, dt, ne, [i0, i1, i2, i3], v);
                }
            }
        }
        Op::Add | Op::Mul | Op::Div => {
            let (a, b) = (src[0], src[1]);
            let bne = b.desc.ne;
            for (i1, i2, i3) in rows(ne) {
                for i0 in 0..ne[0] {
                    let x = a.get([i0, i1, i2, i3]);
                    let y = b.get([i0 % bne[0], i1 % bne[1], i2 % bne[2], i3 % bne[3]]);
                    let v = match node.op {
                        Op::Add => x + y,
                        Op::Mul => x * y,
                        _ => x / y,
                    };
                    put(out, dt, ne, [i0, i1, i2, i3], v);
                }
            }
        }
        Op::Scale { scale } => {
            for (i1, i2, i3) in rows(ne) {
                for i0 in 0..ne[0] {
                    put(
                        out,
                        dt,
                        ne,
                        [i0, i1, i2, i3],
                        src[0].get([i0, i1, i2, i3]) * scale,
                    );
                }
            }
        }
        Op::RmsNorm { eps } => {
            let mut o = vec![0f32; ne[0]];
            for (i1, i2, i3) in rows(ne) {
                rms_norm_row(&src[0].row(i1, i2, i3), eps, &mut o);
                for (i0, &v) in o.iter().enumerate() {
                    put(out, dt, ne, [i0, i1, i2, i3], v);
                }
            }
        }
        Op::Silu | Op::Swiglu => {
            for (i1, i2, i3) in rows(ne) {
                for i0 in 0..ne[0] {
                    let i = [i0, i1, i2, i3];
                    let mut v = silu(src[0].get(i));
                    if node.op == Op::Swiglu {
                        v *= src[1].get(i);
                    }
                    put(out, dt, ne, i, v);
                }
            }
        }
        Op::Gelu | Op::Geglu => {
            for (i1, i2, i3) in rows(ne) {
                for i0 in 0..ne[0] {
                    let i = [i0, i1, i2, i3];
                    let x = src[0].get(i);
                    let v = match node.op {
                        Op::Geglu => geglu(x, src[1].get(i)),
                        _ => gelu(x),
                    };
                    put(out, dt, ne, i, v);
                }
            }
        }
        Op::SoftMax { scale, max_bias } => {
            let mask = src.get(1);
            for (i1, i2, i3) in rows(ne) {
                let mut row = src[0].row(i1, i2, i3);
                let m = mask.map(|m| {
                    let (m2, m3) = (m.desc.ne[2], m.desc.ne[3]);
                    m.row(i1, i2 % m2, i3 % m3)
                });
                let slope = alibi_slope(max_bias, i2, ne[2]);
                soft_max_row(&mut row, scale, m.as_deref().map(|m| (m, slope)));
                for (i0, &v) in row.iter().enumerate() {
                    put(out, dt, ne, [i0, i1, i2, i3], v);
                }
            }
        }
        Op::Rope(p) => {
            let (a, pos) = (src[0], src[1]);
            let mut cache = vec![0f32; ne[0] + 1];
            let mut o = vec![0f32; ne[0]];
            for (i1, i2, i3) in rows(ne) {
                rope_cache(pos.get_i32([i2, 0, 0, 0]) as f32, &p, &mut cache);
                rope_row(
                    &a.row(i1, i2, i3),
                    &cache,
                    p.mode,
                    p.n_dims as usize,
                    &mut o,
                );
                for (i0, &v) in o.iter().enumerate() {
                    put(out, dt, ne, [i0, i1, i2, i3], v);
                }
            }
        }
        Op::Clamp { min, max } => {
            for (i1, i2, i3) in rows(ne) {
                for i0 in 0..ne[0] {
                    let i = [i0, i1, i2, i3];
                    put(out, dt, ne, i, clamp(src[0].get(i), min, max));
                }
            }
        }
        Op::SumRows => {
            for (i1, i2, i3) in rows(ne) {
                put(
                    out,
                    dt,
                    ne,
                    [0, i1, i2, i3],
                    sum_row(&src[0].row(i1, i2, i3)),
                );
            }
        }
        Op::Argmax => {
            for (r, (i1, i2, i3)) in rows(ne).enumerate() {
                let v = argmax_row(&src[0].row(i1, i2, i3));
                out[4 * r..4 * r + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
        Op::ArgsortTopK { k } => {
            let mut top = vec![0i32; k as usize];
            for (r, (i1, i2, i3)) in rows(ne).enumerate() {
                argsort_top_k_row(&src[0].row(i1, i2, i3), &mut top);
                for (j, &v) in top.iter().enumerate() {
                    let o = 4 * (r * ne[0] + j);
                    out[o..o + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        Op::MulMat => mul_mat(node, src[0], src[1], out)?,
        Op::MulMatId => mul_mat_id(node, src[0], src[1], src[2], out)?,
        Op::SetRows => {
            let (a, idx) = (src[0], src[1]);
            // Source rows in order: for repeated indices the last one wins.
            for i in 0..a.desc.ne[1] {
                let r = idx.get_i32([i, 0, 0, 0]);
                if r < 0 || r as usize >= ne[1] {
                    return Err("row index out of range");
                }
                for (i0, &v) in a.row(i, 0, 0).iter().enumerate() {
                    put(out, dt, ne, [i0, r as usize, 0, 0], v);
                }
            }
        }
        Op::Cpy | Op::Cont => {
            let a = src[0];
            let n = a.desc.nelements();
            let vals = || -> Vec<f32> { (0..n).map(|f| a.get(index_of(f, a.desc.ne))).collect() };
            if dt.is_quantized() && !a.desc.dtype.is_quantized() {
                let vals = vals();
                let rs = dt.row_size(ne[0]).ok_or("bad row")?;
                for (r, chunk) in vals.chunks(ne[0]).enumerate() {
                    crate::quant::quantize_row(dt, chunk, &mut out[r * rs..(r + 1) * rs]);
                }
            } else if a.desc.dtype == DType::I32 && dt == DType::I32 {
                for f in 0..n {
                    let v = a.get_i32(index_of(f, a.desc.ne));
                    out[4 * f..4 * f + 4].copy_from_slice(&v.to_le_bytes());
                }
            } else if a.desc.dtype.is_quantized() {
                // CONT of a quantised tensor: rows are copied as bytes.
                let rs = a.desc.row_size();
                for (r, (i1, i2, i3)) in rows(ne).enumerate() {
                    let o = a.desc.offset_of([0, i1, i2, i3]);
                    out[r * rs..(r + 1) * rs].copy_from_slice(&a.bytes[o..o + rs]);
                }
            } else {
                for (f, v) in vals().into_iter().enumerate() {
                    put(out, dt, ne, index_of(f, ne), v);
                }
            }
        }
        Op::Concat { dim } => {
            let (a, b) = (src[0], src[1]);
            let d = dim as usize;
            let ts = dt.type_size();
            for (i1, i2, i3) in rows(ne) {
                for i0 in 0..ne[0] {
                    let mut i = [i0, i1, i2, i3];
                    let t = if i[d] < a.desc.ne[d] {
                        a
                    } else {
                        i[d] -= a.desc.ne[d];
                        b
                    };
                    let o = t.desc.offset_of(i);
                    let flat = ((i3 * ne[2] + i2) * ne[1] + i1) * ne[0] + i0;
                    out[flat * ts..(flat + 1) * ts].copy_from_slice(&t.bytes[o..o + ts]);
                }
            }
        }
        Op::FlashAttnExt {
            scale,
            max_bias,
            softcap,
        } => flash_attn(node, src, scale, max_bias, softcap, out),
        _ => return Err("op has no reference"),
    }
    Ok(())
}

fn mul_mat(
    node: &Tensor,
    a: HostTensor<'_>,
    b: HostTensor<'_>,
    out: &mut [u8],
) -> Result<(), &'static str> {
    let ne = node.ne;
    let k = a.desc.ne[0];
    let (r2, r3) = (b.desc.ne[2] / a.desc.ne[2], b.desc.ne[3] / a.desc.ne[3]);
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for n in 0..ne[1] {
                let yrow: Vec<f32> = (0..k).map(|i| b.get([i, n, i2, i3])).collect();
                let yq = quantize_activations(a.desc.dtype.vec_dot_type(), &yrow)?;
                for m in 0..ne[0] {
                    let v = weight_row_dot(a, [0, m, i2 / r2, i3 / r3], &yrow, &yq);
                    put(out, DType::F32, ne, [m, n, i2, i3], v);
                }
            }
        }
    }
    Ok(())
}

/// Reference of [`Op::MulMatId`]: `out[m, e, t]` is the dot of row `m` of expert
/// `ids[e, t]` with `b[:, e mod B1, t]`, exactly as [`mul_mat`] computes a dot.
fn mul_mat_id(
    node: &Tensor,
    a: HostTensor<'_>,
    b: HostTensor<'_>,
    ids: HostTensor<'_>,
    out: &mut [u8],
) -> Result<(), &'static str> {
    let ne = node.ne;
    let k = a.desc.ne[0];
    let b1 = b.desc.ne[1];
    for t in 0..ne[2] {
        for e in 0..ne[1] {
            let id = ids.get_i32([e, t, 0, 0]);
            if id < 0 || id as usize >= a.desc.ne[2] {
                return Err("expert id out of range");
            }
            let yrow: Vec<f32> = (0..k).map(|i| b.get([i, e % b1, t, 0])).collect();
            let yq = quantize_activations(a.desc.dtype.vec_dot_type(), &yrow)?;
            for m in 0..ne[0] {
                let v = weight_row_dot(a, [0, m, id as usize, 0], &yrow, &yq);
                put(out, DType::F32, ne, [m, e, t, 0], v);
            }
        }
    }
    Ok(())
}

/// The dot of weight row `ai` (`[0, i1, i2, i3]`) of `a` with an activation row: `y` in
/// f32 and `yq` converted to the weights' dot type by [`quantize_activations`].
fn weight_row_dot(a: HostTensor<'_>, ai: [usize; MAX_DIMS], y: &[f32], yq: &[u8]) -> f32 {
    let k = a.desc.ne[0];
    let w = a.desc.dtype;
    match w {
        DType::F32 => {
            let x: Vec<f32> = (0..k).map(|i| a.get([i, ai[1], ai[2], ai[3]])).collect();
            dot_f32(&x, y)
        }
        DType::F16 | DType::BF16 => {
            let conv = if w == DType::F16 {
                f32_to_f16
            } else {
                f32_to_bf16
            };
            let x: Vec<u16> = (0..k)
                .map(|i| conv(a.get([i, ai[1], ai[2], ai[3]])))
                .collect();
            let y: Vec<u16> = yq
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();
            if w == DType::F16 {
                dot_f16(&x, &y)
            } else {
                dot_bf16(&x, &y)
            }
        }
        _ => {
            let o = a.desc.offset_of(ai);
            vec_dot_quant(w, &a.bytes[o..o + a.desc.row_size()], yq, k)
        }
    }
}

/// Converts an activation row to the dot type: F32 bytes as they are, F16/BF16 rounded,
/// Q8_0/Q8_1/Q8_K by ggml-core's reference quantisers.
pub fn quantize_activations(vdt: DType, y: &[f32]) -> Result<Vec<u8>, &'static str> {
    Ok(match vdt {
        DType::F32 => y.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F16 => y
            .iter()
            .flat_map(|&v| f32_to_f16(v).to_le_bytes())
            .collect(),
        DType::BF16 => y
            .iter()
            .flat_map(|&v| f32_to_bf16(v).to_le_bytes())
            .collect(),
        DType::Q8_0 | DType::Q8_1 | DType::Q8K => {
            let mut out = vec![
                0u8;
                vdt.row_size(y.len())
                    .ok_or("row not a multiple of the block")?
            ];
            crate::quant::quantize_row(vdt, y, &mut out);
            out
        }
        _ => return Err("no dot type"),
    })
}

/// Reference of [`Op::FlashAttnExt`] (see the module docs for the order).
fn flash_attn(
    node: &Tensor,
    src: &[HostTensor<'_>],
    scale: f32,
    max_bias: f32,
    softcap: f32,
    out: &mut [u8],
) {
    let (q, k, v) = (src[0], src[1], src[2]);
    let mask = src.get(3);
    let (n_q, n_head, ne3) = (q.desc.ne[1], q.desc.ne[2], q.desc.ne[3]);
    let (n_kv, h_kv) = (k.desc.ne[1], k.desc.ne[2]);
    let dv = v.desc.ne[0];
    let group = n_head / h_kv;
    for i3 in 0..ne3 {
        for iq in 0..n_q {
            for h in 0..n_head {
                let hk = h / group;
                let slope = alibi_slope(max_bias, h, n_head);
                let qrow = q.row(iq, h, i3);
                let scores: Vec<Option<f32>> = (0..n_kv)
                    .map(|j| {
                        let mv = mask.map(|m| slope * m.get([j, iq, 0, 0]));
                        if mv == Some(f32::NEG_INFINITY) {
                            return None;
                        }
                        let krow = k.row(j, hk, i3);
                        let dot = if k.desc.dtype == DType::F16 {
                            let qh: Vec<u16> = qrow.iter().map(|&x| f32_to_f16(x)).collect();
                            let kh: Vec<u16> = krow.iter().map(|&x| f32_to_f16(x)).collect();
                            dot_f16(&qh, &kh)
                        } else {
                            dot_f32(&qrow, &krow)
                        };
                        let mut s = dot * scale;
                        if softcap > 0.0 {
                            s = softcap * (s / softcap).tanh();
                        }
                        Some(match mv {
                            Some(m) => s + m,
                            None => s,
                        })
                    })
                    .collect();
                let mut lanes = [f32::NEG_INFINITY; LANES];
                for (j, s) in scores.iter().enumerate() {
                    if let Some(s) = s {
                        lanes[j % LANES] = fmax(*s, lanes[j % LANES]);
                    }
                }
                let mx = tree16_max(lanes);
                let mut sum = [0f32; LANES];
                let mut acc = vec![0f32; dv];
                for (j, s) in scores.iter().enumerate() {
                    let Some(s) = s else { continue };
                    let wgt = exp(s - mx);
                    sum[j % LANES] += wgt;
                    let vrow = v.row(j, hk, i3);
                    for (a, &x) in acc.iter_mut().zip(&vrow) {
                        *a += wgt * x;
                    }
                }
                let s = tree16(sum);
                let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
                for (i0, &a) in acc.iter().enumerate() {
                    put(out, DType::F32, node.ne, [i0, h, iq, i3], a * inv);
                }
            }
        }
    }
}
