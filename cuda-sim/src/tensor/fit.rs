//! Pinning the f16 accumulation model on a GPU: [`numerics_cases`] are `m16n8k16`
//! products designed to tell every [`MmaModel::candidates`] model apart (a large
//! product with many small ones below and above each alignment threshold, the large one
//! first or last so that the block boundaries show; carries and ties for the rounding;
//! random products over a wide exponent range); a GPU computes them (the calibration
//! kit's `mma_f16_numerics` probe) and [`fit_f16_model`] finds the models that reproduce
//! its raw f32 results.

use super::model::{HalfInput, MmaModel};

/// One `m16n8k16.row.col.f32.f16.f16.f32` product: `D = A B + C`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumericsCase {
    /// A, 16 x 16 f16 encodings, row-major (`a[row * 16 + k]`).
    pub a: Vec<u16>,
    /// B, 16 x 8 f16 encodings, row-major (`b[k * 8 + col]`).
    pub b: Vec<u16>,
    /// C, 16 x 8 f32 encodings, row-major (`c[row * 8 + col]`).
    pub c: Vec<u32>,
}

impl NumericsCase {
    /// D by `model`, 16 x 8 f32 encodings, row-major.
    pub fn expected(&self, model: &MmaModel) -> Vec<u32> {
        (0..128)
            .map(|i| self.element(model, i / 8, i % 8))
            .collect()
    }

    /// D\[row\]\[col\] by `model`.
    fn element(&self, model: &MmaModel, row: usize, col: usize) -> u32 {
        let mut b = [0u16; 16];
        for (k, v) in b.iter_mut().enumerate() {
            *v = self.b[k * 8 + col];
        }
        let a = &self.a[row * 16..row * 16 + 16];
        model.dot(HalfInput::F16, self.c[row * 8 + col], a, &b)
    }
}

/// What [`fit_f16_model`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FitResult {
    /// The candidates that reproduce every result bit for bit.
    pub exact: Vec<MmaModel>,
    /// The candidate with the fewest differing results (the first of the exact ones
    /// when there are some), and that count.
    pub best: (MmaModel, usize),
    /// Results compared.
    pub results: usize,
}

impl FitResult {
    /// The model when exactly one candidate reproduces everything.
    pub fn unique(&self) -> Option<MmaModel> {
        match self.exact.as_slice() {
            [m] => Some(*m),
            _ => None,
        }
    }

    /// One line for a report.
    pub fn summary(&self) -> String {
        let (m, bad) = self.best;
        let what = match self.exact.len() {
            0 => format!("no model reproduces all {} results", self.results),
            1 => format!("unique fit of {} results", self.results),
            n => format!("{n} models reproduce all {} results", self.results),
        };
        format!(
            "{what}; best: blocks of {}, {} aligned bits from the {:?}, {:?} ({bad} differ)",
            m.block, m.align_bits, m.align_to, m.rounding
        )
    }
}

/// The candidates of [`MmaModel::candidates`] that reproduce `outputs` (the raw f32
/// results of `cases`, each case's 16 x 8 row-major, cases in order). An output list of
/// the wrong length matches nothing.
pub fn fit_f16_model(cases: &[NumericsCase], outputs: &[u32]) -> FitResult {
    fit_against(&candidate_outputs(cases), outputs)
}

/// Every candidate with the results it gives for `cases`.
fn candidate_outputs(cases: &[NumericsCase]) -> Vec<(MmaModel, Vec<u32>)> {
    MmaModel::candidates()
        .into_iter()
        .map(|m| (m, cases.iter().flat_map(|c| c.expected(&m)).collect()))
        .collect()
}

fn fit_against(table: &[(MmaModel, Vec<u32>)], outputs: &[u32]) -> FitResult {
    let results = table.first().map_or(0, |(_, o)| o.len());
    let mut exact = Vec::new();
    let mut best: Option<(MmaModel, usize)> = None;
    for (m, want) in table {
        let bad = if outputs.len() != results {
            results.max(1)
        } else {
            want.iter().zip(outputs).filter(|(x, y)| x != y).count()
        };
        if bad == 0 {
            exact.push(*m);
        }
        if best.is_none_or(|(_, b)| bad < b) {
            best = Some((*m, bad));
        }
    }
    FitResult {
        exact,
        best: best.expect("there are candidates"),
        results,
    }
}

/// A small seeded generator (the cases are the same on every machine).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The f16 encoding of `sign * (1 + frac / 1024) * 2^exp` for a normal exponent, or
/// of `sign * frac * 2^-24` below (`exp < -14`: a subnormal, `frac` its field).
fn f16_bits(neg: bool, exp: i32, frac: u16) -> u16 {
    let sign = if neg { 0x8000 } else { 0 };
    if exp < -14 {
        // 2^exp as a subnormal: field 2^(exp + 24).
        sign | (1u16 << (exp + 24).clamp(0, 9))
    } else {
        sign | (((exp + 15) as u16) << 10) | (frac & 0x3ff)
    }
}

fn f32_bits(neg: bool, exp: i32, frac: u32) -> u32 {
    (if neg { 0x8000_0000 } else { 0 }) | (((exp + 127) as u32) << 23) | (frac & 0x7f_ffff)
}

/// The probe's products (eight `m16n8k16` cases, 1024 results), fixed: changing them
/// changes what a recorded probe means.
pub fn numerics_cases() -> Vec<NumericsCase> {
    let mut cases = Vec::new();
    let one = f16_bits(false, 0, 0);
    // 1-2: one product of 1 (first or last k, alternating rows) and fifteen small ones
    // of 2^-(8 + row/2 + col) (col scales B's small rows): every exponent from 2^-8 to
    // 2^-30 below the large one, all small ones positive (case 1) or negative (case 2).
    for neg in [false, true] {
        let mut a = vec![0u16; 256];
        let mut b = vec![0u16; 128];
        for row in 0..16 {
            let big_k = if row % 2 == 0 { 0 } else { 15 };
            for k in 0..16 {
                a[row * 16 + k] = if k == big_k {
                    one
                } else {
                    f16_bits(neg, -8 - (row as i32 / 2), 0)
                };
            }
        }
        for k in 0..16 {
            for n in 0..8 {
                // Row 0 and row 15 of B carry the large product unscaled.
                b[k * 8 + n] = if k == 0 || k == 15 {
                    one
                } else {
                    f16_bits(false, -2 * n as i32, 0)
                };
            }
        }
        cases.push(NumericsCase {
            a,
            b,
            c: vec![0; 128],
        });
    }
    // 3: the large addend is C (2^e), the products small with all significand bits set:
    // their sum's low bits fall at and below every grid, and the block sums carry.
    {
        let mut r = Rng(3);
        let a: Vec<u16> = (0..256)
            .map(|i| f16_bits(r.below(4) == 0, -6 - (i % 16) / 3, 0x3ff))
            .collect();
        let b: Vec<u16> = (0..128)
            .map(|_| f16_bits(false, -(r.below(6) as i32), r.below(1024) as u16 | 0x201))
            .collect();
        let c = (0..128)
            .map(|i| f32_bits(false, (i % 8) - 4, r.below(1 << 23) as u32))
            .collect();
        cases.push(NumericsCase { a, b, c });
    }
    // 4: sums that carry past the largest addend with bits below the f32 unit: sixteen
    // products just below 1 (all-ones significands), plus C = 0 or -1/2.
    {
        let mut r = Rng(4);
        let a: Vec<u16> = (0..256)
            .map(|_| f16_bits(false, -1, 0x3ff - r.below(8) as u16))
            .collect();
        let b: Vec<u16> = (0..128)
            .map(|_| f16_bits(false, 0, 0x3ff - r.below(64) as u16))
            .collect();
        let c = (0..128)
            .map(|i| if i % 2 == 0 { 0 } else { f32_bits(true, -1, 0) })
            .collect();
        cases.push(NumericsCase { a, b, c });
    }
    // 5: pairs of products (1 + 2^-m) 2^-24 and (1 - 2^-m) 2^-24 (m = 1..8 by row)
    // beside an accumulator C = +-2^(0..3): they reach a unit of C only if both keep
    // their last bit, which shows every alignment width even with blocks of two. The
    // pair is the first two products (rows 0-7) or the last two (rows 8-15).
    {
        let mut a = vec![0u16; 256];
        for row in 0..16 {
            let m = 1 + (row % 8) as u16;
            let (k0, k1) = if row < 8 { (0, 1) } else { (14, 15) };
            a[row * 16 + k0] = f16_bits(false, -12, 1024 >> m);
            a[row * 16 + k1] = f16_bits(false, -13, 1024 - (1024 >> (m - 1)));
        }
        let b = vec![f16_bits(false, -12, 0); 128];
        let c = (0..128).map(|i| f32_bits(i % 8 >= 4, i % 4, 0)).collect();
        cases.push(NumericsCase { a, b, c });
    }
    // 6-8: random products, exponents spread over 2^-24..2^4 (A) and 2^-6..2^3 (B),
    // random signs and significands, C random or zero.
    for seed in 6..9u64 {
        let mut r = Rng(seed * 7919);
        let a: Vec<u16> = (0..256)
            .map(|_| {
                let exp = 4 - r.below(29) as i32;
                f16_bits(r.below(2) == 0, exp, r.below(1024) as u16)
            })
            .collect();
        let b: Vec<u16> = (0..128)
            .map(|_| {
                let exp = 3 - r.below(10) as i32;
                f16_bits(r.below(3) == 0, exp, r.below(1024) as u16)
            })
            .collect();
        let c = (0..128)
            .map(|_| {
                if r.below(3) == 0 {
                    0
                } else {
                    f32_bits(
                        r.below(2) == 0,
                        6 - r.below(30) as i32,
                        r.below(1 << 23) as u32,
                    )
                }
            })
            .collect();
        cases.push(NumericsCase { a, b, c });
    }
    cases
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe's cases tell the candidates apart: the outputs of each candidate are
    /// reproduced by that candidate only.
    #[test]
    fn every_candidate_is_recovered_from_its_own_outputs() {
        let table = candidate_outputs(&numerics_cases());
        assert_eq!(table.len(), 104);
        for (m, out) in &table {
            let fit = fit_against(&table, out);
            assert_eq!(fit.exact, vec![*m], "{m:?}: {}", fit.summary());
            assert_eq!(fit.unique(), Some(*m));
            // Not by a hair: every other candidate differs in several results.
            for (other, o) in &table {
                let differ = o.iter().zip(out).filter(|(x, y)| x != y).count();
                assert!(other == m || differ >= 3, "{m:?} vs {other:?}: {differ}");
            }
        }
        // The public entry point, on the two defaults.
        for m in [MmaModel::SM80, MmaModel::SM90] {
            let out: Vec<u32> = numerics_cases()
                .iter()
                .flat_map(|c| c.expected(&m))
                .collect();
            assert_eq!(fit_f16_model(&numerics_cases(), &out).unique(), Some(m));
        }
    }

    #[test]
    fn a_wrong_result_count_matches_nothing() {
        let fit = fit_f16_model(&numerics_cases(), &[0; 5]);
        assert!(fit.exact.is_empty());
        assert!(fit.summary().starts_with("no model"), "{}", fit.summary());
    }
}
