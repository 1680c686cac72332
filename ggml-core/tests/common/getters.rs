//! Calls every typed getter of a parsed file for one key, and every conversion of a value: shared by the tests' accessor
//! walk (`common::touch_all`) and the fuzz target's (`fuzz/src/lib.rs`, which includes
//! this file by path).

use ggml_core::gguf::{Gguf, Value};

/// Every `get_*` and `get_as_*` of `g` for `key`; only a panic can fail it.
pub fn call_every_getter(g: &Gguf<'_>, key: &str) {
    let _ = (
        g.get_u32(key),
        g.get_i32(key),
        g.get_u64(key),
        g.get_i64(key),
        g.get_f32(key),
        g.get_f64(key),
        g.get_bool(key),
        g.get_str(key),
        g.get_array(key),
        g.get_as_u32(key),
        g.get_as_i32(key),
        g.get_as_u64(key),
        g.get_as_i64(key),
        g.get_as_usize(key),
    );
}

/// Every `as_*` and `to_*` conversion of `v` but `as_array`; only a panic can fail it.
pub fn call_every_conversion(v: &Value<'_>) {
    let _ = (
        v.as_u8(),
        v.as_i8(),
        v.as_u16(),
        v.as_i16(),
        v.as_u32(),
        v.as_i32(),
        v.as_u64(),
        v.as_i64(),
        v.as_f32(),
        v.as_f64(),
        v.as_bool(),
        v.as_str(),
        v.to_u32(),
        v.to_i32(),
        v.to_u64(),
        v.to_i64(),
        v.to_usize(),
    );
}
