//! The hand-written PTX modules, embedded in the binary and JIT-compiled by the driver
//! once per device context.

/// Every kernel entry point of the crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(usize)]
pub enum KernelId {
    /// `binary.ptx`: add / mul / div with broadcasting.
    Binary,
    /// `unary.ptx`: scale.
    Scale,
    /// `unary.ptx`: silu.
    Silu,
    /// `unary.ptx`: swiglu.
    Swiglu,
    /// `unary.ptx`: gelu (tanh approximation, ggml's f16-table semantics).
    Gelu,
    /// `unary.ptx`: geglu.
    Geglu,
    /// `unary.ptx`: clamp.
    Clamp,
    /// `cpy.ptx`: cpy / cont.
    Cpy,
    /// `cpy.ptx`: concat.
    Concat,
    /// `cpy.ptx`: set_rows.
    SetRows,
    /// `getrows.ptx`: get_rows of float rows.
    GetRowsF,
    /// `quant.ptx`: get_rows of quantised rows.
    GetRowsQ,
    /// `quant.ptx`: activations to Q8_1 (for the tiled-class products and the first
    /// generation).
    QuantizeQ8_1,
    /// `unary.ptx`: swiglu_q8_1, SWIGLU with its result also quantised to Q8_1 (a
    /// prompt's SwiGLU before the product that reads it; a fusion).
    SwigluQ8_1,
    /// `quant.ptx`: quantised mul_mat, matrix-vector class, first generation.
    Mmvq,
    /// `quant.ptx`: quantised mul_mat, tiled class, first generation.
    Mmq,
    /// `quant.ptx`: quantised mul_mat_id, first generation (the matrix-vector class
    /// through the ids).
    MmvqId,
    /// `qmm.ptx`: quantised products, second generation (mul_mat of every class,
    /// mul_mat_id, and the fused decode-class runs).
    Qmm,
    /// `qmm.ptx`: 2-D quantised mul_mat of the tiled class, 32 x 32 outputs a block, the
    /// integer dot products on int8 tensor cores (exact): bit for bit `qmm`'s results.
    Qgemm,
    /// `mul_mat.ptx`: f32/f16/bf16 mul_mat.
    MulMatF,
    /// `mul_mat.ptx`: f32/f16/bf16 mul_mat_id.
    MulMatFId,
    /// `norm.ptx`: rms_norm.
    RmsNorm,
    /// `norm.ptx`: rms_norm_q8_1, RMS norm x weight with the result also quantised to
    /// Q8_1 (a prompt's norm before the products that read it; a fusion).
    RmsNormQ8_1,
    /// `softmax.ptx`: soft_max.
    SoftMax,
    /// `rope.ptx`: rope.
    Rope,
    /// `rope.ptx`: rope_store, RoPE of Q and K with the KV-cache stores (a fusion).
    RopeStore,
    /// `flash_attn.ptx`: flash_attn_ext, the first attention kernel (one warp per query
    /// row), kept behind `CudaTuning::legacy_decode_attn` and `legacy_prompt_attn`.
    FlashAttnExt,
    /// `flash_attn.ptx`: flash_attn_dec, attention over fixed KV tiles split across
    /// blocks and combined in order, for every batch (first written for decode-sized
    /// ones, hence the name).
    FlashAttnDec,
    /// `fattn_mma.ptx` (generated): flash_attn_mma_d64, prompt attention (8 queries or
    /// more) on f16 tensor cores for f16 K/V of head size 64.
    FlashAttnMma64,
    /// `fattn_mma.ptx` (generated): flash_attn_mma_d128, the same for head size 128.
    FlashAttnMma128,
    /// `fattn_row.ptx` (generated): flash_attn_row_d64, decode attention (fewer than 8
    /// queries) with one query row per block for f16 K/V of head size 64: the bits of
    /// `flash_attn_dec`.
    FlashAttnRow64,
    /// `fattn_row.ptx` (generated): flash_attn_row_d128, the same for head size 128.
    FlashAttnRow128,
    /// `fattn_row.ptx` (generated): flash_attn_row_d256, the same for head size 256.
    FlashAttnRow256,
    /// `rows.ptx`: sum_rows.
    SumRows,
    /// `rows.ptx`: argsort_top_k.
    ArgsortTopK,
    /// `upload.ptx`: the scatter of a batched host upload.
    UploadScatter,
    /// `argmax.ptx`: argmax (greedy sampling's token on the device).
    Argmax,
}

impl KernelId {
    /// Number of kernels.
    pub const COUNT: usize = KernelId::Argmax as usize + 1;

    /// Every kernel, in declaration order (`ALL[k as usize] == k`).
    pub const ALL: [KernelId; KernelId::COUNT] = [
        KernelId::Binary,
        KernelId::Scale,
        KernelId::Silu,
        KernelId::Swiglu,
        KernelId::Gelu,
        KernelId::Geglu,
        KernelId::Clamp,
        KernelId::Cpy,
        KernelId::Concat,
        KernelId::SetRows,
        KernelId::GetRowsF,
        KernelId::GetRowsQ,
        KernelId::QuantizeQ8_1,
        KernelId::SwigluQ8_1,
        KernelId::Mmvq,
        KernelId::Mmq,
        KernelId::MmvqId,
        KernelId::Qmm,
        KernelId::Qgemm,
        KernelId::MulMatF,
        KernelId::MulMatFId,
        KernelId::RmsNorm,
        KernelId::RmsNormQ8_1,
        KernelId::SoftMax,
        KernelId::Rope,
        KernelId::RopeStore,
        KernelId::FlashAttnExt,
        KernelId::FlashAttnDec,
        KernelId::FlashAttnMma64,
        KernelId::FlashAttnMma128,
        KernelId::FlashAttnRow64,
        KernelId::FlashAttnRow128,
        KernelId::FlashAttnRow256,
        KernelId::SumRows,
        KernelId::ArgsortTopK,
        KernelId::UploadScatter,
        KernelId::Argmax,
    ];

    /// Whether the kernel, or a `.func` it calls (directly or through others), contains
    /// an inexact instruction (see [`inexact_functions`]): then its outputs on a GPU
    /// differ from cuda-sim's within the instruction's bound, where every other
    /// kernel's outputs are bit for bit the same. Derived from the PTX text.
    pub fn uses_approx(self) -> bool {
        static APPROX: std::sync::OnceLock<[bool; KernelId::COUNT]> = std::sync::OnceLock::new();
        APPROX.get_or_init(|| {
            let mut out = [false; KernelId::COUNT];
            for m in MODULES {
                let inexact = inexact_functions(m.source);
                for (id, name) in m.kernels {
                    out[*id as usize] = inexact.iter().any(|f| f == name);
                }
            }
            out
        })[self as usize]
    }

    /// The module file and `.entry` name of the kernel.
    pub fn entry(self) -> (&'static str, &'static str) {
        MODULES
            .iter()
            .find_map(|m| {
                m.kernels
                    .iter()
                    .find(|(k, _)| *k == self)
                    .map(|(_, name)| (m.file, *name))
            })
            .expect("every kernel is in MODULES (tested)")
    }
}

/// Every kernel's static resources (registers, shared memory, spills) as `ptxas -v`
/// reports them for sm_80 and sm_90, one row per kernel and architecture (`cargo xtask
/// ptx-check --write` writes it; cuda-sim's `cost::ResourceTable::parse` reads it).
pub const PTXAS_RESOURCES: &str = include_str!("../kernels/ptxas-resources.txt");

/// One PTX file and the kernels it defines.
#[derive(Clone, Copy, Debug)]
pub struct Module {
    /// File name under `kernels/`.
    pub file: &'static str,
    /// The PTX text.
    pub source: &'static str,
    /// Kernel ids and their `.entry` names.
    pub kernels: &'static [(KernelId, &'static str)],
}

/// Whether `.entry` `entry` of PTX text `source` runs `griddepcontrol.wait` (a line of
/// its body that starts with it; a commented-out one does not count).
pub(crate) fn entry_waits_for_grid(source: &str, entry: &str) -> bool {
    let head = format!(".visible .entry {entry}(");
    let mut inside = false;
    for line in source.lines().map(str::trim_start) {
        if line.starts_with(".visible .entry") {
            inside = line.starts_with(&head);
        } else if inside && line.starts_with("griddepcontrol.wait") {
            return true;
        }
    }
    false
}

/// A [`Module`] for `kernels/<file>.ptx` with its kernels' ids and `.entry` names.
macro_rules! ptx_module {
    ($file:literal: $($id:ident = $entry:literal),+ $(,)?) => {
        Module {
            file: concat!($file, ".ptx"),
            source: include_str!(concat!("../kernels/", $file, ".ptx")),
            kernels: &[$((KernelId::$id, $entry)),+],
        }
    };
}

/// All modules, in load order.
pub const MODULES: [Module; 16] = [
    ptx_module!("binary": Binary = "binary"),
    ptx_module!(
        "unary":
        Scale = "scale",
        Silu = "silu",
        Swiglu = "swiglu",
        SwigluQ8_1 = "swiglu_q8_1",
        Gelu = "gelu",
        Geglu = "geglu",
        Clamp = "clamp",
    ),
    ptx_module!("cpy": Cpy = "cpy", Concat = "concat", SetRows = "set_rows"),
    ptx_module!("getrows": GetRowsF = "get_rows_f"),
    ptx_module!(
        "quant":
        GetRowsQ = "get_rows_q",
        QuantizeQ8_1 = "quantize_q8_1",
        Mmvq = "mmvq",
        Mmq = "mmq",
        MmvqId = "mmvq_id",
    ),
    ptx_module!("qmm": Qmm = "qmm", Qgemm = "qgemm"),
    ptx_module!("mul_mat": MulMatF = "mul_mat_f", MulMatFId = "mul_mat_f_id"),
    ptx_module!("norm": RmsNorm = "rms_norm", RmsNormQ8_1 = "rms_norm_q8_1"),
    ptx_module!("softmax": SoftMax = "soft_max"),
    ptx_module!("rope": Rope = "rope", RopeStore = "rope_store"),
    ptx_module!("flash_attn": FlashAttnExt = "flash_attn_ext", FlashAttnDec = "flash_attn_dec"),
    ptx_module!(
        "fattn_mma":
        FlashAttnMma64 = "flash_attn_mma_d64",
        FlashAttnMma128 = "flash_attn_mma_d128",
    ),
    ptx_module!(
        "fattn_row":
        FlashAttnRow64 = "flash_attn_row_d64",
        FlashAttnRow128 = "flash_attn_row_d128",
        FlashAttnRow256 = "flash_attn_row_d256",
    ),
    ptx_module!("rows": SumRows = "sum_rows", ArgsortTopK = "argsort_top_k"),
    ptx_module!("upload": UploadScatter = "upload_scatter"),
    ptx_module!("argmax": Argmax = "argmax"),
];

/// A `.visible .entry` of a PTX text: its name, its parameter names and the comment
/// block right above it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryInfo {
    /// Kernel name.
    pub name: String,
    /// Parameter names in order.
    pub params: Vec<String>,
    /// The `//` comment lines directly above the entry, without the `//`.
    pub header: Vec<String>,
}

/// Parses the entries of a PTX text (enough of PTX for the checks in the tests: entry
/// names, parameter lists and header comments).
pub fn entries(ptx: &str) -> Vec<EntryInfo> {
    let lines: Vec<&str> = ptx.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix(".visible .entry ") else {
            continue;
        };
        let name = rest.split('(').next().unwrap_or("").trim().to_string();
        let mut params = Vec::new();
        for l in &lines[i..] {
            if let Some(p) = l.trim().strip_prefix(".param ") {
                if let Some(n) = p.split_whitespace().last() {
                    params.push(n.trim_end_matches(',').to_string());
                }
            }
            if l.trim_start().starts_with(')') {
                break;
            }
        }
        let mut header = Vec::new();
        let mut j = i;
        while j > 0 && lines[j - 1].trim_start().starts_with("//") {
            j -= 1;
            header.push(lines[j].trim_start().trim_start_matches('/').to_string());
        }
        header.reverse();
        out.push(EntryInfo {
            name,
            params,
            header,
        });
    }
    out
}

/// Whether a PTX opcode (`ex2.approx.ftz.f32`, `div.full.f32`, ...) is inexact: an
/// `.approx` form, `div.full` (both approximate within documented bounds), or an `mma`
/// with f16/bf16 inputs (the ISA leaves its accumulation open; cuda-sim models it). Every
/// other instruction the kernels use, integer `mma` included, is exactly defined by the
/// PTX ISA.
pub fn is_inexact_opcode(opcode: &str) -> bool {
    let mut parts = opcode.split('.');
    let mnemonic = parts.next().unwrap_or("");
    let mods: Vec<&str> = parts.collect();
    mods.contains(&"approx")
        || (mnemonic == "div" && mods.contains(&"full"))
        || (mnemonic == "mma" && mods.iter().any(|m| matches!(*m, "f16" | "bf16")))
}

/// One function of a PTX text: its name, whether its own body has an inexact
/// instruction, and the functions it calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionInfo {
    /// The `.entry` or `.func` name.
    pub name: String,
    /// Whether its body holds an instruction [`is_inexact_opcode`] flags.
    pub inexact: bool,
    /// The callees of its `call` instructions, in order.
    pub calls: Vec<String>,
}

/// The PTX text without `//` comments.
fn strip_comments(ptx: &str) -> String {
    ptx.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(s: &str) -> String {
    s.trim_start()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '$')
        .collect()
}

/// `s` after the balanced parenthesis group it starts with (or `s` if it starts with
/// none).
fn skip_group(s: &str) -> &str {
    let t = s.trim_start();
    if !t.starts_with('(') {
        return t;
    }
    let mut depth = 0;
    for (i, ch) in t.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &t[i + 1..];
                }
            }
            _ => {}
        }
    }
    ""
}

/// The functions (`.entry` and `.func` with a body) of a PTX text.
pub fn functions(ptx: &str) -> Vec<FunctionInfo> {
    let text = strip_comments(ptx);
    let mut out = Vec::new();
    let mut rest = text.as_str();
    loop {
        let at = [".entry", ".func"]
            .iter()
            .filter_map(|kw| {
                rest.match_indices(kw)
                    .find(|(i, _)| {
                        let after = rest[i + kw.len()..].chars().next();
                        after.is_some_and(char::is_whitespace)
                    })
                    .map(|(i, _)| (i, kw.len()))
            })
            .min();
        let Some((i, len)) = at else { break };
        let header = &rest[i + len..];
        // `.func (.param ...) name(...)`: the return parameters come first.
        let after_ret = if header.trim_start().starts_with('(') {
            skip_group(header)
        } else {
            header
        };
        let name = ident(after_ret);
        let (open, semi) = (header.find('{'), header.find(';'));
        let start = match (open, semi) {
            (Some(o), Some(s)) if s < o => {
                rest = &header[s + 1..]; // a prototype without a body
                continue;
            }
            (Some(o), _) => o,
            (None, _) => break,
        };
        let body = &header[start..];
        let mut depth = 0usize;
        let mut end = body.len();
        for (j, ch) in body.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = j;
                        break;
                    }
                }
                _ => {}
            }
        }
        let (mut inexact, mut calls) = (false, Vec::new());
        for stmt in body[1..end].split(';') {
            // Drop scope braces, labels and a guard; what is left starts with the opcode.
            let mut words = stmt
                .split_whitespace()
                .map(|w| w.trim_matches(|c| c == '{' || c == '}'))
                .filter(|w| !w.is_empty() && !w.ends_with(':') && !w.starts_with('@'));
            let Some(opcode) = words.next() else { continue };
            if opcode.starts_with('.') {
                continue; // a declaration
            }
            inexact |= is_inexact_opcode(opcode);
            if opcode == "call" || opcode.starts_with("call.") {
                let at = stmt.find(opcode).map_or(0, |k| k + opcode.len());
                let operands = &stmt[at..];
                let callee = if operands.trim_start().starts_with('(') {
                    skip_group(operands).trim_start().trim_start_matches(',')
                } else {
                    operands
                };
                calls.push(ident(callee));
            }
        }
        out.push(FunctionInfo {
            name,
            inexact,
            calls,
        });
        rest = &body[end..];
    }
    out
}

/// The names of the functions of a PTX text that contain an inexact instruction or
/// call (through any chain of calls) one that does.
pub fn inexact_functions(ptx: &str) -> Vec<String> {
    let fns = functions(ptx);
    let mut inexact: Vec<bool> = fns.iter().map(|f| f.inexact).collect();
    loop {
        let mut changed = false;
        for (i, f) in fns.iter().enumerate() {
            if !inexact[i]
                && f.calls
                    .iter()
                    .any(|c| fns.iter().zip(&inexact).any(|(g, &x)| x && &g.name == c))
            {
                inexact[i] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    fns.into_iter()
        .zip(inexact)
        .filter(|(_, x)| *x)
        .map(|(f, _)| f.name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_with_approx_instructions_are_found_through_their_calls() {
        let approx: Vec<KernelId> = KernelId::ALL
            .into_iter()
            .filter(|k| k.uses_approx())
            .collect();
        // silu, swiglu and swiglu_q8_1 use ex2.approx directly, gelu and geglu through gelu_tab, a
        // .func; scale and clamp share unary.ptx (and its comments naming ex2.approx)
        // but call only ld_any / st_any. qmm has ex2.approx in its SwiGLU epilogue only
        // (the bit-for-bit product tests check its other launches on either driver).
        assert_eq!(
            approx,
            [
                KernelId::Silu,
                KernelId::Swiglu,
                KernelId::Gelu,
                KernelId::Geglu,
                KernelId::SwigluQ8_1,
                KernelId::Qmm,
                KernelId::SoftMax,
                KernelId::FlashAttnExt,
                KernelId::FlashAttnDec,
                KernelId::FlashAttnMma64,
                KernelId::FlashAttnMma128,
                KernelId::FlashAttnRow64,
                KernelId::FlashAttnRow128,
                KernelId::FlashAttnRow256,
            ]
        );
        // Every call names a function of its own module.
        for m in MODULES {
            let fns = functions(m.source);
            for f in &fns {
                for c in &f.calls {
                    assert!(
                        fns.iter().any(|g| &g.name == c),
                        "{}: {} calls {c}",
                        m.file,
                        f.name
                    );
                }
            }
            let entries = entries(m.source).len();
            assert_eq!(
                fns.iter()
                    .filter(|f| m.kernels.iter().any(|k| k.1 == f.name))
                    .count(),
                entries
            );
        }
    }

    #[test]
    fn inexact_instructions_and_calls_are_followed() {
        let ptx = "
.version 8.0
// ex2.approx.f32 in a comment counts for nothing
.func (.param .f32 r) deep(.param .f32 x)
{
    .reg .f32 %f<2>;
    ld.param.f32 %f0, [x];
L1:
    @%p0 ex2.approx.ftz.f32 %f1, %f0;
    st.param.f32 [r], %f1;
    ret;
}
.func (.param .f32 r) middle(.param .f32 x)
{
    {
    .param .f32 a;
    .param .f32 b;
    call.uni (b), deep, (a);
    }
    ret;
}
.func exact_one(.param .f32 x)
{
    add.rn.f32 %f0, %f0, %f0; // tanh.approx.f32 here is a comment
    ret;
}
.visible .entry through_two_calls(.param .u64 p)
{
    call (r), middle, (a);
    call exact_one, (a);
}
.visible .entry only_exact(.param .u64 p)
{
    call exact_one, (a);
    div.rn.f32 %f0, %f0, %f1;
}
.visible .entry full_division(.param .u64 p)
{
    div.full.f32 %f0, %f0, %f1;
}
.visible .entry rcp(.param .u64 p)
{
    rcp.approx.ftz.f64 %fd0, %fd0;
}
";
        let fns = functions(ptx);
        let names: Vec<&str> = fns.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "deep",
                "middle",
                "exact_one",
                "through_two_calls",
                "only_exact",
                "full_division",
                "rcp"
            ]
        );
        assert_eq!(fns[1].calls, ["deep"]);
        assert_eq!(fns[3].calls, ["middle", "exact_one"]);
        assert_eq!(
            inexact_functions(ptx),
            [
                "deep",
                "middle",
                "through_two_calls",
                "full_division",
                "rcp"
            ]
        );
        assert!(is_inexact_opcode("sqrt.approx.f32") && !is_inexact_opcode("sqrt.rn.f32"));
        assert!(!is_inexact_opcode("div.rn.f32") && !is_inexact_opcode("approx"));
        assert!(is_inexact_opcode(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
        ));
        assert!(is_inexact_opcode(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
        ));
        assert!(!is_inexact_opcode(
            "mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32"
        ));
    }

    #[test]
    fn every_kernel_is_an_entry_of_its_module() {
        let mut ids = Vec::new();
        for m in MODULES {
            let names: Vec<String> = entries(m.source).into_iter().map(|e| e.name).collect();
            assert_eq!(names.len(), m.kernels.len(), "{}: {names:?}", m.file);
            for (id, name) in m.kernels {
                assert!(names.iter().any(|n| n == name), "{} lacks {name}", m.file);
                ids.push(*id as usize);
            }
        }
        ids.sort();
        assert_eq!(ids, (0..KernelId::COUNT).collect::<Vec<_>>());
        for (i, k) in KernelId::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
        assert_eq!(KernelId::Mmq.entry(), ("quant.ptx", "mmq"));
    }

    #[test]
    fn ptx_targets_driver_580() {
        for m in MODULES {
            let head: Vec<&str> = m
                .source
                .lines()
                .map(str::trim)
                .filter(|l| {
                    l.starts_with('.') && !l.starts_with(".visible") && !l.starts_with(".func")
                })
                .take(3)
                .collect();
            assert_eq!(
                head,
                [".version 8.0", ".target sm_80", ".address_size 64"],
                "{}",
                m.file
            );
            assert!(
                m.source.is_ascii(),
                "{}: ptxas rejects non-ASCII text",
                m.file
            );
            assert!(
                m.source.lines().next().unwrap_or("").starts_with("// "),
                "{}",
                m.file
            );
        }
    }

    #[test]
    fn every_entry_documents_its_launch_and_params() {
        for m in MODULES {
            for e in entries(m.source) {
                let h = e.header.join("\n");
                assert!(
                    h.contains(&format!("KERNEL {}", e.name)),
                    "{}: {}",
                    m.file,
                    e.name
                );
                for key in ["Params:", "Grid:", "Block:", "Shared:", "Reduction:"] {
                    assert!(h.contains(key), "{}: {} lacks '{key}'", m.file, e.name);
                }
                assert!(!e.params.is_empty());
                for p in &e.params {
                    let documented = h
                        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .any(|w| w == p);
                    assert!(documented, "{}: {} does not document {p}", m.file, e.name);
                }
            }
        }
    }

    #[test]
    fn ptx_is_structurally_balanced() {
        for m in MODULES {
            let opens = m.source.matches('{').count();
            let closes = m.source.matches('}').count();
            assert_eq!(opens, closes, "{}", m.file);
            for l in m.source.lines() {
                let t = l.trim();
                if t.is_empty() || t.starts_with("//") || t.ends_with(':') {
                    continue;
                }
                let ok = t.ends_with(';')
                    || t.ends_with('{')
                    || t.ends_with('}')
                    || t.ends_with(',')
                    || t.ends_with('(')
                    || t.ends_with(')')
                    || t.starts_with(".version")
                    || t.starts_with(".target")
                    || t.starts_with(".address_size")
                    || t.starts_with(".param")
                    || t.starts_with(".maxntid")
                    || t.starts_with(".maxnreg")
                    || t.starts_with(".func")
                    || t.starts_with(".visible");
                assert!(ok, "{}: suspicious line '{t}'", m.file);
            }
        }
    }
}
