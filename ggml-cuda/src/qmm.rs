//! The host side of `qmm` (kernels/qmm.ptx): what one launch computes, and its argument
//! list in the order of the kernel's `.param`s.

use ggml_core::DType;

use crate::launch::{self, Args, LaunchDims};
use crate::qmm_variant::{Granularity, QmmVariant};

/// `(65535 + tc) / tc`: the kernel divides a thread index below 1024 by a tile's `tc`
/// chunks as a multiply by this and a shift by 16 (exact for `tc <= 64`).
fn tile_reciprocal(tc: usize) -> u32 {
    debug_assert!((1..=launch::QMM_TILE_DECODE).contains(&tc));
    ((65535 + tc) / tc) as u32
}

/// One weight matrix of a `qmm` launch and the output it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Matrix {
    /// Weights (device address).
    pub w: u64,
    /// The weights' dtype.
    pub dtype: DType,
    /// Rows (outputs per column).
    pub m: usize,
    /// Byte stride of the weight rows.
    pub nbw: usize,
    /// Output (device address).
    pub d: u64,
    /// Byte stride of the output columns.
    pub nbd: usize,
}

/// The RMS norm prologue: the activation is `x * scale * weight`, with `scale` of each
/// column as rms_norm computes it; `rms` and `mul` receive `x * scale` and the product.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Norm {
    /// Norm weight, f32 [K].
    pub weight: u64,
    /// Epsilon.
    pub eps: f32,
    /// rms_norm output [K, N].
    pub rms: u64,
    /// mul output [K, N].
    pub mul: u64,
    /// Column byte stride of both outputs.
    pub nb1: usize,
}

/// What the epilogue does with the products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Epilogue {
    /// Writes the products.
    None,
    /// Writes the product (one matrix) and `e = product + residual`.
    Add {
        /// Residual [M, N].
        res: u64,
        /// Its column byte stride.
        nbres: usize,
        /// The sum's output.
        e: u64,
        /// Its column byte stride.
        nbe: usize,
    },
    /// Writes gate (matrix 0), up (matrix 1) and `e = act(gate) * up`.
    Glu {
        /// GeGLU (else SwiGLU).
        geglu: bool,
        /// The gated output.
        e: u64,
        /// Its column byte stride.
        nbe: usize,
    },
}

/// MUL_MAT_ID: the expert of (slot y, token z) from `ids`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ids {
    /// i32 ids [n_used, T].
    pub ids: u64,
    /// Their byte strides.
    pub nb: [usize; 2],
    /// Number of experts.
    pub n_as: usize,
    /// Error word set on a bad id.
    pub err: u64,
}

/// Where the RoPE + KV-store epilogue sends one matrix's outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RopeRole {
    /// RoPE into the roped Q.
    Q,
    /// RoPE into the roped K, and the roped K into the K cache.
    K,
    /// The product into the V cache.
    V,
}

/// A float cache row store of the RoPE epilogue (set_rows into row `idx[column]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CacheStore {
    /// The cache (device address).
    pub cache: u64,
    /// Its row byte stride.
    pub nb1: usize,
    /// Its element type code: 0 f32, 1 f16, 2 bf16.
    pub ty: u32,
    /// Its rows.
    pub rows: usize,
    /// The store's error word (set to 1 on a row index outside the cache).
    pub err: u64,
}

/// The RoPE + KV-store epilogue (normal RoPE, pairs (2t, 2t+1), no YaRN ramp): the
/// `rope_store` kernel's arithmetic on the products of the launch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Rope {
    /// The role of each matrix (None: a plain product).
    pub roles: [Option<RopeRole>; 3],
    /// Outputs not written: a later output of the run takes their bytes.
    pub dead: [bool; 3],
    /// The norm prologue's two outputs not written (dead likewise).
    pub norm_dead: bool,
    /// i32 positions [N] and their byte stride.
    pub pos: (u64, usize),
    /// i32 cache rows [N] and their byte stride.
    pub idx: (u64, usize),
    /// Head dimension.
    pub ne0: usize,
    /// Rotated dimensions.
    pub n_dims: usize,
    /// theta_scale, freq_scale and mscale as the rope kernel takes them.
    pub consts: [f32; 3],
    /// Roped Q and its column byte stride (Q role).
    pub q: (u64, usize),
    /// Roped K and its column byte stride (K role).
    pub k: (u64, usize),
    /// The K cache store (K role).
    pub k_store: CacheStore,
    /// The V cache store (V role).
    pub v_store: CacheStore,
}

/// One `qmm` launch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Call {
    /// f32 activations.
    pub x: u64,
    /// Their byte strides of dims 1..3 (ids mode: rows, tokens).
    pub nbx: [usize; 3],
    /// Whether `x` holds the activations' Q8_1 blocks (quantize_q8_1's) rather than f32
    /// values.
    pub prequant: bool,
    /// K (a multiple of 32; of 256 for k-quants).
    pub k: usize,
    /// Columns N (ids mode: 1).
    pub n: usize,
    /// B2 and the broadcast ratios r2, r3 of matrix 0 (ids mode: B1, 1, 1).
    pub b2: usize,
    /// Broadcast ratio r2.
    pub r2: usize,
    /// Broadcast ratio r3.
    pub r3: usize,
    /// Blocks in y and z: column tiles and batches (ids mode: slots and tokens).
    pub ny: usize,
    /// See `ny`.
    pub nz: usize,
    /// Up to three matrices.
    pub mats: [Option<Matrix>; 3],
    /// Batch byte strides of matrix 0 (ids mode: the expert stride, 0).
    pub nbwb: [usize; 2],
    /// Batch byte strides of output 0 (ids mode: the token stride, 0).
    pub nbdb: [usize; 2],
    /// Norm prologue.
    pub norm: Option<Norm>,
    /// Epilogue.
    pub epi: Epilogue,
    /// MUL_MAT_ID.
    pub ids: Option<Ids>,
    /// The RoPE + KV-store epilogue (with `epi` None only).
    pub rope: Option<Rope>,
}

/// The byte alignment `qmm` needs of the weight rows of `dtype` (base and strides): the
/// largest power of two that divides the block size, up to 16.
pub(crate) fn weight_alignment(dtype: DType) -> usize {
    let ts = dtype.type_size();
    1 << ts.trailing_zeros().min(4)
}

impl Default for Matrix {
    fn default() -> Matrix {
        Matrix {
            w: 0,
            dtype: DType::F32,
            m: 0,
            nbw: 0,
            d: 0,
            nbd: 0,
        }
    }
}

impl Call {
    /// Columns per block.
    fn nt(&self) -> usize {
        if self.ids.is_some() {
            1
        } else {
            launch::qmm_columns(self.n)
        }
    }

    /// Partials per output: the decode class's [`launch::QMM_DECODE_LANES`] below
    /// [`launch::MMQ_MIN_N`] tokens (columns; ids mode: tokens) when `decode_lanes` (the
    /// tuning of that name), else 1.
    fn lanes(&self, decode_lanes: bool) -> usize {
        match decode_lanes {
            true => launch::qmm_lanes(if self.ids.is_some() { self.nz } else { self.n }),
            false => 1,
        }
    }

    /// Rows per block and the blocks over the rows.
    fn rows(&self, decode_lanes: bool) -> Option<(usize, usize)> {
        let nt = self.nt();
        let lanes = self.lanes(decode_lanes);
        let ms = self.mats.iter().flatten().map(|m| m.m);
        if matches!(self.epi, Epilogue::Glu { .. }) {
            let m0 = self.mats[0]?.m;
            let rows = launch::qmm_rows(nt, lanes, 2 * m0, self.k / 32)?;
            return Some((rows, m0.div_ceil(rows / 2)));
        }
        let total: usize = ms.clone().sum();
        let rows = launch::qmm_rows(nt, lanes, total, self.k / 32)?;
        Some((rows, ms.map(|m| m.div_ceil(rows)).sum()))
    }

    /// Grid, block and shared memory with the default tuning, or `None` past the launch
    /// limits.
    #[cfg(test)]
    pub fn dims(&self) -> Option<LaunchDims> {
        self.dims_with(true)
    }

    /// Grid, block and shared memory, with the decode class's 8 lanes per output when
    /// `decode_lanes` (the tuning of that name), or `None` past the launch limits.
    pub fn dims_with(&self, decode_lanes: bool) -> Option<LaunchDims> {
        let (rows, ctas) = self.rows(decode_lanes)?;
        let mut d = launch::qmm(
            ctas,
            self.ny,
            self.nz,
            rows,
            self.nt(),
            self.lanes(decode_lanes),
            self.k / 32,
        )?;
        if self.rope.is_some() {
            // The RoPE table past the norm scales: cos and sin of each output.
            d.shared += u32::try_from(rows * self.nt() * 8).ok()?;
        }
        Some(d)
    }

    /// The arguments, in the order of the kernel's parameters, with Q8_0 blocks loaded
    /// through 48-byte windows when `q8_window` (the tuning of that name; same values),
    /// and the decode class's 8 lanes per output when `decode_lanes` (its tuning).
    pub fn args_with(&self, q8_window: bool, decode_lanes: bool) -> Option<Args> {
        let (rows, _) = self.rows(decode_lanes)?;
        let mut a = Args::new();
        a.u64(self.x);
        for s in self.nbx {
            a.usize(s);
        }
        let flags = self.flags(rows, q8_window, decode_lanes);
        let chunks = self.k / 32;
        let tc = launch::qmm_tile(self.nt(), chunks);
        let [offw, offs, offn, _] = launch::qmm_layout(rows, self.nt(), tc);
        a.u32(chunks as u32)
            .u32(tile_reciprocal(chunks.clamp(1, tc)))
            .u32(tile_reciprocal((chunks.max(1) - 1) % tc + 1))
            .u32(tc as u32)
            .u32(offw as u32)
            .u32(offs as u32)
            .u32(offn as u32)
            .u32(self.n as u32)
            .u32(self.nt() as u32)
            .u32(rows as u32)
            .u32(self.b2 as u32)
            .u32(self.r2 as u32)
            .u32(self.r3 as u32)
            .u32(flags);
        let norm = self.norm.unwrap_or(Norm {
            weight: 0,
            eps: 0.0,
            rms: 0,
            mul: 0,
            nb1: 0,
        });
        a.u64(norm.weight)
            .f32(norm.eps)
            .f32(1.0 / self.k.max(1) as f32)
            .u64(norm.rms)
            .u64(norm.mul)
            .usize(norm.nb1);
        let mats = self.mats.map(Option::unwrap_or_default);
        for m in &mats {
            a.u64(m.w);
        }
        for code in self.dtype_codes() {
            a.u32(code);
        }
        for m in &mats {
            a.u32(m.m as u32);
        }
        for m in &mats {
            a.usize(m.nbw);
        }
        a.usize(self.nbwb[0]).usize(self.nbwb[1]);
        for m in &mats {
            a.u64(m.d);
        }
        for m in &mats {
            a.usize(m.nbd);
        }
        a.usize(self.nbdb[0]).usize(self.nbdb[1]);
        let (res, nbres, e, nbe) = match self.epi {
            Epilogue::None => (0, 0, 0, 0),
            Epilogue::Add { res, nbres, e, nbe } => (res, nbres, e, nbe),
            Epilogue::Glu { e, nbe, .. } => (0, 0, e, nbe),
        };
        a.u64(res).usize(nbres).u64(e).usize(nbe);
        let ids = self.ids.unwrap_or(Ids {
            ids: 0,
            nb: [0, 0],
            n_as: 0,
            err: 0,
        });
        a.u64(ids.ids)
            .usize(ids.nb[0])
            .usize(ids.nb[1])
            .u32(ids.n_as as u32)
            .u64(ids.err);
        self.rope_args(&mut a);
        Some(a)
    }
}

impl Call {
    /// `p_flags` of a launch with `rows` rows per block.
    fn flags(&self, rows: usize, q8_window: bool, decode_lanes: bool) -> u32 {
        u32::from(self.norm.is_some())
            | match self.epi {
                Epilogue::None => 0,
                Epilogue::Add { .. } => 2,
                Epilogue::Glu { geglu: false, .. } => 4,
                Epilogue::Glu { geglu: true, .. } => 6,
            }
            | if self.ids.is_some() { 8 } else { 0 }
            | if self.prequant { 16 } else { 0 }
            | if self.rope.is_some() { 32 } else { 0 }
            | rows.trailing_zeros() << 8
            | u32::from(q8_window) << 12
            | u32::from(self.lanes(decode_lanes) > 1) << 13
    }

    /// `p_dt0..2`: each matrix's dtype code and, above it, the bytes per block (for the
    /// prefetches). A matrix that is not there passes matrix 0's (the kernel never reads
    /// it: no block and no group selects a matrix of 0 rows), so that matrices of one
    /// dtype pass one code and a launch has a [`QmmVariant`].
    fn dtype_codes(&self) -> [u32; 3] {
        let code = |d: DType| d.ggml_id() | (d.type_size() as u32) << 8;
        let first = self.mats[0].map_or(DType::F32, |m| m.dtype);
        self.mats.map(|m| code(m.map_or(first, |m| m.dtype)))
    }

    /// The [`QmmVariant`] a launch runs with variants of `specialize`'s granularity
    /// (`None`: the tuning `no-specialize`): the decode class's launches (8 lanes per
    /// output) whose matrices share one dtype. Other
    /// launches run the generic entry: a prompt's products are long enough that their
    /// instruction fetch is paid once, and their forms would each compile another entry.
    pub(crate) fn variant_with(
        &self,
        q8_window: bool,
        decode_lanes: bool,
        specialize: Option<Granularity>,
    ) -> Option<QmmVariant> {
        let granularity = specialize?;
        if self.lanes(decode_lanes) == 1 {
            return None;
        }
        let (rows, _) = self.rows(decode_lanes)?;
        QmmVariant::of(
            self.flags(rows, q8_window, decode_lanes),
            self.dtype_codes(),
            granularity,
        )
    }

    /// The RoPE epilogue's arguments (all 0 without it).
    fn rope_args(&self, a: &mut Args) {
        let none = CacheStore {
            cache: 0,
            nb1: 0,
            ty: 0,
            rows: 0,
            err: 0,
        };
        let r = self.rope.unwrap_or(Rope {
            roles: [None; 3],
            dead: [false; 3],
            norm_dead: false,
            pos: (0, 0),
            idx: (0, 0),
            ne0: 0,
            n_dims: 0,
            consts: [0.0; 3],
            q: (0, 0),
            k: (0, 0),
            k_store: none,
            v_store: none,
        });
        let mut flags = 0u32;
        for (i, role) in r.roles.iter().enumerate() {
            let code = match role {
                None => 0,
                Some(RopeRole::Q) => 1,
                Some(RopeRole::K) => 2,
                Some(RopeRole::V) => 3,
            };
            flags |= code << (2 * i) | u32::from(r.dead[i]) << (6 + i);
        }
        flags |= u32::from(r.norm_dead) << 9;
        a.u32(flags)
            .u64(r.pos.0)
            .usize(r.pos.1)
            .u64(r.idx.0)
            .usize(r.idx.1)
            .u32(r.ne0 as u32)
            .u32(r.n_dims as u32)
            .u32(launch::div_magic(r.ne0.max(1) as u32));
        for c in r.consts {
            a.f32(c);
        }
        a.u64(r.q.0).usize(r.q.1).u64(r.k.0).usize(r.k.1);
        a.u64(r.k_store.cache)
            .usize(r.k_store.nb1)
            .u64(r.v_store.cache)
            .usize(r.v_store.nb1);
        a.u32(r.k_store.ty)
            .u32(r.v_store.ty)
            .u32(r.k_store.rows as u32)
            .u32(r.v_store.rows as u32);
        a.u64(r.k_store.err).u64(r.v_store.err);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{entries, KernelId};

    fn call() -> Call {
        let mat = Matrix {
            w: 0x1000,
            dtype: DType::Q4_1,
            m: 576,
            nbw: 360,
            d: 0x2000,
            nbd: 2304,
        };
        Call {
            x: 0x3000,
            nbx: [2304, 2304, 2304],
            prequant: false,
            k: 576,
            n: 1,
            b2: 1,
            r2: 1,
            r3: 1,
            ny: 1,
            nz: 1,
            mats: [Some(mat), Some(Matrix { m: 192, ..mat }), None],
            nbwb: [0, 0],
            nbdb: [0, 0],
            norm: None,
            epi: Epilogue::None,
            ids: None,
            rope: None,
        }
    }

    #[test]
    fn args_match_the_kernel_parameters() {
        let (file, name) = KernelId::Qmm.entry();
        let m = crate::kernels::MODULES
            .iter()
            .find(|m| m.file == file)
            .unwrap();
        let e = entries(m.source)
            .into_iter()
            .find(|e| e.name == name)
            .unwrap();
        let a = call().args_with(false, true).unwrap();
        assert_eq!(a.len(), e.params.len());
    }

    #[test]
    fn tile_reciprocal_divides_every_thread_index_exactly() {
        for tc in 1..=launch::QMM_TILE_DECODE {
            let itc = tile_reciprocal(tc);
            for thr in 0..1024u32 {
                assert_eq!((thr * itc) >> 16, thr / tc as u32, "{thr} / {tc}");
            }
        }
    }

    /// The kernel's division-free `x / d` for a constant `d` with `c = RN(1/d)`
    /// (Markstein): `q0 = x c`, `r = x - d q0` (exact), `RN(q0 + r c)`.
    fn markstein(x: f32, d: f32, c: f32) -> f32 {
        let q0 = x * c;
        let r = q0.mul_add(-d, x);
        r.mul_add(c, q0)
    }

    /// Stage A's `d = amax / 127`: every non-negative f32 (and +inf passed through, as
    /// the kernel does) gives the division's bits.
    #[test]
    fn division_by_127_without_a_division_is_exact_for_every_non_negative_f32() {
        let c = 1.0f32 / 127.0;
        assert_eq!(c.to_bits(), 0x3C01_0204, "the kernel's constant");
        let wrong = (0u32..=0x7F80_0000)
            .filter(|&b| {
                let x = f32::from_bits(b);
                let q = if x.is_infinite() {
                    x * c
                } else {
                    markstein(x, 127.0, c)
                };
                q.to_bits() != (x / 127.0).to_bits()
            })
            .count();
        assert_eq!(wrong, 0);
    }

    /// The norm's `mean = sum / K` where the kernel takes the division-free path
    /// (2^-100 <= sum < inf): every such f32 for SmolLM2's two K, every 7th for other K
    /// (Markstein's theorem covers every K; below 2^-100 the quotient can be subnormal,
    /// where it fails, and the kernel divides).
    #[rstest::rstest]
    #[case(576, 1)]
    #[case(1536, 1)]
    #[case(32, 7)]
    #[case(96, 7)]
    #[case(640, 7)]
    #[case(960, 7)]
    #[case(2048, 7)]
    #[case(2880, 7)]
    #[case(4096, 7)]
    #[case(5120, 7)]
    #[case(8192, 7)]
    #[case(14336, 7)]
    fn division_by_k_without_a_division_is_exact_above_2_pow_minus_100(
        #[case] k: u32,
        #[case] step: usize,
    ) {
        let d = k as f32;
        let c = 1.0 / d;
        let lo = 2f32.powi(-100).to_bits();
        let wrong = (lo..0x7F80_0000)
            .step_by(step)
            .filter(|&b| {
                let x = f32::from_bits(b);
                markstein(x, d, c).to_bits() != (x / d).to_bits()
            })
            .count();
        assert_eq!(wrong, 0);
        // The guard is needed: just below it some quotients do differ.
        if k == 576 {
            let x = f32::from_bits(0x0080_0460);
            assert_ne!(markstein(x, d, c).to_bits(), (x / d).to_bits());
        }
    }

    #[test]
    fn blocks_cover_every_matrix() {
        let c = call();
        // 576 + 192 rows at 8 rows per block.
        assert_eq!(c.dims().unwrap().grid, (72 + 24, 1, 1));
        let glu = Call {
            epi: Epilogue::Glu {
                geglu: false,
                e: 0x4000,
                nbe: 6144,
            },
            mats: [c.mats[0], c.mats[0], None],
            ..c
        };
        // Each block takes 4 rows of both matrices.
        assert_eq!(glu.dims().unwrap().grid, (144, 1, 1));
    }

    #[test]
    fn alignment_of_each_format() {
        assert_eq!(weight_alignment(DType::Q4_0), 2);
        assert_eq!(weight_alignment(DType::Q4_1), 4);
        assert_eq!(weight_alignment(DType::Q5_1), 8);
        assert_eq!(weight_alignment(DType::Q4K), 16);
        assert_eq!(weight_alignment(DType::Q6K), 2);
    }
}
