//! `graph_compute` of a [`CudaBackend`]: a split's steps launched one by one, or captured
//! into a CUDA graph and replayed (see [`crate::graphs`] for when).
//!
//! Before anything of a split is launched or captured, the scratch is sized for all of
//! its nodes and the pending uploads are flushed, so that a capture contains only
//! launches, copies and memsets on the stream: nothing allocates, frees, synchronises or
//! copies through pageable memory inside it (the driver would refuse, and cuda-sim
//! checks it).

use std::sync::atomic::Ordering;

use ggml_core::{BackendResult, Name, Tensor, TensorId};

use crate::backend::{CudaBackend, State};
use crate::driver::Api;
use crate::err_words::REGION_WORDS;
use crate::fusion::{self, Step};
use crate::graphs::{self, Captured, Entry};
use crate::kernels::KernelId;
use crate::launch::{Args, LaunchDims};
use crate::uploads::Scatter;

fn lock_class(be: &CudaBackend) -> std::sync::MutexGuard<'_, Option<crate::MulMatClass>> {
    be.last_class.lock().unwrap_or_else(|e| e.into_inner())
}

impl CudaBackend {
    /// The body of `graph_compute`.
    pub(crate) fn compute_steps(
        &self,
        tensors: &[Tensor],
        nodes: &[TensorId],
    ) -> BackendResult<()> {
        self.bind()?;
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut *guard;
        let steps = fusion::plan(tensors, nodes, &st.tuning);
        if st.timer.is_some() {
            // Each step (a node, or a fused run as one) has its own time; never captured.
            self.flush_uploads(st, false)?;
            return self.run_timed_steps(st, tensors, nodes, &steps);
        }
        let need = nodes
            .iter()
            .map(|&id| crate::ops::scratch_need(tensors, id))
            .max()
            .unwrap_or(0);
        if need > 0 {
            self.scratch(st, need)?;
        }
        // While launches are recorded, every one is made from the host so each is seen
        // (and tagged for cuda-sim's profiler); a prompt's split is never captured.
        if !st.tuning.graphs || st.recorded.is_some() || graphs::prompt_sized(tensors, nodes) {
            self.flush_uploads(st, false)?;
            return self.run_steps(st, tensors, nodes, &steps);
        }
        let scatter = self.flush_uploads(st, true)?;
        let extra = scatter.map(|s| s.key_words());
        let extra: &[u64] = extra.as_ref().map_or(&[], |e| &e[..]);
        let Some(key) = st
            .key
            .build(tensors, nodes, &steps, &st.tuning, st.scratch, extra)
        else {
            // A bad node id: the eager path reports it.
            return self.run_eager(st, tensors, nodes, &steps, scatter);
        };
        match st.graphs.find(key) {
            Some(i) if st.graphs.entry(i).captured.is_some() => self.replay(st, i, true),
            Some(i) => self.capture(st, i, tensors, nodes, &steps, scatter),
            None => {
                if let Some(old) = st.graphs.insert(key) {
                    self.drop_entry(st, old);
                }
                self.run_eager(st, tensors, nodes, &steps, scatter)
            }
        }
    }

    /// `steps` launched one by one, after the scatter of a folded upload.
    fn run_eager(
        &self,
        st: &mut State,
        tensors: &[Tensor],
        nodes: &[TensorId],
        steps: &[Step],
        scatter: Option<Scatter>,
    ) -> BackendResult<()> {
        if let Some(s) = scatter {
            self.launch_scatter(st, s)?;
        }
        self.run_steps(st, tensors, nodes, steps)
    }

    fn run_steps(
        &self,
        st: &mut State,
        tensors: &[Tensor],
        nodes: &[TensorId],
        steps: &[Step],
    ) -> BackendResult<()> {
        for &step in steps {
            match step {
                Step::Node(i) => crate::ops::run(self, st, tensors, nodes[i])?,
                Step::Fused { fusion, start, end } => {
                    crate::ops::run_fused(self, st, tensors, &nodes[start..end], fusion)?
                }
            }
        }
        Ok(())
    }

    fn run_timed_steps(
        &self,
        st: &mut State,
        tensors: &[Tensor],
        nodes: &[TensorId],
        steps: &[Step],
    ) -> BackendResult<()> {
        for &step in steps {
            match step {
                Step::Node(i) => match ggml_core::OpTime::key_of(tensors, nodes[i]) {
                    Some(key) => self
                        .run_timed(st, key, |be, st| crate::ops::run(be, st, tensors, nodes[i]))?,
                    None => crate::ops::run(self, st, tensors, nodes[i])?,
                },
                Step::Fused { fusion, start, end } => {
                    let run = &nodes[start..end];
                    self.run_timed(st, fusion.key(tensors, run), |be, st| {
                        crate::ops::run_fused(be, st, tensors, run, fusion)
                    })?
                }
            }
        }
        Ok(())
    }

    /// Launches the scatter of a flushed upload batch.
    pub(crate) fn launch_scatter(&self, st: &mut State, s: Scatter) -> BackendResult<()> {
        let f = self.dev.kernels.get(KernelId::UploadScatter);
        let d = LaunchDims {
            grid: (s.n, s.chunks, 1),
            block: (256, 1, 1),
            shared: 0,
            programmatic: false,
        };
        let mut a = Args::new();
        a.u64(s.buf).u64(s.desc).u32(s.n);
        // While recording, tagged and recorded like every node's launch (see ops).
        let tag = st.recorded.as_ref().map(|r| r.len() as u64);
        if tag.is_some() {
            self.api().set_launch_tag(self.stream, tag);
        }
        self.api().launch(f, &d, self.stream, &mut a).map_err(|e| {
            self.cu(e)
                .at("set_tensor_async", Name::new("upload_scatter"))
        })?;
        self.launches[KernelId::UploadScatter as usize].fetch_add(1, Ordering::Relaxed);
        st.record(
            (KernelId::UploadScatter, f),
            ("UPLOAD_SCATTER", None),
            Name::new("upload_scatter"),
            d,
            0,
            &a,
        );
        Ok(())
    }

    /// Launches the graph of entry `i`; `count_kernels`: add its kernels to the kernel
    /// statistics (a capture counted them already for its first launch).
    fn replay(&self, st: &mut State, i: usize, count_kernels: bool) -> BackendResult<()> {
        let c = st
            .graphs
            .entry(i)
            .captured
            .as_mut()
            .expect("replayed entries are captured");
        self.api()
            .graph_launch(c.exec, self.stream)
            .map_err(|e| self.cu(e))?;
        self.counters.replayed(&c.tally);
        c.armed = true;
        if count_kernels {
            for &(k, n) in &c.kernels {
                self.launches[k as usize].fetch_add(n, Ordering::Relaxed);
            }
            for (l, n) in self.class_launches.iter().zip(c.classes) {
                l.fetch_add(n, Ordering::Relaxed);
            }
        }
        if let Some(class) = c.last_class {
            *lock_class(self) = Some(class);
        }
        Ok(())
    }

    /// Captures the launches of `steps` (with the scatter of a folded upload) into the
    /// graph of entry `i`, instantiates it and launches it. Without a free error-word
    /// region (every graph region waits for a check) the steps run one by one instead.
    #[allow(clippy::too_many_arguments)]
    fn capture(
        &self,
        st: &mut State,
        i: usize,
        tensors: &[Tensor],
        nodes: &[TensorId],
        steps: &[Step],
        scatter: Option<Scatter>,
    ) -> BackendResult<()> {
        let Some(region) = st.err.take_free() else {
            return self.run_eager(st, tensors, nodes, steps, scatter);
        };
        let api = self.api();
        let before: Vec<u64> = self
            .launches
            .iter()
            .map(|l| l.load(Ordering::Relaxed))
            .collect();
        let classes_before: [u64; 3] =
            std::array::from_fn(|i| self.class_launches[i].load(Ordering::Relaxed));
        if let Err(e) = api.stream_begin_capture(self.stream) {
            st.err.give_back(region);
            return Err(self.cu(e));
        }
        self.counters.begin_capture();
        st.capturing = true;
        st.err.capturing = Some((region, Vec::new()));
        let run = (|| -> BackendResult<()> {
            if let Some(s) = scatter {
                self.launch_scatter(st, s)?;
            }
            self.run_steps(st, tensors, nodes, steps)?;
            // The graph ends by copying its error words to their mirror.
            let n = st.err.capturing.as_ref().map_or(0, |(_, u)| u.len());
            if n > 0 {
                let w = region * REGION_WORDS;
                // SAFETY: the region's words of the pinned mirror, which only this
                // graph's replays write; the host reads them after a synchronisation
                // (or, racing a replay, word by word with volatile reads).
                unsafe {
                    api.memcpy_dtoh_pinned_async(
                        self.err_host.add(w) as *mut u8,
                        self.err_word + 4 * w as u64,
                        4 * n.min(REGION_WORDS),
                        self.stream,
                    )
                }
                .map_err(|e| self.cu(e))?;
            }
            Ok(())
        })();
        let (_, users) = st.err.capturing.take().unwrap_or_default();
        st.capturing = false;
        let ended = api.stream_end_capture(self.stream);
        let tally = self.counters.end_capture();
        let graph = match (run, ended) {
            (Ok(()), Ok(g)) => g,
            (run, ended) => {
                // Nothing of the capture ran: take back what it counted.
                if let Ok(g) = ended {
                    api.graph_destroy(g);
                }
                for (l, b) in self.launches.iter().zip(&before) {
                    l.store(*b, Ordering::Relaxed);
                }
                for (c, b) in self.class_launches.iter().zip(classes_before) {
                    c.store(b, Ordering::Relaxed);
                }
                st.err.give_back(region);
                return Err(match (run, ended) {
                    (Err(e), _) => e,
                    (_, Err(e)) => self.cu(e),
                    _ => unreachable!("handled above"),
                });
            }
        };
        let exec = api.graph_instantiate(graph);
        api.graph_destroy(graph);
        let exec = match exec {
            Ok(e) => e,
            Err(e) => {
                st.err.give_back(region);
                return Err(self.cu(e));
            }
        };
        self.counters.captured();
        let kernels = self
            .launches
            .iter()
            .zip(&before)
            .enumerate()
            .filter_map(|(k, (l, b))| {
                let n = l.load(Ordering::Relaxed) - b;
                (n > 0).then_some((KernelId::ALL[k], n))
            })
            .collect();
        let mut classes = [0; 3];
        for ((n, c), b) in classes
            .iter_mut()
            .zip(&self.class_launches)
            .zip(classes_before)
        {
            *n = c.load(Ordering::Relaxed) - b;
        }
        st.graphs.entry(i).captured = Some(Captured {
            exec,
            tally,
            kernels,
            classes,
            last_class: *lock_class(self),
            region,
            users,
            armed: false,
        });
        self.replay(st, i, false)
    }

    /// Lets go of an entry's graph: the executable graph is destroyed (a launch in flight
    /// completes), and its error region is checked once more at the next synchronisation
    /// if it ran since the last one.
    pub(crate) fn drop_entry(&self, st: &mut State, e: Entry) {
        let Some(c) = e.captured else { return };
        self.api().graph_exec_destroy(c.exec);
        match c.armed {
            true => st.err.retired.push((c.region, c.users)),
            false => st.err.give_back(c.region),
        }
    }

    /// Forgets every key and graph (the memory their launches use is about to change).
    pub(crate) fn clear_graphs(&self, st: &mut State) {
        for e in st.graphs.take_all() {
            self.drop_entry(st, e);
        }
    }

    /// A kernel error that a graph replay already mirrored to the host, without waiting
    /// (it stays for the next synchronisation to report).
    pub(crate) fn replayed_kernel_error(&self, st: &mut State) -> BackendResult<()> {
        let regions: Vec<_> = st
            .graphs
            .captured_mut()
            .filter(|c| c.armed)
            .map(|c| (c.region, c.users.clone()))
            .chain(st.err.retired.iter().cloned())
            .collect();
        for (region, users) in regions {
            if let Some(e) = self.region_error(region, &users) {
                return Err(e);
            }
        }
        Ok(())
    }
}
