//! What the exact-arithmetic tests share: a launcher that runs one instruction per thread
//! through the interpreter, and oracles that compute the expected bits independently of
//! it (integer arithmetic on the IEEE encodings; never the interpreter's helpers, and
//! never the host's own f32 rounding of the operation under test).

// Each test binary uses part of this module.
#![allow(dead_code)]

use cuda_sim::exec::{launch, LaunchConfig, LaunchError};
use cuda_sim::fault::Checks;
use cuda_sim::mem::FlatMemory;
use cuda_sim::ptx::Module;

const BASE: u64 = 0x1000_0000;

/// The canonical NaN of NVIDIA GPUs' f32 arithmetic (the PTX ISA leaves NaN payloads
/// unspecified; every f32 operation with a NaN result gives this one).
pub const CANONICAL_NAN: u32 = 0x7fff_ffff;

/// The type `ld` / `st` move a value of PTX type `ty` as (f16 and bf16 move as `.b16`).
fn mem_type(ty: &str) -> &str {
    match ty {
        "f16" | "bf16" => "b16",
        t => t,
    }
}

/// The register type declared for a value of PTX type `ty`: f16 and bf16 values live in
/// `.b16` registers, bytes in 16-bit ones (`ld`, `st` and `cvt` take wider registers).
fn reg_type(ty: &str) -> &str {
    match ty {
        "f16" | "bf16" | "b8" => "b16",
        "u8" => "u16",
        "s8" => "s16",
        t => t,
    }
}

/// Runs `instr` once per case. The instruction reads `%xa`, `%xb`, `%xc` (registers of the
/// types `types[0..3]`, loaded from the case's three operands, little-endian, low bytes
/// first) and writes `%xd` (of type `types[3]`), whose bits are returned, zero-extended.
/// `%q` is a spare predicate. Blocks of 32 threads: thread `32 w + l` runs case
/// `32 w + l` in lane `l` of warp `w`, so a warp-wide instruction sees 32 consecutive
/// cases. All of cuda-sim's checks are on.
pub fn run(types: [&str; 4], instr: &str, cases: &[[u64; 3]]) -> Vec<u64> {
    try_run(types, instr, cases).unwrap_or_else(|e| panic!("{e}"))
}

/// [`run`], or the parse or launch error.
pub fn try_run(types: [&str; 4], instr: &str, cases: &[[u64; 3]]) -> Result<Vec<u64>, String> {
    let [ra, rb, rc, rd] = types.map(reg_type);
    let [ta, tb, tc, td] = types.map(mem_type);
    let text = format!(
        ".version 8.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 p_in, .param .u64 p_out, .param .u32 p_n)
{{
    .reg .pred %p0, %q;
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    .reg .{ra} %xa;
    .reg .{rb} %xb;
    .reg .{rc} %xc;
    .reg .{rd} %xd;
    mov.u32 %r0, %ctaid.x;
    mov.u32 %r1, %tid.x;
    mad.lo.u32 %r0, %r0, 32, %r1;
    ld.param.u32 %r2, [p_n];
    setp.ge.u32 %p0, %r0, %r2;
    @%p0 bra DONE;
    ld.param.u64 %rd0, [p_in];
    mul.wide.u32 %rd1, %r0, 24;
    add.u64 %rd1, %rd0, %rd1;
    ld.global.{ta} %xa, [%rd1];
    ld.global.{tb} %xb, [%rd1+8];
    ld.global.{tc} %xc, [%rd1+16];
    {instr}
    ld.param.u64 %rd2, [p_out];
    mul.wide.u32 %rd3, %r0, 8;
    add.u64 %rd2, %rd2, %rd3;
    st.global.{td} [%rd2], %xd;
DONE:
    ret;
}}
"
    );
    let module = Module::parse("exact.ptx", &text).map_err(|e| e.to_string())?;
    let n = cases.len();
    let out_at = BASE + (24 * n as u64).next_multiple_of(256);
    let mem = FlatMemory::new(BASE, (out_at - BASE) as usize + 8 * n + 8, false);
    let input: Vec<u8> = cases
        .iter()
        .flat_map(|c| c.iter().flat_map(|v| v.to_le_bytes()))
        .collect();
    mem.write(BASE, &input);
    let cfg = LaunchConfig {
        grid: [n.div_ceil(32) as u32, 1, 1],
        block: [32, 1, 1],
        dynamic_shared: 0,
        programmatic: false,
    };
    let args: [&[u8]; 3] = [
        &BASE.to_le_bytes(),
        &out_at.to_le_bytes(),
        &(n as u32).to_le_bytes(),
    ];
    match launch(&module, "k", &cfg, &args, &mem, Checks::ALL, 2) {
        Ok(_) => {}
        Err(LaunchError::Fault(f)) => return Err(f.to_string()),
        Err(LaunchError::Invalid(e)) => return Err(e.to_string()),
    }
    let mut out = vec![0u8; 8 * n];
    mem.read(out_at, &mut out);
    Ok(out
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

/// The error that refuses `instr`, or `None` if it runs.
pub fn rejected(types: [&str; 4], instr: &str) -> Option<String> {
    try_run(types, instr, &[[0, 0, 0]]).err()
}

/// Asserts that `got[i] == want[i]` for every case, naming the first few that differ.
pub fn assert_bits(what: &str, cases: &[[u64; 3]], got: &[u64], want: &[u64]) {
    assert_eq!(got.len(), want.len());
    let bad: Vec<String> = cases
        .iter()
        .zip(got.iter().zip(want))
        .filter(|(_, (g, w))| g != w)
        .take(8)
        .map(|(c, (g, w))| format!("  operands {c:#x?}: got {g:#x}, want {w:#x}"))
        .collect();
    let n_bad = got.iter().zip(want).filter(|(g, w)| g != w).count();
    assert!(
        bad.is_empty(),
        "{what}: {n_bad} of {} cases differ:\n{}",
        got.len(),
        bad.join("\n")
    );
}

/// A binary floating-point format: `p` significand bits (hidden bit included), `emin` the
/// exponent of the smallest normal, `emax` of the largest finite value, `bits` wide.
#[derive(Clone, Copy, Debug)]
pub struct Format {
    /// Significand precision.
    pub p: u32,
    /// Smallest normal exponent.
    pub emin: i32,
    /// Largest exponent.
    pub emax: i32,
    /// Width of the encoding.
    pub bits: u32,
}

/// IEEE binary16.
pub const F16: Format = Format::binary(16, 11);
/// bfloat16.
pub const BF16: Format = Format::binary(16, 8);
/// IEEE binary32.
pub const F32: Format = Format::binary(32, 24);
/// IEEE binary64.
pub const F64: Format = Format::binary(64, 53);

impl Format {
    /// The IEEE-style format `bits` wide with `p` significand bits: a sign bit, `bits - p`
    /// exponent bits with bias `emax = 2^(bits - p - 1) - 1`, and `emin = 1 - emax`.
    pub const fn binary(bits: u32, p: u32) -> Format {
        let emax = (1i32 << (bits - p - 1)) - 1;
        Format {
            p,
            emin: 1 - emax,
            emax,
            bits,
        }
    }

    fn bias(self) -> i32 {
        self.emax
    }

    fn frac_bits(self) -> u32 {
        self.p - 1
    }

    /// The encoding of +infinity.
    pub fn inf(self) -> u64 {
        ((1u64 << (self.bits - self.p)) - 1) << self.frac_bits()
    }

    /// The sign bit.
    pub fn sign(self) -> u64 {
        1u64 << (self.bits - 1)
    }

    /// Whether `bits` encode a NaN.
    pub fn is_nan(self, bits: u64) -> bool {
        let mag = bits & (self.sign() - 1);
        mag > self.inf()
    }

    /// A finite encoding as (negative, integer significand m, exponent e): value m * 2^e.
    /// `None` for infinities and NaN.
    pub fn decode(self, bits: u64) -> Option<(bool, u128, i32)> {
        let neg = bits & self.sign() != 0;
        let mag = bits & (self.sign() - 1);
        if mag >= self.inf() {
            return None;
        }
        let field = (mag >> self.frac_bits()) as i32;
        let frac = (mag & ((1u64 << self.frac_bits()) - 1)) as u128;
        let shift = self.bias() + self.frac_bits() as i32;
        Some(if field == 0 {
            (neg, frac, 1 - shift)
        } else {
            (neg, frac | 1 << self.frac_bits(), field - shift)
        })
    }

    /// The value `(-1)^neg * (m + sticky') * 2^e` rounded to nearest, ties to even, where
    /// `sticky` says that nonzero bits follow below `m` (so the value is strictly above
    /// `m * 2^e` in magnitude). Overflow gives infinity, underflow subnormals or zero.
    pub fn round(self, neg: bool, m: u128, e: i32, sticky: bool) -> u64 {
        let sign = if neg { self.sign() } else { 0 };
        if m == 0 {
            assert!(!sticky, "a sticky bit below zero has no magnitude to round");
            return sign;
        }
        let top = e + (127 - m.leading_zeros() as i32); // value in [2^top, 2^(top+1))
        let p = self.p as i32;
        let q = (top - (p - 1)).max(self.emin - (p - 1)); // exponent of the last place
        let shift = q - e;
        let mut mant = if shift <= 0 {
            // Bits below m are below the last place too (shift 0): less than half of it.
            assert!(!sticky || shift == 0, "sticky bits above the last place");
            m << (-shift)
        } else if shift >= 128 {
            0 // far below half the smallest place (m < 2^127 <= half)
        } else {
            let kept = m >> shift;
            let rem = m & ((1u128 << shift) - 1);
            let half = 1u128 << (shift - 1);
            let up = rem > half || (rem == half && (sticky || kept & 1 == 1));
            kept + up as u128
        };
        let mut q = q;
        if mant == 1u128 << p {
            mant >>= 1;
            q += 1;
        }
        let hidden = 1u128 << (p - 1);
        if mant >= hidden {
            let exp = q + p - 1;
            if exp > self.emax {
                return sign | self.inf();
            }
            let field = (exp + self.bias()) as u64;
            sign | field << self.frac_bits() | (mant - hidden) as u64
        } else {
            sign | mant as u64
        }
    }
}

/// f32 bits as u64 (the launcher's operand slots).
pub fn f(x: f32) -> u64 {
    x.to_bits() as u64
}

/// f64 bits.
pub fn d(x: f64) -> u64 {
    x.to_bits()
}

/// The exact value of a finite f32 or f64 encoding as (negative, m, e).
pub fn exact(fmt: Format, bits: u64) -> (bool, u128, i32) {
    fmt.decode(bits).expect("a finite value")
}

/// `x` rounded to nearest integer by `mode` ('n' ties to even, 'z' toward zero, 'm' down,
/// 'p' up), from the encoding: the integer as i128 (saturating far beyond any register),
/// or `None` for NaN and infinities.
pub fn round_to_int(fmt: Format, bits: u64, mode: char) -> Option<i128> {
    let (neg, m, e) = fmt.decode(bits)?;
    let (int, frac_num, frac_den): (i128, u128, u128) = if e >= 0 {
        let int = if e > 60 {
            i128::MAX / 2
        } else {
            (m << e) as i128
        };
        (int, 0, 1)
    } else if -e >= 120 {
        (0, m, 0) // the fraction is tiny but nonzero when m != 0
    } else {
        let den = 1u128 << (-e);
        ((m >> (-e)) as i128, m & (den - 1), den)
    };
    let nonzero = frac_num != 0;
    // Compare the fraction (magnitude) with one half.
    let (above_half, at_half) = if frac_den == 0 {
        (false, false)
    } else {
        (2 * frac_num > frac_den, 2 * frac_num == frac_den)
    };
    let away = match mode {
        'n' => above_half || (at_half && int & 1 == 1),
        'z' => false,
        'm' => neg && nonzero,
        'p' => !neg && nonzero,
        _ => panic!("rounding mode {mode}"),
    };
    let mag = int + away as i128;
    Some(if neg { -mag } else { mag })
}

/// A small seeded generator: the same cases on every run.
pub struct Rng(pub u64);

impl Rng {
    /// 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let x = self.0;
        (x ^ (x >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ (x >> 32)
    }

    /// An f32 with exponent in `lo..=hi` (unbiased), random sign and significand whose
    /// low bits are often all ones or all zeros (where roundings differ).
    pub fn f32_in(&mut self, lo: i32, hi: i32) -> f32 {
        let r = self.next();
        let exp = lo + (r % (hi - lo + 1) as u64) as i32;
        let mut frac = (r >> 16) as u32 & 0x7f_ffff;
        match (r >> 8) & 3 {
            0 => frac |= 0xfff,
            1 => frac &= !0xfff,
            _ => {}
        }
        let sign = ((r >> 12) & 1) as u32;
        f32::from_bits(sign << 31 | ((exp + 127) as u32) << 23 | frac)
    }
}
