//! Tensor descriptors: shape, strides, dtype, producing op, sources and data location.

use crate::dtype::DType;
use crate::name::Name;
use crate::op::Op;

/// Maximum number of dimensions.
pub const MAX_DIMS: usize = 4;
/// Maximum number of source operands of an op.
pub const MAX_SRC: usize = 4;

/// Index of a tensor in its [`Context`](crate::Context). A tensor's sources always have
/// smaller ids, so id order is a topological order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u32);

impl TensorId {
    /// The id as an index.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// Role flags of a tensor, as ggml's `GGML_TENSOR_FLAG_*`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TensorFlags(pub u8);

impl TensorFlags {
    /// Written by the caller before each compute (token ids, positions, masks).
    pub const INPUT: TensorFlags = TensorFlags(1);
    /// Read by the caller after a compute; never overwritten by the allocator.
    pub const OUTPUT: TensorFlags = TensorFlags(2);
    /// A trainable parameter.
    pub const PARAM: TensorFlags = TensorFlags(4);
    /// A model weight: lives in a weight buffer for the whole run.
    pub const WEIGHT: TensorFlags = TensorFlags(8);

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: TensorFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// The union of both flag sets.
    pub const fn union(self, other: TensorFlags) -> TensorFlags {
        TensorFlags(self.0 | other.0)
    }
}

/// A memory domain: the memory a buffer type allocates from. Backends that
/// [`support`](crate::backend::Backend::supports_domain) a domain read it directly;
/// anything else is copied by the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemoryDomain(pub u32);

impl MemoryDomain {
    /// Ordinary host memory (including memory-mapped model files).
    pub const HOST: MemoryDomain = MemoryDomain(0);

    /// A domain id never returned before in this process (thread-safe).
    pub fn fresh() -> MemoryDomain {
        use core::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(1);
        MemoryDomain(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// A buffer: an allocation of one backend (or host memory), named by domain and index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId {
    /// Memory the buffer lives in.
    pub domain: MemoryDomain,
    /// Index of the buffer, unique within its domain.
    pub index: u32,
}

/// Where a tensor's bytes are: a buffer and the address of the first byte in that
/// buffer's address space (a host pointer for host memory, a device pointer for a GPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DataRef {
    /// The buffer holding the bytes.
    pub buffer: BufferId,
    /// Address of element (0, 0, 0, 0).
    pub addr: u64,
}

/// A tensor descriptor, as ggml's `struct ggml_tensor` without the data.
///
/// `ne[i]` is the number of elements along dimension `i` (dimension 0 is the innermost,
/// contiguous one); `nb[i]` is the stride in bytes. For block-quantised dtypes
/// `nb[0]` is the block size in bytes and `nb[1]` the row size. Create descriptors through
/// [`Context`](crate::Context), which validates them; the fields are public so that
/// backends and schedulers can read them without accessor noise.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tensor {
    /// Element type.
    pub dtype: DType,
    /// Elements per dimension.
    pub ne: [usize; MAX_DIMS],
    /// Stride in bytes per dimension.
    pub nb: [usize; MAX_DIMS],
    /// The op that computes this tensor ([`Op::None`] for leaves: weights and inputs).
    pub op: Op,
    /// Operands of `op`.
    pub src: [Option<TensorId>; MAX_SRC],
    /// For views: the tensor (never itself a view) whose bytes this one aliases.
    pub view_src: Option<TensorId>,
    /// For views: byte offset into `view_src`.
    pub view_offs: usize,
    /// Role flags.
    pub flags: TensorFlags,
    /// Name, for messages, weight lookup and traces.
    pub name: Name,
    /// Location of the bytes once allocated. Views get `view_src`'s buffer at `view_offs`.
    pub data: Option<DataRef>,
}

impl Tensor {
    /// A contiguous tensor descriptor of `dtype` and shape `ne` with no op and no data.
    /// Returns `None` if `ne[0]` is not a multiple of the block size or sizes overflow.
    pub fn contiguous(dtype: DType, ne: [usize; MAX_DIMS]) -> Option<Tensor> {
        let nb = contiguous_strides(dtype, ne)?;
        // The total size must fit too.
        nb[3].checked_mul(ne[3])?;
        Some(Tensor {
            dtype,
            ne,
            nb,
            op: Op::None,
            src: [None; MAX_SRC],
            view_src: None,
            view_offs: 0,
            flags: TensorFlags::default(),
            name: Name::EMPTY,
            data: None,
        })
    }

    /// Number of elements.
    pub fn nelements(&self) -> usize {
        self.ne.iter().product()
    }

    /// Number of rows (product of dimensions 1..4).
    pub fn nrows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// Bytes of one row of `ne[0]` elements.
    pub fn row_size(&self) -> usize {
        self.ne[0] / self.dtype.block_size() * self.dtype.type_size()
    }

    /// Bytes spanned from the first to one past the last element (ggml's `ggml_nbytes`);
    /// 0 for an empty tensor.
    pub fn nbytes(&self) -> usize {
        if self.ne.contains(&0) {
            return 0;
        }
        // Scalar types may be transposed, so every dimension counts; blocks only run along 0.
        let (mut n, first) = if self.dtype.block_size() == 1 {
            (self.dtype.type_size(), 0)
        } else {
            (self.row_size(), 1)
        };
        for i in first..MAX_DIMS {
            n += (self.ne[i] - 1) * self.nb[i];
        }
        n
    }

    /// Whether elements are laid out densely in dimension order (ggml_is_contiguous).
    pub fn is_contiguous(&self) -> bool {
        contiguous_strides(self.dtype, self.ne)
            .is_some_and(|nb| (0..MAX_DIMS).all(|i| self.ne[i] == 1 || self.nb[i] == nb[i]))
    }

    /// Whether rows (dimension 0) are contiguous, whatever the higher strides.
    pub fn rows_contiguous(&self) -> bool {
        self.ne[0] == 1 || self.nb[0] == self.dtype.type_size()
    }

    /// Whether dimensions 0 and 1 are swapped in memory (ggml_is_transposed).
    pub fn is_transposed(&self) -> bool {
        self.nb[0] > self.nb[1]
    }

    /// Whether the tensor is a view of another tensor's bytes.
    pub fn is_view(&self) -> bool {
        self.view_src.is_some()
    }

    /// Whether `self` and `other` have the same shape.
    pub fn same_shape(&self, other: &Tensor) -> bool {
        self.ne == other.ne
    }

    /// Whether `other` can be broadcast (repeated) to the shape of `self`:
    /// each `self.ne[i]` is a multiple of `other.ne[i]` (ggml_can_repeat, reversed).
    pub fn can_broadcast_from(&self, other: &Tensor) -> bool {
        (0..MAX_DIMS).all(|i| other.ne[i] != 0 && self.ne[i] % other.ne[i] == 0)
    }

    /// Byte offset of element `(i0, i1, i2, i3)` (for scalar dtypes, or block index `i0`).
    pub fn offset_of(&self, i: [usize; MAX_DIMS]) -> usize {
        i[0] * self.nb[0] + i[1] * self.nb[1] + i[2] * self.nb[2] + i[3] * self.nb[3]
    }
}

/// Strides of a dense tensor, or `None` on block misalignment or overflow.
pub fn contiguous_strides(dtype: DType, ne: [usize; MAX_DIMS]) -> Option<[usize; MAX_DIMS]> {
    let row = dtype.row_size(ne[0])?;
    let nb1 = row;
    let nb2 = nb1.checked_mul(ne[1])?;
    let nb3 = nb2.checked_mul(ne[2])?;
    Some([dtype.type_size(), nb1, nb2, nb3])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nbytes_and_contiguity() {
        let t = Tensor::contiguous(DType::Q4_1, [64, 3, 2, 1]).unwrap();
        assert_eq!(t.nb, [20, 40, 120, 240]);
        assert_eq!(t.nbytes(), 240);
        assert!(t.is_contiguous());
        let mut tr = Tensor::contiguous(DType::F32, [4, 3, 1, 1]).unwrap();
        tr.ne.swap(0, 1);
        tr.nb.swap(0, 1);
        assert!(tr.is_transposed());
        assert!(!tr.is_contiguous());
        assert_eq!(tr.nbytes(), 48);
        assert!(Tensor::contiguous(DType::Q8_0, [33, 1, 1, 1]).is_none());
        assert!(Tensor::contiguous(DType::F32, [usize::MAX / 2, 4, 1, 1]).is_none());
    }
}
