//! Bit manipulation as the PTX ISA defines it: `prmt` (every mode), `lop3`, the funnel
//! shift `shf`, `bfi`, `popc`, `clz`, `brev`, `bfind`.

use crate::ptx::ir::{BitOp, PrmtMode, Ty};

/// `prmt.b32[.mode] d, a, b, c`: the bytes of `{b, a}` (a's bytes 0-3, b's 4-7),
/// selected for each destination byte by a nibble of `c` (generic: bit 3 replicates the
/// selected byte's sign) or by a mode's table indexed by `c`'s two low bits.
pub(crate) fn prmt(mode: PrmtMode, a: u64, b: u64, c: u64) -> u64 {
    let src = (b & 0xffff_ffff) << 32 | (a & 0xffff_ffff);
    let byte = |i: u64| (src >> (8 * (i & 7))) & 0xff;
    let s = (c & 3) as usize;
    // The modes' tables, destination bytes 0..3.
    let table: Option<[u64; 4]> = match mode {
        PrmtMode::Generic => None,
        PrmtMode::F4e => Some([[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]][s]),
        PrmtMode::B4e => Some([[0, 7, 6, 5], [1, 0, 7, 6], [2, 1, 0, 7], [3, 2, 1, 0]][s]),
        PrmtMode::Rc8 => Some([[0; 4], [1; 4], [2; 4], [3; 4]][s]),
        PrmtMode::Ecl => Some([[0, 1, 2, 3], [1, 1, 2, 3], [2, 2, 2, 3], [3, 3, 3, 3]][s]),
        PrmtMode::Ecr => Some([[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 2, 2], [0, 1, 2, 3]][s]),
        PrmtMode::Rc16 => Some([[0, 1, 0, 1], [2, 3, 2, 3], [0, 1, 0, 1], [2, 3, 2, 3]][s]),
    };
    let mut d = 0u64;
    for i in 0..4 {
        let v = match table {
            Some(t) => byte(t[i]),
            None => {
                let sel = (c >> (4 * i)) & 0xf;
                let v = byte(sel);
                if sel & 8 != 0 {
                    if v & 0x80 != 0 {
                        0xff
                    } else {
                        0
                    }
                } else {
                    v
                }
            }
        };
        d |= v << (8 * i);
    }
    d
}

/// `lop3.b32`: each result bit is bit `(a << 2) | (b << 1) | c` of `lut`.
pub(crate) fn lop3(a: u64, b: u64, c: u64, lut: u8) -> u64 {
    let mut d = 0u64;
    for i in 0..32 {
        let idx = ((a >> i & 1) << 2) | ((b >> i & 1) << 1) | (c >> i & 1);
        d |= ((lut as u64 >> idx) & 1) << i;
    }
    d
}

/// `shf.{l,r}.{clamp,wrap}.b32`: `{b, a}` shifted by `c` (clamped to 32, or modulo
/// 32); left gives the upper word, right the lower.
pub(crate) fn shf(left: bool, wrap: bool, a: u64, b: u64, c: u64) -> u64 {
    let v = (b & 0xffff_ffff) << 32 | (a & 0xffff_ffff);
    let c = c as u32;
    let n = if wrap { c & 31 } else { c.min(32) };
    if left {
        (v << n) >> 32
    } else {
        (v >> n) & 0xffff_ffff
    }
}

/// `bfi`: `b` with bits `pos..pos + len` (from the low 8 bits of each, clipped at the
/// top bit) replaced by the low bits of `a`.
pub(crate) fn bfi(ty: Ty, a: u64, b: u64, pos: u64, len: u64) -> u64 {
    let w = ty.bits();
    let (pos, len) = ((pos & 0xff) as u32, (len & 0xff) as u32);
    let mut f = b;
    for i in 0..len {
        if pos + i >= w {
            break;
        }
        let bit = 1u64 << (pos + i);
        f = (f & !bit) | ((a >> i & 1) << (pos + i));
    }
    super::arith::mask(f, ty)
}

/// `popc`, `clz`, `brev`, `bfind[.shiftamt]`.
pub(crate) fn bits(op: BitOp, ty: Ty, shift: bool, a: u64) -> u64 {
    let w = ty.bits();
    let v = super::arith::mask(a, ty);
    match op {
        BitOp::Popc => v.count_ones() as u64,
        BitOp::Clz => (v.leading_zeros() - (64 - w)) as u64,
        BitOp::Brev => v.reverse_bits() >> (64 - w),
        BitOp::Bfind => {
            // Signed: the highest bit that differs from the sign bit.
            let x = if ty.is_signed() && v >> (w - 1) & 1 == 1 {
                !v & super::arith::mask(u64::MAX, ty)
            } else {
                v
            };
            if x == 0 {
                0xffff_ffff
            } else {
                let pos = 63 - x.leading_zeros() as u64;
                if shift {
                    (w as u64 - 1) - pos
                } else {
                    pos
                }
            }
        }
    }
}
