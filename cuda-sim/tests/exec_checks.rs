//! Each check of the interpreter catches a deliberately broken kernel, names kernel, PTX
//! line, block and thread, and lets the fixed kernel pass.

#![allow(clippy::result_large_err)]

use cuda_sim::exec::{launch, LaunchConfig, LaunchError};
use cuda_sim::fault::{Checks, FaultKind, KernelFault};
use cuda_sim::mem::FlatMemory;
use cuda_sim::ptx::Module;

const BASE: u64 = 0x1000_0000;

fn module(body: &str, shared: &str) -> Module {
    let text = format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n{shared}\n.visible .entry k(.param .u64 p_out, .param .u32 p_n)\n{{\n{body}\n}}\n"
    );
    Module::parse("k.ptx", &text).unwrap_or_else(|e| panic!("{e}"))
}

fn run(m: &Module, block: [u32; 3], mem: &FlatMemory, checks: Checks) -> Result<(), KernelFault> {
    let out = BASE.to_le_bytes();
    let n = 0u32.to_le_bytes();
    let cfg = LaunchConfig {
        grid: [2, 1, 1],
        block,
        dynamic_shared: 0,
        programmatic: false,
    };
    match launch(m, "k", &cfg, &[&out, &n], mem, checks, 2) {
        Ok(_) => Ok(()),
        Err(LaunchError::Fault(f)) => Err(*f),
        Err(LaunchError::Invalid(e)) => panic!("invalid launch: {e}"),
    }
}

const REGS: &str = "    .reg .pred %p<4>;\n    .reg .b32 %r<16>;\n    .reg .f32 %f<4>;\n    .reg .b64 %rd<8>;\n    ld.param.u64 %rd0, [p_out];\n    mov.u32 %r0, %tid.x;\n";

#[test]
fn memcheck_out_of_bounds_store() {
    // Thread i stores word i; 64 threads but room for 32 words.
    let body = format!("{REGS}    mul.wide.u32 %rd1, %r0, 4;\n    add.u64 %rd1, %rd0, %rd1;\n    st.global.u32 [%rd1], %r0;\n    ret;");
    let m = module(&body, "");
    let small = FlatMemory::new(BASE, 128, false);
    let f = run(&m, [64, 1, 1], &small, Checks::ALL).unwrap_err();
    assert_eq!(f.kind, FaultKind::OutOfBounds);
    assert_eq!(f.kernel, "k");
    assert_eq!(f.thread, [32, 0, 0], "{f}");
    assert_eq!(f.address, Some(BASE + 128));
    assert!(f.instruction.starts_with("st.global.u32"), "{f}");
    assert_eq!(f.kind.error_code(), cuda_sim::ErrorCode::IllegalAddress);
    let big = FlatMemory::new(BASE, 256, false);
    run(&m, [64, 1, 1], &big, Checks::ALL).unwrap();
}

#[test]
fn memcheck_misaligned_load() {
    let body = format!("{REGS}    ld.global.u32 %r1, [%rd0+2];\n    ret;");
    let m = module(&body, "");
    let mem = FlatMemory::new(BASE, 64, false);
    let f = run(&m, [32, 1, 1], &mem, Checks::ALL).unwrap_err();
    assert_eq!(f.kind, FaultKind::Misaligned);
    assert_eq!(f.address, Some(BASE + 2));
    let fixed = module(
        &format!("{REGS}    ld.global.u32 %r1, [%rd0+4];\n    ret;"),
        "",
    );
    run(&fixed, [32, 1, 1], &mem, Checks::ALL).unwrap();
}

#[test]
fn initcheck_reads_of_never_written_memory() {
    let body =
        format!("{REGS}    ld.global.f32 %f0, [%rd0+8];\n    st.global.f32 [%rd0], %f0;\n    ret;");
    let m = module(&body, "");
    let mem = FlatMemory::new(BASE, 64, true);
    let f = run(&m, [32, 1, 1], &mem, Checks::ALL).unwrap_err();
    assert_eq!(f.kind, FaultKind::UninitializedRead);
    assert_eq!(f.line, 13, "{f}");
    mem.write(BASE + 8, &1f32.to_le_bytes());
    run(&m, [32, 1, 1], &mem, Checks::ALL).unwrap();
    let mut out = [0u8; 4];
    mem.read(BASE, &mut out);
    assert_eq!(f32::from_le_bytes(out), 1.0);
}

/// Warp 1 reads the shared word warp 0 wrote: a race without bar.sync, fine with it.
fn shared_kernel(with_barrier: bool) -> Module {
    let bar = if with_barrier {
        "    bar.sync 0;\n"
    } else {
        ""
    };
    let body = format!(
        "{REGS}    mov.u64 %rd2, sm;\n    setp.ne.u32 %p0, %r0, 0;\n    @%p0 bra SKIP;\n    st.shared.u32 [%rd2], 7;\nSKIP:\n{bar}    setp.ne.u32 %p1, %r0, 32;\n    @%p1 bra DONE;\n    ld.shared.u32 %r2, [%rd2];\n    st.global.u32 [%rd0], %r2;\nDONE:\n    ret;"
    );
    module(&body, ".shared .align 4 .b8 sm[16];")
}

#[test]
fn racecheck_shared_memory_between_warps() {
    let mem = FlatMemory::new(BASE, 64, false);
    let f = run(&shared_kernel(false), [64, 1, 1], &mem, Checks::ALL).unwrap_err();
    assert_eq!(f.kind, FaultKind::SharedRace);
    assert_eq!(f.thread, [32, 0, 0]);
    assert!(f.detail.contains("warp 0"), "{f}");
    run(&shared_kernel(true), [64, 1, 1], &mem, Checks::ALL).unwrap();
    let mut out = [0u8; 4];
    mem.read(BASE, &mut out);
    assert_eq!(u32::from_le_bytes(out), 7);
    // Without racecheck the racy kernel runs (warps run in order, so it reads 7).
    run(&shared_kernel(false), [64, 1, 1], &mem, Checks::NONE).unwrap();
}

/// Warp 0 writes a shared word; after a barrier warps 0 and 1 read it and warp 2 then
/// writes it: a race with both readers (reported as "other warps") unless a second
/// barrier orders the write after the reads.
fn two_readers_then_a_writer(second_barrier: bool) -> Module {
    let bar = if second_barrier {
        "    bar.sync 0;\n"
    } else {
        ""
    };
    let body = format!(
        "{REGS}    mov.u64 %rd2, sm;\n    and.b32 %r1, %r0, 31;\n    shr.u32 %r3, %r0, 5;\n    setp.ne.u32 %p0, %r0, 0;\n    @%p0 bra FIRST;\n    st.shared.u32 [%rd2], 7;\nFIRST:\n    bar.sync 0;\n    setp.ne.u32 %p1, %r1, 0;\n    setp.gt.u32 %p2, %r3, 1;\n    or.pred %p1, %p1, %p2;\n    @%p1 bra READ_DONE;\n    ld.shared.u32 %r2, [%rd2];\nREAD_DONE:\n{bar}    setp.ne.u32 %p3, %r0, 64;\n    @%p3 bra DONE;\n    st.shared.u32 [%rd2], 9;\nDONE:\n    ret;"
    );
    module(&body, ".shared .align 4 .b8 sm[16];")
}

#[test]
fn racecheck_remembers_that_several_warps_read_a_word() {
    let mem = FlatMemory::new(BASE, 64, false);
    let f = run(
        &two_readers_then_a_writer(false),
        [96, 1, 1],
        &mem,
        Checks::ALL,
    )
    .unwrap_err();
    assert_eq!(f.kind, FaultKind::SharedRace);
    assert_eq!(f.thread, [64, 0, 0]);
    assert!(f.detail.contains("read by other warps"), "{f}");
    run(
        &two_readers_then_a_writer(true),
        [96, 1, 1],
        &mem,
        Checks::ALL,
    )
    .unwrap();
}

#[test]
fn synccheck_shuffle_with_a_wrong_member_mask() {
    // Only the even lanes execute the shuffle, but the mask names all 32.
    let body = |mask: &str| {
        format!("{REGS}    and.b32 %r1, %r0, 1;\n    setp.ne.u32 %p0, %r1, 0;\n    @%p0 bra DONE;\n    shfl.sync.bfly.b32 %r2, %r0, 2, 31, {mask};\n    st.global.u32 [%rd0], %r2;\nDONE:\n    ret;")
    };
    let mem = FlatMemory::new(BASE, 64, false);
    let f = run(
        &module(&body("0xffffffff"), ""),
        [32, 1, 1],
        &mem,
        Checks::ALL,
    )
    .unwrap_err();
    assert_eq!(f.kind, FaultKind::SyncMask);
    assert!(f.detail.contains("not executing"), "{f}");
    run(
        &module(&body("0x55555555"), ""),
        [32, 1, 1],
        &mem,
        Checks::ALL,
    )
    .unwrap();
}

#[test]
fn synccheck_bar_sync_under_divergence() {
    let body = format!(
        "{REGS}    setp.lt.u32 %p0, %r0, 16;\n    @%p0 bra DONE;\n    bar.sync 0;\nDONE:\n    ret;"
    );
    let mem = FlatMemory::new(BASE, 64, false);
    let f = run(&module(&body, ""), [32, 1, 1], &mem, Checks::ALL).unwrap_err();
    assert_eq!(f.kind, FaultKind::BarrierDivergence);
    let ok = format!("{REGS}    bar.sync 0;\n    ret;");
    run(&module(&ok, ""), [64, 1, 1], &mem, Checks::ALL).unwrap();
}

#[test]
fn trap_is_an_illegal_instruction() {
    let body = format!("{REGS}    setp.eq.u32 %p0, %r0, 5;\n    @%p0 trap;\n    ret;");
    let mem = FlatMemory::new(BASE, 64, false);
    let f = run(&module(&body, ""), [32, 1, 1], &mem, Checks::NONE).unwrap_err();
    assert_eq!(f.kind, FaultKind::IllegalInstruction);
    assert_eq!(f.thread, [5, 0, 0]);
    assert_eq!(f.block, [0, 0, 0]);
}

#[test]
fn unsupported_instructions_are_load_errors_with_their_line() {
    let text = ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 p)\n{\n    .reg .b32 %r<2>;\n    mov.u32 %r0, 1;\n    sad.u32 %r1, %r0, %r0, %r0;\n    ret;\n}\n";
    let e = Module::parse("bad.ptx", text).unwrap_err();
    assert_eq!(e.line, 8);
    assert_eq!(e.file, "bad.ptx");
    assert_eq!(e.text, "sad.u32 %r1, %r0, %r0, %r0;");
    assert!(
        e.to_string().contains("unsupported instruction 'sad.u32'"),
        "{e}"
    );
    let e = Module::parse(
        "bad.ptx",
        &text.replace("sad.u32 %r1, %r0, %r0, %r0", "bra NOWHERE"),
    )
    .unwrap_err();
    assert!(e.message.contains("unknown label"), "{e}");
}

#[test]
fn prefetch_is_a_hint_that_never_faults() {
    // A prefetch of a line past the allocation (a GPU drops it) and of a valid one, then
    // a store: memcheck passes, and the store lands.
    let body = format!(
        "{REGS}    add.u64 %rd1, %rd0, 4096;\n    prefetch.global.L2 [%rd1];\n    prefetch.global.L1 [%rd0+64];\n    mul.wide.u32 %rd2, %r0, 4;\n    add.u64 %rd2, %rd0, %rd2;\n    st.global.u32 [%rd2], %r0;\n    ret;"
    );
    let m = module(&body, "");
    let mem = FlatMemory::new(BASE, 256, false);
    run(&m, [32, 1, 1], &mem, Checks::ALL).unwrap();
    let mut word = [0u8; 4];
    mem.read(BASE + 4 * 7, &mut word);
    assert_eq!(u32::from_le_bytes(word), 7);
    // Without a cache level the instruction is not one cuda-sim accepts.
    let text = ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 p_out)\n{\n    .reg .b64 %rd<2>;\n    ld.param.u64 %rd0, [p_out];\n    prefetch.global [%rd0];\n    ret;\n}\n";
    let e = Module::parse("k.ptx", text).unwrap_err();
    assert!(e.to_string().contains("cache level"), "{e}");
}
