//! Macros the levels build their [`super::Kernels`] tables with, so that every level
//! lists its entries in one place.

/// Safe table entries over a level's `unsafe` kernels: `fn name(args) = name_imp;`
/// defines `name`, which calls `name_imp`.
macro_rules! safe {
    ($(fn $name:ident($($a:ident: $t:ty),*) $(-> $ret:ty)? = $imp:ident;)*) => {$(
        fn $name($($a: $t),*) $(-> $ret)? {
            // SAFETY: a level's table, and with it this entry, is installed only where
            // the level's target features were detected (or are baseline: NEON on
            // aarch64); the invoking module names them.
            unsafe { $imp($($a),*) }
        }
    )*};
}

/// The safe entries every vector level has, over its `*_imp` kernels of the same names.
macro_rules! safe_common {
    () => {
        safe! {
            fn dot_f32(x: &[f32], y: &[f32]) -> f32 = dot_f32_imp;
            fn sum_sq(x: &[f32]) -> f32 = sum_sq_imp;
            fn max(x: &[f32]) -> f32 = max_imp;
            fn exp_shift_sum(x: &mut [f32], m: f32) -> f32 = exp_shift_sum_imp;
            fn silu(x: &[f32], out: &mut [f32]) = silu_imp;
            fn swiglu(a: &[f32], b: &[f32], out: &mut [f32]) = swiglu_imp;
            fn f32_to_f16(x: &[f32], out: &mut [u16]) = f32_to_f16_imp;
            fn axpy_f32(acc: &mut [f32], w: f32, v: &[f32]) = axpy_f32_imp;
            fn dots_f16(q: &[u16], k: &[u16], stride: usize, out: &mut [f32]) = dots_f16_imp;
            fn axpy_f16_rows(accs: &mut [&mut [f32]], ws: &[&[f32]], v: &[u16], stride: usize) = axpy_f16_rows_imp;
            fn tile_f32(w: DType, k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]) = tile_f32_imp;
            fn tile_f16(w: DType, k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]) = tile_f16_imp;
        }
    };
}

/// A level's [`super::Kernels`] table: the elementwise and attention entries are the
/// invoking module's functions of the same names, the others as given (no gemv).
macro_rules! kernels_table {
    ($isa:expr, heads: $heads:expr, quantize: $quantize:expr, mm: $mm:expr, pack: $pack:expr, unpacked: $unpacked:expr $(,)?) => {
        Kernels {
            isa: $isa,
            dot_f32,
            sum_sq,
            max,
            exp_shift_sum,
            silu,
            swiglu,
            f32_to_f16,
            axpy_f32,
            dots_f16,
            dots_f16_heads: $heads,
            axpy_f16_rows,
            quantize: $quantize,
            mm: $mm,
            pack: $pack,
            gemv: super::no_gemv,
            unpacked: $unpacked,
            panel: super::panel::no_panel,
        }
    };
}
