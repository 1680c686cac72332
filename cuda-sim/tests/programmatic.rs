//! Programmatic dependent launch (sm_90): `griddepcontrol.wait` and
//! `.launch_dependents`, the launch attribute through the driver and graphs, the check
//! that nothing touches global memory before the wait, and the profile's split of the
//! critical path at the wait.

use cuda_sim::driver::{CaptureMode, Driver, ProfileConfig, SimConfig};
use cuda_sim::exec::{launch, launch_profiled, LaunchConfig, LaunchError};
use cuda_sim::fault::{Checks, FaultKind};
use cuda_sim::mem::FlatMemory;
use cuda_sim::profile::{PathCounts, ProfileOptions};
use cuda_sim::ptx::Module;
use cuda_sim::ErrorCode;

const BASE: u64 = 0x1000;

/// `out[tid] = in[tid] + 1`, with the wait (and the trigger) placed by `before`: the
/// lines that come before the load.
fn kernel(target: &str, before: &str, after: &str) -> String {
    format!(
        "
.version 8.0
.target {target}
.address_size 64
.visible .entry k(.param .u64 p_in, .param .u64 p_out)
{{
    .reg .b32 %r<4>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd0, [p_in];
    ld.param.u64 %rd1, [p_out];
    mov.u32 %r0, %tid.x;
    mul.wide.u32 %rd2, %r0, 4;
    add.u64 %rd3, %rd0, %rd2;
    add.u64 %rd4, %rd1, %rd2;
    prefetch.global.L1 [%rd3];
{before}
    ld.global.u32 %r1, [%rd3];
{after}
    add.u32 %r1, %r1, 1;
    st.global.u32 [%rd4], %r1;
    ret;
}}
"
    )
}

const WAIT: &str = "    griddepcontrol.wait;\n    griddepcontrol.launch_dependents;";

fn cfg(programmatic: bool) -> LaunchConfig {
    LaunchConfig {
        grid: [1, 1, 1],
        block: [128, 1, 1],
        dynamic_shared: 0,
        programmatic,
    }
}

fn memory() -> FlatMemory {
    let mem = FlatMemory::new(BASE, 1024, true);
    let input: Vec<u8> = (0..128u32).flat_map(|i| (i * 3).to_le_bytes()).collect();
    mem.write(BASE, &input);
    mem
}

fn run(ptx: &str, programmatic: bool) -> Result<Vec<u32>, LaunchError> {
    let m = Module::parse("pdl.ptx", ptx).unwrap();
    let mem = memory();
    let (a, b) = (BASE.to_le_bytes(), (BASE + 512).to_le_bytes());
    launch(&m, "k", &cfg(programmatic), &[&a, &b], &mem, Checks::ALL, 1)?;
    let mut out = vec![0u8; 512];
    mem.read(BASE + 512, &mut out);
    Ok(out
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect())
}

#[test]
fn griddepcontrol_needs_an_sm_90_target() {
    let e = Module::parse("pdl.ptx", &kernel("sm_80", WAIT, "")).unwrap_err();
    assert!(
        e.to_string()
            .contains("griddepcontrol requires .target sm_90"),
        "{e}"
    );
    Module::parse("pdl.ptx", &kernel("sm_90", WAIT, "")).unwrap();
    let e = Module::parse("pdl.ptx", &kernel("sm_90", "    griddepcontrol.go;", "")).unwrap_err();
    assert!(e.to_string().contains("griddepcontrol"), "{e}");
}

#[test]
fn the_wait_changes_no_result() {
    let want: Vec<u32> = (0..128).map(|i| i * 3 + 1).collect();
    assert_eq!(run(&kernel("sm_90", WAIT, ""), true).unwrap(), want);
    assert_eq!(run(&kernel("sm_90", WAIT, ""), false).unwrap(), want);
    assert_eq!(run(&kernel("sm_90", "", ""), false).unwrap(), want);
}

#[test]
fn a_global_access_before_the_wait_is_a_race_in_a_programmatic_launch() {
    // The load comes before the wait: a race only when the grid may overlap the one
    // before it.
    let late = kernel("sm_90", "", WAIT);
    assert!(run(&late, false).is_ok());
    match run(&late, true) {
        Err(LaunchError::Fault(f)) => {
            assert_eq!(f.kind, FaultKind::DependencyRace);
            assert_eq!(f.kind.check_name(), "racecheck");
            assert_eq!(f.instruction, "ld.global.u32 %r1, [%rd3];");
        }
        other => panic!("{other:?}"),
    }
    // A kernel without the wait may not be launched programmatically at all.
    assert!(matches!(
        run(&kernel("sm_90", "", ""), true),
        Err(LaunchError::Fault(f)) if f.kind == FaultKind::DependencyRace
    ));
}

#[test]
fn the_profile_splits_the_critical_path_at_the_wait() {
    // Two dependent global loads after the wait, none before it.
    let ptx = kernel(
        "sm_90",
        WAIT,
        "    mul.wide.u32 %rd5, %r1, 0;\n    add.u64 %rd5, %rd3, %rd5;\n    ld.global.u32 %r1, [%rd5];",
    );
    let m = Module::parse("pdl.ptx", &ptx).unwrap();
    let mem = memory();
    let (a, b) = (BASE.to_le_bytes(), (BASE + 512).to_le_bytes());
    let opts = ProfileOptions {
        stall_lines: true,
        ..ProfileOptions::default()
    };
    let (_, c) =
        launch_profiled(&m, "k", &cfg(true), &[&a, &b], &mem, Checks::ALL, 1, &opts).unwrap();
    // The critical warp's cycles by line add up to the path (the jump of its clock at the
    // wait is not charged to the wait's line).
    let by_line: u64 = c.critical_stalls.iter().map(|&(_, n)| n).sum();
    assert_eq!(by_line, c.critical_path_cycles, "{:?}", c.critical_stalls);
    let post = c.post_wait_path.expect("the kernel waits");
    assert_eq!(post.global, 2, "{post:?}");
    assert_eq!(c.critical_path.global, 2);
    // The path before the wait: the parameter loads and the address arithmetic.
    let pre = PathCounts {
        issue: c.critical_path.issue - post.issue,
        alu: c.critical_path.alu - post.alu,
        ..Default::default()
    };
    assert!(pre.alu >= 2 && pre.issue >= 2, "{pre:?}");
    assert_eq!(
        c.critical_path_cycles,
        c.critical_path.cycles(&opts.latencies),
        "the two parts add up"
    );
    // Without the wait there is one path, no split.
    let plain = Module::parse("pdl.ptx", &kernel("sm_90", "", "")).unwrap();
    let (_, c) = launch_profiled(
        &plain,
        "k",
        &cfg(false),
        &[&a, &b],
        &mem,
        Checks::ALL,
        1,
        &opts,
    )
    .unwrap();
    assert_eq!(c.post_wait_path, None);
}

fn driver(arch: (i32, i32)) -> std::sync::Arc<Driver> {
    Driver::new(SimConfig {
        devices: 1,
        memory_per_device: 1 << 20,
        compute_capability: arch,
        ..SimConfig::default()
    })
}

#[test]
fn the_driver_refuses_sm_90_code_and_programmatic_launches_on_sm_80() {
    let drv = driver((8, 0));
    let e = drv
        .module_load(0, "pdl.ptx", &kernel("sm_90", WAIT, ""))
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidPtx);
    assert!(e.detail.contains("newer than the device"), "{}", e.detail);
    let m = drv
        .module_load(0, "plain.ptx", &kernel("sm_80", "", ""))
        .unwrap();
    let f = drv.module_function(m, "k").unwrap();
    let s = drv.stream_create(0, true).unwrap();
    let p = drv.mem_alloc(0, 1024).unwrap();
    let (a, b) = (p.to_le_bytes(), (p + 512).to_le_bytes());
    let e = drv
        .launch_ex(f, [2, 1, 1], [64, 1, 1], 0, s, &[&a, &b], true)
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NotSupported);
}

#[test]
fn programmatic_launches_are_profiled_as_such_and_keep_the_flag_in_a_graph() {
    let drv = driver((9, 0));
    assert_eq!(
        drv.device_name(0).unwrap(),
        "cuda-sim GPU 0 (emulated sm_90)"
    );
    let good = drv
        .module_load(0, "pdl.ptx", &kernel("sm_90", WAIT, ""))
        .unwrap();
    let good = drv.module_function(good, "k").unwrap();
    let s = drv.stream_create(0, false).unwrap();
    let p = drv.mem_alloc(0, 1024).unwrap();
    let input: Vec<u8> = (0..128u32).flat_map(|i| (i * 3).to_le_bytes()).collect();
    drv.memcpy_htod(p, &input).unwrap();
    let (a, b) = (p.to_le_bytes(), (p + 512).to_le_bytes());
    drv.enable_profiling(ProfileConfig::new(cuda_sim::cost::GpuSpec::h200()));
    for programmatic in [false, true] {
        drv.launch_ex(good, [1, 1, 1], [128, 1, 1], 0, s, &[&a, &b], programmatic)
            .unwrap();
    }
    drv.stream_synchronize(s).unwrap();
    let records = drv.take_launch_records();
    drv.disable_profiling();
    let flags: Vec<bool> = records.iter().map(|r| r.programmatic).collect();
    assert_eq!(flags, [false, true]);
    assert!(records.iter().all(|r| r.counters.post_wait_path.is_some()));
    let mut out = vec![0u8; 512];
    drv.memcpy_dtoh(&mut out, p + 512).unwrap();
    assert_eq!(&out[4..8], &4u32.to_le_bytes());

    // Captured, the flag stays with the node: replayed, the load before the wait faults.
    let late = drv
        .module_load(0, "late.ptx", &kernel("sm_90", "", WAIT))
        .unwrap();
    let late = drv.module_function(late, "k").unwrap();
    drv.stream_begin_capture(s, CaptureMode::ThreadLocal)
        .unwrap();
    drv.launch_ex(late, [1, 1, 1], [128, 1, 1], 0, s, &[&a, &b], true)
        .unwrap();
    let g = drv.stream_end_capture(s).unwrap();
    let e = drv.graph_instantiate(g).unwrap();
    drv.graph_launch(e, s).unwrap();
    let err = drv.stream_synchronize(s).unwrap_err();
    assert!(err.detail.contains("griddepcontrol.wait"), "{}", err.detail);
}

#[test]
fn for_arch_retargets_for_sm_90_and_drops_the_wait_below() {
    let text = kernel("sm_80", WAIT, "");
    let on_90 = cuda_sim::ptx::for_arch(&text, 90);
    assert!(on_90.contains(".target sm_90") && on_90.contains("    griddepcontrol.wait;"));
    Module::parse("pdl.ptx", &on_90).unwrap();
    let on_80 = cuda_sim::ptx::for_arch(&text, 80);
    assert_eq!(on_80.lines().count(), text.lines().count());
    assert!(on_80.contains("// (sm_90 only)     griddepcontrol.wait;"));
    let m = Module::parse("pdl.ptx", &on_80).unwrap();
    assert_eq!(m.target_sm(), 80);
    // A module without the instructions is left as it is below sm_90.
    let plain = kernel("sm_80", "", "");
    assert!(matches!(
        cuda_sim::ptx::for_arch(&plain, 80),
        std::borrow::Cow::Borrowed(_)
    ));
}
