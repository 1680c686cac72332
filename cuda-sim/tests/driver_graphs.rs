//! Stream capture and CUDA graphs on the emulated driver: what a capture records, how a
//! graph replays, and the driver's errors for calls a capture forbids.

use std::sync::Arc;

use cuda_sim::driver::{
    CaptureMode, CaptureStatus, Driver, FunctionHandle, SimConfig, StreamHandle,
};
use cuda_sim::{ErrorCode, FaultKind};

/// `.entry NAME(p, n, v)`: `p[i] = p[i] OP v` for i < n, with `OP` the 32-bit integer
/// instruction `op` (both kernels of the module have this one body).
fn update_kernel(name: &str, what: &str, op: &str) -> String {
    format!(
        r#"
// p[i] {what} v for i < n
.visible .entry {name}(
	.param .u64 {name}_p,
	.param .u32 {name}_n,
	.param .u32 {name}_v
)
{{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<4>;

	ld.param.u64 	%rd1, [{name}_p];
	ld.param.u32 	%r2, [{name}_n];
	ld.param.u32 	%r3, [{name}_v];
	mov.u32 	%r4, %ctaid.x;
	mov.u32 	%r5, %ntid.x;
	mov.u32 	%r6, %tid.x;
	mad.lo.s32 	%r1, %r4, %r5, %r6;
	setp.ge.u32 	%p1, %r1, %r2;
	@%p1 bra 	DONE;
	cvta.to.global.u64 	%rd2, %rd1;
	mul.wide.u32 	%rd3, %r1, 4;
	add.s64 	%rd2, %rd2, %rd3;
	ld.global.u32 	%r7, [%rd2];
	{op} 	%r7, %r7, %r3;
	st.global.u32 	[%rd2], %r7;
DONE:
	ret;
}}
"#
    )
}

/// The test module: `add_value` (p[i] += v) and `mul_value` (p[i] *= v).
fn ptx() -> String {
    let header = "\n.version 8.0\n.target sm_80\n.address_size 64\n";
    let add = update_kernel("add_value", "+=", "add.s32");
    let mul = update_kernel("mul_value", "*=", "mul.lo.s32");
    format!("{header}{add}{mul}")
}

const N: u32 = 64;

struct Setup {
    drv: Arc<Driver>,
    add: FunctionHandle,
    mul: FunctionHandle,
    s: StreamHandle,
    p: u64,
}

fn setup() -> Setup {
    let drv = Driver::new(SimConfig {
        memory_per_device: 1 << 30,
        exec_threads: 1,
        ..SimConfig::default()
    });
    let m = drv.module_load(0, "graph_test.ptx", &ptx()).unwrap();
    let add = drv.module_function(m, "add_value").unwrap();
    let mul = drv.module_function(m, "mul_value").unwrap();
    let s = drv.stream_create(0, true).unwrap();
    let p = drv.mem_alloc(0, 4 * N as usize).unwrap();
    drv.memset_d8_async(p, 0, 4 * N as usize, s).unwrap();
    drv.stream_synchronize(s).unwrap();
    Setup {
        drv,
        add,
        mul,
        s,
        p,
    }
}

fn launch(x: &Setup, f: FunctionHandle, p: u64, v: u32) {
    x.drv
        .launch(
            f,
            [1, 1, 1],
            [N, 1, 1],
            0,
            x.s,
            &[&p.to_le_bytes(), &N.to_le_bytes(), &v.to_le_bytes()],
        )
        .unwrap();
}

fn read(x: &Setup) -> Vec<u32> {
    let mut out = vec![0u8; 4 * N as usize];
    x.drv.memcpy_dtoh(&mut out, x.p).unwrap();
    out.chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn a_capture_records_and_a_graph_replays_in_order() {
    let x = setup();
    x.drv
        .stream_begin_capture(x.s, CaptureMode::ThreadLocal)
        .unwrap();
    assert_eq!(
        x.drv.stream_is_capturing(x.s).unwrap(),
        CaptureStatus::Active
    );
    launch(&x, x.add, x.p, 3);
    launch(&x, x.mul, x.p, 5);
    x.drv.memset_d8_async(x.p, 0, 4, x.s).unwrap();
    let before = x.drv.launches_executed();
    let g = x.drv.stream_end_capture(x.s).unwrap();
    assert_eq!(x.drv.stream_is_capturing(x.s).unwrap(), CaptureStatus::None);
    // Nothing ran.
    x.drv.stream_synchronize(x.s).unwrap();
    assert_eq!(x.drv.launches_executed(), before);
    assert_eq!(read(&x), vec![0; N as usize]);
    assert_eq!(x.drv.graph_node_count(g).unwrap(), 3);
    let e = x.drv.graph_instantiate(g).unwrap();
    x.drv.graph_destroy(g).unwrap();
    x.drv.graph_launch(e, x.s).unwrap();
    x.drv.graph_launch(e, x.s).unwrap();
    x.drv.stream_synchronize(x.s).unwrap();
    assert_eq!(x.drv.launches_executed() - before, 4);
    // ((0 + 3) * 5 + 3) * 5, element 0 zeroed by the memset at the end of each replay.
    let mut want = vec![90; N as usize];
    want[0] = 0;
    assert_eq!(read(&x), want);
    x.drv.graph_exec_destroy(e).unwrap();
    assert_eq!(x.drv.graph_count(), (0, 0));
    assert_eq!(
        x.drv.graph_launch(e, x.s).unwrap_err().code,
        ErrorCode::InvalidHandle
    );
}

#[test]
fn kernel_arguments_are_copied_at_the_call() {
    let x = setup();
    x.drv
        .stream_begin_capture(x.s, CaptureMode::Relaxed)
        .unwrap();
    let mut v = 7u32.to_le_bytes();
    x.drv
        .launch(
            x.add,
            [1, 1, 1],
            [N, 1, 1],
            0,
            x.s,
            &[&x.p.to_le_bytes(), &N.to_le_bytes(), &v],
        )
        .unwrap();
    v = 1000u32.to_le_bytes();
    let g = x.drv.stream_end_capture(x.s).unwrap();
    let e = x.drv.graph_instantiate(g).unwrap();
    x.drv.graph_launch(e, x.s).unwrap();
    x.drv.stream_synchronize(x.s).unwrap();
    assert_eq!(read(&x), vec![7; N as usize], "{v:?}");
}

#[test]
fn pinned_copies_replay_and_pageable_ones_are_refused() {
    let x = setup();
    let host = x.drv.mem_alloc_host(4 * N as usize).unwrap();
    let back = x.drv.mem_alloc_host(4 * N as usize).unwrap();
    let len = 4 * N as usize;
    x.drv
        .stream_begin_capture(x.s, CaptureMode::ThreadLocal)
        .unwrap();
    // SAFETY: pinned blocks of `len` bytes, alive until freed below after the stream
    // drained.
    unsafe {
        x.drv.memcpy_htod_async(x.p, host, len, x.s).unwrap();
    }
    launch(&x, x.add, x.p, 1);
    // SAFETY: as above.
    unsafe {
        x.drv.memcpy_dtoh_async(back, x.p, len, x.s).unwrap();
    }
    let e = x
        .drv
        .graph_instantiate(x.drv.stream_end_capture(x.s).unwrap())
        .unwrap();
    // The pinned source is read when the graph runs, not at capture.
    for round in 0..2u8 {
        // SAFETY: the stream is idle: nothing reads or writes the pinned blocks.
        unsafe { std::ptr::write_bytes(host, round * 16, len) };
        x.drv.graph_launch(e, x.s).unwrap();
        x.drv.stream_synchronize(x.s).unwrap();
        let want = u32::from_le_bytes([round * 16; 4]) + 1;
        // SAFETY: the copy into `back` completed.
        let got = unsafe { std::slice::from_raw_parts(back, len) };
        assert_eq!(&got[..4], &want.to_le_bytes());
        assert_eq!(read(&x), vec![want; N as usize]);
    }
    // A pageable source: refused, and the capture is invalidated.
    x.drv
        .stream_begin_capture(x.s, CaptureMode::ThreadLocal)
        .unwrap();
    let pageable = [0u8; 16];
    // SAFETY: `pageable` is valid for 16 bytes during the call.
    let err = unsafe {
        x.drv
            .memcpy_htod_async(x.p, pageable.as_ptr(), 16, x.s)
            .unwrap_err()
    };
    assert_eq!(err.code, ErrorCode::StreamCaptureUnsupported);
    assert_eq!(
        x.drv.stream_is_capturing(x.s).unwrap(),
        CaptureStatus::Invalidated
    );
    let mut out = [0u8; 16];
    // SAFETY: `out` is valid for 16 bytes during the call.
    let err = unsafe {
        x.drv
            .memcpy_dtoh_async(out.as_mut_ptr(), x.p, 16, x.s)
            .unwrap_err()
    };
    assert_eq!(err.code, ErrorCode::StreamCaptureInvalidated);
    assert_eq!(
        x.drv.stream_end_capture(x.s).unwrap_err().code,
        ErrorCode::StreamCaptureInvalidated
    );
    x.drv.mem_free_host(host).unwrap();
    x.drv.mem_free_host(back).unwrap();
}

#[test]
fn synchronising_a_capturing_stream_is_refused_and_invalidates_it() {
    let x = setup();
    for sync in [Driver::stream_synchronize, Driver::stream_query] {
        x.drv
            .stream_begin_capture(x.s, CaptureMode::Relaxed)
            .unwrap();
        launch(&x, x.add, x.p, 1);
        assert_eq!(
            sync(&x.drv, x.s).unwrap_err().code,
            ErrorCode::StreamCaptureUnsupported
        );
        // Later work on the stream and the end report the invalidation.
        let e = x
            .drv
            .launch(
                x.add,
                [1, 1, 1],
                [N, 1, 1],
                0,
                x.s,
                &[&x.p.to_le_bytes(), &N.to_le_bytes(), &1u32.to_le_bytes()],
            )
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::StreamCaptureInvalidated);
        let e = x.drv.stream_end_capture(x.s).unwrap_err();
        assert_eq!(e.code, ErrorCode::StreamCaptureInvalidated);
        assert!(e.detail.contains("was invalidated"), "{e}");
    }
    // The stream works normally afterwards; nothing captured ever ran.
    x.drv.stream_synchronize(x.s).unwrap();
    assert_eq!(read(&x), vec![0; N as usize]);
    let d = x.drv.stream_create(0, true).unwrap();
    x.drv.stream_begin_capture(d, CaptureMode::Relaxed).unwrap();
    assert_eq!(
        x.drv.device_synchronize(0).unwrap_err().code,
        ErrorCode::StreamCaptureUnsupported
    );
    assert_eq!(
        x.drv.stream_end_capture(d).unwrap_err().code,
        ErrorCode::StreamCaptureInvalidated
    );
}

#[test]
fn events_recorded_in_a_capture_mark_graph_points() {
    let x = setup();
    let ev = x.drv.event_create(0).unwrap();
    x.drv
        .stream_begin_capture(x.s, CaptureMode::ThreadLocal)
        .unwrap();
    launch(&x, x.add, x.p, 1);
    x.drv.event_record(ev, x.s).unwrap();
    // A wait in the same capture adds nothing.
    x.drv.stream_wait_event(x.s, ev).unwrap();
    launch(&x, x.add, x.p, 1);
    let g = x.drv.stream_end_capture(x.s).unwrap();
    assert_eq!(x.drv.graph_node_count(g).unwrap(), 2);
    // After the capture the event stands for a node.
    for e in [
        x.drv.event_query(ev).unwrap_err(),
        x.drv.event_synchronize(ev).unwrap_err(),
        x.drv.stream_wait_event(x.s, ev).unwrap_err(),
    ] {
        assert_eq!(e.code, ErrorCode::CapturedEvent, "{e}");
    }
    // During a capture, a query of an event recorded in it is refused and invalidates it.
    x.drv
        .stream_begin_capture(x.s, CaptureMode::ThreadLocal)
        .unwrap();
    x.drv.event_record(ev, x.s).unwrap();
    assert_eq!(
        x.drv.event_query(ev).unwrap_err().code,
        ErrorCode::StreamCaptureUnsupported
    );
    assert_eq!(
        x.drv.stream_end_capture(x.s).unwrap_err().code,
        ErrorCode::StreamCaptureInvalidated
    );
    // A record outside a capture makes it an ordinary event again; waiting on it inside
    // a capture crosses the capture's boundary.
    x.drv.event_record(ev, x.s).unwrap();
    x.drv.event_synchronize(ev).unwrap();
    x.drv
        .stream_begin_capture(x.s, CaptureMode::ThreadLocal)
        .unwrap();
    assert_eq!(
        x.drv.stream_wait_event(x.s, ev).unwrap_err().code,
        ErrorCode::StreamCaptureIsolation
    );
    assert_eq!(
        x.drv.stream_end_capture(x.s).unwrap_err().code,
        ErrorCode::StreamCaptureInvalidated
    );
    // Another stream joining a capture is not emulated.
    x.drv
        .stream_begin_capture(x.s, CaptureMode::ThreadLocal)
        .unwrap();
    x.drv.event_record(ev, x.s).unwrap();
    let other = x.drv.stream_create(0, true).unwrap();
    assert_eq!(
        x.drv.stream_wait_event(other, ev).unwrap_err().code,
        ErrorCode::NotSupported
    );
    x.drv.stream_end_capture(x.s).unwrap();
}

#[test]
fn unsafe_calls_follow_the_capture_mode() {
    let x = setup();
    let drv = &x.drv;
    // Thread-local: the capturing thread may not allocate; another thread may.
    drv.stream_begin_capture(x.s, CaptureMode::ThreadLocal)
        .unwrap();
    let q = std::thread::scope(|t| t.spawn(|| drv.mem_alloc(0, 256)).join().unwrap()).unwrap();
    assert_eq!(
        drv.mem_free(q).unwrap_err().code,
        ErrorCode::StreamCaptureUnsupported
    );
    assert_eq!(
        drv.stream_end_capture(x.s).unwrap_err().code,
        ErrorCode::StreamCaptureInvalidated
    );
    // Refused before anything was freed.
    drv.mem_free(q).unwrap();
    drv.stream_begin_capture(x.s, CaptureMode::ThreadLocal)
        .unwrap();
    for e in [
        drv.mem_alloc(0, 256).unwrap_err(),
        drv.mem_alloc_host(256).unwrap_err(),
    ] {
        assert_eq!(e.code, ErrorCode::StreamCaptureUnsupported, "{e}");
    }
    assert_eq!(
        drv.stream_end_capture(x.s).unwrap_err().code,
        ErrorCode::StreamCaptureInvalidated
    );
    // Global: no thread may; the legacy stream may not be used either.
    drv.stream_begin_capture(x.s, CaptureMode::Global).unwrap();
    let e = std::thread::scope(|t| t.spawn(|| drv.mem_alloc(0, 256)).join().unwrap());
    assert_eq!(e.unwrap_err().code, ErrorCode::StreamCaptureUnsupported);
    assert_eq!(
        drv.stream_end_capture(x.s).unwrap_err().code,
        ErrorCode::StreamCaptureInvalidated
    );
    drv.stream_begin_capture(x.s, CaptureMode::Global).unwrap();
    let e = std::thread::scope(|t| t.spawn(|| drv.memset_d8(x.p, 0, 16)).join().unwrap());
    assert_eq!(e.unwrap_err().code, ErrorCode::StreamCaptureUnsupported);
    assert_eq!(
        drv.stream_end_capture(x.s).unwrap_err().code,
        ErrorCode::StreamCaptureInvalidated
    );
    // Relaxed: allowed.
    drv.stream_begin_capture(x.s, CaptureMode::Relaxed).unwrap();
    let q = drv.mem_alloc(0, 256).unwrap();
    drv.mem_free(q).unwrap();
    drv.stream_end_capture(x.s).unwrap();
    // A blocking stream's capture makes the legacy stream unusable, in any mode.
    let b = drv.stream_create(0, false).unwrap();
    drv.stream_begin_capture(b, CaptureMode::Relaxed).unwrap();
    assert_eq!(
        drv.memset_d8(x.p, 0, 16).unwrap_err().code,
        ErrorCode::StreamCaptureImplicit
    );
    assert_eq!(
        drv.stream_end_capture(b).unwrap_err().code,
        ErrorCode::StreamCaptureInvalidated
    );
}

#[test]
fn capture_state_errors() {
    let x = setup();
    let drv = &x.drv;
    assert_eq!(
        drv.stream_end_capture(x.s).unwrap_err().code,
        ErrorCode::IllegalState
    );
    let legacy = drv.legacy_stream(0).unwrap();
    assert_eq!(
        drv.stream_begin_capture(legacy, CaptureMode::Relaxed)
            .unwrap_err()
            .code,
        ErrorCode::StreamCaptureUnsupported
    );
    drv.stream_begin_capture(x.s, CaptureMode::ThreadLocal)
        .unwrap();
    assert_eq!(
        drv.stream_begin_capture(x.s, CaptureMode::ThreadLocal)
            .unwrap_err()
            .code,
        ErrorCode::IllegalState
    );
    let e = std::thread::scope(|t| t.spawn(|| drv.stream_end_capture(x.s)).join().unwrap());
    assert_eq!(e.unwrap_err().code, ErrorCode::StreamCaptureWrongThread);
    // Still capturing: the right thread ends it.
    let g = drv.stream_end_capture(x.s).unwrap();
    assert_eq!(drv.graph_node_count(g).unwrap(), 0);
    // Relaxed captures may end on another thread.
    drv.stream_begin_capture(x.s, CaptureMode::Relaxed).unwrap();
    let g = std::thread::scope(|t| t.spawn(|| drv.stream_end_capture(x.s)).join().unwrap());
    assert!(g.is_ok());
    // Destroying a capturing stream drops the capture.
    let d = drv.stream_create(0, true).unwrap();
    drv.stream_begin_capture(d, CaptureMode::ThreadLocal)
        .unwrap();
    drv.stream_destroy(d).unwrap();
    drv.mem_free(drv.mem_alloc(0, 64).unwrap()).unwrap();
}

#[test]
fn a_freed_pointer_baked_into_a_graph_is_a_use_after_free() {
    let x = setup();
    let q = x.drv.mem_alloc(0, 4 * N as usize).unwrap();
    x.drv.memset_d8_async(q, 0, 4 * N as usize, x.s).unwrap();
    x.drv
        .stream_begin_capture(x.s, CaptureMode::ThreadLocal)
        .unwrap();
    launch(&x, x.add, q, 1);
    let e = x
        .drv
        .graph_instantiate(x.drv.stream_end_capture(x.s).unwrap())
        .unwrap();
    x.drv.graph_launch(e, x.s).unwrap();
    x.drv.stream_synchronize(x.s).unwrap();
    x.drv.mem_free(q).unwrap();
    x.drv.graph_launch(e, x.s).unwrap();
    assert_eq!(
        x.drv.stream_synchronize(x.s).unwrap_err().code,
        ErrorCode::IllegalAddress
    );
    let f = &x.drv.fault_reports()[0];
    assert_eq!(f.kind, FaultKind::UseAfterFree);
    assert_eq!(f.kernel, "add_value");
}

#[test]
fn executable_graphs_update_within_their_topology() {
    let x = setup();
    let capture = |v: u32, f: FunctionHandle| {
        x.drv
            .stream_begin_capture(x.s, CaptureMode::ThreadLocal)
            .unwrap();
        launch(&x, f, x.p, v);
        x.drv.stream_end_capture(x.s).unwrap()
    };
    let e = x.drv.graph_instantiate(capture(1, x.add)).unwrap();
    x.drv.graph_launch(e, x.s).unwrap();
    x.drv.graph_exec_update(e, capture(10, x.add)).unwrap();
    x.drv.graph_launch(e, x.s).unwrap();
    x.drv.stream_synchronize(x.s).unwrap();
    assert_eq!(read(&x), vec![11; N as usize]);
    // Another kernel is not an update.
    let e2 = x.drv.graph_exec_update(e, capture(2, x.mul)).unwrap_err();
    assert_eq!(e2.code, ErrorCode::GraphExecUpdateFailure);
    x.drv.graph_launch(e, x.s).unwrap();
    x.drv.stream_synchronize(x.s).unwrap();
    assert_eq!(read(&x), vec![21; N as usize]);
}

#[test]
fn a_graph_launched_into_a_capture_joins_it() {
    let x = setup();
    x.drv
        .stream_begin_capture(x.s, CaptureMode::ThreadLocal)
        .unwrap();
    launch(&x, x.add, x.p, 2);
    let inner = x
        .drv
        .graph_instantiate(x.drv.stream_end_capture(x.s).unwrap())
        .unwrap();
    x.drv
        .stream_begin_capture(x.s, CaptureMode::ThreadLocal)
        .unwrap();
    x.drv.graph_launch(inner, x.s).unwrap();
    launch(&x, x.mul, x.p, 3);
    let g = x.drv.stream_end_capture(x.s).unwrap();
    assert_eq!(x.drv.graph_node_count(g).unwrap(), 2);
    let outer = x.drv.graph_instantiate(g).unwrap();
    x.drv.graph_launch(outer, x.s).unwrap();
    x.drv.stream_synchronize(x.s).unwrap();
    assert_eq!(read(&x), vec![6; N as usize]);
}
