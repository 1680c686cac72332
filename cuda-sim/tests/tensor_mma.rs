//! `mma.sync.aligned` on cuda-sim against the PTX ISA: every element of A, B and C goes
//! through the fragment layouts of the ISA's tables "Matrix Fragments for mma.m16n8k8 /
//! m16n8k16 / m16n8k32" (written out again here, case by case as the ISA states them),
//! and D is compared with products computed here: exact integer dot products for
//! `.s8`/`.u8` (wrapping, or clamped with `.satfinite`), and for f16/bf16 inputs whose
//! sums are exact in f32 (small integers), so that any accumulation order gives them.
//! The f16 model's truncation, and the approx check's distance from the exact sum, are
//! checked on designed inputs; and the profiler counts the tensor multiply-adds.

mod common;

use cuda_sim::exec::{launch, LaunchConfig, LaunchError};
use cuda_sim::fault::{Checks, FaultKind};
use cuda_sim::mem::FlatMemory;
use cuda_sim::profile::InstrClass;
use cuda_sim::ptx::Module;
use cuda_sim::tensor::{error_bound, AlignRef, BlockRounding, MmaModel};
use rstest::rstest;

const BASE: u64 = 0x1000_0000;

/// (row, col) of element `i` of `lane`'s fragment, from the ISA's tables.
fn coord(matrix: char, k: usize, bits: usize, lane: usize, i: usize) -> (usize, usize) {
    let (g, t) = (lane >> 2, lane % 4);
    match (matrix, k, bits) {
        ('A', 16, 16) => (
            if i < 2 || (4..6).contains(&i) {
                g
            } else {
                g + 8
            },
            if i < 4 {
                t * 2 + (i & 1)
            } else {
                t * 2 + (i & 1) + 8
            },
        ),
        ('A', 8, 16) => (if i < 2 { g } else { g + 8 }, t * 2 + (i & 1)),
        ('A', 16, 8) => (if i < 4 { g } else { g + 8 }, t * 4 + (i & 3)),
        ('A', 32, 8) => (
            if i < 4 || (8..12).contains(&i) {
                g
            } else {
                g + 8
            },
            if i < 8 {
                t * 4 + (i & 3)
            } else {
                t * 4 + (i & 3) + 16
            },
        ),
        ('B', 16, 16) => (
            if i < 2 {
                t * 2 + (i & 1)
            } else {
                t * 2 + (i & 1) + 8
            },
            g,
        ),
        ('B', 8, 16) => (t * 2 + i, g),
        ('B', 16, 8) => (t * 4 + i, g),
        ('B', 32, 8) => (
            if i < 4 {
                t * 4 + (i & 3)
            } else {
                t * 4 + (i & 3) + 16
            },
            g,
        ),
        ('C', _, _) => (if i < 2 { g } else { g + 8 }, t * 2 + (i & 1)),
        _ => panic!("no layout for {matrix} k{k} {bits}-bit"),
    }
}

/// Packs a matrix (`cols` wide, elements of `bits`) into each lane's registers:
/// `regs` words per lane, lane-major, element i in register i * bits / 32.
fn pack(m: &[u64], cols: usize, matrix: char, k: usize, bits: usize, regs: usize) -> Vec<u32> {
    let per = 32 / bits;
    let mut out = vec![0u32; 32 * regs];
    for lane in 0..32 {
        for i in 0..regs * per {
            let (r, c) = coord(matrix, k, bits, lane, i);
            let v = (m[r * cols + c] as u32) & (((1u64 << bits) - 1) as u32);
            out[lane * regs + i / per] |= v << ((i % per) * bits);
        }
    }
    out
}

/// D (16 x 8, elements of `bits`) back from each lane's `regs` words.
fn unpack(words: &[u32], bits: usize, regs: usize) -> Vec<u64> {
    let per = 32 / bits;
    let mut d = vec![0u64; 128];
    for lane in 0..32 {
        for i in 0..4 {
            let (r, c) = coord('C', 16, 16, lane, i);
            let w = words[lane * regs + i / per];
            d[r * 8 + c] = ((w as u64) >> ((i % per) * bits)) & ((1u64 << bits) - 1);
        }
    }
    d
}

struct Shape<'a> {
    instr: &'a str,
    na: usize,
    nb: usize,
    nc: usize,
    nd: usize,
}

fn kernel(s: &Shape) -> String {
    let list = |p: &str, n: usize| {
        (0..n)
            .map(|i| format!("%{p}{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut body = String::new();
    for (p, n, param) in [("a", s.na, "p_a"), ("b", s.nb, "p_b"), ("c", s.nc, "p_c")] {
        body += &format!(
            "    ld.param.u64 %rd0, [{param}];\n    mul.wide.u32 %rd1, %r0, {};\n    add.u64 %rd0, %rd0, %rd1;\n",
            4 * n
        );
        for i in 0..n {
            body += &format!("    ld.global.b32 %{p}{i}, [%rd0+{}];\n", 4 * i);
        }
    }
    body += &format!(
        "    {} {{{}}}, {{{}}}, {{{}}}, {{{}}};\n",
        s.instr,
        list("d", s.nd),
        list("a", s.na),
        list("b", s.nb),
        list("c", s.nc)
    );
    body += &format!(
        "    ld.param.u64 %rd0, [p_d];\n    mul.wide.u32 %rd1, %r0, {};\n    add.u64 %rd0, %rd0, %rd1;\n",
        4 * s.nd
    );
    for i in 0..s.nd {
        body += &format!("    st.global.b32 [%rd0+{}], %d{i};\n", 4 * i);
    }
    format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 p_a, .param .u64 p_b, .param .u64 p_c, .param .u64 p_d, .param .u32 p_active)\n{{\n    .reg .pred %p0;\n    .reg .b32 %r<4>, %a<4>, %b<2>, %c<4>, %d<4>;\n    .reg .b64 %rd<4>;\n    mov.u32 %r0, %tid.x;\n    ld.param.u32 %r1, [p_active];\n    setp.ge.u32 %p0, %r0, %r1;\n    @%p0 bra DONE;\n{body}DONE:\n    ret;\n}}\n"
    )
}

/// Runs one warp of `shape` on the packed operands; `active` lanes execute the mma.
fn run_mma(
    s: &Shape,
    a: &[u32],
    b: &[u32],
    c: &[u32],
    checks: Checks,
    active: u32,
) -> Result<Vec<u32>, LaunchError> {
    let m = Module::parse("mma.ptx", &kernel(s)).unwrap_or_else(|e| panic!("{e}"));
    let mem = FlatMemory::new(BASE, 4096, false);
    let put = |at: u64, w: &[u32]| {
        let bytes: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
        mem.write(at, &bytes);
    };
    put(BASE, a);
    put(BASE + 1024, b);
    put(BASE + 2048, c);
    let args: [&[u8]; 5] = [
        &BASE.to_le_bytes(),
        &(BASE + 1024).to_le_bytes(),
        &(BASE + 2048).to_le_bytes(),
        &(BASE + 3072).to_le_bytes(),
        &active.to_le_bytes(),
    ];
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        dynamic_shared: 0,
        programmatic: false,
    };
    launch(&m, "k", &cfg, &args, &mem, checks, 1)?;
    let mut out = vec![0u8; 4 * 32 * s.nd];
    mem.read(BASE + 3072, &mut out);
    Ok(out
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect())
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 ^ (self.0 >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9) >> 11
    }
}

#[rstest]
#[case::k32_s8_s8("m16n8k32", "s8", "s8", false)]
#[case::k32_u8_s8("m16n8k32", "u8", "s8", false)]
#[case::k32_s8_u8("m16n8k32", "s8", "u8", false)]
#[case::k32_u8_u8_sat("m16n8k32", "u8", "u8", true)]
#[case::k32_s8_s8_sat("m16n8k32", "s8", "s8", true)]
#[case::k16_s8_s8("m16n8k16", "s8", "s8", false)]
#[case::k16_u8_s8_sat("m16n8k16", "u8", "s8", true)]
fn integer_mma_is_exact(
    #[case] shape: &str,
    #[case] at: &str,
    #[case] bt: &str,
    #[case] sat: bool,
) {
    let k = if shape == "m16n8k32" { 32 } else { 16 };
    let mut r = Rng(k as u64 + sat as u64);
    let a: Vec<u64> = (0..16 * k).map(|_| r.next() & 0xff).collect();
    let b: Vec<u64> = (0..k * 8).map(|_| r.next() & 0xff).collect();
    // C near both ends of the s32 range, so that sums overflow.
    let c: Vec<u64> = (0..128)
        .map(|i| match i % 3 {
            0 => (i32::MAX - (r.next() % 1000) as i32) as u32 as u64,
            1 => (i32::MIN + (r.next() % 1000) as i32) as u32 as u64,
            _ => r.next() & 0xffff_ffff,
        })
        .collect();
    let (na, nb) = (k * 16 / 32 / 4, k * 8 / 32 / 4);
    let s = Shape {
        instr: &format!(
            "mma.sync.aligned.{shape}.row.col{}.s32.{at}.{bt}.s32",
            if sat { ".satfinite" } else { "" }
        ),
        na,
        nb,
        nc: 4,
        nd: 4,
    };
    let words = run_mma(
        &s,
        &pack(&a, k, 'A', k, 8, na),
        &pack(&b, 8, 'B', k, 8, nb),
        &pack(&c, 8, 'C', k, 32, 4),
        Checks::ALL,
        32,
    )
    .unwrap();
    let d = unpack(&words, 32, 4);
    let val = |x: u64, ty: &str| {
        if ty == "s8" {
            x as u8 as i8 as i64
        } else {
            x as i64
        }
    };
    for row in 0..16 {
        for n in 0..8 {
            let mut acc = c[row * 8 + n] as u32 as i32 as i64;
            for kk in 0..k {
                acc += val(a[row * k + kk], at) * val(b[kk * 8 + n], bt);
            }
            let want = if sat {
                acc.clamp(i32::MIN as i64, i32::MAX as i64) as i32 as u32
            } else {
                acc as u32
            };
            assert_eq!(d[row * 8 + n] as u32, want, "D[{row}][{n}] of {}", s.instr);
        }
    }
}

/// f16 / bf16 encodings of small integers (exact in both formats).
fn small(v: i64, bf16: bool) -> u64 {
    if v == 0 {
        return 0;
    }
    let (neg, m) = (v < 0, v.unsigned_abs());
    let e = 63 - m.leading_zeros() as u64; // 2^e <= m < 2^(e+1)
    let (frac_bits, bias) = if bf16 { (7, 127) } else { (10, 15) };
    let frac = (m - (1 << e)) << (frac_bits - e);
    (neg as u64) << 15 | (e + bias) << frac_bits | frac
}

fn f32_of_int(v: i64) -> u64 {
    (v as f32).to_bits() as u64
}

#[rstest]
#[case::k16_f32_f16(
    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    16,
    false,
    true,
    true
)]
#[case::k16_f16_f16(
    "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16",
    16,
    false,
    false,
    false
)]
#[case::k16_bf16(
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    16,
    true,
    true,
    true
)]
#[case::k8_f32_f16(
    "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32",
    8,
    false,
    true,
    true
)]
#[case::k8_bf16(
    "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32",
    8,
    true,
    true,
    true
)]
fn float_mma_places_every_element(
    #[case] instr: &str,
    #[case] k: usize,
    #[case] bf16: bool,
    #[case] d_f32: bool,
    #[case] c_f32: bool,
) {
    // Distinct small integers per element, so a misplaced one changes the sum.
    let av: Vec<i64> = (0..16 * k).map(|i| (i as i64 * 7 + 3) % 11 - 5).collect();
    let bv: Vec<i64> = (0..k * 8).map(|i| (i as i64 * 5 + 1) % 9 - 4).collect();
    let cv: Vec<i64> = (0..128).map(|i| (i as i64 * 13) % 31 - 15).collect();
    let a: Vec<u64> = av.iter().map(|&v| small(v, bf16)).collect();
    let b: Vec<u64> = bv.iter().map(|&v| small(v, bf16)).collect();
    let (nc, nd) = (if c_f32 { 4 } else { 2 }, if d_f32 { 4 } else { 2 });
    let c: Vec<u64> = cv
        .iter()
        .map(|&v| {
            if c_f32 {
                f32_of_int(v)
            } else {
                small(v, false)
            }
        })
        .collect();
    let s = Shape {
        instr,
        na: k / 4,
        nb: k / 8,
        nc,
        nd,
    };
    let c_bits = if c_f32 { 32 } else { 16 };
    // The model is irrelevant here (every sum is exact); approx would move the results.
    for model in [MmaModel::SM80, MmaModel::SM90] {
        let checks = Checks {
            approx_at_bound: false,
            mma: model,
            ..Checks::ALL
        };
        let words = run_mma(
            &s,
            &pack(&a, k, 'A', k, 16, k / 4),
            &pack(&b, 8, 'B', k, 16, k / 8),
            &pack(&c, 8, 'C', k, c_bits, nc),
            checks,
            32,
        )
        .unwrap();
        let d = unpack(&words, if d_f32 { 32 } else { 16 }, nd);
        for row in 0..16 {
            for n in 0..8 {
                let mut acc = cv[row * 8 + n];
                for kk in 0..k {
                    acc += av[row * k + kk] * bv[kk * 8 + n];
                }
                let want = if d_f32 {
                    f32_of_int(acc)
                } else {
                    small(acc, false)
                };
                assert_eq!(d[row * 8 + n], want, "D[{row}][{n}] of {instr}: {acc}");
            }
        }
    }
}

/// One row of A: a product of 1 first, then fifteen of 2^-26 each; B all ones; C = 0.
/// The exact sum is 1 + 15 * 2^-26. Blocks of 16 with 24 kept bits drop every small
/// product (each below the grid of 1's block, 2^-23); 27 kept bits keep them all and
/// the block sum truncates to 1 + 2^-23 (15/8 of a unit, toward zero: one unit).
#[test]
fn f16_model_truncates_as_parameterised() {
    let k = 16;
    let mut a = vec![0u64; 256];
    for row in 0..16 {
        a[row * 16] = 0x3c00; // 1
        for kk in 1..16 {
            a[row * 16 + kk] = 0x0200; // 2^-15, a subnormal
        }
    }
    // B: 1 in row 0, 2^-11 elsewhere: products 1 and 2^-26.
    let b: Vec<u64> = (0..128)
        .map(|i| if i < 8 { 0x3c00 } else { 0x1000 })
        .collect();
    let c = vec![0u64; 128];
    let s = Shape {
        instr: "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        na: 4,
        nb: 2,
        nc: 4,
        nd: 4,
    };
    let run_with = |block, align_bits| {
        let checks = Checks {
            approx_at_bound: false,
            mma: MmaModel {
                block,
                align_bits,
                align_to: AlignRef::LeadingBit,
                rounding: BlockRounding::TowardZero,
            },
            ..Checks::ALL
        };
        let w = run_mma(
            &s,
            &pack(&a, k, 'A', k, 16, 4),
            &pack(&b, 8, 'B', k, 16, 2),
            &pack(&c, 8, 'C', k, 32, 4),
            checks,
            32,
        )
        .unwrap();
        unpack(&w, 32, 4)
    };
    let one = 1f32.to_bits() as u64;
    assert!(run_with(16, 24).iter().all(|&d| d == one));
    assert!(run_with(16, 27).iter().all(|&d| d == one + 1));
    // Blocks of 8: 1 + 7 * 2^-26 truncates to 1; then 1 + 8 * 2^-26 = 1 + 2^-23.
    assert!(run_with(8, 27).iter().all(|&d| d == one + 1));
    // Blocks of 4: 1 + 3 * 2^-26 -> 1, four times: 1 (never a whole unit).
    assert!(run_with(4, 27).iter().all(|&d| d == one));
}

/// Under the approx check every result sits within the declared bound of the exact
/// sum, most of them near its edge, moving both ways.
#[test]
fn approx_check_moves_results_to_the_bound() {
    let k = 16;
    let mut r = Rng(99);
    // Random f16 of moderate range: sign, exponent -4..3, random fraction.
    let rand_f16 = |r: &mut Rng| -> (u64, f64) {
        let x = r.next();
        let e = (x % 8) as i64 - 4;
        let frac = (x >> 8) & 0x3ff;
        let neg = (x >> 20) & 1;
        let v =
            (1.0 + frac as f64 / 1024.0) * (e as f64).exp2() * if neg == 1 { -1.0 } else { 1.0 };
        (neg << 15 | ((e + 15) as u64) << 10 | frac, v)
    };
    let (a, av): (Vec<u64>, Vec<f64>) = (0..256).map(|_| rand_f16(&mut r)).unzip();
    let (b, bv): (Vec<u64>, Vec<f64>) = (0..128).map(|_| rand_f16(&mut r)).unzip();
    let c = vec![0u64; 128];
    let s = Shape {
        instr: "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        na: 4,
        nb: 2,
        nc: 4,
        nd: 4,
    };
    let w = run_mma(
        &s,
        &pack(&a, k, 'A', k, 16, 4),
        &pack(&b, 8, 'B', k, 16, 2),
        &pack(&c, 8, 'C', k, 32, 4),
        Checks::ALL,
        32,
    )
    .unwrap();
    let d = unpack(&w, 32, 4);
    let (mut up, mut down) = (0, 0);
    for row in 0..16 {
        for n in 0..8 {
            let terms: Vec<f64> = (0..k).map(|kk| av[row * k + kk] * bv[kk * 8 + n]).collect();
            let exact: f64 = terms.iter().sum();
            let abs: f64 = terms.iter().map(|t| t.abs()).sum();
            let bound = (k as f64 + 1.0) * (-22f64).exp2() * abs;
            assert_eq!(bound, error_bound(k as u32, abs));
            let got = f32::from_bits(d[row * 8 + n] as u32) as f64;
            let err = got - exact;
            assert!(
                err.abs() <= bound,
                "[{row}][{n}]: {got} vs {exact}, bound {bound}"
            );
            assert!(
                err.abs() >= 0.5 * bound,
                "[{row}][{n}]: {err} not near {bound}"
            );
            if err > 0.0 {
                up += 1;
            } else {
                down += 1;
            }
        }
    }
    assert!(up > 30 && down > 30, "{up} up, {down} down");
}

#[test]
fn synccheck_wants_the_whole_warp() {
    let s = Shape {
        instr: "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        na: 4,
        nb: 2,
        nc: 4,
        nd: 4,
    };
    let z = vec![0u32; 256];
    match run_mma(&s, &z, &z, &z, Checks::ALL, 16) {
        Err(LaunchError::Fault(f)) => {
            assert_eq!(f.kind, FaultKind::SyncMask, "{f}");
            assert!(f.detail.contains("all 32 lanes"), "{f}");
        }
        other => panic!("half a warp ran an mma: {other:?}"),
    }
    run_mma(&s, &z, &z, &z, Checks::ALL, 32).unwrap();
}

#[test]
fn profiler_counts_tensor_multiply_adds() {
    let s = Shape {
        instr: "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32",
        na: 4,
        nb: 2,
        nc: 4,
        nd: 4,
    };
    let m = Module::parse("mma.ptx", &kernel(&s)).unwrap();
    let mem = FlatMemory::new(BASE, 4096, false);
    let args: [&[u8]; 5] = [
        &BASE.to_le_bytes(),
        &BASE.to_le_bytes(),
        &BASE.to_le_bytes(),
        &(BASE + 3072).to_le_bytes(),
        &32u32.to_le_bytes(),
    ];
    let c = common::profile_k(&m, 3, 64, &args, &mem, Checks::NONE).unwrap();
    // Warp 1 of each block branches around it: 3 warps execute an mma.
    assert_eq!(c.classes.get(InstrClass::TensorCore), 3);
    assert_eq!(c.tensor_macs, 3 * 16 * 8 * 32);
    assert_eq!(c.tensor_macs_int8, c.tensor_macs);
}

/// Each element of A, B and C read back through D, one position at a time: with B a
/// selector (B[k][n] = 1 where k = n + 8s) D shows A's columns 8s..8s+7; with A a
/// selector (A[i][k] = 1 where k = i + 16s) D shows B's rows; with A zero, D is C. Each
/// matrix is filled twice, with its elements' row numbers and then column numbers
/// (plus one), so a misplaced element shows as a wrong row or column.
#[rstest]
#[case::f16_k16("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", 16, 16)]
#[case::f16_k8("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32", 8, 16)]
#[case::bf16_k16("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 16, 16)]
#[case::u8_k32("mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32", 32, 8)]
#[case::u8_k16("mma.sync.aligned.m16n8k16.row.col.s32.u8.u8.s32", 16, 8)]
fn every_fragment_element_reads_back(#[case] instr: &str, #[case] k: usize, #[case] bits: usize) {
    let bf16 = instr.contains("bf16");
    let enc = |v: i64| -> u64 {
        if bits == 8 {
            v as u64
        } else {
            small(v, bf16)
        }
    };
    let dec = |w: u64| -> i64 {
        if bits == 8 {
            w as u32 as i32 as i64
        } else {
            f32::from_bits(w as u32) as i64
        }
    };
    let (na, nb) = (16 * k * bits / 32 / 32, k * 8 * bits / 32 / 32);
    let s = Shape {
        instr,
        na,
        nb,
        nc: 4,
        nd: 4,
    };
    let c_of = |v: &dyn Fn(usize, usize) -> i64| -> Vec<u64> {
        (0..128)
            .map(|i| {
                let x = v(i / 8, i % 8);
                if bits == 8 {
                    x as u32 as u64
                } else {
                    f32_of_int(x)
                }
            })
            .collect()
    };
    let go = |a: &[u64], b: &[u64], c: &[u64]| -> Vec<i64> {
        let checks = Checks {
            approx_at_bound: false,
            ..Checks::ALL
        };
        let w = run_mma(
            &s,
            &pack(a, k, 'A', k, bits, na),
            &pack(b, 8, 'B', k, bits, nb),
            &pack(c, 8, 'C', k, 32, 4),
            checks,
            32,
        )
        .unwrap();
        unpack(&w, 32, 4).into_iter().map(dec).collect()
    };
    let zero_c = vec![0u64; 128];
    for id in [0usize, 1] {
        let label = |r: usize, c: usize| 1 + if id == 0 { r } else { c } as i64;
        // A through B selectors.
        let a: Vec<u64> = (0..16 * k).map(|x| enc(label(x / k, x % k))).collect();
        for sel in 0..k / 8 {
            let b: Vec<u64> = (0..k * 8)
                .map(|x| enc((x / 8 == x % 8 + 8 * sel) as i64))
                .collect();
            let d = go(&a, &b, &zero_c);
            for row in 0..16 {
                for n in 0..8 {
                    let want = label(row, n + 8 * sel);
                    assert_eq!(d[row * 8 + n], want, "{instr}: A[{row}][{}]", n + 8 * sel);
                }
            }
        }
        // B through A selectors.
        let b: Vec<u64> = (0..k * 8).map(|x| enc(label(x / 8, x % 8))).collect();
        for sel in 0..k.div_ceil(16) {
            let a: Vec<u64> = (0..16 * k)
                .map(|x| enc((x % k == x / k + 16 * sel) as i64))
                .collect();
            let d = go(&a, &b, &zero_c);
            for row in 0..16.min(k) {
                for n in 0..8 {
                    let want = label(row + 16 * sel, n);
                    assert_eq!(d[row * 8 + n], want, "{instr}: B[{}][{n}]", row + 16 * sel);
                }
            }
        }
        // C through a zero A.
        let c = c_of(&|r, col| label(r, col));
        let d = go(&vec![0u64; 16 * k], &b, &c);
        for row in 0..16 {
            for n in 0..8 {
                assert_eq!(d[row * 8 + n], label(row, n), "{instr}: C[{row}][{n}]");
            }
        }
    }
}
