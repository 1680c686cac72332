//! Copies and memsets of the emulated driver: round trips between host and devices and
//! between devices, and when each kind of copy reads or writes host memory (pinned:
//! when it executes; pageable: at the call).

use std::sync::Arc;

use cuda_sim::driver::{device_of, Driver, EventHandle, SimConfig, StreamHandle};
use cuda_sim::ErrorCode;

fn driver() -> Arc<Driver> {
    Driver::new(SimConfig {
        memory_per_device: 1 << 30,
        ..SimConfig::default()
    })
}

fn pattern(n: usize, salt: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// Reads `len` bytes at `src` through the legacy stream's synchronous copy.
fn read(drv: &Driver, src: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    drv.memcpy_dtoh(&mut out, src).unwrap();
    out
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
fn host_device_round_trips() {
    let drv = driver();
    let n = 10_000;
    let data = pattern(n, 1);
    for dev in 0..2 {
        let p = drv.mem_alloc(dev, n).unwrap();
        drv.memcpy_htod(p, &data).unwrap();
        assert_eq!(read(&drv, p, n), data);
        // Partial ranges inside the allocation.
        drv.memcpy_htod(p + 100, &[9; 50]).unwrap();
        assert_eq!(read(&drv, p + 90, 20)[10..], [9; 10]);
        drv.memset_d8(p, 0xee, 64).unwrap();
        assert_eq!(read(&drv, p, 65)[..64], [0xee; 64]);
        assert_eq!(read(&drv, p, 65)[64], data[64]);
        drv.mem_free(p).unwrap();
    }
}

#[test]
fn fresh_memory_reads_as_zeros() {
    let drv = driver();
    let p = drv.mem_alloc(1, 4096).unwrap();
    assert!(read(&drv, p, 4096).iter().all(|&b| b == 0));
}

#[test]
fn async_round_trips_on_streams() {
    let drv = driver();
    let n = 4096;
    let data = pattern(n, 7);
    let s = drv.stream_create(0, true).unwrap();
    let a = drv.mem_alloc(0, n).unwrap();
    let b = drv.mem_alloc(0, n).unwrap();
    // SAFETY: `data` is valid for n bytes during the call (pageable: staged at once).
    unsafe { drv.memcpy_htod_async(a, data.as_ptr(), n, s) }.unwrap();
    drv.memcpy_dtod_async(b, a, n, s).unwrap();
    drv.memset_d8_async(b, 1, 16, s).unwrap();
    let mut out = vec![0u8; n];
    // SAFETY: `out` is valid for n bytes; pageable, so the call waits for the copy.
    unsafe { drv.memcpy_dtoh_async(out.as_mut_ptr(), b, n, s) }.unwrap();
    assert_eq!(out[..16], [1; 16]);
    assert_eq!(out[16..], data[16..]);
    drv.stream_synchronize(s).unwrap();
    drv.stream_destroy(s).unwrap();
}

#[test]
fn peer_copies_with_and_without_peer_access() {
    let drv = driver();
    assert!(drv.can_access_peer(0, 1).unwrap());
    assert!(!drv.can_access_peer(1, 1).unwrap());
    assert_eq!(
        drv.can_access_peer(0, 2).unwrap_err().code,
        ErrorCode::InvalidDevice
    );
    let n = 5000;
    let data = pattern(n, 3);
    let a = drv.mem_alloc(0, n).unwrap();
    let b = drv.mem_alloc(1, n).unwrap();
    let s0 = drv.stream_create(0, true).unwrap();
    drv.memcpy_htod(a, &data).unwrap();
    // The synchronous htod may still be in flight on the legacy stream: order it.
    drv.stream_synchronize(drv.legacy_stream(0).unwrap())
        .unwrap();
    drv.memcpy_peer_async(b, 1, a, 0, n, s0).unwrap();
    drv.stream_synchronize(s0).unwrap();
    assert_eq!(read(&drv, b, n), data);

    drv.enable_peer_access(1, 0).unwrap();
    assert_eq!(
        drv.enable_peer_access(1, 0).unwrap_err().code,
        ErrorCode::PeerAccessAlreadyEnabled
    );
    assert_eq!(
        drv.enable_peer_access(1, 1).unwrap_err().code,
        ErrorCode::InvalidValue
    );
    assert_eq!(
        drv.enable_peer_access(0, 5).unwrap_err().code,
        ErrorCode::InvalidDevice
    );
    let s1 = drv.stream_create(1, true).unwrap();
    drv.memset_d8_async(b, 0x42, 100, s1).unwrap();
    drv.memcpy_peer_async(a, 0, b, 1, 100, s1).unwrap();
    // A plain device-to-device copy between devices works too (unified addressing).
    drv.memcpy_dtod_async(a + 100, b + 100, 100, s1).unwrap();
    drv.stream_synchronize(s1).unwrap();
    let got = read(&drv, a, n);
    assert_eq!(got[..100], [0x42; 100]);
    assert_eq!(got[100..], data[100..]);

    // The pointers must be memory of the devices named.
    let e = drv.memcpy_peer_async(b, 0, a, 0, 16, s0).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidValue);
    assert!(e.detail.contains("device 1"), "{e}");
    assert_eq!(
        drv.memcpy_peer_async(b, 1, a, 7, 16, s0).unwrap_err().code,
        ErrorCode::InvalidDevice
    );
}

#[test]
fn sync_copies_order_on_the_legacy_stream() {
    let drv = driver();
    let p = drv.mem_alloc(0, 1 << 20).unwrap();
    for seed in 0..8 {
        drv.set_chaos(Some(seed));
        let v = seed as u8 + 1;
        // Asynchronous, but the later synchronous read is on the same (legacy) stream.
        drv.memset_d8(p, v, 1 << 20).unwrap();
        assert!(
            read(&drv, p, 1 << 20).iter().all(|&b| b == v),
            "seed {seed}"
        );
        drv.memcpy_htod(p, &[v + 1; 256]).unwrap();
        assert_eq!(read(&drv, p, 256), [v + 1; 256], "seed {seed}");
    }
}

#[test]
fn sync_htod_from_pinned_memory_returns_after_completion() {
    let drv = driver();
    let n = 1 << 20;
    let p = drv.mem_alloc(0, n).unwrap();
    let host = drv.mem_alloc_host(n).unwrap();
    // SAFETY: a pinned block of n bytes, used by no queued copy.
    let src = unsafe { std::slice::from_raw_parts_mut(host, n) };
    src.fill(0x11);
    let legacy = drv.legacy_stream(0).unwrap();
    for seed in 0..4 {
        drv.set_chaos(Some(seed));
        drv.memcpy_htod(p, src).unwrap();
        // Nothing is left in flight on the legacy stream.
        drv.stream_query(legacy).unwrap();
    }
    drv.mem_free_host(host).unwrap();
}

#[test]
fn pinned_sources_are_read_when_the_copy_executes() {
    let drv = driver();
    let n = 4096;
    let s = drv.stream_create(0, true).unwrap();
    let dst = drv.mem_alloc(0, n).unwrap();
    let host = drv.mem_alloc_host(n).unwrap();
    let scratch = drv.mem_alloc(0, BUSY_LEN).unwrap();
    for _attempt in 0..5 {
        // SAFETY: the pinned block holds n bytes; no copy is queued on it right now.
        unsafe { std::ptr::write_bytes(host, 1, n) };
        let before = busy(&drv, s, scratch);
        // SAFETY: the pinned block stays allocated until the stream is synchronised.
        unsafe { drv.memcpy_htod_async(dst, host, n, s) }.unwrap();
        // Overwrite the staging bytes before the copy ran: a GPU reads the new bytes.
        // SAFETY: as above; the copy has not started while `before` is pending.
        unsafe { std::ptr::write_bytes(host, 2, n) };
        let raced = drv.event_query(before).is_ok();
        drv.stream_synchronize(s).unwrap();
        if raced {
            continue;
        }
        assert!(read(&drv, dst, n).iter().all(|&b| b == 2));
        drv.mem_free_host(host).unwrap();
        return;
    }
    panic!("the stream never stayed busy long enough");
}

#[test]
fn pageable_sources_are_staged_at_the_call() {
    let drv = driver();
    let n = 4096;
    let s = drv.stream_create(0, true).unwrap();
    let dst = drv.mem_alloc(0, n).unwrap();
    let mut host = vec![1u8; n];
    let scratch = drv.mem_alloc(0, BUSY_LEN).unwrap();
    busy(&drv, s, scratch);
    // SAFETY: `host` is valid for n bytes during the call.
    unsafe { drv.memcpy_htod_async(dst, host.as_ptr(), n, s) }.unwrap();
    host.fill(2);
    drv.stream_synchronize(s).unwrap();
    assert!(read(&drv, dst, n).iter().all(|&b| b == 1));
}

#[test]
fn dtoh_into_pinned_memory_lands_when_executed_into_pageable_at_return() {
    let drv = driver();
    let n = 4096;
    let s = drv.stream_create(0, true).unwrap();
    let src = drv.mem_alloc(0, n).unwrap();
    drv.memset_d8_async(src, 9, n, s).unwrap();
    let host = drv.mem_alloc_host(n).unwrap();
    let scratch = drv.mem_alloc(0, BUSY_LEN).unwrap();
    let before = busy(&drv, s, scratch);
    // SAFETY: the pinned block holds n bytes and is only read after synchronising.
    unsafe { drv.memcpy_dtoh_async(host, src, n, s) }.unwrap();
    // SAFETY: reading pinned memory the queued copy has not written yet (it has not
    // started while `before` is pending; checked below).
    let early = unsafe { std::slice::from_raw_parts(host, n) }.to_vec();
    if drv.event_query(before).is_err() {
        assert!(early.iter().all(|&b| b == 0), "written before the copy ran");
        assert_eq!(drv.stream_query(s).unwrap_err().code, ErrorCode::NotReady);
    }
    drv.stream_synchronize(s).unwrap();
    // SAFETY: the copy completed.
    assert!(unsafe { std::slice::from_raw_parts(host, n) }
        .iter()
        .all(|&b| b == 9));

    // Into pageable memory the call itself waits, behind the busy work.
    let before = busy(&drv, s, scratch);
    drv.memset_d8_async(src, 4, n, s).unwrap();
    let mut out = vec![0u8; n];
    // SAFETY: `out` is valid for n bytes during the call.
    unsafe { drv.memcpy_dtoh_async(out.as_mut_ptr(), src, n, s) }.unwrap();
    assert!(out.iter().all(|&b| b == 4));
    drv.event_query(before).unwrap();
    drv.mem_free_host(host).unwrap();
}

#[test]
fn pinned_memory_freed_under_a_queued_copy_faults() {
    let drv = driver();
    let n = 4096;
    let s = drv.stream_create(0, true).unwrap();
    let dst = drv.mem_alloc(0, n).unwrap();
    let scratch = drv.mem_alloc(0, BUSY_LEN).unwrap();
    for _attempt in 0..5 {
        let host = drv.mem_alloc_host(n).unwrap();
        let before = busy(&drv, s, scratch);
        // SAFETY: the block is valid now; it is freed before the copy runs, which the
        // driver turns into a fault instead of a read of freed memory.
        unsafe { drv.memcpy_htod_async(dst, host, n, s) }.unwrap();
        drv.mem_free_host(host).unwrap();
        if drv.event_query(before).is_ok() {
            drv.stream_synchronize(s).unwrap();
            continue;
        }
        assert_eq!(
            drv.stream_synchronize(s).unwrap_err().code,
            ErrorCode::IllegalAddress
        );
        assert_eq!(drv.fault_reports().len(), 1);
        return;
    }
    panic!("the stream never stayed busy long enough");
}
