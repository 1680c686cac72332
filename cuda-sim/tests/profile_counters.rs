//! The profiler's counters against counts worked out by hand on small kernels.

use cuda_sim::exec::{launch_profiled, LaunchConfig};
use cuda_sim::fault::Checks;
use cuda_sim::mem::FlatMemory;
use cuda_sim::profile::{
    DramTraffic, InstrClass, L2Model, Latencies, LaunchCounters, MemSpace, PathCounts,
    ProfileOptions, SECTOR_BYTES,
};
use cuda_sim::ptx::Module;
use rstest::rstest;

const BASE: u64 = 0x1000_0000;

fn module(text: &str) -> Module {
    let text = format!(".version 8.0\n.target sm_80\n.address_size 64\n{text}");
    Module::parse("k.ptx", &text).unwrap_or_else(|e| panic!("{e}"))
}

/// out[i] = in[i * stride], i = ctaid.x * ntid.x + tid.x: 15 instructions per warp.
const COPY: &str = r#"
.visible .entry copy(.param .u64 p_in, .param .u64 p_out, .param .u32 p_stride)
{
    .reg .b32 %r<8>;
    .reg .f32 %f<2>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd0, [p_in];
    ld.param.u64 %rd1, [p_out];
    ld.param.u32 %r0, [p_stride];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mad.lo.u32 %r4, %r2, %r3, %r1;
    mul.lo.u32 %r5, %r4, %r0;
    mul.wide.u32 %rd2, %r5, 4;
    add.u64 %rd2, %rd0, %rd2;
    ld.global.f32 %f0, [%rd2];
    mul.wide.u32 %rd3, %r4, 4;
    add.u64 %rd3, %rd1, %rd3;
    st.global.f32 [%rd3], %f0;
    ret;
}
"#;

struct Copy {
    m: Module,
    mem: FlatMemory,
    n: u64,
    stride: u32,
}

impl Copy {
    /// `n` threads in blocks of 128 reading every `stride`-th float.
    fn new(n: u64, stride: u32) -> Copy {
        let bytes = (n * stride as u64 + n) * 4;
        let mem = FlatMemory::new(BASE, bytes as usize, true);
        let data: Vec<u8> = (0..n * stride as u64)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect();
        mem.write(BASE, &data);
        Copy {
            m: module(COPY),
            mem,
            n,
            stride,
        }
    }

    fn out(&self) -> u64 {
        BASE + self.n * self.stride as u64 * 4
    }

    fn run(&self, threads: usize, opts: &ProfileOptions) -> LaunchCounters {
        let (a, b, s) = (
            BASE.to_le_bytes(),
            self.out().to_le_bytes(),
            self.stride.to_le_bytes(),
        );
        let cfg = LaunchConfig {
            grid: [(self.n / 128) as u32, 1, 1],
            block: [128, 1, 1],
            dynamic_shared: 0,
            programmatic: false,
        };
        launch_profiled(
            &self.m,
            "copy",
            &cfg,
            &[&a, &b, &s],
            &self.mem,
            Checks::ALL,
            threads,
            opts,
        )
        .unwrap_or_else(|e| panic!("{e:?}"))
        .1
    }
}

#[rstest]
// A coalesced copy of N floats touches N/8 sectors and N*4/128 lines.
#[case::coalesced(1, 256 / 8, 256 * 4 / 128)]
// Lanes 32 words apart each touch a sector and a line of their own.
#[case::stride_32(32, 256, 256)]
// Lanes 2 words apart: a warp spans 256 bytes, 8 sectors and 2 lines.
#[case::stride_2(2, 256 * 8 / 32, 256 * 8 / 128)]
fn global_loads_count_sectors_and_lines(
    #[case] stride: u32,
    #[case] sectors: u64,
    #[case] lines: u64,
) {
    let n = 256;
    let c = Copy::new(n, stride).run(2, &ProfileOptions::default());
    assert_eq!(c.global_load.requests, n / 32);
    assert_eq!(c.global_load.sectors, sectors);
    assert_eq!(c.global_load.lines, lines);
    // The stores are coalesced whatever the stride.
    assert_eq!(c.global_store.requests, n / 32);
    assert_eq!(c.global_store.sectors, n / 8);
    assert_eq!(c.global_store.lines, n * 4 / 128);
    assert_eq!(c.unique_read_sectors, sectors);
    assert_eq!(c.unique_write_sectors, n / 8);
}

#[test]
fn instruction_classes_of_the_copy_kernel() {
    let c = Copy::new(256, 1).run(1, &ProfileOptions::default());
    let warps = 8;
    let ld = |space, width| InstrClass::Load { space, width };
    let st = |space, width| InstrClass::Store { space, width };
    let want = [
        (ld(MemSpace::Param, 8), 2 * warps),
        (ld(MemSpace::Param, 4), warps),
        (InstrClass::Move, 3 * warps),
        (InstrClass::IntMul, 4 * warps),
        (InstrClass::IntAlu, 2 * warps),
        (ld(MemSpace::Global, 4), warps),
        (st(MemSpace::Global, 4), warps),
        (InstrClass::Control, warps),
    ];
    let got: Vec<(InstrClass, u64)> = c.classes.nonzero().collect();
    let mut want_sorted = want.to_vec();
    want_sorted.sort_by_key(|(c, _)| c.index());
    assert_eq!(got, want_sorted);
    assert_eq!(c.warp_instructions, 15 * warps);
    assert_eq!(c.classes.total(), c.warp_instructions);
    assert_eq!(c.thread_instructions, 15 * 256);
    assert_eq!(c.lane_utilisation(), 1.0);
    assert_eq!((c.grid, c.block, c.blocks), ([2, 1, 1], [128, 1, 1], 2));
}

#[test]
fn critical_path_of_the_copy_kernel() {
    // Worked by hand: the chain mov ntid -> mad -> mul -> mul.wide -> add -> ld.global
    // -> st -> ret, after six back-to-back issues: 7 issue cycles, 5 ALU results and one
    // global load.
    let lat = Latencies::default();
    let c = Copy::new(256, 1).run(
        1,
        &ProfileOptions {
            latencies: lat,
            sample_blocks: None,
            stall_lines: false,
        },
    );
    let path = PathCounts {
        issue: 7,
        alu: 5,
        special: 0,
        shared: 0,
        global: 1,
    };
    assert_eq!(c.critical_path, path);
    assert_eq!(c.critical_path_cycles, 7 + 5 * lat.alu + lat.global);
    assert_eq!(path.cycles(&lat), c.critical_path_cycles);
}

#[test]
fn dram_traffic_through_the_l2_model() {
    let copy = Copy::new(256, 1);
    let opts = ProfileOptions::default();
    let first = DramTraffic {
        read_sectors: 32,
        write_sectors: 32,
    };
    let mut l2 = L2Model::new(1 << 20);
    assert_eq!(copy.run(1, &opts).apply_l2(&mut l2), first);
    // The same read again is L2-resident, and the output is still dirty there.
    assert_eq!(copy.run(1, &opts).apply_l2(&mut l2), DramTraffic::default());
    l2.reset();
    assert_eq!(copy.run(1, &opts).apply_l2(&mut l2), first);
    // A 16-sector L2 cannot hold the 64-sector footprint: each launch misses again.
    let mut tiny = L2Model::new(16 * SECTOR_BYTES);
    assert_eq!(copy.run(1, &opts).apply_l2(&mut tiny), first);
    assert_eq!(copy.run(1, &opts).apply_l2(&mut tiny), first);
    // Applying twice does not count twice.
    let mut c = copy.run(1, &opts);
    let d = c.apply_l2(&mut l2);
    assert_eq!(c.apply_l2(&mut l2), d);
    assert_eq!(c.dram, Some(d));
}

/// Thread i stores word i*stride of a 4 KiB shared array, then loads it back.
const BANKS: &str = r#"
.shared .align 4 .b8 smem[4096];
.visible .entry banks(.param .u32 p_stride)
{
    .reg .b32 %r<8>;
    ld.param.u32 %r0, [p_stride];
    mov.u32 %r1, %tid.x;
    mul.lo.u32 %r2, %r1, %r0;
    shl.b32 %r2, %r2, 2;
    mov.u32 %r4, smem;
    add.u32 %r2, %r2, %r4;
    st.shared.u32 [%r2], %r1;
    ld.shared.u32 %r3, [%r2];
    ret;
}
"#;

#[rstest]
#[case::conflict_free(1, 1)]
#[case::broadcast(0, 1)]
#[case::two_way(2, 2)]
#[case::thirty_two_way(32, 32)]
#[case::odd_stride_is_conflict_free(31, 1)]
fn shared_wavefronts_by_stride(#[case] stride: u32, #[case] wavefronts: u64) {
    let m = module(BANKS);
    let mem = FlatMemory::new(BASE, 16, false);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        dynamic_shared: 0,
        programmatic: false,
    };
    let s = stride.to_le_bytes();
    let (_, c) = launch_profiled(
        &m,
        "banks",
        &cfg,
        &[&s],
        &mem,
        Checks::ALL,
        1,
        &ProfileOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(c.shared_load.requests, 1);
    assert_eq!(c.shared_store.requests, 1);
    assert_eq!(c.shared_load.wavefronts, wavefronts);
    assert_eq!(c.shared_store.wavefronts, wavefronts);
    assert_eq!(c.static_shared, 4096);
}

fn run_plain(text: &str, kernel: &str, grid: u32, block: u32) -> LaunchCounters {
    let m = module(text);
    let mem = FlatMemory::new(BASE, 16, false);
    let cfg = LaunchConfig {
        grid: [grid, 1, 1],
        block: [block, 1, 1],
        dynamic_shared: 0,
        programmatic: false,
    };
    launch_profiled(
        &m,
        kernel,
        &cfg,
        &[],
        &mem,
        Checks::ALL,
        2,
        &ProfileOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e:?}"))
    .1
}

#[test]
fn lane_utilisation_of_a_divergent_branch() {
    // Lanes 0..8 take the branch (1 instruction), lanes 8..32 run 3: thread
    // instructions 32 + 32 + 8 (the guarded bra counts its taking lanes) + 3 * 24 + 8 +
    // 32 = 184 over 8 warp instructions.
    let text = r#"
.visible .entry div()
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    mov.u32 %r0, %tid.x;
    setp.lt.u32 %p0, %r0, 8;
    @%p0 bra TAKEN;
    add.u32 %r1, %r0, 1;
    add.u32 %r1, %r1, 1;
    bra END;
TAKEN:
    add.u32 %r1, %r0, 2;
END:
    ret;
}
"#;
    let c = run_plain(text, "div", 1, 32);
    assert_eq!(c.warp_instructions, 8);
    assert_eq!(c.thread_instructions, 184);
    assert_eq!(c.lane_utilisation(), 184.0 / 256.0);
}

#[test]
fn barriers_count_per_warp() {
    let text = r#"
.visible .entry bars()
{
    bar.sync 0;
    bar.sync 0;
    ret;
}
"#;
    // 2 blocks of 4 warps, 2 barriers each.
    let c = run_plain(text, "bars", 2, 128);
    assert_eq!(c.barriers, 16);
    assert_eq!(c.classes.get(InstrClass::Control), 24);
}

#[test]
fn counters_do_not_depend_on_host_threads() {
    let copy = Copy::new(128 * 64, 3);
    let opts = ProfileOptions::default();
    let one = copy.run(1, &opts);
    let four = copy.run(4, &opts);
    assert_eq!(one, four);
    let (mut a, mut b) = (one, four);
    assert_eq!(
        a.apply_l2(&mut L2Model::new(1 << 16)),
        b.apply_l2(&mut L2Model::new(1 << 16))
    );
}

#[test]
fn critical_stalls_of_the_copy_kernel_by_line() {
    // The copy kernel's lines in the module text (three header lines, then COPY, which
    // starts with an empty line): 10-12 ld.param, 13-15 mov, 16 mad, 17 mul, 18 mul.wide,
    // 19 add, 20 ld.global, 21 mul.wide, 22 add, 23 st.global, 24 ret. Each gets one
    // issue cycle plus its wait, worked by hand as in `critical_path_of_the_copy_kernel`:
    // the mad waits for ntid (issued at 6, ready at 10), each next link of the address
    // chain 4 cycles, the store for the load (issued at 26, ready at 626).
    let lat = Latencies::default();
    let opts = ProfileOptions {
        latencies: lat,
        stall_lines: true,
        ..Default::default()
    };
    let c = Copy::new(256, 1).run(2, &opts);
    let want = vec![
        (10, 1),
        (11, 1),
        (12, 1),
        (13, 1),
        (14, 1),
        (15, 1),
        (16, 4),
        (17, 4),
        (18, 4),
        (19, 4),
        (20, 4),
        (21, 1),
        (22, 4),
        (23, 626 - 31),
        (24, 1),
    ];
    assert_eq!(c.critical_stalls, want);
    let total: u64 = c.critical_stalls.iter().map(|&(_, n)| n).sum();
    assert_eq!(total, c.critical_path_cycles);
    let off = Copy::new(256, 1).run(2, &ProfileOptions::default());
    assert!(off.critical_stalls.is_empty());
}

/// Warp 1 loads a word (line 14) and waits for it (line 15) before `bar.sync` (line 17);
/// warp 0 skips the load, waits at the barrier, then does two dependent adds and so ends
/// last.
const BARRIER_WAIT: &str = r#"
.visible .entry bar_wait(.param .u64 p)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<2>;
    .reg .pred %p<2>;
    ld.param.u64 %rd0, [p];
    mov.u32 %r0, %tid.x;
    setp.lt.u32 %p0, %r0, 32;
    @%p0 bra SKIP;
    ld.global.u32 %r1, [%rd0];
    add.u32 %r2, %r1, 1;
SKIP:
    bar.sync 0;
    @!%p0 bra DONE;
    add.u32 %r3, %r0, 1;
    add.u32 %r3, %r3, 1;
DONE:
    ret;
}
"#;

#[test]
fn a_barrier_passes_the_latest_arrivals_lines_to_the_warps_it_releases() {
    let m = module(BARRIER_WAIT);
    let mem = FlatMemory::new(BASE, 64, true);
    mem.write(BASE, &[0; 64]);
    let lat = Latencies::default();
    let arg = BASE.to_le_bytes();
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [64, 1, 1],
        dynamic_shared: 0,
        programmatic: false,
    };
    let opts = ProfileOptions {
        latencies: lat,
        stall_lines: true,
        ..Default::default()
    };
    let (_, c) = launch_profiled(
        &m,
        "bar_wait",
        &cfg,
        &[&arg],
        &mem,
        Checks::default(),
        1,
        &opts,
    )
    .unwrap();
    // Warp 1 issues the load at 11 and waits for it: its add issues at 11 + global, its
    // bar.sync one cycle later, which releases warp 0 at 612. The critical path runs
    // through warp 1's load, so warp 0 (which ends last: the guarded bra at 613, the adds
    // at 614 and 618, ret at 619) carries warp 1's lines up to the barrier, not a wait
    // charged to its own bar.sync.
    let at = |line: u32| {
        c.critical_stalls
            .iter()
            .find(|&&(l, _)| l == line)
            .map(|&(_, n)| n)
    };
    assert_eq!(at(14), Some(1));
    assert_eq!(at(15), Some(lat.global));
    assert_eq!(at(17), Some(1));
    assert_eq!(c.critical_path_cycles, 619 - 600 + lat.global);
    let total: u64 = c.critical_stalls.iter().map(|&(_, n)| n).sum();
    assert_eq!(total, c.critical_path_cycles);
}

#[test]
fn sampling_scales_a_uniform_kernel() {
    let copy = Copy::new(128 * 64, 1);
    let full = copy.run(2, &ProfileOptions::default());
    let sampled = copy.run(
        2,
        &ProfileOptions {
            sample_blocks: Some(8),
            ..Default::default()
        },
    );
    assert_eq!(sampled.blocks, 64);
    assert_eq!(sampled.blocks_interpreted, 8);
    assert!(sampled.sampled() && !full.sampled());
    assert_eq!(sampled.warp_instructions, full.warp_instructions);
    assert_eq!(sampled.thread_instructions, full.thread_instructions);
    assert_eq!(sampled.classes, full.classes);
    assert_eq!(sampled.global_load, full.global_load);
    assert_eq!(sampled.global_store, full.global_store);
    assert_eq!(sampled.unique_read_sectors, full.unique_read_sectors);
    assert_eq!(sampled.critical_path, full.critical_path);
    let (mut s, mut f) = (sampled, full);
    assert_eq!(
        s.apply_l2(&mut L2Model::new(1 << 20)),
        f.apply_l2(&mut L2Model::new(1 << 20))
    );
}

/// out[i] = in[tid.x mod 32]: every warp of a block reads the same 32 floats.
const SHARED_READ: &str = r#"
.visible .entry same(.param .u64 p_in, .param .u64 p_out)
{
    .reg .b32 %r<8>;
    .reg .f32 %f<2>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd0, [p_in];
    ld.param.u64 %rd1, [p_out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mad.lo.u32 %r4, %r2, %r3, %r1;
    and.b32 %r5, %r1, 31;
    mul.wide.u32 %rd2, %r5, 4;
    add.u64 %rd2, %rd0, %rd2;
    ld.global.f32 %f0, [%rd2];
    mul.wide.u32 %rd3, %r4, 4;
    add.u64 %rd3, %rd1, %rd3;
    st.global.f32 [%rd3], %f0;
    ret;
}
"#;

/// L1 keeps what a block read: 4 blocks of 4 warps reading the same 4 sectors send 4
/// read sectors per block to L2 (not 4 per warp), and every store sector.
#[test]
fn l2_sees_each_blocks_reads_once_and_every_store() {
    let m = module(SHARED_READ);
    let (blocks, threads) = (4u64, 128u64);
    let mem = FlatMemory::new(BASE, (32 + blocks * threads) as usize * 4, true);
    mem.write(BASE, &[0u8; 128]);
    let (a, b) = (BASE.to_le_bytes(), (BASE + 128).to_le_bytes());
    let cfg = LaunchConfig {
        grid: [blocks as u32, 1, 1],
        block: [threads as u32, 1, 1],
        dynamic_shared: 0,
        programmatic: false,
    };
    for host_threads in [1, 3] {
        let c = launch_profiled(
            &m,
            "same",
            &cfg,
            &[&a, &b],
            &mem,
            Checks::ALL,
            host_threads,
            &ProfileOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{e:?}"))
        .1;
        let warps = blocks * threads / 32;
        assert_eq!(c.global_load.sectors, warps * 4);
        assert_eq!(c.unique_read_sectors, 4);
        let store_sectors = blocks * threads / 8;
        assert_eq!(c.global_store.sectors, store_sectors);
        assert_eq!(
            c.l2_sectors,
            blocks * 4 + store_sectors,
            "{host_threads} threads"
        );
    }
}
