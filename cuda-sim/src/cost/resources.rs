//! A table of kernels' static resources per architecture, as `ptxas -v` reports them,
//! in a checked-in text form (one kernel and architecture a line) that a build step
//! regenerates and compares.
//!
//! ```text
//! # file kernel arch registers static_shared spill_stores spill_loads stack
//! binary.ptx add_f32 sm_80 16 0 0 0 0
//! ```

use std::collections::BTreeMap;

use super::occupancy::KernelResources;
use super::CostError;

/// The column header line of the text form.
pub const HEADER: &str =
    "# file kernel arch registers static_shared spill_stores spill_loads stack";

/// Static resources of kernels, by (PTX file name, kernel, architecture such as `sm_90`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceTable {
    rows: BTreeMap<(String, String, String), KernelResources>,
}

impl ResourceTable {
    /// An empty table.
    pub fn new() -> ResourceTable {
        ResourceTable::default()
    }

    /// The resources of `kernel` of `file` (a file name such as `softmax.ptx`) on `arch`.
    pub fn get(&self, file: &str, kernel: &str, arch: &str) -> Option<KernelResources> {
        let file = file.rsplit('/').next().unwrap_or(file);
        self.rows
            .get(&(file.to_string(), kernel.to_string(), arch.to_string()))
            .copied()
    }

    /// Adds or replaces a row.
    pub fn insert(&mut self, file: &str, kernel: &str, arch: &str, r: KernelResources) {
        self.rows
            .insert((file.to_string(), kernel.to_string(), arch.to_string()), r);
    }

    /// How many rows it has.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether it has no row.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Parses the text form: `#` lines are comments, every other non-empty line has
    /// eight fields. A malformed line is an error naming it.
    pub fn parse(text: &str) -> Result<ResourceTable, CostError> {
        let mut t = ResourceTable::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            let bad = || CostError::new(format!("resource table line {}: '{line}'", i + 1));
            if f.len() != 8 {
                return Err(bad());
            }
            let n = |s: &str| s.parse::<u32>().map_err(|_| bad());
            let r = KernelResources {
                registers: n(f[3])?,
                static_shared: n(f[4])?,
                spill_store_bytes: n(f[5])?,
                spill_load_bytes: n(f[6])?,
                stack_bytes: n(f[7])?,
            };
            t.insert(f[0], f[1], f[2], r);
        }
        Ok(t)
    }

    /// The text form, with `comment` lines (each prefixed `# `) before the header.
    pub fn to_text(&self, comment: &[&str]) -> String {
        let mut s = String::new();
        for c in comment {
            s.push_str("# ");
            s.push_str(c);
            s.push('\n');
        }
        s.push_str(HEADER);
        s.push('\n');
        for ((file, kernel, arch), r) in &self.rows {
            s.push_str(&format!(
                "{file} {kernel} {arch} {} {} {} {} {}\n",
                r.registers,
                r.static_shared,
                r.spill_store_bytes,
                r.spill_load_bytes,
                r.stack_bytes
            ));
        }
        s
    }

    /// Adds the kernels of `ptxas -v` output `text` for PTX file `file` assembled for
    /// `arch`. Only entry functions become rows. Output without any entry is an error.
    pub fn add_ptxas_verbose(
        &mut self,
        file: &str,
        arch: &str,
        text: &str,
    ) -> Result<(), CostError> {
        // name -> (stack, spill stores, spill loads), from "Function properties for X".
        let mut props: BTreeMap<String, (u32, u32, u32)> = BTreeMap::new();
        let mut entries: Vec<(String, u32, u32)> = Vec::new();
        let mut props_of: Option<String> = None;
        let mut current: Option<String> = None;
        let err = |what: &str, line: &str| {
            CostError::new(format!(
                "ptxas -v output of {file} ({arch}): {what}: '{line}'"
            ))
        };
        for line in text.lines() {
            let l = line.trim();
            if let Some(rest) = l.split("Compiling entry function '").nth(1) {
                let name = rest.split('\'').next().unwrap_or("").to_string();
                current = Some(name);
            } else if l.contains("Compiling function '") {
                current = None;
            } else if let Some(rest) = l.split("Function properties for ").nth(1) {
                props_of = Some(rest.trim().to_string());
            } else if l.contains("bytes stack frame") {
                let name = props_of
                    .take()
                    .ok_or_else(|| err("properties without a function", l))?;
                let stack = number_before(l, "bytes stack frame").ok_or_else(|| err("stack", l))?;
                let st =
                    number_before(l, "bytes spill stores").ok_or_else(|| err("spill stores", l))?;
                let ld =
                    number_before(l, "bytes spill loads").ok_or_else(|| err("spill loads", l))?;
                props.insert(name, (stack, st, ld));
            } else if l.contains("Used ") && l.contains(" registers") {
                let Some(name) = current.take() else {
                    continue;
                };
                let regs = number_before(l, "registers").ok_or_else(|| err("registers", l))?;
                let smem = number_before(l, "bytes smem").unwrap_or(0);
                entries.push((name, regs, smem));
            }
        }
        if entries.is_empty() {
            return Err(CostError::new(format!(
                "ptxas -v output of {file} ({arch}) names no entry function"
            )));
        }
        for (name, registers, static_shared) in entries {
            let (stack_bytes, spill_store_bytes, spill_load_bytes) =
                props.get(&name).copied().unwrap_or_default();
            self.insert(
                file,
                &name,
                arch,
                KernelResources {
                    registers,
                    static_shared,
                    spill_store_bytes,
                    spill_load_bytes,
                    stack_bytes,
                },
            );
        }
        Ok(())
    }
}

/// The integer just before `what` in `line` ("0 bytes stack frame" -> 0).
fn number_before(line: &str, what: &str) -> Option<u32> {
    let at = line.find(what)?;
    line[..at].split_whitespace().last()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTXAS: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'flash_attn_ext' for 'sm_90'
ptxas info    : Function properties for flash_attn_ext
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 4352 bytes smem, 536 bytes cmem[0]
ptxas info    : Compile time = 102.733 ms
ptxas info    : Function properties for helper
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'soft_max' for 'sm_90'
ptxas info    : Function properties for soft_max
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 22 registers, used 0 barriers
";

    #[test]
    fn parses_ptxas_verbose_output() {
        let mut t = ResourceTable::new();
        t.add_ptxas_verbose("fa.ptx", "sm_90", PTXAS).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(
            t.get("fa.ptx", "flash_attn_ext", "sm_90"),
            Some(KernelResources {
                registers: 40,
                static_shared: 4352,
                spill_store_bytes: 4,
                spill_load_bytes: 12,
                stack_bytes: 8,
            })
        );
        assert_eq!(
            t.get("kernels/fa.ptx", "soft_max", "sm_90")
                .unwrap()
                .registers,
            22
        );
        assert_eq!(t.get("fa.ptx", "soft_max", "sm_80"), None);
        assert!(ResourceTable::new()
            .add_ptxas_verbose("x.ptx", "sm_80", "ptxas info : 0 bytes gmem\n")
            .is_err());
    }

    #[test]
    fn text_form_round_trips() {
        let mut t = ResourceTable::new();
        t.add_ptxas_verbose("fa.ptx", "sm_90", PTXAS).unwrap();
        let text = t.to_text(&["generated for a test"]);
        assert!(text.starts_with("# generated for a test\n# file kernel arch"));
        assert_eq!(ResourceTable::parse(&text).unwrap(), t);
        let e = ResourceTable::parse("a.ptx k sm_80 12 0 0 0\n").unwrap_err();
        assert!(e.to_string().contains("line 1"), "{e}");
        assert!(ResourceTable::parse("a.ptx k sm_80 x 0 0 0 0\n").is_err());
    }
}
