//! Streams and events of the emulated driver: ordering through events (across streams
//! and devices), the legacy NULL stream's rules, and races that chaos delays make
//! observable when the ordering is missing.

use std::sync::Arc;

use cuda_sim::driver::{device_of, Driver, EventHandle, SimConfig, StreamHandle};
use cuda_sim::ErrorCode;

/// Rounds a race test tries before concluding that the race never shows.
const RACE_ROUNDS: u64 = 400;

fn driver() -> Arc<Driver> {
    Driver::new(SimConfig {
        memory_per_device: 1 << 30,
        ..SimConfig::default()
    })
}

/// Reads `len` bytes at `src` on stream `s` (pageable: the call waits for the copy).
fn read_on(drv: &Driver, src: u64, len: usize, s: StreamHandle) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: `out` is valid for `len` bytes during the call.
    unsafe { drv.memcpy_dtoh_async(out.as_mut_ptr(), src, len, s) }.unwrap();
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
fn handles_are_checked() {
    let drv = driver();
    let s = drv.stream_create(0, true).unwrap();
    let e = drv.event_create(0).unwrap();
    let bogus = StreamHandle(9999);
    assert_eq!(
        drv.stream_synchronize(bogus).unwrap_err().code,
        ErrorCode::InvalidHandle
    );
    assert_eq!(
        drv.stream_query(bogus).unwrap_err().code,
        ErrorCode::InvalidHandle
    );
    assert_eq!(
        drv.event_query(EventHandle(s.0)).unwrap_err().code,
        ErrorCode::InvalidHandle
    );
    assert_eq!(
        drv.stream_destroy(StreamHandle(e.0)).unwrap_err().code,
        ErrorCode::InvalidHandle
    );
    let legacy = drv.legacy_stream(0).unwrap();
    assert_ne!(legacy, drv.legacy_stream(1).unwrap());
    assert_eq!(
        drv.stream_destroy(legacy).unwrap_err().code,
        ErrorCode::InvalidHandle
    );
    assert_eq!(
        drv.legacy_stream(2).unwrap_err().code,
        ErrorCode::InvalidDevice
    );
    assert_eq!(
        drv.stream_create(2, true).unwrap_err().code,
        ErrorCode::InvalidDevice
    );
    assert_eq!(
        drv.event_create(7).unwrap_err().code,
        ErrorCode::InvalidDevice
    );
    // Events are recorded on streams of their own device.
    let s1 = drv.stream_create(1, true).unwrap();
    assert_eq!(
        drv.event_record(e, s1).unwrap_err().code,
        ErrorCode::InvalidHandle
    );
    drv.stream_destroy(s).unwrap();
    assert_eq!(
        drv.stream_destroy(s).unwrap_err().code,
        ErrorCode::InvalidHandle
    );
    assert_eq!(
        drv.event_record(e, s).unwrap_err().code,
        ErrorCode::InvalidHandle
    );
    let p = drv.mem_alloc(0, 16).unwrap();
    assert_eq!(
        drv.memset_d8_async(p, 0, 16, s).unwrap_err().code,
        ErrorCode::InvalidHandle
    );
    drv.event_destroy(e).unwrap();
    assert_eq!(
        drv.event_destroy(e).unwrap_err().code,
        ErrorCode::InvalidHandle
    );
    assert_eq!(
        drv.stream_wait_event(s1, e).unwrap_err().code,
        ErrorCode::InvalidHandle
    );
    assert!(drv.context_error(0).is_none());
}

#[test]
fn an_event_never_recorded_is_complete() {
    let drv = driver();
    let e = drv.event_create(1).unwrap();
    drv.event_query(e).unwrap();
    drv.event_synchronize(e).unwrap();
    let s = drv.stream_create(0, true).unwrap();
    drv.stream_wait_event(s, e).unwrap();
    drv.stream_synchronize(s).unwrap();
}

#[test]
fn queries_report_pending_work() {
    let drv = driver();
    let s = drv.stream_create(0, true).unwrap();
    let scratch = drv.mem_alloc(0, BUSY_LEN).unwrap();
    let mut seen_pending = false;
    for _attempt in 0..5 {
        let e = busy(&drv, s, scratch);
        let (sq, eq) = (drv.stream_query(s), drv.event_query(e));
        for r in [&sq, &eq] {
            if let Err(err) = r {
                assert_eq!(err.code, ErrorCode::NotReady);
            }
        }
        drv.event_synchronize(e).unwrap();
        drv.event_query(e).unwrap();
        drv.stream_query(s).unwrap();
        let e2 = busy(&drv, s, scratch);
        drv.device_synchronize(0).unwrap();
        drv.event_query(e2).unwrap();
        drv.stream_query(s).unwrap();
        if sq.is_err() && eq.is_err() {
            seen_pending = true;
            break;
        }
    }
    assert!(seen_pending, "the queries never saw the busy work pending");
}

/// Producer on `p` writes `value`, records an event; consumer on `c` (maybe another
/// device) waits on it (if `wait`) and copies the bytes to its own buffer, then reads.
fn produce_consume(
    drv: &Driver,
    (p, pdev, pbuf): (StreamHandle, usize, u64),
    (c, cdev, cbuf): (StreamHandle, usize, u64),
    e: EventHandle,
    value: u8,
    n: usize,
    wait: bool,
) -> Vec<u8> {
    drv.memset_d8_async(pbuf, value, n, p).unwrap();
    drv.event_record(e, p).unwrap();
    if wait {
        drv.stream_wait_event(c, e).unwrap();
    }
    drv.memcpy_peer_async(cbuf, cdev, pbuf, pdev, n, c).unwrap();
    let out = read_on(drv, cbuf, n, c);
    drv.stream_synchronize(p).unwrap();
    out
}

#[test]
fn event_waits_order_streams_under_chaos() {
    let drv = driver();
    let n = 4096;
    for (pdev, cdev) in [(0, 0), (0, 1), (1, 0)] {
        let p = drv.stream_create(pdev, true).unwrap();
        let c = drv.stream_create(cdev, true).unwrap();
        let pbuf = drv.mem_alloc(pdev, n).unwrap();
        let cbuf = drv.mem_alloc(cdev, n).unwrap();
        let e = drv.event_create(pdev).unwrap();
        for seed in 0..40u64 {
            drv.set_chaos(Some(seed));
            let v = seed as u8 + 1;
            let out = produce_consume(&drv, (p, pdev, pbuf), (c, cdev, cbuf), e, v, n, true);
            assert!(
                out.iter().all(|&b| b == v),
                "devices {pdev}->{cdev}, seed {seed}: the consumer saw stale bytes"
            );
        }
    }
    drv.set_chaos(None);
}

#[test]
fn without_the_event_wait_the_race_is_observable() {
    let drv = driver();
    let n = 4096;
    for (pdev, cdev) in [(0, 0), (0, 1)] {
        let p = drv.stream_create(pdev, true).unwrap();
        let c = drv.stream_create(cdev, true).unwrap();
        let pbuf = drv.mem_alloc(pdev, n).unwrap();
        let cbuf = drv.mem_alloc(cdev, n).unwrap();
        let e = drv.event_create(pdev).unwrap();
        let stale = (0..RACE_ROUNDS).find(|&seed| {
            drv.set_chaos(Some(seed));
            let v = (seed % 250) as u8 + 1;
            let out = produce_consume(&drv, (p, pdev, pbuf), (c, cdev, cbuf), e, v, n, false);
            out.iter().any(|&b| b != v)
        });
        assert!(
            stale.is_some(),
            "devices {pdev}->{cdev}: {RACE_ROUNDS} chaos seeds and the unordered consumer never overtook the producer"
        );
    }
    drv.set_chaos(None);
}

#[test]
fn a_wait_uses_the_record_current_at_the_call() {
    let drv = driver();
    let n = 4096;
    let p = drv.stream_create(0, true).unwrap();
    let q = drv.stream_create(0, true).unwrap();
    let c = drv.stream_create(1, true).unwrap();
    let buf = drv.mem_alloc(0, n).unwrap();
    let out = drv.mem_alloc(1, n).unwrap();
    let e = drv.event_create(0).unwrap();
    let scratch = drv.mem_alloc(0, BUSY_LEN).unwrap();
    for seed in 0..8u64 {
        drv.set_chaos(Some(seed));
        let v = seed as u8 + 1;
        // The producer's write comes after busy work; the event captures the write.
        busy(&drv, p, scratch);
        drv.memset_d8_async(buf, v, n, p).unwrap();
        drv.event_record(e, p).unwrap();
        drv.stream_wait_event(c, e).unwrap();
        // Re-recorded on an idle stream: the earlier wait must not see this record.
        drv.event_record(e, q).unwrap();
        drv.memcpy_peer_async(out, 1, buf, 0, n, c).unwrap();
        let got = read_on(&drv, out, n, c);
        assert!(
            got.iter().all(|&b| b == v),
            "seed {seed}: the wait followed a later record"
        );
        drv.device_synchronize(0).unwrap();
    }
}

#[test]
fn blocking_streams_order_with_the_legacy_stream() {
    let drv = driver();
    let n = 1 << 16;
    let b = drv.stream_create(0, false).unwrap();
    let buf = drv.mem_alloc(0, n).unwrap();
    for seed in 0..40u64 {
        drv.set_chaos(Some(seed));
        let v = seed as u8 + 1;
        // A legacy-stream memset (returns at once), then a read on a blocking stream:
        // the read waits for the memset.
        drv.memset_d8(buf, v, n).unwrap();
        assert!(
            read_on(&drv, buf, n, b).iter().all(|&x| x == v),
            "seed {seed}: memset"
        );
        // A pageable htod (returns before landing), then a read on the blocking stream.
        drv.memcpy_htod(buf, &vec![v ^ 0x80; n]).unwrap();
        assert!(
            read_on(&drv, buf, n, b).iter().all(|&x| x == v ^ 0x80),
            "seed {seed}: htod"
        );
        // Work on the blocking stream, then the legacy stream's synchronous read.
        drv.memset_d8_async(buf, v ^ 0x40, n, b).unwrap();
        let mut out = vec![0u8; n];
        drv.memcpy_dtoh(&mut out, buf).unwrap();
        assert!(
            out.iter().all(|&x| x == v ^ 0x40),
            "seed {seed}: legacy after blocking"
        );
    }
    drv.set_chaos(None);
}

#[test]
fn legacy_stream_synchronize_covers_blocking_streams() {
    let drv = driver();
    let b = drv.stream_create(1, false).unwrap();
    let scratch = drv.mem_alloc(1, BUSY_LEN).unwrap();
    let e = busy(&drv, b, scratch);
    drv.stream_synchronize(drv.legacy_stream(1).unwrap())
        .unwrap();
    drv.event_query(e).unwrap();
    let nb = drv.stream_create(1, true).unwrap();
    let e = busy(&drv, nb, scratch);
    drv.stream_synchronize(drv.legacy_stream(1).unwrap())
        .unwrap();
    // Not ordered with a non-blocking stream: it is most likely still busy.
    let _ = drv.event_query(e);
    drv.stream_synchronize(nb).unwrap();
}

#[test]
fn non_blocking_streams_overtake_sync_htod_and_memset() {
    let drv = driver();
    let n = 4096;
    let nb = drv.stream_create(0, true).unwrap();
    let buf = drv.mem_alloc(0, n).unwrap();
    let overtaken = (0..RACE_ROUNDS).find(|&seed| {
        drv.set_chaos(Some(seed));
        let v = (seed % 250) as u8 + 1;
        drv.memcpy_htod(buf, &vec![v; n]).unwrap();
        read_on(&drv, buf, n, nb).iter().any(|&x| x != v)
    });
    assert!(
        overtaken.is_some(),
        "a non-blocking stream never overtook a pageable memcpy_htod in {RACE_ROUNDS} seeds"
    );
    let overtaken = (0..RACE_ROUNDS).find(|&seed| {
        drv.set_chaos(Some(seed));
        let v = (seed % 250) as u8 + 1;
        drv.memset_d8(buf, v, n).unwrap();
        read_on(&drv, buf, n, nb).iter().any(|&x| x != v)
    });
    assert!(
        overtaken.is_some(),
        "a non-blocking stream never overtook memset_d8 in {RACE_ROUNDS} seeds"
    );
    drv.set_chaos(None);
}

#[test]
fn destroy_drains_the_stream() {
    let drv = driver();
    let n = 32 << 20;
    let buf = drv.mem_alloc(0, n).unwrap();
    for non_blocking in [true, false] {
        let s = drv.stream_create(0, non_blocking).unwrap();
        drv.memset_d8_async(buf, 0x77 + non_blocking as u8, n, s)
            .unwrap();
        drv.stream_destroy(s).unwrap();
        let mut out = vec![0u8; n];
        drv.memcpy_dtoh(&mut out, buf).unwrap();
        assert!(out.iter().all(|&x| x == 0x77 + non_blocking as u8));
    }
}

#[test]
fn device_synchronize_waits_for_every_stream() {
    let drv = driver();
    let streams: Vec<_> = (0..3)
        .map(|i| drv.stream_create(0, i != 1).unwrap())
        .collect();
    let scratch = drv.mem_alloc(0, BUSY_LEN).unwrap();
    let events: Vec<_> = streams.iter().map(|&s| busy(&drv, s, scratch)).collect();
    drv.device_synchronize(0).unwrap();
    for e in events {
        drv.event_query(e).unwrap();
    }
    for s in streams {
        drv.stream_query(s).unwrap();
        drv.stream_destroy(s).unwrap();
    }
}

#[test]
fn chaos_is_configurable() {
    let drv = Driver::new(SimConfig {
        chaos_seed: Some(5),
        ..SimConfig::default()
    });
    assert_eq!(drv.config().chaos_seed, Some(5));
    drv.set_chaos(None);
    assert_eq!(drv.config().chaos_seed, None);
    drv.set_chaos(Some(9));
    assert_eq!(drv.config().chaos_seed, Some(9));
}

#[test]
fn a_pipeline_of_streams_across_devices_under_chaos() {
    let drv = driver();
    let n = 2048;
    // Stage i runs on device i % 2, blocking streams and non-blocking ones mixed, and
    // copies stage i-1's buffer into its own after waiting on stage i-1's event.
    let stages: Vec<(usize, StreamHandle, u64, EventHandle)> = (0..6)
        .map(|i| {
            let dev = i % 2;
            let s = drv.stream_create(dev, i % 3 != 0).unwrap();
            let buf = drv.mem_alloc(dev, n).unwrap();
            (dev, s, buf, drv.event_create(dev).unwrap())
        })
        .collect();
    for seed in 0..24u64 {
        drv.set_chaos(Some(seed));
        let v = seed as u8 + 1;
        let (_, s0, buf0, e0) = stages[0];
        drv.memset_d8_async(buf0, v, n, s0).unwrap();
        drv.event_record(e0, s0).unwrap();
        for w in stages.windows(2) {
            let (pdev, _, pbuf, pe) = w[0];
            let (cdev, cs, cbuf, ce) = w[1];
            drv.stream_wait_event(cs, pe).unwrap();
            drv.memcpy_peer_async(cbuf, cdev, pbuf, pdev, n, cs)
                .unwrap();
            drv.event_record(ce, cs).unwrap();
        }
        // Meanwhile, legacy-stream work on both devices (ordered only with the
        // blocking stages).
        for (_, _, buf, _) in &stages[..2] {
            drv.memset_d8(*buf, v, 16).unwrap();
        }
        let (_, last_s, last_buf, last_e) = stages[5];
        drv.event_synchronize(last_e).unwrap();
        let out = read_on(&drv, last_buf, n, last_s);
        assert!(out.iter().all(|&b| b == v), "seed {seed}");
        for dev in 0..2 {
            drv.device_synchronize(dev).unwrap();
        }
    }
    drv.set_chaos(None);
}

#[test]
fn many_host_threads_share_streams() {
    let drv = driver();
    let s = drv.stream_create(0, true).unwrap();
    let t = drv.stream_create(1, false).unwrap();
    drv.set_chaos(Some(3));
    std::thread::scope(|sc| {
        for k in 0..4u8 {
            let drv = &drv;
            sc.spawn(move || {
                let e = drv.event_create(0).unwrap();
                let a = drv.mem_alloc(0, 1024).unwrap();
                let b = drv.mem_alloc(1, 1024).unwrap();
                for i in 0..20u8 {
                    let v = k.wrapping_mul(50).wrapping_add(i);
                    drv.memset_d8_async(a, v, 1024, s).unwrap();
                    drv.event_record(e, s).unwrap();
                    drv.stream_wait_event(t, e).unwrap();
                    drv.memcpy_peer_async(b, 1, a, 0, 1024, t).unwrap();
                    let out = read_on(drv, b, 1024, t);
                    assert!(out.iter().all(|&x| x == v));
                }
                drv.event_destroy(e).unwrap();
            });
        }
    });
    drv.stream_destroy(s).unwrap();
    drv.stream_destroy(t).unwrap();
}

/// Timed events: the time between two records is that of the work between them on the
/// stream; untimed, unrecorded and pending events are errors, as the driver API says.
#[test]
fn timed_events_measure_the_work_between_them() {
    let drv = driver();
    let s = drv.stream_create(0, true).unwrap();
    let scratch = drv.mem_alloc(0, BUSY_LEN).unwrap();
    let (a, b) = (
        drv.event_create_timed(0).unwrap(),
        drv.event_create_timed(0).unwrap(),
    );
    let untimed = drv.event_create(0).unwrap();
    assert_eq!(
        drv.event_elapsed_ms(a, b).unwrap_err().code,
        ErrorCode::InvalidHandle,
        "never recorded"
    );
    drv.event_record(a, s).unwrap();
    drv.event_record(untimed, s).unwrap();
    let gate = busy(&drv, s, scratch);
    drv.memset_d8_async(scratch, 1, BUSY_LEN, s).unwrap();
    drv.event_record(b, s).unwrap();
    if drv.event_query(gate).is_err() {
        // Still busy: the end has not completed.
        assert_eq!(
            drv.event_elapsed_ms(a, b).unwrap_err().code,
            ErrorCode::NotReady
        );
    }
    drv.event_synchronize(b).unwrap();
    let ms = drv.event_elapsed_ms(a, b).unwrap();
    assert!(ms > 0.0, "two 64 MiB memsets took {ms} ms");
    assert!(
        drv.event_elapsed_ms(b, a).unwrap() < 0.0,
        "reversed: negative"
    );
    assert_eq!(
        drv.event_elapsed_ms(a, untimed).unwrap_err().code,
        ErrorCode::InvalidHandle
    );
    // A new record moves the start.
    drv.event_record(a, s).unwrap();
    drv.stream_synchronize(s).unwrap();
    assert!(drv.event_elapsed_ms(a, b).unwrap() <= 0.0);
}
