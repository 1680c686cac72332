//! Counts of successful launches per kernel.

use crate::kernels::KernelId;

/// Successful launches of each kernel since the backend was created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelStats {
    /// Quantised mul_mats run in the matrix-vector class (fewer than
    /// [`MMQ_MIN_N`](crate::MMQ_MIN_N) columns: `mmvq`, or `qmm` with one column tile),
    /// fused ones included (see [`MulMatClass`](crate::MulMatClass)).
    pub mmvq: u64,
    /// Quantised mul_mats run in the tiled class (`mmq`, or `qmm` with 8-column tiles).
    pub mmq: u64,
    /// `qmm` launches (among `launches`' `Qmm`) that ran a variant compiled for their
    /// dtype and fused form (the `specialize` tuning, [`CudaTuning`](crate::CudaTuning)).
    pub qmm_variants: u64,
    /// Launches per kernel, indexed by `KernelId as usize`.
    pub launches: [u64; KernelId::COUNT],
}

impl Default for KernelStats {
    fn default() -> Self {
        KernelStats {
            mmvq: 0,
            mmq: 0,
            qmm_variants: 0,
            launches: [0; KernelId::COUNT],
        }
    }
}

impl KernelStats {
    /// Launches of kernel `k`.
    pub fn launches_of(&self, k: KernelId) -> u64 {
        self.launches[k as usize]
    }
}
