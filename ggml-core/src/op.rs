//! Ops: their parameters, shape rules and exact meaning.
//!
//! Each constructor on [`Context`] validates its operands, infers the result's shape and
//! dtype and appends the result tensor. The doc comment of each constructor is the
//! specification that every backend kernel implements; the scalar reference kernels of
//! `ggml-cpu` are its executable form.

use crate::context::Context;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorId, MAX_DIMS};

/// Rotation layout of [`Op::Rope`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeMode {
    /// Rotates adjacent pairs `(x[2i], x[2i+1])` (ggml mode 0, llama).
    Normal,
    /// Rotates pairs `(x[i], x[i + n_dims/2])` (ggml mode 2, GPT-NeoX).
    Neox,
}

/// Parameters of [`Op::Rope`], as `ggml_rope_ext`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Pair layout.
    pub mode: RopeMode,
    /// Number of leading dimensions rotated (even, at most `ne[0]`); the rest are copied.
    pub n_dims: u32,
    /// Base of the frequencies: `theta_i = pos * freq_base^(-2i/n_dims)`.
    pub freq_base: f32,
    /// Position scale applied to every angle (linear interpolation).
    pub freq_scale: f32,
    /// YaRN extrapolation mix (0 disables YaRN).
    pub ext_factor: f32,
    /// Magnitude scale of cos and sin.
    pub attn_factor: f32,
    /// YaRN low correction dimension parameter.
    pub beta_fast: f32,
    /// YaRN high correction dimension parameter.
    pub beta_slow: f32,
    /// Training context length (YaRN correction dims).
    pub n_ctx_orig: u32,
}

impl RopeParams {
    /// Plain RoPE of `n_dims` dimensions with base `freq_base` (llama defaults otherwise).
    pub fn llama(n_dims: u32, freq_base: f32) -> RopeParams {
        RopeParams {
            mode: RopeMode::Normal,
            n_dims,
            freq_base,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 0,
        }
    }
}

/// Parameters of [`Op::FlashAttnExt`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnParams {
    /// Factor applied to `q·k` (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    /// ALiBi maximum bias (0 disables ALiBi).
    pub max_bias: f32,
    /// Logit soft-capping value (0 disables it).
    pub softcap: f32,
}

impl AttnParams {
    /// Plain scaled attention: no ALiBi, no soft-capping.
    pub fn scaled(scale: f32) -> AttnParams {
        AttnParams {
            scale,
            max_bias: 0.0,
            softcap: 0.0,
        }
    }
}

/// The operation that computes a tensor, with its parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// A leaf: weight, input or other data set from outside.
    None,
    /// See [`Context::get_rows`].
    GetRows,
    /// See [`Context::add`].
    Add,
    /// See [`Context::mul`].
    Mul,
    /// See [`Context::div`].
    Div,
    /// See [`Context::scale`].
    Scale {
        /// Factor.
        scale: f32,
    },
    /// See [`Context::rms_norm`].
    RmsNorm {
        /// Added to the mean square before the square root.
        eps: f32,
    },
    /// See [`Context::mul_mat`].
    MulMat,
    /// See [`Context::mul_mat_id`].
    MulMatId,
    /// See [`Context::argsort_top_k`].
    ArgsortTopK {
        /// How many indices each row keeps.
        k: u32,
    },
    /// See [`Context::sum_rows`].
    SumRows,
    /// See [`Context::argmax`].
    Argmax,
    /// See [`Context::clamp`].
    Clamp {
        /// Lower bound.
        min: f32,
        /// Upper bound.
        max: f32,
    },
    /// See [`Context::rope`].
    Rope(RopeParams),
    /// See [`Context::soft_max`].
    SoftMax {
        /// Factor applied to the input before the mask is added.
        scale: f32,
        /// ALiBi maximum bias (0 disables ALiBi).
        max_bias: f32,
    },
    /// See [`Context::cpy`].
    Cpy,
    /// See [`Context::set_rows`].
    SetRows,
    /// See [`Context::cont`].
    Cont,
    /// See [`Context::view`].
    View,
    /// See [`Context::reshape`].
    Reshape,
    /// See [`Context::permute`].
    Permute {
        /// `axes[i]` is the result dimension that source dimension `i` moves to.
        axes: [u8; MAX_DIMS],
    },
    /// See [`Context::transpose`].
    Transpose,
    /// See [`Context::silu`].
    Silu,
    /// See [`Context::swiglu`].
    Swiglu,
    /// See [`Context::gelu`].
    Gelu,
    /// See [`Context::geglu`].
    Geglu,
    /// See [`Context::concat`].
    Concat {
        /// Dimension along which the operands are joined.
        dim: u8,
    },
    /// See [`Context::flash_attn_ext`].
    FlashAttnExt {
        /// Factor applied to `q·k`.
        scale: f32,
        /// ALiBi maximum bias (0 disables ALiBi).
        max_bias: f32,
        /// Logit soft-capping value (0 disables it).
        softcap: f32,
    },
}

impl Op {
    /// ggml's name of the op (`"MUL_MAT"`, ...).
    pub const fn name(&self) -> &'static str {
        match self {
            Op::None => "NONE",
            Op::GetRows => "GET_ROWS",
            Op::Add => "ADD",
            Op::Mul => "MUL",
            Op::Div => "DIV",
            Op::Scale { .. } => "SCALE",
            Op::RmsNorm { .. } => "RMS_NORM",
            Op::MulMat => "MUL_MAT",
            Op::MulMatId => "MUL_MAT_ID",
            Op::ArgsortTopK { .. } => "ARGSORT_TOP_K",
            Op::SumRows => "SUM_ROWS",
            Op::Argmax => "ARGMAX",
            Op::Clamp { .. } => "CLAMP",
            Op::Rope(_) => "ROPE",
            Op::SoftMax { .. } => "SOFT_MAX",
            Op::Cpy => "CPY",
            Op::SetRows => "SET_ROWS",
            Op::Cont => "CONT",
            Op::View => "VIEW",
            Op::Reshape => "RESHAPE",
            Op::Permute { .. } => "PERMUTE",
            Op::Transpose => "TRANSPOSE",
            Op::Silu => "SILU",
            Op::Swiglu => "SWIGLU",
            Op::Gelu => "GELU",
            Op::Geglu => "GEGLU",
            Op::Concat { .. } => "CONCAT",
            Op::FlashAttnExt { .. } => "FLASH_ATTN_EXT",
        }
    }

    /// Whether the op only reinterprets its source's bytes (no kernel runs).
    pub const fn is_view(&self) -> bool {
        matches!(
            self,
            Op::View | Op::Reshape | Op::Permute { .. } | Op::Transpose
        )
    }
}

fn shape_err(op: &'static str, rule: &'static str, a: &Tensor, b: [usize; MAX_DIMS]) -> Error {
    Error::Shape {
        op,
        rule,
        a: a.name,
        a_ne: a.ne,
        b_ne: b,
    }
}

fn dtype_err(op: &'static str, t: &Tensor, expected: &'static str) -> Error {
    Error::DType {
        op,
        tensor: t.name,
        dtype: t.dtype,
        expected,
    }
}

fn require_float(op: &'static str, t: &Tensor) -> Result<()> {
    if t.dtype.is_float() {
        Ok(())
    } else {
        Err(dtype_err(op, t, "f32, f16 or bf16"))
    }
}

fn require(op: &'static str, t: &Tensor, dtype: DType, expected: &'static str) -> Result<()> {
    if t.dtype == dtype {
        Ok(())
    } else {
        Err(dtype_err(op, t, expected))
    }
}

impl Context<'_> {
    /// `GET_ROWS`: gathers rows of `a` by index.
    ///
    /// `a`: any supported dtype, shape `[n, rows, ne2, ne3]`; `idx`: I32 `[k, ne2, ne3', 1]`
    /// with `a.ne[2] == idx.ne[1]`. Result: F32 `[n, k, ne2, idx.ne[2]]` where
    /// `out[:, i, j, l] = dequantize(a[:, idx[i, j, l], j, l % a.ne[3]])`.
    /// An index outside `0..rows` is an error of the backend at run time.
    pub fn get_rows(&mut self, a: TensorId, idx: TensorId) -> Result<TensorId> {
        let (ta, ti) = (*self.get(a)?, *self.get(idx)?);
        require("get_rows", &ti, DType::I32, "i32")?;
        if ta.dtype == DType::I32 {
            return Err(dtype_err("get_rows", &ta, "a float or quantised dtype"));
        }
        if ta.ne[2] != ti.ne[1] || ti.ne[3] != 1 || ta.ne[3] == 0 || ti.ne[2] % ta.ne[3] != 0 {
            return Err(shape_err(
                "get_rows",
                "a.ne[2] == idx.ne[1], idx.ne[3] == 1",
                &ta,
                ti.ne,
            ));
        }
        self.push_op(
            Op::GetRows,
            DType::F32,
            [ta.ne[0], ti.ne[0], ti.ne[1], ti.ne[2]],
            &[a, idx],
        )
    }

    fn binary(&mut self, op: Op, name: &'static str, a: TensorId, b: TensorId) -> Result<TensorId> {
        let (ta, tb) = (*self.get(a)?, *self.get(b)?);
        require_float(name, &ta)?;
        require_float(name, &tb)?;
        if !ta.can_broadcast_from(&tb) {
            return Err(shape_err(name, "a.ne[i] % b.ne[i] == 0", &ta, tb.ne));
        }
        self.push_op(op, ta.dtype, ta.ne, &[a, b])
    }

    /// `ADD`: `out[i] = a[i] + b[i mod b.ne]`, `b` broadcast over `a` (each `a.ne[d]` a
    /// multiple of `b.ne[d]`). Computed in f32; result has `a`'s shape and dtype.
    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Op::Add, "add", a, b)
    }

    /// `MUL`: `out[i] = a[i] * b[i mod b.ne]`, broadcasting as [`Context::add`].
    pub fn mul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Op::Mul, "mul", a, b)
    }

    /// `DIV`: `out[i] = a[i] / b[i mod b.ne]` (one f32 division), broadcasting as
    /// [`Context::add`].
    pub fn div(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Op::Div, "div", a, b)
    }

    /// `SCALE`: `out[i] = a[i] * scale` (f32 multiply), same shape and dtype as `a`.
    pub fn scale(&mut self, a: TensorId, scale: f32) -> Result<TensorId> {
        let ta = *self.get(a)?;
        require_float("scale", &ta)?;
        self.push_op(Op::Scale { scale }, ta.dtype, ta.ne, &[a])
    }

    /// `RMS_NORM` over each row (dimension 0):
    /// `out = x / sqrt(mean(x²) + eps)`, the mean of squares accumulated as the reduction
    /// order of the backend defines (see DESIGN.md, invariant 2). F32 only.
    pub fn rms_norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        let ta = *self.get(a)?;
        require("rms_norm", &ta, DType::F32, "f32")?;
        if !(eps >= 0.0 && eps.is_finite()) {
            return Err(Error::Param {
                op: "rms_norm",
                what: "eps must be finite and >= 0",
            });
        }
        self.push_op(Op::RmsNorm { eps }, DType::F32, ta.ne, &[a])
    }

    /// `MUL_MAT`: `out[m, n, i2, i3] = Σ_k a[k, m, i2 / r2, i3 / r3] · b[k, n, i2, i3]`.
    ///
    /// `a` (the weights, any dtype, not transposed): `[K, M, A2, A3]`; `b`: F32
    /// `[K, N, B2, B3]` with `B2 % A2 == 0`, `B3 % A3 == 0` (`r2 = B2 / A2` broadcasting, as
    /// grouped-query attention needs). Result: F32 `[M, N, B2, B3]`. For a quantised `a`,
    /// each row of `b` is first quantised to `a.dtype.vec_dot_type()` as ggml does; for
    /// F16 `a`, `b` is rounded to F16. Each output element is an independent dot product
    /// whose reduction order depends only on `K` and the dtypes.
    pub fn mul_mat(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let (ta, tb) = (*self.get(a)?, *self.get(b)?);
        if ta.dtype == DType::I32 || ta.dtype == DType::Q8K {
            return Err(dtype_err(
                "mul_mat",
                &ta,
                "a float or weight-quantised dtype",
            ));
        }
        require("mul_mat", &tb, DType::F32, "f32")?;
        if ta.ne[0] != tb.ne[0] {
            return Err(shape_err("mul_mat", "a.ne[0] == b.ne[0]", &ta, tb.ne));
        }
        if ta.ne[2] == 0 || ta.ne[3] == 0 || tb.ne[2] % ta.ne[2] != 0 || tb.ne[3] % ta.ne[3] != 0 {
            return Err(shape_err(
                "mul_mat",
                "b.ne[2..4] multiples of a.ne[2..4]",
                &ta,
                tb.ne,
            ));
        }
        if ta.is_transposed() {
            return Err(shape_err("mul_mat", "a must not be transposed", &ta, tb.ne));
        }
        self.push_op(
            Op::MulMat,
            DType::F32,
            [ta.ne[1], tb.ne[1], tb.ne[2], tb.ne[3]],
            &[a, b],
        )
    }

    /// `MUL_MAT_ID`: a matrix product whose weight matrix is chosen per row by an index,
    /// as a mixture-of-experts FFN needs.
    ///
    /// `as_`: the stacked expert matrices, any dtype [`mul_mat`](Context::mul_mat) takes,
    /// `[K, M, n_as, 1]`, not transposed; `b`: F32 `[K, B1, T, 1]`; `ids`: I32
    /// `[n_used, T, 1, 1]` with contiguous rows and `n_used % B1 == 0`. Result: F32
    /// `[M, n_used, T, 1]` with
    /// `out[m, e, t] = Σ_k as_[k, m, ids[e, t]] · b[k, e mod B1, t]`, each dot product
    /// computed exactly as [`mul_mat`](Context::mul_mat) computes it for that weight
    /// dtype (`b`'s row quantised to the weight's `vec_dot_type` first). So a token's
    /// result never depends on which other tokens chose the same expert. An id outside
    /// `0..n_as` is an error of the backend at run time.
    pub fn mul_mat_id(&mut self, as_: TensorId, b: TensorId, ids: TensorId) -> Result<TensorId> {
        let (ta, tb, ti) = (*self.get(as_)?, *self.get(b)?, *self.get(ids)?);
        if ta.dtype == DType::I32 || ta.dtype == DType::Q8K {
            return Err(dtype_err(
                "mul_mat_id",
                &ta,
                "a float or weight-quantised dtype",
            ));
        }
        require("mul_mat_id", &tb, DType::F32, "f32")?;
        require("mul_mat_id", &ti, DType::I32, "i32")?;
        if ta.ne[0] != tb.ne[0] || ta.ne[3] != 1 || ta.ne[2] == 0 {
            return Err(shape_err(
                "mul_mat_id",
                "as [K, M, n_as, 1], b [K, B1, T, 1]",
                &ta,
                tb.ne,
            ));
        }
        if ta.is_transposed() {
            return Err(shape_err(
                "mul_mat_id",
                "as must not be transposed",
                &ta,
                tb.ne,
            ));
        }
        if ti.ne[2] != 1 || ti.ne[3] != 1 || ti.ne[0] == 0 || !ti.rows_contiguous() {
            return Err(shape_err(
                "mul_mat_id",
                "ids [n_used, T, 1, 1] with contiguous rows",
                &ti,
                tb.ne,
            ));
        }
        if tb.ne[3] != 1 || tb.ne[2] != ti.ne[1] || tb.ne[1] == 0 || ti.ne[0] % tb.ne[1] != 0 {
            return Err(shape_err(
                "mul_mat_id",
                "b [K, B1, T, 1] with T == ids.ne[1] and n_used % B1 == 0",
                &ta,
                tb.ne,
            ));
        }
        self.push_op(
            Op::MulMatId,
            DType::F32,
            [ta.ne[1], ti.ne[0], ti.ne[1], 1],
            &[as_, b, ids],
        )
    }

    /// `ARGSORT_TOP_K`: for each row of `a` (F32 `[n, rows, ne2, ne3]`), the indices of
    /// its `k` largest entries in descending order of value: I32 `[k, rows, ne2, ne3]`.
    ///
    /// This is ggml's `ggml_argsort_top_k` (a descending argsort, then a view of its
    /// first `k` columns) as one op with a contiguous result. Equal values keep index
    /// order (the lowest index first), so the result is deterministic where ggml's
    /// unstable sort leaves ties open; NaN sorts after every number. `1 <= k <= n`.
    pub fn argsort_top_k(&mut self, a: TensorId, k: usize) -> Result<TensorId> {
        let ta = *self.get(a)?;
        require("argsort_top_k", &ta, DType::F32, "f32")?;
        if k == 0 || k > ta.ne[0] || k > u32::MAX as usize {
            return Err(Error::Param {
                op: "argsort_top_k",
                what: "k must be in 1..=a.ne[0]",
            });
        }
        let ne = [k, ta.ne[1], ta.ne[2], ta.ne[3]];
        self.push_op(Op::ArgsortTopK { k: k as u32 }, DType::I32, ne, &[a])
    }

    /// `SUM_ROWS`: the sum of each row of `a` (F32 `[n, rows, ne2, ne3]`), F32
    /// `[1, rows, ne2, ne3]`. As ggml's CPU backend: accumulated in f64 from the first
    /// element to the last, rounded to f32 once.
    pub fn sum_rows(&mut self, a: TensorId) -> Result<TensorId> {
        let ta = *self.get(a)?;
        require("sum_rows", &ta, DType::F32, "f32")?;
        self.push_op(
            Op::SumRows,
            DType::F32,
            [1, ta.ne[1], ta.ne[2], ta.ne[3]],
            &[a],
        )
    }

    /// `ARGMAX`: for each row of `a` (F32 `[n, rows, ne2, ne3]`, `n >= 1`), the index of
    /// its largest value: I32 `[1, rows, ne2, ne3]` (ggml's `ggml_argmax`, for any rows).
    ///
    /// The meaning is a scan from the first element that moves to element `i` only when
    /// `a[i] > a[best]`: equal values keep the lowest index (`-0.0` equals `+0.0`), a NaN
    /// never wins, and a row whose first element is NaN gives 0. This is exactly
    /// greedy sampling's `argmax` over logits, so a backend computing it returns the token
    /// greedy generation would pick from the whole row.
    pub fn argmax(&mut self, a: TensorId) -> Result<TensorId> {
        let ta = *self.get(a)?;
        require("argmax", &ta, DType::F32, "f32")?;
        if ta.ne[0] == 0 {
            return Err(shape_err(
                "argmax",
                "rows of at least one value",
                &ta,
                ta.ne,
            ));
        }
        self.push_op(
            Op::Argmax,
            DType::I32,
            [1, ta.ne[1], ta.ne[2], ta.ne[3]],
            &[a],
        )
    }

    /// `CLAMP`: `out[i] = max(min(a[i], max), min)` (F32; NaN stays NaN). `min <= max`,
    /// either may be infinite.
    pub fn clamp(&mut self, a: TensorId, min: f32, max: f32) -> Result<TensorId> {
        let ta = *self.get(a)?;
        require("clamp", &ta, DType::F32, "f32")?;
        if min.is_nan() || max.is_nan() || min > max {
            return Err(Error::Param {
                op: "clamp",
                what: "min and max must be numbers with min <= max",
            });
        }
        self.push_op(Op::Clamp { min, max }, DType::F32, ta.ne, &[a])
    }

    /// `ROPE`: rotary position embedding of `a` (F32 or F16 `[head_dim, n_head, n_tokens, 1]`)
    /// by positions `pos` (I32 `[n_tokens]`).
    ///
    /// For pair index `i < n_dims/2` at position `p`: `theta = freq_scale · p · θ^i` with
    /// `θ = freq_base^(-2/n_dims)`, the power `θ^i` computed by repeated f32
    /// multiplication (`t_0 = p`, `t_{i+1} = t_i · θ`) as ggml does; then
    /// `(x0, x1) -> (x0·cos − x1·sin, x0·sin + x1·cos)` with cos and sin scaled by
    /// `attn_factor` (YaRN ramps when `ext_factor != 0`). Pairs are adjacent
    /// ([`RopeMode::Normal`]) or `n_dims/2` apart ([`RopeMode::Neox`]). Dimensions
    /// `n_dims..head_dim` are copied.
    pub fn rope(&mut self, a: TensorId, pos: TensorId, p: RopeParams) -> Result<TensorId> {
        let (ta, tp) = (*self.get(a)?, *self.get(pos)?);
        if !matches!(ta.dtype, DType::F32 | DType::F16) {
            return Err(dtype_err("rope", &ta, "f32 or f16"));
        }
        require("rope", &tp, DType::I32, "i32")?;
        if tp.ne[0] != ta.ne[2] || tp.nelements() != tp.ne[0] {
            return Err(shape_err(
                "rope",
                "pos is 1-D with a.ne[2] entries",
                &ta,
                tp.ne,
            ));
        }
        if p.n_dims == 0 || p.n_dims % 2 != 0 || p.n_dims as usize > ta.ne[0] {
            return Err(Error::Param {
                op: "rope",
                what: "n_dims must be even, > 0 and <= a.ne[0]",
            });
        }
        if !(p.freq_base > 0.0 && p.freq_base.is_finite() && p.freq_scale.is_finite()) {
            return Err(Error::Param {
                op: "rope",
                what: "freq_base must be finite and > 0, freq_scale finite",
            });
        }
        self.push_op(Op::Rope(p), ta.dtype, ta.ne, &[a, pos])
    }

    /// `SOFT_MAX` over each row: `out = softmax(scale · a + slope · mask)`, where
    /// `softmax(x)_i = exp(x_i − max x) / Σ_j exp(x_j − max x)` and `slope` is 1 unless
    /// `max_bias > 0` (ALiBi, per head `i2`). `a`: F32 `[n, rows, ne2, ne3]`; `mask`
    /// (optional): F32 or F16 `[n, ≥ rows, m2, m3]` with `ne2 % m2 == 0`, `ne3 % m3 == 0`,
    /// row `i1` of the mask applying to row `i1` of `a`. Entries of −∞ contribute nothing.
    pub fn soft_max(
        &mut self,
        a: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        max_bias: f32,
    ) -> Result<TensorId> {
        let ta = *self.get(a)?;
        require("soft_max", &ta, DType::F32, "f32")?;
        if let Some(m) = mask {
            let tm = *self.get(m)?;
            if !matches!(tm.dtype, DType::F32 | DType::F16) {
                return Err(dtype_err("soft_max", &tm, "f32 or f16"));
            }
            if tm.ne[0] != ta.ne[0]
                || tm.ne[1] < ta.ne[1]
                || tm.ne[2] == 0
                || tm.ne[3] == 0
                || ta.ne[2] % tm.ne[2] != 0
                || ta.ne[3] % tm.ne[3] != 0
            {
                return Err(shape_err(
                    "soft_max",
                    "mask [n, >= rows, divides ne2, divides ne3]",
                    &ta,
                    tm.ne,
                ));
            }
        }
        if !(scale.is_finite() && max_bias >= 0.0 && max_bias.is_finite()) {
            return Err(Error::Param {
                op: "soft_max",
                what: "scale must be finite and max_bias finite and >= 0",
            });
        }
        let op = Op::SoftMax { scale, max_bias };
        match mask {
            Some(m) => self.push_op(op, DType::F32, ta.ne, &[a, m]),
            None => self.push_op(op, DType::F32, ta.ne, &[a]),
        }
    }

    /// `CPY`: writes the elements of `a`, in row-major order of `a`'s shape, into `b`'s
    /// bytes in row-major order of `b`'s shape, converting dtype (F32 to F16/BF16/F32 or a
    /// quantised type by its reference quantiser, and F16/BF16 to F32). Requires equal
    /// element counts. The result is a view of `b` (same shape, strides, bytes).
    pub fn cpy(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let (ta, tb) = (*self.get(a)?, *self.get(b)?);
        if ta.nelements() != tb.nelements() {
            return Err(shape_err("cpy", "equal element counts", &ta, tb.ne));
        }
        if ta.dtype.is_quantized() || ta.dtype == DType::I32 {
            return Err(dtype_err("cpy", &ta, "f32, f16 or bf16"));
        }
        if tb.dtype == DType::I32 || tb.dtype == DType::Q8K || tb.dtype == DType::Q8_1 {
            return Err(dtype_err("cpy", &tb, "a float or weight-quantised dtype"));
        }
        if tb.dtype.is_quantized() && (!tb.is_contiguous() || tb.ne[0] % tb.dtype.block_size() != 0)
        {
            return Err(shape_err(
                "cpy",
                "quantised destination must be contiguous",
                &ta,
                tb.ne,
            ));
        }
        self.push_view(Op::Cpy, b, tb.dtype, tb.ne, tb.nb, 0, &[a, b])
    }

    /// `SET_ROWS`: writes row `i` of `src`, converted to `dst`'s dtype, into row `idx[i]`
    /// of `dst`; the other rows of `dst` keep their bytes. This is how a KV cache is
    /// written at positions given at run time, so one graph serves every micro-batch.
    ///
    /// `dst`: F32, F16 or BF16 `[n, rows, 1, 1]` with contiguous elements in a row;
    /// `src`: F32 `[n, k, 1, 1]`; `idx`: I32 `[k]`. The result is a view of all of `dst`
    /// (whose bytes the node writes). An index outside `0..rows` is an error of the
    /// backend at run time; two equal indices leave either row's value.
    pub fn set_rows(&mut self, dst: TensorId, src: TensorId, idx: TensorId) -> Result<TensorId> {
        let (td, ts, ti) = (*self.get(dst)?, *self.get(src)?, *self.get(idx)?);
        require("set_rows", &ts, DType::F32, "f32")?;
        require("set_rows", &ti, DType::I32, "i32")?;
        if !matches!(td.dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(dtype_err("set_rows", &td, "f32, f16 or bf16"));
        }
        let flat = |t: &Tensor| t.ne[2] == 1 && t.ne[3] == 1;
        if !flat(&td) || !flat(&ts) || ts.ne[0] != td.ne[0] || ti.ne != [ts.ne[1], 1, 1, 1] {
            return Err(shape_err(
                "set_rows",
                "dst [n, rows], src [n, k], idx [k]",
                &td,
                ts.ne,
            ));
        }
        if td.nb[0] != td.dtype.type_size() {
            return Err(shape_err(
                "set_rows",
                "destination rows must be contiguous",
                &td,
                td.ne,
            ));
        }
        self.push_view(Op::SetRows, dst, td.dtype, td.ne, td.nb, 0, &[src, idx])
    }

    /// `CONT` into another float dtype (ggml's `ggml_cast`): a contiguous copy of `a`
    /// (F32, F16 or BF16) converted to `dtype` (F32, F16 or BF16; to F16 and BF16 by
    /// rounding to nearest even).
    pub fn cont_as(&mut self, a: TensorId, dtype: DType) -> Result<TensorId> {
        let ta = *self.get(a)?;
        require_float("cont_as", &ta)?;
        if !dtype.is_float() {
            return Err(dtype_err("cont_as", &ta, "a float target dtype"));
        }
        self.push_op(Op::Cont, dtype, ta.ne, &[a])
    }

    /// `CONT`: a contiguous copy of `a` (same dtype and shape, elements in row-major
    /// order of the shape, whatever `a`'s strides).
    pub fn cont(&mut self, a: TensorId) -> Result<TensorId> {
        let ta = *self.get(a)?;
        if ta.dtype.is_quantized() && !ta.rows_contiguous() {
            return Err(shape_err(
                "cont",
                "quantised rows must be contiguous",
                &ta,
                ta.ne,
            ));
        }
        self.push_op(Op::Cont, ta.dtype, ta.ne, &[a])
    }

    /// `VIEW`: reinterprets `a`'s bytes from byte `offset` on with shape `ne` and strides
    /// `nb` (`nb[0]` is forced to the element or block size). Fails if the view reaches
    /// past the bytes of the tensor `a` ultimately views.
    pub fn view(
        &mut self,
        a: TensorId,
        ne: [usize; MAX_DIMS],
        nb: [usize; MAX_DIMS],
        offset: usize,
    ) -> Result<TensorId> {
        let ta = *self.get(a)?;
        if ne[0] % ta.dtype.block_size() != 0 {
            return Err(Error::BlockAlignment {
                dtype: ta.dtype,
                ne0: ne[0],
            });
        }
        let mut nb = nb;
        nb[0] = ta.dtype.type_size();
        self.push_view(Op::View, a, ta.dtype, ne, nb, offset, &[a])
    }

    /// A contiguous `VIEW` of `a` with shape `ne` starting at byte `offset`, with strides
    /// following `a`'s row layout (`nb[1]` given; higher strides dense over `ne`).
    pub fn view_2d(
        &mut self,
        a: TensorId,
        ne0: usize,
        ne1: usize,
        nb1: usize,
        offset: usize,
    ) -> Result<TensorId> {
        let ts = self.get(a)?.dtype.type_size();
        let nb2 = nb1.checked_mul(ne1).ok_or(Error::Overflow {
            what: "view stride",
        })?;
        self.view(a, [ne0, ne1, 1, 1], [ts, nb1, nb2, nb2], offset)
    }

    /// `RESHAPE`: the contiguous tensor `a` seen with shape `ne` (same element count).
    pub fn reshape(&mut self, a: TensorId, ne: [usize; MAX_DIMS]) -> Result<TensorId> {
        let ta = *self.get(a)?;
        if !ta.is_contiguous() {
            return Err(shape_err("reshape", "a must be contiguous", &ta, ne));
        }
        let n = ne
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or(Error::Overflow {
                what: "reshape size",
            })?;
        if n != ta.nelements() {
            return Err(shape_err("reshape", "equal element counts", &ta, ne));
        }
        let t = Tensor::contiguous(ta.dtype, ne).ok_or(Error::BlockAlignment {
            dtype: ta.dtype,
            ne0: ne[0],
        })?;
        self.push_view(Op::Reshape, a, ta.dtype, ne, t.nb, 0, &[a])
    }

    /// `PERMUTE`: moves source dimension `i` to result dimension `axes[i]`
    /// (`out.ne[axes[i]] = a.ne[i]`, same for strides), as `ggml_permute`.
    pub fn permute(&mut self, a: TensorId, axes: [u8; MAX_DIMS]) -> Result<TensorId> {
        let ta = *self.get(a)?;
        let mut seen = [false; MAX_DIMS];
        for &ax in &axes {
            if ax as usize >= MAX_DIMS || seen[ax as usize] {
                return Err(Error::Param {
                    op: "permute",
                    what: "axes must be a permutation of 0..4",
                });
            }
            seen[ax as usize] = true;
        }
        if ta.dtype.is_quantized() && axes[0] != 0 {
            return Err(shape_err(
                "permute",
                "quantised blocks must stay in dimension 0",
                &ta,
                ta.ne,
            ));
        }
        let (mut ne, mut nb) = ([0; MAX_DIMS], [0; MAX_DIMS]);
        for i in 0..MAX_DIMS {
            ne[axes[i] as usize] = ta.ne[i];
            nb[axes[i] as usize] = ta.nb[i];
        }
        self.push_view(Op::Permute { axes }, a, ta.dtype, ne, nb, 0, &[a])
    }

    /// `TRANSPOSE`: swaps dimensions 0 and 1 (a permute by `[1, 0, 2, 3]`).
    pub fn transpose(&mut self, a: TensorId) -> Result<TensorId> {
        let ta = *self.get(a)?;
        if ta.dtype.is_quantized() {
            return Err(shape_err(
                "transpose",
                "quantised tensors cannot be transposed",
                &ta,
                ta.ne,
            ));
        }
        let mut ne = ta.ne;
        let mut nb = ta.nb;
        ne.swap(0, 1);
        nb.swap(0, 1);
        self.push_view(Op::Transpose, a, ta.dtype, ne, nb, 0, &[a])
    }

    /// `SILU`: `out = x / (1 + exp(−x))` elementwise, F32.
    pub fn silu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary_f32(Op::Silu, "silu", a)
    }

    /// `SWIGLU` (ggml's `swiglu_split`): `out = silu(a) · b` elementwise, F32, equal shapes.
    pub fn swiglu(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.gated_f32(Op::Swiglu, "swiglu", a, b)
    }

    /// `GELU`, tanh approximation, elementwise, F32, exactly as ggml's CPU backend
    /// computes it (`GGML_GELU_FP16`: through a table indexed by f16):
    ///
    /// - `x <= -10`: `out = 0`;
    /// - `x >= 10`: `out = x`;
    /// - otherwise `out = f32(f16(g(f32(f16(x)))))`, where `f16(·)` rounds to nearest
    ///   even and `g(v) = 0.5·v·(1 + tanh(√(2/π)·v·(1 + 0.044715·v·v)))` is evaluated in
    ///   f32, left to right (`√(2/π)` as the f32 nearest to 0.7978845608), with the C
    ///   library's `tanhf` and `1 + 0.044715·v·v` as one fused multiply-add
    ///   `fma(0.044715·v, v, 1)`, as GCC compiles ggml's C for FMA-capable CPUs; every
    ///   other step is rounded on its own. (`ggml-cpu`'s `reference::gelu_f32` says more.)
    ///
    /// NaN gives NaN (its payload is unspecified), `+∞` gives `+∞` and `−∞` gives 0.
    /// Backends other than the CPU's may differ from this in the last f16 place of
    /// `g` for a few inputs (a `tanh` that is not the C library's).
    pub fn gelu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary_f32(Op::Gelu, "gelu", a)
    }

    /// `GEGLU` (ggml's `geglu_split`): `out = gelu(gate) · up` elementwise, F32, equal
    /// shapes, with [`gelu`](Context::gelu)'s table semantics and one f32 multiply:
    /// `gate <= -10` gives exactly 0 (whatever `up` is), `gate >= 10` gives `gate · up`,
    /// otherwise `f32(f16(g(f32(f16(gate))))) · up`.
    pub fn geglu(&mut self, gate: TensorId, up: TensorId) -> Result<TensorId> {
        self.gated_f32(Op::Geglu, "geglu", gate, up)
    }

    /// An elementwise F32 op of one operand.
    fn unary_f32(&mut self, op: Op, name: &'static str, a: TensorId) -> Result<TensorId> {
        let ta = *self.get(a)?;
        require(name, &ta, DType::F32, "f32")?;
        self.push_op(op, DType::F32, ta.ne, &[a])
    }

    /// A gated elementwise F32 op: `act(gate) · up`, operands of equal shapes.
    fn gated_f32(
        &mut self,
        op: Op,
        name: &'static str,
        gate: TensorId,
        up: TensorId,
    ) -> Result<TensorId> {
        let (ta, tb) = (*self.get(gate)?, *self.get(up)?);
        require(name, &ta, DType::F32, "f32")?;
        require(name, &tb, DType::F32, "f32")?;
        if ta.ne != tb.ne {
            return Err(shape_err(name, "equal shapes", &ta, tb.ne));
        }
        self.push_op(op, DType::F32, ta.ne, &[gate, up])
    }

    /// `CONCAT`: joins `a` and `b` along dimension `dim`; all other dimensions equal,
    /// same scalar dtype. `out[.., i_dim, ..] = a[..]` for `i_dim < a.ne[dim]`, else
    /// `b[.., i_dim − a.ne[dim], ..]`. Used by all-gathers.
    pub fn concat(&mut self, a: TensorId, b: TensorId, dim: usize) -> Result<TensorId> {
        let (ta, tb) = (*self.get(a)?, *self.get(b)?);
        if dim >= MAX_DIMS {
            return Err(Error::Param {
                op: "concat",
                what: "dim must be < 4",
            });
        }
        if ta.dtype != tb.dtype || ta.dtype.is_quantized() {
            return Err(dtype_err("concat", &tb, "the same scalar dtype as a"));
        }
        let mut ne = ta.ne;
        for d in 0..MAX_DIMS {
            if d != dim && ta.ne[d] != tb.ne[d] {
                return Err(shape_err("concat", "equal shapes outside dim", &ta, tb.ne));
            }
        }
        ne[dim] = ta.ne[dim].checked_add(tb.ne[dim]).ok_or(Error::Overflow {
            what: "concat size",
        })?;
        self.push_op(Op::Concat { dim: dim as u8 }, ta.dtype, ne, &[a, b])
    }

    /// `FLASH_ATTN_EXT`: attention `softmax(scale · q·kᵀ + mask) · v` per head.
    ///
    /// `q`: F32 `[D, n_q, H, ne3]`; `k`: F16/F32 `[D, n_kv, H_kv, ne3]`; `v`: F16/F32
    /// `[Dv, n_kv, H_kv, ne3]` with `H % H_kv == 0` (query head `h` uses KV head
    /// `h / (H / H_kv)`); `mask` (optional): F16/F32 `[n_kv, ≥ n_q, 1, 1]` added to the
    /// scores (−∞ masks a position). With `softcap > 0` scores become
    /// `softcap · tanh(s / softcap)` before the mask. Result: F32 `[Dv, H, n_q, ne3]`
    /// (heads before tokens, as ggml). The reduction over KV positions follows the
    /// backend's fixed-lane order; masked positions contribute exactly nothing.
    pub fn flash_attn_ext(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        mask: Option<TensorId>,
        params: AttnParams,
    ) -> Result<TensorId> {
        let AttnParams {
            scale,
            max_bias,
            softcap,
        } = params;
        let (tq, tk, tv) = (*self.get(q)?, *self.get(k)?, *self.get(v)?);
        require("flash_attn_ext", &tq, DType::F32, "f32")?;
        for t in [&tk, &tv] {
            if !matches!(t.dtype, DType::F32 | DType::F16) {
                return Err(dtype_err("flash_attn_ext", t, "f32 or f16"));
            }
        }
        if tk.ne[0] != tq.ne[0]
            || tv.ne[1] != tk.ne[1]
            || tv.ne[2] != tk.ne[2]
            || tk.ne[2] == 0
            || tq.ne[2] % tk.ne[2] != 0
            || tk.ne[3] != tq.ne[3]
            || tv.ne[3] != tq.ne[3]
        {
            return Err(shape_err(
                "flash_attn_ext",
                "q [D,n_q,H], k [D,n_kv,H_kv], v [Dv,n_kv,H_kv], H % H_kv == 0",
                &tq,
                tk.ne,
            ));
        }
        if let Some(m) = mask {
            let tm = *self.get(m)?;
            if !matches!(tm.dtype, DType::F32 | DType::F16) {
                return Err(dtype_err("flash_attn_ext", &tm, "f32 or f16"));
            }
            if tm.ne[0] != tk.ne[1] || tm.ne[1] < tq.ne[1] || tm.ne[2] != 1 || tm.ne[3] != 1 {
                return Err(shape_err(
                    "flash_attn_ext",
                    "mask [n_kv, >= n_q, 1, 1]",
                    &tq,
                    tm.ne,
                ));
            }
        }
        if !(scale.is_finite()
            && max_bias >= 0.0
            && max_bias.is_finite()
            && softcap >= 0.0
            && softcap.is_finite())
        {
            return Err(Error::Param {
                op: "flash_attn_ext",
                what: "scale finite, max_bias and softcap finite and >= 0",
            });
        }
        let op = Op::FlashAttnExt {
            scale,
            max_bias,
            softcap,
        };
        let ne = [tv.ne[0], tq.ne[2], tq.ne[1], tq.ne[3]];
        match mask {
            Some(m) => self.push_op(op, DType::F32, ne, &[q, k, v, m]),
            None => self.push_op(op, DType::F32, ne, &[q, k, v]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;

    fn storage<const N: usize>() -> [Tensor; N] {
        [Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); N]
    }

    #[test]
    fn set_rows_is_a_view_of_its_destination() {
        let mut s = storage::<8>();
        let mut ctx = Context::new(&mut s);
        let cache = ctx.new_tensor(DType::F16, [16, 32, 1, 1]).unwrap();
        let rows = ctx.new_tensor(DType::F32, [16, 4, 1, 1]).unwrap();
        let idx = ctx.new_tensor(DType::I32, [4, 1, 1, 1]).unwrap();
        let w = ctx.set_rows(cache, rows, idx).unwrap();
        let t = *ctx.get(w).unwrap();
        assert_eq!(
            (t.op, t.dtype, t.ne),
            (Op::SetRows, DType::F16, [16, 32, 1, 1])
        );
        assert_eq!((t.view_src, t.view_offs), (Some(cache), 0));
        assert_eq!(t.src[..2], [Some(rows), Some(idx)]);

        let wide = ctx.new_tensor(DType::F32, [8, 4, 1, 1]).unwrap();
        let idx5 = ctx.new_tensor(DType::I32, [5, 1, 1, 1]).unwrap();
        let q = ctx.new_tensor(DType::Q8_0, [32, 4, 1, 1]).unwrap();
        for (d, r, i) in [(cache, wide, idx), (cache, rows, idx5), (q, rows, idx)] {
            assert!(ctx.set_rows(d, r, i).is_err());
        }
        assert!(matches!(
            ctx.set_rows(cache, idx, idx),
            Err(Error::DType { op: "set_rows", .. })
        ));
    }

    #[test]
    fn mul_mat_shapes() {
        let mut s = storage::<8>();
        let mut ctx = Context::new(&mut s);
        let w = ctx.new_tensor(DType::Q4_1, [64, 10, 1, 1]).unwrap();
        let x = ctx.new_tensor(DType::F32, [64, 3, 1, 1]).unwrap();
        let y = ctx.mul_mat(w, x).unwrap();
        assert_eq!(ctx.get(y).unwrap().ne, [10, 3, 1, 1]);
        let bad = ctx.new_tensor(DType::F32, [32, 3, 1, 1]).unwrap();
        assert!(matches!(
            ctx.mul_mat(w, bad),
            Err(Error::Shape { op: "mul_mat", .. })
        ));
        assert!(matches!(
            ctx.mul_mat(x, w),
            Err(Error::DType { op: "mul_mat", .. })
        ));
    }

    #[test]
    fn views_stay_in_bounds() {
        let mut s = storage::<8>();
        let mut ctx = Context::new(&mut s);
        let a = ctx.new_tensor(DType::F32, [4, 4, 1, 1]).unwrap();
        let v = ctx.view_2d(a, 4, 2, 16, 32).unwrap();
        assert_eq!(ctx.get(v).unwrap().view_offs, 32);
        let vv = ctx.view_2d(v, 4, 1, 16, 16).unwrap();
        let t = ctx.get(vv).unwrap();
        assert_eq!((t.view_src, t.view_offs), (Some(a), 48));
        assert!(matches!(
            ctx.view_2d(a, 4, 2, 16, 40),
            Err(Error::ViewOutOfBounds { .. })
        ));
        assert!(matches!(
            ctx.view(a, [4, 1, 1, 1], [4, usize::MAX, 1, 1], 0),
            Ok(_) | Err(Error::Overflow { .. })
        ));
        assert!(matches!(
            ctx.view(a, [4, 2, 1, 1], [4, usize::MAX, 1, 1], 0),
            Err(Error::Overflow { .. })
        ));
    }

    #[test]
    fn permute_moves_dims() {
        let mut s = storage::<4>();
        let mut ctx = Context::new(&mut s);
        let a = ctx.new_tensor(DType::F32, [2, 3, 5, 1]).unwrap();
        let p = ctx.permute(a, [0, 2, 1, 3]).unwrap();
        let t = ctx.get(p).unwrap();
        assert_eq!(t.ne, [2, 5, 3, 1]);
        assert_eq!(t.nb, [4, 24, 8, 120]);
        assert!(ctx.permute(a, [0, 0, 1, 2]).is_err());
    }

    #[test]
    fn flash_attn_result_layout() {
        let mut s = storage::<8>();
        let mut ctx = Context::new(&mut s);
        let q = ctx.new_tensor(DType::F32, [64, 7, 9, 1]).unwrap();
        let k = ctx.new_tensor(DType::F16, [64, 256, 3, 1]).unwrap();
        let v = ctx.new_tensor(DType::F16, [64, 256, 3, 1]).unwrap();
        let m = ctx.new_tensor(DType::F16, [256, 8, 1, 1]).unwrap();
        let o = ctx
            .flash_attn_ext(q, k, v, Some(m), AttnParams::scaled(0.125))
            .unwrap();
        assert_eq!(ctx.get(o).unwrap().ne, [64, 9, 7, 1]);
        let k2 = ctx.new_tensor(DType::F16, [64, 256, 2, 1]).unwrap();
        assert!(ctx
            .flash_attn_ext(q, k2, v, None, AttnParams::scaled(0.125))
            .is_err());
    }

    #[test]
    fn gelu_and_geglu_shapes_and_dtypes() {
        let mut s = storage::<8>();
        let mut ctx = Context::new(&mut s);
        let g = ctx.new_tensor(DType::F32, [10, 3, 2, 1]).unwrap();
        let u = ctx.new_tensor(DType::F32, [10, 3, 2, 1]).unwrap();
        let y = ctx.gelu(g).unwrap();
        let t = *ctx.get(y).unwrap();
        assert_eq!((t.op, t.dtype, t.ne), (Op::Gelu, DType::F32, [10, 3, 2, 1]));
        assert_eq!((t.op.name(), &t.src[..2]), ("GELU", &[Some(g), None][..]));
        let z = ctx.geglu(g, u).unwrap();
        let t = *ctx.get(z).unwrap();
        assert_eq!(
            (t.op, t.dtype, t.ne),
            (Op::Geglu, DType::F32, [10, 3, 2, 1])
        );
        assert_eq!(
            (t.op.name(), &t.src[..2]),
            ("GEGLU", &[Some(g), Some(u)][..])
        );
        // Equal shapes only (no broadcasting), f32 only, as swiglu.
        let row = ctx.new_tensor(DType::F32, [10, 1, 1, 1]).unwrap();
        assert!(matches!(
            ctx.geglu(g, row),
            Err(Error::Shape { op: "geglu", .. })
        ));
        let h = ctx.new_tensor(DType::F16, [10, 3, 2, 1]).unwrap();
        assert!(matches!(ctx.gelu(h), Err(Error::DType { op: "gelu", .. })));
        assert!(matches!(
            ctx.geglu(g, h),
            Err(Error::DType { op: "geglu", .. })
        ));
    }

    #[test]
    fn moe_ops_shapes_and_errors() {
        let mut s = storage::<16>();
        let mut ctx = Context::new(&mut s);
        let w = ctx.new_tensor(DType::Q4_0, [64, 96, 4, 1]).unwrap();
        let x = ctx.new_tensor(DType::F32, [64, 1, 5, 1]).unwrap();
        let logits = ctx.new_tensor(DType::F32, [4, 5, 1, 1]).unwrap();
        let ids = ctx.argsort_top_k(logits, 2).unwrap();
        let t = *ctx.get(ids).unwrap();
        assert_eq!(
            (t.op, t.dtype, t.ne),
            (Op::ArgsortTopK { k: 2 }, DType::I32, [2, 5, 1, 1])
        );
        assert!(ctx.argsort_top_k(logits, 5).is_err());
        assert!(ctx.argsort_top_k(logits, 0).is_err());
        let y = ctx.mul_mat_id(w, x, ids).unwrap();
        let t = *ctx.get(y).unwrap();
        assert_eq!(
            (t.op.name(), t.dtype, t.ne),
            ("MUL_MAT_ID", DType::F32, [96, 2, 5, 1])
        );
        assert_eq!(&t.src[..3], &[Some(w), Some(x), Some(ids)][..]);
        // b with one row per selected expert is allowed; a K mismatch, a token-count
        // mismatch or float ids are not.
        let x2 = ctx.new_tensor(DType::F32, [64, 2, 5, 1]).unwrap();
        assert!(ctx.mul_mat_id(w, x2, ids).is_ok());
        let bad_k = ctx.new_tensor(DType::F32, [32, 1, 5, 1]).unwrap();
        assert!(matches!(
            ctx.mul_mat_id(w, bad_k, ids),
            Err(Error::Shape {
                op: "mul_mat_id",
                ..
            })
        ));
        let bad_t = ctx.new_tensor(DType::F32, [64, 1, 4, 1]).unwrap();
        assert!(ctx.mul_mat_id(w, bad_t, ids).is_err());
        assert!(matches!(
            ctx.mul_mat_id(w, x, logits),
            Err(Error::DType {
                op: "mul_mat_id",
                ..
            })
        ));
        let sums = ctx.sum_rows(logits).unwrap();
        assert_eq!(ctx.get(sums).unwrap().ne, [1, 5, 1, 1]);
        let best = ctx.argmax(logits).unwrap();
        let t = *ctx.get(best).unwrap();
        assert_eq!(
            (t.op.name(), t.dtype, t.ne),
            ("ARGMAX", DType::I32, [1, 5, 1, 1])
        );
        assert!(matches!(
            ctx.argmax(ids),
            Err(Error::DType { op: "argmax", .. })
        ));
        let empty_rows = ctx.new_tensor(DType::F32, [0, 2, 1, 1]).unwrap();
        assert!(matches!(
            ctx.argmax(empty_rows),
            Err(Error::Shape { op: "argmax", .. })
        ));
        let c = ctx
            .clamp(sums, half::f16::MIN_POSITIVE.to_f32(), f32::INFINITY)
            .unwrap();
        assert_eq!(
            ctx.get(c).unwrap().op,
            Op::Clamp {
                min: half::f16::MIN_POSITIVE.to_f32(),
                max: f32::INFINITY
            }
        );
        assert!(ctx.clamp(sums, 1.0, 0.0).is_err());
        assert!(ctx.clamp(sums, f32::NAN, 0.0).is_err());
        let d = ctx.div(logits, c).unwrap();
        assert_eq!(ctx.get(d).unwrap().op.name(), "DIV");
    }

    #[test]
    fn capacity_is_an_error() {
        let mut s = storage::<2>();
        let mut ctx = Context::new(&mut s);
        ctx.new_tensor_1d(DType::F32, 4).unwrap();
        ctx.new_tensor_1d(DType::F32, 4).unwrap();
        assert!(matches!(
            ctx.new_tensor_1d(DType::F32, 4),
            Err(Error::CapacityExceeded { capacity: 2, .. })
        ));
    }
}
