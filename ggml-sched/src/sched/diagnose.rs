//! Words for people when a wait times out: which queues had not finished, what each ran
//! last, which event was waited for.

use ggml_core::TensorId;

use super::Scheduler;
use crate::error::SchedError;
use crate::plan::EventKey;

impl Scheduler {
    pub(super) fn timeout_err(&self, b: usize, wait: String, t: std::time::Duration) -> SchedError {
        let unfinished: Vec<usize> = (0..self.backends.len())
            .filter(|&x| {
                !matches!(
                    self.backends[x].synchronize_timeout(std::time::Duration::ZERO),
                    Ok(true)
                )
            })
            .collect();
        {
            let mut stuck = self.stuck.lock().unwrap_or_else(|e| e.into_inner());
            stuck[b] = true;
            for &x in &unfinished {
                stuck[x] = true;
            }
        }
        let unfinished: Vec<String> = unfinished
            .into_iter()
            .map(|x| format!("{} (last work: {})", self.props[x].name, self.last_work(x)))
            .collect();
        SchedError::Timeout {
            backend: self.props[b].name.clone(),
            wait,
            seconds: t.as_secs_f64(),
            last: self.last_work(b),
            unfinished: match unfinished.is_empty() {
                true => "none".to_string(),
                false => unfinished.join(", "),
            },
        }
    }

    /// The last split enqueued on backend `b`, for people.
    fn last_work(&self, b: usize) -> String {
        let last = self
            .last_split
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(b)
            .copied()
            .flatten();
        match (last, self.graph.as_ref()) {
            (Some(k), Some(gs)) => {
                let sp = &gs.part.splits[k];
                let name = |id: &TensorId| {
                    let t = &gs.tables[0][id.index()];
                    format!("{} '{}'", t.op.name(), t.name.as_str())
                };
                let first = sp.nodes.first().map(name).unwrap_or_default();
                let end = sp.nodes.last().map(name).unwrap_or_default();
                format!("split {k} ({first} .. {end})")
            }
            _ => "none".to_string(),
        }
    }

    /// An event for people: `split[cpu#1]@0`.
    pub(super) fn event_label(&self, e: &EventKey) -> String {
        let kind = match e.kind {
            crate::plan::EventKind::Split => "split".to_string(),
            crate::plan::EventKind::CopyDone => "copydone".to_string(),
            crate::plan::EventKind::Inputs => "inputs".to_string(),
            crate::plan::EventKind::InputsCopied => "inputs-copied".to_string(),
            crate::plan::EventKind::Produced(k) => format!("split{k}"),
        };
        format!("{kind}[{}]@{}", self.props[e.backend].name, e.slot)
    }
}
