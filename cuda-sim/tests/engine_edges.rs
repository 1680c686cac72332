//! Edges of the execution engine the other tests leave open, each a small PTX program
//! whose expected result is worked out here from the PTX ISA (never by cuda-sim's own
//! helpers): the lanes of a block's partial last warp, the thread a synccheck of a
//! `.sync.aligned` instruction names, `mma` with infinite B or C or one infinite A
//! element, the predicate logic instructions, stores to a `.param` argument at a nonzero
//! offset, `.local` memory per thread, the bounds of a function's `.param` space,
//! `bar.warp.sync`'s mask check, `mov` packing and unpacking per lane, `shfl` from a
//! lane that is not executing it, `ret` / `exit` / falling off the end while other lanes
//! wait elsewhere, `bar.sync` inside a function, a full member mask in a partial warp, and
//! a launch's instruction counts.

mod exact;

use cuda_sim::exec::{launch, LaunchConfig, LaunchError};
use cuda_sim::fault::{Checks, FaultKind, KernelFault};
use cuda_sim::mem::FlatMemory;
use cuda_sim::ptx::Module;
use rstest::rstest;

const BASE: u64 = 0x1000_0000;
const HEADER: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";
/// What the output words hold before a kernel runs (no thread writes it here).
const SENTINEL: u32 = 0xdead_beef;

/// Runs kernel `k(.param .u64 p_out)` of `text` as one block of `block` threads, with
/// `p_out` pointing at `words` words of [`SENTINEL`]; the words after the run, or the
/// fault.
fn run(
    text: &str,
    block: [u32; 3],
    words: usize,
    checks: Checks,
) -> Result<Vec<u32>, Box<KernelFault>> {
    let module = Module::parse("engine.ptx", text).unwrap_or_else(|e| panic!("{e}"));
    let mem = FlatMemory::new(BASE, 4 * words, false);
    let fill: Vec<u8> = (0..words).flat_map(|_| SENTINEL.to_le_bytes()).collect();
    mem.write(BASE, &fill);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block,
        dynamic_shared: 0,
        programmatic: false,
    };
    match launch(&module, "k", &cfg, &[&BASE.to_le_bytes()], &mem, checks, 1) {
        Ok(_) => {}
        Err(LaunchError::Fault(f)) => return Err(f),
        Err(LaunchError::Invalid(e)) => panic!("invalid launch: {e}"),
    }
    let mut out = vec![0u8; 4 * words];
    mem.read(BASE, &mut out);
    Ok(out
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect())
}

/// Every thread of a block writes `1000 + its linear index` (x fastest, then y, then z)
/// to that word. A block whose size is not a multiple of 32 has a last warp with fewer
/// lanes: exactly the block's threads run, so exactly `x * y * z` words are written and
/// the rest keep the sentinel.
/// Kills `engine.rs` `BlockRunner::run`: `(threads - w * 32).min(32)` with `+` for `-`
/// (every warp after the first would get 32 lanes).
#[rstest]
#[case::one_lane_over_a_warp([33, 1, 1])]
#[case::two_dimensional([8, 5, 1])]
#[case::three_dimensional([3, 3, 7])]
#[case::three_warps([70, 1, 1])]
#[case::whole_warps([64, 1, 1])]
fn a_partial_last_warp_runs_only_the_blocks_threads(#[case] block: [u32; 3]) {
    let text = format!(
        "{HEADER}.visible .entry k(.param .u64 p_out)
{{
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd0, [p_out];
    mov.u32 %r0, %tid.x;
    mov.u32 %r1, %tid.y;
    mov.u32 %r2, %tid.z;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %ntid.y;
    mad.lo.u32 %r5, %r2, %r4, %r1;
    mad.lo.u32 %r5, %r5, %r3, %r0;
    mul.wide.u32 %rd1, %r5, 4;
    add.u64 %rd1, %rd0, %rd1;
    add.u32 %r6, %r5, 1000;
    st.global.u32 [%rd1], %r6;
    ret;
}}
"
    );
    let threads = (block[0] * block[1] * block[2]) as usize;
    let got = run(&text, block, 96, Checks::ALL).unwrap_or_else(|f| panic!("{f}"));
    let want: Vec<u32> = (0..96u32)
        .map(|i| {
            if (i as usize) < threads {
                1000 + i
            } else {
                SENTINEL
            }
        })
        .collect();
    let written = got.iter().filter(|&&w| w != SENTINEL).count();
    let first_bad = got.iter().zip(&want).position(|(g, w)| g != w);
    assert_eq!(
        first_bad, None,
        "block {block:?}: {written} words written for {threads} threads"
    );
}

/// An `mma.sync.aligned` of f16 with every A element 1.0, B and C uniform; D's words.
fn mma_kernel(guard: &str, instr: &str, a: u32, b: u32, c: u32, nc: usize) -> String {
    let list = |p: &str, n: usize| {
        (0..n)
            .map(|i| format!("%{p}{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let movs = |p: &str, n: usize, v: u32| {
        (0..n)
            .map(|i| format!("    mov.b32 %{p}{i}, {v:#010x};\n"))
            .collect::<String>()
    };
    let stores = (0..nc)
        .map(|i| format!("    st.global.b32 [%rd1+{}], %d{i};\n", 4 * i))
        .collect::<String>();
    format!(
        "{HEADER}.visible .entry k(.param .u64 p_out)
{{
    .reg .pred %p0;
    .reg .b32 %r<4>;
    .reg .b32 %a<4>;
    .reg .b32 %b<2>;
    .reg .b32 %c<4>;
    .reg .b32 %d<4>;
    .reg .b64 %rd<4>;
    mov.u32 %r0, %tid.x;
{}{}{}{guard}
    {instr} {{{}}}, {{{}}}, {{%b0, %b1}}, {{{}}};
    ld.param.u64 %rd0, [p_out];
    mul.wide.u32 %rd1, %r0, {};
    add.u64 %rd1, %rd0, %rd1;
{stores}    ret;
}}
",
        movs("a", 4, a),
        movs("b", 2, b),
        movs("c", nc, c),
        list("d", nc),
        list("a", 4),
        list("c", nc),
        4 * nc,
    )
}

const MMA_F32: &str = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32";

/// synccheck of `mma.sync.aligned`, which all 32 lanes must execute together: the fault
/// names the lowest thread of the warp that does not execute it (the one that should
/// have come), whichever lanes do.
/// Kills `collective.rs` `BlockRunner::whole_warp`: `(!exec).trailing_zeros()` with the
/// `!` deleted (it would name the lowest lane that does execute it).
#[rstest]
#[case::low_half("setp.lt.u32 %p0, %r0, 16;", 16)]
#[case::high_half("setp.ge.u32 %p0, %r0, 16;", 0)]
#[case::odd_lanes("and.b32 %r1, %r0, 1;\n    setp.ne.u32 %p0, %r1, 0;", 0)]
#[case::all_but_lane_5("setp.ne.u32 %p0, %r0, 5;", 5)]
#[case::all_but_lane_31("setp.ne.u32 %p0, %r0, 31;", 31)]
fn synccheck_of_a_partial_mma_names_the_first_missing_thread(
    #[case] guard: &str,
    #[case] missing: u32,
) {
    let instr = format!("@%p0 {MMA_F32}");
    let text = mma_kernel(guard, &instr, 0x3c00_3c00, 0, 0, 4);
    let f = run(&text, [32, 1, 1], 128, Checks::ALL).unwrap_err();
    assert_eq!(f.kind, FaultKind::SyncMask, "{f}");
    assert_eq!(f.thread, [missing, 0, 0], "{f}");
    // The same guard true in every lane runs.
    let all = mma_kernel("setp.lt.u32 %p0, %r0, 32;", &instr, 0x3c00_3c00, 0, 0, 4);
    run(&all, [32, 1, 1], 128, Checks::ALL).unwrap_or_else(|f| panic!("{f}"));
}

/// `mma` with finite A (1.0) and an infinity in every element of B, or in C: each element
/// of D is C + a sum of 16 products 1 x B, so an infinite B gives an infinity of its sign
/// (and C = +inf with finite products gives +inf), with the f32 or f16 accumulator, under
/// either of cuda-sim's accumulation choices (the ISA's error-bound edge or the SM90
/// model).
/// Kills `collective.rs` `BlockRunner::mma`: `row_ok[row] && col_ok[n] && finite(c)`
/// with `||` for the first `&&` (a finite row of A would take the finite path and read
/// the infinite B elements as zero).
#[rstest]
#[case::f16_b_plus_inf(MMA_F32, 0x3c00, 0x7c00, 0, 4, 0x7f80_0000)]
#[case::f16_b_minus_inf(MMA_F32, 0x3c00, 0xfc00, 0, 4, 0xff80_0000)]
#[case::f16_c_plus_inf(MMA_F32, 0x3c00, 0x3c00, 0x7f80_0000, 4, 0x7f80_0000)]
#[case::bf16_b_plus_inf(
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    0x3f80,
    0x7f80,
    0,
    4,
    0x7f80_0000
)]
#[case::f16_accumulator_b_minus_inf(
    "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16",
    0x3c00,
    0xfc00,
    0,
    2,
    0xfc00_fc00
)]
fn mma_with_infinite_b_or_c_gives_infinite_d(
    #[case] instr: &str,
    #[case] a_half: u32,
    #[case] b_half: u32,
    #[case] c_word: u32,
    #[case] nc: usize,
    #[case] want_word: u32,
    #[values(Checks::ALL, Checks::NONE)] checks: Checks,
) {
    let pair = |h: u32| h << 16 | h;
    let text = mma_kernel("", instr, pair(a_half), pair(b_half), c_word, nc);
    let got = run(&text, [32, 1, 1], 32 * nc, checks).unwrap_or_else(|f| panic!("{f}"));
    let bad: Vec<String> = got
        .iter()
        .enumerate()
        .filter(|(_, &w)| w != want_word)
        .take(4)
        .map(|(i, w)| format!("word {i}: {w:#010x}"))
        .collect();
    assert!(bad.is_empty(), "want {want_word:#010x} everywhere: {bad:?}");
}

/// `and`, `or`, `xor` and `not` on predicates (PTX ISA "Logic and Shift Instructions":
/// and, or, xor, not with type `.pred`), over the whole truth table; the result comes
/// back through `selp` as 1 or 0.
/// Kills `instr.rs` `BlockRunner::exec`: `x & y` of `and.pred` with `^` (and the same
/// for `|` of `or.pred`).
#[rstest]
#[case::and("and.pred %q, %p0, %q;", |x: bool, y: bool| x && y)]
#[case::or("or.pred %q, %p0, %q;", |x: bool, y: bool| x || y)]
#[case::xor("xor.pred %q, %p0, %q;", |x: bool, y: bool| x != y)]
#[case::not("not.pred %q, %p0;", |x: bool, _: bool| !x)]
fn predicate_logic_truth_tables(#[case] op: &str, #[case] want: fn(bool, bool) -> bool) {
    let instr = format!(
        "setp.ne.u32 %p0, %xa, 0;\n    setp.ne.u32 %q, %xb, 0;\n    {op}\n    selp.u32 %xd, 1, 0, %q;"
    );
    let cases = [[0, 0, 0], [0, 1, 0], [1, 0, 0], [1, 1, 0]];
    let got = exact::run(["u32", "u32", "u32", "u32"], &instr, &cases);
    let expected: Vec<u64> = cases
        .iter()
        .map(|c| want(c[0] != 0, c[1] != 0) as u64)
        .collect();
    exact::assert_bits(op, &cases, &got, &expected);
}

/// A call whose second argument sits 4 bytes into the caller's `.param` space: each
/// calling thread passes x = 3 tid + 7 and y = tid to `diff`, which returns x - y, so it
/// writes 2 tid + 7; threads below `first` skip the call and write nothing.
/// Kills `memory.rs` `BlockRunner::store`: the `.param` store's byte
/// `lane * param_bytes + offset` with `-` for `+` (lane 0's store would fall before the
/// frame's parameters, and lane L's into lane L - 1's).
#[rstest]
#[case::every_thread(0)]
#[case::all_but_thread_0(1)]
fn param_stores_at_an_offset_reach_the_callee(#[case] first: u32) {
    let text = format!(
        "{HEADER}.func (.param .b32 r) diff(.param .b32 x, .param .b32 y)
{{
    .reg .b32 %t<3>;
    ld.param.b32 %t0, [x];
    ld.param.b32 %t1, [y];
    sub.u32 %t2, %t0, %t1;
    st.param.b32 [r], %t2;
    ret;
}}
.visible .entry k(.param .u64 p_out)
{{
    .reg .pred %p0;
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd0, [p_out];
    mov.u32 %r0, %tid.x;
    setp.lt.u32 %p0, %r0, {first};
    @%p0 bra DONE;
    mad.lo.u32 %r1, %r0, 3, 7;
    {{
        .param .b32 px;
        .param .b32 py;
        .param .b32 pr;
        st.param.b32 [px], %r1;
        st.param.b32 [py], %r0;
        call (pr), diff, (px, py);
        ld.param.b32 %r2, [pr];
    }}
    mul.wide.u32 %rd1, %r0, 4;
    add.u64 %rd1, %rd0, %rd1;
    st.global.u32 [%rd1], %r2;
DONE:
    ret;
}}
"
    );
    let got = run(&text, [32, 1, 1], 32, Checks::ALL).unwrap_or_else(|f| panic!("{f}"));
    let want: Vec<u32> = (0..32)
        .map(|t| if t < first { SENTINEL } else { 2 * t + 7 })
        .collect();
    assert_eq!(got, want);
}

/// Every thread stores two words to its own `.local` array (at byte offsets 4 and 12,
/// after a barrier that lets every other thread store too), loads them back and writes
/// `1000 * tid + (7 * tid + 1)`: local memory is per thread and keeps what was stored at
/// each offset.
/// Kills `memory.rs` `BlockRunner::load` and `store`: the local range `s..s + n` with `-`
/// or `*` for `+` (an empty, reversed or misplaced range).
#[test]
fn local_memory_is_per_thread_and_keeps_each_offset() {
    let text = format!(
        "{HEADER}.visible .entry k(.param .u64 p_out)
{{
    .local .align 8 .b8 buf[16];
    .reg .b32 %r<6>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd0, [p_out];
    mov.u32 %r0, %tid.x;
    mov.u64 %rd2, buf;
    mad.lo.u32 %r1, %r0, 7, 1;
    st.local.u32 [%rd2+4], %r1;
    st.local.u32 [%rd2+12], %r0;
    bar.sync 0;
    ld.local.u32 %r2, [%rd2+4];
    ld.local.u32 %r3, [%rd2+12];
    mad.lo.u32 %r4, %r3, 1000, %r2;
    mul.wide.u32 %rd1, %r0, 4;
    add.u64 %rd1, %rd0, %rd1;
    st.global.u32 [%rd1], %r4;
    ret;
}}
"
    );
    let got = run(&text, [40, 1, 1], 40, Checks::ALL).unwrap_or_else(|f| panic!("{f}"));
    let want: Vec<u32> = (0..40).map(|t| 1000 * t + 7 * t + 1).collect();
    assert_eq!(got, want);
}

/// A kernel whose only `.param` variable is the 4-byte `pa`: a store of 4 bytes at `pa`
/// ends exactly at the end of the function's parameter space and is legal (its value read
/// back and written out); a store or a load at `pa + 4`, just past the end, is a
/// `LocalOrSharedOutOfBounds` fault.
/// Kills `memory.rs` `BlockRunner::store`'s bound `s + n > param_bytes` with `>=` (the
/// legal store faults) or `==` (the store past the end is not caught), and `load`'s with
/// `-` for `+` (the load past the end is not caught).
#[rstest]
#[case::store_ending_at_the_end("st.param.b32 [pa], %r1;", None)]
#[case::store_past_the_end("st.param.b32 [pa+4], %r1;", Some("parameter write out of range"))]
#[case::load_past_the_end("ld.param.b32 %r1, [pa+4];", Some("parameter read out of range"))]
fn function_param_space_ends_at_its_last_variable(
    #[case] access: &str,
    #[case] fault: Option<&str>,
) {
    let text = format!(
        "{HEADER}.visible .entry k(.param .u64 p_out)
{{
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd0, [p_out];
    mov.u32 %r0, %tid.x;
    add.u32 %r1, %r0, 50;
    {{
        .param .b32 pa;
        st.param.b32 [pa], %r0;
        {access}
        ld.param.b32 %r2, [pa];
    }}
    mul.wide.u32 %rd1, %r0, 4;
    add.u64 %rd1, %rd0, %rd1;
    st.global.u32 [%rd1], %r2;
    ret;
}}
"
    );
    match (run(&text, [32, 1, 1], 32, Checks::ALL), fault) {
        (Ok(got), None) => {
            let want: Vec<u32> = (0..32).map(|t| t + 50).collect();
            assert_eq!(got, want);
        }
        (Ok(got), Some(f)) => panic!("expected the fault {f:?}, the kernel wrote {got:?}"),
        (Err(e), Some(f)) => {
            assert_eq!(e.kind, FaultKind::LocalOrSharedOutOfBounds, "{e}");
            assert!(e.to_string().contains(f), "{e}");
        }
        (Err(e), None) => panic!("{e}"),
    }
}

/// `bar.warp.sync` whose mask names lanes that are not executing it (lanes 16-31 branched
/// around it) is a `SyncMask` fault under synccheck, and nothing at all without the
/// checks (every thread then writes its index); a mask of exactly the executing lanes is
/// clean either way.
/// Kills `instr.rs` `BlockRunner::exec`'s guard `exec != 0 && checks.synccheck` of the
/// `BarWarpSync` arm set to `false` (the bad mask passes) or `true` (checked without
/// synccheck).
#[rstest]
#[case::bad_mask_checked("0xffffffff", Checks::ALL, true)]
#[case::bad_mask_unchecked("0xffffffff", Checks::NONE, false)]
#[case::exact_mask_checked("0x0000ffff", Checks::ALL, false)]
fn warp_sync_mask_is_checked_only_under_synccheck(
    #[case] mask: &str,
    #[case] checks: Checks,
    #[case] faults: bool,
) {
    let text = format!(
        "{HEADER}.visible .entry k(.param .u64 p_out)
{{
    .reg .pred %p0;
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd0, [p_out];
    mov.u32 %r0, %tid.x;
    setp.ge.u32 %p0, %r0, 16;
    @%p0 bra SKIP;
    bar.warp.sync {mask};
SKIP:
    mul.wide.u32 %rd1, %r0, 4;
    add.u64 %rd1, %rd0, %rd1;
    st.global.u32 [%rd1], %r0;
    ret;
}}
"
    );
    let fault = faults.then_some("bar.warp.sync");
    expect_sync_fault_or(run(&text, [32, 1, 1], 32, checks), fault, (0..32).collect());
}

/// `mov` packing two 32-bit registers into a 64-bit one and unpacking it again, with
/// values that differ per lane: thread t packs {3t + 1, 5t + 2}, unpacks it into two other
/// registers and writes `hi * 1000 + lo` from the unpacked pair (so 1000 (5t + 2) + 3t + 1),
/// the packed value's high half, and the high half of the unpacked low part packed twice
/// (3t + 1: the unpacked part holds exactly its 32 bits).
/// Kills `instr.rs` `BlockRunner::exec`'s register index `reg * 32 + lane` with `-` for `+`
/// in the `mov` vector forms (the source parts, the packed destination, the unpacked
/// parts): every lane but 0 would read or write another lane's register; and `mask_bits`'s
/// `w >= 64` as `w < 64` (an unpacked part keeping the whole 64-bit value).
#[test]
fn vector_mov_packs_and_unpacks_each_lanes_own_registers() {
    let text = format!(
        "{HEADER}.visible .entry k(.param .u64 p_out)
{{
    .reg .b32 %r<8>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd0, [p_out];
    mov.u32 %r0, %tid.x;
    mad.lo.u32 %r1, %r0, 3, 1;
    mad.lo.u32 %r2, %r0, 5, 2;
    mov.b64 %rd3, {{%r1, %r2}};
    mov.b64 {{%r4, %r5}}, %rd3;
    mad.lo.u32 %r6, %r5, 1000, %r4;
    shr.u64 %rd4, %rd3, 32;
    cvt.u32.u64 %r7, %rd4;
    mov.b64 %rd5, {{%r4, %r4}};
    shr.u64 %rd5, %rd5, 32;
    cvt.u32.u64 %r3, %rd5;
    mul.wide.u32 %rd1, %r0, 12;
    add.u64 %rd1, %rd0, %rd1;
    st.global.u32 [%rd1], %r6;
    st.global.u32 [%rd1+4], %r7;
    st.global.u32 [%rd1+8], %r3;
    ret;
}}
"
    );
    let got = run(&text, [40, 1, 1], 120, Checks::ALL).unwrap_or_else(|f| panic!("{f}"));
    let want: Vec<u32> = (0..40)
        .flat_map(|t| [1000 * (5 * t + 2) + 3 * t + 1, 5 * t + 2, 3 * t + 1])
        .collect();
    assert_eq!(got, want);
}

/// `shfl.sync.idx` by lanes 0-15 (the mask names exactly them) from source lane 20, which
/// is not executing it: under synccheck a `SyncMask` fault naming lane 20 (the PTX ISA
/// leaves the value undefined); reading lane 5 instead is clean and gives lane 5's value.
/// Kills `instr.rs` `BlockRunner::exec`'s source-lane check `exec & (1 << j) == 0` with `|`
/// or `^` for `&` (the read of a lane that is not executing passes).
#[rstest]
#[case::inactive_source(20, true)]
#[case::active_source(5, false)]
fn shfl_from_a_lane_that_is_not_executing_faults_under_synccheck(
    #[case] src: u32,
    #[case] faults: bool,
) {
    let text = format!(
        "{HEADER}.visible .entry k(.param .u64 p_out)
{{
    .reg .pred %p0;
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd0, [p_out];
    mov.u32 %r0, %tid.x;
    add.u32 %r1, %r0, 100;
    mov.u32 %r2, %r0;
    setp.ge.u32 %p0, %r0, 16;
    @%p0 bra SKIP;
    shfl.sync.idx.b32 %r2, %r1, {src}, 31, 0x0000ffff;
SKIP:
    mul.wide.u32 %rd1, %r0, 4;
    add.u64 %rd1, %rd0, %rd1;
    st.global.u32 [%rd1], %r2;
    ret;
}}
"
    );
    let want = (0..32)
        .map(|t| if t < 16 { src + 100 } else { t })
        .collect();
    let fault = faults.then_some("read lane 20");
    expect_sync_fault_or(run(&text, [32, 1, 1], 32, Checks::ALL), fault, want);
}

/// With `fault` `Some(text)`: the run ended in a `SyncMask` fault whose message contains
/// `text`; with `None`: it ran clean and wrote `want`.
fn expect_sync_fault_or(
    got: Result<Vec<u32>, Box<KernelFault>>,
    fault: Option<&str>,
    want: Vec<u32>,
) {
    match (got, fault) {
        (Ok(got), None) => assert_eq!(got, want),
        (Ok(got), Some(_)) => panic!("expected a SyncMask fault, the kernel wrote {got:?}"),
        (Err(e), Some(text)) => {
            assert_eq!(e.kind, FaultKind::SyncMask, "{e}");
            assert!(e.to_string().contains(text), "{e}");
        }
        (Err(e), None) => panic!("{e}"),
    }
}

/// `mma` (f16 in, f32 accumulator) with one infinite A element, at row 3 and k 5, all
/// other A and B elements 1.0 but B[5][0] = 0 and B[5][1] = -1: row 3 of D is NaN (inf x 0)
/// in column 0, -inf in column 1 and +inf elsewhere; every other row sums 16 products of
/// 1 x B: 15, 14, then 16. Fragments as the PTX ISA lays out m16n8k16 (lane = 4 group +
/// t: A's first register holds row `group`, k = 2t and 2t + 1; B's, k = 2t and 2t + 1 of
/// column `group`; D's four words rows group, group, group + 8, group + 8 and columns 2t,
/// 2t + 1).
/// Kills `collective.rs` `BlockRunner::mma`: the non-finite row marked at `i % kk` or
/// `i * kk` instead of `i / kk` (row 3 would take the finite path and read the infinity
/// as zero, or index past the rows), and the general path's B column gathered at
/// `kv + 8 + n` or `kv / 8 + n` instead of `kv * 8 + n` (column 0 would read a 1.0 at k 5
/// and give +inf).
#[rstest]
fn mma_with_one_infinite_a_element_follows_its_row_and_the_b_column(
    #[values(Checks::ALL, Checks::NONE)] checks: Checks,
) {
    let text = format!(
        "{HEADER}.visible .entry k(.param .u64 p_out)
{{
    .reg .pred %p<3>;
    .reg .b32 %r<2>;
    .reg .b32 %a<4>;
    .reg .b32 %b<2>;
    .reg .b32 %c<4>;
    .reg .b32 %d<4>;
    .reg .b64 %rd<2>;
    mov.u32 %r0, %tid.x;
    setp.eq.u32 %p0, %r0, 14;
    setp.eq.u32 %p1, %r0, 2;
    setp.eq.u32 %p2, %r0, 6;
    selp.b32 %a0, 0x7c003c00, 0x3c003c00, %p0;
    mov.b32 %a1, 0x3c003c00;
    mov.b32 %a2, 0x3c003c00;
    mov.b32 %a3, 0x3c003c00;
    mov.b32 %b0, 0x3c003c00;
    @%p1 mov.b32 %b0, 0x00003c00;
    @%p2 mov.b32 %b0, 0xbc003c00;
    mov.b32 %b1, 0x3c003c00;
    mov.b32 %c0, 0;
    mov.b32 %c1, 0;
    mov.b32 %c2, 0;
    mov.b32 %c3, 0;
    {MMA_F32} {{%d0, %d1, %d2, %d3}}, {{%a0, %a1, %a2, %a3}}, {{%b0, %b1}}, {{%c0, %c1, %c2, %c3}};
    ld.param.u64 %rd0, [p_out];
    mul.wide.u32 %rd1, %r0, 16;
    add.u64 %rd1, %rd0, %rd1;
    st.global.b32 [%rd1], %d0;
    st.global.b32 [%rd1+4], %d1;
    st.global.b32 [%rd1+8], %d2;
    st.global.b32 [%rd1+12], %d3;
    ret;
}}
"
    );
    let got = run(&text, [32, 1, 1], 128, checks).unwrap_or_else(|f| panic!("{f}"));
    for lane in 0..32usize {
        let (group, t) = (lane / 4, lane % 4);
        for (w, &bits) in got[4 * lane..4 * lane + 4].iter().enumerate() {
            let (row, col) = (group + 8 * (w / 2), 2 * t + w % 2);
            let v = f32::from_bits(bits);
            // Under the approx checks a finite sum sits at the edge of the f16 MMA's
            // error bound; without them it is exact.
            let near =
                |want: f32| v == want || (checks == Checks::ALL && (v - want).abs() <= 1e-4 * want);
            let ok = match (row, col) {
                (3, 0) => v.is_nan(),
                (3, 1) => v == f32::NEG_INFINITY,
                (3, _) => v == f32::INFINITY,
                (_, 0) => near(15.0),
                (_, 1) => near(14.0),
                _ => near(16.0),
            };
            assert!(ok, "D[{row}][{col}] = {v} ({bits:#010x})");
        }
    }
}

/// `.func name(.param .u64 p_at, .param .u32 p_lane)`: `%sd0` = p_at and `%s0` = p_lane
/// loaded, then `body` (registers `%s0-3`, `%sd0-1`, `%q0-1`).
fn at_lane_func(name: &str, body: &str) -> String {
    format!(
        ".func {name}(.param .u64 p_at, .param .u32 p_lane)
{{
    .reg .b32 %s<4>;
    .reg .b64 %sd<2>;
    .reg .pred %q<2>;
    ld.param.u64 %sd0, [p_at];
    ld.param.u32 %s0, [p_lane];
{body}}}
"
    )
}

/// A kernel's call of an [`at_lane_func`] with `%rd1` as its address and `%r0` as its
/// lane.
fn call_at_lane(name: &str) -> String {
    format!(
        "    {{
        .param .u64 a_at;
        .param .u32 a_lane;
        st.param.u64 [a_at], %rd1;
        st.param.u32 [a_lane], %r0;
        call.uni {name}, (a_at, a_lane);
    }}
"
    )
}

/// Lanes 0-7 `ret` and lanes 8-15 `exit` in the middle of the kernel; every other lane
/// calls `store`, a `.func` whose lanes with an odd index `ret` early and whose others
/// fall off its end (no `ret`) after storing `1000 + lane`; back in the kernel each lane
/// still running stores `2000 + lane` one word further on, and the kernel itself ends
/// without a `ret`. So words 0-15 keep the sentinel, the odd lanes of 16-31 write only
/// their second word, the even ones both.
/// Kills `run_warp`'s arms for `ret` and `exit` deleted (their lanes would run on) and
/// falling off the end with `done &= group` (the lanes would never finish).
#[test]
fn ret_exit_and_falling_off_the_end_stop_exactly_their_lanes() {
    let text = format!(
        "{HEADER}{func}.visible .entry k(.param .u64 p_out)
{{
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    .reg .pred %p<2>;
    ld.param.u64 %rd0, [p_out];
    mov.u32 %r0, %tid.x;
    setp.lt.u32 %p0, %r0, 8;
    @%p0 ret;
    setp.lt.u32 %p1, %r0, 16;
    @%p1 exit;
    mul.wide.u32 %rd1, %r0, 8;
    add.u64 %rd1, %rd0, %rd1;
{call}    add.u32 %r1, %r0, 2000;
    st.global.u32 [%rd1+4], %r1;
}}
",
        func = at_lane_func(
            "store",
            "    and.b32 %s1, %s0, 1;
    setp.ne.u32 %q0, %s1, 0;
    @%q0 ret;
    add.u32 %s2, %s0, 1000;
    st.global.u32 [%sd0], %s2;
"
        ),
        call = call_at_lane("store"),
    );
    let got = run(&text, [32, 1, 1], 64, Checks::ALL).unwrap_or_else(|f| panic!("{f}"));
    for lane in 0..32u32 {
        let (first, second) = (got[2 * lane as usize], got[2 * lane as usize + 1]);
        let want = match lane {
            0..=15 => (SENTINEL, SENTINEL),
            l if l % 2 == 1 => (SENTINEL, 2000 + l),
            l => (1000 + l, 2000 + l),
        };
        assert_eq!((first, second), want, "lane {lane}");
    }
}

/// A launch's statistics: one warp instruction per issued step of each warp, and one
/// thread instruction per lane that executes it (a lane whose guard is false does not).
/// 40 threads are a warp of 32 and a warp of 8; four instructions each, the guarded add
/// executed by lanes 0-4 only: 8 warp instructions, 3 * 40 + 5 = 125 thread
/// instructions.
/// Kills `run_warp`'s `thread_instructions += exec.count_ones()` with `*=`.
#[test]
fn launch_statistics_count_warp_steps_and_executing_lanes() {
    let text = format!(
        "{HEADER}.visible .entry k(.param .u64 p_out)
{{
    .reg .b32 %r<2>;
    .reg .pred %p<1>;
    mov.u32 %r0, %tid.x;
    setp.lt.u32 %p0, %r0, 5;
    @%p0 add.u32 %r1, %r0, 1;
    ret;
}}
"
    );
    let module = Module::parse("engine.ptx", &text).unwrap_or_else(|e| panic!("{e}"));
    let mem = FlatMemory::new(BASE, 4, false);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [40, 1, 1],
        dynamic_shared: 0,
        programmatic: false,
    };
    let stats = launch(
        &module,
        "k",
        &cfg,
        &[&BASE.to_le_bytes()],
        &mem,
        Checks::ALL,
        1,
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(stats.warp_instructions, 8);
    assert_eq!(stats.thread_instructions, 125);
}

/// Expected words of [`a_guarded_exit_steps_only_its_own_group`] and
/// [`a_guarded_ret_steps_only_its_own_group`]: nothing from lanes 0-3, `1000 + lane` from
/// 4-15, `3000 + lane` from 16-31.
fn check_guarded_leave(got: &[u32]) {
    for (lane, &v) in got.iter().enumerate() {
        let want = match lane as u32 {
            0..=3 => SENTINEL,
            l @ 4..=15 => 1000 + l,
            l => 3000 + l,
        };
        assert_eq!(v, want, "lane {lane}");
    }
}

/// Lanes 16-31 branch ahead to `HIGH` and wait there while lanes 0-15 run a predicated
/// `exit` that lanes 0-3 take: the lanes that skip it step to the next instruction, and
/// the waiting lanes keep their place, so every lane from 4 on stores its word.
/// (cuda-sim runs a kernel's own `ret` as `exit`.)
/// Kills `run_warp`'s `step(pc, group & !exec)` after `exit` as `group | !exec` (the
/// waiting lanes skip their store), `group ^ !exec` and `group & exec` (the lanes that
/// skip it never move on).
#[rstest]
#[case::exit("exit")]
#[case::kernel_ret("ret")]
fn a_guarded_exit_steps_only_its_own_group(#[case] leave: &str) {
    let text = format!(
        "{HEADER}.visible .entry k(.param .u64 p_out)
{{
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    .reg .pred %p<2>;
    ld.param.u64 %rd0, [p_out];
    mov.u32 %r0, %tid.x;
    mul.wide.u32 %rd1, %r0, 4;
    add.u64 %rd1, %rd0, %rd1;
    add.u32 %r2, %r0, 3000;
    setp.ge.u32 %p0, %r0, 16;
    @%p0 bra HIGH;
    setp.lt.u32 %p1, %r0, 4;
    @%p1 {leave};
    add.u32 %r1, %r0, 1000;
    st.global.u32 [%rd1], %r1;
    ret;
HIGH:
    st.global.u32 [%rd1], %r2;
    ret;
}}
"
    );
    check_guarded_leave(&run(&text, [32, 1, 1], 32, Checks::ALL).unwrap_or_else(|f| panic!("{f}")));
}

/// The same inside a called `.func`, where `ret` returns to the caller: lanes 16-31 wait
/// at the function's `HIGH` while lanes 0-3 return early.
/// Kills `run_warp`'s `step(pc, group & !exec)` after a function's `ret` as `group |
/// !exec`, `group ^ !exec` and `group & exec`.
#[test]
fn a_guarded_ret_steps_only_its_own_group() {
    let text = format!(
        "{HEADER}{func}.visible .entry k(.param .u64 p_out)
{{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd0, [p_out];
    mov.u32 %r0, %tid.x;
    mul.wide.u32 %rd1, %r0, 4;
    add.u64 %rd1, %rd0, %rd1;
{call}    ret;
}}
",
        func = at_lane_func(
            "body",
            "    add.u32 %s2, %s0, 3000;
    setp.ge.u32 %q0, %s0, 16;
    @%q0 bra HIGH;
    setp.lt.u32 %q1, %s0, 4;
    @%q1 ret;
    add.u32 %s1, %s0, 1000;
    st.global.u32 [%sd0], %s1;
    ret;
HIGH:
    st.global.u32 [%sd0], %s2;
    ret;
"
        ),
        call = call_at_lane("body"),
    );
    check_guarded_leave(&run(&text, [32, 1, 1], 32, Checks::ALL).unwrap_or_else(|f| panic!("{f}")));
}

/// cuda-sim runs `bar.sync` only in a kernel's own body: reached inside a called `.func`
/// (by the whole warp, converged) it is refused under synccheck as a barrier it cannot
/// order, and without the check the block runs on.
/// Kills `run_warp`'s barrier check `exec != all || depth != 1 || exec != group` with the
/// second `||` as `&&`.
#[test]
fn bar_sync_inside_a_called_function_is_refused_under_synccheck() {
    let text = format!(
        "{HEADER}.func wait()
{{
    bar.sync 0;
    ret;
}}
.visible .entry k(.param .u64 p_out)
{{
    call.uni wait, ();
    ret;
}}
"
    );
    let f = run(&text, [64, 1, 1], 1, Checks::ALL).expect_err("bar.sync in a .func");
    assert_eq!(f.kind, FaultKind::BarrierDivergence, "{f}");
    run(&text, [64, 1, 1], 1, Checks::NONE).unwrap_or_else(|f| panic!("{f}"));
}

/// A block of 40 threads: its second warp has lanes 0-7 only, and a `shfl.sync` with the
/// full member mask there names lanes that do not exist, which is not a missing member
/// (they are not live); every lane gets lane 0's value of its own warp.
/// Kills `run_warp`'s live mask `lanes & !exited` as `lanes | !exited`.
#[test]
fn a_full_member_mask_in_a_partial_warp_names_no_missing_lane() {
    let text = format!(
        "{HEADER}.visible .entry k(.param .u64 p_out)
{{
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd0, [p_out];
    mov.u32 %r0, %tid.x;
    add.u32 %r1, %r0, 500;
    shfl.sync.idx.b32 %r2, %r1, 0, 31, 0xffffffff;
    mul.wide.u32 %rd1, %r0, 4;
    add.u64 %rd1, %rd0, %rd1;
    st.global.u32 [%rd1], %r2;
    ret;
}}
"
    );
    let got = run(&text, [40, 1, 1], 40, Checks::ALL).unwrap_or_else(|f| panic!("{f}"));
    for (t, &v) in got.iter().enumerate() {
        assert_eq!(v, if t < 32 { 500 } else { 532 }, "thread {t}");
    }
}
