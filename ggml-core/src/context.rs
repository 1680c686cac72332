//! A context: tensor descriptors stored in caller-provided memory.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::name::Name;
use crate::op::Op;
use crate::tensor::{Tensor, TensorFlags, TensorId, MAX_DIMS, MAX_SRC};

/// Tensor descriptors in a caller-provided slice. Nothing is allocated: creating more
/// tensors than the slice holds returns [`Error::CapacityExceeded`].
///
/// Ops are methods (see [`crate::op`]); each validates its operands, infers the result's
/// shape and dtype, and appends the result. Ids grow monotonically, so a tensor's sources
/// always precede it.
///
/// ```
/// use ggml_core::{Context, DType, Tensor};
/// let mut storage = [Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 8];
/// let mut ctx = Context::new(&mut storage);
/// let a = ctx.new_tensor(DType::F32, [4, 2, 1, 1]).unwrap();
/// let b = ctx.new_tensor(DType::F32, [4, 1, 1, 1]).unwrap();
/// let c = ctx.add(a, b).unwrap();
/// assert_eq!(ctx.get(c).unwrap().ne, [4, 2, 1, 1]);
/// ```
#[derive(Debug)]
pub struct Context<'a> {
    slots: &'a mut [Tensor],
    len: usize,
}

impl<'a> Context<'a> {
    /// A context storing up to `slots.len()` tensors in `slots` (their contents are
    /// overwritten as tensors are created).
    pub fn new(slots: &'a mut [Tensor]) -> Context<'a> {
        Context { slots, len: 0 }
    }

    /// Number of tensors created.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no tensor was created yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Maximum number of tensors.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// All tensors created so far, indexed by [`TensorId`].
    pub fn tensors(&self) -> &[Tensor] {
        &self.slots[..self.len]
    }

    /// Mutable access to all tensors (for allocators and schedulers that place data or
    /// rewrite sources; keep sources pointing at smaller ids).
    pub fn tensors_mut(&mut self) -> &mut [Tensor] {
        &mut self.slots[..self.len]
    }

    /// Removes every tensor.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The tensor `id`.
    pub fn get(&self, id: TensorId) -> Result<&Tensor> {
        self.slots[..self.len]
            .get(id.index())
            .ok_or(Error::UnknownTensor {
                id: id.0,
                len: self.len,
            })
    }

    /// Mutable access to the tensor `id`.
    pub fn get_mut(&mut self, id: TensorId) -> Result<&mut Tensor> {
        let len = self.len;
        self.slots[..len]
            .get_mut(id.index())
            .ok_or(Error::UnknownTensor { id: id.0, len })
    }

    /// The first tensor named `name`.
    pub fn find(&self, name: &str) -> Option<TensorId> {
        self.tensors()
            .iter()
            .position(|t| t.name.as_str() == name)
            .map(|i| TensorId(i as u32))
    }

    /// Appends a descriptor as is (after checking its sources exist) and returns its id.
    pub fn push(&mut self, t: Tensor) -> Result<TensorId> {
        for s in t.src.iter().chain(core::iter::once(&t.view_src)).flatten() {
            self.get(*s)?;
        }
        if self.len == self.slots.len() {
            return Err(Error::CapacityExceeded {
                what: "context tensors",
                capacity: self.slots.len(),
            });
        }
        if self.len >= u32::MAX as usize {
            return Err(Error::Overflow { what: "tensor id" });
        }
        self.slots[self.len] = t;
        self.len += 1;
        Ok(TensorId(self.len as u32 - 1))
    }

    /// A new leaf tensor (no op, no data) of `dtype` and shape `ne`.
    pub fn new_tensor(&mut self, dtype: DType, ne: [usize; MAX_DIMS]) -> Result<TensorId> {
        if ne[0] % dtype.block_size() != 0 {
            return Err(Error::BlockAlignment { dtype, ne0: ne[0] });
        }
        let t = Tensor::contiguous(dtype, ne).ok_or(Error::Overflow {
            what: "tensor size",
        })?;
        self.push(t)
    }

    /// A new 1-D leaf tensor.
    pub fn new_tensor_1d(&mut self, dtype: DType, ne0: usize) -> Result<TensorId> {
        self.new_tensor(dtype, [ne0, 1, 1, 1])
    }

    /// A new 2-D leaf tensor.
    pub fn new_tensor_2d(&mut self, dtype: DType, ne0: usize, ne1: usize) -> Result<TensorId> {
        self.new_tensor(dtype, [ne0, ne1, 1, 1])
    }

    /// Sets the name of `id`.
    pub fn set_name(&mut self, id: TensorId, name: &str) -> Result<()> {
        self.get_mut(id)?.name = Name::new(name);
        Ok(())
    }

    /// Adds `flags` to the tensor `id`.
    pub fn set_flags(&mut self, id: TensorId, flags: TensorFlags) -> Result<()> {
        let t = self.get_mut(id)?;
        t.flags = t.flags.union(flags);
        Ok(())
    }

    /// Appends the result of `op` over `src`, a new contiguous tensor of `dtype` and `ne`.
    pub(crate) fn push_op(
        &mut self,
        op: Op,
        dtype: DType,
        ne: [usize; MAX_DIMS],
        src: &[TensorId],
    ) -> Result<TensorId> {
        let mut t = Tensor::contiguous(dtype, ne).ok_or(Error::Overflow {
            what: "result size",
        })?;
        t.op = op;
        t.src = srcs(src);
        self.push(t)
    }

    /// Appends `op` over `src` as a view of `base` with the given shape, strides and
    /// byte offset relative to `base` (checked to stay within `base`'s root tensor).
    #[allow(clippy::too_many_arguments)] // crate-private; each argument is one field of the view
    pub(crate) fn push_view(
        &mut self,
        op: Op,
        base: TensorId,
        dtype: DType,
        ne: [usize; MAX_DIMS],
        nb: [usize; MAX_DIMS],
        offset: usize,
        src: &[TensorId],
    ) -> Result<TensorId> {
        let b = *self.get(base)?;
        let (root, root_offs) = match b.view_src {
            Some(r) => (r, b.view_offs),
            None => (base, 0),
        };
        let view_offs = root_offs.checked_add(offset).ok_or(Error::Overflow {
            what: "view offset",
        })?;
        let mut t = Tensor {
            dtype,
            ne,
            nb,
            op,
            src: srcs(src),
            view_src: Some(root),
            view_offs,
            flags: TensorFlags::default(),
            name: Name::EMPTY,
            data: None,
        };
        let r = self.get(root)?;
        let size = r.nbytes();
        let span = checked_nbytes(&t).ok_or(Error::Overflow { what: "view size" })?;
        let end = view_offs
            .checked_add(span)
            .ok_or(Error::Overflow { what: "view end" })?;
        if end > size {
            return Err(Error::ViewOutOfBounds {
                tensor: r.name,
                end,
                size,
            });
        }
        t.name = b.name;
        self.push(t)
    }
}

fn srcs(src: &[TensorId]) -> [Option<TensorId>; MAX_SRC] {
    let mut out = [None; MAX_SRC];
    for (o, s) in out.iter_mut().zip(src) {
        *o = Some(*s);
    }
    out
}

/// `Tensor::nbytes` with overflow checks (for user-provided view shapes and strides).
pub(crate) fn checked_nbytes(t: &Tensor) -> Option<usize> {
    if t.ne.contains(&0) {
        return Some(0);
    }
    let bs = t.dtype.block_size();
    if t.ne[0] % bs != 0 {
        return None;
    }
    let mut n = if bs == 1 {
        t.dtype.type_size()
    } else {
        (t.ne[0] / bs).checked_mul(t.nb[0])?
    };
    let first = if bs == 1 { 0 } else { 1 };
    for i in first..MAX_DIMS {
        n = n.checked_add((t.ne[i] - 1).checked_mul(t.nb[i])?)?;
    }
    Some(n)
}
