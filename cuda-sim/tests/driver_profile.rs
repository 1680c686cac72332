//! Profiling through the emulated driver: records in launch order with their tags,
//! the L2 model persisting across launches until reset, sampling, and off by default.

use cuda_sim::cost::GpuSpec;
use cuda_sim::driver::{Driver, ProfileConfig, SimConfig, StreamHandle};
use cuda_sim::ErrorCode;

const PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64
.visible .entry scale(.param .u64 p_x, .param .u32 p_n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<3>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd0, [p_x];
    ld.param.u32 %r0, [p_n];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mad.lo.u32 %r4, %r1, %r2, %r3;
    setp.ge.u32 %p0, %r4, %r0;
    @%p0 bra DONE;
    mul.wide.u32 %rd1, %r4, 4;
    add.u64 %rd2, %rd0, %rd1;
    ld.global.f32 %f0, [%rd2];
    mul.rn.f32 %f1, %f0, 0f40000000;
    st.global.f32 [%rd2], %f1;
DONE:
    ret;
}
"#;

const N: usize = 1 << 14;

struct Setup {
    d: std::sync::Arc<Driver>,
    f: cuda_sim::driver::FunctionHandle,
    x: u64,
    s: StreamHandle,
}

fn setup() -> Setup {
    let d = Driver::new(SimConfig {
        devices: 1,
        ..SimConfig::default()
    });
    let m = d.module_load(0, "scale.ptx", PTX).unwrap();
    let f = d.module_function(m, "scale").unwrap();
    let x = d.mem_alloc(0, N * 4).unwrap();
    d.memcpy_htod(x, &vec![0u8; N * 4]).unwrap();
    // A pageable copy may return before its DMA ends, and the non-blocking stream below
    // does not order after the NULL stream it ran on: wait for it.
    d.device_synchronize(0).unwrap();
    let s = d.stream_create(0, true).unwrap();
    Setup { d, f, x, s }
}

impl Setup {
    fn launch(&self) {
        let args: [&[u8]; 2] = [&self.x.to_le_bytes(), &(N as u32).to_le_bytes()];
        self.d
            .launch(
                self.f,
                [(N / 256) as u32, 1, 1],
                [256, 1, 1],
                0,
                self.s,
                &args,
            )
            .unwrap();
    }
}

#[test]
fn nothing_is_recorded_with_profiling_off() {
    let t = setup();
    assert_eq!(t.d.profiling(), None);
    t.launch();
    t.d.stream_synchronize(t.s).unwrap();
    assert!(t.d.take_launch_records().is_empty());
}

#[test]
fn records_in_launch_order_with_tags_and_an_l2_across_launches() {
    let t = setup();
    t.d.enable_profiling(ProfileConfig::new(GpuSpec::h200()));
    assert!(t.d.profiling().is_some());
    t.d.set_launch_tag(t.s, Some(11)).unwrap();
    t.launch();
    t.d.set_launch_tag(t.s, Some(12)).unwrap();
    t.launch();
    t.d.set_launch_tag(t.s, None).unwrap();
    t.launch();
    t.d.stream_synchronize(t.s).unwrap();
    let r = t.d.take_launch_records();
    assert_eq!(r.len(), 3);
    assert_eq!(
        r.iter().map(|r| r.tag).collect::<Vec<_>>(),
        [Some(11), Some(12), None]
    );
    assert!(r.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(r
        .iter()
        .all(|r| r.kernel == "scale" && r.module_file == "scale.ptx"));
    assert!(r.iter().all(|r| r.stream == t.s && r.device == 0));
    let sectors = N as u64 / 8;
    let dram: Vec<(u64, u64)> = r
        .iter()
        .map(|r| {
            let d = r.counters.dram.expect("the L2 model ran");
            (d.read_sectors, d.write_sectors)
        })
        .collect();
    // First touch reads and dirties every sector; the next passes find them resident.
    assert_eq!(dram, [(sectors, sectors), (0, 0), (0, 0)]);
    assert_eq!(r[0].counters.global_load.sectors, sectors);
    assert!(t.d.take_launch_records().is_empty(), "taken once");

    t.d.reset_l2();
    t.launch();
    t.d.stream_synchronize(t.s).unwrap();
    let r = t.d.take_launch_records();
    assert_eq!(r[0].counters.dram.unwrap().read_sectors, sectors);
    assert_eq!(r[0].seq, 3);

    t.d.disable_profiling();
    t.launch();
    t.d.stream_synchronize(t.s).unwrap();
    assert!(t.d.take_launch_records().is_empty());
}

#[test]
fn sampling_interprets_a_subset_and_scales() {
    let t = setup();
    t.d.enable_profiling(ProfileConfig {
        gpu: GpuSpec::h100_sxm(),
        sample_blocks: Some(4),
        stall_lines: false,
    });
    t.launch();
    t.d.stream_synchronize(t.s).unwrap();
    let r = t.d.take_launch_records();
    let c = &r[0].counters;
    assert_eq!((c.blocks, c.blocks_interpreted), (64, 4));
    assert_eq!(c.global_load.sectors, N as u64 / 8);
    // 14 instructions a thread, the guarded `bra` taken by none of them: 13 count.
    assert_eq!(c.thread_instructions, 13 * N as u64);
    assert_eq!(c.warp_instructions, 14 * N as u64 / 32);
}

#[test]
fn a_tag_on_an_unknown_stream_is_an_invalid_handle() {
    let t = setup();
    let e =
        t.d.set_launch_tag(StreamHandle(999_999), Some(1))
            .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidHandle);
}
