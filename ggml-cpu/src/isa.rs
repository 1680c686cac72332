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
    /// [`Isa::Neon`] plus the dot-product extension (FEAT_DotProd: `sdot` for the
    /// integer dots of the quantised products).
    NeonDotprod,
    /// [`Isa::NeonDotprod`] plus the 8-bit integer matrix multiply (FEAT_I8MM: `smmla`,
    /// 2 × 2 integer dots per instruction in the quantised tiles).
    NeonI8mm,
    /// x86-64 AVX2 with FMA and F16C (x86-64-v3).
    Avx2,
    /// AVX-512 F, BW, VL and DQ on top of [`Isa::Avx2`].
    Avx512,
    /// [`Isa::Avx512`] plus AVX-512 VNNI (`vpdpbusd` for the integer dots).
    Avx512Vnni,
}

/// Every level, lowest first.
pub const ALL_ISAS: [Isa; 7] = [
    Isa::Scalar,
    Isa::Neon,
    Isa::NeonDotprod,
    Isa::NeonI8mm,
    Isa::Avx2,
    Isa::Avx512,
    Isa::Avx512Vnni,
];

impl Isa {
    /// Whether this CPU can run the level.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDotprod => {
                Isa::Neon.is_available() && std::arch::is_aarch64_feature_detected!("dotprod")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::NeonI8mm => {
                Isa::NeonDotprod.is_available() && std::arch::is_aarch64_feature_detected!("i8mm")
            }
            #[cfg(not(target_arch = "aarch64"))]
            Isa::Neon | Isa::NeonDotprod | Isa::NeonI8mm => false,
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

    /// The level `$GGML_RS_ISA` selects for backends whose options name none (`None`
    /// when the variable is unset or empty): see [`Isa::parse_selected`].
    pub fn from_env() -> Result<Option<Isa>, &'static str> {
        Isa::parse_selected(std::env::var("GGML_RS_ISA").ok().as_deref())
    }

    /// A level selected by name (`$GGML_RS_ISA`'s value), checked: an unknown name, or a
    /// level this CPU cannot run, is an error (never a silent fall back to another level).
    pub fn parse_selected(value: Option<&str>) -> Result<Option<Isa>, &'static str> {
        match value.map(str::trim) {
            None | Some("") => Ok(None),
            Some(name) => match Isa::from_name(name) {
                None => Err("GGML_RS_ISA names an unknown level (see ggml_cpu::ALL_ISAS)"),
                Some(isa) if !isa.is_available() => {
                    Err("GGML_RS_ISA names a level this CPU cannot run")
                }
                Some(isa) => Ok(Some(isa)),
            },
        }
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
            Isa::NeonDotprod => "dotprod",
            Isa::NeonI8mm => "i8mm",
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

    /// `$GGML_RS_EXPECT_ISA` (set by `cargo xtask aarch64` per emulated CPU model) is the
    /// best level detected here: detection neither misses a level nor invents one.
    #[test]
    fn expected_best_level_detected() {
        if let Ok(name) = std::env::var("GGML_RS_EXPECT_ISA") {
            let want = Isa::from_name(&name)
                .unwrap_or_else(|| panic!("GGML_RS_EXPECT_ISA: unknown level '{name}'"));
            assert_eq!(Isa::detect(), want, "available: {:?}", Isa::available());
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
    fn selected_levels_are_checked() {
        assert_eq!(Isa::parse_selected(None), Ok(None));
        assert_eq!(Isa::parse_selected(Some(" ")), Ok(None));
        assert!(Isa::parse_selected(Some("avx9")).is_err());
        for isa in ALL_ISAS {
            let r = Isa::parse_selected(Some(isa.name()));
            match isa.is_available() {
                true => assert_eq!(r, Ok(Some(isa))),
                false => assert!(r.is_err(), "{isa}"),
            }
        }
    }

    /// Each level's features imply the lower levels' of its architecture, so the
    /// available levels of an architecture form a prefix of its list.
    #[test]
    fn levels_nest() {
        let chains: [&[Isa]; 2] = [
            &[Isa::Neon, Isa::NeonDotprod, Isa::NeonI8mm],
            &[Isa::Avx2, Isa::Avx512, Isa::Avx512Vnni],
        ];
        for chain in chains {
            for w in chain.windows(2) {
                assert!(!w[1].is_available() || w[0].is_available(), "{w:?}");
            }
        }
    }

    #[test]
    fn detect_is_available() {
        assert!(Isa::detect().is_available());
        assert!(Isa::available().contains(&Isa::Scalar));
        assert_eq!(Isa::available().last(), Some(&Isa::detect()));
    }
}
