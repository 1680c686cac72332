//! `cargo xtask gen-ptx`: writes `ggml-cuda/kernels/qmm.ptx`, the second generation of
//! quantised product kernels, from the skeleton and the per-dtype fragments below.
//!
//! The kernel is one `.entry` (`qmm`) whose stage B (the integer dot products) has one
//! specialised loop per weight dtype; everything else (activation quantisation, the RMS
//! norm prologue, the f32 chain, the epilogues) is written once. The ten loops differ
//! only in how a lane loads and unpacks its 8 quants of a chunk, so the loop is a
//! template ([`LOOP`]) and each dtype gives a fragment ([`fragment`]). Edit this file,
//! then run `cargo xtask gen-ptx`; the test below fails while the checked-in file is
//! stale.

use std::path::Path;

mod qgemm;

/// Where the generated PTX goes, relative to the workspace root.
pub const OUT: &str = "ggml-cuda/kernels/qmm.ptx";

/// Writes [`OUT`] under `root`.
pub fn gen_ptx(root: &Path) -> Result<(), String> {
    crate::ptx::write_generated(root, OUT, &generate())
}

/// The weight dtypes: label, ggml type id.
const DTYPES: [(&str, u32); 10] = [
    ("Q4_0", 2),
    ("Q4_1", 3),
    ("Q5_0", 6),
    ("Q5_1", 7),
    ("Q8_0", 8),
    ("Q2_K", 10),
    ("Q3_K", 11),
    ("Q4_K", 12),
    ("Q5_K", 13),
    ("Q6_K", 14),
];

/// Selects group `%gi` (0: matrix `%ga`'s rows; 1, GLU only: matrix 1's) into `%gdt`,
/// `%gM`, `%gw`, `%gnbw`, `%gmb`, `%gRg`, `%groff`, and its block geometry into `%gts`
/// (bytes per block) and `%gsh` (log2 of chunks per block).
fn select_group() -> String {
    String::from(
        "    setp.eq.u32 %p1, %gi, 0;
    selp.b32 %gdt, %dta, %dt1, %p1;
    selp.b32 %gM, %Ma, %M1, %p1;
    selp.b64 %gw, %wa, %w1, %p1;
    selp.b64 %gnbw, %nbwa, %nbw1, %p1;
    mov.u32 %gmb, %mb;
    selp.b32 %gRg, %R, %RH, %p1;
    @%pg2 mov.u32 %gRg, %RH;
    selp.b32 %groff, 0, %RH, %p1;
    shr.u32 %gts, %gdt, 8;
    and.b32 %gdt, %gdt, 255;
    setp.ge.u32 %p1, %gdt, 10;
    selp.b32 %gsh, 3, 0, %p1;
",
    )
}

/// The weight row of stage-B task row `%br` of the current group: `%rw`, its first byte.
/// A GLU whose two matrices share a dtype runs one group over both halves of the CTA's
/// rows (`%gRs` = R/2: rows from there on are matrix 1's, at the same row numbers); any
/// other launch has `%gRs` above every row.
const TASK_ROW: &str = "    add.u32 %t0, %gmb, %br;
    setp.ge.u32 %p1, %br, %gRs;
    @%p1 sub.u32 %t0, %t0, %gRs;
    sub.u32 %t1, %gM, 1;
    min.u32 %t0, %t0, %t1;
    selp.b64 %rw, %w1, %gw, %p1;
    selp.b64 %rd1, %nbw1, %gnbw, %p1;
    cvt.u64.u32 %rd0, %t0;
    mad.lo.u64 %rw, %rd0, %rd1, %rw;
";

/// Prefetches into L1 the activation lines the current K-tile (`%tb`, `%TCa` chunks)
/// reads. Labels get `tag`.
fn prefetch_activation(tag: &str) -> String {
    format!(
        "    mul.lo.u32 %t2, %nv, %TCa;
    setp.ge.u32 %p0, %thr, %t2;
    @%p0 bra PF{tag}_XD;
    add.u32 %t4, %bjt0, %tb;
    cvt.u64.u32 %rd0, %br0;
    mad.lo.u64 %rd1, %rd0, %nbx1, %xb;
    selp.b32 %t5, 36, 128, %pq8;
    mul.wide.u32 %rd0, %t4, %t5;
    add.u64 %rd1, %rd1, %rd0;
    prefetch.global.L1 [%rd1];
PF{tag}_XD:
"
    )
}

/// Prefetches into L1 what the current K-tile (`%tb`, `%TCa` chunks) reads from global
/// memory: the activation lines (unless `activation` is false), the norm weight's, and
/// the weight blocks of this thread's stage-B tasks in each group. Labels get `tag`.
fn prefetch(tag: &str, activation: bool) -> String {
    let mut f = String::from(
        "    // Prefetch what the tile reads (the loads come after the norm and stage A).\n",
    );
    if activation {
        f += &prefetch_activation(tag);
    }
    f += &format!(
        "PF{tag}_NW:
    @!%pnorm bra PF{tag}_W;
    setp.ge.u32 %p0, %thr, %TCa;
    @%p0 bra PF{tag}_W;
    add.u32 %t4, %thr, %tb;
    ld.param.u64 %rd1, [p_nw];
    cvta.to.global.u64 %rd1, %rd1;
    mul.wide.u32 %rd0, %t4, 128;
    add.u64 %rd1, %rd1, %rd0;
    prefetch.global.L1 [%rd1];
PF{tag}_W:
    mov.u32 %gi, 0;
PF{tag}_GROUP:
    setp.ge.u32 %p0, %gi, %ngrp;
    @%p0 bra PF{tag}_DONE;
"
    );
    f += &select_group();
    f += &format!(
        "    mul.lo.u32 %Q, %gRg, %TCa;
    mov.u32 %br, %br0;
    mov.u32 %bjt, %bjt0;
    mov.u32 %base, 0;
PF{tag}_LOOP:
    setp.ge.u32 %p0, %base, %Q;
    @%p0 bra PF{tag}_NEXT;
    add.u32 %t0, %base, %thr;
    setp.ge.u32 %p0, %t0, %Q;
    @%p0 bra PF{tag}_ADVANCE;
{TASK_ROW}    add.u32 %t0, %tb, %bjt;
    shr.u32 %t0, %t0, %gsh;
    mul.wide.u32 %rd0, %t0, %gts;
    add.u64 %rb, %rw, %rd0;
    prefetch.global.L1 [%rb];
    sub.u32 %t1, %gts, 1;
    cvt.u64.u32 %rd0, %t1;
    add.u64 %rd0, %rb, %rd0;
    prefetch.global.L1 [%rd0];
    setp.gt.u32 %p0, %gts, 128;
    @%p0 prefetch.global.L1 [%rb+128];
PF{tag}_ADVANCE:
    add.u32 %base, %base, %T;
    add.u32 %bjt, %bjt, %djt;
    add.u32 %br, %br, %dr;
    setp.ge.u32 %p0, %bjt, %TCa;
    @%p0 sub.u32 %bjt, %bjt, %TCa;
    @%p0 add.u32 %br, %br, 1;
    bra PF{tag}_LOOP;
PF{tag}_NEXT:
    add.u32 %gi, %gi, 1;
    bra PF{tag}_GROUP;
PF{tag}_DONE:
"
    );
    f
}

/// The first tile's prefetches around the wait for the grid before this one
/// (programmatic dependent launch, sm_90): the weights and the norm weight, which no
/// kernel writes, before it; the activation, which the grid before may still be
/// writing, after it (a line prefetched early could be stale in L1).
fn first_prefetch_and_wait() -> String {
    let mut f = prefetch("F", false);
    f += GRID_WAIT;
    f += &prefetch_activation("F");
    f
}

/// `griddepcontrol.wait` and `.launch_dependents`: above them the kernel reads only
/// its parameters and prefetches weights; from here on it reads and writes global
/// memory, once the grid before it has finished (`cuda_sim::ptx::for_arch` comments
/// both lines out below sm_90).
const GRID_WAIT: &str =
    "    // Programmatic dependent launch: wait for the grid before this one, then let the
    // next one start its own prologue.
    griddepcontrol.wait;
    griddepcontrol.launch_dependents;
";

/// The whole generated file.
pub fn generate() -> String {
    let mut dispatch = String::new();
    let mut loops = String::new();
    for (name, id) in DTYPES {
        dispatch.push_str(&format!(
            "    setp.eq.u32 %p0, %gdt, {id};\n    @%p0 bra B_{name};\n"
        ));
        // Formats with a zero point subtract z * (sc0 * sum_lo + sc1 * sum_hi); for the
        // others that is 0 and the instructions are left out.
        let zp = if ["Q4_0", "Q5_0", "Q8_0", "Q3_K", "Q6_K"].contains(&name) {
            "    ld.shared.v2.b32 {%slo, %shi}, [%ra+8];
    mul.lo.s32 %t1, %zs0, %slo;
    mad.lo.s32 %t1, %zs1, %shi, %t1;
    sub.s32 %t0, %t0, %t1;"
        } else {
            "    // no zero point"
        };
        loops.push_str(
            &LOOP
                .replace("@ZP@", zp)
                .replace("@DT@", name)
                .replace("@ROW@", TASK_ROW)
                .replace("@FRAG@", qmm_fragment(name).trim_end_matches('\n')),
        );
    }
    let qmm = SKELETON
        .replace("@SELECT_GROUP@\n", &select_group())
        .replace("@PREFETCH_FIRST@\n", &first_prefetch_and_wait())
        .replace("@PREFETCH_NEXT@\n", &prefetch("N", true))
        .replace("@B_DISPATCH@\n", &dispatch)
        .replace("@B_LOOPS@\n", &loops)
        .replace("@STAGE_C@\n", &stage_c())
        .replace("@NORM_SUM@\n", &norm_sum())
        .replace(
            "@RT_TABLE@",
            &RT_TABLE
                .replace("@D_OF_ROW@", D_OF_ROW)
                .replace("@TABLE_MADE@", TABLE_MADE)
                .replace("@COS_SIN@", &cos_sin("RT", "%rd0")),
        )
        .replace(
            "@EPI_ROPE@\n",
            &EPI_ROPE
                .replace("@D_OF_ROW@", D_OF_ROW)
                .replace("@TABLE_MADE@", TABLE_MADE)
                .replace("@COS_SIN@", &cos_sin("EPI", "%rd1")),
        );
    qmm + &qgemm::qgemm()
}

/// `%t10` = d = row `%t0` mod ne0, the head's by mul.hi with `p_mg_ne0` (clobbers `%t9`).
const D_OF_ROW: &str = "    ld.param.u32 %t9, [p_ne0];
    ld.param.u32 %t10, [p_mg_ne0];
    mul.hi.u32 %t10, %t0, %t10;
    mul.lo.u32 %t10, %t10, %t9;
    sub.u32 %t10, %t0, %t10;
";

/// `%p1`: whether the CTA's RoPE table is made (see [`RT_TABLE`]): its last warp
/// computes no norm column and one round of its lanes covers every output (a CTA with
/// a RoPE role; clobbers `%t14`).
const TABLE_MADE: &str = "    shr.u32 %t14, %T, 5;
    sub.u32 %t14, %t14, 1;
    setp.ge.u32 %p1, %t14, %nv;
    mul.lo.u32 %t14, %R, %nv;
    setp.le.u32 %p2, %t14, 32;
    and.pred %p1, %p1, %p2;
";

/// cos and sin of pair `%t13` at the position of column `col` (a 64-bit register),
/// times mscale, into `%f12` and `%f13`: rope.ptx's `rope_store` instruction for
/// instruction (theta by repeated multiplication from float(pos), YaRN's freq_scale (its
/// ramp is off: ext_factor 0), `sincos_f`, mscale). Labels get `tag`; clobbers `%rd3`,
/// `%rd4`, `%t9`, `%t14`.
fn cos_sin(tag: &str, col: &str) -> String {
    format!(
        "    ld.param.u64 %rd3, [p_pos];
    cvta.to.global.u64 %rd3, %rd3;
    ld.param.u64 %rd4, [p_nbp0];
    mad.lo.u64 %rd3, {col}, %rd4, %rd3;
    ld.global.s32 %t9, [%rd3];
    // theta_t: float(pos) times theta_scale t times, in order.
    cvt.rn.f32.s32 %f2, %t9;
    ld.param.f32 %f3, [p_theta_scale];
    // (eight at a time, then the last 0 to 7 each under its own predicate: the loop's
    // tests stay off the chain)
    mov.u32 %t14, %t13;
{tag}_TH8:
    setp.lt.u32 %p1, %t14, 8;
    @%p1 bra {tag}_TH_LAST;
{th8}    sub.u32 %t14, %t14, 8;
    bra {tag}_TH8;
{tag}_TH_LAST:
{th_last}    // theta = freq_scale * theta (YaRN without its ramp: ext_factor is 0 here)
    ld.param.f32 %f4, [p_freq_scale];
    mul.rn.f32 %f5, %f4, %f2;
{sincos}    ld.param.f32 %f14, [p_mscale];
    mul.rn.f32 %f12, %f12, %f14;
    mul.rn.f32 %f13, %f13, %f14;
",
        th8 = "    mul.rn.f32 %f2, %f2, %f3;\n".repeat(8),
        th_last = theta_last(),
        sincos = sincos_inline(),
    )
}

/// The RoPE table of a CTA with a RoPE role (Q or K), made at NORM_DONE by its last warp
/// when that warp computes no norm column (so it is idle there) and its lanes cover the
/// CTA's outputs in one round ([`TABLE_MADE`]): lane o < R * nv takes output (row o mod
/// R, column o / R) and writes its cos and sin times mscale, as the epilogue would
/// compute them, to 8 bytes at 32 + 8 o past the norm scales. The theta chain and
/// `sincos_f` (about 1,400 cycles) then run while warp 0 computes the norm, off the
/// critical path; the epilogue reads the pair after the barriers between.
const RT_TABLE: &str = "    @!%prope bra RT_DONE;
@TABLE_MADE@    @!%p1 bra RT_DONE;
    shr.u32 %t9, %T, 5;
    sub.u32 %t9, %t9, 1;
    shr.u32 %t10, %thr, 5;
    setp.ne.u32 %p0, %t10, %t9;
    @%p0 bra RT_DONE;
    and.b32 %t11, %thr, 31;
    mul.lo.u32 %t10, %R, %nv;
    setp.ge.u32 %p0, %t11, %t10;
    @%p0 bra RT_DONE;
    // The role of the CTA's matrix: Q (1) or K (2) only.
    ld.param.u32 %t5, [p_rflags];
    shl.b32 %t6, %ga, 1;
    shr.u32 %t6, %t5, %t6;
    and.b32 %t6, %t6, 3;
    setp.eq.u32 %p0, %t6, 0;
    @%p0 bra RT_DONE;
    setp.eq.u32 %p0, %t6, 3;
    @%p0 bra RT_DONE;
    // Row mb + (o mod R) of the matrix, column o / R.
    sub.u32 %t12, %R, 1;
    and.b32 %t12, %t11, %t12;
    shr.u32 %t7, %t11, %lR;
    add.u32 %t0, %mb, %t12;
    setp.ge.u32 %p0, %t0, %Ma;
    @%p0 bra RT_DONE;
    // d = r mod ne0, pair t = d / 2; past n_dims no rotation.
@D_OF_ROW@    shr.u32 %t13, %t10, 1;
    and.b32 %t10, %t10, 0xFFFFFFFE;
    ld.param.u32 %t9, [p_n_dims];
    setp.ge.u32 %p0, %t10, %t9;
    @%p0 bra RT_DONE;
    cvt.u64.u32 %rd0, %t7;
@COS_SIN@    mul.wide.u32 %rd0, %t11, 8;
    add.u64 %rd0, %sN, %rd0;
    st.shared.v2.f32 [%rd0+32], {%f12, %f13};
RT_DONE:
";

/// The RoPE + KV-store epilogue (`p_rflags`): in `%t0` the thread's row r, `%rd0` = 4r,
/// `%rd1` its column, `%t6` the CTA's role, `%f8` the value of row r ^ 1, `%t8` the cache row. Each step is
/// rope.ptx's `rope_store` instruction for instruction (theta by repeated multiplication
/// from float(pos), YaRN's freq_scale (its ramp is off: ext_factor 0), `sincos_f`, mscale, the rotation, the stores as set_rows
/// converts), so the values are those of the unfused launches.
const EPI_ROPE: &str = "EPI_ROPE:
    // The cache row of column cn (both stores).
    ld.param.u64 %rd3, [p_idx];
    cvta.to.global.u64 %rd3, %rd3;
    ld.param.u64 %rd4, [p_nbi0r];
    mad.lo.u64 %rd3, %rd1, %rd4, %rd3;
    ld.global.u32 %t8, [%rd3];
    setp.eq.u32 %p1, %t6, 3;
    @%p1 bra EPI_VSTORE;
    // d = r mod ne0 (the head is mul.hi(r, p_mg_ne0)), pair t = d / 2, %p3: d odd.
@D_OF_ROW@    and.b32 %t11, %t10, 1;
    setp.ne.u32 %p3, %t11, 0;
    sub.u32 %t12, %t10, %t11;
    shr.u32 %t13, %t10, 1;
    mov.f32 %f0, %acc;
    ld.param.u32 %t9, [p_n_dims];
    setp.ge.u32 %p1, %t12, %t9;
    @%p1 bra EPI_RWRITE;
    // cos and sin of pair t times mscale: from the table the CTA's idle warp made
    // during the norm (RT_TABLE), else here.
@TABLE_MADE@    @!%p1 bra EPI_CS;
    mad.lo.u32 %t9, %cn, %R, %cr;
    mul.wide.u32 %rd3, %t9, 8;
    add.u64 %rd3, %sN, %rd3;
    ld.shared.v2.f32 {%f12, %f13}, [%rd3+32];
    bra EPI_ROTATE;
EPI_CS:
@COS_SIN@EPI_ROTATE:
    // x0, x1: the values of rows 2t and 2t + 1; row 2t gets x0 cos - x1 sin, row 2t + 1
    // x0 sin + x1 cos.
    selp.f32 %f1, %f8, %acc, %p3;
    selp.f32 %f2, %acc, %f8, %p3;
    mul.rn.f32 %f4, %f1, %f13;
    mul.rn.f32 %f6, %f2, %f12;
    sub.rn.f32 %f0, %f4, %f6;
    mul.rn.f32 %f4, %f1, %f12;
    mul.rn.f32 %f6, %f2, %f13;
    add.rn.f32 %f7, %f4, %f6;
    selp.f32 %f0, %f7, %f0, %p3;
EPI_RWRITE:
    // The roped value into Q's (role 1) or K's (role 2) rope output.
    setp.eq.u32 %p1, %t6, 2;
    ld.param.u64 %rd3, [p_krope];
    ld.param.u64 %rd4, [p_nbkrope];
    ld.param.u64 %rd5, [p_qrope];
    ld.param.u64 %rd6, [p_nbqrope];
    selp.b64 %rd3, %rd3, %rd5, %p1;
    selp.b64 %rd4, %rd4, %rd6, %p1;
    cvta.to.global.u64 %rd3, %rd3;
    mad.lo.u64 %rd3, %rd1, %rd4, %rd3;
    add.u64 %rd3, %rd3, %rd0;
    st.global.f32 [%rd3], %f0;
    @!%p1 bra DONE;
    ld.param.u32 %t9, [p_rows_k];
    ld.param.u32 %t10, [p_tk];
    ld.param.u64 %rd3, [p_kc];
    ld.param.u64 %rd4, [p_nbkc1];
    ld.param.u64 %rd5, [p_errk];
    bra EPI_STORE;
EPI_VSTORE:
    mov.f32 %f0, %acc;
    ld.param.u32 %t9, [p_rows_v];
    ld.param.u32 %t10, [p_tv];
    ld.param.u64 %rd3, [p_vc];
    ld.param.u64 %rd4, [p_nbvc1];
    ld.param.u64 %rd5, [p_errv];
EPI_STORE:
    // %f0 into element r of cache row %t8, converted as set_rows does; a row outside the
    // cache sets the store's error word instead.
    setp.lt.u32 %p1, %t8, %t9;
    @%p1 bra EPI_STORE_ROW;
    cvta.to.global.u64 %rd5, %rd5;
    st.global.u32 [%rd5], 1;
    bra DONE;
EPI_STORE_ROW:
    cvta.to.global.u64 %rd3, %rd3;
    cvt.u64.u32 %rd6, %t8;
    mad.lo.u64 %rd3, %rd6, %rd4, %rd3;
    setp.ne.u32 %p1, %t10, 0;
    @%p1 bra EPI_STORE_16;
    add.u64 %rd3, %rd3, %rd0;
    st.global.f32 [%rd3], %f0;
    bra DONE;
EPI_STORE_16:
    mul.wide.u32 %rd6, %t0, 2;
    add.u64 %rd3, %rd3, %rd6;
    setp.eq.u32 %p1, %t10, 1;
    cvt.rn.f16.f32 %hh0, %f0;
    cvt.rn.bf16.f32 %hh1, %f0;
    selp.b16 %hh0, %hh0, %hh1, %p1;
    st.global.b16 [%rd3], %hh0;
    bra DONE;
";

/// The theta chain's last `%t14` (0 to 7) multiplications, each under its own test.
fn theta_last() -> String {
    (0..7)
        .map(|k| format!("    setp.gt.u32 %p1, %t14, {k};\n    @%p1 mul.rn.f32 %f2, %f2, %f3;\n"))
        .collect()
}

/// rope.ptx's `sincos_f`, inlined: its instructions with the registers renamed
/// (`%f3` -> `%sf3`, ...), the argument taken from `%f5` and sin, cos left in `%f12`,
/// `%f13`, so that the RoPE epilogue runs the very instructions the rope kernels call
/// (and no call: its ABI would spill the kernel's registers).
fn sincos_inline() -> String {
    const ROPE: &str = include_str!("../../ggml-cuda/kernels/rope.ptx");
    let start = ROPE
        .find(".func (.param .align 8 .b8 r[8]) sincos_f(")
        .expect("rope.ptx defines sincos_f");
    let body = &ROPE[start..];
    let body = &body[..body.find("\n}\n").expect("sincos_f ends")];
    let mut f = String::from("    // sincos_f of rope.ptx, inlined by the generator\n");
    for line in body.lines().skip(1) {
        let t = line.trim();
        if t.is_empty() || t == "{" || t.starts_with(".reg") || t == "ret;" {
            continue;
        }
        let renamed = rename_regs(t);
        let out = match renamed.as_str() {
            "ld.param.f32 %sf0, [p_x];" => "mov.f32 %sf0, %f5;".to_string(),
            x if x.starts_with("st.param.f32 [r+0], ") => {
                format!("mov.f32 %f12, {}", &x["st.param.f32 [r+0], ".len()..])
            }
            x if x.starts_with("st.param.f32 [r+4], ") => {
                format!("mov.f32 %f13, {}", &x["st.param.f32 [r+4], ".len()..])
            }
            x => x.to_string(),
        };
        if t.starts_with("//") {
            f += &format!("    {t}\n");
        } else {
            f += &format!("    {out}\n");
        }
    }
    assert!(
        !f.contains("param"),
        "sincos_f took a form the inliner does not know"
    );
    f
}

/// `%f3` -> `%sf3`, `%r1` -> `%sr1`, `%p0` -> `%sp0` in one PTX line.
fn rename_regs(line: &str) -> String {
    let mut out = String::with_capacity(line.len() + 8);
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() {
        out.push(b[i] as char);
        let reg = b[i] == b'%'
            && i + 2 < b.len()
            && matches!(b[i + 1], b'f' | b'r' | b'p')
            && b[i + 2].is_ascii_digit();
        if reg {
            out.push('s');
        }
        i += 1;
    }
    out
}

/// The norm prologue's sum of squares, x_i^2 for i = lane, lane + 32, ... in order: 16
/// values at a time while 20 or more are left, then the last 0 to 19 in blocks of 16, 8,
/// 4, 2 and 1 (each block taken or not as a whole, the same for every lane: K is a
/// multiple of 32), all of those loads issued before their first fma; then the warp's
/// butterfly (16, 8, 4, 2, 1). In: `%rd1` the column, `%t3` the lane, `%f0` = 0. The
/// 8- and 4-blocks use the 16-block's registers: below 20 values the 16-block is never
/// taken with either (at most 19 values live, as few registers as the 16-block needs).
fn norm_sum() -> String {
    let wide: Vec<String> = (0..8)
        .map(|i| format!("%cf{i}"))
        .chain((0..8).map(|i| format!("%cg{i}")))
        .collect();
    let narrow: Vec<String> = (1..=3).map(|i| format!("%f{i}")).collect();
    let loads = |regs: &[String]| -> String {
        regs.iter()
            .enumerate()
            .map(|(i, r)| format!("    ld.global.f32 {r}, [%rd2+{}];\n", 128 * i))
            .collect()
    };
    let fmas = |regs: &[String]| -> String {
        regs.iter()
            .map(|r| format!("    fma.rn.f32 %f0, {r}, {r}, %f0;\n"))
            .collect()
    };
    let mut f = String::from(
        "    mov.u32 %t5, %NK;
NORM_SUM32:
    setp.lt.u32 %p1, %t5, 20;
    @%p1 bra NORM_TAIL;
    mul.wide.u32 %rd2, %t3, 4;
    add.u64 %rd2, %rd1, %rd2;
",
    );
    f += &loads(&wide);
    f += &fmas(&wide);
    f += "    add.u32 %t3, %t3, 512;
    sub.u32 %t5, %t5, 16;
    bra NORM_SUM32;
NORM_TAIL:
    // the last 0 to 19 values: the blocks' tests, then their loads, then their fmas
";
    let blocks: [(u32, &[String]); 5] = [
        (16, &wide),
        (8, &wide[0..8]),
        (4, &wide[8..12]),
        (2, &narrow[0..2]),
        (1, &narrow[2..3]),
    ];
    for (i, (n, _)) in blocks.iter().enumerate() {
        f += &format!("    and.b32 %t6, %t5, {n};\n    setp.ne.u32 %pn{i}, %t6, 0;\n");
    }
    f += "    mul.wide.u32 %rd2, %t3, 4;\n    add.u64 %rd2, %rd1, %rd2;\n";
    for (i, (n, regs)) in blocks.iter().enumerate() {
        f += &format!("    @!%pn{i} bra NORM_L{i};\n");
        f += &loads(regs);
        if *n > 1 {
            f += &format!("    add.u64 %rd2, %rd2, {};\n", 128 * n);
        }
        f += &format!("NORM_L{i}:\n");
    }
    for (i, (_, regs)) in blocks.iter().enumerate() {
        f += &format!("    @!%pn{i} bra NORM_F{i};\n");
        f += &fmas(regs);
        f += &format!("NORM_F{i}:\n");
    }
    f += "NORM_REDUCE:\n    bar.warp.sync 0xffffffff;\n    // K, -K and RN(1/K) for the mean (issued while the shuffles run)\n    cvt.rn.f32.u32 %f9, %t2;\n    ld.param.f32 %f11, [p_rk];\n";
    for lane in [16, 8, 4, 2, 1] {
        f.push_str(&format!(
            "    shfl.sync.bfly.b32 %f1, %f0, {lane}, 31, 0xffffffff;\n    add.rn.f32 %f0, %f0, %f1;\n"
        ));
        if lane == 8 {
            f.push_str("    neg.f32 %f10, %f9;\n");
        }
    }
    f
}

/// Chunks per unrolled group of stage C.
const C_GROUP: usize = 8;

/// Chunks per unrolled group of the decode class's stage C (a lane's chunks are 8
/// apart: at K = 576 it has 2 or 3, at 1536 6).
const C8_GROUP: usize = 2;

/// Stage C: the f32 chain of output (cr, cn) over the tile's chunks, in order; in the
/// decode class (`%pc8`) one chain per lane over chunks j = thr (mod 8) of the tile (a
/// tile starts at a multiple of 8 chunks, so that is j mod 8 in K too), the 8 chains
/// meeting in the epilogue. The thread's chunk records lie at fixed strides from three
/// pointers (W: 16 bytes, A: 48 bytes, S: 4 bytes per chunk), so a group of chunks
/// issues all its shared loads at once, then the products dw * da and float(sumi) (off
/// the chain), then the chain's two fma per chunk back to back. The chunks left over,
/// and every chunk when a group is Q2_K, go one at a time.
fn stage_c() -> String {
    let mut f = String::from(
        "    // Stage C: the f32 chain of output (cr, cn) over the tile's chunks, in order.
    @!%pact bra C_DONE;
    add.u32 %t1, %TC, 1;
    mul.lo.u32 %t2, %cn, %TC;
    mad.lo.u32 %t0, %cn, %R, %cr;
    add.u32 %t3, %TC, 4;
    mul.lo.u32 %t1, %cr, %t1;
    mul.wide.u32 %rd0, %t2, 48;
    mul.lo.u32 %t0, %t0, %t3;
    add.u64 %rd6, %sA, %rd0;
    mul.wide.u32 %rd0, %t1, 16;
    add.u64 %rd5, %sW, %rd0;
    mul.wide.u32 %rd0, %t0, 4;
    add.u64 %rd7, %sS, %rd0;
    @%pc8 bra C8;
    mov.u32 %j, 0;
    @%pq2 bra C_ONE;
",
    );
    f += &chunk_groups("C", C_GROUP, 1);
    f += &one_chunk("C", 1);
    f += "C8:
    // The decode class: this lane's chunks j = thr (mod 8).
    and.b32 %j, %thr, 7;
    mul.wide.u32 %rd0, %j, 16;
    add.u64 %rd5, %rd5, %rd0;
    mul.wide.u32 %rd0, %j, 48;
    add.u64 %rd6, %rd6, %rd0;
    mul.wide.u32 %rd0, %j, 4;
    add.u64 %rd7, %rd7, %rd0;
    @%pq2 bra C8_ONE;
";
    f += &chunk_groups("C8", C8_GROUP, 8);
    f += &one_chunk("C8", 8);
    f
}

/// Stage C's groups of `g` chunks `step` apart (labels `{tag}_GROUP`, leaving for
/// `{tag}_ONE` when fewer than `g` are left): the chunk index in `%j`, the record pointers
/// in `%rd5`, `%rd6`, `%rd7`.
fn chunk_groups(tag: &str, g: usize, step: usize) -> String {
    // The test for the next group is computed inside the group, so that its branch never
    // waits.
    let span = step * (g - 1);
    let mut f = format!(
        "    add.u32 %t12, %j, {span};
    setp.ge.u32 %p3, %t12, %TCa;
{tag}_GROUP:
    @%p3 bra {tag}_ONE;
"
    );
    for k in 0..g {
        f += &format!(
            "    ld.shared.v2.b32 {{%cw{k}, %cm{k}}}, [%rd5+{}];
    ld.shared.v2.b32 {{%ca{k}, %cb{k}}}, [%rd6+{}];
",
            16 * step * k,
            48 * step * k
        );
    }
    if step == 1 {
        for q in 0..g / 4 {
            f += &format!(
                "    ld.shared.v4.b32 {{%cs{}, %cs{}, %cs{}, %cs{}}}, [%rd7+{}];
",
                4 * q,
                4 * q + 1,
                4 * q + 2,
                4 * q + 3,
                16 * q
            );
        }
    } else {
        for k in 0..g {
            f += &format!("    ld.shared.b32 %cs{k}, [%rd7+{}];\n", 4 * step * k);
        }
    }
    // (the .b32 registers feed the f32 instructions directly: a mov in between would
    // hold each product up by its latency)
    f += &format!("    add.u32 %t12, %t12, {};\n", step * g);
    for k in 0..g {
        f += &format!(
            "    mul.rn.f32 %cf{k}, %cw{k}, %ca{k};
    cvt.rn.f32.s32 %cg{k}, %cs{k};
"
        );
    }
    f += "    setp.ge.u32 %p3, %t12, %TCa;\n";
    for k in 0..g {
        f += &format!(
            "    fma.rn.f32 %acc, %cf{k}, %cg{k}, %acc;
    fma.rn.f32 %acc, %cm{k}, %cb{k}, %acc;
"
        );
    }
    f += &format!(
        "    add.u32 %j, %j, {};
    add.u64 %rd5, %rd5, {};
    add.u64 %rd6, %rd6, {};
    add.u64 %rd7, %rd7, {};
    bra {tag}_GROUP;
",
        step * g,
        16 * step * g,
        48 * step * g,
        4 * step * g
    );
    f
}

/// Stage C's chunks one at a time, `step` apart, from `%j` to the tile's end (labels
/// `{tag}_ONE`, `{tag}_O0`), with Q2_K's min term.
fn one_chunk(tag: &str, step: usize) -> String {
    format!(
        "{tag}_ONE:
    setp.ge.u32 %p0, %j, %TCa;
    @%p0 bra C_DONE;
    ld.shared.v4.b32 {{%W0, %W1, %W2, %W3}}, [%rd5];
    ld.shared.v4.b32 {{%a0, %a1, %a2, %a3}}, [%rd6];
    ld.shared.b32 %x0, [%rd7];
    mov.b32 %f0, %W0;
    mov.b32 %f1, %W1;
    mov.b32 %f2, %W2;
    mov.b32 %f3, %a0;
    mov.b32 %f4, %a1;
    mul.rn.f32 %f5, %f0, %f3;
    cvt.rn.f32.s32 %f6, %x0;
    fma.rn.f32 %acc, %f5, %f6, %acc;
    fma.rn.f32 %acc, %f1, %f4, %acc;
    @!%pq2 bra {tag}_O0;
    setp.eq.f32 %p1, %f2, 0f00000000;
    @%p1 bra {tag}_O0;
    and.b32 %t10, %W3, 0xFFFF;
    shr.u32 %t11, %W3, 16;
    mul.lo.s32 %t10, %t10, %a2;
    mad.lo.s32 %t10, %t11, %a3, %t10;
    mul.rn.f32 %f5, %f2, %f3;
    neg.f32 %f5, %f5;
    cvt.rn.f32.s32 %f6, %t10;
    fma.rn.f32 %acc, %f5, %f6, %acc;
{tag}_O0:
    add.u32 %j, %j, {step};
    add.u64 %rd5, %rd5, {};
    add.u64 %rd6, %rd6, {};
    add.u64 %rd7, %rd7, {};
    bra {tag}_ONE;
",
        16 * step,
        48 * step,
        4 * step
    )
}

/// `dst[i]`, i = 0..n, = the 32-bit words at the 2-byte aligned address `[a]`, `[a+4]`,
/// ...: n 32-bit loads where `pal` (a is 4-byte aligned); else a 16-bit load, n - 1
/// 32-bit loads and a 16-bit load, all inside the n words, put back together.
fn ld_words(dst: &[&str], a: &str, pal: &str) -> String {
    let n = dst.len();
    let mut f = String::new();
    for (i, d) in dst.iter().enumerate() {
        f += &format!("    @{pal} ld.global.nc.b32 {d}, [{a}+{}];\n", 4 * i);
    }
    f += &format!("    @!{pal} ld.global.nc.b16 %hh4, [{a}];\n");
    for i in 0..n - 1 {
        f += &format!("    @!{pal} ld.global.nc.b32 %X{i}, [{a}+{}];\n", 2 + 4 * i);
    }
    f += &format!("    @!{pal} ld.global.nc.b16 %hh5, [{a}+{}];\n", 4 * n - 2);
    for i in 0..n - 1 {
        f += &format!("    @!{pal} mov.b32 {{%xl{i}, %xh{i}}}, %X{i};\n");
    }
    for (i, d) in dst.iter().enumerate() {
        let lo = if i == 0 {
            "%hh4".to_string()
        } else {
            format!("%xh{}", i - 1)
        };
        let hi = if i == n - 1 {
            "%hh5".to_string()
        } else {
            format!("%xl{i}")
        };
        f += &format!("    @!{pal} mov.b32 {d}, {{{lo}, {hi}}};\n");
    }
    f
}

/// `%pal = (the address in the b64 register a is 4-byte aligned)`.
fn aligned4(a: &str) -> String {
    format!(
        "    cvt.u32.u64 %t14, {a};
    and.b32 %t14, %t14, 3;
    setp.eq.u32 %pal, %t14, 0;
"
    )
}

/// Registers `%{p}0` .. `%{p}{n-1}`.
fn regs(p: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("%{p}{i}")).collect()
}

/// [`ld_words`] into `%{p}0..%{p}{n-1}`.
fn ld_regs(p: &str, n: usize, a: &str, pal: &str) -> String {
    let r = regs(p, n);
    let refs: Vec<&str> = r.iter().map(String::as_str).collect();
    ld_words(&refs, a, pal)
}

/// `%U{i} = %W{i} & 0x0F0F0F0F` (values 4i..4i+3) and `%U{4+i} = (%W{i} >> 4) &
/// 0x0F0F0F0F` (values 16+4i..), i = 0..4: the nibbles of a 16-byte qs array.
fn split_nibbles() -> String {
    let mut f = String::new();
    for i in 0..4 {
        f += &format!(
            "    and.b32 %U{i}, %W{i}, 0x0F0F0F0F;
    shr.b32 %t1, %W{i}, 4;
    and.b32 %U{}, %t1, 0x0F0F0F0F;
",
            4 + i
        );
    }
    f
}

/// ORs bit 4 of values i (bit i of `%H0`) into the bytes of `%U0..%U7`.
fn fifth_bits() -> String {
    let mut f = String::new();
    for i in 0..8 {
        f += &format!(
            "    shr.b32 %t13, %H0, {};
    and.b32 %t13, %t13, 15;
    mul.lo.u32 %t13, %t13, 0x00204081;
    and.b32 %t13, %t13, 0x01010101;
    shl.b32 %t13, %t13, 4;
    or.b32 %U{i}, %U{i}, %t13;
",
            4 * i
        );
    }
    f
}

/// `%U{i} = (%W{i} >> shift) & mask` for i = 0..8 (`shift` a register or a number).
fn shift_mask(shift: &str, mask: &str) -> String {
    (0..8)
        .map(|i| {
            format!(
                "    shr.b32 %U{i}, %W{i}, {shift};
    and.b32 %U{i}, %U{i}, {mask};
"
            )
        })
        .collect()
}

/// `%U{i} |= ((%H{i} >> shift) & mask) << up` for i = 0..8.
fn or_high(shift: &str, mask: &str, up: u32) -> String {
    (0..8)
        .map(|i| {
            format!(
                "    shr.b32 %t1, %H{i}, {shift};
    and.b32 %t1, %t1, {mask};
    shl.b32 %t1, %t1, {up};
    or.b32 %U{i}, %U{i}, %t1;
"
            )
        })
        .collect()
}

/// Defaults of the chunk outputs most formats leave at their neutral value.
const PLAIN_CHUNK: &str = "    mov.b32 %sc0, 1;
    mov.b32 %sc1, 1;
    mov.f32 %dm, 0f00000000;
    mov.b32 %m01, 0;
";

/// The block `%t0` (super-block for k-quants) of `size` bytes of row `%rw`, in `%rb`.
fn block(size: u32) -> String {
    block_of("%t0", size)
}

/// Block `index` (a register), of `size` bytes, of the row at `%rw`: its address in `%rb`.
fn block_of(index: &str, size: u32) -> String {
    format!(
        "    mul.wide.u32 %rd0, {index}, {size};
    add.u64 %rb, %rw, %rd0;
"
    )
}

/// Legacy formats: chunk `%j` is block `%j`, of `size` bytes, in `%rb`.
fn legacy_block(size: u32) -> String {
    block_of("%j", size)
}

/// [`PLAIN_CHUNK`], then the zero-point terms of a format whose values are stored offset
/// by `z` (0 for the formats with a min).
fn plain_chunk_with_zero_point(z: u32) -> String {
    format!("{PLAIN_CHUNK}    mov.b32 %zs0, {z};\n    mov.b32 %zs1, {z};\n")
}

/// Sub-block `%s = j & 7`, `%t0 = j >> 3` (super-block), `%sn = s >> 2`, `%st = s & 3`.
const KQ_INDEX: &str = "    shr.u32 %t0, %j, 3;
    and.b32 %s, %j, 7;
    shr.u32 %sn, %s, 2;
    and.b32 %st, %s, 3;
";

/// [`fragment`] as `qmm`'s stage B runs it. With flags bit 12 (the `q8-window` tuning),
/// Q8_0 loads the 48 bytes from its block's address rounded down to 16 (`o` = the address
/// mod 16, even: the 34 bytes lie inside) in three 16-byte loads, where they lie inside
/// the matrix, and shifts the block out of them in registers: a warp's loads then touch
/// about a third of the sectors that [`ld_words`]' nine or ten narrow loads touch (lanes'
/// blocks are 34 bytes apart; the output head: 8.90 M -> 3.15 M sectors). Same values.
fn qmm_fragment(dtype: &str) -> String {
    if dtype != "Q8_0" {
        return fragment(dtype);
    }
    let win: Vec<String> = (0..8)
        .map(|i| format!("%W{i}"))
        .chain((0..4).map(|i| format!("%X{i}")))
        .collect();
    let mut f = legacy_block(34);
    f += "    // The window [a16, a16 + 48), a16 = rb - o, when asked for (flags bit 12) and
    // inside [w, w + M * nbw).
    and.b32 %t1, %flags, 4096;
    setp.eq.u32 %p1, %t1, 0;
    @%p1 bra B_Q8_0_NARROW;
    cvt.u32.u64 %t1, %rb;
    and.b32 %t1, %t1, 15;
    cvt.u64.u32 %rd1, %t1;
    sub.u64 %ra, %rb, %rd1;
    setp.ge.u64 %p1, %ra, %gw;
    cvt.u64.u32 %rd1, %gM;
    mad.lo.u64 %rd1, %rd1, %gnbw, %gw;
    add.u64 %rd0, %ra, 48;
    setp.le.u64 %p2, %rd0, %rd1;
    and.pred %p1, %p1, %p2;
    @!%p1 bra B_Q8_0_NARROW;
    ld.global.nc.v4.b32 {%W0, %W1, %W2, %W3}, [%ra];
    ld.global.nc.v4.b32 {%W4, %W5, %W6, %W7}, [%ra+16];
    ld.global.nc.v4.b32 {%X0, %X1, %X2, %X3}, [%ra+32];
    // Words o / 4 .. of the window to the front: by 1 word where bit 2 of o is set, by
    // 2 where bit 3 is.
    and.b32 %t2, %t1, 4;
    setp.ne.u32 %p1, %t2, 0;
";
    // Word k takes word k + by where %p1, k ascending (each read before it is written).
    let rotate = |by: usize, words: usize| -> String {
        (0..words)
            .map(|k| {
                format!(
                    "    selp.b32 {}, {}, {}, %p1;\n",
                    win[k],
                    win[k + by],
                    win[k]
                )
            })
            .collect()
    };
    f += &rotate(1, 11);
    f += "    and.b32 %t2, %t1, 8;\n    setp.ne.u32 %p1, %t2, 0;\n";
    f += &rotate(2, 9);
    f += "    // d at byte o mod 4 of word 0 (0 or 2), the quants from byte o mod 4 + 2: word i
    // = words (i, i + 1) shifted right by 16 or 32 bits.
    and.b32 %t2, %t1, 2;
    shl.b32 %t2, %t2, 3;
    shr.b32 %t3, %W0, %t2;
    mov.b32 {%hh0, %hh1}, %t3;
    add.u32 %t2, %t2, 16;
";
    for i in 0..8 {
        f += &format!(
            "    shf.r.clamp.b32 %W{i}, {}, {}, %t2;\n",
            win[i],
            win[i + 1]
        );
    }
    f += "    bra B_Q8_0_HAVE;\nB_Q8_0_NARROW:\n";
    f += &q8_0_narrow_loads();
    f += "B_Q8_0_HAVE:\n";
    f += &q8_0_unpack();
    f
}

/// Q8_0's block at `%rb` into `%hh0` (d) and `%W0..%W7` (the quants, as i8x4 words):
/// a 16-bit load, then [`ld_words`] from the 2-byte aligned quants.
fn q8_0_narrow_loads() -> String {
    let mut f = String::from(
        "    ld.global.nc.b16 %hh0, [%rb];
    add.u64 %ra, %rb, 2;
",
    );
    f += &aligned4("%ra");
    f += &ld_regs("W", 8, "%ra", "%pal");
    f
}

/// Q8_0's chunk outputs from `%hh0` and `%W0..%W7`: u = q xor 0x80, z = 128.
fn q8_0_unpack() -> String {
    let mut f = String::from("    cvt.f32.f16 %dw, %hh0;\n    mov.f32 %mw, 0f00000000;\n");
    for i in 0..8 {
        f += &format!("    xor.b32 %U{i}, %W{i}, 0x80808080;\n");
    }
    f += &plain_chunk_with_zero_point(128);
    f
}

/// The fragment of `dtype`: from the row address `%rw` and the chunk index `%j`,
/// computes the chunk's 32 unsigned quants `%U0..%U7` (value 4i+b in byte b of `%U{i}`),
/// its integer scales `%sc0` (values 0..15), `%sc1` (16..31), the zero-point terms
/// `%zs0 = z * sc0`, `%zs1 = z * sc1`, and `%dw`, `%mw`, `%dm` (f32) and `%m01` (Q2_K's
/// mins, m0 | m1 << 16).
fn fragment(dtype: &str) -> String {
    let mut f = String::new();
    match dtype {
        "Q4_0" => {
            // {d: f16, qs[16]} = 18 bytes, 2-byte aligned; value i = low nibble of qs[i],
            // value 16+i = high nibble.
            f += &legacy_block(18);
            f += "    ld.global.nc.b16 %hh0, [%rb];
    add.u64 %ra, %rb, 2;
";
            f += &aligned4("%ra");
            f += &ld_regs("W", 4, "%ra", "%pal");
            f += "    cvt.f32.f16 %dw, %hh0;\n    mov.f32 %mw, 0f00000000;\n";
            f += &split_nibbles();
            f += &plain_chunk_with_zero_point(8);
        }
        "Q4_1" => {
            // {d, m: f16, qs[16]} = 20 bytes, 4-byte aligned.
            f += &legacy_block(20);
            f += "    ld.global.nc.b32 %t1, [%rb];
    ld.global.nc.b32 %W0, [%rb+4];
    ld.global.nc.b32 %W1, [%rb+8];
    ld.global.nc.b32 %W2, [%rb+12];
    ld.global.nc.b32 %W3, [%rb+16];
    mov.b32 {%hh0, %hh1}, %t1;
    cvt.f32.f16 %dw, %hh0;
    cvt.f32.f16 %mw, %hh1;
";
            f += &split_nibbles();
            f += &plain_chunk_with_zero_point(0);
        }
        "Q5_0" => {
            // {d: f16, qh: u32, qs[16]} = 22 bytes, 2-byte aligned; bit i of qh is bit 4 of
            // value i.
            f += &legacy_block(22);
            f += "    ld.global.nc.b16 %hh0, [%rb];
    add.u64 %ra, %rb, 2;
";
            f += &aligned4("%ra");
            f += &ld_words(&["%H0", "%W0", "%W1", "%W2", "%W3"], "%ra", "%pal");
            f += "    cvt.f32.f16 %dw, %hh0;\n    mov.f32 %mw, 0f00000000;\n";
            f += &split_nibbles();
            f += &fifth_bits();
            f += &plain_chunk_with_zero_point(16);
        }
        "Q5_1" => {
            // {d, m: f16, qh: u32, qs[16]} = 24 bytes, 8-byte aligned.
            f += &legacy_block(24);
            f += "    ld.global.nc.v2.b32 {%t1, %H0}, [%rb];
    ld.global.nc.v2.b32 {%W0, %W1}, [%rb+8];
    ld.global.nc.v2.b32 {%W2, %W3}, [%rb+16];
    mov.b32 {%hh0, %hh1}, %t1;
    cvt.f32.f16 %dw, %hh0;
    cvt.f32.f16 %mw, %hh1;
";
            f += &split_nibbles();
            f += &fifth_bits();
            f += &plain_chunk_with_zero_point(0);
        }
        "Q8_0" => {
            // {d: f16, qs: i8[32]} = 34 bytes, 2-byte aligned; u = q xor 0x80, z = 128.
            f += &legacy_block(34);
            f += &q8_0_narrow_loads();
            f += &q8_0_unpack();
        }
        "Q2_K" => {
            // {scales[16], qs[64], d, dmin: f16} = 84 bytes, 4-byte aligned. Sub-block s:
            // u_i = (qs[32n + i] >> 2t) & 3; scales[2s], scales[2s + 1] hold scale (low
            // nibble) and min (high nibble) of values 0..15 and 16..31.
            f += KQ_INDEX;
            f += &block(84);
            f += "    ld.global.nc.b32 %t1, [%rb+80];
    mov.b32 {%hh0, %hh1}, %t1;
    cvt.f32.f16 %dw, %hh0;
    cvt.f32.f16 %dm, %hh1;
    mov.f32 %mw, 0f00000000;
    shl.b32 %t2, %s, 1;
    cvt.u64.u32 %rd1, %t2;
    add.u64 %ra, %rb, %rd1;
    ld.global.nc.b16 %hh2, [%ra];
    cvt.u32.u16 %t3, %hh2;
    and.b32 %sc0, %t3, 15;
    bfe.u32 %t4, %t3, 4, 4;
    bfe.u32 %sc1, %t3, 8, 4;
    bfe.u32 %t5, %t3, 12, 4;
    shl.b32 %t5, %t5, 16;
    or.b32 %m01, %t4, %t5;
    mov.b32 %zs0, 0;
    mov.b32 %zs1, 0;
    shl.b32 %t2, %sn, 5;
    cvt.u64.u32 %rd1, %t2;
    add.u64 %ra, %rb, %rd1;
";
            for i in 0..8 {
                f += &format!("    ld.global.nc.b32 %W{i}, [%ra+{}];\n", 16 + 4 * i);
            }
            f += "    shl.b32 %t2, %st, 1;\n";
            f += &shift_mask("%t2", "0x03030303");
        }
        "Q3_K" => {
            // {hmask[32], qs[64], scales[12], d: f16} = 110 bytes, 2-byte aligned.
            // Sub-block s: u_i = (qs[32n + i] >> 2t) & 3 | ((hmask[i] >> s) & 1) << 2,
            // z = 4; 6-bit scale k = (scales[k % 8] >> 4(k / 8)) & 15 |
            // ((scales[8 + k % 4] >> 2(k / 4)) & 3) << 4, minus 32; sc0, sc1 = scales 2s,
            // 2s + 1.
            f += KQ_INDEX;
            f += &block(110);
            f += "    ld.global.nc.b16 %hh0, [%rb+108];
    cvt.f32.f16 %dw, %hh0;
    mov.f32 %mw, 0f00000000;
    shl.b32 %t2, %st, 1;
    cvt.u64.u32 %rd1, %t2;
    add.u64 %ra, %rb, %rd1;
    ld.global.nc.u8 %t3, [%ra+96];
    ld.global.nc.u8 %t4, [%ra+97];
    shl.b32 %t5, %sn, 2;
    shr.b32 %t3, %t3, %t5;
    and.b32 %t3, %t3, 15;
    shr.b32 %t4, %t4, %t5;
    and.b32 %t4, %t4, 15;
    and.b32 %t2, %st, 1;
    shl.b32 %t2, %t2, 1;
    cvt.u64.u32 %rd1, %t2;
    add.u64 %ra, %rb, %rd1;
    ld.global.nc.u8 %t6, [%ra+104];
    ld.global.nc.u8 %t7, [%ra+105];
    shr.u32 %t5, %s, 1;
    shl.b32 %t5, %t5, 1;
    shr.b32 %t6, %t6, %t5;
    and.b32 %t6, %t6, 3;
    shl.b32 %t6, %t6, 4;
    or.b32 %t3, %t3, %t6;
    sub.s32 %sc0, %t3, 32;
    shr.b32 %t7, %t7, %t5;
    and.b32 %t7, %t7, 3;
    shl.b32 %t7, %t7, 4;
    or.b32 %t4, %t4, %t7;
    sub.s32 %sc1, %t4, 32;
    mul.lo.s32 %zs0, %sc0, 4;
    mul.lo.s32 %zs1, %sc1, 4;
    mov.f32 %dm, 0f00000000;
    mov.b32 %m01, 0;
";
            f += &aligned4("%rb");
            f += "    shl.b32 %t2, %sn, 5;
    cvt.u64.u32 %rd1, %t2;
    add.u64 %ra, %rb, %rd1;
    add.u64 %ra, %ra, 32;
";
            f += &ld_regs("W", 8, "%ra", "%pal");
            f += &ld_regs("H", 8, "%rb", "%pal");
            f += "    shl.b32 %t2, %st, 1;\n";
            f += &shift_mask("%t2", "0x03030303");
            f += &or_high("%s", "0x01010101", 2);
        }
        "Q4_K" | "Q5_K" => {
            // Q4_K: {d, dmin: f16, scales[12], qs[128]} = 144 bytes; Q5_K: {d, dmin,
            // scales[12], qh[32], qs[128]} = 176 bytes; both 16-byte aligned. Sub-block
            // s: values are the low (s even) or high (s odd) nibbles of qs[32(s/2)..],
            // Q5_K adds bit s of qh[i] as bit 4; the 6-bit scale sc and min m of s (s < 4:
            // q[s] & 63, q[s+4] & 63; else (q[s+4] & 15) | (q[s-4] >> 6) << 4 and
            // (q[s+4] >> 4) | (q[s] >> 6) << 4, q = scales); dw = d, mw = -(dmin * m).
            let (size, qs) = if dtype == "Q4_K" {
                (144, 16)
            } else {
                (176, 48)
            };
            f += KQ_INDEX;
            f += &block(size);
            f += "    ld.global.nc.b32 %t1, [%rb];
    mov.b32 {%hh0, %hh1}, %t1;
    cvt.f32.f16 %dw, %hh0;
    cvt.f32.f16 %f0, %hh1;
    cvt.u64.u32 %rd1, %s;
    add.u64 %ra, %rb, %rd1;
    ld.global.nc.u8 %t3, [%ra+4];
    ld.global.nc.u8 %t4, [%ra+8];
    ld.global.nc.u8 %t5, [%ra];
    and.b32 %t6, %t3, 63;
    and.b32 %t7, %t4, 63;
    and.b32 %t8, %t4, 15;
    shr.b32 %t9, %t5, 6;
    shl.b32 %t9, %t9, 4;
    or.b32 %t8, %t8, %t9;
    shr.b32 %t10, %t4, 4;
    shr.b32 %t9, %t3, 6;
    shl.b32 %t9, %t9, 4;
    or.b32 %t10, %t10, %t9;
    setp.lt.u32 %p1, %s, 4;
    selp.b32 %sc0, %t6, %t8, %p1;
    selp.b32 %t7, %t7, %t10, %p1;
    mov.b32 %sc1, %sc0;
    cvt.rn.f32.u32 %f1, %t7;
    mul.rn.f32 %f1, %f0, %f1;
    neg.f32 %mw, %f1;
    mov.b32 %zs0, 0;
    mov.b32 %zs1, 0;
    mov.f32 %dm, 0f00000000;
    mov.b32 %m01, 0;
";
            f += &format!(
                "    shr.u32 %t2, %s, 1;
    shl.b32 %t2, %t2, 5;
    cvt.u64.u32 %rd1, %t2;
    add.u64 %ra, %rb, %rd1;
    ld.global.nc.v4.b32 {{%W0, %W1, %W2, %W3}}, [%ra+{qs}];
    ld.global.nc.v4.b32 {{%W4, %W5, %W6, %W7}}, [%ra+{}];
    and.b32 %t2, %s, 1;
    shl.b32 %t2, %t2, 2;
",
                qs + 16
            );
            f += &shift_mask("%t2", "0x0F0F0F0F");
            if dtype == "Q5_K" {
                f += "    ld.global.nc.v4.b32 {%H0, %H1, %H2, %H3}, [%rb+16];
    ld.global.nc.v4.b32 {%H4, %H5, %H6, %H7}, [%rb+32];
";
                f += &or_high("%s", "0x01010101", 4);
            }
        }
        "Q6_K" => {
            // {ql[128], qh[64], scales: i8[16], d: f16} = 210 bytes, 2-byte aligned.
            // Sub-block s: low bits from ql[64n + 32(t & 1) + i] (nibble t / 2), high bits
            // (qh[32n + i] >> 2t) & 3, z = 32, scales sc[8n + 2t], sc[8n + 2t + 1].
            f += KQ_INDEX;
            f += &block(210);
            f += "    ld.global.nc.b16 %hh0, [%rb+208];
    cvt.f32.f16 %dw, %hh0;
    mov.f32 %mw, 0f00000000;
    shl.b32 %t2, %sn, 3;
    shl.b32 %t3, %st, 1;
    add.u32 %t2, %t2, %t3;
    cvt.u64.u32 %rd1, %t2;
    add.u64 %ra, %rb, %rd1;
    ld.global.nc.s8 %sc0, [%ra+192];
    ld.global.nc.s8 %sc1, [%ra+193];
    shl.b32 %zs0, %sc0, 5;
    shl.b32 %zs1, %sc1, 5;
    mov.f32 %dm, 0f00000000;
    mov.b32 %m01, 0;
";
            f += &aligned4("%rb");
            f += "    shl.b32 %t2, %sn, 6;
    and.b32 %t3, %st, 1;
    shl.b32 %t3, %t3, 5;
    add.u32 %t2, %t2, %t3;
    cvt.u64.u32 %rd1, %t2;
    add.u64 %ra, %rb, %rd1;
";
            f += &ld_regs("W", 8, "%ra", "%pal");
            f += "    shl.b32 %t2, %sn, 5;
    cvt.u64.u32 %rd1, %t2;
    add.u64 %ra, %rb, %rd1;
    add.u64 %ra, %ra, 128;
";
            f += &ld_regs("H", 8, "%ra", "%pal");
            f += "    shr.u32 %t2, %st, 1;
    shl.b32 %t2, %t2, 2;
    shl.b32 %t3, %st, 1;
";
            f += &shift_mask("%t2", "0x0F0F0F0F");
            f += &or_high("%t3", "0x03030303", 4);
        }
        other => panic!("no fragment for {other}"),
    }
    f
}

/// Stage B for one dtype: thread t takes tasks t, t + T, t + 2T, ... of the current group
/// and K-tile, task = (row r, chunk jt), r-major, so a warp's lanes take neighbouring
/// chunks of a row (and the next row's after the last). Per column the thread dots the
/// chunk's 32 quants with the activation block (8 dp4a per half), subtracts the
/// zero-point terms and stores sumi in S; it also stores the chunk's dw, mw, dm, m01 in W.
const LOOP: &str = "
B_@DT@:
    mul.lo.u32 %Q, %gRg, %TCa;
    mov.u32 %br, %br0;
    mov.u32 %bjt, %bjt0;
    mov.u32 %base, 0;
B_@DT@_LOOP:
    setp.ge.u32 %p0, %base, %Q;
    @%p0 bra B_NEXT;
    add.u32 %t0, %base, %thr;
    setp.ge.u32 %p0, %t0, %Q;
    @%p0 bra B_@DT@_ADVANCE;
@ROW@    add.u32 %j, %tb, %bjt;
@FRAG@
    add.u32 %t2, %groff, %br;
    add.u32 %t3, %TC, 4;
    add.u32 %t4, %TC, 1;
    mov.u32 %n, 0;
B_@DT@_COL:
    setp.ge.u32 %p0, %n, %nv;
    @%p0 bra B_@DT@_COLEND;
    mad.lo.u32 %t0, %n, %TC, %bjt;
    mad.lo.u32 %t1, %n, %R, %t2;
    mul.wide.u32 %rd0, %t0, 48;
    mad.lo.u32 %t1, %t1, %t3, %bjt;
    add.u64 %ra, %sA, %rd0;
    mul.wide.u32 %rd1, %t1, 4;
    ld.shared.v4.b32 {%a0, %a1, %a2, %a3}, [%ra+16];
    ld.shared.v4.b32 {%a4, %a5, %a6, %a7}, [%ra+32];
    add.u64 %rd1, %sS, %rd1;
    dp4a.u32.s32 %x0, %U0, %a0, 0;
    dp4a.u32.s32 %x1, %U4, %a4, 0;
    dp4a.u32.s32 %x0, %U1, %a1, %x0;
    dp4a.u32.s32 %x1, %U5, %a5, %x1;
    dp4a.u32.s32 %x0, %U2, %a2, %x0;
    dp4a.u32.s32 %x1, %U6, %a6, %x1;
    dp4a.u32.s32 %x0, %U3, %a3, %x0;
    dp4a.u32.s32 %x1, %U7, %a7, %x1;
    mul.lo.s32 %t0, %sc0, %x0;
    mad.lo.s32 %t0, %sc1, %x1, %t0;
@ZP@
    st.shared.b32 [%rd1], %t0;
    add.u32 %n, %n, 1;
    bra B_@DT@_COL;
B_@DT@_COLEND:
    mad.lo.u32 %t1, %t2, %t4, %bjt;
    mul.wide.u32 %rd0, %t1, 16;
    add.u64 %rd0, %sW, %rd0;
    st.shared.v4.b32 [%rd0], {%dw, %mw, %dm, %m01};
B_@DT@_ADVANCE:
    add.u32 %base, %base, %T;
    add.u32 %bjt, %bjt, %djt;
    add.u32 %br, %br, %dr;
    setp.ge.u32 %p0, %bjt, %TCa;
    @%p0 sub.u32 %bjt, %bjt, %TCa;
    @%p0 add.u32 %br, %br, 1;
    bra B_@DT@_LOOP;
";

/// The kernel around stage B.
const SKELETON: &str = r"// qmm.ptx -- quantised products, generation 2 (MUL_MAT with quantised weights for every
// number of columns, MUL_MAT_ID, and the fused decode-class runs: RMS norm x weight in
// the prologue, up to three products that share their activation, the residual add or
// the gated activation in the epilogue).
// GENERATED by `cargo xtask gen-ptx` from xtask/src/qmm_ptx.rs: edit that file, not this
// one. PTX ISA 8.0, sm_80 and newer (JIT by the driver).
//
// Chunks and their unpacked form (u_i, z, sc0, sc1, dw, mw, m0, m1, dm) are those of
// quant.ptx's header. Per output element y[m, n] the arithmetic is, with L partials
// (L = 8 in the decode class, flags bit 13: fewer than 8 columns, and MUL_MAT_ID; L = 1
// in the tiled class, and in qgemm):
//     acc[l] = 0 for l < L
//     for chunk j = 0, 1, ..., K/32 - 1, in this order, with l = j mod L:
//         sumi = sc0 * sum_{i<16} (u_i - z) a_i + sc1 * sum_{i>=16} (u_i - z) a_i (int32)
//         acc[l] = fma(dw * da, float(sumi), acc[l])
//         acc[l] = fma(mw, sa, acc[l])
//         if dm != 0:  mi = m0 * sum_{i<16} a_i + m1 * sum_{i>=16} a_i            (int32)
//                      acc[l] = fma(-(dm * da), float(mi), acc[l])
//     L = 1: y = acc[0]; L = 8: y = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) +
//     (acc3 + acc7)), the butterfly over lane distances 4, 2, 1
// with {da, sa, a_i} the Q8_1 block j of the activation column, bit for bit as
// quantize_q8_1 writes it (here computed in shared memory, never stored). The integer
// sums are exact in any order (two's complement), so they are split over lanes freely;
// the float part is L chains per output, each in chunk order, on L lanes of one warp. The
// result depends on K, the class and the data only: not on M, N within the class, the
// tiling, the fusion or the grid, so every fused form gives its class's bits
// (reference::mul_mat_q_dot, reference::mul_mat_q_dot_lanes).

.version 8.0
.target sm_80
.address_size 64

.extern .shared .align 16 .b8 qmm_smem[];

// ---------------------------------------------------------------------------------
// KERNEL qmm
// out[m, n] = sum_k w[k, m] * a[k, n] for up to three quantised weight matrices that
// read the same activation, in the per-output order of the file header.
// Params:
//   p_x       f32 activations [K, N, B2, B3] (ids mode: [K, B1, T]), element stride 4,
//             or (flags bit 4) their Q8_1 blocks
//   p_nbx1, p_nbx2, p_nbx3   activation byte strides of dims 1..3
//   p_nchunks K / 32
//   p_itc0, p_itc1           (65535 + c) / c for the first and the last K-tile's
//                            chunks c (min(K/32, TC) and ((K/32 - 1) mod TC) + 1)
//   p_tc      TC, chunks per K-tile: 32, or 64 (at most 512 threads)
//   p_offw, p_offs, p_offn   byte offsets of the W, S and norm-scale regions in shared
//                            memory (below)
//   p_n       N (columns; ids mode: 1)
//   p_nt      NT, columns per CTA (1..8): blockIdx.y takes columns y*NT .. y*NT+NT-1
//   p_rows    R, rows per CTA (8, 16, 32 or 64, R * NT <= T); GLU mode: R/2 rows of
//             each of the two matrices
//   p_b2      B2 (to split blockIdx.z into i2, i3); ids mode: B1
//   p_r2, p_r3               broadcast ratios B2/A2 and B3/A3 of matrix 0
//   p_flags   bit 0: RMS norm prologue; bits 1-2: epilogue (0 none, 1 residual add,
//             2 swiglu, 3 geglu); bit 3: ids mode (MUL_MAT_ID); bit 4: p_x holds
//             Q8_1 blocks (quantize_q8_1's, strides p_nbx*) instead of f32 values;
//             bit 5: the RoPE + KV-store epilogue (p_rflags; epilogue 0);
//             bits 8-11: log2(R); bit 12: Q8_0 blocks through 16-byte loads of a
//             48-byte window (the `q8-window` tuning; same values); bit 13: the
//             decode class's order, 8 partials per output on 8 lanes (8 * R * NT <= T)
//   p_nw      norm weight, f32 [K] (norm prologue)
//   p_eps     norm epsilon
//   p_rk      1/K rounded to f32 (the norm's mean)
//   p_rms, p_mul             norm outputs [K, N] (x * scale, and that times p_nw),
//                            written by CTA (0, 0, 0); column stride p_nbr1
//   p_nbr1    byte stride of the columns of p_rms and p_mul
//   p_w0, p_w1, p_w2         weight matrices [K, M_i] (matrix 0: [K, M0, A2, A3])
//   p_dt0, p_dt1, p_dt2      their dtype codes (quant.ptx's header), plus the bytes per
//                            block times 256
//   p_m0, p_m1, p_m2         their rows M_i (0: no such matrix)
//   p_nbw0, p_nbw1, p_nbw2   their row byte strides
//   p_nbwb2, p_nbwb3         batch byte strides of matrix 0 (ids mode: expert stride)
//   p_d0, p_d1, p_d2         f32 outputs [M_i, N] (output 0: [M0, N, B2, B3])
//   p_nbd0, p_nbd1, p_nbd2   their column byte strides (ids mode, output 0: slot stride)
//   p_nbdb2, p_nbdb3         batch byte strides of output 0 (ids mode: token stride)
//   p_res, p_nbres           epilogue add: residual [M0, N] and its column stride
//   p_e, p_nbe               epilogue output (add or GLU result) [M0, N], column stride
//   p_ids     ids mode: i32 expert ids [n_used, T]
//   p_nbi0, p_nbi1           id byte strides
//   p_n_as    number of experts; an id outside 0..n_as sets *p_err = 1 and the CTA
//             writes nothing
//   p_err     u32 error word
//   p_rflags  the RoPE + KV-store epilogue (0: off; epilogue 0 only): bits 2i..2i+1 the
//             role of matrix i (0 none, 1 Q: RoPE into p_qrope, 2 K: RoPE into p_krope and the
//             K cache store, 3 V: the V cache store); bit 6 + i: output i is not written
//             (dead: a later output of the run takes its bytes); bit 9: the norm outputs
//             p_rms and p_mul are not written (both dead likewise; with p_rms dead alone
//             the host passes p_rms = p_mul: a thread writes x * scale, then the product)
//   p_pos, p_nbp0            i32 positions [N] and their byte stride
//   p_idx, p_nbi0r           i32 cache rows [N] of both stores and their byte stride
//   p_ne0, p_n_dims          head dimension and rotated dimensions (both even; normal
//                            RoPE: pairs (2t, 2t+1) of each head, rows past n_dims copied)
//   p_mg_ne0  ceil(2^32 / ne0): a row's head is mul.hi(row, p_mg_ne0)
//   p_theta_scale, p_freq_scale, p_mscale    as rope.ptx's rope_store, whose YaRN
//             ramp is left out: the host fuses only ropes with ext_factor 0 (the ramp's
//             division would make ptxas spill registers around its slow path)
//   p_qrope, p_nbqrope, p_krope, p_nbkrope  roped Q and K [ne0, heads, N] (heads contiguous) and
//                            their column byte strides
//   p_kc, p_nbkc1, p_vc, p_nbvc1 K and V caches and their row byte strides
//   p_tk, p_tv               cache element types: 0 f32, 1 f16, 2 bf16
//   p_rows_k, p_rows_v       cache rows; a row index outside them sets that store's
//                            error word p_errk / p_errv to 1 and writes no cache row
// Grid:   (CTAs over rows: sum over matrices of ceil(M_i / R) (GLU: ceil(M0 / (R/2))),
//          ceil(N / NT) (ids mode: n_used), B2*B3 (ids mode: T))
// Block:  (T, 1, 1), T a multiple of 32, at most 512, R * NT <= T
// Shared: NT*TC*48 + R*(TC+1)*16 + R*NT*(TC+4)*4 + 32 bytes: per TC-chunk K-tile the
//         Q8_1 activation blocks {da, sa, sum_lo, sum_hi, q[32]} (48 B per column and
//         chunk, at (column*TC + chunk)*48), per (row, chunk) {dw, mw, dm, m01} (16 B,
//         at (row*(TC+1) + chunk)*16: at p_offw), per (column, row, chunk) sumi (4 B, at
//         ((column*R + row)*(TC+4) + chunk)*4: each output's chunks contiguous, rows 4
//         banks apart: at p_offs), the norm scale per column (at p_offn).
// Reduction: per output as the file header: one thread per (row, chunk) computes the
//   chunk's integer dot product (stage B, 8 dp4a per half); the f32 chain over chunks in
//   increasing order by one thread per output (stage C). Activation quantisation as
//   quantize_q8_1 (amax by max, sum by integer add: order-free). Norm prologue as
//   rms_norm: lane l adds x_i^2 (fma) for i = l, l+32, ..., butterfly 16, 8, 4, 2, 1.
// ---------------------------------------------------------------------------------
.visible .entry qmm(
    .param .u64 p_x,
    .param .u64 p_nbx1,
    .param .u64 p_nbx2,
    .param .u64 p_nbx3,
    .param .u32 p_nchunks,
    .param .u32 p_itc0,
    .param .u32 p_itc1,
    .param .u32 p_tc,
    .param .u32 p_offw,
    .param .u32 p_offs,
    .param .u32 p_offn,
    .param .u32 p_n,
    .param .u32 p_nt,
    .param .u32 p_rows,
    .param .u32 p_b2,
    .param .u32 p_r2,
    .param .u32 p_r3,
    .param .u32 p_flags,
    .param .u64 p_nw,
    .param .f32 p_eps,
    .param .f32 p_rk,
    .param .u64 p_rms,
    .param .u64 p_mul,
    .param .u64 p_nbr1,
    .param .u64 p_w0,
    .param .u64 p_w1,
    .param .u64 p_w2,
    .param .u32 p_dt0,
    .param .u32 p_dt1,
    .param .u32 p_dt2,
    .param .u32 p_m0,
    .param .u32 p_m1,
    .param .u32 p_m2,
    .param .u64 p_nbw0,
    .param .u64 p_nbw1,
    .param .u64 p_nbw2,
    .param .u64 p_nbwb2,
    .param .u64 p_nbwb3,
    .param .u64 p_d0,
    .param .u64 p_d1,
    .param .u64 p_d2,
    .param .u64 p_nbd0,
    .param .u64 p_nbd1,
    .param .u64 p_nbd2,
    .param .u64 p_nbdb2,
    .param .u64 p_nbdb3,
    .param .u64 p_res,
    .param .u64 p_nbres,
    .param .u64 p_e,
    .param .u64 p_nbe,
    .param .u64 p_ids,
    .param .u64 p_nbi0,
    .param .u64 p_nbi1,
    .param .u32 p_n_as,
    .param .u64 p_err,
    .param .u32 p_rflags,
    .param .u64 p_pos,
    .param .u64 p_nbp0,
    .param .u64 p_idx,
    .param .u64 p_nbi0r,
    .param .u32 p_ne0,
    .param .u32 p_n_dims,
    .param .u32 p_mg_ne0,
    .param .f32 p_theta_scale,
    .param .f32 p_freq_scale,
    .param .f32 p_mscale,
    .param .u64 p_qrope,
    .param .u64 p_nbqrope,
    .param .u64 p_krope,
    .param .u64 p_nbkrope,
    .param .u64 p_kc,
    .param .u64 p_nbkc1,
    .param .u64 p_vc,
    .param .u64 p_nbvc1,
    .param .u32 p_tk,
    .param .u32 p_tv,
    .param .u32 p_rows_k,
    .param .u32 p_rows_v,
    .param .u64 p_errk,
    .param .u64 p_errv
)
.maxntid 512, 1, 1
.maxnreg 84
{
    .reg .pred %p<4>;
    .reg .pred %pn<8>;
    .reg .pred %pnorm, %pglu, %pg2, %pids, %pq2, %pq8, %pv, %pal, %pwr, %pact, %pres, %pdead, %prope, %pc8;
    .reg .b16 %hh<8>, %xl<7>, %xh<7>;
    .reg .b32 %t<16>, %X<7>, %W<8>, %H<8>, %U<8>, %a<8>;
    .reg .b32 %thr, %T, %R, %NT, %NK, %N, %nv, %flags, %epi, %ngrp, %gi, %tb, %TCa;
    .reg .b32 %ga, %mb, %Ma, %dta, %M1, %dt1, %cn, %cr, %RH;
    .reg .b32 %gdt, %gM, %gmb, %gRg, %gRs, %groff, %gts, %gsh;
    .reg .b32 %Q, %br, %bjt, %dr, %djt, %base, %j, %n, %s, %sn, %st, %ITC, %br0, %bjt0, %lR, %TC;
    .reg .b32 %sc0, %sc1, %zs0, %zs1, %m01, %x0, %x1, %slo, %shi;
    .reg .f32 %f<16>;
    .reg .f32 %acc, %dw, %mw, %dm, %fres;
    .reg .b32 %cw<8>, %cm<8>, %ca<8>, %cb<8>, %cs<8>;
    .reg .f32 %cf<8>, %cg<8>;
    .reg .b64 %rd<8>;
    .reg .b64 %sA, %sW, %sS, %sN, %xb, %nbx1, %rw, %rb, %ra;
    .reg .b64 %gw, %gnbw, %wa, %nbwa, %w1, %nbw1, %da, %nbda, %d1, %nbd1;
    .reg .pred %sp<4>;
    .reg .b32 %sr<4>;
    .reg .f32 %sf<16>;

    mov.u32 %thr, %tid.x;
    mov.u32 %T, %ntid.x;
    ld.param.u32 %R, [p_rows];
    ld.param.u32 %NT, [p_nt];
    ld.param.u32 %NK, [p_nchunks];
    // The first tile's chunks and 2^16 / TCa rounded up (see below), for the first and
    // the last tile (the host's divisions: none waits in the kernel).
    ld.param.u32 %TC, [p_tc];
    min.u32 %TCa, %NK, %TC;
    ld.param.u32 %ITC, [p_itc0];
    ld.param.u32 %N, [p_n];
    ld.param.u32 %flags, [p_flags];
    bfe.u32 %lR, %flags, 8, 4;
    and.b32 %t0, %flags, 1;
    setp.ne.u32 %pnorm, %t0, 0;
    bfe.u32 %epi, %flags, 1, 2;
    setp.ge.u32 %pglu, %epi, 2;
    and.b32 %t0, %flags, 32;
    setp.ne.u32 %prope, %t0, 0;
    and.b32 %t0, %flags, 8;
    setp.ne.u32 %pids, %t0, 0;
    and.b32 %t0, %flags, 16;
    setp.ne.u32 %pq8, %t0, 0;
    and.b32 %t0, %flags, 8192;
    setp.ne.u32 %pc8, %t0, 0;
    // Shared memory: A at 0, W after NT*1536 bytes, S after R*528 more, the norm scales
    // after R*NT*144 more.
    mov.u64 %sA, qmm_smem;
    ld.param.u32 %t0, [p_offw];
    ld.param.u32 %t1, [p_offs];
    ld.param.u32 %t2, [p_offn];
    cvt.u64.u32 %rd0, %t0;
    cvt.u64.u32 %rd1, %t1;
    cvt.u64.u32 %rd2, %t2;
    add.u64 %sW, %sA, %rd0;
    add.u64 %sS, %sA, %rd1;
    add.u64 %sN, %sA, %rd2;

    // Activation columns, matrix-0 batch offsets (%rd3 weights, %rd4 output).
    ld.param.u64 %xb, [p_x];
    cvta.to.global.u64 %xb, %xb;
    ld.param.u64 %nbx1, [p_nbx1];
    ld.param.u32 %t1, [p_b2];
    @%pids bra SETUP_IDS;
    mov.u32 %t2, %ctaid.z;
    mov.u32 %t3, 0;
    mov.u32 %t4, 0;
    ld.param.u32 %t8, [p_r2];
    ld.param.u32 %t9, [p_r3];
    // (batch 0 branches past the divisions: a predicated-off one still holds up its
    // result's readers in the cost model's scoreboard)
    mov.u32 %t6, 0;
    mov.u32 %t7, 0;
    setp.eq.u32 %p0, %t2, 0;
    @%p0 bra BATCH0;
    rem.u32 %t3, %t2, %t1;
    div.u32 %t4, %t2, %t1;
    div.u32 %t6, %t3, %t8;
    div.u32 %t7, %t4, %t9;
BATCH0:
    mov.u32 %t5, %ctaid.y;
    mul.lo.u32 %t5, %t5, %NT;
    sub.u32 %nv, %N, %t5;
    min.u32 %nv, %nv, %NT;
    ld.param.u64 %rd0, [p_nbx2];
    cvt.u64.u32 %rd1, %t3;
    mad.lo.u64 %xb, %rd1, %rd0, %xb;
    ld.param.u64 %rd0, [p_nbx3];
    cvt.u64.u32 %rd1, %t4;
    mad.lo.u64 %xb, %rd1, %rd0, %xb;
    cvt.u64.u32 %rd1, %t5;
    mad.lo.u64 %xb, %rd1, %nbx1, %xb;
    ld.param.u64 %rd0, [p_nbwb2];
    cvt.u64.u32 %rd1, %t6;
    mul.lo.u64 %rd3, %rd1, %rd0;
    ld.param.u64 %rd0, [p_nbwb3];
    cvt.u64.u32 %rd1, %t7;
    mad.lo.u64 %rd3, %rd1, %rd0, %rd3;
    ld.param.u64 %rd0, [p_nbdb2];
    cvt.u64.u32 %rd1, %t3;
    mul.lo.u64 %rd4, %rd1, %rd0;
    ld.param.u64 %rd0, [p_nbdb3];
    cvt.u64.u32 %rd1, %t4;
    mad.lo.u64 %rd4, %rd1, %rd0, %rd4;
    ld.param.u64 %rd0, [p_nbd0];
    cvt.u64.u32 %rd1, %t5;
    mad.lo.u64 %rd4, %rd1, %rd0, %rd4;
    bra SETUP_ROWS;
SETUP_IDS:
    // Slot e = ctaid.y, token t = ctaid.z: expert ids[e, t] (the whole CTA leaves on a
    // bad one), activation row (e mod B1, t). The ids are the grid before's output: the
    // wait comes first here (it returns at once the second time).
    griddepcontrol.wait;
    mov.u32 %t2, %ctaid.y;
    mov.u32 %t3, %ctaid.z;
    ld.param.u64 %rd0, [p_ids];
    cvta.to.global.u64 %rd0, %rd0;
    ld.param.u64 %rd1, [p_nbi0];
    cvt.u64.u32 %rd2, %t2;
    mad.lo.u64 %rd0, %rd2, %rd1, %rd0;
    ld.param.u64 %rd1, [p_nbi1];
    cvt.u64.u32 %rd2, %t3;
    mad.lo.u64 %rd0, %rd2, %rd1, %rd0;
    ld.global.u32 %t4, [%rd0];
    ld.param.u32 %t5, [p_n_as];
    setp.lt.u32 %p0, %t4, %t5;
    @%p0 bra IDS_OK;
    setp.ne.u32 %p1, %thr, 0;
    @%p1 bra DONE;
    ld.param.u64 %rd0, [p_err];
    cvta.to.global.u64 %rd0, %rd0;
    st.global.u32 [%rd0], 1;
    bra DONE;
IDS_OK:
    mov.u32 %nv, 1;
    rem.u32 %t5, %t2, %t1;
    cvt.u64.u32 %rd1, %t5;
    mad.lo.u64 %xb, %rd1, %nbx1, %xb;
    ld.param.u64 %rd0, [p_nbx2];
    cvt.u64.u32 %rd1, %t3;
    mad.lo.u64 %xb, %rd1, %rd0, %xb;
    ld.param.u64 %rd0, [p_nbwb2];
    cvt.u64.u32 %rd1, %t4;
    mul.lo.u64 %rd3, %rd1, %rd0;
    ld.param.u64 %rd0, [p_nbd0];
    cvt.u64.u32 %rd1, %t2;
    mul.lo.u64 %rd4, %rd1, %rd0;
    ld.param.u64 %rd0, [p_nbdb2];
    cvt.u64.u32 %rd1, %t3;
    mad.lo.u64 %rd4, %rd1, %rd0, %rd4;

SETUP_ROWS:
    // Rows: group a is (matrix %ga, rows %mb.. of it, in CTA rows 0..); in GLU mode a
    // second group is matrix 1's same rows, in CTA rows R/2...
    ld.param.u32 %Ma, [p_m0];
    ld.param.u32 %M1, [p_m1];
    ld.param.u32 %t2, [p_m2];
    mov.u32 %t3, %ctaid.x;
    shr.u32 %RH, %R, 1;
    @%pglu bra SETUP_GLU;
    mov.u32 %ngrp, 1;
    sub.u32 %t4, %R, 1;
    add.u32 %t5, %Ma, %t4;
    shr.u32 %t5, %t5, %lR;
    add.u32 %t6, %M1, %t4;
    shr.u32 %t6, %t6, %lR;
    add.u32 %t6, %t6, %t5;
    mov.u32 %ga, 0;
    mov.u32 %t7, %t3;
    setp.ge.u32 %p0, %t3, %t5;
    @%p0 mov.u32 %ga, 1;
    @%p0 sub.u32 %t7, %t3, %t5;
    setp.ge.u32 %p1, %t3, %t6;
    @%p1 mov.u32 %ga, 2;
    @%p1 sub.u32 %t7, %t3, %t6;
    mul.lo.u32 %mb, %t7, %R;
    bra SETUP_MATS;
SETUP_GLU:
    mov.u32 %ngrp, 2;
    mov.u32 %ga, 0;
    mul.lo.u32 %mb, %t3, %RH;
SETUP_MATS:
    // Matrix %ga's weights, dtype, rows, row stride, output and its column stride.
    // (every parameter load first, then the selections)
    ld.param.u32 %dta, [p_dt0];
    ld.param.u32 %dt1, [p_dt1];
    ld.param.u32 %t4, [p_dt2];
    ld.param.u64 %wa, [p_w0];
    ld.param.u64 %w1, [p_w1];
    ld.param.u64 %rd0, [p_w2];
    ld.param.u64 %nbwa, [p_nbw0];
    ld.param.u64 %nbw1, [p_nbw1];
    ld.param.u64 %rd1, [p_nbw2];
    ld.param.u64 %da, [p_d0];
    ld.param.u64 %d1, [p_d1];
    ld.param.u64 %rd2, [p_d2];
    ld.param.u64 %nbda, [p_nbd0];
    ld.param.u64 %nbd1, [p_nbd1];
    ld.param.u64 %rd5, [p_nbd2];
    setp.eq.u32 %p0, %ga, 1;
    setp.eq.u32 %p1, %ga, 2;
    @%p0 mov.u32 %dta, %dt1;
    @%p0 mov.u32 %Ma, %M1;
    @%p0 mov.u64 %wa, %w1;
    @%p0 mov.u64 %nbwa, %nbw1;
    @%p0 mov.u64 %da, %d1;
    @%p0 mov.u64 %nbda, %nbd1;
    @%p1 mov.u32 %dta, %t4;
    @%p1 mov.u32 %Ma, %t2;
    @%p1 mov.u64 %wa, %rd0;
    @%p1 mov.u64 %nbwa, %rd1;
    @%p1 mov.u64 %da, %rd2;
    @%p1 mov.u64 %nbda, %rd5;
    cvta.to.global.u64 %wa, %wa;
    cvta.to.global.u64 %w1, %w1;
    cvta.to.global.u64 %da, %da;
    cvta.to.global.u64 %d1, %d1;
    // Batch / expert / column offsets apply to matrix 0 and output 0 only (the fused
    // forms have one batch and one column tile).
    setp.eq.u32 %p2, %ga, 0;
    @%p2 add.u64 %wa, %wa, %rd3;
    @%p2 add.u64 %da, %da, %rd4;
    // Stage C needs the Q2_K min terms only if a group is Q2_K.
    and.b32 %t0, %dta, 255;
    setp.eq.u32 %p0, %t0, 10;
    and.b32 %t0, %dt1, 255;
    setp.eq.u32 %p1, %t0, 10;
    and.pred %p1, %p1, %pglu;
    or.pred %pq2, %p0, %p1;
    // A GLU over two matrices of one dtype: stage B takes both groups in one pass
    // (TASK_ROW), so the CTA's loads of both wait for one round trip, not two.
    setp.eq.u32 %p0, %dta, %dt1;
    and.pred %p0, %p0, %pglu;
    @%p0 mov.u32 %ngrp, 1;
    selp.b32 %gRs, %RH, 0xFFFFFFFF, %p0;
    not.pred %p0, %p0;
    and.pred %pg2, %p0, %pglu;

    // Stage C's thread: output (row %cr of the CTA, column %cn of the tile); in the
    // decode class (%pc8) 8 threads per output, thread thr taking output thr / 8 and
    // its chunks j = thr (mod 8).
    selp.b32 %t0, 3, 0, %pc8;
    shr.u32 %t1, %thr, %t0;
    shr.u32 %cn, %t1, %lR;
    sub.u32 %t0, %R, 1;
    and.b32 %cr, %t1, %t0;
    setp.lt.u32 %pact, %cn, %nv;
    mov.f32 %acc, 0f00000000;
    // The add epilogue's residual of this thread's output (the first of its 8 in the
    // decode class): its address now, the load after the first prefetches (so that
    // nothing waits for either), its latency passing during the norm and the tiles.
    and.b32 %t1, %thr, 7;
    @!%pc8 mov.u32 %t1, 0;
    setp.eq.u32 %pres, %t1, 0;
    and.pred %pres, %pres, %pact;
    setp.eq.u32 %p0, %epi, 1;
    and.pred %pres, %pres, %p0;
    add.u32 %t3, %mb, %cr;
    setp.lt.u32 %p0, %t3, %Ma;
    and.pred %pres, %pres, %p0;
    ld.param.u64 %ra, [p_res];
    cvta.to.global.u64 %ra, %ra;
    ld.param.u64 %rd2, [p_nbres];
    cvt.u64.u32 %rd0, %cn;
    mad.lo.u64 %ra, %rd0, %rd2, %ra;
    mul.wide.u32 %rd0, %t3, 4;
    add.u64 %ra, %ra, %rd0;

    mov.u32 %tb, 0;
    // thr / TCa, thr % TCa, T / TCa, T % TCa by a multiply with 2^16 / TCa rounded up
    // (exact for numerators below 1024 and TCa <= 64).
    mul.lo.u32 %br0, %thr, %ITC;
    shr.u32 %br0, %br0, 16;
    mul.lo.u32 %bjt0, %br0, %TCa;
    sub.u32 %bjt0, %thr, %bjt0;
    mul.lo.u32 %dr, %T, %ITC;
    shr.u32 %dr, %dr, 16;
    mul.lo.u32 %djt, %dr, %TCa;
    sub.u32 %djt, %T, %djt;
@PREFETCH_FIRST@
    @%pres ld.global.f32 %fres, [%ra];
    // Norm prologue: warp w computes the scale of columns w, w + T/32, ... exactly as
    // rms_norm does (lane l adds x_i^2 for i = l, l+32, ... in order).
    @!%pnorm bra NORM_DONE;
    shr.u32 %t0, %thr, 5;
    and.b32 %t1, %thr, 31;
NORM_COL:
    setp.ge.u32 %p0, %t0, %nv;
    @%p0 bra NORM_DONE;
    cvt.u64.u32 %rd0, %t0;
    mad.lo.u64 %rd1, %rd0, %nbx1, %xb;
    shl.b32 %t2, %NK, 5;
    mov.f32 %f0, 0f00000000;
    mov.u32 %t3, %t1;
@NORM_SUM@
    // mean = sum / K: where nothing can underflow (2^-100 <= sum < inf) without a
    // division (Markstein: q0 = sum * RN(1/K), r = sum - K q0 exactly, RN(q0 + r RN(1/K))
    // is the division's result, qmm.rs's `division_by_k_...`), else the division.
    setp.ge.f32 %p1, %f0, 0f0D800000;
    setp.lt.f32 %p2, %f0, 0f7F800000;
    mul.rn.f32 %f3, %f0, %f11;
    and.pred %p1, %p1, %p2;
    @!%p1 bra NORM_DIV;
    fma.rn.f32 %f4, %f3, %f10, %f0;
    fma.rn.f32 %f3, %f4, %f11, %f3;
    bra NORM_MEAN;
NORM_DIV:
    div.rn.f32 %f3, %f0, %f9;
NORM_MEAN:
    ld.param.f32 %f4, [p_eps];
    add.rn.f32 %f3, %f3, %f4;
    sqrt.rn.f32 %f3, %f3;
    div.rn.f32 %f5, 0f3F800000, %f3;
    setp.ne.u32 %p1, %t1, 0;
    mul.wide.u32 %rd2, %t0, 4;
    add.u64 %rd2, %sN, %rd2;
    @!%p1 st.shared.f32 [%rd2], %f5;
    shr.u32 %t2, %T, 5;
    add.u32 %t0, %t0, %t2;
    bra NORM_COL;
NORM_DONE:
@RT_TABLE@    // CTA (0, 0, 0) writes the norm outputs.
    mov.u32 %t0, %ctaid.x;
    mov.u32 %t1, %ctaid.y;
    or.b32 %t0, %t0, %t1;
    mov.u32 %t1, %ctaid.z;
    or.b32 %t0, %t0, %t1;
    setp.eq.u32 %pwr, %t0, 0;
    and.pred %pwr, %pwr, %pnorm;
    // ... unless both are dead (p_rflags bit 9).
    ld.param.u32 %t1, [p_rflags];
    and.b32 %t2, %t1, 512;
    setp.eq.u32 %p0, %t2, 0;
    and.pred %pwr, %pwr, %p0;

TILE:
    setp.ge.u32 %p0, %tb, %NK;
    @%p0 bra EPILOGUE;
    setp.eq.u32 %p0, %tb, 0;
    @%p0 bra TILE_FETCHED;
    ld.param.u32 %t1, [p_itc1];
    ld.param.u32 %t2, [p_itc0];
    sub.u32 %TCa, %NK, %tb;
    min.u32 %TCa, %TCa, %TC;
    // thr / TCa, thr % TCa, T / TCa, T % TCa by a multiply with 2^16 / TCa rounded up
    // (exact for numerators below 1024 and TCa <= 64).
    setp.eq.u32 %p0, %TCa, %TC;
    selp.b32 %ITC, %t2, %t1, %p0;
    mul.lo.u32 %br0, %thr, %ITC;
    shr.u32 %br0, %br0, 16;
    mul.lo.u32 %bjt0, %br0, %TCa;
    sub.u32 %bjt0, %thr, %bjt0;
    mul.lo.u32 %dr, %T, %ITC;
    shr.u32 %dr, %dr, 16;
    mul.lo.u32 %djt, %dr, %TCa;
    sub.u32 %djt, %T, %djt;
@PREFETCH_NEXT@
TILE_FETCHED:
    bar.sync 0;

    // Stage A: the tile's Q8_1 blocks of each column, 8 lanes per block (4 values each),
    // bit for bit as quantize_q8_1. A warp whose 4 blocks are all past the end skips
    // the round (its shuffles stay within the warp).
    shr.u32 %t0, %thr, 3;
    and.b32 %t1, %thr, 7;
    mul.lo.u32 %t2, %nv, %TCa;
    and.b32 %t12, %t0, 0xFFFFFFFC;
    mov.u32 %base, 0;
A_LOOP:
    setp.ge.u32 %p0, %base, %t2;
    @%p0 bra A_DONE;
    add.u32 %t3, %base, %t12;
    setp.ge.u32 %p0, %t3, %t2;
    @%p0 bra A_NEXT;
    add.u32 %t3, %base, %t0;
    setp.lt.u32 %pv, %t3, %t2;
    sub.u32 %t4, %t2, 1;
    min.u32 %t3, %t3, %t4;
    mul.lo.u32 %n, %t3, %ITC;
    shr.u32 %n, %n, 16;
    mul.lo.u32 %j, %n, %TCa;
    sub.u32 %j, %t3, %j;
    @%pq8 bra A_COPY;
    // element index i0 = (tb + j)*32 + 4*lane8 of column n; every global load (the
    // values, the norm weight) issued before the first use.
    add.u32 %t4, %tb, %j;
    shl.b32 %t4, %t4, 5;
    shl.b32 %t5, %t1, 2;
    add.u32 %t4, %t4, %t5;
    cvt.u64.u32 %rd0, %n;
    mad.lo.u64 %rd1, %rd0, %nbx1, %xb;
    mul.wide.u32 %rd2, %t4, 4;
    add.u64 %rd1, %rd1, %rd2;
    ld.global.f32 %f0, [%rd1];
    ld.global.f32 %f1, [%rd1+4];
    ld.global.f32 %f2, [%rd1+8];
    ld.global.f32 %f3, [%rd1+12];
    @!%pnorm bra A_QUANT;
    ld.param.u64 %rd5, [p_nw];
    cvta.to.global.u64 %rd5, %rd5;
    add.u64 %rd5, %rd5, %rd2;
    ld.global.f32 %f4, [%rd5];
    ld.global.f32 %f5, [%rd5+4];
    ld.global.f32 %f6, [%rd5+8];
    ld.global.f32 %f7, [%rd5+12];
    mul.wide.u32 %rd5, %n, 4;
    add.u64 %rd5, %sN, %rd5;
    ld.shared.f32 %f8, [%rd5];
    // the norm outputs' addresses while the loads are in flight
    ld.param.u64 %rd5, [p_nbr1];
    mul.lo.u64 %rd6, %rd0, %rd5;
    add.u64 %rd6, %rd6, %rd2;
    ld.param.u64 %rd5, [p_rms];
    cvta.to.global.u64 %rd5, %rd5;
    add.u64 %rd5, %rd5, %rd6;
    ld.param.u64 %rd2, [p_mul];
    cvta.to.global.u64 %rd2, %rd2;
    add.u64 %rd6, %rd2, %rd6;
    and.pred %p1, %pwr, %pv;
    // x * scale (rms_norm), then times the weight (mul)
    mul.rn.f32 %f0, %f0, %f8;
    mul.rn.f32 %f1, %f1, %f8;
    mul.rn.f32 %f2, %f2, %f8;
    mul.rn.f32 %f3, %f3, %f8;
    mul.rn.f32 %f4, %f0, %f4;
    mul.rn.f32 %f5, %f1, %f5;
    mul.rn.f32 %f6, %f2, %f6;
    mul.rn.f32 %f7, %f3, %f7;
    @%p1 st.global.f32 [%rd5], %f0;
    @%p1 st.global.f32 [%rd5+4], %f1;
    @%p1 st.global.f32 [%rd5+8], %f2;
    @%p1 st.global.f32 [%rd5+12], %f3;
    @%p1 st.global.f32 [%rd6], %f4;
    @%p1 st.global.f32 [%rd6+4], %f5;
    @%p1 st.global.f32 [%rd6+8], %f6;
    @%p1 st.global.f32 [%rd6+12], %f7;
    mov.f32 %f0, %f4;
    mov.f32 %f1, %f5;
    mov.f32 %f2, %f6;
    mov.f32 %f3, %f7;
A_QUANT:
    // amax (max is exact in any order), d = amax / 127, id = 1/d (0 for d = 0)
    abs.f32 %f4, %f0;
    abs.f32 %f5, %f1;
    abs.f32 %f6, %f2;
    abs.f32 %f7, %f3;
    max.f32 %f4, %f4, %f5;
    max.f32 %f6, %f6, %f7;
    max.f32 %f4, %f4, %f6;
    shfl.sync.bfly.b32 %f5, %f4, 1, 31, 0xffffffff;
    max.f32 %f4, %f4, %f5;
    shfl.sync.bfly.b32 %f5, %f4, 2, 31, 0xffffffff;
    max.f32 %f4, %f4, %f5;
    shfl.sync.bfly.b32 %f5, %f4, 4, 31, 0xffffffff;
    max.f32 %f4, %f4, %f5;
    // d = amax / 127 correctly rounded without a division (Markstein: q0 = amax * c
    // with c = RN(1/127), r = amax - 127 q0 exactly, d = RN(q0 + r c); equal to the
    // division for every non-negative f32, qmm.rs's `division_by_127_...`), inf passed
    // through.
    mul.rn.f32 %f6, %f4, 0f3C010204;
    setp.eq.f32 %p1, %f4, 0f7F800000;
    fma.rn.f32 %f5, %f6, 0fC2FE0000, %f4;
    @!%p1 fma.rn.f32 %f6, %f5, 0f3C010204, %f6;
    setp.eq.f32 %p1, %f6, 0f00000000;
    div.rn.f32 %f7, 0f3F800000, %f6;
    cvt.rn.f16.f32 %hh0, %f6;
    // the block's shared address while the divisions run
    mad.lo.u32 %t11, %n, %TC, %j;
    mul.wide.u32 %rd0, %t11, 48;
    add.u64 %rd0, %sA, %rd0;
    mul.wide.u32 %rd1, %t1, 4;
    add.u64 %rd1, %rd0, %rd1;
    setp.ne.u32 %p2, %t1, 0;
    selp.f32 %f7, 0f00000000, %f7, %p1;
    // q = round half away from zero (x * id), as quantize_q8_1: the four values side
    // by side
    mul.rn.f32 %f8, %f0, %f7;
    mul.rn.f32 %f9, %f1, %f7;
    mul.rn.f32 %f10, %f2, %f7;
    mul.rn.f32 %f11, %f3, %f7;
    cvt.rzi.s32.f32 %t5, %f8;
    cvt.rzi.s32.f32 %t6, %f9;
    cvt.rzi.s32.f32 %t7, %f10;
    cvt.rzi.s32.f32 %t8, %f11;
    mov.b32 %X0, %f8;
    mov.b32 %X1, %f9;
    mov.b32 %X2, %f10;
    mov.b32 %X3, %f11;
    cvt.rn.f32.s32 %f12, %t5;
    cvt.rn.f32.s32 %f13, %t6;
    cvt.rn.f32.s32 %f14, %t7;
    cvt.rn.f32.s32 %f15, %t8;
    shr.s32 %X0, %X0, 31;
    shr.s32 %X1, %X1, 31;
    shr.s32 %X2, %X2, 31;
    shr.s32 %X3, %X3, 31;
    sub.rn.f32 %f12, %f8, %f12;
    sub.rn.f32 %f13, %f9, %f13;
    sub.rn.f32 %f14, %f10, %f14;
    sub.rn.f32 %f15, %f11, %f15;
    or.b32 %X0, %X0, 1;
    or.b32 %X1, %X1, 1;
    or.b32 %X2, %X2, 1;
    or.b32 %X3, %X3, 1;
    abs.f32 %f12, %f12;
    abs.f32 %f13, %f13;
    abs.f32 %f14, %f14;
    abs.f32 %f15, %f15;
    setp.ge.f32 %p0, %f12, 0f3F000000;
    setp.ge.f32 %p1, %f13, 0f3F000000;
    setp.ge.f32 %p3, %f14, 0f3F000000;
    @%p0 add.s32 %t5, %t5, %X0;
    setp.ge.f32 %p0, %f15, 0f3F000000;
    @%p1 add.s32 %t6, %t6, %X1;
    @%p3 add.s32 %t7, %t7, %X2;
    @%p0 add.s32 %t8, %t8, %X3;
    // sums: 4 lanes per half, then both halves; the 4 quants packed into one word
    add.s32 %t9, %t5, %t6;
    add.s32 %t10, %t7, %t8;
    and.b32 %t5, %t5, 255;
    and.b32 %t6, %t6, 255;
    and.b32 %t7, %t7, 255;
    shl.b32 %t8, %t8, 24;
    add.s32 %t9, %t9, %t10;
    shl.b32 %t6, %t6, 8;
    shl.b32 %t7, %t7, 16;
    shfl.sync.bfly.b32 %t10, %t9, 1, 31, 0xffffffff;
    or.b32 %t5, %t5, %t6;
    or.b32 %t7, %t7, %t8;
    add.s32 %t9, %t9, %t10;
    or.b32 %t5, %t5, %t7;
    shfl.sync.bfly.b32 %t10, %t9, 2, 31, 0xffffffff;
    @%pv st.shared.b32 [%rd1+16], %t5;
    add.s32 %t9, %t9, %t10;
    shfl.sync.bfly.b32 %t10, %t9, 4, 31, 0xffffffff;
    add.s32 %t10, %t9, %t10;
    @!%pv bra A_NEXT;
    @%p2 bra A_NEXT;
    // d and s = d * sum as f16, read back as f32 (what a Q8_1 block holds)
    cvt.rn.f32.s32 %f8, %t10;
    mul.rn.f32 %f8, %f6, %f8;
    cvt.f32.f16 %f6, %hh0;
    cvt.rn.f16.f32 %hh1, %f8;
    sub.s32 %t8, %t10, %t9;
    cvt.f32.f16 %f8, %hh1;
    st.shared.v4.b32 [%rd0], {%f6, %f8, %t9, %t8};
    bra A_NEXT;
A_COPY:
    // Activations already quantised (quantize_q8_1's blocks, 36 bytes): lane l of the
    // 8 copies quants 4l..4l+3, lane 0 d and s; the sums per half by dp4a and shuffles.
    cvt.u64.u32 %rd0, %n;
    mad.lo.u64 %rd1, %rd0, %nbx1, %xb;
    add.u32 %t4, %tb, %j;
    mul.wide.u32 %rd2, %t4, 36;
    add.u64 %rd1, %rd1, %rd2;
    mul.wide.u32 %rd2, %t1, 4;
    add.u64 %rd2, %rd1, %rd2;
    ld.global.b32 %t5, [%rd2+4];
    mov.b32 %t6, 0x01010101;
    dp4a.u32.s32 %t9, %t6, %t5, 0;
    shfl.sync.bfly.b32 %t10, %t9, 1, 31, 0xffffffff;
    add.s32 %t9, %t9, %t10;
    shfl.sync.bfly.b32 %t10, %t9, 2, 31, 0xffffffff;
    add.s32 %t9, %t9, %t10;
    shfl.sync.bfly.b32 %t10, %t9, 4, 31, 0xffffffff;
    add.s32 %t10, %t9, %t10;
    @!%pv bra A_NEXT;
    mad.lo.u32 %t11, %n, %TC, %j;
    mul.wide.u32 %rd0, %t11, 48;
    add.u64 %rd0, %sA, %rd0;
    mul.wide.u32 %rd2, %t1, 4;
    add.u64 %rd2, %rd0, %rd2;
    st.shared.b32 [%rd2+16], %t5;
    setp.ne.u32 %p1, %t1, 0;
    @%p1 bra A_NEXT;
    ld.global.b32 %t5, [%rd1];
    mov.b32 {%hh0, %hh1}, %t5;
    cvt.f32.f16 %f6, %hh0;
    cvt.f32.f16 %f8, %hh1;
    sub.s32 %t8, %t10, %t9;
    st.shared.v4.b32 [%rd0], {%f6, %f8, %t9, %t8};
A_NEXT:
    shr.u32 %t3, %T, 3;
    add.u32 %base, %base, %t3;
    bra A_LOOP;
A_DONE:
    bar.sync 0;

    // Stage B: integer dot products, per group, in the loop of its dtype.
    mov.u32 %gi, 0;
B_GROUP:
    setp.ge.u32 %p0, %gi, %ngrp;
    @%p0 bra B_END;
@SELECT_GROUP@
@B_DISPATCH@
    bra B_NEXT;
@B_LOOPS@
B_NEXT:
    add.u32 %gi, %gi, 1;
    bra B_GROUP;
B_END:
    bar.sync 0;

@STAGE_C@
C_DONE:
    add.u32 %tb, %tb, %TC;
    bra TILE;

EPILOGUE:
    @!%pc8 bra EPI_BEGIN;
    // The decode class: each output's 8 partials meet in the butterfly over lane
    // distances 4, 2, 1 (lane 0: ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7))), and
    // the first of its 8 threads goes on.
    shfl.sync.bfly.b32 %f0, %acc, 4, 31, 0xffffffff;
    add.rn.f32 %acc, %acc, %f0;
    shfl.sync.bfly.b32 %f0, %acc, 2, 31, 0xffffffff;
    add.rn.f32 %acc, %acc, %f0;
    shfl.sync.bfly.b32 %f0, %acc, 1, 31, 0xffffffff;
    add.rn.f32 %acc, %acc, %f0;
    and.b32 %t0, %thr, 7;
    setp.eq.u32 %p0, %t0, 0;
    and.pred %pact, %pact, %p0;
EPI_BEGIN:
    @%pglu bra EPI_GLU;
    @%prope bra EPI_ROLE;
    // One matrix per CTA: y, and with the add epilogue y + residual.
    @!%pact bra DONE;
    add.u32 %t0, %mb, %cr;
    setp.ge.u32 %p0, %t0, %Ma;
    @%p0 bra DONE;
    mul.wide.u32 %rd0, %t0, 4;
    cvt.u64.u32 %rd1, %cn;
    mad.lo.u64 %rd2, %rd1, %nbda, %da;
    add.u64 %rd2, %rd2, %rd0;
    st.global.f32 [%rd2], %acc;
    setp.ne.u32 %p1, %epi, 1;
    @%p1 bra DONE;
    add.rn.f32 %f1, %acc, %fres;
    ld.param.u64 %rd2, [p_e];
    cvta.to.global.u64 %rd2, %rd2;
    ld.param.u64 %rd3, [p_nbe];
    mad.lo.u64 %rd2, %rd1, %rd3, %rd2;
    add.u64 %rd2, %rd2, %rd0;
    st.global.f32 [%rd2], %f1;
    bra DONE;
EPI_ROLE:
    // The RoPE + KV-store epilogue: the role of matrix %ga (%t6: 0 none, 1 Q, 2 K, 3 V)
    // and whether its output is dead.
    ld.param.u32 %t5, [p_rflags];
    shl.b32 %t6, %ga, 1;
    add.u32 %t7, %ga, 6;
    shr.u32 %t6, %t5, %t6;
    shr.u32 %t7, %t5, %t7;
    and.b32 %t6, %t6, 3;
    and.b32 %t7, %t7, 1;
    setp.ne.u32 %pdead, %t7, 0;
    // A RoPE role needs the pair's other value: rows 2t and 2t+1 of a head are CTA rows
    // cr and cr ^ 1 (R is even, so is every CTA's first row); they meet in shared memory
    // (S, once every thread is done reading it; a branch on the CTA's role only. A
    // shuffle would do, but makes ptxas spill the kernel's registers.)
    setp.lt.u32 %p2, %t6, 3;
    setp.ne.u32 %p1, %t6, 0;
    and.pred %p2, %p2, %p1;
    // (every register the epilogue reads is written on each path to it: a predicated
    // or missing write keeps an older value alive through the whole kernel, and ptxas
    // spills)
    mov.f32 %f8, %acc;
    @!%p2 bra EPI_ROW;
    bar.sync 0;
    mad.lo.u32 %t1, %cn, %R, %cr;
    mul.wide.u32 %rd3, %t1, 4;
    add.u64 %rd3, %sS, %rd3;
    @%pact st.shared.f32 [%rd3], %acc;
    bar.sync 0;
    xor.b32 %t1, %t1, 1;
    mul.wide.u32 %rd3, %t1, 4;
    add.u64 %rd3, %sS, %rd3;
    @%pact ld.shared.f32 %f8, [%rd3];
EPI_ROW:
    @!%pact bra DONE;
    add.u32 %t0, %mb, %cr;
    setp.ge.u32 %p0, %t0, %Ma;
    @%p0 bra DONE;
    mul.wide.u32 %rd0, %t0, 4;
    cvt.u64.u32 %rd1, %cn;
    mad.lo.u64 %rd2, %rd1, %nbda, %da;
    add.u64 %rd2, %rd2, %rd0;
    @!%pdead st.global.f32 [%rd2], %acc;
    setp.eq.u32 %p1, %t6, 0;
    @%p1 bra DONE;
@EPI_ROPE@
EPI_GLU:
    // Gate rows are CTA rows 0..R/2, up rows R/2..R: meet in shared memory (S, once
    // every thread is done reading it).
    bar.sync 0;
    mad.lo.u32 %t0, %cn, %R, %cr;
    mul.wide.u32 %rd0, %t0, 4;
    add.u64 %rd0, %sS, %rd0;
    @%pact st.shared.f32 [%rd0], %acc;
    bar.sync 0;
    @!%pact bra DONE;
    setp.ge.u32 %p0, %cr, %RH;
    @%p0 bra DONE;
    add.u32 %t1, %mb, %cr;
    setp.ge.u32 %p0, %t1, %Ma;
    @%p0 bra DONE;
    ld.shared.f32 %f0, [%rd0];
    mul.wide.u32 %rd1, %RH, 4;
    add.u64 %rd1, %rd0, %rd1;
    ld.shared.f32 %f3, [%rd1];
    mul.wide.u32 %rd0, %t1, 4;
    cvt.u64.u32 %rd1, %cn;
    mad.lo.u64 %rd2, %rd1, %nbda, %da;
    add.u64 %rd2, %rd2, %rd0;
    st.global.f32 [%rd2], %f0;
    mad.lo.u64 %rd2, %rd1, %nbd1, %d1;
    add.u64 %rd2, %rd2, %rd0;
    st.global.f32 [%rd2], %f3;
    ld.param.u64 %rd2, [p_e];
    cvta.to.global.u64 %rd2, %rd2;
    ld.param.u64 %rd3, [p_nbe];
    mad.lo.u64 %rd2, %rd1, %rd3, %rd2;
    add.u64 %rd2, %rd2, %rd0;
    setp.eq.u32 %p1, %epi, 3;
    @%p1 bra EPI_GEGLU;
    // swiglu: silu(g) * u, the instructions of unary.ptx's swiglu
    mul.rn.f32 %f1, %f0, 0fBFB8AA3B;
    ex2.approx.f32 %f1, %f1;
    add.rn.f32 %f1, %f1, 0f3F800000;
    div.rn.f32 %f2, %f0, %f1;
    mul.rn.f32 %f4, %f2, %f3;
    st.global.f32 [%rd2], %f4;
    bra DONE;
EPI_GEGLU:
    // geglu: the instructions of unary.ptx's gelu_tab and geglu
    cvt.rn.f16.f32 %hh0, %f0;
    cvt.f32.f16 %f1, %hh0;
    mul.rn.f32 %f2, %f1, 0f3D372713;
    fma.rn.f32 %f2, %f2, %f1, 0f3F800000;
    mul.rn.f32 %f4, %f1, 0f3F4C422A;
    mul.rn.f32 %f4, %f4, %f2;
    abs.f32 %f5, %f4;
    mul.rn.f32 %f5, %f5, 0fC038AA3B;
    ex2.approx.f32 %f5, %f5;
    add.rn.f32 %f6, %f5, 0f3F800000;
    add.rn.f32 %f7, %f5, %f5;
    div.rn.f32 %f6, %f7, %f6;
    sub.rn.f32 %f7, 0f3F800000, %f6;
    setp.lt.f32 %p0, %f4, 0f00000000;
    @%p0 neg.f32 %f7, %f7;
    add.rn.f32 %f7, %f7, 0f3F800000;
    mul.rn.f32 %f8, %f1, 0f3F000000;
    mul.rn.f32 %f8, %f8, %f7;
    cvt.rn.f16.f32 %hh1, %f8;
    cvt.f32.f16 %f8, %hh1;
    setp.ge.f32 %p0, %f0, 0f41200000;
    selp.f32 %f8, %f0, %f8, %p0;
    mul.rn.f32 %f9, %f8, %f3;
    setp.le.f32 %p1, %f0, 0fC1200000;
    selp.f32 %f9, 0f00000000, %f9, %p1;
    st.global.f32 [%rd2], %f9;
DONE:
    ret;
}
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_in_qmm_ptx_is_current() {
        crate::ptx::assert_checked_in(OUT, &generate());
    }

    #[test]
    fn every_dtype_has_one_loop() {
        let text = generate();
        for (name, id) in DTYPES {
            assert_eq!(text.matches(&format!("\nB_{name}:\n")).count(), 1, "{name}");
            assert!(text.contains(&format!("setp.eq.u32 %p0, %gdt, {id};")));
        }
        for marker in [
            "@FRAG@",
            "@DT@",
            "@ZP@",
            "@ROW@",
            "@B_",
            "@SELECT",
            "@PREFETCH",
        ] {
            assert!(!text.contains(marker), "{marker} left in the output");
        }
    }
}
