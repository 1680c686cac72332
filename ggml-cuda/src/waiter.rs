//! Host waits with a time limit. The driver has no timed wait: instead of polling an
//! event (a driver call per poll, and up to a pause's worth of latency after it
//! completes), a helper thread makes the blocking `cuEventSynchronize` and the caller
//! waits for its answer with a timeout. A wait that times out leaves its helper blocked
//! on the event (a hung device); the next wait starts another helper.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::Mutex;
use std::time::Duration;

use crate::driver::{Api, Ctx, CuError, Event};

type Job = (Event, SyncSender<Result<(), CuError>>);

/// One backend's helper thread, started at its first wait.
#[derive(Default)]
pub(crate) struct Waiter {
    jobs: Mutex<Option<Sender<Job>>>,
}

fn serve(api: &'static dyn Api, ctx: Ctx, jobs: Receiver<Job>) {
    let bound = api.bind(ctx);
    for (ev, answer) in jobs {
        let r = match bound {
            Ok(()) => api.event_synchronize(ev),
            Err(e) => Err(e),
        };
        // The caller may have given up (timed out): nobody to tell.
        let _ = answer.send(r);
    }
}

impl Waiter {
    /// Blocks until `ev` completed (`Ok(true)`) or `timeout` passed (`Ok(false)`).
    pub(crate) fn wait(
        &self,
        api: &'static dyn Api,
        ctx: Ctx,
        ev: Event,
        timeout: Duration,
    ) -> Result<bool, CuError> {
        let (tx, rx) = mpsc::sync_channel(1);
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let mut job = Some((ev, tx));
        if let Some(s) = jobs.as_ref() {
            if let Err(mpsc::SendError(j)) = s.send(job.take().expect("set above")) {
                // The helper is gone (it panicked): start another.
                job = Some(j);
            }
        }
        if let Some(j) = job {
            let (s, r) = mpsc::channel();
            std::thread::Builder::new()
                .name("ggml-cuda-waiter".into())
                .spawn(move || serve(api, ctx, r))
                .map_err(|_| CuError::new("cannot start a thread for a timed wait", 0))?;
            s.send(j)
                .map_err(|_| CuError::new("the timed-wait thread exited at once", 0))?;
            *jobs = Some(s);
        }
        match rx.recv_timeout(timeout) {
            Ok(r) => r.map(|()| true),
            Err(RecvTimeoutError::Timeout) => {
                // The helper stays blocked on this event; the next wait gets a new one.
                *jobs = None;
                Ok(false)
            }
            Err(RecvTimeoutError::Disconnected) => {
                *jobs = None;
                Err(CuError::new("the timed-wait thread panicked", 0))
            }
        }
    }
}
