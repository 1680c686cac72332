//! Chrome trace-event files of scheduler runs (`--trace FILE`) and their summary
//! (`ggml-harness trace-summary FILE`).
//!
//! The file opens in chrome://tracing or <https://ui.perfetto.dev>: one track for the host
//! and one per backend queue, every copy, compute, wait, input write and host sync a
//! slice, every event record an instant, each labelled with run, slot, split, batch,
//! micro-batch, tensor and the happens-before rule a wait discharges.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use ggml_sched::{SliceKind, Trace, TraceTrack};
use serde_json::{json, Value};

use crate::error::{HarnessError, Result};

const PID: u64 = 1;

fn tid(track: TraceTrack) -> u64 {
    match track {
        TraceTrack::Host => 0,
        TraceTrack::Queue(i) => i as u64 + 1,
    }
}

/// The trace as a Chrome trace-event JSON document (times in µs from the first slice).
pub fn chrome_json(trace: &Trace) -> Value {
    let t0 = trace.slices.iter().map(|s| s.start_ns).min().unwrap_or(0);
    let us = |ns: u64| (ns - t0) as f64 / 1000.0;
    let mut events = vec![json!({
        "name": "thread_name", "ph": "M", "pid": PID, "tid": 0,
        "args": { "name": "host" }
    })];
    for (i, q) in trace.queues.iter().enumerate() {
        events.push(json!({
            "name": "thread_name", "ph": "M", "pid": PID, "tid": i as u64 + 1,
            "args": { "name": format!("{q} queue") }
        }));
    }
    for s in &trace.slices {
        let mut args = serde_json::Map::new();
        args.insert("seq".into(), json!(s.seq));
        if let Some(r) = s.run {
            args.insert("run".into(), json!(r));
        }
        if let Some(c) = s.slot {
            args.insert("slot".into(), json!(c));
        }
        if let Some(k) = s.split {
            args.insert("split".into(), json!(k));
        }
        if let Some((b, u)) = s.batch {
            args.insert("batch".into(), json!(b));
            args.insert("ubatch".into(), json!(u));
        }
        if let Some(rule) = s.rule {
            args.insert("rule".into(), json!(rule.to_string()));
        }
        if let Some(d) = s.dst {
            args.insert("to".into(), json!(tid(TraceTrack::Queue(d))));
        }
        let mut e = json!({
            "name": s.label,
            "cat": s.kind.name(),
            "pid": PID,
            "tid": tid(s.track),
            "ts": us(s.start_ns),
            "args": args,
        });
        if s.kind == SliceKind::Record {
            e["ph"] = json!("i");
            e["s"] = json!("t");
        } else {
            e["ph"] = json!("X");
            e["dur"] = json!((s.end_ns - s.start_ns) as f64 / 1000.0);
        }
        events.push(e);
    }
    json!({ "traceEvents": events, "displayTimeUnit": "ms" })
}

/// Writes [`chrome_json`] of `trace` to `path`.
pub fn write_chrome(trace: &Trace, path: &Path) -> Result<()> {
    let text = serde_json::to_string(&chrome_json(trace)).expect("JSON values serialise");
    std::fs::write(path, text).map_err(|source| HarnessError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Busy and idle time of one track.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TrackSummary {
    /// Track name (`host`, `CPU#0 queue`, ...).
    pub name: String,
    /// Time covered by copies, computes and input writes (queues) or by submits and
    /// host syncs (host), in ms; overlapping slices count once.
    pub busy_ms: f64,
    /// The rest of the trace's span, in ms.
    pub idle_ms: f64,
}

/// The sync pattern of one split.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SplitPattern {
    /// Split index.
    pub split: u64,
    /// Its actions in issue order, most common over the runs: `w` queue wait, `s` host
    /// sync, `a` async copy, `c` copy through the host, `g` graph.
    pub pattern: String,
    /// Runs that had this pattern, of those that ran the split.
    pub runs: usize,
    /// Runs that ran the split.
    pub of: usize,
}

/// What `trace-summary` reports.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TraceSummary {
    /// From the first slice's start to the last one's end, in ms.
    pub span_ms: f64,
    /// Per track.
    pub tracks: Vec<TrackSummary>,
    /// Fraction of the span during which at least two queues are busy at once.
    pub overlap: f64,
    /// Per split.
    pub splits: Vec<SplitPattern>,
    /// Host syncs by the rule they discharge (`HB5`, `HB7`, `none`).
    pub host_syncs: BTreeMap<String, usize>,
    /// Host syncs inside a batch (between its first and last micro-batch's submits)
    /// for a rule other than HB5 or HB7.
    pub stray_host_syncs: usize,
    /// Batches and runs (micro-batches) in the trace.
    pub batches: usize,
    /// Runs in the trace.
    pub runs: usize,
    /// Copies between devices, per pass (run), by how much of them the destination
    /// device spent computing anyway.
    pub copies: Vec<PassCopies>,
    /// The sums of [`TraceSummary::copies`].
    pub copy_total: PassCopies,
}

/// Copy time of one pass (or of all, in [`TraceSummary::copy_total`]), summed over the
/// destination devices: each copy's interval is cut into the part during which its
/// destination's queue computed (hidden) and the rest, during which the destination
/// waited or was idle (exposed). A copy on the destination's own queue is all exposed.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct PassCopies {
    /// Run index (`None` in the total).
    pub run: Option<u64>,
    /// Copy time (overlapping copies into one device count once), ms.
    pub copy_ms: f64,
    /// Part of it during which the destination computed, ms.
    pub hidden_ms: f64,
    /// The rest, ms.
    pub exposed_ms: f64,
}

impl PassCopies {
    /// Hidden share of the copy time (0 without copies).
    pub fn hidden_fraction(&self) -> f64 {
        if self.copy_ms > 0.0 {
            self.hidden_ms / self.copy_ms
        } else {
            0.0
        }
    }
}

/// Merges `[start, end)` intervals into sorted disjoint ones.
fn merge(mut iv: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    iv.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<(f64, f64)> = Vec::new();
    for (a, b) in iv {
        match out.last_mut() {
            Some(m) if a <= m.1 => m.1 = m.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// Length of the intersection of two sets of disjoint sorted intervals.
fn intersection_len(a: &[(f64, f64)], b: &[(f64, f64)]) -> f64 {
    let (mut i, mut j, mut total) = (0, 0, 0.0);
    while i < a.len() && j < b.len() {
        let lo = a[i].0.max(b[j].0);
        let hi = a[i].1.min(b[j].1);
        if hi > lo {
            total += hi - lo;
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    total
}

/// Hidden and exposed copy time per pass (see [`PassCopies`]).
fn copy_overlap(slices: &[Slice]) -> Vec<PassCopies> {
    // Compute intervals per device track, all runs together: a device computing another
    // pass's work while a copy lands still hides it.
    let mut compute: BTreeMap<u64, Vec<(f64, f64)>> = BTreeMap::new();
    for s in slices.iter().filter(|s| s.cat == "compute" && s.dur > 0.0) {
        compute.entry(s.tid).or_default().push((s.ts, s.ts + s.dur));
    }
    let compute: BTreeMap<u64, Vec<(f64, f64)>> =
        compute.into_iter().map(|(t, iv)| (t, merge(iv))).collect();
    let mut copies: BTreeMap<(u64, u64), Vec<(f64, f64)>> = BTreeMap::new();
    for s in slices.iter().filter(|s| s.cat == "copy" && s.dur > 0.0) {
        if let (Some(run), Some(to)) = (s.run, s.to) {
            copies
                .entry((run, to))
                .or_default()
                .push((s.ts, s.ts + s.dur));
        }
    }
    let mut passes: BTreeMap<u64, PassCopies> = BTreeMap::new();
    for ((run, to), iv) in copies {
        let iv = merge(iv);
        let total: f64 = iv.iter().map(|(a, b)| b - a).sum();
        let hidden = compute.get(&to).map_or(0.0, |c| intersection_len(&iv, c));
        let p = passes.entry(run).or_insert_with(|| PassCopies {
            run: Some(run),
            ..Default::default()
        });
        p.copy_ms += total / 1000.0;
        p.hidden_ms += hidden / 1000.0;
        p.exposed_ms += (total - hidden) / 1000.0;
    }
    passes.into_values().collect()
}

/// A slice read back from a trace file.
struct Slice {
    tid: u64,
    cat: String,
    ts: f64,
    dur: f64,
    seq: u64,
    run: Option<u64>,
    split: Option<u64>,
    batch: Option<u64>,
    rule: Option<String>,
    /// For copies: the track of the device written.
    to: Option<u64>,
}

fn bad(path: &str, why: &str) -> HarnessError {
    HarnessError::Usage(format!("{path}: not a ggml-harness trace: {why}"))
}

fn parse(path: &str, doc: &Value) -> Result<(BTreeMap<u64, String>, Vec<Slice>)> {
    let events = doc
        .get("traceEvents")
        .and_then(Value::as_array)
        .ok_or_else(|| bad(path, "no traceEvents array"))?;
    let mut names = BTreeMap::new();
    let mut slices = Vec::new();
    for e in events {
        let tid = e["tid"]
            .as_u64()
            .ok_or_else(|| bad(path, "an event without tid"))?;
        match e["ph"].as_str() {
            Some("M") => {
                let n = e["args"]["name"].as_str().unwrap_or("?");
                names.insert(tid, n.to_string());
            }
            Some(ph @ ("X" | "i")) => {
                let args = &e["args"];
                slices.push(Slice {
                    tid,
                    cat: e["cat"].as_str().unwrap_or("").to_string(),
                    ts: e["ts"]
                        .as_f64()
                        .ok_or_else(|| bad(path, "a slice without ts"))?,
                    dur: if ph == "X" {
                        e["dur"].as_f64().unwrap_or(0.0)
                    } else {
                        0.0
                    },
                    seq: args["seq"].as_u64().unwrap_or(0),
                    run: args["run"].as_u64(),
                    split: args["split"].as_u64(),
                    batch: args["batch"].as_u64(),
                    rule: args["rule"].as_str().map(str::to_string),
                    to: args["to"].as_u64(),
                });
            }
            _ => {}
        }
    }
    Ok((names, slices))
}

/// Length of the union of `[start, end)` intervals.
fn union_len(mut iv: Vec<(f64, f64)>) -> f64 {
    iv.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut total, mut cur): (f64, Option<(f64, f64)>) = (0.0, None);
    for (a, b) in iv {
        match cur {
            Some((s, e)) if a <= e => cur = Some((s, e.max(b))),
            Some((s, e)) => {
                total += e - s;
                cur = Some((a, b));
            }
            None => cur = Some((a, b)),
        }
    }
    total + cur.map_or(0.0, |(s, e)| e - s)
}

fn busy_kind(cat: &str, host: bool) -> bool {
    match SliceKind::from_name(cat) {
        Some(SliceKind::Compute | SliceKind::Copy | SliceKind::SetInput) => !host,
        Some(SliceKind::Submit | SliceKind::HostSync | SliceKind::HostCopy) => host,
        _ => false,
    }
}

/// Summarises a trace file written by [`write_chrome`].
pub fn summarize(path: &Path) -> Result<TraceSummary> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| HarnessError::Io {
        path: name.clone(),
        source,
    })?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| bad(&name, &e.to_string()))?;
    summarize_value(&name, &doc)
}

/// [`summarize`] of a parsed document (`name` is used in errors).
pub fn summarize_value(name: &str, doc: &Value) -> Result<TraceSummary> {
    let (names, slices) = parse(name, doc)?;
    if slices.is_empty() {
        return Err(bad(name, "no slices"));
    }
    let start = slices.iter().map(|s| s.ts).fold(f64::INFINITY, f64::min);
    let end = slices
        .iter()
        .map(|s| s.ts + s.dur)
        .fold(f64::NEG_INFINITY, f64::max);
    let span = end - start;

    let mut per_track: BTreeMap<u64, Vec<(f64, f64)>> = BTreeMap::new();
    for &t in names.keys() {
        per_track.entry(t).or_default();
    }
    for s in &slices {
        if busy_kind(&s.cat, s.tid == 0) && s.dur > 0.0 {
            per_track
                .entry(s.tid)
                .or_default()
                .push((s.ts, s.ts + s.dur));
        }
    }
    let tracks = per_track
        .iter()
        .map(|(t, iv)| {
            let busy = union_len(iv.clone());
            TrackSummary {
                name: names
                    .get(t)
                    .cloned()
                    .unwrap_or_else(|| format!("track {t}")),
                busy_ms: busy / 1000.0,
                idle_ms: (span - busy).max(0.0) / 1000.0,
            }
        })
        .collect();

    // Overlap: sweep the queues' busy intervals (each queue's merged first).
    let mut edges: Vec<(f64, i32)> = Vec::new();
    for (t, iv) in &per_track {
        if *t == 0 {
            continue;
        }
        let mut iv = iv.clone();
        iv.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut merged: Vec<(f64, f64)> = Vec::new();
        for (a, b) in iv {
            match merged.last_mut() {
                Some(m) if a <= m.1 => m.1 = m.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        for (a, b) in merged {
            edges.push((a, 1));
            edges.push((b, -1));
        }
    }
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut depth, mut last, mut both) = (0, start, 0.0);
    for (x, d) in edges {
        if depth >= 2 {
            both += x - last;
        }
        depth += d;
        last = x;
    }

    // Sync pattern per split: letters in issue order within each run.
    let mut by_run_split: BTreeMap<(u64, u64), Vec<(u64, char)>> = BTreeMap::new();
    for s in &slices {
        let (Some(run), Some(split)) = (s.run, s.split) else {
            continue;
        };
        if let Some(l) = SliceKind::from_name(&s.cat).and_then(SliceKind::letter) {
            by_run_split
                .entry((split, run))
                .or_default()
                .push((s.seq, l));
        }
    }
    let mut counts: BTreeMap<u64, HashMap<String, usize>> = BTreeMap::new();
    for ((split, _), mut v) in by_run_split {
        v.sort();
        let p: String = v.into_iter().map(|(_, l)| l).collect();
        *counts.entry(split).or_default().entry(p).or_default() += 1;
    }
    let splits = counts
        .into_iter()
        .map(|(split, m)| {
            let of = m.values().sum();
            let (pattern, runs) = m
                .into_iter()
                .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
                .expect("non-empty");
            SplitPattern {
                split,
                pattern,
                runs,
                of,
            }
        })
        .collect();

    // Host syncs, and those inside a batch for another rule than HB5/HB7.
    let mut host_syncs = BTreeMap::new();
    let mut batch_span: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for s in slices.iter().filter(|s| s.cat == "submit") {
        if let Some(b) = s.batch {
            let e = batch_span.entry(b).or_insert((s.ts, s.ts + s.dur));
            e.0 = e.0.min(s.ts);
            e.1 = e.1.max(s.ts + s.dur);
        }
    }
    let mut stray = 0;
    for s in slices.iter().filter(|s| s.cat == "host_sync") {
        let rule = s.rule.clone().unwrap_or_else(|| "none".into());
        *host_syncs.entry(rule.clone()).or_default() += 1;
        let inside = batch_span
            .values()
            .any(|&(a, b)| s.ts >= a && s.ts + s.dur <= b);
        if inside && rule != "HB5" && rule != "HB7" {
            stray += 1;
        }
    }
    let runs = slices
        .iter()
        .filter_map(|s| s.run)
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let copies = copy_overlap(&slices);
    let mut copy_total = PassCopies::default();
    for p in &copies {
        copy_total.copy_ms += p.copy_ms;
        copy_total.hidden_ms += p.hidden_ms;
        copy_total.exposed_ms += p.exposed_ms;
    }
    Ok(TraceSummary {
        copies,
        copy_total,
        span_ms: span / 1000.0,
        tracks,
        overlap: if span > 0.0 { both / span } else { 0.0 },
        splits,
        host_syncs,
        stray_host_syncs: stray,
        batches: batch_span.len(),
        runs,
    })
}

impl TraceSummary {
    /// The summary as text for people.
    pub fn text(&self) -> String {
        let mut s = format!(
            "span {:.2} ms, {} batches, {} runs (micro-batches)\n\n| track | busy ms | idle ms | busy % |\n|---|---|---|---|\n",
            self.span_ms, self.batches, self.runs
        );
        for t in &self.tracks {
            let pct = if self.span_ms > 0.0 {
                100.0 * t.busy_ms / self.span_ms
            } else {
                0.0
            };
            s.push_str(&format!(
                "| {} | {:.2} | {:.2} | {pct:.1} |\n",
                t.name, t.busy_ms, t.idle_ms
            ));
        }
        s.push_str(&format!(
            "\noverlap (two or more queues busy): {:.1} % of the span\n\n| split | pattern | runs |\n|---|---|---|\n",
            100.0 * self.overlap
        ));
        for p in &self.splits {
            s.push_str(&format!(
                "| {} | {} | {}/{} |\n",
                p.split, p.pattern, p.runs, p.of
            ));
        }
        let syncs: Vec<String> = self
            .host_syncs
            .iter()
            .map(|(r, n)| format!("{r} {n}"))
            .collect();
        let c = &self.copy_total;
        s.push_str(&format!(
            "\ncopies between devices: {:.2} ms, hidden behind the destination's compute {:.2} ms ({:.1} %), exposed {:.2} ms; per pass {:.3} ms exposed over {} passes\n",
            c.copy_ms,
            c.hidden_ms,
            100.0 * c.hidden_fraction(),
            c.exposed_ms,
            if self.copies.is_empty() { 0.0 } else { c.exposed_ms / self.copies.len() as f64 },
            self.copies.len()
        ));
        s.push_str(&format!(
            "\nhost syncs: {} ({} inside a batch for a rule other than HB5/HB7)\n",
            if syncs.is_empty() {
                "none".to_string()
            } else {
                syncs.join(", ")
            },
            self.stray_host_syncs
        ));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ggml_sched::{HbRule, TraceSlice};

    fn slice(track: TraceTrack, kind: SliceKind, t: (u64, u64), seq: u64) -> TraceSlice {
        TraceSlice {
            track,
            kind,
            label: "x".into(),
            run: Some(0),
            slot: Some(0),
            split: Some(if track == TraceTrack::Queue(1) { 1 } else { 0 }),
            batch: Some((0, 0)),
            rule: None,
            dst: None,
            seq,
            start_ns: t.0 * 1000,
            end_ns: t.1 * 1000,
        }
    }

    #[test]
    fn summary_of_a_hand_made_trace() {
        let q0 = TraceTrack::Queue(0);
        let q1 = TraceTrack::Queue(1);
        let mut host = slice(TraceTrack::Host, SliceKind::Submit, (0, 10), 0);
        host.split = None;
        let mut hb5 = slice(TraceTrack::Host, SliceKind::HostSync, (8, 9), 7);
        (hb5.split, hb5.rule) = (None, Some(HbRule::Hb5));
        let mut stray = slice(TraceTrack::Host, SliceKind::HostSync, (9, 10), 8);
        (stray.split, stray.rule) = (None, Some(HbRule::Hb3));
        // Copies into CPU#1: two on its own queue during its compute (hidden), one on
        // CPU#0's queue from 20 to 50 µs, half before CPU#1 computes (exposed).
        let mut c1 = slice(q1, SliceKind::Copy, (60, 62), 4);
        let mut c2 = slice(q1, SliceKind::Copy, (62, 64), 5);
        let mut c0 = slice(q0, SliceKind::Copy, (20, 50), 9);
        (c1.dst, c2.dst, c0.dst, c0.split) = (Some(1), Some(1), Some(1), None);
        let trace = Trace {
            queues: vec!["CPU#0".into(), "CPU#1".into()],
            slices: vec![
                host,
                slice(q0, SliceKind::Compute, (0, 60), 1),
                slice(q0, SliceKind::Record, (60, 60), 2),
                slice(q1, SliceKind::Wait, (1, 60), 3),
                c1,
                c2,
                c0,
                slice(q1, SliceKind::Compute, (40, 100), 6),
                hb5,
                stray,
            ],
        };
        let doc = chrome_json(&trace);
        let s = summarize_value("t.json", &doc).unwrap();
        assert!((s.span_ms - 0.1).abs() < 1e-9, "{s:?}");
        assert_eq!(s.tracks.len(), 3);
        assert!((s.tracks[1].busy_ms - 0.06).abs() < 1e-9);
        assert!((s.tracks[2].busy_ms - 0.06).abs() < 1e-9, "{s:?}");
        // Both queues busy from 40 to 60 µs: 20 % of 100 µs.
        assert!((s.overlap - 0.2).abs() < 1e-9, "{}", s.overlap);
        assert_eq!(s.splits[0].pattern, "g");
        assert_eq!(s.splits[1].pattern, "waag");
        assert_eq!(s.host_syncs.get("HB5"), Some(&1));
        assert_eq!(s.stray_host_syncs, 1);
        assert_eq!(s.copies.len(), 1);
        let c = &s.copy_total;
        assert!((c.copy_ms - 0.034).abs() < 1e-9, "{c:?}");
        assert!((c.hidden_ms - 0.014).abs() < 1e-9, "{c:?}");
        assert!((c.exposed_ms - 0.020).abs() < 1e-9, "{c:?}");
        assert!(s.text().contains("exposed 0.02 ms"), "{}", s.text());
        assert!(s.text().contains("| 1 | waag | 1/1 |"));
        let events = doc["traceEvents"].as_array().unwrap();
        assert!(events
            .iter()
            .any(|e| e["ph"] == "i" && e["cat"] == "record"));
        assert!(events
            .iter()
            .any(|e| e["ph"] == "M" && e["args"]["name"] == "CPU#1 queue"));
    }

    #[test]
    fn a_file_that_is_not_a_trace_is_refused() {
        let e = summarize_value("x.json", &json!({"a": 1})).unwrap_err();
        assert!(e.to_string().contains("no traceEvents"), "{e}");
    }
}
