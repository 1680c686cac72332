//! Instruction-set levels and their run-time detection.

use core::fmt;

/// An instruction-set level the kernels can run on.
///
/// Every level computes bit-identical results (see the crate docs on reduction order);
/// levels differ only in speed. [`Isa::detect`] picks the best one the CPU has;
/// [`crate::CpuBackendOptions::isa`] can force a lower one (tests do, to cover every path).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust, no target features beyond the compilation target's baseline.
    Scalar,
    /// AArch64 Advanced SIMD (baseline on aarch64).
    Neon,
    /// x86-64 AVX2 with FMA and F16C (x86-64-v3).
    Avx2,
    /// AVX-512 F, BW, VL and DQ on top of [`Isa::Avx2`].
    Avx512,
    /// [`Isa::Avx512`] plus AVX-512 VNNI (`vpdpbusd` for the integer dots).
    Avx512Vnni,
}

/// Every level, lowest first.
pub const ALL_ISAS: [Isa; 5] = [
    Isa::Scalar,
    Isa::Neon,
    Isa::Avx2,
    Isa::Avx512,
    Isa::Avx512Vnni,
];

impl Isa {
    /// Whether this CPU can run the level.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Neon => cfg!(target_arch = "aarch64"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::is_x86_feature_detected!("avx2")
                    && std::is_x86_feature_detected!("fma")
                    && std::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_available()
                    && std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
                    && std::is_x86_feature_detected!("avx512vl")
                    && std::is_x86_feature_detected!("avx512dq")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                Isa::Avx512.is_available() && std::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni => false,
        }
    }

    /// The best level this CPU can run.
    pub fn detect() -> Isa {
        ALL_ISAS
            .iter()
            .rev()
            .copied()
            .find(|i| i.is_available())
            .unwrap_or(Isa::Scalar)
    }

    /// Every level this CPU can run, lowest first.
    pub fn available() -> Vec<Isa> {
        ALL_ISAS
            .iter()
            .copied()
            .filter(|i| i.is_available())
            .collect()
    }

    /// The level named `name` (as [`Isa::name`] writes it).
    pub fn from_name(name: &str) -> Option<Isa> {
        ALL_ISAS.iter().copied().find(|i| i.name() == name)
    }

    /// The levels that `$GGML_RS_REQUIRE_ISA` (comma-separated names) says must run here,
    /// checked: an unknown name, or a level this CPU cannot run (so its kernels' tests
    /// would be skipped), is an error that says so. Empty when the variable is unset.
    /// CI sets it to the levels its machine reports, so a runner without a level fails
    /// loudly instead of dropping that level's tests.
    pub fn required() -> Result<Vec<Isa>, String> {
        match std::env::var("GGML_RS_REQUIRE_ISA") {
            Ok(list) => Isa::check_required(&list),
            Err(_) => Ok(Vec::new()),
        }
    }

    /// [`Isa::required`] for an explicit list.
    pub fn check_required(list: &str) -> Result<Vec<Isa>, String> {
        let mut out = Vec::new();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let isa = Isa::from_name(name).ok_or_else(|| {
                format!(
                    "GGML_RS_REQUIRE_ISA: unknown level '{name}' (known: {})",
                    ALL_ISAS.map(Isa::name).join(", ")
                )
            })?;
            if !isa.is_available() {
                return Err(format!(
                    "GGML_RS_REQUIRE_ISA names {name}, which this CPU cannot run: its kernels' \
                     tests did not run (available: {})",
                    Isa::available()
                        .iter()
                        .map(|i| i.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            out.push(isa);
        }
        Ok(out)
    }

    /// A short lower-case name (`"avx2"`).
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Neon => "neon",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Vnni => "avx512vnni",
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The levels CI requires ran here (the SIMD tests loop over every available level).
    #[test]
    fn required_levels_ran() {
        let required = Isa::required().unwrap_or_else(|e| panic!("{e}"));
        let ran = Isa::available();
        for isa in required {
            assert!(ran.contains(&isa), "{isa} required but not run");
        }
    }

    #[test]
    fn required_lists_are_checked() {
        assert_eq!(Isa::check_required(""), Ok(vec![]));
        assert_eq!(Isa::check_required("scalar"), Ok(vec![Isa::Scalar]));
        let e = Isa::check_required("scalar,avx9").unwrap_err();
        assert!(e.contains("unknown level 'avx9'"), "{e}");
        for isa in ALL_ISAS {
            assert_eq!(Isa::from_name(isa.name()), Some(isa));
            let r = Isa::check_required(isa.name());
            assert_eq!(r.is_ok(), isa.is_available(), "{isa}: {r:?}");
        }
    }

    #[test]
    fn detect_is_available() {
        assert!(Isa::detect().is_available());
        assert!(Isa::available().contains(&Isa::Scalar));
        assert_eq!(Isa::available().last(), Some(&Isa::detect()));
    }
}
