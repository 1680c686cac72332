//! `atom` and `fence`: atomics are indivisible across blocks that run on several host
//! threads, and the last-block pattern (store, fence, barrier, atomic count, the last
//! block reads every block's store) sees every store.

#![allow(clippy::result_large_err)]

use cuda_sim::exec::{launch, LaunchConfig, LaunchError};
use cuda_sim::fault::{Checks, FaultKind};
use cuda_sim::mem::FlatMemory;
use cuda_sim::ptx::Module;

const BASE: u64 = 0x2000_0000;

fn module(body: &str) -> Module {
    let text = format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 p_out, .param .u32 p_n)\n{{\n    .reg .pred %p<4>;\n    .reg .b32 %r<16>;\n    .reg .b64 %rd<8>;\n    ld.param.u64 %rd0, [p_out];\n    ld.param.u32 %r9, [p_n];\n    mov.u32 %r0, %tid.x;\n    mov.u32 %r1, %ctaid.x;\n    mov.u32 %r2, %ntid.x;\n    mad.lo.u32 %r3, %r1, %r2, %r0;\n{body}\n}}\n"
    );
    Module::parse("k.ptx", &text).unwrap_or_else(|e| panic!("{e}"))
}

fn run(
    m: &Module,
    grid: u32,
    block: u32,
    n: u32,
    mem: &FlatMemory,
    threads: usize,
) -> Result<(), LaunchError> {
    let cfg = LaunchConfig {
        grid: [grid, 1, 1],
        block: [block, 1, 1],
        dynamic_shared: 0,
        programmatic: false,
    };
    let out = BASE.to_le_bytes();
    let nb = n.to_le_bytes();
    launch(m, "k", &cfg, &[&out, &nb], mem, Checks::ALL, threads).map(|_| ())
}

fn words(mem: &FlatMemory, at: u64, n: usize) -> Vec<u32> {
    let mut b = vec![0u8; 4 * n];
    mem.read(at, &mut b);
    b.chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Word 0 counts; thread g stores the count it saw at word 1 + g.
#[test]
fn atomic_add_hands_out_every_value_once() {
    let body = "    atom.global.add.u32 %r4, [%rd0], 1;\n    mul.wide.u32 %rd1, %r3, 4;\n    add.u64 %rd1, %rd0, %rd1;\n    st.global.u32 [%rd1+4], %r4;\n    ret;";
    let m = module(body);
    let (grid, block) = (16, 96);
    let n = (grid * block) as usize;
    for threads in [1, 4] {
        let mem = FlatMemory::new(BASE, 4 * (n + 1), true);
        mem.write(BASE, &[0; 4]);
        run(&m, grid, block, 0, &mem, threads).unwrap();
        let w = words(&mem, BASE, n + 1);
        assert_eq!(w[0], n as u32);
        let mut seen = w[1..].to_vec();
        seen.sort_unstable();
        assert_eq!(seen, (0..n as u32).collect::<Vec<_>>(), "{threads} threads");
    }
}

/// Block b stores b + 1 at word 2 + b, fences, and counts itself at word 0; the block
/// that counts last sums the stores in index order into word 1 and resets the count.
#[test]
fn the_last_block_sees_every_block_store() {
    let body = "    .shared .align 4 .b32 last;\n    mul.wide.u32 %rd1, %r1, 4;\n    add.u64 %rd1, %rd0, %rd1;\n    add.u32 %r4, %r1, 1;\n    setp.ne.u32 %p0, %r0, 0;\n    @!%p0 st.global.u32 [%rd1+8], %r4;\n    fence.acq_rel.gpu;\n    bar.sync 0;\n    @%p0 bra WAIT;\n    atom.acq_rel.gpu.global.add.u32 %r5, [%rd0], 1;\n    sub.u32 %r6, %r9, 1;\n    setp.eq.u32 %p1, %r5, %r6;\n    selp.u32 %r7, 1, 0, %p1;\n    st.shared.u32 [last], %r7;\nWAIT:\n    bar.sync 0;\n    ld.shared.u32 %r7, [last];\n    setp.eq.u32 %p2, %r7, 0;\n    @%p2 bra DONE;\n    @%p0 bra DONE;\n    membar.gl;\n    mov.u32 %r8, 0;\n    mov.u32 %r10, 0;\n    mov.u64 %rd2, %rd0;\nSUM:\n    setp.ge.u32 %p3, %r8, %r9;\n    @%p3 bra STORE;\n    ld.global.cg.u32 %r11, [%rd2+8];\n    add.u32 %r10, %r10, %r11;\n    add.u64 %rd2, %rd2, 4;\n    add.u32 %r8, %r8, 1;\n    bra SUM;\nSTORE:\n    st.global.u32 [%rd0+4], %r10;\n    st.global.u32 [%rd0], 0;\nDONE:\n    ret;";
    let m = module(body);
    let grid = 200u32;
    for threads in [1, 3, 8] {
        let mem = FlatMemory::new(BASE, 4 * (grid as usize + 2), true);
        mem.write(BASE, &[0; 8]);
        for round in 0..3 {
            run(&m, grid, 64, grid, &mem, threads).unwrap();
            let w = words(&mem, BASE, 2);
            assert_eq!(
                w[1],
                grid * (grid + 1) / 2,
                "{threads} threads, round {round}"
            );
            assert_eq!(w[0], 0, "the last block resets the count");
        }
    }
}

/// One thread runs each form; the results were worked out by hand.
#[test]
fn every_atomic_form_parses_and_runs() {
    let body = "    setp.ne.u32 %p0, %r3, 0;\n    @%p0 bra DONE;\n    atom.global.exch.b32 %r4, [%rd0], 9;\n    atom.global.cas.b32 %r5, [%rd0], 9, 20;\n    atom.global.cas.b32 %r6, [%rd0], 9, 30;\n    atom.global.max.s32 %r7, [%rd0], -5;\n    atom.global.min.u32 %r8, [%rd0], 7;\n    atom.relaxed.gpu.global.inc.u32 %r10, [%rd0], 7;\n    atom.global.or.b32 %r11, [%rd0], 12;\n    fence.sc.gpu;\n    membar.cta;\n    fence.acq_rel.cta;\n    ld.global.u32 %r12, [%rd0];\n    st.global.v4.u32 [%rd0+16], {%r4, %r5, %r6, %r7};\n    st.global.v4.u32 [%rd0+32], {%r8, %r10, %r11, %r12};\nDONE:\n    ret;";
    let m = module(body);
    let mem = FlatMemory::new(BASE, 64, true);
    mem.write(BASE, &3u32.to_le_bytes());
    run(&m, 1, 32, 0, &mem, 1).unwrap();
    // 3 -exch 9-> 9 -cas(9,20)-> 20 -cas(9,30) misses-> 20 -max(-5)-> 20 -min(7)-> 7
    // -inc(7): 7 >= 7 -> 0 -or 12-> 12.
    assert_eq!(words(&mem, BASE + 16, 8), [3, 9, 20, 20, 20, 7, 0, 12]);
}

#[test]
fn atomics_are_checked_like_loads() {
    let m = module("    atom.global.add.u32 %r4, [%rd0+2], 1;\n    ret;");
    let mem = FlatMemory::new(BASE, 64, true);
    mem.write(BASE, &[0; 8]);
    match run(&m, 1, 32, 0, &mem, 1) {
        Err(LaunchError::Fault(f)) => assert_eq!(f.kind, FaultKind::Misaligned, "{f}"),
        other => panic!("{other:?}"),
    }
    let m = module("    atom.global.add.u32 %r4, [%rd0+8], 1;\n    ret;");
    match run(&m, 1, 32, 0, &mem, 1) {
        Err(LaunchError::Fault(f)) => assert_eq!(f.kind, FaultKind::UninitializedRead, "{f}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn unsupported_atomic_and_fence_forms_are_load_errors() {
    for (line, why) in [
        ("atom.global.add.max.u32 %r4, [%rd0], 1;", "one operation"),
        ("atom.global.cas.b32 %r4, [%rd0], 1;", "takes 4 operands"),
        ("membar.foo;", "membar."),
    ] {
        let text = format!(
            ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 p)\n{{\n    .reg .b32 %r<8>;\n    .reg .b64 %rd<2>;\n    {line}\n    ret;\n}}\n"
        );
        let e = Module::parse("bad.ptx", &text).expect_err(line);
        assert!(e.to_string().contains(why), "{line}: {e}");
    }
}
