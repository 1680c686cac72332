//! Launch configurations of the kernels (pure arithmetic, tested without a GPU) and the
//! on-stack kernel argument list.

use core::ffi::c_void;

/// CUDA's limit on `gridDim.y` and `gridDim.z`.
pub const MAX_GRID_YZ: u32 = 65_535;
/// CUDA's limit on `gridDim.x`.
pub const MAX_GRID_X: u32 = i32::MAX as u32;
/// Threads per block of the elementwise kernels.
pub const ELEMENTWISE_BLOCK: u32 = 256;
/// Shared memory a block may use without opting in (48 KiB).
pub const DEFAULT_MAX_SHARED: u32 = 48 * 1024;
/// Largest head size flash_attn_ext supports (D and Dv).
pub const MAX_HEAD_DIM: usize = 256;
/// Longest row argsort_top_k sorts: its 8-byte sort keys fill the default 48 KiB of
/// shared memory.
pub const ARGSORT_MAX_N: usize = DEFAULT_MAX_SHARED as usize / 8;
/// Threads per block of sum_rows (one thread per row).
pub const SUM_ROWS_BLOCK: u32 = 256;

/// Grid, block and dynamic shared memory of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDims {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory in bytes.
    pub shared: u32,
    /// Launch with programmatic stream serialisation (Hopper's programmatic dependent
    /// launch): the grid may start while the kernel before it on the stream finishes and
    /// waits for it at its `griddepcontrol.wait`. Set at launch for the kernels that have
    /// the wait, on sm_90 and newer, unless [`CudaTuning::pdl`](crate::CudaTuning::pdl)
    /// is off; the shapes' functions here leave it `false`.
    pub programmatic: bool,
}

/// The kernel class of a quantised mul_mat; both give bit-identical results because
/// they share the per-output reduction order (see `kernels/quant.ptx`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MulMatClass {
    /// `mmvq`: one warp per output element (N < [`MMQ_MIN_N`]).
    Mmvq,
    /// `mmq`: one warp per 1 x 8 output tile (N >= [`MMQ_MIN_N`]).
    Mmq,
}

/// Smallest number of activation columns (tokens) for which the tiled `mmq` kernel runs.
pub const MMQ_MIN_N: usize = 8;

/// The quantised mul_mat kernel class used for `n` activation columns.
pub fn mul_mat_class(n: usize) -> MulMatClass {
    if n >= MMQ_MIN_N {
        MulMatClass::Mmq
    } else {
        MulMatClass::Mmvq
    }
}

fn div_ceil_u32(a: usize, b: usize) -> Option<u32> {
    u32::try_from(a.div_ceil(b)).ok()
}

fn check(d: LaunchDims) -> Option<LaunchDims> {
    let (x, y, z) = d.grid;
    let ok = (1..=MAX_GRID_X).contains(&x)
        && (1..=MAX_GRID_YZ).contains(&y)
        && (1..=MAX_GRID_YZ).contains(&z);
    ok.then_some(d)
}

/// One thread per element, 256 per block (binary, unary, cpy, concat). `None` when
/// `n` is 0 or does not fit the 32-bit element index the kernels use.
pub fn elementwise(n: usize) -> Option<LaunchDims> {
    if n == 0 || n > u32::MAX as usize {
        return None;
    }
    check(LaunchDims {
        grid: (div_ceil_u32(n, ELEMENTWISE_BLOCK as usize)?, 1, 1),
        block: (ELEMENTWISE_BLOCK, 1, 1),
        shared: 0,
        programmatic: false,
    })
}

/// One warp per row, 4 rows per block (rms_norm, soft_max).
pub fn warp_per_row(rows: usize) -> Option<LaunchDims> {
    if rows == 0 || rows > u32::MAX as usize {
        return None;
    }
    check(LaunchDims {
        grid: (div_ceil_u32(rows, 4)?, 1, 1),
        block: (32, 4, 1),
        shared: 0,
        programmatic: false,
    })
}

/// `rms_norm_q8_1` over `rows` rows of `n` values: one block per row, a warp per Q8_1
/// block (at most 32 warps, each then taking every 32nd block).
pub fn rms_norm_q8_1(rows: usize, n: usize) -> Option<LaunchDims> {
    // One warp per Q8_1 block of the row (each warp recomputes the row's scale), at most
    // 32 (then warps take several blocks).
    let warps = (n / 32).clamp(1, 32) as u32;
    check(LaunchDims {
        grid: (u32::try_from(rows).ok().filter(|&r| r > 0)?, 1, 1),
        block: (32, warps, 1),
        shared: 0,
        programmatic: false,
    })
}

/// mul_mat kernels: `mmvq` and `mul_mat_f` use one warp per (row m, column n); `mmq` one
/// warp per (row m, 8 columns). `batch` = B2 * B3.
pub fn mul_mat(class: Option<MulMatClass>, m: usize, n: usize, batch: usize) -> Option<LaunchDims> {
    if m == 0 || n == 0 || batch == 0 {
        return None;
    }
    let ny = match class {
        Some(MulMatClass::Mmq) => n.div_ceil(8),
        _ => n,
    };
    check(LaunchDims {
        grid: (
            div_ceil_u32(m, 4)?,
            u32::try_from(ny).ok()?,
            u32::try_from(batch).ok()?,
        ),
        block: (32, 4, 1),
        shared: 0,
        programmatic: false,
    })
}

/// mul_mat_id (`mmvq_id` and `mul_mat_f_id`): one warp per output element (row m, slot
/// e, token t), 4 warps per block: grid (ceil(M/4), n_used, T).
pub fn mul_mat_id(m: usize, n_used: usize, tokens: usize) -> Option<LaunchDims> {
    if m == 0 || n_used == 0 || tokens == 0 {
        return None;
    }
    check(LaunchDims {
        grid: (
            div_ceil_u32(m, 4)?,
            u32::try_from(n_used).ok()?,
            u32::try_from(tokens).ok()?,
        ),
        block: (32, 4, 1),
        shared: 0,
        programmatic: false,
    })
}

/// Most threads per block of `qmm`.
pub const QMM_MAX_THREADS: usize = 256;
/// Chunks of 32 values per K-tile of `qmm` (its shared memory holds one tile).
pub const QMM_TILE: usize = 32;
/// Chunks per K-tile of a `qmm` block of fewer than [`QMM_MMQ_COLUMNS`] columns when K has
/// more than [`QMM_TILE`] chunks: K up to 2048 in one tile (one pass of stages A and B,
/// instead of one per 32 chunks, each waiting for its loads and barriers).
pub const QMM_TILE_DECODE: usize = 64;
/// Most threads per `qmm` block with [`QMM_TILE_DECODE`]-chunk tiles (one per (row, chunk)
/// of 8 rows).
pub const QMM_MAX_THREADS_DECODE: usize = 512;
/// Columns per block of `qmm` in the tiled class (N >= [`MMQ_MIN_N`]); below it a block
/// takes all N columns.
pub const QMM_MMQ_COLUMNS: usize = 8;
/// Partials per output of `qmm`'s decode class (a product over fewer than
/// [`MMQ_MIN_N`] tokens: its columns, or MUL_MAT_ID's tokens): chunk `j` of K feeds
/// partial `j mod 8`, each on a lane of its own, and the 8 meet in the butterfly
/// (`reference::mul_mat_q_dot_lanes`). The tiled class keeps one chain per output.
pub const QMM_DECODE_LANES: usize = 8;

/// Partials (and threads) per output of a `qmm` product over `tokens` tokens (its
/// columns; MUL_MAT_ID: its tokens): [`QMM_DECODE_LANES`] in the decode class, else 1.
pub fn qmm_lanes(tokens: usize) -> usize {
    match mul_mat_class(tokens) {
        MulMatClass::Mmvq => QMM_DECODE_LANES,
        MulMatClass::Mmq => 1,
    }
}
/// Blocks `qmm` aims for at least, when choosing its rows per block: one per SM of an
/// H100/H200 (132 SMs). Modelled on the H200 (`ggml-harness profile --gen-position 64`),
/// SmolLM2's gate + up run (3072 rows, both matrices in one stage-B pass) takes 7.08 µs
/// at 8 rows a block (384 blocks, each loading and normalising the activation), 6.23 at
/// 16 (192 blocks of 288 threads), 6.98 at 32 (96 blocks, stage B in three rounds of 256
/// threads); the Q, K and V run (960 rows) 5.41 at 8 (120 blocks), 5.36 at 16; the O
/// product (576 rows) 3.16 at 8 (72 blocks), more at 16 (the two MUL_MAT+ADD launches
/// 3.78 -> 3.88 µs on average).
const QMM_MIN_BLOCKS: usize = 132;

/// Byte offsets of the W, S and norm-scale regions of a `qmm` block's shared memory, and
/// its size, for `rows` rows, `nt` columns and K-tiles of `tc` chunks (see its PTX
/// header).
pub fn qmm_layout(rows: usize, nt: usize, tc: usize) -> [usize; 4] {
    let w = nt * tc * 48;
    let s = w + rows * (tc + 1) * 16;
    let n = s + rows * nt * (tc + 4) * 4;
    [w, s, n, n + 32]
}

/// Shared memory of a `qmm` block of `rows` rows, `nt` columns and `tc`-chunk K-tiles.
pub fn qmm_shared(rows: usize, nt: usize, tc: usize) -> usize {
    qmm_layout(rows, nt, tc)[3]
}

/// The K-tile chosen by [`set_qmm_tile`] (0: none).
static QMM_TILE_FORCED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Makes [`qmm_tile`] answer `tc` (32 or 64) wherever its rules allow a choice, or go back
/// to its own (`None`): a knob to compare the two (any choice gives the same bits).
/// Process-wide.
pub fn set_qmm_tile(tc: Option<usize>) {
    let t = tc
        .filter(|t| [QMM_TILE, QMM_TILE_DECODE].contains(t))
        .unwrap_or(0);
    QMM_TILE_FORCED.store(t, std::sync::atomic::Ordering::Relaxed);
}

/// Chunks per K-tile of a `qmm` block of `nt` columns for K of `nchunks` chunks:
/// [`QMM_TILE_DECODE`] below [`QMM_MMQ_COLUMNS`] columns when K has more than one
/// [`QMM_TILE`] (and 8 rows of it fit the default shared memory), else [`QMM_TILE`].
pub fn qmm_tile(nt: usize, nchunks: usize) -> usize {
    let allowed = nt < QMM_MMQ_COLUMNS
        && nchunks > QMM_TILE
        && qmm_shared(8, nt, QMM_TILE_DECODE) <= DEFAULT_MAX_SHARED as usize;
    match QMM_TILE_FORCED.load(std::sync::atomic::Ordering::Relaxed) {
        _ if !allowed => QMM_TILE,
        0 => QMM_TILE_DECODE,
        t => t,
    }
}

/// Columns per `qmm` block for `n` columns: all of them below [`MMQ_MIN_N`], else
/// [`QMM_MMQ_COLUMNS`].
pub fn qmm_columns(n: usize) -> usize {
    match mul_mat_class(n) {
        MulMatClass::Mmvq => n,
        MulMatClass::Mmq => QMM_MMQ_COLUMNS,
    }
}

/// Rows per block that [`set_qmm_rows`] forces (0: none).
static QMM_ROWS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Makes [`qmm_rows`] answer `rows` (8, 16, 32 or 64) wherever that fits the block's
/// threads and shared memory, or go back to its own choice (`None`): a knob for speed
/// measurements (any choice gives the same bits). Process-wide.
pub fn set_qmm_rows(rows: Option<usize>) {
    let r = rows.filter(|r| [8, 16, 32, 64].contains(r)).unwrap_or(0);
    QMM_ROWS.store(r, std::sync::atomic::Ordering::Relaxed);
}

/// Most shared memory a `qmm` block of the tiled class asks for (it opts in past the
/// default 48 KiB; every sm_80+ GPU allows more).
pub const QMM_MAX_SHARED: usize = 96 * 1024;

/// Rows per `qmm` block (8, 16, 32 or 64) for blocks of `nt` columns over `total_rows`
/// rows. Fewer than 8 columns: the largest that still gives `QMM_MIN_BLOCKS` blocks
/// within the default 48 KiB of shared memory (latency matters: many small blocks); the
/// tiled class: 32 rows (one output per thread of 256, fewer and fuller blocks). More
/// than 8 rows only where `lanes` threads per output ([`qmm_lanes`]) fit in 256. `None`
/// when `nt` is 0 or above 8. Any choice gives the same bits.
pub fn qmm_rows(nt: usize, lanes: usize, total_rows: usize, nchunks: usize) -> Option<usize> {
    if nt == 0 || nt > QMM_MMQ_COLUMNS {
        return None;
    }
    let tc = qmm_tile(nt, nchunks);
    let tiled = nt == QMM_MMQ_COLUMNS;
    let limit = if tiled {
        QMM_MAX_SHARED
    } else {
        DEFAULT_MAX_SHARED as usize
    };
    let fits = |r: usize| r * nt * lanes <= QMM_MAX_THREADS && qmm_shared(r, nt, tc) <= limit;
    let forced = QMM_ROWS.load(std::sync::atomic::Ordering::Relaxed);
    if forced != 0 && fits(forced) {
        return Some(forced);
    }
    if tiled {
        return Some(32);
    }
    let mut r = 8;
    while r < 64 && fits(2 * r) && total_rows.div_ceil(2 * r) >= QMM_MIN_BLOCKS {
        r *= 2;
    }
    Some(r)
}

/// Threads per `qmm` block of `rows` rows and `nt` columns for K of `nchunks` chunks:
/// one per (row, chunk) of a K-tile, up to [`QMM_MAX_THREADS`] ([`QMM_MAX_THREADS_DECODE`]
/// with [`QMM_TILE_DECODE`]-chunk tiles, or below 8 columns when that many threads take
/// every task at once), and at least `lanes` per output ([`qmm_lanes`]).
pub fn qmm_threads(rows: usize, nt: usize, lanes: usize, nchunks: usize) -> usize {
    let tc = qmm_tile(nt, nchunks);
    let tasks = rows * nchunks.clamp(1, tc);
    // Below 8 columns a block's tasks all run in one round when up to 512 threads hold
    // them (each round waits for its weight loads); more tasks take 256-thread rounds,
    // so that blocks of 84 registers a thread still fit three to an SM.
    let one_round = nt < QMM_MMQ_COLUMNS && tasks <= QMM_MAX_THREADS_DECODE;
    let most = if tc == QMM_TILE && !one_round {
        QMM_MAX_THREADS
    } else {
        QMM_MAX_THREADS_DECODE
    };
    (tasks.min(most).max(rows * nt * lanes)).div_ceil(32) * 32
}

/// `qmm`: `ctas` blocks over the rows, `ny` over column tiles (or MUL_MAT_ID's slots),
/// `nz` over batches (or tokens); `rows` x `nt` outputs per block of `lanes` threads each
/// ([`qmm_lanes`]), K of `nchunks` chunks.
pub fn qmm(
    ctas: usize,
    ny: usize,
    nz: usize,
    rows: usize,
    nt: usize,
    lanes: usize,
    nchunks: usize,
) -> Option<LaunchDims> {
    if ctas == 0 || ny == 0 || nz == 0 || rows == 0 || nt == 0 || nchunks == 0 {
        return None;
    }
    check(LaunchDims {
        grid: (
            u32::try_from(ctas).ok()?,
            u32::try_from(ny).ok()?,
            u32::try_from(nz).ok()?,
        ),
        block: (qmm_threads(rows, nt, lanes, nchunks) as u32, 1, 1),
        shared: u32::try_from(qmm_shared(rows, nt, qmm_tile(nt, nchunks))).ok()?,
        programmatic: false,
    })
}

/// Outputs a `qgemm` block computes along each of M and N.
pub const QGEMM_TILE: usize = 32;
/// Threads of a `qgemm` block.
pub const QGEMM_THREADS: u32 = 128;
/// Shared memory of a `qgemm` block: 32 row lines of 8 unpacked weight chunks of 80 bytes
/// padded by 16, then 32 column lines of 8 activation blocks of 48 bytes padded by 16 (its
/// PTX header; the padding keeps both the stores and the loads free of bank conflicts).
pub const QGEMM_SHARED: u32 = 32 * (8 * 80 + 16) + 32 * (8 * 48 + 16);

/// `qgemm` over an `m` x `n` output of `nchunks` chunks: one block of
/// [`QGEMM_THREADS`] per 32 x 32 tile.
pub fn qgemm(m: usize, n: usize, nchunks: usize) -> Option<LaunchDims> {
    if m == 0 || n == 0 || nchunks == 0 || m > u32::MAX as usize || n > u32::MAX as usize {
        return None;
    }
    check(LaunchDims {
        grid: (
            div_ceil_u32(m, QGEMM_TILE)?,
            div_ceil_u32(n, QGEMM_TILE)?,
            1,
        ),
        block: (QGEMM_THREADS, 1, 1),
        shared: QGEMM_SHARED,
        programmatic: false,
    })
}

/// sum_rows: one thread per row, [`SUM_ROWS_BLOCK`] per block.
pub fn sum_rows(rows: usize) -> Option<LaunchDims> {
    if rows == 0 || rows > u32::MAX as usize {
        return None;
    }
    check(LaunchDims {
        grid: (div_ceil_u32(rows, SUM_ROWS_BLOCK as usize)?, 1, 1),
        block: (SUM_ROWS_BLOCK, 1, 1),
        shared: 0,
        programmatic: false,
    })
}

/// Threads per block of argmax (one block per row).
pub const ARGMAX_BLOCK: u32 = 256;

/// argmax: one block of [`ARGMAX_BLOCK`] threads per row.
pub fn argmax(rows: usize) -> Option<LaunchDims> {
    if rows == 0 {
        return None;
    }
    check(LaunchDims {
        grid: (u32::try_from(rows).ok()?, 1, 1),
        block: (ARGMAX_BLOCK, 1, 1),
        shared: 0,
        programmatic: false,
    })
}

/// argsort_top_k: one block per row of `n` values, `min(256, n rounded up to 32)`
/// threads, `8 n` bytes of shared memory for the sort keys. `None` past
/// [`ARGSORT_MAX_N`].
pub fn argsort_top_k(n: usize, rows: usize) -> Option<LaunchDims> {
    if n == 0 || n > ARGSORT_MAX_N || rows == 0 {
        return None;
    }
    check(LaunchDims {
        grid: (u32::try_from(rows).ok()?, 1, 1),
        block: ((n.div_ceil(32) * 32).min(256) as u32, 1, 1),
        shared: (8 * n) as u32,
        programmatic: false,
    })
}

/// `quantize_q8_1`: 8 blocks of 32 values per 256-thread block; rows in y, batch in z.
pub fn quantize_q8_1(k: usize, rows: usize, batch: usize) -> Option<LaunchDims> {
    if k == 0 || k % 32 != 0 || rows == 0 || batch == 0 {
        return None;
    }
    check(LaunchDims {
        grid: (
            div_ceil_u32(k / 32, 8)?,
            u32::try_from(rows).ok()?,
            u32::try_from(batch).ok()?,
        ),
        block: (256, 1, 1),
        shared: 0,
        programmatic: false,
    })
}

/// get_rows: `get_rows_f` has one thread per element of a row (256 per block),
/// `get_rows_q` one thread per 32-value chunk (64 per block). `k` rows gathered per
/// (j, l), `zl` = A2 * L.
pub fn get_rows(quantized: bool, n: usize, k: usize, zl: usize) -> Option<LaunchDims> {
    if n == 0 || k == 0 || zl == 0 {
        return None;
    }
    let (x, bx) = if quantized {
        if n % 32 != 0 {
            return None;
        }
        (div_ceil_u32(n / 32, 64)?, 64)
    } else {
        (div_ceil_u32(n, 256)?, 256)
    };
    check(LaunchDims {
        grid: (x, u32::try_from(k).ok()?, u32::try_from(zl).ok()?),
        block: (bx, 1, 1),
        shared: 0,
        programmatic: false,
    })
}

/// rope: one block per (head, token, i3), one thread per rotated pair.
pub fn rope(ne: [usize; 4]) -> Option<LaunchDims> {
    let pairs = ne[0] / 2;
    if pairs == 0 || ne[0] % 2 != 0 || pairs > 1024 {
        return None;
    }
    let threads = (pairs.div_ceil(32) * 32) as u32;
    check(LaunchDims {
        grid: (
            u32::try_from(ne[1]).ok()?,
            u32::try_from(ne[2]).ok()?,
            u32::try_from(ne[3]).ok()?,
        ),
        block: (threads, 1, 1),
        shared: 0,
        programmatic: false,
    })
}

/// Most threads of a `rope_store` block.
pub const ROPE_STORE_THREADS: u32 = 512;

/// rope_store: one block per token, with its `hq` Q heads and `hk` K heads of `ne0`
/// values and its `nv` V values as f32 in shared memory, then the `ne0 / 2` rotation
/// angles of its position. A thread per task (a rotated or copied pair, a pair of V
/// values), in whole warps, 64 to [`ROPE_STORE_THREADS`]: every task in one round up to
/// 512 tasks (SmolLM2's decode step has 480). `None` without K heads, for an odd or zero
/// head size, or when the inputs do not fit the default 48 KiB.
pub fn rope_store(ne0: usize, hq: usize, hk: usize, nv: usize, n: usize) -> Option<LaunchDims> {
    if hk == 0 || ne0 == 0 || ne0 % 2 != 0 || n == 0 {
        return None;
    }
    // The inputs, then the theta table (ne0 / 2 values).
    let values = (hq + hk)
        .checked_mul(ne0)?
        .checked_add(nv)?
        .checked_add(ne0 / 2)?;
    let shared = u32::try_from(values.checked_mul(4)?).ok()?;
    if shared > DEFAULT_MAX_SHARED {
        return None;
    }
    let tasks = (hq + hk) * (ne0 / 2) + nv.div_ceil(2);
    let most = ROPE_STORE_THREADS as usize;
    let threads = u32::try_from(tasks.next_multiple_of(32).clamp(64, most)).ok()?;
    check(LaunchDims {
        grid: (u32::try_from(n).ok()?, 1, 1),
        block: (threads, 1, 1),
        shared,
        programmatic: false,
    })
}

/// `ceil(2^32 / d)` for `d >= 2`, and 0 for `d = 1` (the kernels add `u * (d == 1)`):
/// `u / d = mul.hi(u, magic)` exactly while `u * d < 2^32`.
/// `d` is at least 1 (the callers' launch checks refuse an empty dimension).
pub(crate) fn div_magic(d: u32) -> u32 {
    debug_assert!(d >= 1, "div_magic: division by zero");
    match d {
        0 | 1 => 0,
        // ceil(2^32 / d) < 2^32 for d >= 2
        _ => ((1u64 << 32).div_ceil(u64::from(d))) as u32,
    }
}

/// flash_attn_ext: warps per block so that the per-warp shared state
/// `(Dv*32 + D) * 4` bytes fits the default 48 KiB, at most 4.
pub fn flash_attn(d: usize, dv: usize, heads: usize, n_q: usize, ne3: usize) -> Option<LaunchDims> {
    if d == 0
        || dv == 0
        || d > MAX_HEAD_DIM
        || dv > MAX_HEAD_DIM
        || heads == 0
        || n_q == 0
        || ne3 == 0
    {
        return None;
    }
    let per_warp = (dv * 32 + d) * 4;
    let wpb = (DEFAULT_MAX_SHARED as usize / per_warp).clamp(1, 4);
    check(LaunchDims {
        grid: (
            div_ceil_u32(heads, wpb)?,
            u32::try_from(n_q).ok()?,
            u32::try_from(ne3).ok()?,
        ),
        block: (32, wpb as u32, 1),
        shared: u32::try_from(per_warp * wpb).ok()?,
        programmatic: false,
    })
}

/// KV positions per tile of `flash_attn_mma` (tile `i` holds positions `64i..64i+63`).
pub const FA_MMA_TILE: usize = 64;
/// Query rows (heads of one KV head times queries) one `flash_attn_mma` block computes:
/// 16 per warp, 4 warps.
pub const FA_MMA_ROWS: usize = 64;

/// KV tiles per chunk of `flash_attn_mma` (chunk `c` holds positions
/// `128c..128c+127`); fixed, so that a row's bits do not depend on n_kv. Equal to the
/// generator's `CHUNK_TILES` (`xtask/src/fattn_ptx.rs`).
pub const FA_MMA_CHUNK_TILES: usize = 2;

/// Geometry of one `flash_attn_mma` launch and the scratch its chunk combine needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashAttnMma {
    /// Grid and block (the shared memory is static).
    pub dims: LaunchDims,
    /// KV chunks: `ceil(ceil(n_kv / 64) / FA_MMA_CHUNK_TILES)`, at least 1.
    pub chunks: u32,
    /// Row blocks per KV head: `ceil(n_q * gqa / 64)`.
    pub row_blocks: u32,
    /// Bytes of the (m, l) pairs of the partials (0 with one chunk).
    pub ml_bytes: usize,
    /// Bytes of the partials in all: the pairs, then `D` f32 per (row, chunk).
    pub part_bytes: usize,
    /// u32 counters: one per (row block, KV head, i3); 0 with one chunk.
    pub counters: usize,
}

/// flash_attn_mma for head size `d` (64 or 128), `n_q` queries of `gqa` query heads per
/// KV head, `heads_kv` KV heads: one block of 128 threads per ([`FA_MMA_ROWS`] query
/// rows, KV chunk, KV head, i3). `None` for other head sizes or a grid beyond CUDA's
/// limits; positions and `(rows + 64) * gqa` must fit the kernel's 32 bits.
pub fn flash_attn_mma(
    d: usize,
    gqa: usize,
    heads_kv: usize,
    n_q: usize,
    n_kv: usize,
    ne3: usize,
) -> Option<FlashAttnMma> {
    if !matches!(d, 64 | 128) || gqa == 0 || heads_kv == 0 || n_q == 0 || ne3 == 0 {
        return None;
    }
    u32::try_from(n_kv.checked_add(FA_MMA_TILE)?).ok()?;
    let rows = n_q.checked_mul(gqa)?;
    // The kernel divides row indices (under rows + 64) by gqa with div_magic.
    u32::try_from(rows.checked_add(FA_MMA_ROWS)?.checked_mul(gqa)?).ok()?;
    let chunks = n_kv
        .div_ceil(FA_MMA_TILE)
        .div_ceil(FA_MMA_CHUNK_TILES)
        .max(1);
    let row_blocks = rows.div_ceil(FA_MMA_ROWS);
    // ... and block indices by the chunk count.
    u32::try_from(row_blocks.checked_mul(chunks)?.checked_mul(chunks)?).ok()?;
    let dims = check(LaunchDims {
        grid: (
            u32::try_from(row_blocks.checked_mul(chunks)?).ok()?,
            u32::try_from(heads_kv).ok()?,
            u32::try_from(ne3).ok()?,
        ),
        block: (128, 1, 1),
        shared: 0,
        programmatic: false,
    })?;
    // Partial index ((i3 H_kv + hk) 64 nrb + r) nch + ch in 32 bits, as the kernel has it.
    let slots = heads_kv
        .checked_mul(ne3)?
        .checked_mul(row_blocks * FA_MMA_ROWS)?
        .checked_mul(chunks)?;
    u32::try_from(slots).ok()?;
    let (ml_bytes, part_bytes, counters) = if chunks == 1 {
        (0, 0, 0)
    } else {
        let ml = slots * 8;
        (
            ml,
            ml.checked_add(slots.checked_mul(4 * d)?)?,
            heads_kv * ne3 * row_blocks,
        )
    };
    Some(FlashAttnMma {
        dims,
        chunks: chunks as u32,
        row_blocks: row_blocks as u32,
        ml_bytes,
        part_bytes,
        counters,
    })
}

/// KV positions per tile of `flash_attn_dec` (tile `i` holds positions `128i..128i+127`).
pub const FA_DEC_TILE: usize = 128;
/// Query rows (heads of one KV head times queries) one `flash_attn_dec` block computes at
/// most.
pub const FA_DEC_ROWS: usize = 8;
/// Blocks below which `flash_attn_dec` splits a KV head's query rows over more, smaller
/// groups when asked to (an H100's or H200's multiprocessors). The rows of a group share
/// its tile's K and V loads; apart, each block reads them again from L2, but a decode's
/// handful of blocks otherwise leaves all but a few multiprocessors idle.
pub const FA_DEC_MIN_BLOCKS: usize = 132;
/// Threads of a `flash_attn_dec` block.
pub const FA_DEC_THREADS: u32 = 128;

/// Geometry of one `flash_attn_dec` launch and the scratch it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashAttnDec {
    /// Grid, block and shared memory.
    pub dims: LaunchDims,
    /// KV tiles: `max(1, ceil(n_kv / FA_DEC_TILE))`.
    pub tiles: u32,
    /// Query rows per group (at most [`FA_DEC_ROWS`]).
    pub rows_per_group: u32,
    /// Row groups per KV head: `ceil(gqa * n_q / rows_per_group)`.
    pub groups: u32,
    /// Bytes of the partials: `(Dv + 2) * 4` per (tile, query row, head, i3).
    pub part_bytes: usize,
    /// u32 counters of the last-block combine: one per (KV head, group, i3).
    pub counters: usize,
}

/// flash_attn_dec for `n_q` queries of `heads` query heads over `heads_kv` KV heads: one
/// block of [`FA_DEC_THREADS`] per (KV tile, KV head and group of up to [`FA_DEC_ROWS`]
/// query rows, i3). With `split_rows`, a grid of fewer than [`FA_DEC_MIN_BLOCKS`] blocks
/// takes the largest groups that still give that many, or groups of one row. Any grouping
/// gives the same bits. `None` for head sizes above [`MAX_HEAD_DIM`], heads not a multiple
/// of `heads_kv`, or a grid beyond CUDA's limits.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_dec(
    d: usize,
    dv: usize,
    heads: usize,
    heads_kv: usize,
    n_q: usize,
    n_kv: usize,
    ne3: usize,
    split_rows: bool,
) -> Option<FlashAttnDec> {
    if d == 0
        || dv == 0
        || d > MAX_HEAD_DIM
        || dv > MAX_HEAD_DIM
        || heads_kv == 0
        || heads % heads_kv != 0
        || heads == 0
        || n_q == 0
        || ne3 == 0
    {
        return None;
    }
    let gqa = heads / heads_kv;
    let head_rows = gqa.checked_mul(n_q)?;
    let tiles = n_kv.div_ceil(FA_DEC_TILE).max(1);
    let blocks_of = |rpg: usize| {
        tiles
            .saturating_mul(heads_kv)
            .saturating_mul(ne3)
            .saturating_mul(head_rows.div_ceil(rpg))
    };
    let rpg = match split_rows {
        true => (1..=FA_DEC_ROWS)
            .rev()
            .find(|&r| blocks_of(r) >= FA_DEC_MIN_BLOCKS)
            .unwrap_or(1),
        false => FA_DEC_ROWS,
    };
    let groups = head_rows.div_ceil(rpg);
    let rc = head_rows.min(rpg);
    let shared = 224 + 16 * (rc * d).div_ceil(4) + 4 * rc * (FA_DEC_TILE + 4 * dv);
    let y = heads_kv.checked_mul(groups)?;
    let dims = check(LaunchDims {
        grid: (
            u32::try_from(tiles).ok()?,
            u32::try_from(y).ok()?,
            u32::try_from(ne3).ok()?,
        ),
        block: (FA_DEC_THREADS, 1, 1),
        shared: u32::try_from(shared).ok()?,
        programmatic: false,
    })?;
    let rows = ne3.checked_mul(n_q)?.checked_mul(heads)?;
    let part_bytes = rows.checked_mul(tiles)?.checked_mul((dv + 2) * 4)?;
    // The kernel indexes partials with 32-bit (row, tile) products.
    u32::try_from(rows.checked_mul(tiles)?).ok()?;
    Some(FlashAttnDec {
        dims,
        tiles: tiles as u32,
        rows_per_group: rpg as u32,
        groups: groups as u32,
        part_bytes,
        counters: y * ne3,
    })
}

/// Threads of a `flash_attn_row` block (one per position of a tile).
pub const FA_ROW_THREADS: u32 = 128;

/// Geometry of one `flash_attn_row` launch and the scratch it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashAttnRow {
    /// Grid, block and shared memory (static: none at launch).
    pub dims: LaunchDims,
    /// KV tiles: `max(1, ceil(n_kv / FA_DEC_TILE))`.
    pub tiles: u32,
    /// Bytes of the partials' (m, s) pairs, 8 per (tile, row); 0 with one tile.
    pub ms_bytes: usize,
    /// Bytes of all the partials: the pairs, then `d * 4` per (tile, row) of a values.
    pub part_bytes: usize,
    /// u32 counters of the last-block combine, one per output row; 0 with one tile.
    pub counters: usize,
}

/// flash_attn_row for `n_q` queries of `heads` query heads, head size `d` (= Dv): one
/// block of [`FA_ROW_THREADS`] per (KV tile, head, query and i3). `None` for a head size
/// without an entry (64, 128, 256), no queries, or a grid beyond CUDA's limits.
pub fn flash_attn_row(
    d: usize,
    heads: usize,
    n_q: usize,
    n_kv: usize,
    ne3: usize,
) -> Option<FlashAttnRow> {
    if !matches!(d, 64 | 128 | 256) || heads == 0 || n_q == 0 || ne3 == 0 {
        return None;
    }
    let tiles = n_kv.div_ceil(FA_DEC_TILE).max(1);
    let dims = check(LaunchDims {
        grid: (
            u32::try_from(tiles).ok()?,
            u32::try_from(heads).ok()?,
            u32::try_from(n_q.checked_mul(ne3)?).ok()?,
        ),
        block: (FA_ROW_THREADS, 1, 1),
        shared: 0,
        programmatic: false,
    })?;
    let rows = ne3.checked_mul(n_q)?.checked_mul(heads)?;
    // The kernel indexes rows, partials and their a values with 32-bit products.
    u32::try_from(rows.checked_mul(tiles)?.checked_mul(d)?).ok()?;
    let (ms_bytes, part_bytes, counters) = match tiles {
        1 => (0, 0, 0),
        _ => {
            let ms = rows * tiles * 8;
            (ms, ms + rows * tiles * d * 4, rows)
        }
    };
    Some(FlashAttnRow {
        dims,
        tiles: tiles as u32,
        ms_bytes,
        part_bytes,
        counters,
    })
}

/// The type an argument was packed as, checked against the kernel's `.param` list on
/// cuda-sim (a mismatch there is a launch error, not a wrong result on a GPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgKind {
    /// A 64-bit integer or device pointer (`.u64` / `.s64` / `.b64`).
    U64,
    /// A 32-bit integer (`.u32` / `.s32` / `.b32`).
    U32,
    /// A 32-bit float (`.f32`).
    F32,
}

impl ArgKind {
    /// Size of the parameter in bytes.
    pub fn size(self) -> usize {
        match self {
            ArgKind::U64 => 8,
            ArgKind::U32 | ArgKind::F32 => 4,
        }
    }
}

/// Kernel arguments kept on the stack: each value sits in its own 8-byte slot (u32 and
/// f32 in the low 4 bytes, which is what the driver reads on little-endian hosts), and
/// the pointer array handed to `cuLaunchKernel` is built at launch time.
#[derive(Clone)]
pub struct Args {
    slots: [u64; Args::MAX],
    kinds: [ArgKind; Args::MAX],
    len: usize,
}

impl Default for Args {
    fn default() -> Self {
        Self::new()
    }
}

impl Args {
    /// Most arguments of any kernel.
    pub const MAX: usize = 96;

    /// An empty list.
    pub fn new() -> Args {
        Args {
            slots: [0; Args::MAX],
            kinds: [ArgKind::U64; Args::MAX],
            len: 0,
        }
    }

    /// Number of arguments pushed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no argument was pushed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn push(&mut self, v: u64, kind: ArgKind) -> &mut Args {
        assert!(self.len < Args::MAX, "kernel argument list overflow");
        self.slots[self.len] = v;
        self.kinds[self.len] = kind;
        self.len += 1;
        self
    }

    /// A 64-bit value (device pointer, byte stride).
    pub fn u64(&mut self, v: u64) -> &mut Args {
        self.push(v, ArgKind::U64)
    }

    /// A byte stride or size as u64.
    pub fn usize(&mut self, v: usize) -> &mut Args {
        self.push(v as u64, ArgKind::U64)
    }

    /// A 32-bit unsigned value.
    pub fn u32(&mut self, v: u32) -> &mut Args {
        self.push(v as u64, ArgKind::U32)
    }

    /// An f32 value.
    pub fn f32(&mut self, v: f32) -> &mut Args {
        self.push(v.to_bits() as u64, ArgKind::F32)
    }

    /// The slot values.
    pub fn slots(&self) -> &[u64] {
        &self.slots[..self.len]
    }

    /// The type each slot was packed as.
    pub fn kinds(&self) -> &[ArgKind] {
        &self.kinds[..self.len]
    }

    /// Fills `ptrs` with pointers to the slots and returns the used prefix. `self` must
    /// not move or change while the pointers are in use.
    pub fn pointers<'a>(
        &'a mut self,
        ptrs: &'a mut [*mut c_void; Args::MAX],
    ) -> &'a mut [*mut c_void] {
        for (p, s) in ptrs.iter_mut().zip(self.slots.iter_mut()) {
            *p = s as *mut u64 as *mut c_void;
        }
        &mut ptrs[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elementwise_covers_every_element() {
        let d = elementwise(1000).unwrap();
        assert_eq!(d.grid, (4, 1, 1));
        assert!(d.grid.0 * d.block.0 >= 1000);
        assert!(elementwise(0).is_none());
        assert!(elementwise(1usize << 33).is_none());
    }

    #[test]
    fn mul_mat_classes_and_grids() {
        assert_eq!(mul_mat_class(1), MulMatClass::Mmvq);
        assert_eq!(mul_mat_class(7), MulMatClass::Mmvq);
        assert_eq!(mul_mat_class(8), MulMatClass::Mmq);
        let v = mul_mat(Some(MulMatClass::Mmvq), 576, 3, 1).unwrap();
        assert_eq!(v.grid, (144, 3, 1));
        let q = mul_mat(Some(MulMatClass::Mmq), 49152, 17, 2).unwrap();
        assert_eq!(q.grid, (12288, 3, 2));
        assert_eq!(q.block, (32, 4, 1));
        assert!(mul_mat(None, 4, 70_000, 1).is_none());
        assert!(mul_mat(Some(MulMatClass::Mmq), 4, 70_000, 1).is_some());
    }

    #[test]
    fn qmm_rows_per_block() {
        // Small matrices: 8 rows per block (the most blocks); a gate + up run of 2 x 1536
        // rows: 16 (192 blocks, one per SM at least); the output matrix: 32 (8 lanes per
        // output of 256 threads), 64 with one lane (a MUL_MAT_ID of 8 tokens or more).
        let l8 = QMM_DECODE_LANES;
        assert_eq!(qmm_lanes(1), l8);
        assert_eq!(qmm_lanes(7), l8);
        assert_eq!(qmm_lanes(8), 1);
        assert_eq!(qmm_rows(1, l8, 192, 18), Some(8));
        assert_eq!(qmm_rows(1, l8, 1536, 18), Some(8));
        assert_eq!(qmm_rows(1, l8, 960, 18), Some(8));
        assert_eq!(qmm_rows(1, l8, 3072, 18), Some(16));
        assert_eq!(qmm_rows(1, l8, 49152, 18), Some(32));
        assert_eq!(qmm_rows(1, 1, 49152, 18), Some(64));
        assert_eq!(qmm_rows(1, l8, 576, 48), Some(8));
        // The tiled class: 32 rows (its shared memory opts in past 48 KiB); 7 columns: 8
        // rows (8 lanes per output), one lane: at most 16 (48 KiB), 8 with 64-chunk tiles.
        assert_eq!(qmm_rows(8, 1, 1 << 20, 18), Some(32));
        assert!(qmm_shared(32, 8, QMM_TILE) <= QMM_MAX_SHARED);
        assert_eq!(qmm_rows(7, l8, 1 << 20, 18), Some(8));
        assert_eq!(qmm_rows(7, 1, 1 << 20, 18), Some(16));
        assert_eq!(qmm_rows(7, 1, 1 << 20, 48), Some(8));
        assert_eq!(qmm_rows(0, l8, 10, 18), None);
        assert_eq!(qmm_rows(9, 1, 10, 18), None);
        for nt in 1..=7 {
            for nchunks in [18, 48, 200] {
                let r = qmm_rows(nt, l8, 1 << 20, nchunks).unwrap();
                let tc = qmm_tile(nt, nchunks);
                assert!(r == 8 || r * nt * l8 <= QMM_MAX_THREADS);
                assert!(qmm_threads(r, nt, l8, nchunks) <= QMM_MAX_THREADS_DECODE);
                assert!(qmm_shared(r, nt, tc) <= DEFAULT_MAX_SHARED as usize);
            }
        }
        assert_eq!(qmm_columns(7), 7);
        assert_eq!(qmm_columns(8), 8);
        // One thread per (row, chunk) of a tile: K = 576 (18 chunks) at 8 rows.
        let d = qmm(72, 1, 1, 8, 1, l8, 18).unwrap();
        assert_eq!((d.grid, d.block, d.shared), ((72, 1, 1), (160, 1, 1), 6944));
        assert_eq!(qmm_threads(64, 1, 1, 18), 256);
        assert_eq!(qmm_threads(32, 1, l8, 18), 256);
        // SmolLM2's gate + up at 16 rows a block: 288 tasks, one round.
        assert_eq!(qmm_threads(16, 1, l8, 18), 288);
        assert_eq!(qmm_threads(16, 8, 1, 18), 256);
        assert_eq!(qmm_threads(32, 8, 1, 1), 256);
        // 7 columns of 8 rows: 8 lanes for each of the 56 outputs.
        assert_eq!(qmm_threads(8, 7, l8, 1), 448);
        assert!(qmm(1, 70_000, 1, 8, 1, l8, 18).is_none());
    }

    #[test]
    fn flash_attn_row_grids() {
        // A SmolLM2 decode at 65 positions: one tile, 9 heads, no partials.
        let g = flash_attn_row(64, 9, 1, 65, 1).unwrap();
        assert_eq!((g.dims.grid, g.dims.block), ((1, 9, 1), (128, 1, 1)));
        assert_eq!((g.tiles, g.part_bytes, g.counters), (1, 0, 0));
        // 3 queries over 2 i3 at 300 positions: 3 tiles, partials per (tile, row).
        let g = flash_attn_row(128, 4, 3, 300, 2).unwrap();
        assert_eq!(g.dims.grid, (3, 4, 6));
        assert_eq!((g.ms_bytes, g.counters), (24 * 3 * 8, 24));
        assert_eq!(g.part_bytes, 24 * 3 * 8 + 24 * 3 * 128 * 4);
        assert!(flash_attn_row(80, 4, 1, 10, 1).is_none());
        assert!(flash_attn_row(64, 0, 1, 10, 1).is_none());
        assert!(flash_attn_row(64, 70_000, 1, 10, 1).is_none());
    }

    #[test]
    fn qmm_takes_k_in_one_64_chunk_tile_below_8_columns() {
        assert_eq!(qmm_tile(1, 18), QMM_TILE);
        assert_eq!(qmm_tile(1, 33), QMM_TILE_DECODE);
        assert_eq!(qmm_tile(7, 48), QMM_TILE_DECODE);
        assert_eq!(qmm_tile(8, 48), QMM_TILE);
        // K = 1536 at 8 rows: one tile, a thread per (row, chunk).
        let d = qmm(72, 1, 1, 8, 1, QMM_DECODE_LANES, 48).unwrap();
        assert_eq!((d.block, d.shared), ((384, 1, 1), 3072 + 8320 + 2176 + 32));
        assert_eq!(qmm_threads(8, 1, QMM_DECODE_LANES, 64), 512);
        assert_eq!(qmm_threads(8, 1, QMM_DECODE_LANES, 200), 512);
        assert_eq!(qmm_threads(64, 1, 1, 200), 512);
        // The layout: A, then W, then S, then the norm scales.
        assert_eq!(
            qmm_layout(8, 1, 64),
            [3072, 3072 + 8320, 3072 + 8320 + 2176, 13600]
        );
        assert_eq!(
            qmm_layout(8, 1, 32),
            [1536, 1536 + 4224, 1536 + 4224 + 1152, 6944]
        );
    }

    #[test]
    fn flash_attn_fits_shared_memory() {
        for (d, want_w) in [(64, 4), (128, 2), (256, 1)] {
            let l = flash_attn(d, d, 9, 7, 1).unwrap();
            assert_eq!(l.block, (32, want_w, 1));
            assert!(l.shared <= DEFAULT_MAX_SHARED);
            assert!(l.grid.0 * want_w >= 9);
        }
        assert!(flash_attn(512, 512, 1, 1, 1).is_none());
    }

    #[test]
    fn flash_attn_mma_grids() {
        // SmolLM2's pp512: 1536 rows of each of 3 KV heads, 4 chunks of 128 positions.
        let l = flash_attn_mma(64, 3, 3, 512, 512, 1).unwrap();
        assert_eq!(
            (l.dims.grid, l.dims.block, l.dims.shared),
            ((96, 3, 1), (128, 1, 1), 0)
        );
        assert_eq!((l.chunks, l.row_blocks, l.counters), (4, 24, 72));
        assert_eq!(l.ml_bytes, 3 * 1536 * 4 * 8);
        assert_eq!(l.part_bytes, l.ml_bytes + 3 * 1536 * 4 * 64 * 4);
        // One chunk: no partials, no counters.
        let one = flash_attn_mma(128, 1, 2, 65, 100, 2).unwrap();
        assert_eq!(
            (one.dims.grid, one.chunks, one.part_bytes, one.counters),
            ((2, 2, 2), 1, 0, 0)
        );
        assert_eq!(flash_attn_mma(64, 1, 1, 8, 0, 1).unwrap().chunks, 1);
        for bad in [(256, 1, 1, 8), (64, 0, 1, 8), (64, 1, 0, 8), (64, 1, 1, 0)] {
            assert!(flash_attn_mma(bad.0, bad.1, bad.2, bad.3, 64, 1).is_none());
        }
        assert!(flash_attn_mma(64, 1, 1, 8, u32::MAX as usize, 1).is_none());
    }

    #[test]
    fn flash_attn_dec_grids() {
        // SmolLM2: 9 heads over 3 KV heads, one token, n_kv 256: 2 tiles x 3 heads.
        let s = flash_attn_dec(64, 64, 9, 3, 1, 256, 1, false).unwrap();
        assert_eq!((s.dims.grid, s.dims.block), ((2, 3, 1), (128, 1, 1)));
        assert_eq!((s.tiles, s.groups, s.counters), (2, 1, 3));
        assert_eq!(s.part_bytes, 9 * 2 * 66 * 4);
        assert_eq!(s.dims.shared, 224 + 4 * 3 * (64 + 128 + 256));
        // q rows padded to 16 bytes: 3 rows of 18.
        let odd = flash_attn_dec(18, 18, 3, 1, 1, 16, 1, false).unwrap();
        assert_eq!(odd.dims.shared, 224 + 16 * 14 + 4 * 3 * (128 + 72));
        // Gemma 3 at 7 queries: 28 rows of the one KV head in 4 groups of 8.
        let g = flash_attn_dec(256, 256, 4, 1, 7, 4096, 2, false).unwrap();
        assert_eq!((g.dims.grid, g.groups, g.counters), ((32, 4, 2), 4, 8));
        assert!(g.dims.shared <= DEFAULT_MAX_SHARED, "{}", g.dims.shared);
        // No KV at all still runs one (empty) tile.
        assert_eq!(
            flash_attn_dec(64, 64, 9, 3, 1, 0, 1, false).unwrap().tiles,
            1
        );
        assert!(flash_attn_dec(512, 64, 1, 1, 1, 16, 1, false).is_none());
        assert!(flash_attn_dec(64, 64, 9, 2, 1, 16, 1, false).is_none());
    }

    #[test]
    fn flash_attn_dec_splits_rows_of_small_grids() {
        // SmolLM2's decode: 3 rows per KV head, one tile: 9 blocks of one row.
        let s = flash_attn_dec(64, 64, 9, 3, 1, 100, 1, true).unwrap();
        assert_eq!((s.dims.grid, s.rows_per_group, s.groups), ((1, 9, 1), 1, 3));
        assert_eq!(s.counters, 9);
        assert_eq!(s.dims.shared, 224 + 16 * 16 + 4 * (128 + 256));
        // Partials do not depend on the grouping.
        let whole = flash_attn_dec(64, 64, 9, 3, 1, 100, 1, false).unwrap();
        assert_eq!((whole.rows_per_group, whole.groups), (8, 1));
        assert_eq!(s.part_bytes, whole.part_bytes);
        // Gemma 3, 7 queries at n_kv 4096 (32 tiles): 28 rows in groups of 8 or 7 make 4
        // groups, 128 blocks, short of 132; groups of 6 make 5, 160 blocks.
        let g = flash_attn_dec(256, 256, 4, 1, 7, 4096, 1, true).unwrap();
        assert_eq!(
            (g.rows_per_group, g.groups, g.dims.grid),
            (6, 5, (32, 5, 1))
        );
        // A grid already wide enough keeps groups of 8.
        let wide = flash_attn_dec(64, 64, 9, 3, 4, 128 * 64, 1, true).unwrap();
        assert_eq!((wide.rows_per_group, wide.groups), (8, 2));
    }

    /// `mul.hi(u, div_magic(d)) + u * (d == 1)` is `u / d` wherever `u * d < 2^32`.
    #[test]
    fn div_magic_divides_exactly_in_its_range() {
        for d in [1u32, 2, 3, 7, 32, 64, 96, 128, 1000, 4096, 65535] {
            let m = u64::from(div_magic(d));
            let limit = (1u64 << 32) / u64::from(d);
            let probes = (0..2000u64).chain((limit.saturating_sub(2000))..limit);
            for u in probes {
                let q = ((u * m) >> 32) + u * u64::from(d == 1);
                assert_eq!(q, u / u64::from(d), "{u} / {d}");
            }
        }
    }

    /// flash_attn_dec divides u < 2^16 by every divisor up to 512 (gqa, head sizes, row
    /// groups, V thread groups) with `mul.hi(u, div_magic(x))`, or takes u for x = 1.
    #[test]
    fn div_magic_divides_every_small_divisor_below_2_16() {
        assert_eq!(div_magic(1), 0);
        for x in 2u32..=512 {
            let m = div_magic(x) as u64;
            let top = (u32::MAX / x).min(u16::MAX as u32);
            for u in (0..=top).step_by(7).chain([top, x - 1, x, x + 1]) {
                let q = ((u as u64 * m) >> 32) as u32;
                assert_eq!(q, u / x, "{u} / {x}");
            }
        }
    }

    #[test]
    fn other_kernels() {
        assert_eq!(quantize_q8_1(576, 5, 1).unwrap().grid, (3, 5, 1));
        assert!(quantize_q8_1(100, 5, 1).is_none());
        assert_eq!(get_rows(true, 576, 4, 1).unwrap().grid, (1, 4, 1));
        assert_eq!(get_rows(false, 576, 4, 1).unwrap().grid, (3, 4, 1));
        assert_eq!(rope([64, 9, 7, 1]).unwrap().block, (32, 1, 1));
        assert_eq!(rope([256, 2, 3, 1]).unwrap().block, (128, 1, 1));
        // SmolLM2: 12 heads of 32 pairs and 96 V pairs, one task each.
        let rs = rope_store(64, 9, 3, 192, 1).unwrap();
        assert_eq!((rs.grid, rs.block), ((1, 1, 1), (480, 1, 1)));
        assert_eq!(rope_store(2, 0, 1, 0, 1).unwrap().block, (64, 1, 1));
        assert_eq!(rope_store(256, 8, 4, 1024, 2).unwrap().block, (512, 1, 1));
        assert_eq!(rs.shared, 4 * (12 * 64 + 192 + 32));
        assert_eq!(rope_store(256, 0, 1, 256, 7).unwrap().grid, (7, 1, 1));
        assert!(rope_store(64, 9, 0, 0, 1).is_none());
        assert!(rope_store(128, 64, 32, 4096, 1).is_none(), "past 48 KiB");
        assert_eq!(warp_per_row(9).unwrap().grid, (3, 1, 1));
    }

    #[test]
    fn moe_kernels() {
        let d = mul_mat_id(1536, 2, 7).unwrap();
        assert_eq!((d.grid, d.block), ((384, 2, 7), (32, 4, 1)));
        assert!(mul_mat_id(4, 2, 70_000).is_none());
        assert!(mul_mat_id(0, 2, 1).is_none());
        assert_eq!(sum_rows(257).unwrap().grid, (2, 1, 1));
        assert_eq!(argmax(3).unwrap().grid, (3, 1, 1));
        assert_eq!(argmax(3).unwrap().block, (ARGMAX_BLOCK, 1, 1));
        assert!(argmax(0).is_none());
        let a = argsort_top_k(4, 9).unwrap();
        assert_eq!((a.grid, a.block, a.shared), ((9, 1, 1), (32, 1, 1), 32));
        let a = argsort_top_k(ARGSORT_MAX_N, 1).unwrap();
        assert_eq!(a.block, (256, 1, 1));
        assert!(a.shared <= DEFAULT_MAX_SHARED);
        assert!(argsort_top_k(ARGSORT_MAX_N + 1, 1).is_none());
        assert_eq!(argsort_top_k(100, 1).unwrap().block, (128, 1, 1));
    }

    #[test]
    fn args_live_in_slots() {
        let mut a = Args::new();
        a.u64(0xdead_beef_0000).u32(7).f32(1.5).usize(3);
        assert_eq!(
            a.slots(),
            &[0xdead_beef_0000, 7, 1.5f32.to_bits() as u64, 3]
        );
        assert_eq!(
            a.kinds(),
            &[ArgKind::U64, ArgKind::U32, ArgKind::F32, ArgKind::U64]
        );
        let mut ptrs = [core::ptr::null_mut(); Args::MAX];
        let n = a.pointers(&mut ptrs).len();
        assert_eq!(n, 4);
        // SAFETY: the pointers point into `a.slots`, alive and unmodified here.
        let second = unsafe { *(ptrs[1] as *const u32) };
        assert_eq!(second, 7);
    }
}
