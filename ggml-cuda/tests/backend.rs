//! Backend creation and capabilities: libcuda's clean failure without a GPU, and virtual
//! devices on the driver under test (cuda-sim unless `GGML_RS_REQUIRE_GPU` is set).

use ggml_core::{Backend, BackendErrorKind, CopyQueue};
use ggml_cuda::{driver, CudaBackend, DriverKind};

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
            println!(
                "libcuda unavailable, as expected without a GPU: {}",
                why.what
            );
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

/// libcuda where a GPU is required (`GGML_RS_REQUIRE_GPU`), cuda-sim otherwise.
fn driver_under_test() -> DriverKind {
    if std::env::var_os("GGML_RS_REQUIRE_GPU").is_some() {
        DriverKind::Cuda
    } else {
        DriverKind::Sim
    }
}

#[test]
fn virtual_devices_have_own_streams_and_domains() {
    let kind = driver_under_test();
    let v = CudaBackend::new_virtual_with(kind, 0, 2).expect("two instances on device 0");
    let p = kind.prefix();
    assert_eq!(v[0].name().as_str(), format!("{p}:0#0"));
    assert_eq!(v[1].name().as_str(), format!("{p}:0#1"));
    assert_eq!(v[0].driver_kind(), kind);
    assert_ne!(v[0].domain(), v[1].domain());
    assert!(v[0].supports_domain(v[0].domain()) && !v[0].supports_domain(v[1].domain()));
    let caps = v[0].caps();
    assert!(caps.events && caps.async_compute);
    assert_eq!(caps.copy_queue, CopyQueue::Source);
    assert!(v[0].can_wait_on(&v[1]));
}
