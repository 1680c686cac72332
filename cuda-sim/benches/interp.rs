//! Interpreter speed in warp-instructions per second: a warp-per-row dot product (the
//! shape of the project's mul_mat kernels: a strided loop, fma, a shfl.xor reduction).
//! `GGML_SIM_BENCH_THREADS` sets the host threads (default 1). A second case runs the
//! same launch with the profiler's counters on.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use cuda_sim::exec::{launch, launch_profiled, LaunchConfig};
use cuda_sim::fault::Checks;
use cuda_sim::mem::FlatMemory;
use cuda_sim::profile::ProfileOptions;
use cuda_sim::ptx::Module;

const PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64
.visible .entry dot(.param .u64 p_a, .param .u64 p_x, .param .u64 p_out, .param .u32 p_k)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .f32 %f<6>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd0, [p_a];
    ld.param.u64 %rd1, [p_x];
    ld.param.u64 %rd2, [p_out];
    ld.param.u32 %r0, [p_k];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mul.wide.u32 %rd3, %r2, %r0;
    shl.b64 %rd3, %rd3, 2;
    add.u64 %rd0, %rd0, %rd3;
    mov.f32 %f0, 0f00000000;
    mov.u32 %r3, %r1;
LOOP:
    setp.ge.u32 %p0, %r3, %r0;
    @%p0 bra REDUCE;
    mul.wide.u32 %rd4, %r3, 4;
    add.u64 %rd5, %rd0, %rd4;
    add.u64 %rd6, %rd1, %rd4;
    ld.global.f32 %f1, [%rd5];
    ld.global.f32 %f2, [%rd6];
    fma.rn.f32 %f0, %f1, %f2, %f0;
    add.u32 %r3, %r3, 32;
    bra LOOP;
REDUCE:
    shfl.sync.bfly.b32 %f3, %f0, 16, 31, 0xffffffff;
    add.rn.f32 %f0, %f0, %f3;
    shfl.sync.bfly.b32 %f3, %f0, 8, 31, 0xffffffff;
    add.rn.f32 %f0, %f0, %f3;
    shfl.sync.bfly.b32 %f3, %f0, 4, 31, 0xffffffff;
    add.rn.f32 %f0, %f0, %f3;
    shfl.sync.bfly.b32 %f3, %f0, 2, 31, 0xffffffff;
    add.rn.f32 %f0, %f0, %f3;
    shfl.sync.bfly.b32 %f3, %f0, 1, 31, 0xffffffff;
    add.rn.f32 %f0, %f0, %f3;
    setp.ne.u32 %p1, %r1, 0;
    @%p1 bra DONE;
    mul.wide.u32 %rd7, %r2, 4;
    add.u64 %rd8, %rd2, %rd7;
    st.global.f32 [%rd8], %f0;
DONE:
    ret;
}
"#;

fn bench(c: &mut Criterion) {
    let threads: usize = std::env::var("GGML_SIM_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let (k, rows) = (1024usize, 256usize);
    let module = Module::parse("dot.ptx", PTX).expect("parses");
    let base = 0x1000_0000u64;
    let mem = FlatMemory::new(base, (k * rows + k + rows) * 4, true);
    let a: Vec<u8> = (0..k * rows)
        .flat_map(|i| ((i % 7) as f32).to_le_bytes())
        .collect();
    let x: Vec<u8> = (0..k)
        .flat_map(|i| ((i % 5) as f32).to_le_bytes())
        .collect();
    mem.write(base, &a);
    let xa = base + (k * rows * 4) as u64;
    mem.write(xa, &x);
    let out = xa + (k * 4) as u64;
    let args: [Vec<u8>; 4] = [
        base.to_le_bytes().to_vec(),
        xa.to_le_bytes().to_vec(),
        out.to_le_bytes().to_vec(),
        (k as u32).to_le_bytes().to_vec(),
    ];
    let argv: Vec<&[u8]> = args.iter().map(|v| v.as_slice()).collect();
    let cfg = LaunchConfig {
        grid: [rows as u32, 1, 1],
        block: [32, 1, 1],
        dynamic_shared: 0,
    };
    let run = || launch(&module, "dot", &cfg, &argv, &mem, Checks::ALL, threads).expect("runs");
    let per_launch = run().warp_instructions;
    let mut g = c.benchmark_group("interp");
    g.throughput(Throughput::Elements(per_launch));
    g.bench_function(format!("dot_k{k}_rows{rows}_threads{threads}"), |b| {
        b.iter(run)
    });
    // The same launch with the profiler's counters on.
    let opts = ProfileOptions::default();
    let run_profiled = || {
        launch_profiled(
            &module,
            "dot",
            &cfg,
            &argv,
            &mem,
            Checks::ALL,
            threads,
            &opts,
        )
        .expect("runs")
    };
    g.bench_function(
        format!("dot_k{k}_rows{rows}_threads{threads}_profiled"),
        |b| b.iter(run_profiled),
    );
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
