//! Guards on modelled claims: where the constants came from, and which kernel families'
//! modelled times no longer match measurements.
//!
//! A [`Calibration`] records the GPU data a set of constants was fitted to (commit,
//! file, date) and, per kernel family, the error the fit left (measured / modelled
//! within `[1 / (1 + e), 1 + e]`). [`check_drift`] compares new measurements with the
//! model: a family whose ratio leaves its calibrated band, or that was never
//! calibrated, has its modelled claims void until the constants are fitted again.

/// The calibrated error of one kernel family.
#[derive(Clone, Debug, PartialEq)]
pub struct FamilyError {
    /// The family (`mul_mat_q4_1`, `flash_attn_ext`, ...).
    pub family: String,
    /// Relative error `e` left by the fit: ratios within `[1/(1+e), 1+e]` agree.
    pub error: f64,
}

/// Where a set of constants came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    /// The GPU (`h200`).
    pub gpu: String,
    /// The commit of the measured data (7 to 40 hex digits).
    pub commit: String,
    /// The file holding the measurements (`harness/reference/cuda-h200.md`).
    pub file: String,
    /// The date of the measurement, `YYYY-MM-DD`.
    pub date: String,
    /// Calibrated error per family.
    pub families: Vec<FamilyError>,
}

/// One family's measured and modelled time, to check against a calibration.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    /// The family.
    pub family: String,
    /// Measured seconds.
    pub measured_s: f64,
    /// Modelled seconds.
    pub modelled_s: f64,
}

/// Whether a family's modelled claims stand.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// The family.
    pub family: String,
    /// measured / modelled (NaN when either is not a positive number).
    pub ratio: f64,
    /// The calibrated error, if the family has one.
    pub allowed: Option<f64>,
    /// True when the family's modelled claims are void.
    pub void: bool,
    /// Why, in words.
    pub reason: String,
}

impl Calibration {
    /// Checks the provenance fields: a hex commit, a file, an ISO date, positive finite
    /// errors. A calibration that fails this cites no usable GPU data.
    pub fn validate(&self) -> Result<(), String> {
        let hex = (7..=40).contains(&self.commit.len())
            && self.commit.chars().all(|c| c.is_ascii_hexdigit());
        if !hex {
            return Err(format!(
                "commit '{}' is not 7 to 40 hex digits",
                self.commit
            ));
        }
        if self.file.trim().is_empty() {
            return Err("no file named".into());
        }
        let d: Vec<&str> = self.date.split('-').collect();
        let date_ok = d.len() == 3
            && [4, 2, 2]
                .iter()
                .zip(&d)
                .all(|(n, p)| p.len() == *n && p.chars().all(|c| c.is_ascii_digit()));
        if !date_ok {
            return Err(format!("date '{}' is not YYYY-MM-DD", self.date));
        }
        for f in &self.families {
            if !(f.error > 0.0 && f.error.is_finite()) {
                return Err(format!("family {}: error {}", f.family, f.error));
            }
        }
        Ok(())
    }

    /// The calibrated error of `family`.
    pub fn error_of(&self, family: &str) -> Option<f64> {
        self.families
            .iter()
            .find(|f| f.family == family)
            .map(|f| f.error)
    }
}

/// The verdict on each observation under `cal` (in the order given). An invalid
/// calibration voids every family.
pub fn check_drift(cal: &Calibration, observed: &[Observation]) -> Vec<Verdict> {
    let invalid = cal.validate().err();
    observed
        .iter()
        .map(|o| {
            let ok = |v: f64| v > 0.0 && v.is_finite();
            let ratio = if ok(o.measured_s) && ok(o.modelled_s) {
                o.measured_s / o.modelled_s
            } else {
                f64::NAN
            };
            let allowed = cal.error_of(&o.family);
            let (void, reason) = if let Some(why) = &invalid {
                (true, format!("calibration invalid: {why}"))
            } else if ratio.is_nan() {
                (
                    true,
                    format!(
                        "measured {} s / modelled {} s is not a ratio",
                        o.measured_s, o.modelled_s
                    ),
                )
            } else if let Some(e) = allowed {
                if ratio.ln().abs() > (1.0 + e).ln() {
                    (
                        true,
                        format!(
                            "measured/modelled {ratio:.3} is outside the calibrated ±{:.1} % \
                             ({} at {})",
                            e * 100.0,
                            cal.file,
                            cal.commit
                        ),
                    )
                } else {
                    (
                        false,
                        format!("measured/modelled {ratio:.3} within ±{:.1} %", e * 100.0),
                    )
                }
            } else {
                (
                    true,
                    format!("not calibrated ({} at {})", cal.file, cal.commit),
                )
            };
            Verdict {
                family: o.family.clone(),
                ratio,
                allowed,
                void,
                reason,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn cal() -> Calibration {
        Calibration {
            gpu: "h200".into(),
            commit: "6b447ba9".into(),
            file: "harness/reference/cuda-h200.md".into(),
            date: "2025-01-31".into(),
            families: vec![
                FamilyError {
                    family: "mul_mat".into(),
                    error: 0.10,
                },
                FamilyError {
                    family: "flash_attn".into(),
                    error: 0.25,
                },
            ],
        }
    }

    fn obs(family: &str, measured: f64, modelled: f64) -> Observation {
        Observation {
            family: family.into(),
            measured_s: measured,
            modelled_s: modelled,
        }
    }

    #[rstest]
    #[case::within("mul_mat", 1.05, false)]
    #[case::at_the_edge_fast("mul_mat", 1.0 / 1.0999, false)]
    #[case::drifted_slow("mul_mat", 1.2, true)]
    #[case::drifted_fast("mul_mat", 0.85, true)]
    #[case::wider_band("flash_attn", 1.2, false)]
    #[case::never_calibrated("rms_norm", 1.0, true)]
    fn drift_beyond_the_calibrated_error_voids(
        #[case] family: &str,
        #[case] ratio: f64,
        #[case] void: bool,
    ) {
        let v = check_drift(&cal(), &[obs(family, ratio * 2e-6, 2e-6)]);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].void, void, "{}", v[0].reason);
        assert!((v[0].ratio - ratio).abs() < 1e-9);
    }

    #[test]
    fn bad_numbers_and_bad_provenance_void() {
        assert!(check_drift(&cal(), &[obs("mul_mat", 0.0, 1.0)])[0].void);
        assert!(check_drift(&cal(), &[obs("mul_mat", 1.0, f64::INFINITY)])[0].void);
        for bad in [
            Calibration {
                commit: "main".into(),
                ..cal()
            },
            Calibration {
                date: "31.1.2025".into(),
                ..cal()
            },
            Calibration {
                file: " ".into(),
                ..cal()
            },
        ] {
            assert!(bad.validate().is_err());
            let v = check_drift(&bad, &[obs("mul_mat", 1.0, 1.0)]);
            assert!(v[0].void && v[0].reason.starts_with("calibration invalid"));
        }
        assert!(cal().validate().is_ok());
    }
}
