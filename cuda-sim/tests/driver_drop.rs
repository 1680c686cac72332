//! Dropping the driver waits for queued work and joins every worker thread. One test in
//! this binary (its own process), so that the thread count is not disturbed by other
//! tests.

use cuda_sim::driver::{Driver, SimConfig};

/// Threads of this process.
#[cfg(target_os = "linux")]
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[cfg(not(target_os = "linux"))]
fn threads() -> usize {
    0
}

/// Threads of this process once it has `want` of them, or after a second. A joined
/// thread can stay listed in `/proc/self/task` for a moment: the join returns when the
/// kernel clears the thread's id word, slightly before it removes the task.
fn threads_settled(want: usize) -> usize {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        let n = threads();
        if n == want || std::time::Instant::now() >= until {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn dropping_the_driver_joins_its_workers() {
    let before = threads();
    for round in 0..3 {
        let drv = Driver::new(SimConfig {
            devices: 2,
            memory_per_device: 1 << 30,
            chaos_seed: Some(round),
            ..SimConfig::default()
        });
        let mut streams = Vec::new();
        for dev in 0..2 {
            for non_blocking in [true, false] {
                streams.push((dev, drv.stream_create(dev, non_blocking).unwrap()));
            }
        }
        if cfg!(target_os = "linux") {
            assert_eq!(
                threads(),
                before + 2 + streams.len(),
                "one worker per stream"
            );
        }
        // Queued work, an event chain across devices, and a destroyed stream.
        let e = drv.event_create(0).unwrap();
        let big = drv.mem_alloc(0, 16 << 20).unwrap();
        let other = drv.mem_alloc(1, 16 << 20).unwrap();
        drv.memset_d8_async(big, 1, 16 << 20, streams[0].1).unwrap();
        drv.event_record(e, streams[0].1).unwrap();
        drv.stream_wait_event(streams[2].1, e).unwrap();
        drv.memcpy_peer_async(other, 1, big, 0, 16 << 20, streams[2].1)
            .unwrap();
        drv.memset_d8(big, 2, 16 << 20).unwrap();
        drv.stream_destroy(streams[1].1).unwrap();
        if cfg!(target_os = "linux") {
            let want = before + 2 + streams.len() - 1;
            assert_eq!(threads_settled(want), want, "destroy joins");
        }
        let pinned = drv.mem_alloc_host(1 << 20).unwrap();
        assert!(!pinned.is_null());
        drop(drv);
        if cfg!(target_os = "linux") {
            assert_eq!(
                threads_settled(before),
                before,
                "round {round}: every worker joined"
            );
        }
    }
}
