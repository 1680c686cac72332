//! The f16 `mma` accumulation model of sm_90 against a real H100: the calibration kit's
//! `mma_f16_numerics` probe, run on an NVIDIA H100 80GB HBM3 (driver 580, CUDA 13.0) at
//! commit a5a7363, recorded the raw f32 results of every product of
//! `tensor::numerics_cases` (`harness/reference/cuda-h100-a5a7363/probes.json`).

use std::path::PathBuf;

use cuda_sim::tensor::{fit_f16_model, numerics_cases, AlignRef, BlockRounding, MmaModel};

/// The probe's samples: D's f32 bits (stored as JSON numbers), each case's 16 x 8
/// row-major, cases in order.
fn h100_results() -> Vec<u32> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../harness/reference/cuda-h100-a5a7363/probes.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let json: serde_json::Value = serde_json::from_str(&text).expect("probes.json is JSON");
    let probe = json["probes"]
        .as_array()
        .expect("a probes list")
        .iter()
        .find(|p| p["name"] == "mma_f16_numerics")
        .expect("the mma_f16_numerics probe");
    probe["samples"]
        .as_array()
        .expect("samples")
        .iter()
        .map(|s| {
            let v = s.as_f64().expect("a number");
            assert!(
                v.fract() == 0.0 && (0.0..=u32::MAX as f64).contains(&v),
                "not f32 bits: {v}"
            );
            v as u32
        })
        .collect()
}

#[test]
fn sm90_is_the_one_model_that_reproduces_the_h100() {
    let results = h100_results();
    assert_eq!(results.len(), 8 * 128);
    let fit = fit_f16_model(&numerics_cases(), &results);
    assert_eq!(fit.unique(), Some(MmaModel::SM90), "{}", fit.summary());
    assert_eq!(MmaModel::default(), MmaModel::SM90);
}

/// What the input-exponent alignment changes: the best leading-bit model (the best
/// candidate before `AlignRef::InputExponents` existed) misses 64 of the H100's results,
/// all in the random cases 6-8. The two alignments differ only where the block's largest
/// addend is a product whose significands multiply to 2 or more (its leading bit one
/// above its input exponents): there the H100 keeps one bit more.
#[test]
fn leading_bit_alignment_misses_64_h100_results() {
    let results = h100_results();
    let lead = MmaModel {
        block: 16,
        align_bits: 26,
        align_to: AlignRef::LeadingBit,
        rounding: BlockRounding::TowardZero,
    };
    let cases = numerics_cases();
    let mut differ_per_case = Vec::new();
    for (case, want) in cases.iter().zip(results.chunks(128)) {
        let got = case.expected(&lead);
        differ_per_case.push(got.iter().zip(want).filter(|(x, y)| x != y).count());
    }
    assert_eq!(differ_per_case, [0, 0, 0, 0, 0, 25, 24, 15]);
}
