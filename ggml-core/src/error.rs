//! The error type of tensor, op and graph construction.

use core::fmt;

use crate::dtype::DType;
use crate::name::Name;

/// What went wrong while building tensors, ops or graphs.
///
/// Every variant names the offending op or tensor so that a message alone says what and
/// where; nothing in this crate panics on bad input.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Error {
    /// A fixed-capacity store (tensors of a context, nodes of a graph) is full.
    CapacityExceeded {
        /// Which store: `"context tensors"`, `"graph nodes"`, ...
        what: &'static str,
        /// Its capacity.
        capacity: usize,
    },
    /// A tensor id does not name a tensor of this context.
    UnknownTensor {
        /// The id.
        id: u32,
        /// Number of tensors in the context.
        len: usize,
    },
    /// Shapes of an op's operands do not fit together.
    Shape {
        /// Op name (`"mul_mat"`, ...).
        op: &'static str,
        /// The rule that failed.
        rule: &'static str,
        /// Name of the first operand.
        a: Name,
        /// Shape of the first operand.
        a_ne: [usize; 4],
        /// Shape of the second operand (or of the requested result).
        b_ne: [usize; 4],
    },
    /// An operand has a dtype the op does not accept.
    DType {
        /// Op name.
        op: &'static str,
        /// Name of the operand.
        tensor: Name,
        /// Its dtype.
        dtype: DType,
        /// What was expected.
        expected: &'static str,
    },
    /// A tensor's first dimension is not a multiple of its dtype's block size.
    BlockAlignment {
        /// The dtype.
        dtype: DType,
        /// The first dimension.
        ne0: usize,
    },
    /// A size computation overflowed `usize`.
    Overflow {
        /// What was being computed.
        what: &'static str,
    },
    /// An op parameter is out of its domain.
    Param {
        /// Op name.
        op: &'static str,
        /// The parameter and the rule it broke.
        what: &'static str,
    },
    /// A view reaches outside the bytes of the tensor it views.
    ViewOutOfBounds {
        /// Name of the viewed tensor.
        tensor: Name,
        /// First byte past the view.
        end: usize,
        /// Bytes of the viewed tensor.
        size: usize,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::CapacityExceeded { what, capacity } => {
                write!(f, "{what}: capacity of {capacity} exceeded")
            }
            Error::UnknownTensor { id, len } => {
                write!(
                    f,
                    "tensor id {id} is not in this context (it has {len} tensors)"
                )
            }
            Error::Shape {
                op,
                rule,
                a,
                a_ne,
                b_ne,
            } => write!(
                f,
                "{op}: shapes do not fit ({rule}): '{a}' is {a_ne:?}, other is {b_ne:?}"
            ),
            Error::DType {
                op,
                tensor,
                dtype,
                expected,
            } => {
                write!(f, "{op}: '{tensor}' has dtype {dtype}, expected {expected}")
            }
            Error::BlockAlignment { dtype, ne0 } => write!(
                f,
                "first dimension {ne0} is not a multiple of the {dtype} block size {}",
                dtype.block_size()
            ),
            Error::Overflow { what } => write!(f, "{what} overflows usize"),
            Error::Param { op, what } => write!(f, "{op}: bad parameter: {what}"),
            Error::ViewOutOfBounds { tensor, end, size } => write!(
                f,
                "view of '{tensor}' ends at byte {end}, past its size of {size} bytes"
            ),
        }
    }
}

impl core::error::Error for Error {}

/// Result with this crate's [`Error`].
pub type Result<T> = core::result::Result<T, Error>;
