//! Entries of `qmm` compiled for one dtype and one fused form.
//!
//! `qmm` is one entry for every weight dtype and every fused form, chosen at run time by
//! its `p_flags` and `p_dt*` parameters: about 5800 SASS instructions of which a decode
//! launch runs 700-1150, spread over the whole entry, and 84 registers. Run 6c's Nsight
//! Compute samples put 32-46 % of the decode products' stalls on instruction fetch and
//! constant-cache misses. A [`QmmVariant`] is the same entry with those parameters bound
//! to the values a launch passes: some of `p_flags`' bits are and-ed out and or-ed in as
//! constants after the parameter load, and the three dtype codes are moved in as
//! immediates. ptxas folds the tests of those bits and drops the code they rule out.
//! Two granularities ([`Granularity`]): the dtype and the decode class alone (one entry
//! for every fused form of a dtype: SmolLM2's four products share 2264 instructions),
//! or also the fused form (one entry per form: 1312-2120). Every instruction that runs is
//! the generic entry's, on the values it would have had: the same bits by construction,
//! and checked against the generic entry in the tests.

use crate::driver::CuError;

/// Which of `qmm`'s `p_flags` bits a variant binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Granularity {
    /// The decode class's bit (13) alone: one entry per dtype for every fused form.
    Dtype,
    /// Every bit but the log2 of the rows per block (bits 8-11, which change with the
    /// shape, not the code that runs): one entry per dtype and fused form.
    Form,
}

impl Granularity {
    /// The bound bits of `p_flags`.
    fn mask(self) -> u32 {
        match self {
            Granularity::Dtype => 1 << 13,
            Granularity::Form => !0xF00,
        }
    }
}

/// A dtype (and fused form) of `qmm`: which bits of `p_flags` it binds and their values,
/// and the dtype code every matrix passes (`p_dt0` = `p_dt1` = `p_dt2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct QmmVariant {
    mask: u32,
    flags: u32,
    dtype: u32,
}

impl QmmVariant {
    /// The variant of a launch with these `p_flags` and `p_dt0..2` at `granularity`, or
    /// `None` where the matrices' dtype codes differ (no variant binds more than one).
    pub(crate) fn of(flags: u32, dtypes: [u32; 3], granularity: Granularity) -> Option<QmmVariant> {
        let mask = granularity.mask();
        (dtypes[1] == dtypes[0] && dtypes[2] == dtypes[0]).then_some(QmmVariant {
            mask,
            flags: flags & mask,
            dtype: dtypes[0],
        })
    }

    /// The variant's `.entry` name: `qmm__m<mask>_f<flags>_d<dtype code>` (`qmm__` and a
    /// suffix, so that a profile can tell it for `qmm`).
    pub(crate) fn entry(&self) -> String {
        format!(
            "{}m{:x}_f{:x}_d{}",
            VARIANT_PREFIX, self.mask, self.flags, self.dtype
        )
    }

    /// A PTX module of this variant's entry alone, from the generic `qmm` module text
    /// `source` (as loaded, after `cuda_sim::ptx::for_arch`): its directives and shared
    /// declaration, then the `qmm` entry renamed, with the flags and dtype parameters
    /// bound. An error names a line of the generic entry the binding expects and did not
    /// find exactly once (the generator changed it).
    pub(crate) fn ptx(&self, source: &str) -> Result<String, CuError> {
        let missing = |what: &'static str| CuError::new(what, 0);
        let start = source
            .find(ENTRY_HEAD)
            .ok_or_else(|| missing("qmm variant: no `qmm` entry in the module"))?;
        let len = source[start..]
            .find("\n}\n")
            .ok_or_else(|| missing("qmm variant: the `qmm` entry has no end"))?;
        let mut entry = source[start..start + len + 3].to_string();
        let mut text = String::new();
        for line in source[..start].lines() {
            let l = line.trim_start();
            if [".version", ".target", ".address_size", ".extern"]
                .iter()
                .any(|d| l.starts_with(d))
            {
                text.push_str(line);
                text.push('\n');
            }
        }
        let flags = (
            FLAGS_LOAD.to_string(),
            format!(
                "{FLAGS_LOAD}\n    and.b32 %flags, %flags, {};\n    \
                 or.b32 %flags, %flags, {};",
                !self.mask, self.flags
            ),
        );
        let dtypes = DT_REGS.map(|(reg, param)| {
            (
                format!("    ld.param.u32 {reg}, [{param}];"),
                format!("    mov.u32 {reg}, {};", self.dtype),
            )
        });
        for (from, to) in std::iter::once(&flags).chain(&dtypes) {
            let line = format!("\n{from}\n");
            if entry.matches(&line).count() != 1 {
                return Err(missing(
                    "qmm variant: the generic entry's flags or dtype parameter loads changed",
                ));
            }
            entry = entry.replacen(&line, &format!("\n{to}\n"), 1);
        }
        text.push('\n');
        text.push_str(&entry.replacen(
            ENTRY_HEAD,
            &format!(".visible .entry {}(", self.entry()),
            1,
        ));
        Ok(text)
    }
}

/// The prefix of every variant's entry name.
const VARIANT_PREFIX: &str = "qmm__";

/// The generic entry's first line.
const ENTRY_HEAD: &str = ".visible .entry qmm(";

/// The generic entry's load of `p_flags` (its decoding follows it).
const FLAGS_LOAD: &str = "    ld.param.u32 %flags, [p_flags];";

/// The registers the generic entry loads the three dtype codes into, and their
/// parameters.
const DT_REGS: [(&str, &str); 3] = [("%dta", "p_dt0"), ("%dt1", "p_dt1"), ("%t4", "p_dt2")];

#[cfg(test)]
mod tests {
    use super::*;

    const QMM: &str = include_str!("../kernels/qmm.ptx");

    #[test]
    fn a_variant_needs_one_dtype_and_binds_its_granularitys_bits() {
        use Granularity::{Dtype, Form};
        assert_eq!(QmmVariant::of(0x2121, [5123, 5123, 1024], Form), None);
        let v = QmmVariant::of(0x2321, [5123; 3], Form).unwrap();
        assert_eq!(v, QmmVariant::of(0x2021, [5123; 3], Form).unwrap());
        assert_ne!(v, QmmVariant::of(0x2023, [5123; 3], Form).unwrap());
        assert_eq!(v.entry(), "qmm__mfffff0ff_f2021_d5123");
        // One entry per dtype for every form of the decode class; the class bit counts.
        let d = QmmVariant::of(0x2321, [5123; 3], Dtype).unwrap();
        assert_eq!(d, QmmVariant::of(0x2025, [5123; 3], Dtype).unwrap());
        assert_ne!(d, QmmVariant::of(0x0025, [5123; 3], Dtype).unwrap());
        assert_ne!(d, QmmVariant::of(0x2025, [2306; 3], Dtype).unwrap());
        assert_eq!(d.entry(), "qmm__m2000_f2000_d5123");
    }

    #[test]
    fn the_variant_binds_the_flags_and_dtypes_and_nothing_else() {
        let v = QmmVariant::of(0x2021, [5123; 3], Granularity::Form).unwrap();
        let text = v.ptx(QMM).unwrap();
        let entries = crate::kernels::entries(&text);
        assert_eq!(entries.len(), 1, "one entry");
        assert_eq!(entries[0].name, "qmm__mfffff0ff_f2021_d5123");
        let d = QmmVariant::of(0x2021, [5123; 3], Granularity::Dtype).unwrap();
        assert!(d
            .ptx(QMM)
            .unwrap()
            .contains("    and.b32 %flags, %flags, 4294959103;\n    or.b32 %flags, %flags, 8192;"));
        let generic = crate::kernels::entries(QMM);
        let qmm = generic.iter().find(|e| e.name == "qmm").unwrap();
        assert_eq!(
            entries[0].params, qmm.params,
            "the generic entry's parameters"
        );
        assert!(text.contains(".extern .shared .align 16 .b8 qmm_smem[];"));
        assert!(
            text.contains("    and.b32 %flags, %flags, 3840;\n    or.b32 %flags, %flags, 8225;")
        );
        assert!(
            !text.contains("[p_dt0]") && !text.contains("[p_dt1]") && !text.contains("[p_dt2]")
        );
        assert_eq!(text.matches("mov.u32 %dta, 5123;").count(), 1);
        // Everything else is the generic entry's text, line for line.
        let body = |t: &str| -> Vec<String> {
            let s = t.find(".visible .entry").unwrap();
            let e = s + t[s..].find("\n}\n").unwrap();
            t[s..e]
                .lines()
                .skip(1)
                .filter(|l| {
                    !l.contains("%flags, %flags")
                        && !l.contains("[p_dt")
                        && !l.starts_with("    mov.u32 %dta, ")
                        && !l.starts_with("    mov.u32 %dt1, ")
                        && !l.starts_with("    mov.u32 %t4, ")
                })
                .map(str::to_string)
                .collect()
        };
        assert_eq!(body(&text), body(QMM));
    }

    #[test]
    fn a_changed_generic_entry_is_an_error_not_a_wrong_variant() {
        let v = QmmVariant::of(0x2021, [5123; 3], Granularity::Form).unwrap();
        let changed = QMM.replace("ld.param.u32 %dt1, [p_dt1];", "ld.param.u32 %dt1, [p_dt0];");
        let e = v.ptx(&changed).unwrap_err();
        assert!(e.to_string().contains("changed"), "{e}");
        assert!(v.ptx("// no entry\n").is_err());
    }
}
