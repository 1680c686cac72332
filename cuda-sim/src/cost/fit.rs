//! Fitting the tunable constants to measured times, and the error of every row.
//!
//! A row is a set of launches with known counters (an op's calls in a pass, say) and
//! the time measured for all of them. The fit minimises the sum over the rows marked
//! `fit` of `ln(measured / modelled)²` (least squares on the log ratio, so a row 2×
//! too slow weighs as much as one 2× too fast) by a coordinate search over the chosen
//! tunables: each in turn is scaled by the factor in [1/8, 8] that minimises the sum
//! (golden-section search on the log of the factor), for a few rounds. It is
//! deterministic. `dram_efficiency` is kept at most 1 (a kernel cannot beat the peak).

use super::spec::{GpuSpec, Tunable};
use super::{predict, CostError, KernelResources, LaunchKind, Term};
use crate::profile::LaunchCounters;

/// One launch of a row.
#[derive(Clone, Debug, PartialEq)]
pub struct FitLaunch {
    /// Its counters (DRAM traffic from the L2 model, preferably).
    pub counters: LaunchCounters,
    /// The kernel's `ptxas -v` resources on the GPU's architecture, if known.
    pub resources: Option<KernelResources>,
    /// How it was launched.
    pub launch: LaunchKind,
}

/// Launches and the time measured for all of them together.
#[derive(Clone, Debug, PartialEq)]
pub struct FitRow {
    /// What it is (`MUL_MAT q4_1 pp512`).
    pub name: String,
    /// The launches.
    pub launches: Vec<FitLaunch>,
    /// Measured seconds for all of them.
    pub measured_s: f64,
    /// Whether the fit uses it (rows not fitted are still reported).
    pub fit: bool,
}

/// A row's measured and modelled time.
#[derive(Clone, Debug, PartialEq)]
pub struct RowError {
    /// The row's name.
    pub name: String,
    /// Measured seconds.
    pub measured_s: f64,
    /// Modelled seconds.
    pub modelled_s: f64,
    /// measured / modelled.
    pub ratio: f64,
    /// Whether the fit used the row.
    pub fitted: bool,
    /// The term that bound most of the row's modelled time.
    pub bound: Term,
}

/// A fitted GPU and the error of every row under it.
#[derive(Clone, Debug, PartialEq)]
pub struct FitReport {
    /// The GPU with fitted tunables.
    pub spec: GpuSpec,
    /// Every row, fitted or not.
    pub rows: Vec<RowError>,
    /// Root mean square of `ln(ratio)` over the fitted rows.
    pub rms_log_error: f64,
}

/// Measured against modelled for every row under `spec`.
pub fn evaluate(spec: &GpuSpec, rows: &[FitRow]) -> Result<Vec<RowError>, CostError> {
    rows.iter()
        .map(|r| {
            if !(r.measured_s > 0.0 && r.measured_s.is_finite()) {
                return Err(CostError::new(format!(
                    "row {}: measured time {} s",
                    r.name, r.measured_s
                )));
            }
            if r.launches.is_empty() {
                return Err(CostError::new(format!("row {} has no launch", r.name)));
            }
            let mut total = 0.0;
            let mut by_bound: Vec<(Term, f64)> = Vec::new();
            for l in &r.launches {
                let p = predict(spec, &l.counters, l.resources.as_ref(), l.launch)?;
                total += p.time_s;
                match by_bound.iter_mut().find(|(t, _)| *t == p.bound) {
                    Some((_, s)) => *s += p.time_s,
                    None => by_bound.push((p.bound, p.time_s)),
                }
            }
            let bound = by_bound
                .iter()
                .fold((Term::Launch, f64::MIN), |best, &(t, s)| {
                    if s > best.1 {
                        (t, s)
                    } else {
                        best
                    }
                })
                .0;
            Ok(RowError {
                name: r.name.clone(),
                measured_s: r.measured_s,
                modelled_s: total,
                ratio: r.measured_s / total,
                fitted: r.fit,
                bound,
            })
        })
        .collect()
}

fn objective(spec: &GpuSpec, rows: &[FitRow]) -> Result<f64, CostError> {
    Ok(evaluate(spec, rows)?
        .iter()
        .filter(|e| e.fitted)
        .map(|e| e.ratio.ln().powi(2))
        .sum())
}

fn with(spec: &GpuSpec, t: Tunable, v: f64) -> GpuSpec {
    let mut s = spec.clone();
    let v = if t == Tunable::DramEfficiency {
        v.min(1.0)
    } else {
        v
    };
    s.tunables.set(t, v);
    s
}

/// Fits `tunables` of `spec` to the rows marked `fit` (see the module docs); reports
/// every row's error under the result.
pub fn fit(spec: &GpuSpec, rows: &[FitRow], tunables: &[Tunable]) -> Result<FitReport, CostError> {
    if !rows.iter().any(|r| r.fit) {
        return Err(CostError::new("no row is marked for fitting"));
    }
    let mut best = spec.clone();
    let mut best_err = objective(&best, rows)?;
    let golden = (5f64.sqrt() - 1.0) / 2.0;
    for _round in 0..6 {
        for &t in tunables {
            let base = best.tunables.get(t);
            if base <= 0.0 {
                // A zero constant has no scale to search; leave it.
                continue;
            }
            let eval = |x: f64| objective(&with(&best, t, base * x.exp()), rows);
            let (mut lo, mut hi) = (-(8f64.ln()), 8f64.ln());
            let mut x1 = hi - golden * (hi - lo);
            let mut x2 = lo + golden * (hi - lo);
            let (mut f1, mut f2) = (eval(x1)?, eval(x2)?);
            for _ in 0..40 {
                if f1 <= f2 {
                    hi = x2;
                    x2 = x1;
                    f2 = f1;
                    x1 = hi - golden * (hi - lo);
                    f1 = eval(x1)?;
                } else {
                    lo = x1;
                    x1 = x2;
                    f1 = f2;
                    x2 = lo + golden * (hi - lo);
                    f2 = eval(x2)?;
                }
            }
            let x = (lo + hi) / 2.0;
            let candidate = with(&best, t, base * x.exp());
            let err = objective(&candidate, rows)?;
            if err < best_err {
                best = candidate;
                best_err = err;
            }
        }
    }
    let errors = evaluate(&best, rows)?;
    let fitted = errors.iter().filter(|e| e.fitted).count() as f64;
    Ok(FitReport {
        spec: best,
        rms_log_error: (best_err / fitted).sqrt(),
        rows: errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{DramTraffic, GlobalTraffic, InstrClass, PathCounts};

    fn kernel(n: u64, global_hops: u64) -> LaunchCounters {
        let warps = n / 32;
        let mut c = LaunchCounters {
            grid: [(n / 256).max(1) as u32, 1, 1],
            block: [256, 1, 1],
            blocks: (n / 256).max(1),
            blocks_interpreted: (n / 256).max(1),
            warp_instructions: 4 * warps,
            thread_instructions: 4 * n,
            global_load: GlobalTraffic {
                requests: warps,
                sectors: n / 8,
                lines: n / 32,
            },
            dram: Some(DramTraffic {
                read_sectors: n / 8,
                write_sectors: 0,
            }),
            critical_path: PathCounts {
                issue: 4,
                global: global_hops,
                ..Default::default()
            },
            ..Default::default()
        };
        c.classes.0[InstrClass::IntAlu.index()] = 4 * warps;
        c
    }

    fn row(
        spec: &GpuSpec,
        name: &str,
        c: LaunchCounters,
        kind: LaunchKind,
        calls: usize,
    ) -> FitRow {
        let launches = vec![
            FitLaunch {
                counters: c,
                resources: None,
                launch: kind,
            };
            calls
        ];
        let measured = launches
            .iter()
            .map(|l| predict(spec, &l.counters, None, l.launch).unwrap().time_s)
            .sum();
        FitRow {
            name: name.into(),
            launches,
            measured_s: measured,
            fit: true,
        }
    }

    #[test]
    fn recovers_known_constants_from_synthetic_measurements() {
        let mut truth = GpuSpec::h200();
        truth.tunables.dram_efficiency = 0.8;
        truth.tunables.launch_stream_s = 3.0e-6;
        truth.tunables.global_latency = 900.0;
        let rows = vec![
            // Streaming rows with a short path (many loads in flight per warp), so
            // that DRAM bounds them rather than latency per wave.
            row(
                &truth,
                "stream big",
                kernel(1 << 26, 0),
                LaunchKind::GraphNode,
                3,
            ),
            row(
                &truth,
                "stream mid",
                kernel(1 << 22, 0),
                LaunchKind::GraphNode,
                5,
            ),
            row(
                &truth,
                "tiny on stream",
                kernel(256, 1),
                LaunchKind::Stream,
                100,
            ),
            row(&truth, "chain", kernel(256, 40), LaunchKind::GraphNode, 10),
        ];
        let start = GpuSpec::h200();
        let before = evaluate(&start, &rows).unwrap();
        assert!(before.iter().any(|e| (e.ratio - 1.0).abs() > 0.1));
        let report = fit(
            &start,
            &rows,
            &[
                Tunable::DramEfficiency,
                Tunable::LaunchStream,
                Tunable::GlobalLatency,
            ],
        )
        .unwrap();
        let t = report.spec.tunables;
        assert!((t.dram_efficiency - 0.8).abs() < 0.01, "{t:?}");
        assert!((t.launch_stream_s - 3.0e-6).abs() < 0.05e-6, "{t:?}");
        assert!((t.global_latency - 900.0).abs() < 15.0, "{t:?}");
        for e in &report.rows {
            assert!((e.ratio - 1.0).abs() < 0.02, "{e:?}");
        }
        assert!(report.rms_log_error < 0.01);
        assert_eq!(report.rows[0].bound, Term::Dram);
        assert_eq!(report.rows[2].bound, Term::Launch);
        assert_eq!(report.rows[3].bound, Term::Latency);
    }

    #[test]
    fn rows_not_fitted_are_reported_and_bad_rows_rejected() {
        let spec = GpuSpec::h100_sxm();
        let mut r = row(&spec, "a", kernel(1 << 20, 1), LaunchKind::Stream, 1);
        r.fit = false;
        assert!(fit(&spec, std::slice::from_ref(&r), &Tunable::ALL).is_err());
        let e = evaluate(&spec, std::slice::from_ref(&r)).unwrap();
        assert_eq!(e.len(), 1);
        assert!(!e[0].fitted);
        assert!((e[0].ratio - 1.0).abs() < 1e-12);
        r.measured_s = 0.0;
        assert!(evaluate(&spec, &[r]).is_err());
    }
}
