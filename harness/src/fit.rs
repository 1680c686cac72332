//! `ggml-harness fit-cost-model`: the cost model's constants fitted to what a GPU
//! measured, and the error of every row, fitted or not.
//!
//! What was measured comes in one of two forms:
//! - a calibration folder (`ggml-harness calibrate` on the GPU): `probes.json` sets the
//!   constants a probe measures directly (DRAM efficiency, DRAM latency, L2 bandwidth,
//!   the graph-node launch cost where there is such a probe), then `kernels.json`'s
//!   per-launch times (each kernel alone: warm for the prompt pass, L2 flushed for the
//!   generated token, whose weights come from DRAM in a real pass) are summed per pass
//!   and op into the rows the remaining constants are fitted to;
//! - a per-op table (`pass op calls ms`, tab-separated, `#` comments), such as the op
//!   times `bench --op-times` printed on an H200 (harness/reference/cuda-h200-op-times.tsv).
//!
//! The same passes are profiled on cuda-sim ([`crate::profile`]) with the same kernels
//! (`--cuda-tuning` must be what the GPU ran) and joined with the measured rows. A
//! `bench --json` output of the same run ([`read_bench`]) is the end-to-end check the
//! per-kernel rows cannot give: its pp512 and tg128 against the passes priced before and
//! after the fit ([`end_to_end`]), kernels together in a replayed graph, overlaps
//! included.

use std::collections::BTreeMap;
use std::path::Path;

use ggml_cuda::cuda_sim::cost::{self, FitLaunch, FitReport, FitRow, GpuSpec, LaunchKind, Tunable};
use serde_json::{json, Value};

use crate::error::{HarnessError, Result};
use crate::profile::ProfiledLaunch;

/// One measured row: the summed time of an op's launches in a pass.
#[derive(Clone, Debug, PartialEq)]
pub struct MeasuredRow {
    /// `pp512`, `tg`.
    pub pass: String,
    /// `MUL_MAT q4_1`, `ADD`.
    pub op: String,
    /// Nodes (op timing) or launches (calibration) measured.
    pub calls: usize,
    /// Milliseconds for all of them.
    pub ms: f64,
}

fn io_err(path: &Path, source: std::io::Error) -> HarnessError {
    HarnessError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn bad(path: &Path, line: usize, why: impl std::fmt::Display) -> HarnessError {
    HarnessError::Usage(format!("{}:{line}: {why}", path.display()))
}

/// Reads a per-op table: `pass<TAB>op<TAB>calls<TAB>ms` per line, `#` comments.
pub fn read_op_table(path: &Path) -> Result<Vec<MeasuredRow>> {
    let text = std::fs::read_to_string(path).map_err(|e| io_err(path, e))?;
    parse_op_table(&text).map_err(|(line, why)| bad(path, line, why))
}

/// [`read_op_table`] of a text; errors are (1-based line, why).
pub fn parse_op_table(text: &str) -> std::result::Result<Vec<MeasuredRow>, (usize, String)> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        let [pass, op, calls, ms] = f.as_slice() else {
            return Err((
                i + 1,
                format!("expected 4 tab-separated fields, found {}", f.len()),
            ));
        };
        let calls = calls
            .parse()
            .map_err(|_| (i + 1, format!("calls '{calls}' is not a count")))?;
        let ms: f64 = ms
            .parse()
            .ok()
            .filter(|m: &f64| m.is_finite() && *m > 0.0)
            .ok_or_else(|| (i + 1, format!("ms '{ms}' is not a positive number")))?;
        rows.push(MeasuredRow {
            pass: pass.to_string(),
            op: op.to_string(),
            calls,
            ms,
        });
    }
    if rows.is_empty() {
        return Err((0, "no rows".into()));
    }
    Ok(rows)
}

/// `kernels.json`'s launches summed per pass and op: the prompt pass warm, the
/// generated token cold (see the module docs). Launches are checked against the
/// profile's: the same count and kernels in each pass, or the error says where they part.
pub fn rows_from_kernels(path: &Path, launches: &[ProfiledLaunch]) -> Result<Vec<MeasuredRow>> {
    let text = std::fs::read_to_string(path).map_err(|e| io_err(path, e))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| bad(path, e.line(), e))?;
    let rows = v["launches"]
        .as_array()
        .ok_or_else(|| bad(path, 0, "no \"launches\" array"))?;
    let mut sums: BTreeMap<(String, String), (usize, f64)> = BTreeMap::new();
    let mut per_pass: BTreeMap<String, usize> = BTreeMap::new();
    for r in rows {
        let pass = r["pass"].as_str().unwrap_or("?").to_string();
        let index = r["index"].as_u64().unwrap_or(u64::MAX) as usize;
        let kernel = r["kernel"].as_str().unwrap_or("?");
        let op = match r["weights"].as_str() {
            Some(w) => format!("{} {w}", r["op"].as_str().unwrap_or("?")),
            None => r["op"].as_str().unwrap_or("?").to_string(),
        };
        let prof_pass = if pass.starts_with("pp") {
            pass.clone()
        } else {
            "tg".into()
        };
        let Some(p) = launches
            .iter()
            .find(|l| l.pass == prof_pass && l.index == index && l.device == 0)
        else {
            return Err(bad(
                path,
                0,
                format!("{pass} launch {index} ({kernel}) is not in the profile"),
            ));
        };
        if p.kernel.entry().1 != kernel {
            return Err(bad(
                path,
                0,
                format!(
                    "{pass} launch {index}: measured {kernel}, profiled {} (another commit or --cuda-tuning?)",
                    p.kernel.entry().1
                ),
            ));
        }
        let us = if pass.starts_with("pp") {
            r["warm_us"].as_f64()
        } else {
            r["cold_us"].as_f64().or(r["warm_us"].as_f64())
        }
        .ok_or_else(|| bad(path, 0, format!("{pass} launch {index} has no time")))?;
        let e = sums.entry((prof_pass.clone(), op)).or_default();
        e.0 += 1;
        e.1 += us * 1e-3;
        *per_pass.entry(prof_pass).or_default() += 1;
    }
    for (pass, n) in &per_pass {
        let profiled = launches
            .iter()
            .filter(|l| &l.pass == pass && l.device == 0)
            .count();
        if *n != profiled {
            return Err(bad(
                path,
                0,
                format!("{pass}: {n} launches measured, {profiled} profiled"),
            ));
        }
    }
    Ok(sums
        .into_iter()
        .map(|((pass, op), (calls, ms))| MeasuredRow {
            pass,
            op,
            calls,
            ms,
        })
        .collect())
}

/// The constants `probes.json` measures directly, set in `spec`; one line per constant
/// set, saying from which probe.
pub fn apply_probes(spec: &mut GpuSpec, path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|e| io_err(path, e))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| bad(path, e.line(), e))?;
    let probe = |name: &str| -> Option<(f64, f64)> {
        v["probes"]
            .as_array()?
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| Some((p["work"].as_f64()?, p["seconds"].as_f64()?)))
    };
    let clock = spec.arch.clock_hz;
    let mut notes = Vec::new();
    if let Some((bytes, s)) = probe("dram_read") {
        let eff = (bytes / s / spec.arch.dram_bytes_per_s).min(1.0);
        spec.tunables.set(Tunable::DramEfficiency, eff);
        notes.push(format!(
            "dram_efficiency {eff:.3} from dram_read ({:.0} GB/s)",
            bytes / s / 1e9
        ));
    }
    if let Some((bytes, s)) = probe("l2_read") {
        let per_clk = bytes / s / clock;
        spec.tunables.set(Tunable::L2BytesPerClk, per_clk);
        notes.push(format!("l2_bytes_per_clk {per_clk:.0} from l2_read"));
    }
    if let Some((loads, s)) = probe("dram_latency") {
        let cycles = s / loads * clock;
        spec.tunables.set(Tunable::GlobalLatency, cycles);
        notes.push(format!(
            "global_latency {cycles:.0} cycles from dram_latency ({:.0} ns)",
            s / loads * 1e9
        ));
    }
    if let Some((n, s)) = probe("launch_graph_node") {
        spec.tunables.set(Tunable::LaunchGraphNode, s / n);
        notes.push(format!(
            "launch_graph_node {:.2} us from launch_graph_node",
            s / n * 1e6
        ));
    }
    // Not a constant of the model: what a dependency would cost kept inside one kernel,
    // for weighing a persistent decode kernel against a kernel boundary.
    if let (Some((blocks, chain)), Some((_, base))) =
        (probe("handoff_chain"), probe("handoff_base"))
    {
        if blocks > 1.0 {
            notes.push(format!(
                "block hand-off {:.2} us from handoff_chain - handoff_base over {} hand-offs (not fitted)",
                (chain - base) / (blocks - 1.0) * 1e6,
                blocks - 1.0
            ));
        }
    }
    Ok(notes)
}

/// Joins measured rows with the profile's launches: one [`FitRow`] per measured row,
/// fitted when its pass is in `fit_passes`. Measured ops the profile lacks are an error;
/// profiled ops nobody measured are left out.
pub fn fit_rows(
    launches: &[ProfiledLaunch],
    measured: &[MeasuredRow],
    fit_passes: &[String],
    launch: LaunchKind,
) -> Result<Vec<FitRow>> {
    measured
        .iter()
        .map(|m| {
            let ls: Vec<FitLaunch> = launches
                .iter()
                .filter(|l| l.pass == m.pass && l.op_name() == m.op)
                .map(|l| FitLaunch {
                    counters: l.counters.clone(),
                    resources: l.resources,
                    launch,
                })
                .collect();
            if ls.is_empty() {
                return Err(HarnessError::Usage(format!(
                    "measured {} in {} has no launch in the profile (passes profiled: {})",
                    m.op,
                    m.pass,
                    launches
                        .iter()
                        .map(|l| l.pass.as_str())
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            Ok(FitRow {
                name: format!("{} {}", m.pass, m.op),
                launches: ls,
                measured_s: m.ms * 1e-3,
                fit: fit_passes.contains(&m.pass),
            })
        })
        .collect()
}

/// The fit as a Markdown report: every row before and after, and the constants; then
/// `committed` (the GPU's constants as checked in, before any probe set one) against the
/// rows, family by family.
pub fn report(
    committed: &GpuSpec,
    before: &GpuSpec,
    rows: &[FitRow],
    fitted: &FitReport,
    notes: &[String],
) -> Result<String> {
    let pre = cost::evaluate(before, rows).map_err(|e| HarnessError::Model(e.to_string()))?;
    let mut s = String::from(
        "| row | fitted | measured ms | modelled ms before | modelled ms after | measured/modelled after | bound after |\n|---|---|---|---|---|---|---|\n",
    );
    for (b, a) in pre.iter().zip(&fitted.rows) {
        s.push_str(&format!(
            "| {} | {} | {:.3} | {:.3} | {:.3} | {:.2} | {} |\n",
            a.name,
            if a.fitted { "yes" } else { "no" },
            a.measured_s * 1e3,
            b.modelled_s * 1e3,
            a.modelled_s * 1e3,
            a.ratio,
            a.bound.name()
        ));
    }
    s.push_str(&format!(
        "\nrms of ln(measured/modelled) over the fitted rows: {:.3}\n\n| constant | before | after |\n|---|---|---|\n",
        fitted.rms_log_error
    ));
    for t in Tunable::ALL {
        s.push_str(&format!(
            "| {t:?} | {:.4e} | {:.4e} |\n",
            before.tunables.get(t),
            fitted.spec.tunables.get(t)
        ));
    }
    for n in notes {
        s.push_str(&format!("\nset from a probe: {n}"));
    }
    s.push('\n');
    // The committed constants as they are: a probe's value (the graph-node cost of an
    // empty kernel, say) is not what they were fitted with.
    let committed_rows =
        cost::evaluate(committed, rows).map_err(|e| HarnessError::Model(e.to_string()))?;
    s.push_str(&guard_table(committed, &committed_rows));
    Ok(s)
}

/// The committed constants against these measurements, family by family: a family
/// outside the band its calibration left, or never calibrated, has its modelled claims
/// void until the constants are fitted again.
fn guard_table(before: &GpuSpec, pre: &[cost::RowError]) -> String {
    let Some(cal) = before.calibration() else {
        return format!(
            "\nno calibration for {}: every modelled claim for it is uncalibrated\n",
            before.name
        );
    };
    let observed: Vec<cost::Observation> = pre
        .iter()
        .map(|r| cost::Observation {
            family: r.name.clone(),
            measured_s: r.measured_s,
            modelled_s: r.modelled_s,
        })
        .collect();
    let mut s = format!(
        "\nthe committed constants ({} at {}, {}) against this data:\n\n| family | measured/modelled | calibrated band | modelled claims |\n|---|---|---|---|\n",
        cal.gpu, cal.commit, cal.file
    );
    for v in cost::check_drift(&cal, &observed) {
        let band = v.allowed.map_or("none".to_string(), |e| {
            format!("{:.2}..{:.2}", 1.0 / (1.0 + e), 1.0 + e)
        });
        s.push_str(&format!(
            "| {} | {:.2} | {band} | {} |\n",
            v.family,
            v.ratio,
            if v.void { "void" } else { "stand" }
        ));
    }
    s
}

/// One end-to-end figure of a `ggml-harness bench --json` run: a test (`pp512`, `tg128`)
/// and the tokens per second it measured.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchFigure {
    /// `pp512`, `tg128`.
    pub test: String,
    /// Mean tokens per second.
    pub tps: f64,
}

/// The figures of a `ggml-harness bench --json` output and the `--cuda-tuning` it ran
/// with (`None` for an output written before bench recorded it).
pub fn read_bench(path: &Path) -> Result<(Option<String>, Vec<BenchFigure>)> {
    let text = std::fs::read_to_string(path).map_err(|e| io_err(path, e))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| bad(path, e.line(), e))?;
    let results = v["results"].as_array().ok_or_else(|| {
        bad(
            path,
            0,
            "no \"results\" array (not a `bench --json` output?)",
        )
    })?;
    let figures = results
        .iter()
        .map(|r| match (r["test"].as_str(), r["tps_mean"].as_f64()) {
            (Some(test), Some(tps)) if tps > 0.0 => Ok(BenchFigure {
                test: test.to_string(),
                tps,
            }),
            _ => Err(bad(
                path,
                0,
                format!("a result without test and tps_mean: {r}"),
            )),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((v["cuda_tuning"].as_str().map(str::to_string), figures))
}

/// The modelled seconds of bench test `test` (`pp512`: the `pp512` pass; `tgN`: the
/// profiled token, `tg`) in `launches`, `None` for a test the profile has no pass for.
fn test_seconds(launches: &[ProfiledLaunch], test: &str) -> Option<(f64, f64)> {
    let (pass, tokens) = match test.strip_prefix("pp") {
        Some(n) => (test.to_string(), n.parse::<f64>().ok()?),
        None if test.starts_with("tg") => ("tg".to_string(), 1.0),
        None => return None,
    };
    let s = crate::profile::pass_seconds(launches, &pass);
    (s > 0.0).then_some((s, tokens))
}

/// One bench test measured and modelled before and after a fit.
#[derive(Clone, Debug, PartialEq)]
pub struct EndToEnd {
    /// `pp512`, `tg128`.
    pub test: String,
    /// Measured tokens per second.
    pub measured_tps: f64,
    /// Modelled under the constants before the fit (`None`: no such pass profiled).
    pub before_tps: Option<f64>,
    /// Modelled under the fitted constants.
    pub after_tps: Option<f64>,
}

/// Each of `bench`'s tests against the same pass of `before` and `after` (the profiled
/// launches priced with the constants before and after a fit). A generated token is
/// modelled at the profile's position (0), where bench's tg128 averages positions 0..127.
pub fn end_to_end(
    before: &[ProfiledLaunch],
    after: &[ProfiledLaunch],
    bench: &[BenchFigure],
) -> Vec<EndToEnd> {
    let tps = |ls: &[ProfiledLaunch], test: &str| test_seconds(ls, test).map(|(s, n)| n / s);
    bench
        .iter()
        .map(|f| EndToEnd {
            test: f.test.clone(),
            measured_tps: f.tps,
            before_tps: tps(before, &f.test),
            after_tps: tps(after, &f.test),
        })
        .collect()
}

/// [`end_to_end`]'s rows of one pricing (its `after` side) as a Markdown table: each bench
/// figure beside the same test modelled (measured over modelled as a ratio of times: above
/// 1, the GPU was slower than the model).
pub fn measured_against_modelled_table(rows: &[EndToEnd]) -> String {
    let mut s = String::from(
        "| bench test | measured t/s | modelled t/s | measured/modelled time |\n|---|---|---|---|\n",
    );
    for r in rows {
        match r.after_tps {
            Some(m) => s.push_str(&format!(
                "| {} | {:.1} | {m:.1} | {:.3} |\n",
                r.test,
                r.measured_tps,
                m / r.measured_tps
            )),
            None => s.push_str(&format!(
                "| {} | {:.1} | not profiled | |\n",
                r.test, r.measured_tps
            )),
        }
    }
    s
}

/// [`measured_against_modelled_table`]'s rows as JSON: `test`, `measured_tps`,
/// `modelled_tps` (null: not profiled).
pub fn measured_against_modelled_json(rows: &[EndToEnd]) -> Value {
    json!(rows
        .iter()
        .map(|r| json!({
            "test": r.test,
            "measured_tps": r.measured_tps,
            "modelled_tps": r.after_tps,
        }))
        .collect::<Vec<_>>())
}

/// [`end_to_end`]'s rows as a Markdown table (measured over modelled as a ratio of times:
/// above 1, the GPU was slower than the model).
pub fn end_to_end_table(rows: &[EndToEnd]) -> String {
    let mut s = String::from(
        "| bench test | measured t/s | modelled t/s before | modelled t/s after | measured/modelled time after |\n|---|---|---|---|---|\n",
    );
    let cell = |x: Option<f64>| x.map_or("not profiled".to_string(), |v| format!("{v:.1}"));
    for r in rows {
        let ratio = r
            .after_tps
            .map_or(String::new(), |a| format!("{:.2}", a / r.measured_tps));
        s.push_str(&format!(
            "| {} | {:.1} | {} | {} | {ratio} |\n",
            r.test,
            r.measured_tps,
            cell(r.before_tps),
            cell(r.after_tps)
        ));
    }
    s
}

/// [`end_to_end`]'s rows as JSON (the `end_to_end` array of a fit's JSON report).
pub fn end_to_end_json(rows: &[EndToEnd]) -> Value {
    json!(rows
        .iter()
        .map(|r| json!({
            "test": r.test,
            "measured_tps": r.measured_tps,
            "modelled_tps_before": r.before_tps,
            "modelled_tps_after": r.after_tps,
        }))
        .collect::<Vec<_>>())
}

/// The fit as JSON.
pub fn report_json(before: &GpuSpec, fitted: &FitReport, notes: &[String], run: Value) -> Value {
    json!({
        "gpu": fitted.spec.name,
        "rms_log_error": fitted.rms_log_error,
        "constants": Tunable::ALL.iter().map(|t| json!({
            "name": format!("{t:?}"),
            "before": before.tunables.get(*t),
            "after": fitted.spec.tunables.get(*t),
        })).collect::<Vec<_>>(),
        "rows": fitted.rows.iter().map(|r| json!({
            "name": r.name,
            "fitted": r.fitted,
            "measured_ms": r.measured_s * 1e3,
            "modelled_ms": r.modelled_s * 1e3,
            "ratio": r.ratio,
            "bound": r.bound.name(),
        })).collect::<Vec<_>>(),
        "probes": notes,
        "run": run,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The guard table prices the committed constants as they are, not with the probes'
    /// values the fit starts from: an empty kernel timed at the committed graph-node cost
    /// stands, however far the probe's empty-kernel cost is from it.
    #[test]
    fn the_guard_prices_the_committed_constants_not_the_probes() {
        let committed = GpuSpec::h200();
        let mut probed = committed.clone();
        probed.tunables.launch_graph_node_s = committed.tunables.launch_graph_node_s / 6.0;
        let launch = FitLaunch {
            counters: Default::default(),
            resources: None,
            launch: LaunchKind::GraphNode,
        };
        let measured = cost::predict(&committed, &launch.counters, None, launch.launch)
            .unwrap()
            .time_s;
        let rows = vec![FitRow {
            name: "tg UPLOAD_SCATTER".into(),
            launches: vec![launch],
            measured_s: measured,
            fit: true,
        }];
        let fitted = cost::fit(&probed, &rows, &[Tunable::AluLatency]).unwrap();
        let report = report(&committed, &probed, &rows, &fitted, &[]).unwrap();
        let line = report
            .lines()
            .find(|l| l.starts_with("| tg UPLOAD_SCATTER | 1.00 |"))
            .unwrap_or_else(|| panic!("no guard row at 1.00:\n{report}"));
        assert!(line.ends_with("| stand |"), "{line}");
    }

    /// The hand-off probes give a note (not a constant): the chain's extra time over the
    /// unchained blocks, per hand-off; the graph-node constant still comes from its probe.
    #[test]
    fn the_block_hand_off_is_the_chain_over_the_base_per_hand_off() {
        let dir = std::env::temp_dir().join(format!("fit-handoff-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("probes.json");
        std::fs::write(
            &path,
            r#"{"probes": [
                {"name": "launch_graph_node", "work": 100, "seconds": 3.0e-4},
                {"name": "handoff_chain", "work": 1025, "seconds": 1.034e-3},
                {"name": "handoff_base", "work": 1025, "seconds": 2.0e-6}
            ]}"#,
        )
        .unwrap();
        let mut spec = GpuSpec::h200();
        let notes = apply_probes(&mut spec, &path).unwrap();
        assert!((spec.tunables.launch_graph_node_s - 3.0e-6).abs() < 1e-12);
        let line = notes
            .iter()
            .find(|n| n.starts_with("block hand-off"))
            .unwrap_or_else(|| panic!("no hand-off note in {notes:?}"));
        assert!(line.starts_with("block hand-off 1.01 us"), "{line}");
        assert!(line.contains("over 1024 hand-offs"), "{line}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The H200 kit's bench of its default tuning (written before bench recorded the
    /// tuning), and what a file that is no bench output says.
    #[test]
    fn bench_figures_are_read_from_a_kit_run() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let (tuning, figures) =
            read_bench(&root.join("reference/cuda-h200-938b0ae/tuning-default.json")).unwrap();
        assert_eq!(tuning, None);
        let tests: Vec<&str> = figures.iter().map(|f| f.test.as_str()).collect();
        assert_eq!(tests, ["pp512", "tg128"]);
        assert!(
            (figures[1].tps - 722.165).abs() < 1e-3,
            "{}",
            figures[1].tps
        );
        let dir = std::env::temp_dir().join(format!("fit-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_bench = dir.join("probes.json");
        std::fs::write(&not_bench, r#"{"probes": []}"#).unwrap();
        let e = read_bench(&not_bench).unwrap_err().to_string();
        assert!(e.contains("results"), "{e}");
        let tuned = dir.join("tuned.json");
        std::fs::write(
            &tuned,
            r#"{"cuda_tuning": "no-pdl", "results": [{"test": "tg128", "tps_mean": 500.0}]}"#,
        )
        .unwrap();
        assert_eq!(read_bench(&tuned).unwrap().0.as_deref(), Some("no-pdl"));
        std::fs::write(&tuned, r#"{"results": [{"test": "tg128"}]}"#).unwrap();
        assert!(read_bench(&tuned).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_end_to_end_table_gives_measured_over_modelled_time() {
        let rows = [
            EndToEnd {
                test: "tg128".into(),
                measured_tps: 727.0,
                before_tps: Some(670.0),
                after_tps: Some(754.0),
            },
            EndToEnd {
                test: "pp512".into(),
                measured_tps: 12206.0,
                before_tps: None,
                after_tps: None,
            },
        ];
        let t = end_to_end_table(&rows);
        assert!(
            t.contains("| tg128 | 727.0 | 670.0 | 754.0 | 1.04 |"),
            "{t}"
        );
        assert!(
            t.contains("| pp512 | 12206.0 | not profiled | not profiled |  |"),
            "{t}"
        );
    }

    #[test]
    fn measured_against_modelled_gives_the_ratio_of_times() {
        let rows = [
            EndToEnd {
                test: "tg128".into(),
                measured_tps: 1021.6,
                before_tps: None,
                after_tps: Some(1032.0),
            },
            EndToEnd {
                test: "pp512".into(),
                measured_tps: 90438.6,
                before_tps: None,
                after_tps: None,
            },
        ];
        let t = measured_against_modelled_table(&rows);
        assert!(t.contains("| tg128 | 1021.6 | 1032.0 | 1.010 |"), "{t}");
        assert!(t.contains("| pp512 | 90438.6 | not profiled | |"), "{t}");
        let j = measured_against_modelled_json(&rows);
        assert_eq!(j[0]["modelled_tps"], 1032.0);
        assert!(j[1]["modelled_tps"].is_null());
    }

    /// Each committed calibration is the fit it cites: every fitted family of that fit's
    /// report stands, every family drifted past its bound by 1.5x is void, and a family
    /// the fit did not see is void.
    #[rstest::rstest]
    #[case::h100(GpuSpec::h100_sxm(), "reference/cuda-h100-a5a7363/fit-h100-3.json")]
    #[case::h200(GpuSpec::h200(), "reference/cuda-h200-0aadbf6/fit-h200.json")]
    fn each_calibration_matches_the_fit_it_cites(#[case] spec: GpuSpec, #[case] file: &str) {
        let cal = spec.calibration().expect("calibrated");
        // The calibration cites the fit's text report; its JSON lies beside it.
        assert_eq!(
            cal.file.trim_end_matches(".txt"),
            format!("harness/{}", file.trim_end_matches(".json"))
        );
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let fit: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(fit["gpu"].as_str(), Some(spec.name));
        let rows = fit["rows"].as_array().unwrap();
        let obs = |scale: f64| -> Vec<cost::Observation> {
            rows.iter()
                .filter(|r| r["fitted"].as_bool().unwrap())
                .map(|r| cost::Observation {
                    family: r["name"].as_str().unwrap().to_string(),
                    measured_s: r["measured_ms"].as_f64().unwrap() * scale,
                    modelled_s: r["modelled_ms"].as_f64().unwrap(),
                })
                .collect()
        };
        let fitted = obs(1.0);
        assert_eq!(fitted.len(), cal.families.len());
        for v in cost::check_drift(&cal, &fitted) {
            assert!(!v.void, "{v:?}");
        }
        let widest = cal.families.iter().map(|f| f.error).fold(0.0, f64::max);
        let drifted = cost::check_drift(&cal, &obs(1.5 * (1.0 + widest).powi(2)));
        assert!(drifted.iter().all(|v| v.void), "{drifted:?}");
        let unseen = cost::Observation {
            family: "tg MUL_MAT q6_K".into(),
            measured_s: 1.0,
            modelled_s: 1.0,
        };
        assert!(cost::check_drift(&cal, &[unseen])[0].void);
    }

    #[test]
    fn op_tables_are_read_and_checked() {
        let t = "# comment\npp512\tMUL_MAT q4_1\t210\t14.667\n\npp512\tADD\t60\t0.442\n";
        let rows = parse_op_table(t).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].op, "MUL_MAT q4_1");
        assert_eq!((rows[1].calls, rows[1].ms), (60, 0.442));
        assert_eq!(parse_op_table("pp512\tADD\t60").unwrap_err().0, 1);
        assert!(parse_op_table("x\tADD\tmany\t1")
            .unwrap_err()
            .1
            .contains("many"));
        assert!(parse_op_table("x\tADD\t1\t-2")
            .unwrap_err()
            .1
            .contains("-2"));
        assert!(parse_op_table("# only\n").is_err());
    }
}
