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
    /// `quant.ptx`: activations to Q8_1 (for the first-generation products).
    QuantizeQ8_1,
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
    /// `mul_mat.ptx`: f32/f16/bf16 mul_mat.
    MulMatF,
    /// `mul_mat.ptx`: f32/f16/bf16 mul_mat_id.
    MulMatFId,
    /// `norm.ptx`: rms_norm.
    RmsNorm,
    /// `softmax.ptx`: soft_max.
    SoftMax,
    /// `rope.ptx`: rope.
    Rope,
    /// `flash_attn.ptx`: flash_attn_ext.
    FlashAttnExt,
    /// `rows.ptx`: sum_rows.
    SumRows,
    /// `rows.ptx`: argsort_top_k.
    ArgsortTopK,
}

impl KernelId {
    /// Number of kernels.
    pub const COUNT: usize = KernelId::ArgsortTopK as usize + 1;

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
        KernelId::Mmvq,
        KernelId::Mmq,
        KernelId::MmvqId,
        KernelId::Qmm,
        KernelId::MulMatF,
        KernelId::MulMatFId,
        KernelId::RmsNorm,
        KernelId::SoftMax,
        KernelId::Rope,
        KernelId::FlashAttnExt,
        KernelId::SumRows,
        KernelId::ArgsortTopK,
    ];

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

/// All modules, in load order.
pub const MODULES: [Module; 12] = [
    Module {
        file: "binary.ptx",
        source: include_str!("../kernels/binary.ptx"),
        kernels: &[(KernelId::Binary, "binary")],
    },
    Module {
        file: "unary.ptx",
        source: include_str!("../kernels/unary.ptx"),
        kernels: &[
            (KernelId::Scale, "scale"),
            (KernelId::Silu, "silu"),
            (KernelId::Swiglu, "swiglu"),
            (KernelId::Gelu, "gelu"),
            (KernelId::Geglu, "geglu"),
            (KernelId::Clamp, "clamp"),
        ],
    },
    Module {
        file: "cpy.ptx",
        source: include_str!("../kernels/cpy.ptx"),
        kernels: &[
            (KernelId::Cpy, "cpy"),
            (KernelId::Concat, "concat"),
            (KernelId::SetRows, "set_rows"),
        ],
    },
    Module {
        file: "getrows.ptx",
        source: include_str!("../kernels/getrows.ptx"),
        kernels: &[(KernelId::GetRowsF, "get_rows_f")],
    },
    Module {
        file: "quant.ptx",
        source: include_str!("../kernels/quant.ptx"),
        kernels: &[
            (KernelId::GetRowsQ, "get_rows_q"),
            (KernelId::QuantizeQ8_1, "quantize_q8_1"),
            (KernelId::Mmvq, "mmvq"),
            (KernelId::Mmq, "mmq"),
            (KernelId::MmvqId, "mmvq_id"),
        ],
    },
    Module {
        file: "qmm.ptx",
        source: include_str!("../kernels/qmm.ptx"),
        kernels: &[(KernelId::Qmm, "qmm")],
    },
    Module {
        file: "mul_mat.ptx",
        source: include_str!("../kernels/mul_mat.ptx"),
        kernels: &[
            (KernelId::MulMatF, "mul_mat_f"),
            (KernelId::MulMatFId, "mul_mat_f_id"),
        ],
    },
    Module {
        file: "norm.ptx",
        source: include_str!("../kernels/norm.ptx"),
        kernels: &[(KernelId::RmsNorm, "rms_norm")],
    },
    Module {
        file: "softmax.ptx",
        source: include_str!("../kernels/softmax.ptx"),
        kernels: &[(KernelId::SoftMax, "soft_max")],
    },
    Module {
        file: "rope.ptx",
        source: include_str!("../kernels/rope.ptx"),
        kernels: &[(KernelId::Rope, "rope")],
    },
    Module {
        file: "flash_attn.ptx",
        source: include_str!("../kernels/flash_attn.ptx"),
        kernels: &[(KernelId::FlashAttnExt, "flash_attn_ext")],
    },
    Module {
        file: "rows.ptx",
        source: include_str!("../kernels/rows.ptx"),
        kernels: &[
            (KernelId::SumRows, "sum_rows"),
            (KernelId::ArgsortTopK, "argsort_top_k"),
        ],
    },
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

#[cfg(test)]
mod tests {
    use super::*;

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
