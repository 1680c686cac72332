//! The PTX parser on its own: every form it accepts, checked by running what it decoded
//! (so a form that parses into the wrong meaning fails too), and the errors it gives for
//! what it refuses (file, line and a message that says why).

use cuda_sim::exec::{launch, LaunchConfig};
use cuda_sim::fault::Checks;
use cuda_sim::mem::FlatMemory;
use cuda_sim::ptx::{Module, ParamType};
use rstest::rstest;

const HEADER: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";
const BASE: u64 = 0x2000_0000;

/// A kernel `k(.param .u64 p_out)` around `body`, with registers declared.
fn kernel(body: &str) -> String {
    format!(
        "{HEADER}.visible .entry k(.param .u64 p_out)\n{{\n    .reg .pred %p<4>;\n    .reg .b32 %r<8>;\n    .reg .f32 %f<4>;\n    .reg .f64 %fd<2>;\n    .reg .b64 %rd<4>;\n    ld.param.u64 %rd0, [p_out];\n{body}\n    ret;\n}}\n"
    )
}

/// Parses `text`, runs kernel `k` on one thread and returns the 16 bytes at `p_out`.
fn run(text: &str) -> [u8; 16] {
    let m = Module::parse("t.ptx", text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let mem = FlatMemory::new(BASE, 64, false);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        dynamic_shared: 0,
        programmatic: false,
    };
    let p = BASE.to_le_bytes();
    launch(&m, "k", &cfg, &[&p], &mem, Checks::ALL, 1).unwrap_or_else(|e| panic!("{e:?}"));
    let mut out = [0u8; 16];
    mem.read(BASE, &mut out);
    out
}

fn word(b: &[u8; 16], i: usize) -> u32 {
    u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap())
}

#[rstest]
#[case::decimal("mov.u32 %r0, 42;", 42)]
#[case::hex("mov.u32 %r0, 0x2A;", 42)]
#[case::hex_upper("mov.u32 %r0, 0X2a;", 42)]
#[case::negative("mov.s32 %r0, -5;", (-5i32) as u32)]
#[case::float_hex("mov.f32 %f0, 0f40490FDB;\n    mov.b32 %r0, %f0;", 0x4049_0FDB)]
#[case::line_comment("mov.u32 %r0, 7; // mov.u32 %r0, 8;", 7)]
#[case::block_comment("mov.u32 %r0, /* 9 */ 7;", 7)]
#[case::guard_true(
    "mov.u32 %r0, 1;\n    setp.eq.u32 %p0, %r0, 1;\n    @%p0 mov.u32 %r0, 2;",
    2
)]
#[case::guard_negated(
    "mov.u32 %r0, 1;\n    setp.eq.u32 %p0, %r0, 1;\n    @!%p0 mov.u32 %r0, 2;",
    1
)]
#[case::forward_branch("mov.u32 %r0, 1;\n    bra SKIP;\n    mov.u32 %r0, 2;\nSKIP:", 1)]
#[case::backward_loop(
    "mov.u32 %r0, 0;\n    mov.u32 %r1, 5;\nLOOP:\n    add.u32 %r0, %r0, 3;\n    sub.u32 %r1, %r1, 1;\n    setp.ne.u32 %p0, %r1, 0;\n    @%p0 bra.uni LOOP;",
    15
)]
#[case::pragma("mov.u32 %r0, 3;\n    .pragma \"nounroll\";", 3)]
#[case::names_beside_special_ones(
    ".reg .pred %pmk<2>;\n    .reg .b32 %pm8, %envreg32, %clocks;\n    mov.u32 %pm8, 4;\n    mov.u32 %r0, %pm8;",
    4
)]
#[case::f64_hex(
    "mov.f64 %fd0, 0d4000000000000000;\n    cvt.rn.f32.f64 %f0, %fd0;\n    mov.b32 %r0, %f0;",
    0x4000_0000
)]
fn accepted_forms_mean_what_they_say(#[case] body: &str, #[case] want: u32) {
    let text = kernel(&format!("{body}\n    st.global.u32 [%rd0], %r0;"));
    assert_eq!(word(&run(&text), 0), want, "{body}");
}

#[test]
fn vectors_offsets_and_skipped_lanes() {
    let text = kernel(
        "    mov.u32 %r0, 10;\n    mov.u32 %r1, 11;\n    mov.u32 %r2, 12;\n    mov.u32 %r3, 13;\n    st.global.v4.u32 [%rd0], {%r0, %r1, %r2, %r3};\n    ld.global.v2.u32 {_, %r4}, [%rd0+8];\n    st.global.u32 [%rd0+-0], %r4;\n    add.u64 %rd1, %rd0, 16;\n    st.global.u32 [%rd1+-4], %r4;",
    );
    let out = run(&text);
    assert_eq!(
        [word(&out, 0), word(&out, 1), word(&out, 2), word(&out, 3)],
        [13, 11, 12, 13]
    );
}

#[test]
fn functions_shared_memory_and_parameters() {
    let text = format!(
        "{HEADER}.shared .align 16 .b32 table[8];
.func (.param .b32 r) twice(.param .b32 a)
{{
    .reg .b32 %t<2>;
    ld.param.b32 %t0, [a];
    add.u32 %t1, %t0, %t0;
    st.param.b32 [r], %t1;
    ret;
}}
.visible .entry k(.param .u64 p_out, .param .u32 p_n, .param .align 16 .b8 p_blob[24], .param .f32 p_x)
{{
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd0, [p_out];
    mov.u64 %rd1, table;
    mov.u32 %r0, 21;
    st.shared.u32 [%rd1+4], %r0;
    ld.shared.u32 %r1, [table+4];
    {{
        .param .b32 arg;
        .param .b32 ret;
        st.param.b32 [arg], %r1;
        call (ret), twice, (arg);
        ld.param.b32 %r2, [ret];
    }}
    st.global.u32 [%rd0], %r2;
    ret;
}}
"
    );
    let m = Module::parse("t.ptx", &text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.kernel_names(), ["k"]);
    let params = m.kernel_params("k").unwrap();
    let shape: Vec<(&str, ParamType, usize, usize)> = params
        .iter()
        .map(|p| (p.name.as_str(), p.ty, p.size, p.align))
        .collect();
    assert_eq!(
        shape,
        [
            ("p_out", ParamType::Int { signed: false }, 8, 8),
            ("p_n", ParamType::Int { signed: false }, 4, 4),
            ("p_blob", ParamType::Bytes, 24, 16),
            ("p_x", ParamType::Float, 4, 4),
        ]
    );
    assert!(m.instruction_count("twice").unwrap() >= 4);
    let mem = FlatMemory::new(BASE, 64, false);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        dynamic_shared: 0,
        programmatic: false,
    };
    let (p, n, blob, x) = (
        BASE.to_le_bytes(),
        0u32.to_le_bytes(),
        [0u8; 24],
        0f32.to_le_bytes(),
    );
    launch(&m, "k", &cfg, &[&p, &n, &blob, &x], &mem, Checks::ALL, 1)
        .unwrap_or_else(|e| panic!("{e:?}"));
    let mut out = [0u8; 4];
    mem.read(BASE, &mut out);
    assert_eq!(u32::from_le_bytes(out), 42);
}

/// What the parser refuses, the line it names and the words of its message.
#[rstest]
#[case::unknown_opcode("    frobnicate.u32 %r0, %r1;", 12, "frobnicate")]
#[case::unknown_modifier("    add.u32.wat %r0, %r0, 1;", 12, "wat")]
#[case::generic_address("    ld.u32 %r0, [%rd0];", 12, "generic addressing")]
#[case::operand_count("    add.u32 %r0, %r1;", 12, "takes 3 operands")]
#[case::undeclared_register("    mov.u32 %r9, 1;", 12, "%r9")]
#[case::undeclared_label("    bra NOWHERE;", 12, "NOWHERE")]
#[case::vector_width("    ld.global.v4.u32 {%r0, %r1}, [%rd0];", 12, "vector width")]
#[case::store_of_a_hole("    st.global.v2.u32 [%rd0], {%r0, _};", 12, "'_'")]
#[case::approx_add("    add.approx.f32 %f0, %f0, %f0;", 12, "approx")]
#[case::directed_rounding("    add.rz.f32 %f0, %f0, %f0;", 12, "'.rz'")]
#[case::performance_counter_names("    .reg .pred %pm<3>;", 12, "'%pm0'")]
#[case::performance_counter_64("    .reg .b64 %pm7_64;", 12, "'%pm7_64'")]
#[case::environment_register("    .reg .b32 %envreg<32>;", 12, "'%envreg0'")]
#[case::clock_register("    .reg .b32 %r9, %clock;", 12, "'%clock'")]
#[case::lane_mask_register("    .reg .b32 %lanemask_lt;", 12, "special register")]
fn refused_forms_say_where_and_why(#[case] body: &str, #[case] line: u32, #[case] says: &str) {
    let text = kernel(body);
    let e = Module::parse("bad.ptx", &text).unwrap_err();
    assert_eq!((e.file.as_str(), e.line), ("bad.ptx", line), "{e}");
    assert!(e.message.contains(says), "{body}: {e}");
    assert_eq!(e.text, body.trim());
    // One line, naming file and line.
    let shown = e.to_string();
    assert!(
        shown.starts_with(&format!("bad.ptx:{line}:")) && !shown.contains('\n'),
        "{shown}"
    );
}

#[rstest]
#[case::unterminated_body(
    format!("{HEADER}.visible .entry k(.param .u64 p)\n{{\n    ret;\n"),
    "end of"
)]
#[case::duplicate_kernel(
    format!("{HEADER}.visible .entry k(.param .u64 p)\n{{\n    ret;\n}}\n.visible .entry k(.param .u64 p)\n{{\n    ret;\n}}\n"),
    "k"
)]
#[case::symbol_named_like_a_kernel(
    format!("{HEADER}.shared .b32 k[4];\n.visible .entry k(.param .u64 p)\n{{\n    ret;\n}}\n"),
    "'k' defined twice"
)]
#[case::kernel_named_like_a_later_symbol(
    format!("{HEADER}.visible .entry k(.param .u64 p)\n{{\n    ret;\n}}\n.shared .b32 k[4];\n"),
    "'k' defined twice"
)]
#[case::unterminated_string(
    format!("{HEADER}.visible .entry k(.param .u64 p)\n{{\n    .pragma \"nounroll;\n    ret;\n}}\n"),
    "unterminated string"
)]
fn refused_modules(#[case] text: String, #[case] says: &str) {
    let e = Module::parse("bad.ptx", &text).unwrap_err();
    assert!(e.message.contains(says), "{e}");
}
