//! Modules and kernel launches through the emulated driver: loading, launch checks,
//! kernels in stream order, and faults that poison the context (sticky errors).
//!
//! These need cuda-sim's PTX parser and interpreter.

use std::sync::Arc;

use cuda_sim::driver::{Driver, FunctionHandle, ModuleHandle, SimConfig, StreamHandle};
use cuda_sim::{Checks, ErrorCode, FaultKind};

const PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64

// out[i] = 2 i + 1 for i < n
.visible .entry fill_index(
	.param .u64 fill_index_param_0,
	.param .u32 fill_index_param_1
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [fill_index_param_0];
	ld.param.u32 	%r2, [fill_index_param_1];
	mov.u32 	%r3, %ctaid.x;
	mov.u32 	%r4, %ntid.x;
	mov.u32 	%r5, %tid.x;
	mad.lo.s32 	%r1, %r3, %r4, %r5;
	setp.ge.u32 	%p1, %r1, %r2;
	@%p1 bra 	$L__BB0_2;
	cvta.to.global.u64 	%rd2, %rd1;
	mul.wide.u32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd2, %rd3;
	shl.b32 	%r6, %r1, 1;
	add.s32 	%r7, %r6, 1;
	st.global.u32 	[%rd4], %r7;
$L__BB0_2:
	ret;
}

// dst[i] = src[i] + 1 for i < n
.visible .entry add_one(
	.param .u64 add_one_param_0,
	.param .u64 add_one_param_1,
	.param .u32 add_one_param_2
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<8>;

	ld.param.u64 	%rd1, [add_one_param_0];
	ld.param.u64 	%rd2, [add_one_param_1];
	ld.param.u32 	%r2, [add_one_param_2];
	mov.u32 	%r3, %ctaid.x;
	mov.u32 	%r4, %ntid.x;
	mov.u32 	%r5, %tid.x;
	mad.lo.s32 	%r1, %r3, %r4, %r5;
	setp.ge.u32 	%p1, %r1, %r2;
	@%p1 bra 	$L__BB1_2;
	cvta.to.global.u64 	%rd3, %rd1;
	cvta.to.global.u64 	%rd4, %rd2;
	mul.wide.u32 	%rd5, %r1, 4;
	add.s64 	%rd6, %rd3, %rd5;
	ld.global.u32 	%r6, [%rd6];
	add.s32 	%r7, %r6, 1;
	add.s64 	%rd7, %rd4, %rd5;
	st.global.u32 	[%rd7], %r7;
$L__BB1_2:
	ret;
}

// out[tid + offset] = tid: out of bounds for a large offset
.visible .entry store_at(
	.param .u64 store_at_param_0,
	.param .u32 store_at_param_1
)
{
	.reg .b32 	%r<4>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [store_at_param_0];
	ld.param.u32 	%r1, [store_at_param_1];
	mov.u32 	%r2, %tid.x;
	add.s32 	%r3, %r2, %r1;
	cvta.to.global.u64 	%rd2, %rd1;
	mul.wide.u32 	%rd3, %r3, 4;
	add.s64 	%rd4, %rd2, %rd3;
	st.global.u32 	[%rd4], %r2;
	ret;
}
"#;

struct Kernels {
    module: ModuleHandle,
    fill_index: FunctionHandle,
    add_one: FunctionHandle,
    store_at: FunctionHandle,
}

fn driver_with(checks: Checks) -> Arc<Driver> {
    Driver::new(SimConfig {
        memory_per_device: 1 << 30,
        checks,
        exec_threads: 2,
        ..SimConfig::default()
    })
}

fn driver() -> Arc<Driver> {
    driver_with(Checks::ALL)
}

fn load(drv: &Driver, dev: usize) -> Kernels {
    let module = drv
        .module_load(dev, "test_kernels.ptx", PTX)
        .unwrap_or_else(|e| panic!("the test PTX does not load: {e}"));
    let f = |name| drv.module_function(module, name).unwrap();
    Kernels {
        module,
        fill_index: f("fill_index"),
        add_one: f("add_one"),
        store_at: f("store_at"),
    }
}

fn u64_arg(v: u64) -> [u8; 8] {
    v.to_le_bytes()
}

fn u32_arg(v: u32) -> [u8; 4] {
    v.to_le_bytes()
}

fn fill(drv: &Driver, k: &Kernels, out: u64, n: u32, s: StreamHandle) {
    drv.launch(
        k.fill_index,
        [n.div_ceil(128), 1, 1],
        [128, 1, 1],
        0,
        s,
        &[&u64_arg(out), &u32_arg(n)],
    )
    .unwrap();
}

fn add_one(drv: &Driver, k: &Kernels, src: u64, dst: u64, n: u32, s: StreamHandle) {
    drv.launch(
        k.add_one,
        [n.div_ceil(128), 1, 1],
        [128, 1, 1],
        0,
        s,
        &[&u64_arg(src), &u64_arg(dst), &u32_arg(n)],
    )
    .unwrap();
}

fn read_u32(drv: &Driver, src: u64, n: usize) -> Vec<u32> {
    let mut out = vec![0u8; n * 4];
    drv.memcpy_dtoh(&mut out, src).unwrap();
    out.chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn bad_ptx_is_invalid_ptx() {
    let drv = driver();
    let e = drv
        .module_load(0, "bad.ptx", "this is not PTX\n")
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidPtx);
    assert!(e.detail.contains("bad.ptx"), "{e}");
    assert_eq!(
        drv.module_load(4, "x.ptx", PTX).unwrap_err().code,
        ErrorCode::InvalidDevice
    );
    assert!(drv.context_error(0).is_none());
}

#[test]
fn modules_and_functions() {
    let drv = driver();
    let k = load(&drv, 0);
    assert_eq!(
        drv.module_function(k.module, "fill_index").unwrap(),
        k.fill_index
    );
    let missing = drv.module_function(k.module, "nope").unwrap_err();
    assert_eq!(missing.code, ErrorCode::NotFound);
    let params = drv.function_params(k.add_one).unwrap();
    assert_eq!(params.iter().map(|p| p.size).collect::<Vec<_>>(), [8, 8, 4]);
    assert_eq!(params[2].name, "add_one_param_2");
    drv.module_unload(k.module).unwrap();
    assert_eq!(
        drv.function_params(k.add_one).unwrap_err().code,
        ErrorCode::InvalidHandle
    );
    assert_eq!(
        drv.module_unload(k.module).unwrap_err().code,
        ErrorCode::InvalidHandle
    );
    assert_eq!(
        drv.module_function(k.module, "fill_index")
            .unwrap_err()
            .code,
        ErrorCode::InvalidHandle
    );
}

#[test]
fn invalid_launches_fail_at_the_call() {
    let drv = driver();
    let k = load(&drv, 0);
    let s = drv.stream_create(0, true).unwrap();
    let s1 = drv.stream_create(1, true).unwrap();
    let out = drv.mem_alloc(0, 4096).unwrap();
    let (p, n) = (u64_arg(out), u32_arg(16));
    let args: &[&[u8]] = &[&p, &n];
    let launch = |grid, block, shared, s, args: &[&[u8]]| {
        drv.launch(k.fill_index, grid, block, shared, s, args)
            .unwrap_err()
            .code
    };
    assert_eq!(
        launch([1, 1, 1], [32, 1, 1], 0, s, &[&p]),
        ErrorCode::InvalidValue
    );
    assert_eq!(
        launch([1, 1, 1], [32, 1, 1], 0, s, &[&p, &p]),
        ErrorCode::InvalidValue
    );
    assert_eq!(
        launch([0, 1, 1], [32, 1, 1], 0, s, args),
        ErrorCode::InvalidValue
    );
    assert_eq!(
        launch([1, 1, 1], [0, 1, 1], 0, s, args),
        ErrorCode::InvalidValue
    );
    assert_eq!(
        launch([1, 1, 1], [64, 32, 1], 0, s, args),
        ErrorCode::InvalidValue
    );
    assert_eq!(
        launch([1, 1, 1], [1, 1, 65], 0, s, args),
        ErrorCode::InvalidValue
    );
    assert_eq!(
        launch([1, 65536, 1], [32, 1, 1], 0, s, args),
        ErrorCode::InvalidValue
    );
    assert_eq!(
        launch([1, 1, 1], [32, 1, 1], (48 << 10) + 1, s, args),
        ErrorCode::InvalidValue
    );
    assert_eq!(
        launch([1, 1, 1], [32, 1, 1], 0, s1, args),
        ErrorCode::InvalidHandle
    );
    assert_eq!(
        launch([1, 1, 1], [32, 1, 1], 0, StreamHandle(12345), args),
        ErrorCode::InvalidHandle
    );
    assert_eq!(
        drv.function_set_max_dynamic_shared(k.fill_index, 228 << 10)
            .unwrap_err()
            .code,
        ErrorCode::InvalidValue
    );
    drv.function_set_max_dynamic_shared(k.fill_index, 100 << 10)
        .unwrap();
    drv.launch(k.fill_index, [1, 1, 1], [32, 1, 1], 100 << 10, s, args)
        .unwrap();
    drv.stream_synchronize(s).unwrap();
    assert!(
        drv.context_error(0).is_none(),
        "invalid launches are not sticky"
    );
    assert_eq!(
        read_u32(&drv, out, 16),
        (0..16).map(|i| 2 * i + 1).collect::<Vec<_>>()
    );
}

#[test]
fn kernels_run_in_stream_order() {
    let drv = driver();
    for dev in 0..2 {
        let k = load(&drv, dev);
        let s = drv.stream_create(dev, true).unwrap();
        let n = 1000u32;
        let a = drv.mem_alloc(dev, n as usize * 4).unwrap();
        let b = drv.mem_alloc(dev, n as usize * 4).unwrap();
        let before = drv.warp_instructions();
        fill(&drv, &k, a, n, s);
        add_one(&drv, &k, a, b, n, s);
        drv.stream_synchronize(s).unwrap();
        assert!(drv.warp_instructions() > before);
        assert_eq!(
            read_u32(&drv, b, n as usize),
            (0..n).map(|i| 2 * i + 2).collect::<Vec<_>>()
        );
    }
}

#[test]
fn kernels_on_two_streams_ordered_by_an_event() {
    let drv = driver();
    let k = load(&drv, 0);
    let p = drv.stream_create(0, true).unwrap();
    let c = drv.stream_create(0, true).unwrap();
    let e = drv.event_create(0).unwrap();
    let n = 512u32;
    for seed in 0..16 {
        drv.set_chaos(Some(seed));
        let a = drv.mem_alloc(0, n as usize * 4).unwrap();
        let b = drv.mem_alloc(0, n as usize * 4).unwrap();
        fill(&drv, &k, a, n, p);
        drv.event_record(e, p).unwrap();
        drv.stream_wait_event(c, e).unwrap();
        add_one(&drv, &k, a, b, n, c);
        drv.stream_synchronize(c).unwrap();
        assert_eq!(
            read_u32(&drv, b, n as usize),
            (0..n).map(|i| 2 * i + 2).collect::<Vec<_>>(),
            "seed {seed}"
        );
        drv.mem_free(a).unwrap();
        drv.mem_free(b).unwrap();
    }
    assert!(drv.fault_reports().is_empty());
}

#[test]
fn an_out_of_bounds_store_poisons_the_context() {
    let drv = driver();
    let k = load(&drv, 0);
    let s = drv.stream_create(0, true).unwrap();
    let small = drv.mem_alloc(0, 16).unwrap();
    let witness = drv.mem_alloc(1, 64).unwrap();
    drv.memcpy_htod(witness, &[1; 64]).unwrap();
    let src = drv.mem_alloc(0, 64).unwrap();
    drv.memset_d8(src, 9, 64).unwrap();
    drv.device_synchronize(0).unwrap();
    drv.device_synchronize(1).unwrap();
    drv.launch(
        k.store_at,
        [1, 1, 1],
        [32, 1, 1],
        0,
        s,
        &[&u64_arg(small), &u32_arg(1000)],
    )
    .unwrap();
    // Queued behind the faulting kernel, so skipped; or refused at the call if the kernel
    // already poisoned the context.
    if let Err(e) = drv.memcpy_peer_async(witness, 1, src, 0, 64, s) {
        assert_eq!(e.code, ErrorCode::IllegalAddress, "{e}");
    }
    let e = drv.stream_synchronize(s).unwrap_err();
    assert_eq!(e.code, ErrorCode::IllegalAddress, "{e}");
    let reports = drv.fault_reports();
    assert_eq!(reports.len(), 1, "{reports:?}");
    let f = &reports[0];
    assert_eq!(f.kind, FaultKind::OutOfBounds);
    assert_eq!(f.kernel, "store_at");
    assert_eq!(f.file, "test_kernels.ptx");
    assert!(f.instruction.contains("st.global.u32"), "{f}");
    assert_eq!(f.address, Some(small + 4000 + 4 * f.thread[0] as u64));
    // Sticky: every later call touching device 0 fails.
    assert_eq!(
        drv.context_error(0).unwrap().code,
        ErrorCode::IllegalAddress
    );
    let mut out = [0u8; 16];
    assert_eq!(
        drv.memcpy_dtoh(&mut out, small).unwrap_err().code,
        ErrorCode::IllegalAddress
    );
    assert_eq!(
        drv.mem_alloc(0, 16).unwrap_err().code,
        ErrorCode::IllegalAddress
    );
    assert_eq!(
        drv.stream_synchronize(s).unwrap_err().code,
        ErrorCode::IllegalAddress
    );
    assert_eq!(
        drv.launch(
            k.fill_index,
            [1, 1, 1],
            [32, 1, 1],
            0,
            s,
            &[&u64_arg(small), &u32_arg(4)]
        )
        .unwrap_err()
        .code,
        ErrorCode::IllegalAddress
    );
    assert_eq!(
        drv.module_load(0, "again.ptx", PTX).unwrap_err().code,
        ErrorCode::IllegalAddress
    );
    // Device 1 is unaffected, and the skipped copy never wrote it.
    assert!(drv.context_error(1).is_none());
    let mut w = [0u8; 64];
    drv.memcpy_dtoh(&mut w, witness).unwrap();
    assert_eq!(w, [1; 64]);
}

#[test]
fn a_kernel_on_freed_memory_is_a_use_after_free() {
    let drv = driver();
    let k = load(&drv, 1);
    let s = drv.stream_create(1, true).unwrap();
    let p = drv.mem_alloc(1, 4096).unwrap();
    drv.mem_free(p).unwrap();
    fill(&drv, &k, p, 64, s);
    assert_eq!(
        drv.stream_synchronize(s).unwrap_err().code,
        ErrorCode::IllegalAddress
    );
    assert_eq!(drv.fault_reports()[0].kind, FaultKind::UseAfterFree);
}

#[test]
fn kernels_reach_peer_memory_only_with_peer_access() {
    for enable in [false, true] {
        let drv = driver();
        let k = load(&drv, 0);
        let s = drv.stream_create(0, true).unwrap();
        let remote = drv.mem_alloc(1, 256).unwrap();
        if enable {
            drv.enable_peer_access(0, 1).unwrap();
        }
        fill(&drv, &k, remote, 64, s);
        let r = drv.stream_synchronize(s);
        if enable {
            r.unwrap();
            assert_eq!(
                read_u32(&drv, remote, 64),
                (0..64).map(|i| 2 * i + 1).collect::<Vec<_>>()
            );
        } else {
            assert_eq!(r.unwrap_err().code, ErrorCode::IllegalAddress);
            assert!(
                drv.context_error(1).is_none(),
                "the faulting kernel's context is poisoned"
            );
        }
    }
}

#[test]
fn uninitialised_reads_fail_initcheck() {
    for checks in [Checks::ALL, Checks::NONE] {
        let drv = driver_with(checks);
        let k = load(&drv, 0);
        let s = drv.stream_create(0, true).unwrap();
        let a = drv.mem_alloc(0, 256).unwrap();
        let b = drv.mem_alloc(0, 256).unwrap();
        add_one(&drv, &k, a, b, 64, s);
        let r = drv.stream_synchronize(s);
        if checks.initcheck {
            assert_eq!(r.unwrap_err().code, ErrorCode::LaunchFailed);
            assert_eq!(drv.fault_reports()[0].kind, FaultKind::UninitializedRead);
        } else {
            r.unwrap();
            assert_eq!(read_u32(&drv, b, 64), vec![1; 64]);
        }
    }
}

/// Without interpretation launches are checked, ordered and counted, and write nothing;
/// copies still run.
#[test]
fn without_interpretation_launches_are_checked_and_counted_only() {
    let drv = Driver::new(SimConfig {
        memory_per_device: 1 << 30,
        exec_threads: 2,
        interpret: false,
        ..SimConfig::default()
    });
    let k = load(&drv, 0);
    let s = drv.stream_create(0, true).unwrap();
    let p = drv.mem_alloc(0, 4 * 256).unwrap();
    drv.memcpy_htod(p, &[7u8; 4 * 256]).unwrap();
    let before = drv.launches_executed();
    fill(&drv, &k, p, 256, s);
    add_one(&drv, &k, p, p, 256, s);
    drv.stream_synchronize(s).unwrap();
    assert_eq!(drv.launches_executed() - before, 2);
    assert_eq!(drv.warp_instructions(), 0);
    assert_eq!(read_u32(&drv, p, 256), vec![0x0707_0707; 256]);
    // An out-of-bounds store is not executed, so it does not fault.
    drv.launch(
        k.store_at,
        [1, 1, 1],
        [32, 1, 1],
        0,
        s,
        &[&u64_arg(p), &u32_arg(1 << 20)],
    )
    .unwrap();
    drv.stream_synchronize(s).unwrap();
    assert!(drv.context_error(0).is_none());
    // The launch checks still apply.
    let e = drv
        .launch(
            k.fill_index,
            [1, 1, 1],
            [2048, 1, 1],
            0,
            s,
            &[&u64_arg(p), &u32_arg(1)],
        )
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidValue);
    let e = drv
        .launch(k.fill_index, [1, 1, 1], [32, 1, 1], 0, s, &[&u64_arg(p)])
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidValue);
}
