//! Injected driver errors ([`Driver::inject_error`]) and primary-context resets: each
//! kind is raised by the first matching call after it is armed, with its code and note;
//! sticky kinds poison the context until its last user releases it, and the reset gives
//! back a usable device with its memory freed and counted.

use std::sync::Arc;

use cuda_sim::driver::{Driver, InjectedError, SimConfig};
use cuda_sim::ErrorCode;

const PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64

// out[tid] = 7
.visible .entry seven(
	.param .u64 seven_param_0
)
{
	.reg .b32 	%r<3>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [seven_param_0];
	cvta.to.global.u64 	%rd2, %rd1;
	mov.u32 	%r1, %tid.x;
	mul.wide.u32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd2, %rd3;
	mov.u32 	%r2, 7;
	st.global.u32 	[%rd4], %r2;
	ret;
}
"#;

fn driver() -> Arc<Driver> {
    Driver::new(SimConfig {
        devices: 2,
        memory_per_device: 64 << 20,
        ..SimConfig::default()
    })
}

/// Launches `seven` over 32 threads writing at `out` on a new stream of `dev`.
fn launch_seven(drv: &Driver, dev: usize, out: u64) -> Result<(), cuda_sim::CuError> {
    let m = drv.module_load(dev, "seven.ptx", PTX)?;
    let f = drv.module_function(m, "seven")?;
    let s = drv.stream_create(dev, true)?;
    let arg = out.to_le_bytes();
    drv.launch(f, [1, 1, 1], [32, 1, 1], 0, s, &[&arg])?;
    drv.stream_synchronize(s)
}

fn read_u32(drv: &Driver, src: u64) -> u32 {
    let mut b = [0u8; 4];
    drv.memcpy_dtoh(&mut b, src).unwrap();
    u32::from_le_bytes(b)
}

#[test]
fn names_round_trip() {
    for k in InjectedError::ALL {
        assert_eq!(InjectedError::from_name(k.name()), Some(k));
    }
    assert_eq!(InjectedError::from_name("boom"), None);
}

#[test]
fn illegal_address_is_raised_by_the_launch_after_arming_and_is_sticky_until_reset() {
    let drv = driver();
    drv.primary_ctx_retain(0).unwrap();
    let out = drv.mem_alloc(0, 128).unwrap();
    launch_seven(&drv, 0, out).unwrap();
    assert_eq!(read_u32(&drv, out), 7);
    drv.inject_error(0, InjectedError::IllegalAddress, "node 3 'x'")
        .unwrap();
    // The launch call succeeds; the error comes back from the synchronize.
    let e = launch_seven(&drv, 0, out).unwrap_err();
    assert_eq!(e.code, ErrorCode::IllegalAddress);
    assert!(
        e.detail.contains("kernel seven") && e.detail.contains("(injected: node 3 'x')"),
        "{e}"
    );
    assert_eq!(
        drv.context_error(0).unwrap().code,
        ErrorCode::IllegalAddress
    );
    assert!(drv.context_error(1).is_none(), "only device 0 is poisoned");
    assert_eq!(
        drv.mem_alloc(0, 16).unwrap_err().code,
        ErrorCode::IllegalAddress
    );
    // The last user's release resets the context: memory still allocated is freed and
    // counted, and the device works again.
    drv.primary_ctx_release(0).unwrap();
    assert!(drv.context_error(0).is_none());
    assert_eq!(drv.used_memory(0).unwrap(), 0);
    assert_eq!(drv.reclaimed_bytes(0).unwrap(), 128);
    let out = drv.mem_alloc(0, 128).unwrap();
    launch_seven(&drv, 0, out).unwrap();
    assert_eq!(read_u32(&drv, out), 7);
}

#[test]
fn a_retained_context_is_not_reset_before_its_last_release() {
    let drv = driver();
    drv.primary_ctx_retain(1).unwrap();
    drv.primary_ctx_retain(1).unwrap();
    let p = drv.mem_alloc(1, 64).unwrap();
    drv.primary_ctx_release(1).unwrap();
    assert_eq!(drv.used_memory(1).unwrap(), 64);
    drv.mem_free(p).unwrap();
    drv.primary_ctx_release(1).unwrap();
    assert_eq!(
        drv.reclaimed_bytes(1).unwrap(),
        0,
        "everything was freed by its user"
    );
    assert_eq!(
        drv.primary_ctx_release(1).unwrap_err().code,
        ErrorCode::InvalidContext
    );
}

#[test]
fn a_launch_error_is_returned_at_the_call_and_is_not_sticky() {
    let drv = driver();
    let out = drv.mem_alloc(1, 128).unwrap();
    drv.inject_error(1, InjectedError::Launch, "L").unwrap();
    // Armed on device 1: a launch on device 0 does not raise it.
    let other = drv.mem_alloc(0, 128).unwrap();
    launch_seven(&drv, 0, other).unwrap();
    let e = launch_seven(&drv, 1, out).unwrap_err();
    assert_eq!(e.code, ErrorCode::LaunchOutOfResources);
    assert!(
        e.detail.contains("cuLaunchKernel of kernel seven") && e.detail.ends_with("(injected: L)"),
        "{e}"
    );
    assert!(drv.context_error(1).is_none());
    launch_seven(&drv, 1, out).unwrap();
    assert_eq!(read_u32(&drv, out), 7);
}

#[test]
fn a_peer_copy_error_poisons_the_stream_that_ran_it_and_same_device_copies_pass() {
    let drv = driver();
    let a = drv.mem_alloc(0, 256).unwrap();
    let b = drv.mem_alloc(0, 256).unwrap();
    let c = drv.mem_alloc(1, 256).unwrap();
    drv.inject_error(0, InjectedError::PeerCopy, "P").unwrap();
    let s1 = drv.stream_create(1, true).unwrap();
    // Same device: not a peer copy, runs.
    let s0 = drv.stream_create(0, true).unwrap();
    drv.memcpy_dtod_async(b, a, 256, s0).unwrap();
    drv.stream_synchronize(s0).unwrap();
    // Device 0 to device 1 on device 1's stream: fails when it runs, on device 1.
    drv.memcpy_peer_async(c, 1, a, 0, 256, s1).unwrap();
    let e = drv.stream_synchronize(s1).unwrap_err();
    assert_eq!(e.code, ErrorCode::NvlinkUncorrectable);
    assert!(
        e.detail.contains("from device 0 to device 1") && e.detail.ends_with("(injected: P)"),
        "{e}"
    );
    assert!(drv.context_error(0).is_none());
    assert_eq!(
        drv.context_error(1).unwrap().code,
        ErrorCode::NvlinkUncorrectable
    );
}

#[test]
fn an_event_error_is_returned_by_record_or_wait_at_the_call() {
    let drv = driver();
    let s = drv.stream_create(0, true).unwrap();
    let ev = drv.event_create(0).unwrap();
    drv.inject_error(0, InjectedError::Event, "E1").unwrap();
    let e = drv.event_record(ev, s).unwrap_err();
    assert_eq!(e.code, ErrorCode::IllegalState);
    assert!(
        e.detail.starts_with("cuEventRecord") && e.detail.ends_with("(injected: E1)"),
        "{e}"
    );
    drv.event_record(ev, s).unwrap();
    drv.inject_error(0, InjectedError::Event, "E2").unwrap();
    let e = drv.stream_wait_event(s, ev).unwrap_err();
    assert!(
        e.detail.starts_with("cuStreamWaitEvent") && e.detail.ends_with("(injected: E2)"),
        "{e}"
    );
    assert!(drv.context_error(0).is_none());
    drv.event_synchronize(ev).unwrap();
}

#[test]
fn injections_whose_trigger_never_came_can_be_cancelled() {
    let drv = driver();
    drv.inject_error(1, InjectedError::PeerCopy, "x").unwrap();
    drv.inject_error(1, InjectedError::Event, "y").unwrap();
    drv.inject_error(0, InjectedError::Event, "z").unwrap();
    assert_eq!(
        drv.cancel_injected(1),
        vec![InjectedError::PeerCopy, InjectedError::Event]
    );
    assert!(drv.cancel_injected(1).is_empty());
    assert_eq!(drv.cancel_injected(0), vec![InjectedError::Event]);
    assert_eq!(
        drv.inject_error(5, InjectedError::Launch, "")
            .unwrap_err()
            .code,
        ErrorCode::InvalidDevice
    );
}

#[test]
fn a_reset_destroys_the_contexts_streams_events_and_modules() {
    let drv = driver();
    let s = drv.stream_create(0, false).unwrap();
    let ev = drv.event_create(0).unwrap();
    let m = drv.module_load(0, "seven.ptx", PTX).unwrap();
    let other = drv.stream_create(1, true).unwrap();
    drv.primary_ctx_reset(0).unwrap();
    assert_eq!(
        drv.stream_synchronize(s).unwrap_err().code,
        ErrorCode::InvalidHandle
    );
    assert_eq!(
        drv.event_query(ev).unwrap_err().code,
        ErrorCode::InvalidHandle
    );
    assert_eq!(
        drv.module_function(m, "seven").unwrap_err().code,
        ErrorCode::InvalidHandle
    );
    drv.stream_synchronize(other).unwrap();
    let legacy = drv.legacy_stream(0).unwrap();
    drv.stream_synchronize(legacy).unwrap();
}
