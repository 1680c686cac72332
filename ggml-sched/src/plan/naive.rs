//! [`PlanStyle::Naive`]: the plan ggml's scheduler runs (host syncs where ggml has them).

use super::*;

pub(super) fn naive(
    part: &Partition,
    props: &[BackendProps],
    n_copies: usize,
    c: usize,
    plan: &mut Plan,
) {
    // ggml creates events only with n_copies > 1.
    let ev = |b: usize| props[b].events && n_copies > 1;
    let split_ev = |b: usize| EventKey {
        backend: b,
        kind: EventKind::Split,
        slot: c,
    };
    let host_wait_or_sync = |b: usize, why: HbRule| {
        if ev(b) {
            Action::HostWait {
                event: split_ev(b),
                why,
            }
        } else {
            Action::HostSync { backend: b, why }
        }
    };
    for (k, sp) in part.splits.iter().enumerate() {
        let b = sp.backend;
        let mut acts = Vec::new();
        if sp.inputs.is_empty() && k > 0 && part.splits[k - 1].backend != b {
            acts.push(host_wait_or_sync(part.splits[k - 1].backend, HbRule::Hb6));
        }
        for &ci in &sp.inputs {
            let cp = &part.copies[ci];
            if cp.kind == SourceKind::UserInput {
                acts.push(host_wait_or_sync(b, HbRule::Hb3));
                acts.push(Action::Copy {
                    copy: ci,
                    tensor: cp.tensor,
                    slot: c,
                    from: cp.from,
                    to: b,
                    on: CopyOn::Host,
                });
            } else {
                if ev(b) && props[b].can_wait_on[b] {
                    acts.push(Action::Wait {
                        queue: b,
                        event: split_ev(b),
                        why: HbRule::Hb3,
                    });
                } else {
                    acts.push(host_wait_or_sync(b, HbRule::Hb3));
                }
                acts.push(Action::Copy {
                    copy: ci,
                    tensor: cp.tensor,
                    slot: c,
                    from: cp.from,
                    to: b,
                    on: copy_on(props, b),
                });
            }
        }
        acts.push(Action::Compute { split: k });
        if ev(b) {
            acts.push(Action::Record { event: split_ev(b) });
        }
        plan.splits.push(SplitPlan {
            split: k,
            backend: b,
            n_nodes: sp.nodes.len(),
            actions: acts,
        });
    }
}
