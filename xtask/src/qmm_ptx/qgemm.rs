//! The `qgemm` entry of `qmm.ptx`: quantised products of the tiled class (8 columns or
//! more) as a register-tiled GEMM, with `qmm`'s per-output arithmetic.
//!
//! A block computes a 32 x 32 tile of outputs with 128 threads, 8 outputs each (a warp
//! 16 x 16). Per K-tile of [`TK`] chunks the threads unpack the weight chunks once into
//! shared memory (the dtype's `qmm` fragment, one task per (row, chunk)) and copy the
//! activations' Q8_1 blocks (quantised by `quantize_q8_1` before the launch) beside them;
//! then, chunk after chunk in index order, each warp computes its chunk's integer dot
//! products on the tensor cores (`mma` m16n8k16, u8 quants times s8 activations into s32:
//! exact, so the same sums as `qmm`'s dp4a) and each thread steps its 8 outputs' f32
//! chains exactly as `qmm`'s stage C does. Each weight chunk is unpacked once per 32
//! columns (`qmm`: once per 8).

use super::{fragment, DTYPES};

/// Chunks (of 32 values) per K-tile.
const TK: u32 = 8;
/// Rows and columns of a block's output tile.
const BM: u32 = 32;
const BN: u32 = 32;
/// Threads per block.
const THREADS: u32 = 128;
/// Bytes of one unpacked (row, chunk) weight entry in shared memory: U0..U7, {sc0, sc1,
/// zs0, zs1}, {dw, mw, dm, m01}, then 16 bytes of padding, so that the 8 chunks of one row
/// a quarter-warp stores fall in different banks.
const W_ENTRY: u32 = 80;
/// Bytes of one row's line of [`TK`] weight entries, padded by 16 bytes: the 8 rows a
/// quarter-warp reads in the compute loop (one chunk of each) start 16 bytes apart in the
/// banks (a line of `TK * W_ENTRY`, a multiple of 128, put them all in one bank group).
const W_LINE: u32 = TK * W_ENTRY + 16;
/// Bytes of one (column, chunk) activation entry: `{da, sa, sum_lo, sum_hi, q[32]}`.
const A_ENTRY: u32 = 48;
/// Bytes of one column's line of [`TK`] activation entries, padded as [`W_LINE`].
const A_LINE: u32 = TK * A_ENTRY + 16;
/// Offset of the activation lines in shared memory (33 KiB in all with them: the host's
/// `launch::QGEMM_SHARED`).
const A_OFFSET: u32 = BM * W_LINE;

/// The formats whose values are stored offset by a zero point (their chunk's integer dot
/// subtracts `zs0 * sum_lo + zs1 * sum_hi`, as `qmm`'s stage B does for them).
const ZERO_POINT: [&str; 5] = ["Q4_0", "Q5_0", "Q8_0", "Q3_K", "Q6_K"];

/// Registers the stage code shares between its two task copies (everything else in it
/// is the task's own, renamed for the second copy by [`second_copy`]).
const SHARED_REGS: [&str; 14] = [
    "thr", "m0", "n0", "M", "N", "nch", "tb", "xq", "nbx", "wq", "nbw", "sA", "sW", "gdt",
];

/// `text` with every register not in [`SHARED_REGS`] renamed `%y...` (`%t3` -> `%yt3`).
fn second_copy(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 64);
    let mut rest = text;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..=i]);
        rest = &rest[i + 1..];
        let n = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let name = &rest[..n];
        if !SHARED_REGS.contains(&name) {
            out.push('y');
        }
        out.push_str(name);
        rest = &rest[n..];
    }
    out.push_str(rest);
    out
}

/// Task `thr`'s code of a stage (`%qo` = 0) and the second task's (`thr + THREADS`, its
/// registers renamed by [`second_copy`]), line by line side by side: both tasks' global
/// loads are issued before either waits for one. The code is straight-line (no labels).
fn two_tasks(first: &str) -> String {
    let second = second_copy(first);
    let mut out = String::new();
    for (a, b) in first.lines().zip(second.lines()) {
        out += a;
        out.push('\n');
        if !a.trim_start().starts_with("//") {
            out += b;
            out.push('\n');
        }
    }
    out
}

/// A stage task's indices: task `%thr + %qo` is (line `%qcl` = task / TK, chunk `%qc` =
/// task % TK) of the tile; its row or column `first + %qcl` and chunk `%tb + %qc`, each
/// clamped to the last that exists (`count - 1`, `%nch - 1`), go to `%rd0` (widened) and
/// `chunk`.
fn task(first: &str, count: &str, chunk: &str) -> String {
    format!(
        "    add.u32 %qi, %thr, %qo;
    shr.u32 %qcl, %qi, {};
    and.b32 %qc, %qi, {};
    add.u32 %t0, {first}, %qcl;
    sub.u32 %t1, {count}, 1;
    min.u32 %t0, %t0, %t1;
    add.u32 {chunk}, %tb, %qc;
    sub.u32 %t3, %nch, 1;
    min.u32 {chunk}, {chunk}, %t3;
    cvt.u64.u32 %rd0, %t0;
",
        TK.trailing_zeros(),
        TK - 1
    )
}

/// The `qgemm` entry.
pub fn qgemm() -> String {
    assert_eq!(TK * BN, 2 * THREADS, "stage A: two tasks a thread");
    assert_eq!(TK * BM, 2 * THREADS, "stage W: two tasks a thread");
    let mut f = header_constants(HEADER);
    let mut a = format!(
        "    // Stage A: the tile's Q8_1 blocks, task t = (column t / {TK}, chunk t % {TK}).
{}    mad.lo.u64 %rd1, %rd0, %nbx, %xq;
    mul.wide.u32 %rd0, %t2, 36;
    add.u64 %rd1, %rd1, %rd0;
    ld.global.nc.b32 %t4, [%rd1];
",
        task("%n0", "%N", "%t2")
    );
    for i in 0..8 {
        a += &format!("    ld.global.nc.b32 %W{i}, [%rd1+{}];\n", 4 + 4 * i);
    }
    a += "    mov.b32 {%hh0, %hh1}, %t4;
    cvt.f32.f16 %f0, %hh0;
    cvt.f32.f16 %f1, %hh1;
    dp4a.s32.s32 %t5, %W0, 0x01010101, 0;
    dp4a.s32.s32 %t5, %W1, 0x01010101, %t5;
    dp4a.s32.s32 %t5, %W2, 0x01010101, %t5;
    dp4a.s32.s32 %t5, %W3, 0x01010101, %t5;
    dp4a.s32.s32 %t6, %W4, 0x01010101, 0;
    dp4a.s32.s32 %t6, %W5, 0x01010101, %t6;
    dp4a.s32.s32 %t6, %W6, 0x01010101, %t6;
    dp4a.s32.s32 %t6, %W7, 0x01010101, %t6;
";
    a += &format!(
        "    mul.lo.u32 %t0, %qc, {A_ENTRY};
    mad.lo.u32 %t0, %qcl, {A_LINE}, %t0;
    cvt.u64.u32 %rd0, %t0;
    add.u64 %rd0, %sA, %rd0;
    mov.b32 %t7, %f0;
    mov.b32 %t8, %f1;
    st.shared.v4.b32 [%rd0], {{%t7, %t8, %t5, %t6}};
    st.shared.v4.b32 [%rd0+16], {{%W0, %W1, %W2, %W3}};
    st.shared.v4.b32 [%rd0+32], {{%W4, %W5, %W6, %W7}};
"
    );
    f += &format!("    mov.u32 %qo, 0;\n    mov.u32 %yqo, {THREADS};\n");
    f += &two_tasks(&a);
    // Stage W: the tile's weight chunks unpacked by the dtype's fragment; task t = (row
    // t / TK, chunk t % TK). The dtype is the same for every thread: one branch, then
    // both tasks' code side by side.
    f += "    // Stage W: the tile's weight chunks unpacked (two tasks, side by side).\n";
    for (name, id) in DTYPES {
        f += &format!("    setp.eq.u32 %p0, %gdt, {id};\n    @%p0 bra QW_{name};\n");
    }
    f += "    trap;\n";
    let setup = task("%m0", "%M", "%j") + "    mad.lo.u64 %rw, %rd0, %nbw, %wq;\n";
    let store = format!(
        "    mul.lo.u32 %t0, %qc, {W_ENTRY};
    mad.lo.u32 %t0, %qcl, {W_LINE}, %t0;
    cvt.u64.u32 %rd0, %t0;
    add.u64 %rd0, %sW, %rd0;
    st.shared.v4.b32 [%rd0], {{%U0, %U1, %U2, %U3}};
    st.shared.v4.b32 [%rd0+16], {{%U4, %U5, %U6, %U7}};
    st.shared.v4.b32 [%rd0+32], {{%sc0, %sc1, %zs0, %zs1}};
    mov.b32 %t4, %dw;
    mov.b32 %t5, %mw;
    mov.b32 %t6, %dm;
    st.shared.v4.b32 [%rd0+48], {{%t4, %t5, %t6, %m01}};
"
    );
    for (name, _) in DTYPES {
        let mut task = setup.clone();
        task += &fragment(name);
        if !ZERO_POINT.contains(&name) {
            task += "    mov.b32 %zs0, 0;\n    mov.b32 %zs1, 0;\n";
        }
        task += &store;
        f += &format!("QW_{name}:\n");
        f += &two_tasks(&task);
        f += "    bra QW_DONE;\n";
    }
    f += &format!(
        "QW_DONE:
    bar.sync 0;
    // The tile's chunks in order. Warp w takes rows wr = 16 (w % 2) .. wr + 15 and
    // columns wc = 16 (w / 2) .. wc + 15; lane l (g = l / 4, t = l % 4) the outputs of rows
    // r0 = wr + g, r0 + 8 and columns c0 = wc + 2t, c0 + 1, c0 + 8, c0 + 9.
    and.b32 %t0, %thr, 31;
    shr.u32 %t1, %thr, 5;
    shr.u32 %t2, %t0, 2;
    and.b32 %t3, %t0, 3;
    and.b32 %t4, %t1, 1;
    shl.b32 %t4, %t4, 4;
    shr.u32 %t5, %t1, 1;
    shl.b32 %t5, %t5, 4;
    add.u32 %tr, %t4, %t2;
    shl.b32 %t6, %t3, 1;
    add.u32 %tcl, %t5, %t6;
    mul.wide.u32 %rd0, %tr, {W_LINE};
    add.u64 %pw, %sW, %rd0;
    mul.wide.u32 %rd1, %t3, 4;
    add.u64 %pwa, %pw, %rd1;
    add.u32 %t7, %t5, %t2;
    mul.wide.u32 %rd0, %t7, {A_LINE};
    add.u64 %pb, %sA, %rd0;
    add.u64 %pb, %pb, %rd1;
    add.u64 %pb, %pb, 16;
    mul.wide.u32 %rd0, %tcl, {A_LINE};
    add.u64 %pa, %sA, %rd0;
    mov.b32 %qz, 0;
    mov.u32 %qc, 0;
"
    );
    // Chunk c's mma results are in one set of registers (qx/qy or qX/qY) while chunk
    // c + 1's mma goes into the other, ahead of chunk c's chain: the chain never waits
    // for the tensor cores. The loop takes two chunks a turn, one per set.
    f += &mma_block("qx", "qy", false);
    let advance = format!(
        "    add.u64 %pw, %pw, {0};
    add.u64 %pwa, %pwa, {0};
    add.u64 %pa, %pa, {1};
    add.u64 %pb, %pb, {1};
    add.u32 %qc, %qc, 1;
",
        W_ENTRY, A_ENTRY
    );
    for (label, (x, y), (nx, ny)) in [
        ("QG_CHUNK", ("qx", "qy"), ("qX", "qY")),
        ("QG_CHUNK_B", ("qX", "qY"), ("qx", "qy")),
    ] {
        f += &format!(
            "{label}:
    setp.ge.u32 %p0, %qc, %TKa;
    @%p0 bra QG_NEXT;
    add.u32 %t0, %qc, 1;
    setp.ge.u32 %p0, %t0, %TKa;
    @%p0 bra {label}_CHAIN;
"
        );
        f += &mma_block(nx, ny, true);
        f += &format!("{label}_CHAIN:\n");
        f += &chain(x, y, label);
        f += &advance;
    }
    f += &format!(
        "    bra QG_CHUNK;
QG_NEXT:
    add.u32 %tb, %tb, {TK};
    bra QG_TILE;
QG_STORE:
    // The residual add's operands (p_res = 0: none), loaded only now: nothing of the
    // loop above keeps them live.
    ld.param.u64 %res, [p_res];
    setp.ne.u64 %pres, %res, 0;
    cvta.to.global.u64 %res, %res;
    ld.param.u64 %nbr, [p_nbr];
    ld.param.u64 %eq, [p_e];
    cvta.to.global.u64 %eq, %eq;
    ld.param.u64 %nbe, [p_nbe];
"
    );
    // Each output stored (and its residual loaded, all 8 loads in flight), then the
    // residual adds stored.
    for i in 0..2 {
        for j in 0..4 {
            let o = 4 * i + j;
            f += &format!(
                "    add.u32 %t0, %m0, %tr;
    add.u32 %t0, %t0, {row};
    add.u32 %t1, %n0, %tcl;
    add.u32 %t1, %t1, {col};
    setp.lt.u32 %p0, %t0, %M;
    setp.lt.u32 %p1, %t1, %N;
    and.pred %p0, %p0, %p1;
    cvt.u64.u32 %rd0, %t1;
    mad.lo.u64 %rd1, %rd0, %nbd, %dq;
    mad.lo.u64 %rd2, %rd0, %nbr, %res;
    mad.lo.u64 %qe{o}, %rd0, %nbe, %eq;
    mul.wide.u32 %rd0, %t0, 4;
    add.u64 %rd1, %rd1, %rd0;
    add.u64 %rd2, %rd2, %rd0;
    add.u64 %qe{o}, %qe{o}, %rd0;
    @%p0 st.global.f32 [%rd1], %ac{o};
    and.pred %qp{o}, %p0, %pres;
    @%qp{o} ld.global.f32 %qf{o}, [%rd2];
",
                row = 8 * i,
                col = [0, 1, 8, 9][j]
            );
        }
    }
    for o in 0..8 {
        f += &format!(
            "    @%qp{o} add.rn.f32 %qf{o}, %ac{o}, %qf{o};
    @%qp{o} st.global.f32 [%qe{o}], %qf{o};
"
        );
    }
    f += "    ret;\n}\n";
    f
}

/// One chunk of the compute loop. The warp's 16 x 16 outputs are two `mma` tiles of
/// 16 x 8 (u8 weights times s8 activations, s32 sums: exact like dp4a), one `mma` per tile
/// and half chunk (values 0..15 and 16..31, which Q2_K..Q6_K scale apart): a thread gets
/// the sums of rows r0 = wr + g, r1 = r0 + 8 and columns c0 + {0, 1, 8, 9} (g = lane / 4,
/// c0 = wc + 2 (lane % 4)). `%pwa` points at row r0's A word (lane % 4), `%pb` at column
/// wc + g's activation word (lane % 4), `%pw` and `%pa` at row r0's and column c0's
/// entries. Then per output `qmm`'s chain step: acc = fma(dw * da, float(sumi), acc),
/// acc = fma(mw, sa, acc), and for Q2_K with dm != 0 acc = fma(-(dm * da), float(m0 *
/// sum_lo + m1 * sum_hi), acc), each step for the 8 outputs before the next, so that no
/// instruction waits for the one just before it.
fn mma_block(x: &str, y: &str, ahead: bool) -> String {
    let row = 8 * W_LINE; // row r1 = r0 + 8
    let col8 = 8 * A_LINE; // column + 8
    let (w, a) = if ahead { (W_ENTRY, A_ENTRY) } else { (0, 0) };
    let mut f = format!(
        "    ld.shared.b32 %qw0, [%pwa+{w}];
    ld.shared.b32 %qw1, [%pwa+{}];
    ld.shared.b32 %qw2, [%pwa+{}];
    ld.shared.b32 %qw3, [%pwa+{}];
    ld.shared.b32 %qb0, [%pb+{a}];
    ld.shared.b32 %qb1, [%pb+{}];
    ld.shared.b32 %qb2, [%pb+{}];
    ld.shared.b32 %qb3, [%pb+{}];
",
        w + row,
        w + 16,
        w + row + 16,
        a + 16,
        a + col8,
        a + col8 + 16
    );
    for (ng, half, r) in [(0, 0, x), (0, 1, y), (1, 0, x), (1, 1, y)] {
        let o = 2 * ng;
        f += &format!(
            "    mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {{%{r}{}, %{r}{}, %{r}{}, %{r}{}}}, {{%qw{}, %qw{}}}, {{%qb{}}}, {{%qz, %qz, %qz, %qz}};\n",
            o,
            o + 1,
            o + 4,
            o + 5,
            2 * half,
            2 * half + 1,
            2 * ng + half
        );
    }
    f
}

/// The chain steps of the chunk whose sums are in `%{x}0..7` (first halves) and
/// `%{y}0..7` (second halves), as [`mma_block`]'s doc says; `label` names its branch
/// targets.
fn chain(x: &str, y: &str, label: &str) -> String {
    let col8 = 8 * A_LINE;
    let row = 8 * W_LINE;
    let mut f = String::new();
    let col = [0, A_LINE, col8, col8 + A_LINE];
    for (j, off) in col.iter().enumerate() {
        f += &format!(
            "    ld.shared.v4.b32 {{%qa{}, %qa{}, %qa{}, %qa{}}}, [%pa+{off}];\n",
            4 * j,
            4 * j + 1,
            4 * j + 2,
            4 * j + 3,
        );
    }
    // Row i's {sc0, sc1, zs0, zs1} and {dw, mw, dm, m01}: row 0 in %qu0..7, row 1 in %qv0..7.
    for (i, r) in ["qu", "qv"].into_iter().enumerate() {
        f += &format!(
            "    ld.shared.v4.b32 {{%{r}0, %{r}1, %{r}2, %{r}3}}, [%pw+{}];
    ld.shared.v4.b32 {{%{r}4, %{r}5, %{r}6, %{r}7}}, [%pw+{}];
",
            i as u32 * row + 32,
            i as u32 * row + 48
        );
    }
    // Each step for all 8 outputs before the next (the steps of one output depend on each
    // other; the outputs do not), in an order that starts with what the dot products do
    // not feed.
    let step = |f: &mut String, text: &dyn Fn(usize, &str, usize) -> String| {
        for o in 0..8 {
            let r = if o < 4 { "qu" } else { "qv" };
            *f += &text(o, r, o % 4);
        }
    };
    // zero-point terms: %qy = zs0 * sum_lo + zs1 * sum_hi (the half sums are no longer
    // needed), sumi = sc0 * x0 + sc1 * x1 - %qy.
    step(&mut f, &|o, r, j| {
        format!("    mul.lo.s32 %qt{o}, %{r}2, %qa{};\n", 4 * j + 2)
    });
    step(&mut f, &|o, r, _| {
        format!("    mul.lo.s32 %{x}{o}, %{r}0, %{x}{o};\n")
    });
    step(&mut f, &|o, r, j| {
        format!("    mad.lo.s32 %qt{o}, %{r}3, %qa{}, %qt{o};\n", 4 * j + 3)
    });
    step(&mut f, &|o, r, _| {
        format!("    mad.lo.s32 %{x}{o}, %{r}1, %{y}{o}, %{x}{o};\n")
    });
    step(&mut f, &|o, r, j| {
        format!("    mul.rn.f32 %qf{o}, %{r}4, %qa{};\n", 4 * j)
    });
    step(&mut f, &|o, _, _| {
        format!("    sub.s32 %{x}{o}, %{x}{o}, %qt{o};\n")
    });
    step(&mut f, &|o, _, _| {
        format!("    cvt.rn.f32.s32 %qg{o}, %{x}{o};\n")
    });
    step(&mut f, &|o, _, _| {
        format!("    fma.rn.f32 %ac{o}, %qf{o}, %qg{o}, %ac{o};\n")
    });
    step(&mut f, &|o, r, j| {
        format!("    fma.rn.f32 %ac{o}, %{r}5, %qa{}, %ac{o};\n", 4 * j + 1)
    });
    // Q2_K's min term, for the rows whose dm is not 0 (a predicate per row).
    f += &format!(
        "    @%pnq2 bra {label}_NO_MIN;
    setp.neu.f32 %pz, %qu6, 0f00000000;
    setp.neu.f32 %pz1, %qv6, 0f00000000;
    and.b32 %qm0, %qu7, 0xFFFF;
    shr.u32 %qm1, %qu7, 16;
    and.b32 %qm2, %qv7, 0xFFFF;
    shr.u32 %qm3, %qv7, 16;
"
    );
    let pred = |o: usize| if o < 4 { "@%pz" } else { "@%pz1" };
    let m = |o: usize| if o < 4 { (0, 1) } else { (2, 3) };
    step(&mut f, &|o, _, j| {
        format!(
            "    {} mul.lo.s32 %{x}{o}, %qm{}, %qa{};\n",
            pred(o),
            m(o).0,
            4 * j + 2
        )
    });
    step(&mut f, &|o, r, j| {
        format!("    {} mul.rn.f32 %qf{o}, %{r}6, %qa{};\n", pred(o), 4 * j)
    });
    step(&mut f, &|o, _, j| {
        format!(
            "    {} mad.lo.s32 %{x}{o}, %qm{}, %qa{}, %{x}{o};\n",
            pred(o),
            m(o).1,
            4 * j + 3
        )
    });
    step(&mut f, &|o, _, _| {
        format!("    {} neg.f32 %qf{o}, %qf{o};\n", pred(o))
    });
    step(&mut f, &|o, _, _| {
        format!("    {} cvt.rn.f32.s32 %qg{o}, %{x}{o};\n", pred(o))
    });
    step(&mut f, &|o, _, _| {
        format!(
            "    {} fma.rn.f32 %ac{o}, %qf{o}, %qg{o}, %ac{o};\n",
            pred(o)
        )
    });
    f += &format!("{label}_NO_MIN:\n");
    f
}

/// Parameters, registers and the K-tile loop's head, up to stage A.
const HEADER: &str = "
// ---------------------------------------------------------------------------------
// KERNEL qgemm
// out[m, n] = sum_k w[k, m] * a[k, n] (and optionally out + a residual, a fused ADD) for
// one quantised weight matrix and N >= 8
// columns of Q8_1 activations (quantize_q8_1's blocks), 2-D (no batch), in the
// per-output order of the file header: the same bits as qmm. Generated by
// xtask/src/qmm_ptx/qgemm.rs (see its doc for the tiling).
// Params:
//   p_x       Q8_1 activation blocks [K/32 blocks of 36 bytes, N], column stride p_nbx
//   p_nbx     byte stride of the activation columns (a multiple of 4)
//   p_nchunks K / 32 (at least 1)
//   p_n       N
//   p_w       weight matrix [K, M], rows p_nbw bytes apart
//   p_dt      its dtype code (quant.ptx's header) plus the bytes per block times 256
//   p_m       M
//   p_nbw     row byte stride of the weights
//   p_d       f32 output [M, N], column byte stride p_nbd
//   p_nbd     byte stride of the output columns
//   p_res     0, or f32 residual [M, N] (column byte stride p_nbr): then also
//             e = out + res (add.rn, as the ADD's binary kernel) into p_e (stride p_nbe)
//   p_nbr, p_e, p_nbe
//   p_mb1, p_mb2             up to two more matrices in the same launch (products of the
//             same activation): blocks x >= p_mb1 compute matrix 1, x >= p_mb2 matrix 2
//             (gridDim.x for none); the residual add is for a single matrix only
//   p_w1, p_dt1, p_m1, p_nbw1, p_d1, p_nbd1   matrix 1, as p_w .. p_nbd
//   p_w2, p_dt2, p_m2, p_nbw2, p_d2, p_nbd2   matrix 2, as p_w .. p_nbd
// Grid:   (ceil(M / 32) summed over the matrices, ceil(N / 32), 1)
// Block:  (128, 1, 1)
// Shared: dynamic, 32 row lines of 8 unpacked weight chunks (80 bytes each) padded to
//         656 bytes, then 32 column lines of 8 activation blocks (48 bytes each) padded
//         to 400 bytes (qmm_smem): 33792 bytes
// Reduction: per output as the file header, like qmm: each chunk's integer dot product
//   (an s32 mma per half chunk, then sc0, sc1 and the zero-point terms: exact in any
//   order),
//   then the f32 chain over chunks in increasing order by the one thread that owns the
//   output: fma(dw * da, float(sumi)), fma(mw, sa), and Q2_K's min term when dm != 0.
// ---------------------------------------------------------------------------------
.visible .entry qgemm(
    .param .u64 p_x,
    .param .u64 p_nbx,
    .param .u32 p_nchunks,
    .param .u32 p_n,
    .param .u64 p_w,
    .param .u32 p_dt,
    .param .u32 p_m,
    .param .u64 p_nbw,
    .param .u64 p_d,
    .param .u64 p_nbd,
    .param .u64 p_res,
    .param .u64 p_nbr,
    .param .u64 p_e,
    .param .u64 p_nbe,
    .param .u32 p_mb1,
    .param .u32 p_mb2,
    .param .u64 p_w1,
    .param .u32 p_dt1,
    .param .u32 p_m1,
    .param .u64 p_nbw1,
    .param .u64 p_d1,
    .param .u64 p_nbd1,
    .param .u64 p_w2,
    .param .u32 p_dt2,
    .param .u32 p_m2,
    .param .u64 p_nbw2,
    .param .u64 p_d2,
    .param .u64 p_nbd2
)
.maxntid 128, 1, 1
{
    .reg .pred %p<4>;
    .reg .pred %pal, %pz, %pnq2;
    .reg .b16 %hh<8>, %xl<7>, %xh<7>;
    .reg .b32 %t<16>, %X<7>, %W<8>, %H<8>, %U<8>;
    .reg .b32 %j, %s, %sn, %st, %sc0, %sc1, %zs0, %zs1, %m01;
    .reg .f32 %f<16>;
    .reg .f32 %dw, %mw, %dm;
    .reg .b64 %rd<8>;
    .reg .b64 %rw, %rb, %ra;
    .reg .b32 %thr, %m0, %n0, %M, %N, %nch, %gdt, %tb, %TKa, %qi, %qc, %qcl;
    .reg .b64 %sW, %sA, %pw, %pa, %xq, %nbx, %wq, %nbw, %dq, %nbd, %res, %nbr, %eq, %nbe;
    .reg .pred %pres, %qp<8>;
    .reg .b64 %qe<8>;
    .reg .b32 %qa<16>, %qu<8>, %qv<8>, %qx<8>, %qy<8>, %qX<8>, %qY<8>, %qt<8>, %qm<4>;
    .reg .f32 %ac<8>, %qf<8>, %qg<8>;
    .reg .pred %pz1;
    .reg .b32 %qo, %tr, %tcl, %qz, %qw<4>, %qb<4>;
    .reg .b64 %pwa, %pb;
    // The second task copy of stages A and W (qgemm.rs second_copy).
    .reg .pred %yp<4>, %ypal;
    .reg .b16 %yhh<8>, %yxl<7>, %yxh<7>;
    .reg .b32 %yt<16>, %yX<7>, %yW<8>, %yH<8>, %yU<8>;
    .reg .b32 %yj, %ys, %ysn, %yst, %ysc0, %ysc1, %yzs0, %yzs1, %ym01, %yqi, %yqc, %yqcl, %yqo;
    .reg .f32 %yf<16>, %ydw, %ymw, %ydm;
    .reg .b64 %yrd<8>, %yrw, %yrb, %yra;

    mov.u32 %thr, %tid.x;
    // The block's matrix: 0 below p_mb1, 1 from p_mb1, 2 from p_mb2; its first row.
    mov.u32 %t0, %ctaid.x;
    ld.param.u32 %t2, [p_mb1];
    ld.param.u32 %t3, [p_mb2];
    setp.ge.u32 %p2, %t0, %t2;
    setp.ge.u32 %p3, %t0, %t3;
    @%p2 sub.u32 %t0, %t0, %t2;
    @%p3 sub.u32 %t0, %t0, %t3;
    @%p3 add.u32 %t0, %t0, %t2;
    shl.b32 %m0, %t0, 5;
    mov.u32 %t0, %ctaid.y;
    shl.b32 %n0, %t0, 5;
    ld.param.u64 %xq, [p_x];
    cvta.to.global.u64 %xq, %xq;
    ld.param.u64 %nbx, [p_nbx];
    ld.param.u32 %nch, [p_nchunks];
    ld.param.u32 %N, [p_n];
    ld.param.u64 %wq, [p_w];
    ld.param.u32 %gdt, [p_dt];
    ld.param.u32 %M, [p_m];
    ld.param.u64 %nbw, [p_nbw];
    ld.param.u64 %dq, [p_d];
    ld.param.u64 %nbd, [p_nbd];
    @%p2 ld.param.u64 %wq, [p_w1];
    @%p2 ld.param.u32 %gdt, [p_dt1];
    @%p2 ld.param.u32 %M, [p_m1];
    @%p2 ld.param.u64 %nbw, [p_nbw1];
    @%p2 ld.param.u64 %dq, [p_d1];
    @%p2 ld.param.u64 %nbd, [p_nbd1];
    @%p3 ld.param.u64 %wq, [p_w2];
    @%p3 ld.param.u32 %gdt, [p_dt2];
    @%p3 ld.param.u32 %M, [p_m2];
    @%p3 ld.param.u64 %nbw, [p_nbw2];
    @%p3 ld.param.u64 %dq, [p_d2];
    @%p3 ld.param.u64 %nbd, [p_nbd2];
    cvta.to.global.u64 %wq, %wq;
    and.b32 %gdt, %gdt, 255;
    setp.ne.u32 %pnq2, %gdt, 10;
    cvta.to.global.u64 %dq, %dq;
    mov.u64 %sW, qmm_smem;
    add.u64 %sA, %sW, @A_OFFSET@;
    mov.f32 %ac0, 0f00000000;
    mov.f32 %ac1, 0f00000000;
    mov.f32 %ac2, 0f00000000;
    mov.f32 %ac3, 0f00000000;
    mov.f32 %ac4, 0f00000000;
    mov.f32 %ac5, 0f00000000;
    mov.f32 %ac6, 0f00000000;
    mov.f32 %ac7, 0f00000000;
    mov.u32 %tb, 0;
QG_TILE:
    setp.ge.u32 %p0, %tb, %nch;
    @%p0 bra QG_STORE;
    sub.u32 %TKa, %nch, %tb;
    min.u32 %TKa, %TKa, @TK@;
    // The previous tile's chunks are all read before this one overwrites them.
    bar.sync 0;
";

/// [`HEADER`] with its constants in place.
fn header_constants(text: &str) -> String {
    text.replace("@A_OFFSET@", &A_OFFSET.to_string())
        .replace("@TK@", &TK.to_string())
}
