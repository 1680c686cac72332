//! Which of the backend's speed features are on: CUDA graphs, kernel fusions, and which
//! generation of the product and attention kernels runs.
//!
//! Every switch exists so that one run on a GPU can show the effect of each step, old and
//! new side by side. None changes what a graph means: a fused launch computes every node
//! it replaces, bit for bit as the unfused kernels of the same generation do. The kernel
//! generations (`legacy_*`) and the decode class's product order (`decode_lanes`) may
//! differ in reduction order (DESIGN.md, invariant 2's kernel classes), so results are
//! bit-identical only within one setting of those.
//!
//! Parsed from a comma-separated list (`--cuda-tuning` of `ggml-harness`):
//!
//! | item | effect |
//! |---|---|
//! | `default` | everything on, current kernels (what [`CudaTuning::default`] gives) |
//! | `no-graphs` | launch every kernel from the host, never replay a captured graph (a prompt's splits never are, with or without it) |
//! | `no-pdl` | no programmatic dependent launch: every kernel starts when the one before it has ended (it is only used on sm_90 and newer) |
//! | `no-fuse` | every fusion off |
//! | `no-fuse-norm`, `no-fuse-qkv`, `no-fuse-rope-store`, `no-fuse-qkv-rope`, `no-fuse-glu`, `no-fuse-add` | one fusion off |
//! | `no-qgemm` | 2-D products of 8 columns or more on `qmm`'s 8-column tiles instead of `qgemm`'s 32 x 32 register tiles (same bits) |
//! | `legacy-products` | the first quantised product kernels (`mmvq`/`mmq`/`mmvq_id` with a separate `quantize_q8_1`); fusions of products need the current ones and are off with it |
//! | `legacy-decode-attn` | the first flash-attention kernel (`flash_attn_ext`) for decode-sized batches (fewer than 8 queries) |
//! | `legacy-prompt-attn` | the first flash-attention kernel for prompt batches (8 queries or more) |
//! | `no-attn-row-split` | `flash_attn_dec` keeps up to 8 query rows per block however few blocks that gives (a decode of SmolLM2: 3 instead of 9; same bits) |
//! | `no-decode-lanes` | the decode class's quantised products in one chain per output on one thread, as the tiled class (not the decode class's bits: its 8 partials per output are another order) |
//! | `no-row-attn` | decode batches on `flash_attn_dec` instead of `flash_attn_row` (one query row a block, f16 K/V of head size 64, 128 or 256; same bits) |
//! | `no-mma-attn` | prompt batches on the tiled FMA kernel (`flash_attn_dec`, the bits of a decode) instead of `flash_attn_mma` on f16 tensor cores |
//! | `no-specialize` | decode-class `qmm` launches on the one generic entry instead of an entry compiled for their dtype and fused form (same bits; the generic entry branches at run time over every dtype and form) |
//! | `specialize-dtype` | those variants bind the dtype alone: one entry for every fused form of a dtype (same bits; not yet measured on a GPU, the kit benches it) |
//! | `q8-window` | `qmm` loads each Q8_0 block through three 16-byte loads of the 48 aligned bytes around it instead of nine or ten narrow ones (same bits; off by default until a GPU has measured it) |
//! | `legacy` | the backend as first measured: all of the above off or legacy |

use std::fmt;
use std::str::FromStr;

/// The speed features of a [`CudaBackend`](crate::CudaBackend), set with
/// [`CudaBackend::set_tuning`](crate::CudaBackend::set_tuning).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaTuning {
    /// Capture a split's kernels into a CUDA graph once the same split (same nodes,
    /// shapes and addresses) comes again, and replay it with one launch after that.
    pub graphs: bool,
    /// Programmatic dependent launch (sm_90 and newer): the kernels that wait for the
    /// grid before them with `griddepcontrol.wait` (`qmm`, the attention kernels) are launched
    /// with programmatic stream serialisation, so that their launch and their work up to
    /// the wait (parameters, addresses, weight prefetches) overlap the kernel before
    /// them. Same bits: the wait comes before any global memory access.
    pub pdl: bool,
    /// RMS norm × weight computed in the prologue of the products that read it (decode
    /// batches), or with its Q8_1 quantisation for them in one kernel (prompt batches).
    pub fuse_norm: bool,
    /// Products that share one activation (Q, K and V) in one launch.
    pub fuse_qkv: bool,
    /// RoPE of Q and K with the stores of K and V into the KV cache, in one launch.
    pub fuse_rope_store: bool,
    /// That RoPE + KV store in the epilogue of the Q, K and V products it reads (needs
    /// `fuse_rope_store` and the current products).
    pub fuse_qkv_rope: bool,
    /// Gate and up products with the gated activation (SwiGLU, GeGLU), in one launch
    /// (decode batches); a SwiGLU with its Q8_1 quantisation for the products that read it,
    /// in one kernel (prompt batches).
    pub fuse_glu: bool,
    /// A residual add in the epilogue of the product that feeds it (`qmm` for decode
    /// batches, `qgemm` for prompt batches).
    pub fuse_add: bool,
    /// 2-D quantised products of the tiled class (8 columns or more) on `qgemm`, a
    /// register-tiled GEMM with `qmm`'s per-output arithmetic (same bits), instead of
    /// `qmm`'s 8-column tiles.
    pub qgemm: bool,
    /// Run the first generation of quantised product kernels.
    pub legacy_products: bool,
    /// Run the first flash-attention kernel (`flash_attn_ext`, one warp per query row)
    /// for decode-sized batches (fewer than 8 queries) instead of the tiled one.
    pub legacy_decode_attn: bool,
    /// Run the first flash-attention kernel for prompt batches (8 queries or more)
    /// instead of the tiled one.
    pub legacy_prompt_attn: bool,
    /// `flash_attn_dec` splits each KV head's query rows over groups of fewer rows when its
    /// grid would have fewer blocks than an H100 or H200 has multiprocessors (a decode: 3
    /// blocks for SmolLM2, 9 with one row each). Same bits: every row's arithmetic is its
    /// own; each block reads its tile's K and V again.
    pub attn_row_split: bool,
    /// Quantised products of the decode class (fewer than 8 tokens) feed chunk `j` of K
    /// to partial `j mod 8`, 8 lanes per output, combined by a butterfly; off, they chain
    /// every chunk in one sequence on one thread per output, as the tiled class does
    /// (another order: the decode class's bits change with it).
    pub decode_lanes: bool,
    /// Decode batches (fewer than 8 queries) with f16 K/V of head size 64, 128 or 256, no
    /// soft-capping and no ALiBi on `flash_attn_row`: one block per KV tile and query
    /// row, every chain unrolled, `flash_attn_dec`'s arithmetic (same bits) without its
    /// row groups and branches. Off, they run on `flash_attn_dec`.
    pub row_attn: bool,
    /// Prompt batches (8 queries or more) with f16 K/V of head size 64 or 128 on
    /// `flash_attn_mma` (f16 tensor cores; another kernel class: not the bits of a
    /// decode) instead of the tiled FMA kernel. `legacy_prompt_attn` wins over it.
    pub mma_attn: bool,
    /// `qmm` loads each Q8_0 weight block (34 bytes, 2-byte aligned) through three
    /// 16-byte loads of the 48 aligned bytes around it, where those lie inside the
    /// matrix, instead of nine or ten 2- and 4-byte loads: about a third of the sectors
    /// per warp load (cuda-sim's count for SmolLM2's output head: 8.90 M -> 3.15 M).
    /// Same bits. Off by default: the cost model prices each block's distinct sectors
    /// (an ideal L1), which this does not change, so only a GPU can say whether it helps.
    pub q8_window: bool,
    /// Decode-class `qmm` launches (fewer than 8 tokens) whose matrices share one dtype
    /// run an entry of their own: the generic entry with the dtype and the fused form
    /// bound to constants (compiled on first use, `qmm_variant.rs`), so that ptxas
    /// drops every other dtype's and form's code (SmolLM2's Q-K-V kernel: 5824 SASS
    /// instructions to 2120, 84 registers to 56). Same bits. Run 6c's Nsight Compute
    /// samples put 32-46 % of the decode products' stalls on instruction fetch and
    /// constant-cache misses; off, they run on the generic entry.
    pub specialize: bool,
    /// The variants bind the fused form too (one entry per dtype and form, the fewest
    /// instructions each); off, the dtype alone (one entry per dtype for all its forms:
    /// SmolLM2's four decode products share one entry of 2264 instructions, which stays
    /// in the instruction caches from one launch to the next).
    pub specialize_form: bool,
}

impl Default for CudaTuning {
    fn default() -> CudaTuning {
        CudaTuning {
            graphs: true,
            pdl: true,
            fuse_norm: true,
            fuse_qkv: true,
            fuse_rope_store: true,
            fuse_qkv_rope: true,
            fuse_glu: true,
            fuse_add: true,
            qgemm: true,
            legacy_products: false,
            legacy_decode_attn: false,
            legacy_prompt_attn: false,
            attn_row_split: true,
            decode_lanes: true,
            row_attn: true,
            mma_attn: true,
            q8_window: false,
            specialize: true,
            specialize_form: true,
        }
    }
}

/// What a list item does to the tuning it is applied to.
type Switch = fn(&mut CudaTuning);

/// The list items and what each sets, in the order [`CudaTuning`]'s `Display` writes them.
const SWITCHES: &[(&str, Switch)] = &[
    ("no-graphs", |t| t.graphs = false),
    ("no-pdl", |t| t.pdl = false),
    ("no-fuse-norm", |t| t.fuse_norm = false),
    ("no-fuse-qkv", |t| t.fuse_qkv = false),
    ("no-fuse-rope-store", |t| t.fuse_rope_store = false),
    ("no-fuse-qkv-rope", |t| t.fuse_qkv_rope = false),
    ("no-fuse-glu", |t| t.fuse_glu = false),
    ("no-fuse-add", |t| t.fuse_add = false),
    ("no-qgemm", |t| t.qgemm = false),
    ("legacy-products", |t| t.legacy_products = true),
    ("legacy-decode-attn", |t| t.legacy_decode_attn = true),
    ("legacy-prompt-attn", |t| t.legacy_prompt_attn = true),
    ("no-attn-row-split", |t| t.attn_row_split = false),
    ("no-decode-lanes", |t| t.decode_lanes = false),
    ("no-row-attn", |t| t.row_attn = false),
    ("no-mma-attn", |t| t.mma_attn = false),
    ("q8-window", |t| t.q8_window = true),
    ("no-specialize", |t| t.specialize = false),
    ("specialize-dtype", |t| t.specialize_form = false),
];

impl CudaTuning {
    /// The backend as first measured on a GPU: no graphs, no fusions, first kernels.
    pub fn legacy() -> CudaTuning {
        CudaTuning {
            graphs: false,
            pdl: false,
            fuse_norm: false,
            fuse_qkv: false,
            fuse_rope_store: false,
            fuse_qkv_rope: false,
            fuse_glu: false,
            fuse_add: false,
            qgemm: false,
            legacy_products: true,
            legacy_decode_attn: true,
            legacy_prompt_attn: true,
            attn_row_split: false,
            decode_lanes: false,
            row_attn: false,
            mma_attn: false,
            q8_window: false,
            specialize: false,
            specialize_form: true,
        }
    }

    /// Every fusion off, the rest unchanged.
    pub fn without_fusions(self) -> CudaTuning {
        CudaTuning {
            fuse_norm: false,
            fuse_qkv: false,
            fuse_rope_store: false,
            fuse_qkv_rope: false,
            fuse_glu: false,
            fuse_add: false,
            ..self
        }
    }

    /// Whether any fusion is on (and can run: product fusions need the current products).
    pub fn any_fusion(&self) -> bool {
        self.fuse_rope_store
            || (!self.legacy_products
                && (self.fuse_norm
                    || self.fuse_qkv
                    || self.fuse_qkv_rope
                    || self.fuse_glu
                    || self.fuse_add))
    }

    /// The accepted list items, for error messages and help texts.
    pub fn items() -> String {
        let mut v = vec!["default", "no-fuse", "legacy"];
        v.extend(SWITCHES.iter().map(|(n, _)| *n));
        v.join(", ")
    }
}

/// A `--cuda-tuning` list that names an unknown item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TuningParseError(pub String);

impl fmt::Display for TuningParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown CUDA tuning item '{}'; expected a comma-separated list of {}",
            self.0,
            CudaTuning::items()
        )
    }
}

impl std::error::Error for TuningParseError {}

impl FromStr for CudaTuning {
    type Err = TuningParseError;

    /// Applies the items left to right to [`CudaTuning::default`].
    fn from_str(s: &str) -> Result<CudaTuning, TuningParseError> {
        let mut t = CudaTuning::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            match item {
                "default" => t = CudaTuning::default(),
                "no-fuse" => t = t.without_fusions(),
                "legacy" => t = CudaTuning::legacy(),
                _ => match SWITCHES.iter().find(|(n, _)| *n == item) {
                    Some((_, set)) => set(&mut t),
                    None => return Err(TuningParseError(item.to_string())),
                },
            }
        }
        Ok(t)
    }
}

impl fmt::Display for CudaTuning {
    /// The shortest list that [`FromStr`] turns back into `self` (`default` when nothing
    /// differs from the default).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut items = Vec::new();
        for (name, set) in SWITCHES {
            let mut probe = *self;
            set(&mut probe);
            // An item is part of the list when applying it changes nothing: it is set.
            let mut default = CudaTuning::default();
            set(&mut default);
            if probe == *self && default != CudaTuning::default() {
                items.push(*name);
            }
        }
        if items.is_empty() {
            f.write_str("default")
        } else {
            f.write_str(&items.join(","))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_items_left_to_right() {
        assert_eq!("".parse::<CudaTuning>().unwrap(), CudaTuning::default());
        assert_eq!(
            "default".parse::<CudaTuning>().unwrap(),
            CudaTuning::default()
        );
        let t: CudaTuning = "no-graphs, no-fuse-glu".parse().unwrap();
        assert!(!t.graphs && !t.fuse_glu && t.fuse_norm && !t.legacy_products);
        assert_eq!(
            "legacy".parse::<CudaTuning>().unwrap(),
            CudaTuning::legacy()
        );
        let t: CudaTuning = "legacy,default,no-fuse".parse().unwrap();
        assert_eq!(t, CudaTuning::default().without_fusions());
        let e = "no-graph".parse::<CudaTuning>().unwrap_err();
        assert!(e.to_string().contains("'no-graph'") && e.to_string().contains("no-graphs"));
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "default",
            "no-graphs",
            "no-fuse-norm,no-fuse-add",
            "legacy-products",
            "legacy-prompt-attn,legacy-decode-attn",
            "legacy",
            "no-fuse",
            "no-decode-lanes,no-attn-row-split",
            "no-row-attn,no-mma-attn",
            "no-specialize,q8-window",
            "specialize-dtype",
        ] {
            let t: CudaTuning = s.parse().unwrap();
            let back: CudaTuning = t.to_string().parse().unwrap();
            assert_eq!(back, t, "{s} -> {t}");
        }
        assert_eq!(CudaTuning::default().to_string(), "default");
        assert_eq!(
            "no-graphs,legacy-decode-attn"
                .parse::<CudaTuning>()
                .unwrap()
                .to_string(),
            "no-graphs,legacy-decode-attn"
        );
    }

    #[test]
    fn product_fusions_need_current_products() {
        let t = CudaTuning {
            fuse_rope_store: false,
            legacy_products: true,
            ..CudaTuning::default()
        };
        assert!(!t.any_fusion());
        assert!(CudaTuning::default().any_fusion());
        assert!(!CudaTuning::legacy().any_fusion());
    }
}
