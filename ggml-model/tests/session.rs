//! Sessions on a synthetic model: the fault-injection hook a harness plugs in, and the
//! synthetic model writer.

use std::any::Any;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use ggml_core::{Backend, DType};
use ggml_model::batch::Batch;
use ggml_model::error::{ModelError, Result};
use ggml_model::session::{FaultInjector, RunConfig, Session, SplitMode};
use ggml_model::synthetic::{synthetic_gguf, write_synthetic, SyntheticSpec};
use ggml_sched::{FaultKind, FaultPlan, FaultyBackend};

/// The tiny Q4_1 llama in the temporary folder, one file per test.
fn model(test: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "ggml-model-test-{}-{test}.gguf",
        std::process::id()
    ));
    write_synthetic(&SyntheticSpec::tiny(DType::Q4_1), &path).unwrap();
    path
}

fn config() -> RunConfig {
    RunConfig::simple("cpu:2".parse().unwrap(), SplitMode::Layer, 2, 2)
}

/// The logits of a 16-token prompt.
fn logits(session: &Session) -> Vec<f32> {
    let mut kv = session.kv_cache(32).unwrap();
    let mut exec = session.executor().unwrap();
    let mut batch = Batch::default();
    for i in 0..16 {
        batch.push(3 + i, i as i32, 0, true);
    }
    exec.forward(&session.model, &mut kv, &batch).unwrap()
}

/// Wraps `keep` of the devices (all of them: `usize::MAX`), device `faulty` with a kernel
/// fault at node `op`, the others with a fault that never comes.
#[derive(Debug)]
struct Injector {
    keep: usize,
    faulty: usize,
    op: usize,
}

impl fmt::Display for Injector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:kernel", self.faulty, self.op)
    }
}

impl FaultInjector for Injector {
    fn wrap(&self, backends: &[Arc<dyn Backend>]) -> Result<Vec<Arc<FaultyBackend>>> {
        if self.faulty >= backends.len() {
            return Err(ModelError::Usage(format!(
                "{self}: no device {}",
                self.faulty
            )));
        }
        Ok(backends
            .iter()
            .take(self.keep)
            .enumerate()
            .map(|(i, b)| {
                let op = if i == self.faulty {
                    self.op
                } else {
                    usize::MAX
                };
                let kind = FaultKind::Kernel;
                FaultyBackend::new(b.clone(), FaultPlan { op, kind })
            })
            .collect())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[test]
fn an_injected_fault_runs_through_the_wrappers_and_one_that_never_comes_changes_no_bit() {
    let path = model("wrappers");
    let clean = logits(&Session::open(&path, config()).unwrap());

    let mut cfg = config();
    let never = Injector {
        keep: usize::MAX,
        faulty: 1,
        op: usize::MAX,
    };
    cfg.inject_fault = Some(Arc::new(never));
    let session = Session::open(&path, cfg).unwrap();
    assert_eq!(session.faulty.len(), 2);
    let wrapped = logits(&session);
    assert!(session
        .faulty
        .iter()
        .all(|f| f.nodes_seen() > 0 && !f.fired()));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&wrapped), bits(&clean));
    let spec = session.config.inject_fault.as_ref().unwrap();
    assert_eq!(spec.as_any().downcast_ref::<Injector>().unwrap().faulty, 1);
    drop(session);

    let mut cfg = config();
    let kernel = Injector {
        keep: usize::MAX,
        faulty: 1,
        op: 0,
    };
    cfg.inject_fault = Some(Arc::new(kernel));
    let session = Session::open(&path, cfg).unwrap();
    let mut kv = session.kv_cache(32).unwrap();
    let mut exec = session.executor().unwrap();
    let mut batch = Batch::default();
    batch.push(3, 0, 0, true);
    let e = exec.forward(&session.model, &mut kv, &batch).unwrap_err();
    assert!(e.to_string().contains("injected kernel fault"), "{e}");
    assert!(session.faulty[1].fired() && !session.faulty[0].fired());
    drop((exec, kv, session));
    std::fs::remove_file(&path).ok();
}

#[test]
fn an_injector_that_refuses_or_wraps_too_few_devices_fails_the_open() {
    let path = model("refused");
    let mut cfg = config();
    cfg.inject_fault = Some(Arc::new(Injector {
        keep: usize::MAX,
        faulty: 2,
        op: 0,
    }));
    let e = Session::open(&path, cfg).unwrap_err().to_string();
    assert_eq!(e, "2:0:kernel: no device 2");

    let mut cfg = config();
    cfg.inject_fault = Some(Arc::new(Injector {
        keep: 1,
        faulty: 0,
        op: 0,
    }));
    let e = Session::open(&path, cfg).unwrap_err().to_string();
    assert!(e.contains("0:0:kernel: 1 wrappers for 2 devices"), "{e}");
    std::fs::remove_file(&path).ok();
}

#[test]
fn the_synthetic_writer_makes_the_folder_replaces_a_stale_file_and_leaves_no_temporary() {
    let dir = std::env::temp_dir().join(format!("ggml-model-test-{}-writer", std::process::id()));
    let path = dir.join("sub").join("m.gguf");
    let spec = SyntheticSpec::tiny(DType::F16);
    write_synthetic(&spec, &path).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), synthetic_gguf(&spec));

    std::fs::write(&path, b"stale").unwrap();
    write_synthetic(&spec, &path).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), synthetic_gguf(&spec));
    let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["m.gguf"], "no temporary file left");

    let e = write_synthetic(&spec, std::path::Path::new("/")).unwrap_err();
    assert!(matches!(e, ModelError::Usage(_)), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}
