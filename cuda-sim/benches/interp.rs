//! Interpreter speed in warp-instructions per second: a warp-per-row dot product (the
//! shape of the project's mul_mat kernels: a strided loop, fma, a shfl.xor reduction).
//! `GGML_SIM_BENCH_THREADS` sets the host threads (default 1). A second case runs the
//! same launch with the profiler's counters on. Then tensor-core instructions per
//! second: chains of `mma.sync` m16n8k16 (f16, under the approx check and with the
//! accumulation model) and m16n8k32 (s8).

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
        programmatic: false,
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

/// One warp: `p_iters` rounds of four independent mma chains (`MMA` with the operand
/// lists `{d}, {a}, {b}, {d}`).
const MMA_PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64
.visible .entry mma(.param .u32 p_iters, .param .u64 p_out)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>, %a<4>, %b<2>;
    .reg .b32 %c<16>;
    .reg .b64 %rd<2>;
    mov.u32 %r0, %tid.x;
    or.b32 %a0, %r0, 0x3C003800;
    or.b32 %a1, %r0, 0x38003C00;
    or.b32 %a2, %r0, 0x34003C00;
    or.b32 %a3, %r0, 0x3C003400;
    or.b32 %b0, %r0, 0x2C003000;
    or.b32 %b1, %r0, 0x30002C00;
    mov.b32 %c0, 0; mov.b32 %c1, 0; mov.b32 %c2, 0; mov.b32 %c3, 0;
    mov.b32 %c4, 0; mov.b32 %c5, 0; mov.b32 %c6, 0; mov.b32 %c7, 0;
    mov.b32 %c8, 0; mov.b32 %c9, 0; mov.b32 %c10, 0; mov.b32 %c11, 0;
    mov.b32 %c12, 0; mov.b32 %c13, 0; mov.b32 %c14, 0; mov.b32 %c15, 0;
    ld.param.u32 %r1, [p_iters];
LOOP:
    setp.eq.u32 %p0, %r1, 0;
    @%p0 bra DONE;
    MMA {%c0, %c1, %c2, %c3}, {%a0, %a1, %a2, %a3}, {%b0, %b1}, {%c0, %c1, %c2, %c3};
    MMA {%c4, %c5, %c6, %c7}, {%a0, %a1, %a2, %a3}, {%b0, %b1}, {%c4, %c5, %c6, %c7};
    MMA {%c8, %c9, %c10, %c11}, {%a0, %a1, %a2, %a3}, {%b0, %b1}, {%c8, %c9, %c10, %c11};
    MMA {%c12, %c13, %c14, %c15}, {%a0, %a1, %a2, %a3}, {%b0, %b1}, {%c12, %c13, %c14, %c15};
    sub.u32 %r1, %r1, 1;
    bra LOOP;
DONE:
    ld.param.u64 %rd0, [p_out];
    mul.wide.u32 %rd1, %r0, 4;
    add.u64 %rd0, %rd0, %rd1;
    st.global.b32 [%rd0], %c0;
    ret;
}
"#;

fn bench_mma(c: &mut Criterion) {
    let base = 0x1000_0000u64;
    let mem = FlatMemory::new(base, 4096, false);
    let iters = 64u32;
    let args: [Vec<u8>; 2] = [iters.to_le_bytes().to_vec(), base.to_le_bytes().to_vec()];
    let argv: Vec<&[u8]> = args.iter().map(|v| v.as_slice()).collect();
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        dynamic_shared: 0,
        programmatic: false,
    };
    let model = Checks {
        approx_at_bound: false,
        ..Checks::ALL
    };
    let mut g = c.benchmark_group("mma");
    g.throughput(Throughput::Elements(4 * iters as u64));
    for (name, instr, checks) in [
        (
            "f16_at_bound",
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
            Checks::ALL,
        ),
        (
            "f16_model",
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
            model,
        ),
        (
            "s8",
            "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32",
            Checks::ALL,
        ),
    ] {
        let module = Module::parse("mma.ptx", &MMA_PTX.replace("MMA", instr)).expect("parses");
        g.bench_function(name, |b| {
            b.iter(|| launch(&module, "mma", &cfg, &argv, &mem, checks, 1).expect("runs"))
        });
    }
    g.finish();
}

criterion_group!(benches, bench, bench_mma);
criterion_main!(benches);
