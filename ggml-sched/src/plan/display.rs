//! The plan as text: one line per action, with backend, copy and event names.

use std::fmt;

use super::*;

impl Plan {
    fn ev(&self, e: &EventKey) -> String {
        let kind = match e.kind {
            EventKind::Split => "split",
            EventKind::CopyDone => "copydone",
            EventKind::Inputs => "inputs",
            EventKind::InputsCopied => "inputs-copied",
            EventKind::Produced(k) => {
                return format!("split{k}[{}]@{}", self.bname(e.backend), e.slot)
            }
        };
        format!("{kind}[{}]@{}", self.bname(e.backend), e.slot)
    }

    fn bname(&self, b: usize) -> &str {
        self.backend_names.get(b).map_or("?", |s| s.as_str())
    }

    fn fmt_action(&self, f: &mut fmt::Formatter<'_>, a: &Action) -> fmt::Result {
        match a {
            Action::Wait { queue, event, why } => {
                let s = format!("{} <- {}", self.bname(*queue), self.ev(event));
                writeln!(f, "    wait       {s:<40} {why}")
            }
            Action::HostWait { event, why } => {
                writeln!(f, "    host-wait  {:<40} {why}", self.ev(event))
            }
            Action::HostSync { backend, why } => {
                writeln!(f, "    host-sync  {:<40} {why}", self.bname(*backend))
            }
            Action::Copy {
                copy,
                slot,
                from,
                to,
                on,
                ..
            } => {
                let (src, dst) = self
                    .copy_names
                    .get(*copy)
                    .map_or(("?", "?".to_string()), |(s, d)| {
                        (s.as_str(), d.replace("{c}", &slot.to_string()))
                    });
                let on = match on {
                    CopyOn::Src => "on src",
                    CopyOn::Dst => "on dst",
                    CopyOn::Host => "blocking",
                    CopyOn::Engine(e) => &format!("on {}", self.bname(*e)),
                };
                let s = format!("{src} -> {dst}");
                writeln!(
                    f,
                    "    copy       {s:<40} {} -> {} {on}",
                    self.bname(*from),
                    self.bname(*to)
                )
            }
            Action::Compute { split } => {
                let n = self
                    .splits
                    .iter()
                    .find(|s| s.split == *split)
                    .map_or(0, |s| s.n_nodes);
                writeln!(f, "    compute    split {split} ({n} nodes)")
            }
            Action::Record { event } => writeln!(f, "    record     {}", self.ev(event)),
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let style = match self.style {
            PlanStyle::Minimal => "minimal",
            PlanStyle::Naive => "naive (ggml)",
        };
        write!(
            f,
            "plan {style}, n_copies {}, slot {}: {} splits, {} host syncs, {} queue waits",
            self.n_copies,
            self.slot,
            self.splits.len(),
            self.host_syncs(),
            self.queue_waits()
        )?;
        if !self.weaken.is_empty() {
            let w: Vec<_> = self.weaken.iter().map(|k| k.name()).collect();
            write!(f, ", WEAKENED: {}", w.join(","))?;
        }
        writeln!(f)?;
        for (i, (n, note)) in self
            .backend_names
            .iter()
            .zip(&self.backend_notes)
            .enumerate()
        {
            writeln!(f, "  backend {i}: {n} ({note})")?;
        }
        if !self.prologue.is_empty() {
            writeln!(f, "  prologue")?;
            for a in &self.prologue {
                self.fmt_action(f, a)?;
            }
        }
        for s in &self.splits {
            let pat: String = s.actions.iter().filter_map(Action::letter).collect();
            writeln!(
                f,
                "  split {} on {} ({} nodes) [{pat}]",
                s.split,
                self.bname(s.backend),
                s.n_nodes
            )?;
            for a in &s.actions {
                self.fmt_action(f, a)?;
            }
        }
        if !self.epilogue.is_empty() {
            writeln!(f, "  epilogue")?;
            for a in &self.epilogue {
                self.fmt_action(f, a)?;
            }
        }
        writeln!(f, "  pattern: {}", self.pattern())
    }
}
