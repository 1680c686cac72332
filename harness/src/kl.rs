//! KL divergence against llama.cpp: the base file that `llama-perplexity
//! --kl-divergence-base FILE` writes, and the statistics that `llama-perplexity
//! --kl-divergence` prints, computed with the same arithmetic (tools/perplexity/
//! perplexity.cpp).
//!
//! The file (host byte order, little endian in practice):
//!
//! | field      | type                      | meaning                                   |
//! |------------|---------------------------|-------------------------------------------|
//! | magic      | 8 bytes `_logits_`        |                                           |
//! | n_ctx      | u32                       | tokens per chunk                          |
//! | n_vocab    | i32                       | vocabulary size                           |
//! | n_chunk    | i32                       | chunks                                    |
//! | tokens     | i32 × n_ctx·n_chunk       | the evaluated tokens (no BOS substituted) |
//! | log-probs  | per chunk, n_ctx−1−n_ctx/2 rows of `nv = 2·⌈n_vocab/2⌉ + 4` u16 |   |
//!
//! A row is the base model's log-softmax at one scored position, compressed: its first
//! two f32 (four u16) are `scale` and `min_log_prob`, then one u16 `q` per token with
//! `log p = scale·q + min_log_prob` (log-probs below `max − 16` clamp to the minimum).

use std::fmt::{self, Write as _};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::error::{HarnessError, Result};

/// The first 8 bytes of a base file.
pub const MAGIC: &[u8; 8] = b"_logits_";

/// u16 values per row of log-probs for a vocabulary of `n_vocab`: the vocabulary rounded
/// up to even, plus the two f32 of scale and minimum.
pub fn row_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// Rows of log-probs per chunk of `n_ctx` tokens: positions `n_ctx/2 .. n_ctx-2`, each
/// predicting the next token.
pub fn rows_per_chunk(n_ctx: usize) -> usize {
    n_ctx.saturating_sub(1 + n_ctx / 2)
}

/// Anything a base file can be read from.
pub trait Source: Read + Seek + Send {}
impl<T: Read + Seek + Send> Source for T {}

/// An open base file: the header and tokens read and checked, the log-probs read one
/// chunk at a time.
pub struct KlBase {
    name: String,
    src: Box<dyn Source>,
    /// Tokens per chunk.
    pub n_ctx: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Chunks in the file.
    pub n_chunk: usize,
    /// The evaluated tokens, `n_ctx * n_chunk` of them.
    pub tokens: Vec<u32>,
    data_offset: u64,
}

impl fmt::Debug for KlBase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KlBase")
            .field("name", &self.name)
            .field("n_ctx", &self.n_ctx)
            .field("n_vocab", &self.n_vocab)
            .field("n_chunk", &self.n_chunk)
            .finish()
    }
}

/// One chunk's log-probs: `rows_per_chunk(n_ctx)` rows of [`row_len`]`(n_vocab)` u16.
#[derive(Clone, Debug, Default)]
pub struct ChunkLogProbs {
    /// The raw rows, one after the other.
    pub data: Vec<u16>,
    /// u16 per row.
    pub row_len: usize,
}

impl ChunkLogProbs {
    /// Row `r` (scale, minimum, then the quantised log-probs).
    pub fn row(&self, r: usize) -> &[u16] {
        &self.data[r * self.row_len..(r + 1) * self.row_len]
    }
}

/// `scale` and `min_log_prob` of a row: the two f32 in its first four u16.
pub fn row_scale_min(row: &[u16]) -> (f32, f32) {
    let f = |lo: u16, hi: u16| f32::from_bits(u32::from(lo) | (u32::from(hi) << 16));
    (f(row[0], row[1]), f(row[2], row[3]))
}

impl KlBase {
    /// Opens and checks the base file at `path` (header, tokens, total size).
    pub fn open(path: &Path) -> Result<KlBase> {
        let file = std::fs::File::open(path).map_err(|source| HarnessError::Io {
            path: path.display().to_string(),
            source,
        })?;
        KlBase::from_source(
            &path.display().to_string(),
            Box::new(std::io::BufReader::with_capacity(1 << 20, file)),
        )
    }

    /// Reads and checks the header and tokens of a base file from `src`; `name` names it
    /// in errors. Every error is one line naming the field and its byte offset.
    pub fn from_source(name: &str, mut src: Box<dyn Source>) -> Result<KlBase> {
        let bad = |detail: String| HarnessError::Usage(format!("{name}: {detail}"));
        let len = src
            .seek(SeekFrom::End(0))
            .and_then(|l| src.seek(SeekFrom::Start(0)).map(|_| l))
            .map_err(|source| HarnessError::Io {
                path: name.to_string(),
                source,
            })?;
        let mut read = |field: &str, offset: u64, buf: &mut [u8]| -> Result<()> {
            src.read_exact(buf).map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    bad(format!(
                        "truncated: {field} at byte {offset} needs {} bytes, the file has {len}",
                        buf.len()
                    ))
                } else {
                    bad(format!("reading {field} at byte {offset}: {e}"))
                }
            })
        };
        let mut magic = [0u8; 8];
        read("magic", 0, &mut magic)?;
        if &magic != MAGIC {
            return Err(bad(format!(
                "magic {:?} at byte 0 is not {:?}: not a llama-perplexity --kl-divergence-base file",
                String::from_utf8_lossy(&magic),
                "_logits_"
            )));
        }
        let mut word = [0u8; 4];
        read("n_ctx", 8, &mut word)?;
        let n_ctx = u32::from_le_bytes(word);
        read("n_vocab", 12, &mut word)?;
        let n_vocab = i32::from_le_bytes(word);
        read("n_chunk", 16, &mut word)?;
        let n_chunk = i32::from_le_bytes(word);
        // llama.cpp's contexts are i32; a chunk needs at least one scored row.
        if !(3..=i32::MAX as u32).contains(&n_ctx) {
            return Err(bad(format!(
                "n_ctx {n_ctx} at byte 8: must be in 3..={}",
                i32::MAX
            )));
        }
        if n_vocab <= 0 {
            return Err(bad(format!("n_vocab {n_vocab} at byte 12: must be > 0")));
        }
        if n_chunk <= 0 {
            return Err(bad(format!("n_chunk {n_chunk} at byte 16: must be > 0")));
        }
        let (n_ctx, n_vocab, n_chunk) = (n_ctx as usize, n_vocab as usize, n_chunk as usize);
        let n_tokens = n_ctx
            .checked_mul(n_chunk)
            .ok_or_else(|| bad(format!("n_ctx {n_ctx} × n_chunk {n_chunk} overflows")))?;
        let data_offset = 20u64 + 4 * n_tokens as u64;
        let chunk_bytes = (rows_per_chunk(n_ctx) * row_len(n_vocab) * 2) as u64;
        let expected = chunk_bytes
            .checked_mul(n_chunk as u64)
            .and_then(|b| b.checked_add(data_offset))
            .ok_or_else(|| bad("the sizes in the header overflow".into()))?;
        if len < data_offset {
            return Err(bad(format!(
                "truncated: tokens at byte 20 need {} bytes (n_ctx {n_ctx} × n_chunk {n_chunk}), the file has {len}",
                4 * n_tokens
            )));
        }
        if len != expected {
            let what = if len < expected {
                let full = (len - data_offset) / chunk_bytes.max(1);
                format!(
                    "truncated: log-probs of chunk {full} end at byte {}, the file has {len} bytes",
                    data_offset + (full + 1) * chunk_bytes
                )
            } else {
                format!(
                    "{} bytes after the last chunk (byte {expected}): not the size the header gives",
                    len - expected
                )
            };
            return Err(bad(what));
        }
        let mut raw = vec![0u8; 4 * n_tokens];
        read("tokens", 20, &mut raw)?;
        let mut tokens = Vec::with_capacity(n_tokens);
        for (i, b) in raw.chunks_exact(4).enumerate() {
            let t = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            if t < 0 || t as usize >= n_vocab {
                return Err(bad(format!(
                    "tokens[{i}] = {t} at byte {}: not in 0..n_vocab ({n_vocab})",
                    20 + 4 * i
                )));
            }
            tokens.push(t as u32);
        }
        Ok(KlBase {
            name: name.to_string(),
            src,
            n_ctx,
            n_vocab,
            n_chunk,
            tokens,
            data_offset,
        })
    }

    /// Reads chunk `c`'s log-probs into `out`, checking each row's scale (finite, >= 0)
    /// and minimum (finite).
    pub fn read_chunk(&mut self, c: usize, out: &mut ChunkLogProbs) -> Result<()> {
        let name = &self.name;
        let bad = |detail: String| HarnessError::Usage(format!("{name}: {detail}"));
        if c >= self.n_chunk {
            return Err(bad(format!(
                "chunk {c} asked for, the file has {}",
                self.n_chunk
            )));
        }
        let nv = row_len(self.n_vocab);
        let rows = rows_per_chunk(self.n_ctx);
        let offset = self.data_offset + (c * rows * nv * 2) as u64;
        let mut raw = vec![0u8; rows * nv * 2];
        self.src
            .seek(SeekFrom::Start(offset))
            .and_then(|_| self.src.read_exact(&mut raw))
            .map_err(|e| bad(format!("log-probs of chunk {c} at byte {offset}: {e}")))?;
        out.row_len = nv;
        out.data.clear();
        out.data.extend(
            raw.chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]])),
        );
        for r in 0..rows {
            let (scale, min) = row_scale_min(out.row(r));
            if !(scale.is_finite() && scale >= 0.0 && min.is_finite()) {
                return Err(bad(format!(
                    "log-probs of chunk {c}, row {r} (byte {}): scale {scale} and min_log_prob {min} must be finite, scale >= 0",
                    offset + (r * nv * 2) as u64
                )));
            }
        }
        Ok(())
    }

    /// Checks that the base file was made with the same context and tokens as our run:
    /// `n_ctx` equal, the vocabulary `n_vocab`, and the first `n_chunk · n_ctx` of `tokens`
    /// equal to the file's, where `n_chunk` is the smaller of the file's chunks and ours.
    /// Returns that `n_chunk`.
    pub fn check_run(&self, n_ctx: usize, n_vocab: usize, tokens: &[u32]) -> Result<usize> {
        let name = &self.name;
        if n_ctx != self.n_ctx {
            return Err(HarnessError::Usage(format!(
                "{name}: computed with n_ctx {}, this run has --ctx {n_ctx}",
                self.n_ctx
            )));
        }
        if n_vocab != self.n_vocab {
            return Err(HarnessError::Usage(format!(
                "{name}: computed with a vocabulary of {} tokens, the model has {n_vocab}",
                self.n_vocab
            )));
        }
        let n_chunk = self.n_chunk.min(tokens.len() / n_ctx);
        let n = n_chunk * n_ctx;
        if let Some(i) = (0..n).find(|&i| tokens[i] != self.tokens[i]) {
            return Err(HarnessError::Usage(format!(
                "{name}: token {i} (chunk {}, position {}) differs: {} in the base file, {} in this run's text",
                i / n_ctx,
                i % n_ctx,
                self.tokens[i],
                tokens[i]
            )));
        }
        Ok(n_chunk)
    }
}

/// llama.cpp's `nearest_int`: round to nearest, ties to even, through the float trick.
fn nearest_int(f: f32) -> i32 {
    let v = f + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Compresses one row of logits into a base-file row of [`row_len`] u16 as llama.cpp's
/// `log_softmax` (the writing one) does, and returns the token's negative
/// log-likelihood. Used to write base files in tests; `out.len()` must be
/// `row_len(logits.len())`.
pub fn compress_row(logits: &[f32], tok: usize, out: &mut [u16]) -> f64 {
    let n = logits.len();
    let mut max = logits[0];
    let mut min = logits[0];
    for &l in &logits[1..] {
        max = max.max(l);
        min = min.min(l);
    }
    min = min.max(max - 16.0);
    let mut sum_exp = 0f64;
    for &l in logits {
        sum_exp += f64::from((l - max).exp());
    }
    let log_sum_exp = sum_exp.ln() as f32;
    let min_log_prob = min - max - log_sum_exp;
    let scale = (max - min) / 65535.0;
    let (s, m) = (scale.to_bits(), min_log_prob.to_bits());
    out[..4].copy_from_slice(&[s as u16, (s >> 16) as u16, m as u16, (m >> 16) as u16]);
    let q = &mut out[4..];
    if scale != 0.0 {
        let inv = 1.0 / scale;
        for (y, &l) in q.iter_mut().zip(logits) {
            *y = if l > min {
                nearest_int(inv * (l - min)) as u16
            } else {
                0
            };
        }
    } else {
        q[..n].fill(0);
    }
    q[n..].fill(0);
    f64::from(max + log_sum_exp - logits[tok])
}

/// Writes a base file in llama.cpp's format from full logits rows (`n_vocab` each) at
/// every scored position: `logits[c]` holds chunk `c`'s `rows_per_chunk(n_ctx)` rows,
/// `tokens` its `n_ctx · n_chunk` tokens. For tests and tools that need a base file
/// without llama.cpp.
pub fn write_base(n_ctx: usize, n_vocab: usize, tokens: &[u32], logits: &[Vec<f32>]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(n_ctx as u32).to_le_bytes());
    out.extend_from_slice(&(n_vocab as i32).to_le_bytes());
    out.extend_from_slice(&(logits.len() as i32).to_le_bytes());
    for &t in tokens {
        out.extend_from_slice(&(t as i32).to_le_bytes());
    }
    let first = n_ctx / 2;
    let mut row = vec![0u16; row_len(n_vocab)];
    for (c, chunk) in logits.iter().enumerate() {
        for r in 0..rows_per_chunk(n_ctx) {
            let tok = tokens[c * n_ctx + first + r + 1] as usize;
            compress_row(&chunk[r * n_vocab..(r + 1) * n_vocab], tok, &mut row);
            for v in &row {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    out
}

/// The running sums of llama.cpp's `kl_divergence_result`, and the per-token KLD and Δp
/// values for the percentiles.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KlStats {
    /// Σ nll of our logits (f32 terms).
    pub sum_nll: f64,
    /// Σ nll².
    pub sum_nll2: f64,
    /// Σ nll of the base.
    pub sum_nll_base: f64,
    /// Σ nll_base².
    pub sum_nll_base2: f64,
    /// Σ nll · nll_base.
    pub sum_nll_nll_base: f64,
    /// Σ KLD.
    pub sum_kld: f64,
    /// Σ KLD².
    pub sum_kld2: f64,
    /// Σ Δp (our probability of the token minus the base's).
    pub sum_p_diff: f64,
    /// Σ Δp².
    pub sum_p_diff2: f64,
    /// Σ Δp⁴.
    pub sum_p_diff4: f64,
    /// max |Δp|.
    pub max_p_diff: f32,
    /// Tokens whose most likely token is the same for us and the base.
    pub n_same_top: usize,
    /// Tokens scored.
    pub count: usize,
    /// KLD of each token, in order.
    pub kld_values: Vec<f32>,
    /// Δp of each token, in order.
    pub p_diff_values: Vec<f32>,
}

/// llama.cpp's `mean_and_uncertainty`.
fn mean_and_uncertainty(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count < 1 {
        return (0.0, 0.0);
    }
    let f = sum / count as f64;
    let df = sum2 / count as f64 - f * f;
    let df = if df > 0.0 && count > 10 {
        (df / (count - 1) as f64).sqrt()
    } else {
        0.0
    };
    (f, df)
}

/// llama.cpp's `covariance`.
fn covariance(suma: f64, sumb: f64, sumab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let c = count as f64;
    (sumab / c - (suma / c) * (sumb / c)) / (count - 1) as f64
}

/// llama.cpp's `percentile` over sorted values, in f32.
fn percentile(values: &[f32], fraction: f32) -> f32 {
    if fraction <= 0.0 {
        return values[0];
    }
    if fraction >= 1.0 {
        return values[values.len() - 1];
    }
    let mut p = fraction * (values.len() - 1) as f32;
    let ip = p as usize;
    p -= ip as f32;
    (1.0 - p) * values[ip] + p * values[(ip + 1).min(values.len() - 1)]
}

/// Median as llama.cpp takes it (mean of the middle two, in f32, for an even count).
fn median(v: &[f32]) -> f32 {
    let n = v.len();
    if n % 2 == 0 {
        0.5 * (v[n / 2] + v[n / 2 - 1])
    } else {
        v[n / 2]
    }
}

impl KlStats {
    /// Adds one scored token: our `logits` row, the base file's `base` row for the same
    /// position, and the token `tok` that follows. The arithmetic is llama.cpp's (its
    /// `log_softmax` with the base log-probs): f32 max and log-sum-exp, the sum of `expf`
    /// in f64, the KLD summed in f64 from f32 terms over the tokens whose base log-prob is
    /// above −16.
    pub fn add(&mut self, logits: &[f32], base: &[u16], tok: usize) {
        let n_vocab = logits.len();
        let mut max_logit = logits[0];
        let mut imax = 0;
        for (i, &l) in logits.iter().enumerate().skip(1) {
            if l > max_logit {
                max_logit = l;
                imax = i;
            }
        }
        let mut sum_exp = 0f64;
        for &l in logits {
            sum_exp += f64::from((l - max_logit).exp());
        }
        let log_sum_exp = sum_exp.ln() as f32;
        let (scale, min_log_prob) = row_scale_min(base);
        let q = &base[4..4 + n_vocab];

        let nll = max_logit + log_sum_exp - logits[tok];
        self.sum_nll += f64::from(nll);
        self.sum_nll2 += f64::from(nll * nll);
        let nll_base = -(scale * f32::from(q[tok]) + min_log_prob);
        self.sum_nll_base += f64::from(nll_base);
        self.sum_nll_base2 += f64::from(nll_base * nll_base);
        self.sum_nll_nll_base += f64::from(nll * nll_base);

        let max_plus = max_logit + log_sum_exp;
        let mut sum = 0f64;
        let mut imax_base = 0usize;
        let mut p_log_base_max = 0f32;
        for (i, (&qi, &l)) in q.iter().zip(logits).enumerate() {
            let p_log_base = scale * f32::from(qi) + min_log_prob;
            if i == 0 || p_log_base > p_log_base_max {
                p_log_base_max = p_log_base;
                imax_base = i;
            }
            if p_log_base > -16.0 {
                let p_base = p_log_base.exp();
                sum += f64::from(p_base * (p_log_base - l + max_plus));
            }
        }
        self.sum_kld += sum;
        self.sum_kld2 += sum * sum;
        self.count += 1;
        if imax == imax_base {
            self.n_same_top += 1;
        }
        let p_base = (-nll_base).exp();
        let p = (-nll).exp();
        let p_diff = p - p_base;
        self.sum_p_diff += f64::from(p_diff);
        let p_diff2 = f64::from(p_diff * p_diff);
        self.sum_p_diff2 += p_diff2;
        self.sum_p_diff4 += p_diff2 * p_diff2;
        self.max_p_diff = self.max_p_diff.max(p_diff.abs());
        self.kld_values.push(sum as f32);
        self.p_diff_values.push(p_diff);
    }

    /// The header of the per-chunk table, as llama.cpp prints it.
    pub const TABLE_HEADER: &'static str = "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p";

    /// The table line after chunk `chunk` (0-based) in llama.cpp's layout: running PPL,
    /// ln(PPL ratio), mean KLD, RMS Δp and same-top, each with its uncertainty.
    pub fn chunk_line(&self, chunk: usize) -> String {
        let mut s = format!("{:4}", chunk + 1);
        let log_ppl = mean_and_uncertainty(self.sum_nll, self.sum_nll2, self.count);
        let ppl = log_ppl.0.exp();
        let _ = write!(s, "    {:9.4} ± {:9.4}", ppl, ppl * log_ppl.1);
        let base = mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, self.count);
        let cov = covariance(
            self.sum_nll,
            self.sum_nll_base,
            self.sum_nll_nll_base,
            self.count,
        );
        let ratio_unc = (log_ppl.1 * log_ppl.1 + base.1 * base.1 - 2.0 * cov).sqrt();
        let _ = write!(s, "    {:10.5} ± {:10.5}", log_ppl.0 - base.0, ratio_unc);
        let kl = mean_and_uncertainty(self.sum_kld, self.sum_kld2, self.count);
        let _ = write!(s, "    {:10.5} ± {:10.5}", kl.0, kl.1);
        let mse = mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4, self.count);
        let rms = mse.0.sqrt();
        let _ = write!(
            s,
            "    {:6.3} ± {:6.3} %",
            100.0 * rms,
            100.0 * (0.5 / rms * mse.1)
        );
        let top = self.n_same_top as f64 / self.count as f64;
        let top_unc = (top * (1.0 - top) / (self.count as f64 - 1.0)).sqrt();
        let _ = write!(s, "    {:6.3} ± {:6.3} %", 100.0 * top, 100.0 * top_unc);
        s
    }

    /// The final statistics (sorting copies of the per-token values), or `None` for no
    /// tokens.
    pub fn report(&self) -> Option<KlReport> {
        if self.count == 0 {
            return None;
        }
        let mut kld = self.kld_values.clone();
        let mut pd = self.p_diff_values.clone();
        kld.sort_by(f32::total_cmp);
        pd.sort_by(f32::total_cmp);
        let n = self.count;
        let log_ppl = mean_and_uncertainty(self.sum_nll, self.sum_nll2, n);
        let log_ppl_base = mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, n);
        let cov = covariance(self.sum_nll, self.sum_nll_base, self.sum_nll_nll_base, n);
        let ppl = log_ppl.0.exp();
        let ppl_base = log_ppl_base.0.exp();
        let (ppl_unc, ppl_base_unc) = (ppl * log_ppl.1, ppl_base * log_ppl_base.1);
        let ln_ratio = log_ppl.0 - log_ppl_base.0;
        let ln_ratio_unc =
            (log_ppl.1 * log_ppl.1 + log_ppl_base.1 * log_ppl_base.1 - 2.0 * cov).sqrt();
        let ratio = ln_ratio.exp();
        let ppl_cov = ppl * ppl_base * cov;
        let kl = mean_and_uncertainty(self.sum_kld, self.sum_kld2, n);
        let p_diff = mean_and_uncertainty(self.sum_p_diff, self.sum_p_diff2, n);
        let mse = mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4, n);
        let rms = mse.0.sqrt();
        let same_top = n as f64;
        let same_top = self.n_same_top as f64 / same_top;
        let pct = |v: &[f32], fr: &[f32]| fr.iter().map(|&f| percentile(v, f)).collect();
        Some(KlReport {
            count: n,
            ppl: (ppl, ppl_unc),
            ppl_base: (ppl_base, ppl_base_unc),
            ln_ppl_cor: cov / (log_ppl.1 * log_ppl_base.1),
            ln_ppl_ratio: (ln_ratio, ln_ratio_unc),
            ppl_ratio: (ratio, ratio * ln_ratio_unc),
            ppl_diff: (
                ppl - ppl_base,
                (ppl_unc * ppl_unc + ppl_base_unc * ppl_base_unc - 2.0 * ppl_cov).sqrt(),
            ),
            kld: kl,
            kld_max: kld[n - 1],
            kld_percentiles: pct(&kld, &KLD_FRACTIONS),
            kld_median: median(&kld),
            kld_min: kld[0],
            p_diff,
            p_diff_max: pd[n - 1],
            p_diff_percentiles: pct(&pd, &P_DIFF_FRACTIONS),
            p_diff_median: median(&pd),
            p_diff_min: pd[0],
            p_diff_rms: (rms, 0.5 / rms * mse.1),
            same_top: (
                same_top,
                (same_top * (1.0 - same_top) / (n as f64 - 1.0)).sqrt(),
            ),
        })
    }
}

/// The KLD percentiles llama.cpp prints besides max, median and min.
pub const KLD_FRACTIONS: [f32; 8] = [0.999, 0.990, 0.950, 0.900, 0.100, 0.050, 0.010, 0.001];

/// The Δp percentiles llama.cpp prints besides max, median and min.
pub const P_DIFF_FRACTIONS: [f32; 10] = [
    0.999, 0.990, 0.950, 0.900, 0.750, 0.250, 0.100, 0.050, 0.010, 0.001,
];

/// The statistics `llama-perplexity --kl-divergence` prints at the end; pairs are
/// (value, uncertainty). Displayed in llama.cpp's layout.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct KlReport {
    /// Tokens scored.
    pub count: usize,
    /// Mean PPL(Q): our perplexity (from f32 token nlls).
    pub ppl: (f64, f64),
    /// Mean PPL(base): the base file's perplexity (from its compressed log-probs).
    pub ppl_base: (f64, f64),
    /// Cor(ln(PPL(Q)), ln(PPL(base))) as a fraction.
    pub ln_ppl_cor: f64,
    /// Mean ln(PPL(Q)/PPL(base)).
    pub ln_ppl_ratio: (f64, f64),
    /// Mean PPL(Q)/PPL(base).
    pub ppl_ratio: (f64, f64),
    /// Mean PPL(Q)−PPL(base).
    pub ppl_diff: (f64, f64),
    /// Mean KLD.
    pub kld: (f64, f64),
    /// Maximum KLD.
    pub kld_max: f32,
    /// KLD at [`KLD_FRACTIONS`].
    pub kld_percentiles: Vec<f32>,
    /// Median KLD.
    pub kld_median: f32,
    /// Minimum KLD.
    pub kld_min: f32,
    /// Mean Δp (fraction, not %).
    pub p_diff: (f64, f64),
    /// Maximum Δp.
    pub p_diff_max: f32,
    /// Δp at [`P_DIFF_FRACTIONS`].
    pub p_diff_percentiles: Vec<f32>,
    /// Median Δp.
    pub p_diff_median: f32,
    /// Minimum Δp.
    pub p_diff_min: f32,
    /// RMS Δp.
    pub p_diff_rms: (f64, f64),
    /// Fraction of tokens whose most likely token is the same for us and the base.
    pub same_top: (f64, f64),
}

impl fmt::Display for KlReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "====== Perplexity statistics ======")?;
        let ppl_row = |f: &mut fmt::Formatter<'_>, label: &str, (v, e): (f64, f64)| {
            writeln!(f, "{label:<30}: {v:10.6} ± {e:10.6}")
        };
        ppl_row(f, "Mean PPL(Q)", self.ppl)?;
        ppl_row(f, "Mean PPL(base)", self.ppl_base)?;
        writeln!(
            f,
            "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%",
            100.0 * self.ln_ppl_cor
        )?;
        ppl_row(f, "Mean ln(PPL(Q)/PPL(base))", self.ln_ppl_ratio)?;
        ppl_row(f, "Mean PPL(Q)/PPL(base)", self.ppl_ratio)?;
        ppl_row(f, "Mean PPL(Q)-PPL(base)", self.ppl_diff)?;
        writeln!(f)?;
        writeln!(f, "====== KL divergence statistics ======")?;
        writeln!(f, "Mean    KLD: {:10.6} ± {:10.6}", self.kld.0, self.kld.1)?;
        writeln!(f, "Maximum KLD: {:10.6}", self.kld_max)?;
        let k = &self.kld_percentiles;
        let labels = ["99.9%", "99.0%", "95.0%", "90.0%"];
        for (l, v) in labels.iter().zip(&k[..4]) {
            writeln!(f, "{l}   KLD: {v:10.6}")?;
        }
        writeln!(f, "Median  KLD: {:10.6}", self.kld_median)?;
        let labels = ["10.0%", " 5.0%", " 1.0%", " 0.1%"];
        for (l, v) in labels.iter().zip(&k[4..]) {
            writeln!(f, "{l}   KLD: {v:10.6}")?;
        }
        writeln!(f, "Minimum KLD: {:10.6}", self.kld_min)?;
        writeln!(f)?;
        writeln!(f, "====== Token probability statistics ======")?;
        writeln!(
            f,
            "Mean    Δp: {:6.3} ± {:5.3} %",
            100.0 * self.p_diff.0,
            100.0 * self.p_diff.1
        )?;
        let pct = |v: f32| 100.0 * f64::from(v);
        writeln!(f, "Maximum Δp: {:6.3}%", pct(self.p_diff_max))?;
        let p = &self.p_diff_percentiles;
        for (l, v) in ["99.9%", "99.0%", "95.0%", "90.0%", "75.0%"]
            .iter()
            .zip(&p[..5])
        {
            writeln!(f, "{l}   Δp: {:6.3}%", pct(*v))?;
        }
        writeln!(f, "Median  Δp: {:6.3}%", pct(self.p_diff_median))?;
        for (l, v) in ["25.0%", "10.0%", " 5.0%", " 1.0%", " 0.1%"]
            .iter()
            .zip(&p[5..])
        {
            writeln!(f, "{l}   Δp: {:6.3}%", pct(*v))?;
        }
        writeln!(f, "Minimum Δp: {:6.3}%", pct(self.p_diff_min))?;
        writeln!(
            f,
            "RMS Δp    : {:6.3} ± {:5.3} %",
            100.0 * self.p_diff_rms.0,
            100.0 * self.p_diff_rms.1
        )?;
        writeln!(
            f,
            "Same top p: {:6.3} ± {:5.3} %",
            100.0 * self.same_top.0,
            100.0 * self.same_top.1
        )
    }
}

/// A KL-divergence run in progress: the base file, the chunk being scored and the sums.
#[derive(Debug)]
pub struct KlRun {
    /// The base file.
    pub base: KlBase,
    /// The sums so far.
    pub stats: KlStats,
    chunk: ChunkLogProbs,
}

impl KlRun {
    /// A run against `base` with empty sums.
    pub fn new(base: KlBase) -> KlRun {
        KlRun {
            base,
            stats: KlStats::default(),
            chunk: ChunkLogProbs::default(),
        }
    }

    /// Loads chunk `c`'s base log-probs; call before its rows.
    pub fn begin_chunk(&mut self, c: usize) -> Result<()> {
        self.base.read_chunk(c, &mut self.chunk)
    }

    /// Scores row `r` of the current chunk: our `logits` there and the next token `tok`.
    pub fn row(&mut self, r: usize, logits: &[f32], tok: usize) {
        self.stats.add(logits, self.chunk.row(r), tok);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(3.5), 4);
        assert_eq!(nearest_int(65535.0), 65535);
        assert_eq!(nearest_int(0.49), 0);
    }

    #[test]
    fn row_layout_matches_llama_cpp() {
        assert_eq!(row_len(49152), 49156);
        assert_eq!(row_len(5), 10);
        assert_eq!(rows_per_chunk(512), 255);
        assert_eq!(rows_per_chunk(4), 1);
    }

    #[test]
    fn compressed_row_recovers_the_log_probs() {
        let logits = [1.0f32, -2.0, 0.5, 3.0, -30.0];
        let mut row = vec![0u16; row_len(5)];
        let nll = compress_row(&logits, 3, &mut row);
        let (scale, min) = row_scale_min(&row);
        let lse = logits.iter().map(|&l| f64::from(l).exp()).sum::<f64>().ln();
        assert!((nll - (lse - 3.0)).abs() < 1e-5);
        for (i, &l) in logits.iter().enumerate().take(4) {
            let back = f64::from(scale * f32::from(row[4 + i]) + min);
            assert!((back - (f64::from(l) - lse)).abs() < 2e-4, "{i}: {back}");
        }
        // Clamped at max - 16.
        assert_eq!(row[4 + 4], 0);
        assert_eq!(row[9], 0, "padding");
    }

    #[test]
    fn percentiles_interpolate_like_llama_cpp() {
        let v = [0.0f32, 1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.5), 2.0);
        assert_eq!(percentile(&v, 0.1), 0.4);
        assert_eq!(percentile(&v, 1.0), 4.0);
        assert_eq!(median(&v), 2.0);
        assert_eq!(median(&v[..4]), 1.5);
    }
}
