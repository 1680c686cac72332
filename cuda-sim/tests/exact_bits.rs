//! cuda-sim's bit instructions against the PTX ISA's definitions, written out here bit
//! by bit: `prmt` in every mode, `lop3` with every lookup table on chosen bit patterns,
//! the funnel shifts `shf.{l,r}.{clamp,wrap}`, `bfi`, `popc`, `clz`, `brev` and `bfind`
//! (with `.shiftamt`, signed and unsigned).

mod exact;

use exact::{assert_bits, run, Rng};
use rstest::rstest;

fn words(seed: u64, n: usize) -> Vec<u64> {
    let mut v = vec![
        0,
        1,
        0x8000_0000,
        0xffff_ffff,
        0x7fff_ffff,
        0x8080_8080,
        0x0123_4567,
    ];
    let mut r = Rng(seed);
    while v.len() < n {
        v.push(r.next() & 0xffff_ffff);
    }
    v
}

/// Byte `i` (0..7) of `{b, a}`: a holds bytes 0-3, b 4-7.
fn byte(a: u64, b: u64, i: u64) -> u64 {
    if i < 4 {
        a >> (8 * i) & 0xff
    } else {
        b >> (8 * (i - 4)) & 0xff
    }
}

/// The ISA's tables of the special modes: for selector 0..3, the source byte of
/// destination bytes 3, 2, 1, 0 (the table's column order).
fn mode_table(mode: &str, s: usize) -> [u64; 4] {
    let t: [[u64; 4]; 4] = match mode {
        "f4e" => [[3, 2, 1, 0], [4, 3, 2, 1], [5, 4, 3, 2], [6, 5, 4, 3]],
        "b4e" => [[5, 6, 7, 0], [6, 7, 0, 1], [7, 0, 1, 2], [0, 1, 2, 3]],
        "rc8" => [[0, 0, 0, 0], [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]],
        "ecl" => [[3, 2, 1, 0], [3, 2, 1, 1], [3, 2, 2, 2], [3, 3, 3, 3]],
        "ecr" => [[0, 0, 0, 0], [1, 1, 1, 0], [2, 2, 1, 0], [3, 2, 1, 0]],
        "rc16" => [[1, 0, 1, 0], [3, 2, 3, 2], [1, 0, 1, 0], [3, 2, 3, 2]],
        _ => unreachable!(),
    };
    t[s]
}

#[rstest]
fn prmt_every_mode(#[values("", "f4e", "b4e", "rc8", "ecl", "ecr", "rc16")] mode: &str) {
    let a = words(1, 200);
    let b = words(2, 200);
    let c = words(3, 200);
    let cases: Vec<[u64; 3]> = (0..200).map(|i| [a[i], b[(i + 7) % 200], c[i]]).collect();
    let m = if mode.is_empty() {
        String::new()
    } else {
        format!(".{mode}")
    };
    let instr = format!("prmt.b32{m} %xd, %xa, %xb, %xc;");
    let got = run(["b32", "b32", "b32", "b32"], &instr, &cases);
    let want: Vec<u64> = cases
        .iter()
        .map(|&[a, b, c]| {
            let mut d = 0;
            for i in 0..4u64 {
                let v = if mode.is_empty() {
                    let sel = c >> (4 * i) & 0xf;
                    let v = byte(a, b, sel & 7);
                    match (sel & 8 != 0, v & 0x80 != 0) {
                        (true, true) => 0xff,
                        (true, false) => 0,
                        _ => v,
                    }
                } else {
                    byte(a, b, mode_table(mode, (c & 3) as usize)[3 - i as usize])
                };
                d |= v << (8 * i);
            }
            d
        })
        .collect();
    let got: Vec<u64> = got.iter().map(|g| g & 0xffff_ffff).collect();
    assert_bits(&instr, &cases, &got, &want);
}

/// Every lookup table on operands holding all eight input combinations per bit group.
#[test]
fn lop3_every_table() {
    // Bit j of a, b, c is (j >> 2) & 1, (j >> 1) & 1, j & 1 for j in 0..8, repeated.
    let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
    for bit in 0..32 {
        let j = bit % 8;
        a |= ((j >> 2) & 1) << bit;
        b |= ((j >> 1) & 1) << bit;
        c |= (j & 1) << bit;
    }
    for lut in 0..=255u64 {
        let instr = format!("lop3.b32 %xd, %xa, %xb, %xc, {lut};");
        let got = run(["b32", "b32", "b32", "b32"], &instr, &[[a, b, c]])[0] & 0xffff_ffff;
        // The result's byte pattern is the table itself (bit j of each byte = lut bit j).
        let want = lut * 0x0101_0101;
        assert_eq!(got, want, "{instr}");
    }
    // The ISA's example: F(a, b, c) = (a & b) | c has the table (0xF0 & 0xCC) | 0xAA.
    let lut = (0xf0 & 0xcc) | 0xaa;
    let cases: Vec<[u64; 3]> = words(9, 100)
        .chunks(3)
        .filter(|w| w.len() == 3)
        .map(|w| [w[0], w[1], w[2]])
        .collect();
    let instr = format!("lop3.b32 %xd, %xa, %xb, %xc, {lut};");
    let got: Vec<u64> = run(["b32", "b32", "b32", "b32"], &instr, &cases)
        .iter()
        .map(|g| g & 0xffff_ffff)
        .collect();
    let want: Vec<u64> = cases.iter().map(|c| (c[0] & c[1]) | c[2]).collect();
    assert_bits(&instr, &cases, &got, &want);
}

#[rstest]
fn funnel_shifts(#[values("l", "r")] dir: &str, #[values("clamp", "wrap")] mode: &str) {
    let a = words(4, 80);
    let b = words(5, 80);
    let mut cases = Vec::new();
    for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
        for n in [0u64, 1, 7, 31, 32, 33, 63, 200 + i as u64] {
            cases.push([x, y, n]);
        }
    }
    let instr = format!("shf.{dir}.{mode}.b32 %xd, %xa, %xb, %xc;");
    let got: Vec<u64> = run(["b32", "b32", "u32", "b32"], &instr, &cases)
        .iter()
        .map(|g| g & 0xffff_ffff)
        .collect();
    let want: Vec<u64> = cases
        .iter()
        .map(|&[a, b, c]| {
            let n = if mode == "wrap" { c % 32 } else { c.min(32) };
            // Bit i of the 64-bit {b, a}.
            let bit = |i: u64| {
                if i < 32 {
                    a >> i & 1
                } else {
                    b >> (i - 32) & 1
                }
            };
            let mut d = 0;
            for i in 0..32u64 {
                // Left: result bit i is bit (32 + i - n) of the pair; right: bit (i + n).
                let src = if dir == "l" { 32 + i - n } else { i + n };
                let v = if src < 64 { bit(src) } else { 0 };
                d |= v << i;
            }
            d
        })
        .collect();
    assert_bits(&instr, &cases, &got, &want);
}

#[test]
fn bfi_inserts_clipped_fields() {
    let a = words(6, 60);
    let b = words(7, 60);
    let mut cases = Vec::new();
    for i in 0..60 {
        for (pos, len) in [
            (0u64, 0u64),
            (0, 8),
            (4, 12),
            (28, 8),
            (31, 1),
            (0, 32),
            (5, 255),
            (300, 4),
        ] {
            // pos and len travel in one operand: pos in the low half, len in the high.
            cases.push([a[i], b[i], pos | len << 16]);
        }
    }
    let instr = "shr.b32 %r3, %xc, 16;\n    and.b32 %xc, %xc, 0xffff;\n    bfi.b32 %xd, %xa, %xb, %xc, %r3;";
    let got: Vec<u64> = run(["b32", "b32", "b32", "b32"], instr, &cases)
        .iter()
        .map(|g| g & 0xffff_ffff)
        .collect();
    let want: Vec<u64> = cases
        .iter()
        .map(|&[a, b, pl]| {
            let (pos, len) = (pl & 0xff, pl >> 16 & 0xff);
            let mut f = b;
            for i in 0..len {
                if pos + i > 31 {
                    break;
                }
                f = (f & !(1 << (pos + i))) | ((a >> i & 1) << (pos + i));
            }
            f
        })
        .collect();
    assert_bits("bfi.b32", &cases, &got, &want);
}

#[rstest]
#[case::popc("popc.b32", 0xf0f0_0001, 9)]
#[case::popc_zero("popc.b32", 0, 0)]
#[case::clz("clz.b32", 0x0000_8000, 16)]
#[case::clz_zero("clz.b32", 0, 32)]
#[case::brev("brev.b32", 0x0000_0001, 0x8000_0000)]
#[case::brev_pattern("brev.b32", 0x1234_5678, 0x1e6a_2c48)]
#[case::bfind_u32("bfind.u32", 0x0001_0000, 16)]
#[case::bfind_u32_zero("bfind.u32", 0, 0xffff_ffff)]
#[case::bfind_shiftamt("bfind.shiftamt.u32", 0x0001_0000, 15)]
// Signed: the highest bit differing from the sign: -1 has none, -2 has bit 0.
#[case::bfind_s32_minus_one("bfind.s32", 0xffff_ffff, 0xffff_ffff)]
#[case::bfind_s32_minus_two("bfind.s32", 0xffff_fffe, 0)]
#[case::bfind_s32_positive("bfind.s32", 0x0000_00ff, 7)]
fn one_operand_bit_ops(#[case] instr: &str, #[case] a: u64, #[case] want: u64) {
    let text = format!("{instr} %xd, %xa;");
    let got = run(["b32", "b32", "b32", "u32"], &text, &[[a, 0, 0]]);
    assert_eq!(got[0] & 0xffff_ffff, want, "{text} of {a:#x}");
}

/// 64-bit sources: counts match a bit loop; `popc.b64` and `clz.b64` give a u32.
#[test]
fn sixty_four_bit_counts() {
    let cases: Vec<[u64; 3]> = words(8, 100)
        .iter()
        .zip(words(9, 100))
        .map(|(&x, y)| [x << 32 | y, 0, 0])
        .collect();
    for (op, f) in [
        (
            "popc.b64",
            (|x: u64| x.count_ones() as u64) as fn(u64) -> u64,
        ),
        ("clz.b64", |x: u64| {
            (0..64).rev().take_while(|i| x >> i & 1 == 0).count() as u64
        }),
    ] {
        let text = format!("{op} %xd, %xa;");
        let got: Vec<u64> = run(["b64", "b64", "b64", "u32"], &text, &cases)
            .iter()
            .map(|g| g & 0xffff_ffff)
            .collect();
        let want: Vec<u64> = cases.iter().map(|c| f(c[0])).collect();
        assert_bits(op, &cases, &got, &want);
    }
}

/// `and`, `or`, `xor` on 32 and 64 bits against their truth tables, applied bit by bit,
/// on words whose bits overlap in every combination (so `or` and `xor` differ).
#[rstest]
#[case::and("and", [0, 0, 0, 1])]
#[case::or("or", [0, 1, 1, 1])]
#[case::xor("xor", [0, 1, 1, 0])]
fn logic_ops_follow_their_truth_tables(
    #[case] op: &str,
    #[case] table: [u64; 4],
    #[values(32, 64)] bits: u32,
) {
    let ws = words(11, 40);
    let cases: Vec<[u64; 3]> = ws
        .iter()
        .zip(ws.iter().rev())
        .map(|(&x, &y)| {
            if bits == 64 {
                [x << 32 | y, y << 32 | x, 0]
            } else {
                [x, y, 0]
            }
        })
        .collect();
    let want: Vec<u64> = cases
        .iter()
        .map(|&[a, b, _]| {
            (0..bits).fold(0, |acc, i| {
                let t = table[((a >> i & 1) << 1 | (b >> i & 1)) as usize];
                acc | t << i
            })
        })
        .collect();
    let ty = format!("b{bits}");
    let text = format!("{op}.{ty} %xd, %xa, %xb;");
    let got = run([ty.as_str(); 4], &text, &cases);
    assert_bits(&text, &cases, &got, &want);
}

/// `not` on 16, 32 and 64 bits flips every bit of the register's width and nothing above
/// it (the integer path of `un`, which `not.b32` shares with no float).
#[rstest]
fn not_flips_every_bit_of_its_width(#[values(16, 32, 64)] bits: u32) {
    let ws = words(5, 40);
    let cases: Vec<[u64; 3]> = ws
        .iter()
        .zip(ws.iter().rev())
        .map(|(&x, &y)| [(x << 32 | y) & (u64::MAX >> (64 - bits)), 0, 0])
        .collect();
    let want: Vec<u64> = cases
        .iter()
        .map(|&[a, _, _]| (0..bits).fold(0, |acc, i| acc | ((a >> i & 1) ^ 1) << i))
        .collect();
    let ty = format!("b{bits}");
    let text = format!("not.{ty} %xd, %xa;");
    let got = run([ty.as_str(); 4], &text, &cases);
    assert_bits(&text, &cases, &got, &want);
}
