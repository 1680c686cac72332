//! Backend creation and capabilities; runs with or without a GPU.

use ggml_core::{Backend, BackendErrorKind, CopyQueue};
use ggml_cuda::{driver, CudaBackend};

#[test]
fn creation_fails_cleanly_without_a_usable_driver() {
    match driver() {
        Err(why) => {
            let e = CudaBackend::new(0, 0)
                .err()
                .expect("no driver, yet a backend");
            assert_eq!(e.kind, BackendErrorKind::Unavailable);
            assert_eq!(e.detail, why.what);
            assert!(e.to_string().contains("cuda:0#0"), "{e}");
            assert!(CudaBackend::device_count().is_err());
            assert!(CudaBackend::new_virtual(0, 2).is_err());
            assert!(
                std::env::var_os("GGML_RS_REQUIRE_GPU").is_none(),
                "GGML_RS_REQUIRE_GPU is set but the driver cannot be used: {}",
                why.what
            );
            println!("skipped GPU part: {}", why.what);
        }
        Ok(()) => {
            let n = CudaBackend::device_count().expect("device count");
            let e = CudaBackend::new(n + 7, 0)
                .err()
                .expect("ordinal past the last GPU");
            assert_eq!(e.kind, BackendErrorKind::Unavailable);
        }
    }
}

#[test]
fn virtual_devices_have_own_streams_and_domains() {
    let v = match CudaBackend::new_virtual(0, 2) {
        Ok(v) => v,
        Err(e) => {
            assert!(
                std::env::var_os("GGML_RS_REQUIRE_GPU").is_none(),
                "GGML_RS_REQUIRE_GPU is set but no GPU can be used: {e}"
            );
            println!("skipped: {e}");
            return;
        }
    };
    assert_eq!(v[0].name().as_str(), "cuda:0#0");
    assert_eq!(v[1].name().as_str(), "cuda:0#1");
    assert_ne!(v[0].domain(), v[1].domain());
    assert!(v[0].supports_domain(v[0].domain()) && !v[0].supports_domain(v[1].domain()));
    let caps = v[0].caps();
    assert!(caps.events && caps.async_compute);
    assert_eq!(caps.copy_queue, CopyQueue::Source);
    assert!(v[0].can_wait_on(&v[1]));
}
