// Element-wise f32 kernels for x86 (exp, silu, swiglu, f32 -> f16, axpy), written once
// over the vector width and instantiated by `avx2.rs` (8 lanes in a ymm register) and
// `avx512.rs` (16 lanes in a zmm register). Each output element is computed by the same
// operations as the reference, whatever the width: vectors cover the longest prefix of
// whole vectors, the reference's scalar code the tail.
//
// `x86_exp!` makes the vector exp and silu; `x86_elementwise!` the slice kernels, with the
// instantiating file's `ld_f32` (an unaligned load of one vector). The intrinsics that
// differ between the widths are the macros' arguments.

macro_rules! x86_exp {
    (
        feature: $feat:literal,
        vector: $v:ty,
        exp: $exp:ident,
        silu: $silu:ident,
        set1: $set1:ident,
        max: $max:ident,
        min: $min:ident,
        add: $add:ident,
        sub: $sub:ident,
        mul: $mul:ident,
        div: $div:ident,
        xor: $xor:ident,
        add_i32: $add_i:ident,
        sub_i32: $sub_i:ident,
        set1_i32: $set1_i:ident,
        srai_i32: $srai:ident,
        slli_i32: $slli:ident,
        to_bits: $to_bits:ident,
        from_bits: $from_bits:ident $(,)?
    ) => {
        /// [`r::exp`] on every lane: the same operations in the same order.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn $exp(x: $v) -> $v {
            let s = $set1;
            // max(lo, x) = lo > x ? lo : x; min(hi, x) = hi < x ? hi : x (NaN stays NaN).
            let x = $max(s(r::EXP_LO), x);
            let x = $min(s(r::EXP_HI), x);
            let magic = s(r::MAGIC);
            let k = $add($mul(x, s(r::LOG2E)), magic);
            let n = $sub(k, magic);
            let ni = $sub_i($to_bits(k), $to_bits(magic));
            let rr = $sub(x, $mul(n, s(r::LN2_HI)));
            let rr = $sub(rr, $mul(n, s(r::LN2_LO)));
            let z = $mul(rr, rr);
            let mut p = $add($mul(s(r::P0), rr), s(r::P1));
            p = $add($mul(p, rr), s(r::P2));
            p = $add($mul(p, rr), s(r::P3));
            p = $add($mul(p, rr), s(r::P4));
            p = $add($mul(p, rr), s(r::P5));
            p = $add($add($mul(p, z), rr), s(1.0));
            let n1 = $srai::<1>(ni);
            let n2 = $sub_i(ni, n1);
            let bias = $set1_i(127);
            let s1 = $from_bits($slli::<23>($add_i(n1, bias)));
            let s2 = $from_bits($slli::<23>($add_i(n2, bias)));
            $mul($mul(p, s1), s2)
        }

        /// [`r::silu`] on every lane: `x / (1 + exp(-x))`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn $silu(x: $v) -> $v {
            let neg = $xor(x, $set1(-0.0));
            // SAFETY: same features.
            let e = unsafe { $exp(neg) };
            $div(x, $add($set1(1.0), e))
        }
    };
}

macro_rules! x86_elementwise {
    (
        feature: $feat:literal,
        lanes: $lanes:literal,
        silu: $silu:ident,
        store: $store:ident,
        mul: $mul:ident,
        add: $add:ident,
        set1: $set1:ident,
        to_f16: $to_f16:ident,
        store_f16: $store_f16:ident,
        f16_vector: $f16_vector:ty $(,)?
    ) => {
        #[target_feature(enable = $feat)]
        unsafe fn silu_imp(x: &[f32], out: &mut [f32]) {
            let n = x.len().min(out.len());
            let mut i = 0;
            while i + $lanes <= n {
                // SAFETY: a vector's floats at i in both.
                unsafe { $store(out.as_mut_ptr().add(i), $silu(ld_f32(x.as_ptr().add(i)))) };
                i += $lanes;
            }
            for j in i..n {
                out[j] = r::silu(x[j]);
            }
        }

        #[target_feature(enable = $feat)]
        unsafe fn swiglu_imp(a: &[f32], b: &[f32], out: &mut [f32]) {
            let n = a.len().min(b.len()).min(out.len());
            let mut i = 0;
            while i + $lanes <= n {
                // SAFETY: a vector's floats at i in all three.
                unsafe {
                    let s = $silu(ld_f32(a.as_ptr().add(i)));
                    $store(out.as_mut_ptr().add(i), $mul(s, ld_f32(b.as_ptr().add(i))));
                }
                i += $lanes;
            }
            for j in i..n {
                out[j] = r::silu(a[j]) * b[j];
            }
        }

        #[target_feature(enable = $feat)]
        unsafe fn f32_to_f16_imp(x: &[f32], out: &mut [u16]) {
            let n = x.len().min(out.len());
            let mut i = 0;
            while i + $lanes <= n {
                // SAFETY: a vector's values at i in both.
                unsafe {
                    let h = $to_f16::<_MM_FROUND_TO_NEAREST_INT>(ld_f32(x.as_ptr().add(i)));
                    $store_f16(out.as_mut_ptr().add(i) as *mut $f16_vector, h);
                }
                i += $lanes;
            }
            for j in i..n {
                out[j] = r::f32_to_f16(x[j]);
            }
        }

        #[target_feature(enable = $feat)]
        unsafe fn axpy_f32_imp(acc: &mut [f32], w: f32, v: &[f32]) {
            let n = acc.len().min(v.len());
            let wv = $set1(w);
            let mut i = 0;
            while i + $lanes <= n {
                // SAFETY: a vector's floats at i in both.
                unsafe {
                    let p = acc.as_mut_ptr().add(i);
                    $store(p, $add(ld_f32(p), $mul(wv, ld_f32(v.as_ptr().add(i)))));
                }
                i += $lanes;
            }
            for j in i..n {
                acc[j] += w * v[j];
            }
        }
    };
}
