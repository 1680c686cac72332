//! PTX text to a decoded module.
//!
//! The parser accepts the PTX a driver's JIT receives (ISA 8.x, as `ptxas` takes it) for
//! the instruction forms the interpreter implements; anything else is a [`PtxError`]
//! naming file, line and instruction, never a silent no-op. A module is parsed once and
//! executed in decoded form ([`ir`]): registers, labels, symbols and parameters are
//! resolved to indices and offsets.

pub mod ir;
mod lex;
mod parse;

use std::fmt;

/// The scalar type of a kernel parameter as declared (`.param .u32 x` -> `U32`);
/// byte arrays (`.param .align 16 .b8 x[64]`) are `Bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamType {
    /// `.u8`/`.s8`/`.b8` .. `.u64`/`.s64`/`.b64`: an integer of `size` bytes.
    Int {
        /// Whether declared signed (`.sN`).
        signed: bool,
    },
    /// `.f16`, `.f32`, `.f64`.
    Float,
    /// An array of `.b8` (or other elements) with an explicit size.
    Bytes,
}

/// One `.param` of a `.entry`, in declaration order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    /// The parameter's name.
    pub name: String,
    /// Its type class.
    pub ty: ParamType,
    /// Its size in bytes.
    pub size: usize,
    /// Its alignment in bytes.
    pub align: usize,
}

/// A PTX text that does not parse, or uses what the emulator does not implement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxError {
    /// File name as given to [`Module::parse`].
    pub file: String,
    /// 1-based line.
    pub line: u32,
    /// The offending source line, trimmed.
    pub text: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for PtxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: {}: `{}`",
            self.file, self.line, self.message, self.text
        )
    }
}

impl std::error::Error for PtxError {}

/// A parsed PTX module: its kernels (`.entry`), functions (`.func`), and shared/local
/// declarations, decoded for the interpreter.
pub struct Module {
    pub(crate) file: String,
    lines: Vec<String>,
    pub(crate) functions: Vec<ir::Function>,
    pub(crate) local_bytes: usize,
    pub(crate) shared_bytes: usize,
    pub(crate) extern_shared: Option<usize>,
    pub(crate) target_sm: u32,
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module")
            .field("file", &self.file)
            .field("kernels", &self.kernel_names())
            .finish_non_exhaustive()
    }
}

/// The text of a PTX module written for `.target sm_80` as a GPU of architecture
/// `sm` (`major * 10 + minor`) is given it: on sm_90 and newer retargeted to sm_90, so
/// that its `griddepcontrol` instructions (programmatic dependent launch) assemble;
/// below that with those lines commented out (the wait returns at once on a grid not
/// launched programmatically, so dropping it changes nothing). Lines keep their numbers,
/// so fault reports and profiles point into the original text.
pub fn for_arch(ptx: &str, sm: u32) -> std::borrow::Cow<'_, str> {
    let mut changed = false;
    let lines: Vec<String> = ptx
        .lines()
        .map(|l| {
            let t = l.trim_start();
            if sm >= 90 && t == ".target sm_80" {
                changed = true;
                l.replacen("sm_80", "sm_90", 1)
            } else if sm < 90 && t.starts_with("griddepcontrol.") {
                changed = true;
                format!("// (sm_90 only) {l}")
            } else {
                l.to_string()
            }
        })
        .collect();
    if !changed {
        return std::borrow::Cow::Borrowed(ptx);
    }
    let mut out = lines.join("\n");
    if ptx.ends_with('\n') {
        out.push('\n');
    }
    std::borrow::Cow::Owned(out)
}

impl Module {
    /// Parses a PTX text (`file` names it in errors and fault reports).
    pub fn parse(file: &str, text: &str) -> Result<Module, PtxError> {
        let lines: Vec<String> = text.lines().map(|l| l.trim().to_string()).collect();
        match parse::parse(text) {
            Ok(p) => Ok(Module {
                file: file.to_string(),
                lines,
                functions: p.functions,
                local_bytes: p.local_bytes,
                shared_bytes: p.shared_bytes,
                extern_shared: p.extern_shared,
                target_sm: p.target_sm,
            }),
            Err((line, message)) => Err(PtxError {
                file: file.to_string(),
                line,
                text: lines
                    .get((line as usize).wrapping_sub(1))
                    .cloned()
                    .unwrap_or_default(),
                message,
            }),
        }
    }

    /// The `.target` architecture as `major * 10 + minor` (80 for `sm_80`).
    pub fn target_sm(&self) -> u32 {
        self.target_sm
    }

    /// The `.entry` names, in source order.
    pub fn kernel_names(&self) -> Vec<&str> {
        self.functions
            .iter()
            .filter(|f| f.is_entry)
            .map(|f| f.name.as_str())
            .collect()
    }

    /// The parameter list of kernel `name`, or `None` if there is no such `.entry`.
    pub fn kernel_params(&self, name: &str) -> Option<&[Param]> {
        self.functions
            .iter()
            .find(|f| f.is_entry && f.name == name)
            .map(|f| f.kernel_params.as_slice())
    }

    /// Number of decoded instructions of function or kernel `name`.
    pub fn instruction_count(&self, name: &str) -> Option<usize> {
        self.functions
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.code.len())
    }

    /// The trimmed source text of 1-based `line`.
    pub(crate) fn line_text(&self, line: u32) -> &str {
        self.lines
            .get((line as usize).wrapping_sub(1))
            .map_or("", |s| s.as_str())
    }
}
