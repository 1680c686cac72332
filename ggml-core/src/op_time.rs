//! The time a backend spent in one kind of op, for backends that can time their nodes
//! (ggml-cpu's and ggml-cuda's `set_op_timing` / `take_op_times`).

use core::fmt;

use crate::op::Op;
use crate::tensor::{Tensor, TensorId};

/// What a timed node is counted as: its op's name and, for products, the weights' type.
pub type OpKey = (&'static str, Option<&'static str>);

/// The time spent in one kind of op: every node with the same op and, for products,
/// the same weight type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpTime {
    /// The op's name ([`Op::name`]).
    pub op: &'static str,
    /// For MUL_MAT and MUL_MAT_ID, the weights' type ([`DType::name`](crate::DType::name)).
    pub weights: Option<&'static str>,
    /// Nodes timed.
    pub calls: u64,
    /// Their summed time in milliseconds.
    pub ms: f64,
}

impl OpTime {
    /// What node `id` of `tensors` is counted as, `(op, weights)`; `None` for nodes that
    /// compute nothing (views, no-ops, empty tensors), which are not timed.
    pub fn key_of(tensors: &[Tensor], id: TensorId) -> Option<OpKey> {
        let node = tensors.get(id.index())?;
        if node.op.is_view() || node.op == Op::None || node.nelements() == 0 {
            return None;
        }
        let weights = match node.op {
            Op::MulMat | Op::MulMatId => node.src[0]
                .and_then(|s| tensors.get(s.index()))
                .map(|w| w.dtype.name()),
            _ => None,
        };
        Some((node.op.name(), weights))
    }

    /// The sums of key `key`.
    pub fn new(key: OpKey, calls: u64, ms: f64) -> OpTime {
        OpTime {
            op: key.0,
            weights: key.1,
            calls,
            ms,
        }
    }

    /// Sorts `times` longest first (equal times by op and weights), as backends report them.
    pub fn sort_longest_first(times: &mut [OpTime]) {
        times.sort_unstable_by(|x, y| {
            y.ms.total_cmp(&x.ms)
                .then_with(|| (x.op, x.weights).cmp(&(y.op, y.weights)))
        });
    }
}

impl fmt::Display for OpTime {
    /// The op and, for products, the weights' type: `MUL_MAT q4_1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.weights {
            Some(w) => write!(f, "{} {w}", self.op),
            None => f.write_str(self.op),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Context, DType};

    #[test]
    fn products_are_keyed_by_their_weights_and_views_are_not_timed() {
        let mut s = [Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 8];
        let mut ctx = Context::new(&mut s);
        let w = ctx.new_tensor(DType::Q4_0, [64, 4, 1, 1]).unwrap();
        let x = ctx.new_tensor(DType::F32, [64, 2, 1, 1]).unwrap();
        let y = ctx.mul_mat(w, x).unwrap();
        let v = ctx.view_2d(y, 4, 1, 16, 0).unwrap();
        let z = ctx.add(y, y).unwrap();
        let t = ctx.tensors();
        assert_eq!(OpTime::key_of(t, y), Some(("MUL_MAT", Some("q4_0"))));
        assert_eq!(OpTime::key_of(t, z), Some(("ADD", None)));
        assert_eq!(OpTime::key_of(t, v), None);
        assert_eq!(OpTime::key_of(t, w), None, "a leaf computes nothing");
        assert_eq!(OpTime::key_of(t, TensorId(99)), None);
        let time = OpTime {
            op: "MUL_MAT",
            weights: Some("q4_0"),
            calls: 2,
            ms: 1.5,
        };
        let mut buf = [0u8; 32];
        let mut w = Buf(&mut buf, 0);
        fmt::write(&mut w, format_args!("{time}")).unwrap();
        assert_eq!(&w.0[..w.1], b"MUL_MAT q4_0");
    }

    /// A fixed buffer to format into without alloc.
    struct Buf<'a>(&'a mut [u8], usize);
    impl fmt::Write for Buf<'_> {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            let end = self.1 + s.len();
            self.0
                .get_mut(self.1..end)
                .ok_or(fmt::Error)?
                .copy_from_slice(s.as_bytes());
            self.1 = end;
            Ok(())
        }
    }
}
