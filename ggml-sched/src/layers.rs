//! Per-device proportions, as llama.cpp's `--tensor-split`.

use std::ops::Range;

use crate::error::{Result, SchedError};

/// Splits `n_layers` consecutive layers over devices in proportion to `proportions`,
/// exactly as llama.cpp assigns layers for `--split-mode layer --tensor-split ...`:
/// the proportions are summed cumulatively and normalised (`f32`), and layer `il` goes to
/// the first device `i` whose cumulative share exceeds `il / n_layers`.
///
/// Returns one (possibly empty) range per device; the ranges are consecutive and cover
/// `0..n_layers`. Empty `proportions` or all zeros means equal shares (one device per entry;
/// with no entries, one device). Negative or non-finite proportions are an error.
///
/// ```
/// use ggml_sched::split_layers;
/// assert_eq!(split_layers(30, &[1.0, 1.0]).unwrap(), vec![0..15, 15..30]);
/// assert_eq!(split_layers(10, &[3.0, 1.0]).unwrap(), vec![0..8, 8..10]);
/// ```
pub fn split_layers(n_layers: usize, proportions: &[f32]) -> Result<Vec<Range<usize>>> {
    if proportions.iter().any(|p| !p.is_finite() || *p < 0.0) {
        return Err(SchedError::Invalid(format!(
            "layer proportions must be finite and >= 0, got {proportions:?}"
        )));
    }
    let n_dev = proportions.len().max(1);
    let props: Vec<f32> = if proportions.iter().all(|p| *p == 0.0) {
        vec![1.0; n_dev]
    } else {
        proportions.to_vec()
    };
    // llama.cpp: splits[i] = cumulative sum, then divided by the total.
    let mut cum = Vec::with_capacity(n_dev);
    let mut sum = 0.0f32;
    for p in &props {
        sum += p;
        cum.push(sum);
    }
    for c in &mut cum {
        *c /= sum;
    }
    let mut device_of = Vec::with_capacity(n_layers);
    for il in 0..n_layers {
        let x = il as f32 / n_layers as f32;
        // std::upper_bound: first element > x.
        let d = cum.iter().position(|&c| c > x).unwrap_or(n_dev - 1);
        device_of.push(d);
    }
    let mut ranges = Vec::with_capacity(n_dev);
    let mut start = 0;
    for d in 0..n_dev {
        let end = start + device_of[start..].iter().take_while(|&&x| x == d).count();
        ranges.push(start..end);
        start = end;
    }
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_and_weighted() {
        assert_eq!(split_layers(30, &[]).unwrap(), vec![0..30]);
        assert_eq!(
            split_layers(30, &[0.0, 0.0, 0.0]).unwrap(),
            vec![0..10, 10..20, 20..30]
        );
        assert_eq!(split_layers(7, &[1.0, 1.0]).unwrap(), vec![0..4, 4..7]);
        assert_eq!(split_layers(4, &[0.0, 1.0]).unwrap(), vec![0..0, 0..4]);
        assert_eq!(
            split_layers(4, &[1.0, 0.0, 1.0]).unwrap(),
            vec![0..2, 2..2, 2..4]
        );
        assert!(split_layers(4, &[1.0, -1.0]).is_err());
        assert!(split_layers(4, &[f32::NAN]).is_err());
        assert_eq!(split_layers(0, &[1.0, 1.0]).unwrap(), vec![0..0, 0..0]);
    }
}
