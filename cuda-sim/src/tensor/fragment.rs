//! Which element of A, B and C/D each lane's registers hold, as the PTX ISA's tables
//! "Matrix Fragments for mma.m16n8k8 / m16n8k16 / m16n8k32" define them (section
//! 9.7.14.5). With `groupID = laneid >> 2` and `threadID_in_group = laneid % 4`:
//!
//! - A, 16-bit elements (m16n8k8: a0..a3; m16n8k16: a0..a7, two per `.f16x2`/`.b32`
//!   register, low half first): row = groupID + 8 for a2, a3, a6, a7, else groupID;
//!   col = threadID_in_group * 2 + (i & 1), plus 8 for i >= 4.
//! - A, 8-bit elements (m16n8k16: a0..a7; m16n8k32: a0..a15, four per register, lowest
//!   byte first): row = groupID + 8 for 4 <= i < 8 and 12 <= i < 16, else groupID;
//!   col = threadID_in_group * 4 + (i & 3), plus 16 for i >= 8.
//! - B, 16-bit (m16n8k8: b0, b1; m16n8k16: b0..b3): row = threadID_in_group * 2 +
//!   (i & 1), plus 8 for i >= 2; col = groupID.
//! - B, 8-bit (m16n8k16: b0..b3; m16n8k32: b0..b7): row = threadID_in_group * 4 + (i & 3),
//!   plus 16 for i >= 4; col = groupID.
//! - C and D (c0..c3, one per `.f32`/`.s32` register, or two per `.f16x2` register):
//!   row = groupID, plus 8 for i >= 2; col = threadID_in_group * 2 + (i & 1).

/// A matrix operand of an `mma` (C and D share a layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Matrix {
    /// The m x k multiplicand.
    A,
    /// The k x n multiplicand.
    B,
    /// The m x n accumulator and result.
    C,
}

/// Elements of `matrix` one lane holds for shape `m16n8k{k}`.
pub fn elements_per_lane(matrix: Matrix, k: u32) -> u32 {
    match matrix {
        Matrix::A => 16 * k / 32,
        Matrix::B => k * 8 / 32,
        Matrix::C => 4,
    }
}

/// The (row, col) of element `i` (in the ISA's low-to-high order) of `lane`'s fragment
/// of `matrix` for `mma.m16n8k{k}` with A/B elements of `elem_bits` (16 for f16/bf16,
/// 8 for s8/u8; ignored for C). `None` for an unsupported shape or an index past the
/// fragment.
pub fn fragment_coord(
    matrix: Matrix,
    k: u32,
    elem_bits: u32,
    lane: u32,
    i: u32,
) -> Option<(u32, u32)> {
    let supported = matches!((k, elem_bits), (8 | 16, 16) | (16 | 32, 8));
    if lane >= 32 || i >= elements_per_lane(matrix, k) || (matrix != Matrix::C && !supported) {
        return None;
    }
    let (g, t) = (lane >> 2, lane & 3);
    Some(match (matrix, elem_bits) {
        (Matrix::A, 16) => (g + 8 * ((i >> 1) & 1), t * 2 + (i & 1) + 8 * (i >> 2)),
        (Matrix::A, _) => (g + 8 * ((i >> 2) & 1), t * 4 + (i & 3) + 16 * (i >> 3)),
        (Matrix::B, 16) => (t * 2 + (i & 1) + 8 * (i >> 1), g),
        (Matrix::B, _) => (t * 4 + (i & 3) + 16 * (i >> 2), g),
        (Matrix::C, _) => (g + 8 * (i >> 1), t * 2 + (i & 1)),
    })
}

/// For `mma.m16n8k{k}` with A/B elements of `elem_bits`: the row-major index in
/// `matrix` of each lane's fragment elements, lane-major (`lane * elements + i`),
/// computed once from [`fragment_coord`]. `None` for an unsupported shape.
pub(crate) fn fragment_table(matrix: Matrix, k: u32, elem_bits: u32) -> Option<&'static [u16]> {
    use std::sync::OnceLock;
    const SHAPES: [(u32, u32); 4] = [(8, 16), (16, 16), (16, 8), (32, 8)];
    static TABLES: OnceLock<Vec<Vec<u16>>> = OnceLock::new();
    let tables = TABLES.get_or_init(|| {
        let mut all = Vec::new();
        for (k, bits) in SHAPES {
            for matrix in [Matrix::A, Matrix::B, Matrix::C] {
                let cols = match matrix {
                    Matrix::A => k,
                    _ => 8,
                };
                let per = elements_per_lane(matrix, k);
                let mut t = Vec::with_capacity((32 * per) as usize);
                for lane in 0..32 {
                    for i in 0..per {
                        let (r, c) = fragment_coord(matrix, k, bits, lane, i).expect("a shape");
                        t.push((r * cols + c) as u16);
                    }
                }
                all.push(t);
            }
        }
        all
    });
    let s = SHAPES.iter().position(|&x| x == (k, elem_bits))?;
    let m = match matrix {
        Matrix::A => 0,
        Matrix::B => 1,
        Matrix::C => 2,
    };
    Some(&tables[s * 3 + m])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element of every matrix is held by exactly one (lane, index).
    #[test]
    fn fragments_cover_each_matrix_once() {
        for (k, bits) in [(8, 16), (16, 16), (16, 8), (32, 8)] {
            for (matrix, rows, cols) in [(Matrix::A, 16, k), (Matrix::B, k, 8), (Matrix::C, 16, 8)]
            {
                let mut seen = vec![0u32; (rows * cols) as usize];
                for lane in 0..32 {
                    for i in 0..elements_per_lane(matrix, k) {
                        let (r, c) = fragment_coord(matrix, k, bits, lane, i).unwrap();
                        assert!(r < rows && c < cols, "{matrix:?} k{k}: ({r}, {c})");
                        seen[(r * cols + c) as usize] += 1;
                    }
                }
                assert!(seen.iter().all(|&n| n == 1), "{matrix:?} k{k} b{bits}");
            }
        }
        assert_eq!(fragment_coord(Matrix::A, 32, 16, 0, 0), None);
        assert_eq!(fragment_coord(Matrix::C, 16, 16, 0, 4), None);
    }
}
