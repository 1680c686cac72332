//! Device and pinned memory of the emulated driver: allocation, accounting, the
//! configured limit, frees, range checks, and use-after-free detection in copies.

use std::sync::Arc;

use cuda_sim::driver::{device_of, Driver, EventHandle, SimConfig, StreamHandle, ADDRESS_BASE};
use cuda_sim::{ErrorCode, FaultKind};

fn driver(memory: u64) -> Arc<Driver> {
    Driver::new(SimConfig {
        memory_per_device: memory,
        ..SimConfig::default()
    })
}

/// Bytes of the scratch buffers [`busy`] fills.
const BUSY_LEN: usize = 64 << 20;

/// Keeps `s` busy for a while (a memset of `scratch`, [`BUSY_LEN`] bytes on `s`'s
/// device) and records an event after it: while the event is pending, nothing enqueued
/// on `s` afterwards has started.
fn busy(drv: &Driver, s: StreamHandle, scratch: u64) -> EventHandle {
    drv.memset_d8_async(scratch, 0x5a, BUSY_LEN, s).unwrap();
    let e = drv.event_create(device_of(scratch).unwrap()).unwrap();
    drv.event_record(e, s).unwrap();
    e
}

#[test]
fn allocations_are_accounted_and_never_reused() {
    let drv = driver(1 << 20);
    assert_eq!(drv.total_memory(0).unwrap(), 1 << 20);
    let a = drv.mem_alloc(0, 1000).unwrap();
    let b = drv.mem_alloc(0, 24).unwrap();
    let c = drv.mem_alloc(1, 4096).unwrap();
    assert_eq!(a % 256, 0);
    assert_eq!(b % 256, 0);
    assert!(a >= ADDRESS_BASE && b > a && c > b, "{a:#x} {b:#x} {c:#x}");
    assert_eq!(drv.used_memory(0).unwrap(), 1024);
    assert_eq!(drv.used_memory(1).unwrap(), 4096);
    drv.mem_free(a).unwrap();
    assert_eq!(drv.used_memory(0).unwrap(), 24);
    let d = drv.mem_alloc(0, 1000).unwrap();
    assert!(d > b, "a freed address is not handed out again");
    for p in [b, c, d] {
        drv.mem_free(p).unwrap();
    }
    assert_eq!(drv.used_memory(0).unwrap(), 0);
    assert_eq!(drv.used_memory(1).unwrap(), 0);
}

#[test]
fn bad_allocations_and_frees_are_errors() {
    let drv = driver(1 << 20);
    assert_eq!(
        drv.mem_alloc(0, 0).unwrap_err().code,
        ErrorCode::InvalidValue
    );
    assert_eq!(
        drv.mem_alloc(2, 16).unwrap_err().code,
        ErrorCode::InvalidDevice
    );
    let a = drv.mem_alloc(0, 512).unwrap();
    assert_eq!(
        drv.mem_free(a + 8).unwrap_err().code,
        ErrorCode::InvalidValue
    );
    assert_eq!(
        drv.mem_free(0x1234).unwrap_err().code,
        ErrorCode::InvalidValue
    );
    assert_eq!(
        drv.mem_free(u64::MAX).unwrap_err().code,
        ErrorCode::InvalidValue
    );
    drv.mem_free(a).unwrap();
    let again = drv.mem_free(a).unwrap_err();
    assert_eq!(again.code, ErrorCode::InvalidValue);
    assert!(again.detail.contains("already freed"), "{again}");
    assert_eq!(drv.used_memory(0).unwrap(), 0);
    assert!(drv.context_error(0).is_none(), "API errors are not sticky");
}

#[test]
fn the_configured_memory_is_the_limit() {
    let drv = driver(1 << 20);
    let all = drv.mem_alloc(0, 1 << 20).unwrap();
    let e = drv.mem_alloc(0, 1).unwrap_err();
    assert_eq!(e.code, ErrorCode::OutOfMemory);
    assert!(e.detail.contains("1048576"), "{e}");
    // The other device has its own memory.
    let other = drv.mem_alloc(1, 1 << 20).unwrap();
    drv.mem_free(all).unwrap();
    let half = drv.mem_alloc(0, 1 << 19).unwrap();
    let half2 = drv.mem_alloc(0, 1 << 19).unwrap();
    assert_eq!(
        drv.mem_alloc(0, 1).unwrap_err().code,
        ErrorCode::OutOfMemory
    );
    for p in [other, half, half2] {
        drv.mem_free(p).unwrap();
    }
    assert!(drv.context_error(0).is_none(), "OOM is not sticky");
}

#[test]
fn copies_are_range_checked_at_the_call() {
    let drv = driver(1 << 20);
    let s = drv.stream_create(0, true).unwrap();
    let a = drv.mem_alloc(0, 100).unwrap();
    let mut out = [0u8; 8];
    for (dst, len) in [(a + 96, 8), (a + 100, 1), (a - 1, 2), (0x10, 4)] {
        let e = drv.memcpy_htod(dst, &vec![1u8; len]).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidValue, "{dst:#x}+{len}: {e}");
        assert_eq!(
            drv.memset_d8_async(dst, 0, len, s).unwrap_err().code,
            ErrorCode::InvalidValue
        );
    }
    assert_eq!(
        drv.memcpy_dtoh(&mut out, a + 93).unwrap_err().code,
        ErrorCode::InvalidValue
    );
    let b = drv.mem_alloc(0, 100).unwrap();
    assert_eq!(
        drv.memcpy_dtod_async(b, a, 101, s).unwrap_err().code,
        ErrorCode::InvalidValue
    );
    drv.mem_free(a).unwrap();
    let e = drv.memcpy_htod(a, &[1, 2, 3]).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidValue);
    assert!(e.detail.contains("freed"), "{e}");
    // Zero-length copies are no-ops.
    drv.memcpy_htod(b, &[]).unwrap();
    drv.memset_d8(b, 0, 0).unwrap();
    drv.stream_synchronize(s).unwrap();
    assert!(drv.context_error(0).is_none());
    assert!(drv.fault_reports().is_empty());
}

#[test]
fn a_copy_of_memory_freed_before_it_ran_is_a_sticky_fault() {
    for _attempt in 0..5 {
        let drv = driver(1 << 30);
        let s = drv.stream_create(0, true).unwrap();
        let victim = drv.mem_alloc(0, 4096).unwrap();
        let scratch = drv.mem_alloc(0, BUSY_LEN).unwrap();
        let before = busy(&drv, s, scratch);
        let mut out = vec![0u8; 4096];
        // A pinned destination, so that the copy is only enqueued (a pageable one
        // would make the call wait for it).
        let pinned = drv.mem_alloc_host(4096).unwrap();
        // SAFETY: pinned block of 4096 bytes, not touched until the stream is synchronised.
        unsafe { drv.memcpy_dtoh_async(pinned, victim, 4096, s) }.unwrap();
        drv.mem_free(victim).unwrap();
        if drv.event_query(before).is_ok() {
            // The copy may have run before the free: try again.
            let _ = drv.stream_synchronize(s);
            continue;
        }
        let e = drv.stream_synchronize(s).unwrap_err();
        assert_eq!(e.code, ErrorCode::IllegalAddress, "{e}");
        let reports = drv.fault_reports();
        assert_eq!(reports.len(), 1, "{reports:?}");
        assert_eq!(reports[0].kind, FaultKind::UseAfterFree);
        assert_eq!(reports[0].address, Some(victim));
        assert!(reports[0].kernel.contains("DtoH"), "{}", reports[0]);
        // Sticky: every later call on the device fails with it, the other device works.
        assert_eq!(
            drv.context_error(0).unwrap().code,
            ErrorCode::IllegalAddress
        );
        assert_eq!(
            drv.mem_alloc(0, 16).unwrap_err().code,
            ErrorCode::IllegalAddress
        );
        assert_eq!(
            drv.stream_query(s).unwrap_err().code,
            ErrorCode::IllegalAddress
        );
        assert_eq!(
            drv.stream_create(0, true).unwrap_err().code,
            ErrorCode::IllegalAddress
        );
        assert_eq!(
            drv.device_synchronize(0).unwrap_err().code,
            ErrorCode::IllegalAddress
        );
        let other = drv.mem_alloc(1, 16).unwrap();
        drv.memcpy_htod(other, &[7; 16]).unwrap();
        drv.memcpy_dtoh(&mut out[..16], other).unwrap();
        assert_eq!(&out[..16], &[7; 16]);
        assert!(drv.context_error(1).is_none());
        // Destroying things still works (and reports the error).
        assert_eq!(
            drv.stream_destroy(s).unwrap_err().code,
            ErrorCode::IllegalAddress
        );
        assert_eq!(
            drv.stream_destroy(s).unwrap_err().code,
            ErrorCode::InvalidHandle
        );
        drv.mem_free_host(pinned).unwrap();
        return;
    }
    panic!("the stream never stayed busy long enough to free memory under a queued copy");
}

#[test]
fn pinned_memory_is_tracked() {
    let drv = driver(1 << 20);
    assert_eq!(drv.pinned_bytes(), 0);
    let p = drv.mem_alloc_host(10_000).unwrap();
    assert_eq!(p as usize % 4096, 0);
    assert_eq!(drv.pinned_bytes(), 10_000);
    // SAFETY: 10 000 bytes of pinned memory, zero-filled.
    let bytes = unsafe { std::slice::from_raw_parts_mut(p, 10_000) };
    assert!(bytes.iter().all(|&b| b == 0));
    bytes.fill(3);
    assert_eq!(
        drv.mem_alloc_host(0).unwrap_err().code,
        ErrorCode::InvalidValue
    );
    let mut local = [0u8; 4];
    assert_eq!(
        drv.mem_free_host(local.as_mut_ptr()).unwrap_err().code,
        ErrorCode::InvalidValue
    );
    drv.mem_free_host(p).unwrap();
    assert_eq!(
        drv.mem_free_host(p).unwrap_err().code,
        ErrorCode::InvalidValue
    );
    assert_eq!(drv.pinned_bytes(), 0);
}

#[test]
fn allocation_from_many_threads() {
    let drv = driver(64 << 20);
    std::thread::scope(|sc| {
        for t in 0..4u8 {
            let drv = &drv;
            sc.spawn(move || {
                let s = drv.stream_create((t % 2) as usize, true).unwrap();
                for i in 0..50usize {
                    let n = 256 + i * 8;
                    let p = drv.mem_alloc((t % 2) as usize, n).unwrap();
                    drv.memset_d8_async(p, t, n, s).unwrap();
                    let mut out = vec![0u8; n];
                    // SAFETY: `out` is valid for n bytes; a pageable destination makes
                    // the call wait for the copy.
                    unsafe { drv.memcpy_dtoh_async(out.as_mut_ptr(), p, n, s) }.unwrap();
                    assert!(out.iter().all(|&b| b == t));
                    drv.mem_free(p).unwrap();
                }
                drv.stream_destroy(s).unwrap();
            });
        }
    });
    assert_eq!(drv.used_memory(0).unwrap(), 0);
    assert_eq!(drv.used_memory(1).unwrap(), 0);
}
