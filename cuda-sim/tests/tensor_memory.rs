//! The memory instructions of tiled kernels on cuda-sim: `ldmatrix` (every count, with
//! and without `.trans`, against the ISA's description of which lane gets which
//! elements, and its bank conflicts in the profiler), `cp.async` with its groups (data
//! lands at the wait; racecheck fails a read before it and passes one after; memcheck
//! on the source; the `src-size` zero fill; profiler traffic), and atomics on global and
//! shared memory (exact integer results across blocks, racecheck between atomics and
//! plain accesses), `fence`.

#![allow(clippy::result_large_err)]

mod common;

use cuda_sim::exec::{launch, LaunchConfig, LaunchError};
use cuda_sim::fault::{Checks, FaultKind, KernelFault};
use cuda_sim::mem::FlatMemory;
use cuda_sim::profile::{InstrClass, MemSpace};
use cuda_sim::ptx::Module;
use rstest::rstest;

const BASE: u64 = 0x1000_0000;

fn module(text: &str) -> Module {
    let text = format!(".version 8.0\n.target sm_80\n.address_size 64\n{text}");
    Module::parse("k.ptx", &text).unwrap_or_else(|e| panic!("{e}"))
}

fn run(
    m: &Module,
    grid: u32,
    block: u32,
    args: &[&[u8]],
    mem: &FlatMemory,
    checks: Checks,
) -> Result<(), KernelFault> {
    let cfg = LaunchConfig {
        grid: [grid, 1, 1],
        block: [block, 1, 1],
        dynamic_shared: 0,
        programmatic: false,
    };
    match launch(m, "k", &cfg, args, mem, checks, 2) {
        Ok(_) => Ok(()),
        Err(LaunchError::Fault(f)) => Err(*f),
        Err(LaunchError::Invalid(e)) => panic!("invalid launch: {e}"),
    }
}

fn words(mem: &FlatMemory, at: u64, n: usize) -> Vec<u32> {
    let mut b = vec![0u8; 4 * n];
    mem.read(at, &mut b);
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn put(mem: &FlatMemory, at: u64, w: &[u32]) {
    let b: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
    mem.write(at, &b);
}

/// Shared memory holds u16 h at byte 2h (h = 0..1023); each lane reads its row offset
/// from `p_rows` and runs `INSTR` on it; its N registers go to `p_out`.
const LDMATRIX: &str = r#"
.shared .align 16 .b8 sm[2048];
.visible .entry k(.param .u64 p_rows, .param .u64 p_out)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>, %d<4>;
    .reg .b64 %rd<4>;
    mov.u32 %r0, %tid.x;
    mov.u32 %r1, %r0;
FILL:
    setp.ge.u32 %p0, %r1, 512;
    @%p0 bra FILLED;
    shl.b32 %r2, %r1, 1;
    add.u32 %r3, %r2, 1;
    shl.b32 %r3, %r3, 16;
    or.b32 %r3, %r3, %r2;
    shl.b32 %r4, %r1, 2;
    mov.u32 %r5, sm;
    add.u32 %r4, %r4, %r5;
    st.shared.u32 [%r4], %r3;
    add.u32 %r1, %r1, 32;
    bra FILL;
FILLED:
    bar.sync 0;
    ld.param.u64 %rd0, [p_rows];
    mul.wide.u32 %rd1, %r0, 4;
    add.u64 %rd0, %rd0, %rd1;
    ld.global.u32 %r6, [%rd0];
    mov.u32 %r5, sm;
    add.u32 %r6, %r6, %r5;
    INSTR
    ld.param.u64 %rd0, [p_out];
    mul.wide.u32 %rd1, %r0, 16;
    add.u64 %rd0, %rd0, %rd1;
    st.global.v4.b32 [%rd0], {%d0, %d1, %d2, %d3};
    ret;
}
"#;

/// Runs `ldmatrix` with row `r` of matrix `i` at byte `rows[8 i + r]`; returns each
/// lane's four words and the launch's counters.
fn ldmatrix(n: usize, trans: bool, rows: &[u32]) -> (Vec<u32>, cuda_sim::profile::LaunchCounters) {
    let regs = (0..n)
        .map(|i| format!("%d{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    // `.shared::cta` is `.shared`.
    let instr = format!(
        "ldmatrix.sync.aligned.m8n8.x{n}{}.shared{}.b16 {{{regs}}}, [%r6];",
        if trans { ".trans" } else { "" },
        if n == 2 { "::cta" } else { "" }
    );
    let m = module(&LDMATRIX.replace("INSTR", &instr));
    let mem = FlatMemory::new(BASE, 4096, false);
    put(&mem, BASE, rows);
    put(&mem, BASE + 1024, &[0; 128]);
    let args: [&[u8]; 2] = [&BASE.to_le_bytes(), &(BASE + 1024).to_le_bytes()];
    let c =
        common::profile_k(&m, 1, 32, &args, &mem, Checks::ALL).unwrap_or_else(|e| panic!("{e:?}"));
    (words(&mem, BASE + 1024, 128), c)
}

#[rstest]
fn ldmatrix_gives_each_lane_its_row_elements(
    #[values(1, 2, 4)] n: usize,
    #[values(false, true)] trans: bool,
) {
    // Rows scattered over shared memory (16-byte aligned, no two the same).
    let rows: Vec<u32> = (0..32).map(|l| ((l * 37 + 5) % 120) * 16).collect();
    let (out, c) = ldmatrix(n, trans, &rows);
    let elem = |row_addr: u32, col: u32| (row_addr + 2 * col) / 2;
    for lane in 0..32u32 {
        for i in 0..n as u32 {
            // The ISA: lane L holds row L/4, columns 2(L%4) and 2(L%4)+1 of matrix i; with
            // .trans, rows 2(L%4) and 2(L%4)+1 of column L/4.
            let (g, t) = (lane / 4, 2 * (lane % 4));
            let (lo, hi) = if trans {
                (
                    elem(rows[(8 * i + t) as usize], g),
                    elem(rows[(8 * i + t + 1) as usize], g),
                )
            } else {
                (
                    elem(rows[(8 * i + g) as usize], t),
                    elem(rows[(8 * i + g) as usize], t + 1),
                )
            };
            let got = out[(lane * 4 + i) as usize];
            assert_eq!(got, hi << 16 | lo, "lane {lane} matrix {i} trans {trans}");
        }
    }
    assert_eq!(
        c.classes.get(InstrClass::Load {
            space: MemSpace::Shared,
            width: 4 * n as u8
        }),
        1
    );
}

/// Eight rows of one matrix at a stride of 128 bytes share four banks: 8 wavefronts per
/// matrix; contiguous rows, or a stride of 144, are conflict-free: one each.
#[rstest]
#[case::contiguous(16, 1)]
#[case::stride_128(128, 8)]
#[case::padded_144(144, 1)]
fn ldmatrix_bank_conflicts(#[case] stride: u32, #[case] per_matrix: u64) {
    // Row r of matrix i at r * stride + 16 i.
    let rows: Vec<u32> = (0..32).map(|l| (l % 8) * stride + (l / 8) * 16).collect();
    let (_, c) = ldmatrix(4, false, &rows);
    // The fill's stores and the ldmatrix are the only shared accesses; the ldmatrix is
    // the one load request.
    assert_eq!(c.shared_load.requests, 1);
    assert_eq!(c.shared_load.wavefronts, 4 * per_matrix);
}

#[test]
fn ldmatrix_row_address_must_be_aligned() {
    let mut rows: Vec<u32> = (0..32).map(|l| l * 16).collect();
    rows[5] += 8;
    let m = module(&LDMATRIX.replace(
        "INSTR",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%d0, %d1, %d2, %d3}, [%r6];",
    ));
    let mem = FlatMemory::new(BASE, 4096, false);
    put(&mem, BASE, &rows);
    let args: [&[u8]; 2] = [&BASE.to_le_bytes(), &(BASE + 1024).to_le_bytes()];
    let f = run(&m, 1, 32, &args, &mem, Checks::ALL).unwrap_err();
    assert_eq!(f.kind, FaultKind::Misaligned, "{f}");
    assert_eq!(f.thread, [5, 0, 0]);
}

/// Two warps; thread t copies bytes 16t..16t+16 of `p_src` into `buf` with cp.async,
/// then WAIT; after bar.sync it reads the first word the other warp copied.
const CP_ASYNC: &str = r#"
.shared .align 16 .b8 buf[2048];
.visible .entry k(.param .u64 p_src, .param .u64 p_out)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<6>;
    mov.u32 %r0, %tid.x;
    ld.param.u64 %rd0, [p_src];
    mul.wide.u32 %rd1, %r0, 16;
    add.u64 %rd2, %rd0, %rd1;
    mov.u64 %rd3, buf;
    add.u64 %rd3, %rd3, %rd1;
    COPY
    WAIT
    bar.sync 0;
    add.u32 %r1, %r0, 32;
    and.b32 %r1, %r1, 63;
    mul.lo.u32 %r1, %r1, 16;
    mov.u32 %r2, buf;
    add.u32 %r2, %r2, %r1;
    ld.shared.u32 %r3, [%r2];
    ld.param.u64 %rd4, [p_out];
    mul.wide.u32 %rd5, %r0, 4;
    add.u64 %rd4, %rd4, %rd5;
    st.global.u32 [%rd4], %r3;
    ret;
}
"#;

fn cp_async_run(copy: &str, wait: &str, checks: Checks) -> Result<Vec<u32>, KernelFault> {
    let m = module(&CP_ASYNC.replace("COPY", copy).replace("WAIT", wait));
    let mem = FlatMemory::new(BASE, 4096, true);
    let src: Vec<u32> = (0..256).map(|i| 0xc0de_0000 + i).collect();
    put(&mem, BASE, &src);
    put(&mem, BASE + 2048, &[0; 64]);
    let args: [&[u8]; 2] = [&BASE.to_le_bytes(), &(BASE + 2048).to_le_bytes()];
    run(&m, 1, 64, &args, &mem, checks)?;
    Ok(words(&mem, BASE + 2048, 64))
}

const COPY16: &str = "cp.async.cg.shared.global [%rd3], [%rd2], 16;\n    cp.async.commit_group;";

#[rstest]
#[case::wait_group(COPY16, "cp.async.wait_group 0;")]
#[case::wait_all(COPY16, "cp.async.wait_all;")]
// Sub-qualifiers with `::` lex as part of the opcode (a label has a single colon).
#[case::prefetch_hint(
    "cp.async.cg.shared.global.L2::128B [%rd3], [%rd2], 16;",
    "cp.async.wait_all;\n    ld.global.L2::64B.u32 %r7, [%rd2];"
)]
fn cp_async_data_lands_at_the_wait(#[case] copy: &str, #[case] wait: &str) {
    let out = cp_async_run(copy, wait, Checks::ALL).unwrap();
    for (t, &w) in out.iter().enumerate() {
        let other = (t + 32) % 64;
        assert_eq!(w, 0xc0de_0000 + 4 * other as u32, "thread {t}");
    }
}

#[test]
fn cp_async_read_before_the_wait_fails_racecheck() {
    let f = cp_async_run(COPY16, "", Checks::ALL).unwrap_err();
    assert_eq!(f.kind, FaultKind::SharedRace, "{f}");
    assert!(f.detail.contains("cp.async"), "{f}");
    assert!(f.instruction.starts_with("ld.shared"), "{f}");
    // Unchecked, the copy has not landed when the read happens (it never does).
    let out = cp_async_run(COPY16, "", Checks::NONE).unwrap();
    assert!(out.iter().all(|&w| w == 0), "{out:x?}");
}

/// `wait_group 1` lands all but the newest group: the older one may be read, the newer
/// one not yet.
#[test]
fn cp_async_wait_group_keeps_the_newest_groups_pending() {
    // Two groups: the first copies the word read later; the second copies into the
    // second half of buf (bytes 1024+), which nothing reads unless asked.
    let two = "cp.async.ca.shared.global [%rd3], [%rd2], 4;\n    cp.async.commit_group;\n    cp.async.ca.shared.global [%rd3+1024], [%rd2+4], 4;\n    cp.async.commit_group;";
    let out = cp_async_run(two, "cp.async.wait_group 1;", Checks::ALL).unwrap();
    assert_eq!(out[0], 0xc0de_0000 + 4 * 32);
    // Reading the pending second group (thread t reads bytes 1024 + 16 (t % 32)) is a
    // race.
    let m = module(
        &CP_ASYNC
            .replace("COPY", two)
            .replace("WAIT", "cp.async.wait_group 1;")
            .replace(
                "and.b32 %r1, %r1, 63;",
                "and.b32 %r1, %r1, 31;\n    add.u32 %r1, %r1, 64;",
            ),
    );
    let mem = FlatMemory::new(BASE, 4096, false);
    let args: [&[u8]; 2] = [&BASE.to_le_bytes(), &(BASE + 2048).to_le_bytes()];
    let f = run(&m, 1, 64, &args, &mem, Checks::ALL).unwrap_err();
    assert_eq!(f.kind, FaultKind::SharedRace, "{f}");
    assert!(f.instruction.starts_with("ld.shared"), "{f}");
    let fixed = module(
        &CP_ASYNC
            .replace("COPY", two)
            .replace("WAIT", "cp.async.wait_group 0;")
            .replace(
                "and.b32 %r1, %r1, 63;",
                "and.b32 %r1, %r1, 31;\n    add.u32 %r1, %r1, 64;",
            ),
    );
    run(&fixed, 1, 64, &args, &mem, Checks::ALL).unwrap();
}

#[test]
fn cp_async_src_size_zero_fills() {
    let copy = "cp.async.ca.shared.global [%rd3], [%rd2], 16, 0;\n    cp.async.commit_group;";
    // Thread t reads the other warp's first word: src-size 0 wrote zeros.
    let out = cp_async_run(copy, "cp.async.wait_all;", Checks::ALL).unwrap();
    assert!(out.iter().all(|&w| w == 0), "{out:x?}");
    // Two of four bytes: the low half of the source word, zeros above.
    let m = module(
        &CP_ASYNC
            .replace("COPY", "cp.async.ca.shared.global [%rd3], [%rd2], 4, 2;")
            .replace("WAIT", "cp.async.wait_all;"),
    );
    let mem = FlatMemory::new(BASE, 4096, false);
    put(
        &mem,
        BASE,
        &(0..256).map(|i| 0xc0de_0000 + i).collect::<Vec<u32>>(),
    );
    let args: [&[u8]; 2] = [&BASE.to_le_bytes(), &(BASE + 2048).to_le_bytes()];
    run(&m, 1, 64, &args, &mem, Checks::ALL).unwrap();
    let out = words(&mem, BASE + 2048, 64);
    assert_eq!(out[0], (0xc0de_0000u32 + 4 * 32) & 0xffff);
}

/// `src-size` at its edges: equal to cp-size copies every byte (only above it is an
/// illegal instruction), and 0 reads no source byte, so a source address past the end of
/// memory (as a zero-fill guard passes for an out-of-range element) is not checked.
/// Kills `collective.rs` `BlockRunner::cp_async`: `v > n` with `==` or `>=` (a full-size
/// src-size would fault) and `valid > 0` with `>=` (the unread source would be checked).
#[test]
fn cp_async_src_size_at_its_edges() {
    // (a register src-size: an immediate above cp-size is refused when the module loads)
    let full = "mov.u32 %r5, 16;\n    cp.async.cg.shared.global [%rd3], [%rd2], 16, %r5;\n    cp.async.commit_group;";
    let out = cp_async_run(full, "cp.async.wait_all;", Checks::ALL).unwrap();
    for (t, &w) in out.iter().enumerate() {
        let other = (t + 32) % 64;
        assert_eq!(w, 0xc0de_0000 + 4 * other as u32, "thread {t}");
    }
    let over = "mov.u32 %r5, 17;\n    cp.async.cg.shared.global [%rd3], [%rd2], 16, %r5;\n    cp.async.commit_group;";
    let f = cp_async_run(over, "cp.async.wait_all;", Checks::ALL).unwrap_err();
    assert_eq!(f.kind, FaultKind::IllegalInstruction, "{f}");
    let unread =
        "mov.u32 %r5, 0;\n    cp.async.cg.shared.global [%rd3], [%rd2+4096], 16, %r5;\n    cp.async.commit_group;";
    let out = cp_async_run(unread, "cp.async.wait_all;", Checks::ALL).unwrap();
    assert!(out.iter().all(|&w| w == 0), "{out:x?}");
}

#[test]
fn cp_async_memcheck_on_the_source() {
    let m = module(
        &CP_ASYNC
            .replace("COPY", "cp.async.cg.shared.global [%rd3], [%rd2+4096], 16;")
            .replace("WAIT", "cp.async.wait_all;"),
    );
    let mem = FlatMemory::new(BASE, 4096, false);
    let args: [&[u8]; 2] = [&BASE.to_le_bytes(), &(BASE + 2048).to_le_bytes()];
    let f = run(&m, 1, 64, &args, &mem, Checks::ALL).unwrap_err();
    assert_eq!(f.kind, FaultKind::OutOfBounds, "{f}");
    assert!(f.instruction.starts_with("cp.async"), "{f}");
    let m = module(
        &CP_ASYNC
            .replace("COPY", "cp.async.cg.shared.global [%rd3], [%rd2+8], 16;")
            .replace("WAIT", "cp.async.wait_all;"),
    );
    let f = run(&m, 1, 64, &args, &mem, Checks::ALL).unwrap_err();
    assert_eq!(f.kind, FaultKind::Misaligned, "{f}");
}

#[test]
fn cp_async_counts_as_global_load_and_shared_store() {
    let m = module(
        &CP_ASYNC
            .replace("COPY", COPY16)
            .replace("WAIT", "cp.async.wait_group 0;"),
    );
    let mem = FlatMemory::new(BASE, 4096, false);
    let args: [&[u8]; 2] = [&BASE.to_le_bytes(), &(BASE + 2048).to_le_bytes()];
    let c = common::profile_k(&m, 1, 64, &args, &mem, Checks::ALL).unwrap();
    let ld16 = InstrClass::Load {
        space: MemSpace::Global,
        width: 16,
    };
    assert_eq!(c.classes.get(ld16), 2);
    // Each warp copies 512 contiguous bytes: 16 sectors, 4 lines; into shared
    // memory as 4 conflict-free wavefronts of 8 lanes x 16 bytes.
    assert_eq!(c.global_load.requests, 2);
    assert_eq!(c.global_load.sectors, 32);
    assert_eq!(c.global_load.lines, 8);
    assert_eq!(c.shared_store.requests, 2);
    assert_eq!(c.shared_store.wavefronts, 8);
    assert!(c.classes.get(InstrClass::Control) >= 8);
}

/// Four blocks of 64 threads each update global counters: add (every old value once),
/// inc with a wrap, signed max, one winning cas, an f32 reduction; and a shared add.
const ATOMICS: &str = r#"
.shared .align 4 .b32 cnt;
.visible .entry k(.param .u64 p_g, .param .u64 p_out)
{
    .reg .pred %p<2>;
    .reg .b32 %r<12>;
    .reg .f32 %f<2>;
    .reg .b64 %rd<6>;
    mov.u32 %r0, %tid.x;
    mov.u32 %r1, %ctaid.x;
    mad.lo.u32 %r2, %r1, 64, %r0;
    ld.param.u64 %rd0, [p_g];
    setp.ne.u32 %p0, %r0, 0;
    @%p0 bra INIT_DONE;
    st.shared.u32 [cnt], 0;
INIT_DONE:
    bar.sync 0;
    atom.global.add.u32 %r3, [%rd0], 1;
    atom.global.inc.u32 %r4, [%rd0+4], 99;
    sub.s32 %r5, %r2, 100;
    atom.global.max.s32 %r6, [%rd0+8], %r5;
    add.u32 %r7, %r2, 1;
    atom.global.cas.b32 %r8, [%rd0+12], 0, %r7;
    red.global.add.f32 [%rd0+16], 0f3F000000;
    atom.shared.add.u32 %r9, [cnt], 2;
    fence.acq_rel.gpu;
    membar.gl;
    bar.sync 0;
    ld.shared.u32 %r10, [cnt];
    ld.param.u64 %rd1, [p_out];
    mul.wide.u32 %rd2, %r2, 16;
    add.u64 %rd1, %rd1, %rd2;
    st.global.v4.u32 [%rd1], {%r3, %r8, %r9, %r10};
    ret;
}
"#;

#[test]
fn atomics_are_exact_across_blocks_and_warps() {
    let m = module(ATOMICS);
    let mem = FlatMemory::new(BASE, 8192, true);
    put(&mem, BASE, &[0, 0, 0x8000_0000, 0, 0]);
    put(&mem, BASE + 1024, &vec![0; 1024]);
    let args: [&[u8]; 2] = [&BASE.to_le_bytes(), &(BASE + 1024).to_le_bytes()];
    run(&m, 4, 64, &args, &mem, Checks::ALL).unwrap();
    let g = words(&mem, BASE, 5);
    assert_eq!(g[0], 256, "add");
    assert_eq!(g[1], 256 % 100, "inc wraps to 0 after 99: 256 increments");
    assert_eq!(g[2] as i32, 255 - 100, "signed max");
    assert!((1..=256).contains(&g[3]), "cas winner {}", g[3]);
    assert_eq!(f32::from_bits(g[4]), 128.0, "f32 reduction");
    let out = words(&mem, BASE + 1024, 1024);
    let mut olds: Vec<u32> = out.chunks(4).map(|c| c[0]).collect();
    olds.sort_unstable();
    assert_eq!(olds, (0..256).collect::<Vec<u32>>(), "each old value once");
    let cas_winners = out.chunks(4).filter(|c| c[1] == 0).count();
    assert_eq!(cas_winners, 1);
    for block in out.chunks(256) {
        // Shared add of 2 by each of 64 threads: old values 0, 2, ..., 126; final 128.
        let mut shared_olds: Vec<u32> = block.chunks(4).map(|c| c[2]).collect();
        shared_olds.sort_unstable();
        assert_eq!(shared_olds, (0..64).map(|i| 2 * i).collect::<Vec<u32>>());
        assert!(block.chunks(4).all(|c| c[3] == 128));
    }
}

/// A plain read of bytes another warp updated atomically, with no barrier between, is
/// a race; atomics of two warps on the same bytes are not.
#[test]
fn racecheck_between_atomics_and_plain_accesses() {
    let racy = ATOMICS.replace(
        "    fence.acq_rel.gpu;\n    membar.gl;\n    bar.sync 0;\n",
        "    fence.acq_rel.gpu;\n    membar.gl;\n",
    );
    let m = module(&racy);
    let mem = FlatMemory::new(BASE, 8192, false);
    let args: [&[u8]; 2] = [&BASE.to_le_bytes(), &(BASE + 1024).to_le_bytes()];
    let f = run(&m, 1, 64, &args, &mem, Checks::ALL).unwrap_err();
    assert_eq!(f.kind, FaultKind::SharedRace, "{f}");
    // Warp 0 ran to its end (atomic add, then the read); warp 1's atomic then
    // updates bytes warp 0 read in the same barrier interval.
    assert!(f.detail.contains("atomically updates"), "{f}");
    assert!(f.instruction.starts_with("atom.shared"), "{f}");
}

#[rstest]
#[case::atom_red_cas("red.global.cas.b32 [%rd0], 1, 2;")]
#[case::atom_no_space("atom.add.u32 %r1, [%rd0], 1;")]
#[case::atom_f32_max("atom.global.max.f32 %f0, [%rd0], %f1;")]
#[case::ldmatrix_generic("ldmatrix.sync.aligned.m8n8.x4.b16 {%r1, %r2, %r3, %r4}, [%rd0];")]
#[case::ldmatrix_count("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1, %r2}, [%rd0];")]
#[case::cp_async_cg_4("cp.async.cg.shared.global [%rd0], [%rd0], 4;")]
#[case::cp_async_size("cp.async.ca.shared.global [%rd0], [%rd0], 12;")]
#[case::mma_shape(
    "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {%r1, %r2}, {%r1}, {%r1}, {%r1, %r2};"
)]
#[case::mma_bf16_f16_acc("mma.sync.aligned.m16n8k16.row.col.f16.bf16.bf16.f16 {%r1, %r2}, {%r1, %r2, %r3, %r4}, {%r1, %r2}, {%r1, %r2};")]
#[case::mma_mixed_accumulators("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f16 {%r1, %r2, %r3, %r4}, {%r1, %r2, %r3, %r4}, {%r1, %r2}, {%r1, %r2};")]
#[case::mma_wrong_regs("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%r1, %r2}, {%r1, %r2, %r3, %r4}, {%r1, %r2}, {%r1, %r2, %r3, %r4};")]
fn malformed_forms_are_refused(#[case] instr: &str) {
    let text = format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 p)\n{{\n    .reg .b32 %r<5>;\n    .reg .f32 %f<2>;\n    .reg .b64 %rd<2>;\n    {instr}\n    ret;\n}}\n"
    );
    let e = Module::parse("k.ptx", &text).expect_err(instr);
    assert!(
        e.message.contains("unsupported") || e.message.contains("expected"),
        "{e}"
    );
}

/// Every form of these instructions the tiled kernels may use, as ptxas 12.9 accepts
/// them for sm_80 and sm_90 (checked by hand with `ptxas -arch=sm_80`), parses.
#[test]
fn every_form_ptxas_accepts_parses() {
    let m = Module::parse("forms.ptx", FORMS).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.kernel_names(), ["forms"]);
}

const FORMS: &str = r#".version 8.0
.target sm_80
.address_size 64
.shared .align 16 .b8 sm[4096];
.visible .entry forms(.param .u64 p)
{
    .reg .pred %p<2>;
    .reg .b16 %h<4>;
    .reg .b32 %r<16>;
    .reg .f32 %f<8>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd0, [p];
    ld.global.L2::64B.u32 %r0, [%rd0];
    ld.global.v4.u32 {%r1, %r2, %r3, %r4}, [%rd0+16];
    add.rn.f16x2 %r5, %r1, %r2;
    sub.rn.ftz.sat.f16x2 %r5, %r5, %r2;
    mul.rn.f16 %h0, %h1, %h2;
    fma.rn.bf16x2 %r6, %r1, %r2, %r3;
    fma.rn.ftz.sat.f16 %h0, %h1, %h2, %h3;
    min.NaN.f16x2 %r7, %r1, %r2;
    max.bf16x2 %r7, %r7, %r2;
    min.ftz.f16 %h0, %h1, %h2;
    ex2.approx.f16x2 %r8, %r1;
    ex2.approx.f16x2 %r8, %r8;
    neg.f16x2 %r9, %r8;
    abs.bf16 %h0, %h1;
    neg.ftz.f16 %h0, %h0;
    cvt.rn.f16x2.f32 %r10, %f1, %f2;
    cvt.rn.relu.bf16x2.f32 %r10, %f1, %f2;
    mov.b32 %r11, {%h0, %h1};
    mov.b32 {%h2, %h3}, %r11;
    prmt.b32 %r12, %r1, %r2, 0x3210;
    prmt.b32.f4e %r12, %r12, %r2, %r3;
    prmt.b32.rc16 %r12, %r12, %r2, %r3;
    lop3.b32 %r13, %r1, %r2, %r3, 0xE8;
    shf.l.wrap.b32 %r14, %r1, %r2, %r3;
    shf.r.clamp.b32 %r14, %r14, %r2, 7;
    bfi.b32 %r15, %r1, %r2, 4, 8;
    popc.b64 %r1, %rd0;
    clz.b32 %r2, %r1;
    brev.b32 %r3, %r2;
    bfind.shiftamt.u32 %r4, %r3;
    bfind.s32 %r4, %r4;
    atom.global.add.u32 %r5, [%rd0], 1;
    atom.global.inc.u32 %r5, [%rd0+4], 7;
    atom.global.max.s32 %r5, [%rd0+8], %r1;
    atom.global.add.f32 %f3, [%rd0+12], %f1;
    atom.global.cas.b32 %r5, [%rd0+16], 0, %r1;
    atom.global.relaxed.gpu.exch.b64 %rd1, [%rd0+24], %rd0;
    red.global.add.f32 [%rd0+32], %f1;
    red.shared.add.u32 [sm], %r1;
    atom.shared.cas.b64 %rd2, [sm+8], %rd0, %rd1;
    atom.shared.min.u64 %rd2, [sm+16], %rd0;
    fence.acq_rel.gpu;
    fence.sc.cta;
    membar.gl;
    membar.cta;
    mov.u32 %r6, sm;
    ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%r1}, [%r6];
    ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%r1, %r2}, [%r6];
    ldmatrix.sync.aligned.m8n8.x4.shared::cta.b16 {%r1, %r2, %r3, %r4}, [%r6];
    mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f0, %f1, %f2, %f3}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f4, %f5, %f6, %f7};
    mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%r7, %r8}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%r7, %r8};
    mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f0, %f1, %f2, %f3}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f4, %f5, %f6, %f7};
    mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%f0, %f1, %f2, %f3}, {%r1, %r2}, {%r5}, {%f4, %f5, %f6, %f7};
    mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%f0, %f1, %f2, %f3}, {%r1, %r2}, {%r5}, {%f4, %f5, %f6, %f7};
    mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%r9, %r10, %r11, %r12}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%r9, %r10, %r11, %r12};
    mma.sync.aligned.m16n8k32.row.col.satfinite.s32.u8.s8.s32 {%r9, %r10, %r11, %r12}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%r9, %r10, %r11, %r12};
    mma.sync.aligned.m16n8k16.row.col.s32.s8.u8.s32 {%r9, %r10, %r11, %r12}, {%r1, %r2}, {%r5}, {%r9, %r10, %r11, %r12};
    mov.u64 %rd3, sm;
    cp.async.ca.shared.global [%rd3], [%rd0], 4;
    cp.async.ca.shared.global [%rd3+8], [%rd0+8], 8, %r1;
    cp.async.cg.shared.global [%rd3+16], [%rd0+16], 16, 4;
    cp.async.cg.shared.global.L2::128B [%rd3+32], [%rd0+32], 16;
    cp.async.commit_group;
    cp.async.wait_group 1;
    cp.async.wait_all;
    st.global.v4.f32 [%rd0], {%f0, %f1, %f2, %f3};
    st.global.v4.b32 [%rd0+16], {%r9, %r10, %r11, %r12};
    st.global.v4.b32 [%rd0+32], {%r13, %r14, %r15, %r7};
    st.global.v2.b64 [%rd0+48], {%rd1, %rd2};
    ret;
}
"#;

/// racecheck sees `ldmatrix`'s reads: two warps fill shared memory and run ldmatrix with
/// no bar.sync between, so warp 1's fill overwrites rows warp 0 already read. synccheck
/// wants all 32 lanes.
#[test]
fn ldmatrix_racecheck_and_synccheck() {
    let instr = "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%d0, %d1, %d2, %d3}, [%r6];";
    let two_warps = LDMATRIX
        .replace("add.u32 %r1, %r1, 32;", "add.u32 %r1, %r1, 64;")
        .replace("INSTR", instr);
    let mem = FlatMemory::new(BASE, 8192, false);
    let rows: Vec<u32> = (0..64).map(|l| (l % 32) * 16).collect();
    put(&mem, BASE, &rows);
    let args: [&[u8]; 2] = [&BASE.to_le_bytes(), &(BASE + 1024).to_le_bytes()];
    run(&module(&two_warps), 1, 64, &args, &mem, Checks::ALL).unwrap();
    let racy = two_warps.replace("    bar.sync 0;\n", "");
    let f = run(&module(&racy), 1, 64, &args, &mem, Checks::ALL).unwrap_err();
    assert_eq!(f.kind, FaultKind::SharedRace, "{f}");
    assert!(f.detail.contains("read by warp 0"), "{f}");
    let half = LDMATRIX.replace(
        "INSTR",
        &format!("setp.lt.u32 %p1, %r0, 16;\n    @%p1 {instr}"),
    );
    let f = run(&module(&half), 1, 32, &args, &mem, Checks::ALL).unwrap_err();
    assert_eq!(f.kind, FaultKind::SyncMask, "{f}");
    assert!(f.instruction.contains("ldmatrix"), "{f}");
}

/// One thread, one atomic on a global word or double word: the old value returned and
/// the new value stored, worked out by hand from the ISA's definitions.
#[rstest]
#[case::add_u32_wraps("add.u32", 0xffff_ffff, 2, 0, 1)]
#[case::add_s32("add.s32", 5, (-7i32) as u32 as u64, 0, (-2i32) as u32 as u64)]
#[case::add_u64_wraps("add.u64", u64::MAX, 3, 0, 2)]
// 1 + 2^-30 rounds to 1; a subnormal operand is flushed to zero.
#[case::add_f32_rounds("add.f32", 0x3f80_0000, 0x3080_0000, 0, 0x3f80_0000)]
#[case::add_f32_ftz("add.f32", 0, 1, 0, 0)]
#[case::inc_wraps_at_a("inc.u32", 5, 5, 0, 0)]
#[case::inc_below_a("inc.u32", 4, 5, 0, 5)]
#[case::dec_from_zero("dec.u32", 0, 7, 0, 7)]
#[case::dec_above_a("dec.u32", 8, 7, 0, 7)]
#[case::dec_within("dec.u32", 3, 7, 0, 2)]
// old == a is not above a: it decrements (kills `old > a` as `==` or `>=` in apply_atom).
#[case::dec_at_a("dec.u32", 7, 7, 0, 6)]
#[case::min_signed("min.s32", 0xffff_ffff, 1, 0, 0xffff_ffff)]
#[case::min_unsigned("min.u32", 0xffff_ffff, 1, 0, 1)]
#[case::max_signed("max.s32", 0xffff_ffff, 1, 0, 1)]
#[case::max_u64("max.u64", 1 << 40, 1 << 41, 0, 1 << 41)]
#[case::min_s64("min.s64", 1, u64::MAX, 0, u64::MAX)]
#[case::and("and.b32", 0xf0f0, 0xff00, 0, 0xf000)]
#[case::or("or.b32", 0xf0f0, 0xff00, 0, 0xfff0)]
#[case::xor("xor.b64", 0xf0f0, 0xff00, 0, 0x0ff0)]
#[case::exch("exch.b32", 7, 9, 0, 9)]
#[case::cas_hit("cas.b32", 5, 5, 9, 9)]
#[case::cas_miss("cas.b32", 5, 4, 9, 5)]
#[case::cas_b64("cas.b64", 1 << 40, 1 << 40, 3, 3)]
fn atomic_operation_table(
    #[case] op: &str,
    #[case] old: u64,
    #[case] a: u64,
    #[case] b: u64,
    #[case] new: u64,
) {
    let wide = op.ends_with("64");
    let (r, w) = if wide { ("%rd", 8) } else { ("%r", 4) };
    let operands = if op.starts_with("cas") {
        format!("{r}2, {r}3")
    } else {
        format!("{r}2")
    };
    let text = format!(
        ".visible .entry k(.param .u64 p_out, .param .u32 p_n)\n{{\n    .reg .b32 %r<4>;\n    .reg .b64 %rd<4>;\n    ld.param.u64 %rd0, [p_out];\n    ld.global.b{bits} {r}2, [%rd0+16];\n    ld.global.b{bits} {r}3, [%rd0+24];\n    atom.global.{op} {r}1, [%rd0], {operands};\n    st.global.b{bits} [%rd0+8], {r}1;\n    ret;\n}}\n",
        bits = w * 8
    );
    let m = module(&text);
    let mem = FlatMemory::new(BASE, 64, true);
    let words = |v: u64| v.to_le_bytes()[..w].to_vec();
    mem.write(BASE, &words(old));
    mem.write(BASE + 8, &[0; 8]);
    mem.write(BASE + 16, &words(a));
    mem.write(BASE + 24, &words(b));
    let n = 0u32.to_le_bytes();
    run(&m, 1, 1, &[&BASE.to_le_bytes(), &n], &mem, Checks::ALL).unwrap();
    let read = |at: u64| {
        let mut x = [0u8; 8];
        mem.read(at, &mut x[..w]);
        u64::from_le_bytes(x)
    };
    assert_eq!(read(BASE + 8), old, "{op}: old value");
    assert_eq!(read(BASE), new, "{op}: new value");
}
