//! Pinning a backend's compute threads to CPUs of their own (Linux only).
//!
//! Why: the pool's threads meet at a barrier after every node. When the kernel stacks
//! two of them on one CPU (it does after a wake-up, and keeps them there while both look
//! busy), every barrier waits for a time slice. On a 2-vCPU Zen 4 VM, Gemma 3 tg128 with
//! 2 threads went from 62–65 to 80–83 tokens/s with the threads pinned (issue 22).
//!
//! A backend claims distinct CPUs of the process's affinity mask for its threads; the
//! claims of the backends of one process never overlap. Where too few unclaimed CPUs
//! are left, the backend's threads are not pinned at all.

use std::sync::Mutex;

/// CPUs claimed by the live backends of this process.
static CLAIMED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Distinct CPUs held for one backend's threads, given back on drop.
#[derive(Debug)]
pub(crate) struct CpuClaim {
    cpus: Vec<usize>,
}

impl CpuClaim {
    /// Claims `n` CPUs of the calling thread's affinity mask that no other live claim
    /// holds (the lowest numbered first), or `None` where fewer are free or the
    /// platform cannot pin.
    pub(crate) fn new(n: usize) -> Option<CpuClaim> {
        let allowed = allowed_cpus()?;
        let mut claimed = CLAIMED.lock().unwrap_or_else(|e| e.into_inner());
        let cpus: Vec<usize> = allowed
            .into_iter()
            .filter(|c| !claimed.contains(c))
            .take(n)
            .collect();
        if n == 0 || cpus.len() < n {
            return None;
        }
        claimed.extend_from_slice(&cpus);
        Some(CpuClaim { cpus })
    }

    /// The CPU of thread `ith`.
    pub(crate) fn cpu(&self, ith: usize) -> usize {
        self.cpus[ith]
    }
}

impl Drop for CpuClaim {
    fn drop(&mut self) {
        let mut claimed = CLAIMED.lock().unwrap_or_else(|e| e.into_inner());
        claimed.retain(|c| !self.cpus.contains(c));
    }
}

#[cfg(target_os = "linux")]
fn allowed_cpus() -> Option<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data (all zeros is the empty set); sched_getaffinity
    // writes at most `size_of::<cpu_set_t>()` bytes into it.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        set
    };
    let n = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: CPU_ISSET reads bit `c` of the set, `c` < the set's size in bits.
    Some(
        (0..n)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect(),
    )
}

#[cfg(not(target_os = "linux"))]
fn allowed_cpus() -> Option<Vec<usize>> {
    None
}

/// Pins the calling thread to `cpu`; says whether it worked.
#[cfg(target_os = "linux")]
pub(crate) fn pin_current_thread(cpu: usize) -> bool {
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return false;
    }
    // SAFETY: an empty set with bit `cpu` (in range, checked above) set, passed by
    // pointer with its size; pid 0 is the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// Pins the calling thread to `cpu`; says whether it worked.
#[cfg(not(target_os = "linux"))]
pub(crate) fn pin_current_thread(_cpu: usize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The claims are process-wide: these tests take turns.
    static TURN: Mutex<()> = Mutex::new(());

    #[test]
    #[cfg(target_os = "linux")]
    fn claims_are_disjoint_and_given_back() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let n = allowed_cpus().expect("linux reads its mask").len();
        let a = CpuClaim::new(1).expect("one CPU is free");
        let taken = a.cpu(0);
        if n >= 2 {
            let b = CpuClaim::new(1).expect("a second CPU is free");
            assert_ne!(b.cpu(0), taken);
        }
        assert!(CpuClaim::new(n).is_none(), "one CPU is held by `a`");
        drop(a);
        let all = CpuClaim::new(n).expect("every CPU is free again");
        assert!(all.cpus.contains(&taken));
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_pinned_thread_runs_on_its_cpu() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let claim = CpuClaim::new(1).expect("one CPU is free");
        let cpu = claim.cpu(0);
        let on = std::thread::scope(|s| {
            s.spawn(|| {
                assert!(pin_current_thread(cpu));
                // SAFETY: sched_getcpu has no preconditions.
                unsafe { libc::sched_getcpu() }
            })
            .join()
            .unwrap()
        });
        assert_eq!(on, cpu as i32);
    }

    #[test]
    fn zero_or_too_many_cpus_are_refused() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        assert!(CpuClaim::new(0).is_none());
        assert!(CpuClaim::new(1 << 20).is_none());
    }
}
