//! Values as the little-endian bytes a tensor holds, and back.

/// `v` as f32 bytes.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `v` rounded to f16 (to nearest even), as bytes.
pub fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::f16::from_f32(*x).to_bits().to_le_bytes())
        .collect()
}

/// `v` rounded to bf16 (to nearest even), as bytes.
pub fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::bf16::from_f32(*x).to_bits().to_le_bytes())
        .collect()
}

/// `v` as i32 bytes.
pub fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// f32 bytes as values (a trailing partial value is an error of the caller: panics).
pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    assert_eq!(
        bytes.len() % 4,
        0,
        "{} bytes are not whole f32s",
        bytes.len()
    );
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The bit patterns of `v`, for comparisons that must be exact (NaN included, -0 apart
/// from +0).
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let v = [1.5f32, -0.0, 3.0e-5, f32::INFINITY];
        assert_eq!(bits(&f32s(&f32_bytes(&v))), bits(&v));
        assert_eq!(f16_bytes(&[1.0]), [0x00, 0x3c]);
        assert_eq!(bf16_bytes(&[1.0]), [0x80, 0x3f]);
        assert_eq!(i32_bytes(&[-1]), [0xff; 4]);
    }

    #[test]
    #[should_panic(expected = "not whole f32s")]
    fn partial_value_panics() {
        f32s(&[0, 0, 0]);
    }
}
