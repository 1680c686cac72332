//! cuda-sim's integer and lane instructions, run through the interpreter and compared
//! with values computed here in 128-bit integer arithmetic or read off the PTX ISA's
//! definitions: wrapping `add` / `sub` / `mul.lo`, `mul.hi`, `mul.wide`, `mad`, shifts by
//! the width or more (clamped to the width, as the ISA says), `div` / `rem` (by zero as
//! cuda-sim documents: all ones, and the dividend), `min` / `max`, `neg` / `abs`, `bfe`,
//! `dp4a` in its four signednesses, and `shfl.sync` up / down / idx / bfly with clamps
//! and segment masks.

mod exact;

use exact::{assert_bits, run, Rng};
use rstest::rstest;

/// Bits of a PTX integer type.
fn width(ty: &str) -> u32 {
    ty[1..].parse().expect("a width")
}

fn mask(ty: &str, v: u128) -> u64 {
    let w = width(ty);
    (if w == 64 { v } else { v & ((1u128 << w) - 1) }) as u64
}

/// The value of `x`'s low bits as `ty` (sign- or zero-extended).
fn val(ty: &str, x: u64) -> i128 {
    let w = width(ty);
    let low = mask(ty, x as u128) as i128;
    if ty.starts_with('s') && low >> (w - 1) & 1 == 1 {
        low - (1i128 << w)
    } else {
        low
    }
}

/// Operands with every magnitude and the edges of each width.
fn operands(seed: u64, n: usize) -> Vec<u64> {
    let mut v = vec![
        0,
        1,
        2,
        3,
        0x7f,
        0x80,
        0xff,
        0x7fff,
        0x8000,
        0xffff,
        0x7fff_ffff,
        0x8000_0000,
        0xffff_ffff,
        0x1_0000_0000,
        i64::MAX as u64,
        i64::MIN as u64,
        u64::MAX,
        u64::MAX - 1,
    ];
    let mut r = Rng(seed);
    while v.len() < n {
        let x = r.next() >> (r.next() % 64);
        v.push(if r.next() & 1 == 0 {
            x
        } else {
            x.wrapping_neg()
        });
    }
    v
}

/// Pairs (and a third operand) drawn from [`operands`].
fn triples(seed: u64, n: usize) -> Vec<[u64; 3]> {
    let a = operands(seed, n);
    let b = operands(seed + 1, n);
    let c = operands(seed + 2, n);
    // Every edge against every edge first, then the random ones.
    let mut out: Vec<[u64; 3]> = Vec::new();
    for (i, &x) in a.iter().take(18).enumerate() {
        for &y in b.iter().take(18) {
            out.push([x, y, c[i]]);
        }
    }
    out.extend((0..n).map(|i| [a[i], b[(i * 7 + 3) % n], c[(i * 13 + 5) % n]]));
    out
}

fn check(instr: &str, types: [&str; 4], cases: &[[u64; 3]], want: impl Fn(&[u64; 3]) -> u64) {
    let got = run(types, instr, cases);
    let dw = width(types[3]);
    let m = if dw == 64 { u64::MAX } else { (1 << dw) - 1 };
    let got: Vec<u64> = got.iter().map(|g| g & m).collect();
    let want: Vec<u64> = cases.iter().map(want).collect();
    assert_bits(instr, cases, &got, &want);
}

#[rstest]
fn add_sub_mul_lo_wrap(#[values("u16", "s16", "u32", "s32", "u64", "s64")] ty: &str) {
    let cases = triples(1, 600);
    let t = [ty, ty, ty, ty];
    check(&format!("add.{ty} %xd, %xa, %xb;"), t, &cases, |c| {
        mask(ty, (val(ty, c[0]) + val(ty, c[1])) as u128)
    });
    check(&format!("sub.{ty} %xd, %xa, %xb;"), t, &cases, |c| {
        mask(ty, (val(ty, c[0]) - val(ty, c[1])) as u128)
    });
    check(&format!("mul.lo.{ty} %xd, %xa, %xb;"), t, &cases, |c| {
        mask(ty, val(ty, c[0]).wrapping_mul(val(ty, c[1])) as u128)
    });
    check(
        &format!("mad.lo.{ty} %xd, %xa, %xb, %xc;"),
        t,
        &cases,
        |c| {
            let p = val(ty, c[0]).wrapping_mul(val(ty, c[1]));
            mask(ty, p.wrapping_add(val(ty, c[2])) as u128)
        },
    );
}

/// The high half of the double-width product (i128 holds every 64-bit product).
fn high(ty: &str, a: u64, b: u64) -> i128 {
    let w = width(ty);
    let (x, y) = (val(ty, a), val(ty, b));
    match x.checked_mul(y) {
        Some(p) => p >> w,
        // u64 * u64 may exceed i128: use u128.
        None => ((x as u128).wrapping_mul(y as u128) >> w) as i128,
    }
}

#[rstest]
fn mul_hi_and_mad_hi(#[values("u16", "s16", "u32", "s32", "u64", "s64")] ty: &str) {
    let cases = triples(2, 600);
    let t = [ty, ty, ty, ty];
    check(&format!("mul.hi.{ty} %xd, %xa, %xb;"), t, &cases, |c| {
        mask(ty, high(ty, c[0], c[1]) as u128)
    });
    check(
        &format!("mad.hi.{ty} %xd, %xa, %xb, %xc;"),
        t,
        &cases,
        |c| mask(ty, high(ty, c[0], c[1]).wrapping_add(val(ty, c[2])) as u128),
    );
}

#[rstest]
#[case::u16("u16", "u32")]
#[case::s16("s16", "s32")]
#[case::u32("u32", "u64")]
#[case::s32("s32", "s64")]
fn mul_wide_and_mad_wide(#[case] ty: &str, #[case] wide: &str) {
    let cases = triples(3, 600);
    check(
        &format!("mul.wide.{ty} %xd, %xa, %xb;"),
        [ty, ty, wide, wide],
        &cases,
        |c| mask(wide, (val(ty, c[0]) * val(ty, c[1])) as u128),
    );
    check(
        &format!("mad.wide.{ty} %xd, %xa, %xb, %xc;"),
        [ty, ty, wide, wide],
        &cases,
        |c| {
            mask(
                wide,
                (val(ty, c[0]) * val(ty, c[1]) + val(wide, c[2])) as u128,
            )
        },
    );
}

/// Shift amounts are unsigned 32-bit and clamped to the width: `shl` and `shr.u` by the
/// width or more give 0, `shr.s` the sign (PTX ISA, shl / shr).
#[rstest]
fn shifts_clamp_to_the_width(#[values("b16", "b32", "b64", "u32", "s16", "s32", "s64")] ty: &str) {
    let w = width(ty) as u64;
    let values = operands(4, 24);
    let mut cases = Vec::new();
    for &x in &values {
        for s in (0..=w + 6).chain([w * 2, 100, 0x7fff_ffff, 0xffff_ffff, 0x1_0000_0001]) {
            cases.push([x, s, 0]);
        }
    }
    let t = [ty, "u32", "u32", ty];
    // The shift operand is a u32 register: its low 32 bits count.
    let amount = |c: &[u64; 3]| (c[1] & 0xffff_ffff) as u128;
    if !ty.starts_with('s') {
        check(&format!("shl.{ty} %xd, %xa, %xb;"), t, &cases, |c| {
            let s = amount(c);
            if s >= w as u128 {
                0
            } else {
                mask(ty, (mask(ty, c[0] as u128) as u128) << s)
            }
        });
    }
    let shr = if ty.starts_with('b') {
        ty.replace('b', "u")
    } else {
        ty.to_string()
    };
    check(
        &format!("shr.{shr} %xd, %xa, %xb;"),
        [&shr, "u32", "u32", &shr],
        &cases,
        |c| {
            let s = amount(c).min(w as u128 - 1);
            let v = val(&shr, c[0]);
            if shr.starts_with('u') && amount(c) >= w as u128 {
                0
            } else {
                mask(&shr, (v >> s) as u128)
            }
        },
    );
}

#[rstest]
fn div_rem_truncate_and_by_zero(#[values("u16", "s16", "u32", "s32", "u64", "s64")] ty: &str) {
    let mut cases = triples(5, 600);
    // The quotient of MIN / -1 overflows: the ISA leaves it open, so it is not checked.
    cases.retain(|c| {
        !(ty.starts_with('s')
            && val(ty, c[1]) == -1
            && val(ty, c[0]) == -(1i128 << (width(ty) - 1)))
    });
    for x in [7u64, 0, u64::MAX, 0x8000_0000] {
        cases.push([x, 0, 0]);
    }
    let t = [ty, ty, ty, ty];
    let ones = mask(ty, u128::MAX);
    check(&format!("div.{ty} %xd, %xa, %xb;"), t, &cases, |c| {
        let (x, y) = (val(ty, c[0]), val(ty, c[1]));
        if y == 0 {
            ones // cuda-sim: all ones (what NVIDIA GPUs give for unsigned)
        } else {
            mask(ty, (x / y) as u128) // truncates toward zero
        }
    });
    check(&format!("rem.{ty} %xd, %xa, %xb;"), t, &cases, |c| {
        let (x, y) = (val(ty, c[0]), val(ty, c[1]));
        if y == 0 {
            mask(ty, x as u128) // cuda-sim: the dividend
        } else {
            mask(ty, (x % y) as u128) // the sign of the dividend
        }
    });
}

#[rstest]
fn min_max_neg_abs(#[values("s16", "u32", "s32", "u64", "s64")] ty: &str) {
    let cases = triples(6, 300);
    let t = [ty, ty, ty, ty];
    check(&format!("min.{ty} %xd, %xa, %xb;"), t, &cases, |c| {
        mask(ty, val(ty, c[0]).min(val(ty, c[1])) as u128)
    });
    check(&format!("max.{ty} %xd, %xa, %xb;"), t, &cases, |c| {
        mask(ty, val(ty, c[0]).max(val(ty, c[1])) as u128)
    });
    if ty.starts_with('s') {
        // -MIN and |MIN| wrap to MIN.
        check(&format!("neg.{ty} %xd, %xa;"), t, &cases, |c| {
            mask(ty, (-val(ty, c[0])) as u128)
        });
        check(&format!("abs.{ty} %xd, %xa;"), t, &cases, |c| {
            mask(ty, val(ty, c[0]).unsigned_abs())
        });
    }
}

/// `bfe` edge cases, each worked from the ISA's definition: position and length are the
/// low 8 bits of their operands; bits past the top are the sign bit (signed) or 0; the
/// sign bit is bit min(pos + len - 1, msb); length 0 gives 0.
#[rstest]
#[case::field("bfe.u32", 0xabcd_1234, 8, 8, 0x12)]
#[case::clipped_at_the_top("bfe.u32", 0xabcd_1234, 28, 8, 0xa)]
#[case::signed_clipped("bfe.s32", 0xabcd_1234, 28, 8, 0xffff_fffa)]
#[case::signed_negative_field("bfe.s32", 0x0000_0f00, 8, 4, 0xffff_ffff)]
#[case::signed_positive_field("bfe.s32", 0x0000_0700, 8, 4, 0x7)]
#[case::length_zero("bfe.s32", 0xffff_ffff, 4, 0, 0)]
#[case::past_the_top("bfe.u32", 0xffff_ffff, 40, 4, 0)]
#[case::past_the_top_signed("bfe.s32", 0x8000_0000, 40, 4, 0xffff_ffff)]
#[case::low_eight_bits_only("bfe.u32", 0xabcd_1234, 0x108, 0x208, 0x12)]
#[case::wide("bfe.s64", 0x8000_0000_0000_0000, 60, 10, 0xffff_ffff_ffff_fff8)]
#[case::wide_unsigned("bfe.u64", 0xf000_0000_0000_0001, 0, 64, 0xf000_0000_0000_0001)]
fn bfe_table(
    #[case] op: &str,
    #[case] a: u64,
    #[case] pos: u64,
    #[case] len: u64,
    #[case] want: u64,
) {
    let ty = op.rsplit('.').next().expect("a type");
    let c = [[a, pos, len]];
    check(
        &format!("{op} %xd, %xa, %xb, %xc;"),
        [ty, "u32", "u32", ty],
        &c,
        |_| want,
    );
}

/// Fields inside the word: `(a >> pos) & (2^len - 1)`, sign-extended from `len` bits for
/// the signed types.
#[rstest]
fn bfe_random_fields(#[values("u32", "s32", "u64", "s64")] ty: &str) {
    let w = width(ty) as u64;
    let mut r = Rng(7);
    let cases: Vec<[u64; 3]> = (0..1000)
        .map(|_| {
            let len = 1 + r.next() % w;
            let pos = r.next() % (w - len + 1);
            [mask(ty, r.next() as u128), pos, len]
        })
        .collect();
    check(
        &format!("bfe.{ty} %xd, %xa, %xb, %xc;"),
        [ty, "u32", "u32", ty],
        &cases,
        |c| {
            let (pos, len) = (c[1] as u32, c[2] as u32);
            let field = (c[0] as u128 >> pos) & ((1u128 << len) - 1);
            let v = if ty.starts_with('s') && field >> (len - 1) & 1 == 1 {
                field as i128 - (1i128 << len)
            } else {
                field as i128
            };
            mask(ty, v as u128)
        },
    );
}

/// `dp4a`: c plus the four byte products, bytes signed or unsigned as the types say,
/// wrapping at 32 bits.
#[rstest]
fn dp4a_each_signedness(#[values("u32", "s32")] a_ty: &str, #[values("u32", "s32")] b_ty: &str) {
    let mut cases = triples(8, 500);
    // Sums that wrap: c at the top of the range plus the largest products.
    cases.push([0xffff_ffff, 0xffff_ffff, 0x7fff_ffff]);
    cases.push([0x8080_8080, 0x8080_8080, 0x7fff_0000]);
    cases.push([0x8080_8080, 0x7f7f_7f7f, 0x8000_0000]);
    let byte = |v: u64, i: u32, signed: bool| -> i128 {
        let x = (v >> (8 * i)) as u8;
        if signed {
            x as i8 as i128
        } else {
            x as i128
        }
    };
    check(
        &format!("dp4a.{a_ty}.{b_ty} %xd, %xa, %xb, %xc;"),
        [a_ty, b_ty, "s32", "s32"],
        &cases,
        |c| {
            let sum: i128 = (0..4)
                .map(|i| byte(c[0], i, a_ty == "s32") * byte(c[1], i, b_ty == "s32"))
                .sum();
            mask("s32", (sum + val("s32", c[2])) as u128)
        },
    );
}

/// One warp's shuffle: lane `l` holds `value(l)`, passes `b[l]` and `c`.
fn shuffle(mode: &str, b: impl Fn(u64) -> u64, c: u64) -> Vec<u64> {
    let cases: Vec<[u64; 3]> = (0..32).map(|l| [value(l), b(l), c]).collect();
    run(
        ["b32", "u32", "u32", "b32"],
        &format!("shfl.sync.{mode}.b32 %xd, %xa, %xb, %xc, 0xffffffff;"),
        &cases,
    )
}

fn value(lane: u64) -> u64 {
    0xa000_0000 | (lane * 0x0101)
}

/// The CUDA programming guide's semantics of `__shfl_*_sync(mask, v, x, width)`, which
/// pass `c = (32 - width) << 8` for up and `((32 - width) << 8) | 31` for the others:
/// the lane each lane reads.
fn cuda_source(mode: &str, lane: u64, x: u64, width: u64) -> u64 {
    let base = lane / width * width;
    match mode {
        // From lane - x, unless that is below the segment.
        "up" => {
            if lane - base >= x {
                lane - x
            } else {
                lane
            }
        }
        // From lane + x, unless that is past the segment.
        "down" => {
            if lane - base + x < width {
                lane + x
            } else {
                lane
            }
        }
        // From lane ^ x, unless that is in a later segment.
        "bfly" => {
            if lane ^ x < base + width {
                lane ^ x
            } else {
                lane
            }
        }
        // From lane x of the segment (x mod width).
        _ => base + x % width,
    }
}

#[rstest]
fn shfl_with_cuda_widths(
    #[values("up", "down", "bfly", "idx")] mode: &str,
    #[values(32, 16, 8, 4, 2)] width: u64,
) {
    let c = ((32 - width) << 8) | if mode == "up" { 0 } else { 31 };
    for x in [0u64, 1, 2, 3, 5, 8, 16, 31] {
        let got = shuffle(mode, |_| x, c);
        let want: Vec<u64> = (0..32)
            .map(|l| value(cuda_source(mode, l, x, width)))
            .collect();
        assert_eq!(got, want, "shfl.{mode} by {x}, width {width} (c = {c:#x})");
    }
}

/// Clamps that no CUDA width gives, worked from the ISA: `maxLane = (lane & segmask) |
/// (c & ~segmask)`, `minLane = lane & segmask`, and a lane whose source is out of range
/// reads its own value.
#[rstest]
// down by 4 with clamp 15: lanes 0..=11 read lane + 4; the rest their own.
#[case::down_clamp_15("down", 4, 0x0f, |l: u64| if l <= 11 { l + 4 } else { l })]
// up by 2 with clamp 8: lane - 2 >= 8, so lanes 10..=31 read lane - 2.
#[case::up_clamp_8("up", 2, 0x08, |l: u64| if l >= 10 { l - 2 } else { l })]
// bfly 16 with clamp 15: lanes 16..=31 read lane - 16; lanes 0..=15 would read past 15.
#[case::bfly_clamp_15("bfly", 16, 0x0f, |l: u64| if l >= 16 { l - 16 } else { l })]
// idx uses b's low 5 bits: 33 reads lane 1.
#[case::idx_low_bits("idx", 33, 0x1f, |_| 1)]
// idx 20 with clamp 15 (no segments): source 20 > 15, every lane reads its own.
#[case::idx_past_the_clamp("idx", 20, 0x0f, |l: u64| l)]
fn shfl_isa_clamps(
    #[case] mode: &str,
    #[case] x: u64,
    #[case] c: u64,
    #[case] src: fn(u64) -> u64,
) {
    let got = shuffle(mode, |_| x, c);
    let want: Vec<u64> = (0..32).map(|l| value(src(l))).collect();
    assert_eq!(got, want, "shfl.{mode} {x}, c = {c:#x}");
}

/// Each lane may name its own source: lane l reads lane 31 - l.
#[test]
fn shfl_idx_per_lane_sources() {
    let got = shuffle("idx", |l| 31 - l, 0x1f);
    let want: Vec<u64> = (0..32).map(|l| value(31 - l)).collect();
    assert_eq!(got, want);
}
