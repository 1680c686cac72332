//! Perplexity exactly as `llama-perplexity` computes it (tools/perplexity/perplexity.cpp).

use sha2::{Digest, Sha256};

use crate::batch::Batch;
use crate::error::{HarnessError, Result};
use crate::executor::Executor;
use crate::kl::{KlRun, KlStats};
use crate::model::Model;
use crate::placement::KvCache;

/// Settings of a perplexity run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PplSettings {
    /// Tokens per chunk (`-c`).
    pub n_ctx: usize,
    /// Tokens per decode call (`-b`); chunks are processed `max(1, n_batch / n_ctx)` at a
    /// time as separate sequences.
    pub n_batch: usize,
    /// Process at most this many chunks (`--chunks`), all if `None`.
    pub max_chunks: Option<usize>,
}

impl PplSettings {
    /// The settings a run accepts: an even `n_ctx` of at least 4, a batch that divides
    /// `n_ctx` or is a multiple of it, and at least one chunk if the chunks are limited.
    pub fn check(&self) -> Result<()> {
        let n_ctx = self.n_ctx;
        if n_ctx < 4 || n_ctx % 2 != 0 {
            return Err(HarnessError::Usage(format!(
                "--ctx {n_ctx}: must be even and at least 4"
            )));
        }
        if self.n_batch == 0 || (self.n_batch < n_ctx && n_ctx % self.n_batch != 0) {
            return Err(HarnessError::Usage(format!(
                "--batch {}: must divide --ctx {n_ctx} or be a multiple of it",
                self.n_batch
            )));
        }
        if self.max_chunks == Some(0) {
            return Err(HarnessError::Usage(
                "--chunks 0: at least one chunk is needed for a perplexity".into(),
            ));
        }
        Ok(())
    }
}

/// Result of a perplexity run.
#[derive(Clone, Debug, PartialEq)]
pub struct PplResult {
    /// Final perplexity `exp(mean nll)`.
    pub ppl: f64,
    /// Its uncertainty, as llama-perplexity prints it.
    pub ppl_stderr: f64,
    /// Sum of negative log-likelihoods.
    pub nll_sum: f64,
    /// Tokens scored.
    pub n_scored: usize,
    /// The running perplexity after each chunk.
    pub chunks: Vec<f64>,
    /// SHA-256 over the f32 bits (little endian) of every scored logit row, in order.
    pub logits_sha256: String,
}

/// `log_softmax` of perplexity.cpp: the max in f32, the sum of `expf` in f64 in vocab
/// order, and `logit[tok] - max` in f32 before subtracting `log(sum)` in f64. Returns
/// the negative log-likelihood of `tok`.
pub fn token_nll(logits: &[f32], tok: usize) -> f64 {
    let max = logits.iter().copied().fold(logits[0], f32::max);
    let mut sum = 0.0f64;
    for &l in logits {
        sum += f64::from((l - max).exp());
    }
    -(f64::from(logits[tok] - max) - sum.ln())
}

/// Appends the logits rows of `batch` to the vectors of their sequences, in batch order.
fn split_by_sequence(batch: &Batch, logits: &[f32], n_vocab: usize, seq_logits: &mut [Vec<f32>]) {
    let mut row = 0;
    for (k, &out) in batch.output.iter().enumerate() {
        if out {
            let seq = batch.seq[k] as usize;
            seq_logits[seq].extend_from_slice(&logits[row * n_vocab..(row + 1) * n_vocab]);
            row += 1;
        }
    }
}

/// Called after each chunk with its index, the number of chunks, the running perplexity
/// and, in a KL-divergence run, the KL sums so far.
type OnChunk<'f> = dyn FnMut(usize, usize, f64, Option<&KlStats>) + 'f;

/// The running sums of a perplexity run, in token order.
struct Scorer<'a> {
    tokens: &'a [u32],
    n_ctx: usize,
    n_vocab: usize,
    n_chunk: usize,
    hasher: Sha256,
    nll: f64,
    nll2: f64,
    count: usize,
    chunks: Vec<f64>,
    /// The KL-divergence run against a base file, if one was asked for.
    kl: Option<&'a mut KlRun>,
}

impl Scorer<'_> {
    /// Scores the single pass of a group of `seqs` chunks starting at chunk `i`.
    fn pass(
        &mut self,
        i: usize,
        seqs: usize,
        batch: &Batch,
        logits: &[f32],
        on_chunk: &mut OnChunk<'_>,
    ) -> Result<()> {
        let mut seq_logits = vec![Vec::new(); seqs];
        split_by_sequence(batch, logits, self.n_vocab, &mut seq_logits);
        self.group(i, &seq_logits, on_chunk)
    }

    /// Scores a group of chunks starting at chunk `i` (one logits vector per chunk, rows
    /// for positions `n_ctx/2 .. n_ctx-1`).
    fn group(
        &mut self,
        i: usize,
        seq_logits: &[Vec<f32>],
        on_chunk: &mut OnChunk<'_>,
    ) -> Result<()> {
        let (tokens, n_ctx, n_vocab, n_chunk) =
            (self.tokens, self.n_ctx, self.n_vocab, self.n_chunk);
        let first = n_ctx / 2;
        for (seq, logits) in seq_logits.iter().enumerate() {
            let start = (i + seq) * n_ctx;
            if let Some(kl) = self.kl.as_deref_mut() {
                kl.begin_chunk(i + seq)?;
            }
            // Rows are positions first..n_ctx-1; the last is computed but not scored.
            for (r, pos) in (first..n_ctx - 1).enumerate() {
                let l = &logits[r * n_vocab..(r + 1) * n_vocab];
                for x in l {
                    self.hasher.update(x.to_bits().to_le_bytes());
                }
                let tok = tokens[start + pos + 1] as usize;
                let v = token_nll(l, tok);
                self.nll += v;
                self.nll2 += v * v;
                self.count += 1;
                if let Some(kl) = self.kl.as_deref_mut() {
                    kl.row(r, l, tok);
                }
            }
            let running = (self.nll / self.count as f64).exp();
            self.chunks.push(running);
            on_chunk(
                i + seq,
                n_chunk,
                running,
                self.kl.as_deref().map(|kl| &kl.stats),
            );
        }
        Ok(())
    }
}

/// Runs perplexity over `tokens` and reports progress per chunk to `on_chunk(i, n, ppl)`.
pub fn perplexity(
    model: &Model,
    exec: &mut dyn Executor,
    kv: &mut KvCache,
    tokens: &[u32],
    bos: Option<u32>,
    s: PplSettings,
    mut on_chunk: impl FnMut(usize, usize, f64),
) -> Result<PplResult> {
    run(model, exec, kv, tokens, bos, s, None, &mut |i, n, p, _| {
        on_chunk(i, n, p)
    })
}

/// Perplexity and, as `llama-perplexity --kl-divergence` computes them, the KL divergence
/// and token-probability statistics of our logits against the base file of `kl` (written
/// by `llama-perplexity --kl-divergence-base`). The base file must have been made with
/// the same `n_ctx`, vocabulary and tokens (checked first; the error names the first
/// differing token); the run covers the file's chunks, or fewer if `tokens` or
/// `s.max_chunks` hold fewer. `on_chunk(i, n, ppl, stats)` sees the KL sums after each
/// chunk; the final statistics are `kl.stats.report()`.
#[allow(clippy::too_many_arguments)] // perplexity's arguments and the base file
pub fn perplexity_kl(
    model: &Model,
    exec: &mut dyn Executor,
    kv: &mut KvCache,
    tokens: &[u32],
    bos: Option<u32>,
    s: PplSettings,
    kl: &mut KlRun,
    mut on_chunk: impl FnMut(usize, usize, f64, &KlStats),
) -> Result<PplResult> {
    let n_chunk = kl.base.check_run(s.n_ctx, model.hp.n_vocab, tokens)?;
    let s = PplSettings {
        max_chunks: Some(s.max_chunks.unwrap_or(usize::MAX).min(n_chunk)),
        ..s
    };
    run(
        model,
        exec,
        kv,
        tokens,
        bos,
        s,
        Some(kl),
        &mut |i, n, p, st| {
            if let Some(st) = st {
                on_chunk(i, n, p, st)
            }
        },
    )
}

/// The perplexity loop of [`perplexity`] and [`perplexity_kl`].
#[allow(clippy::too_many_arguments)]
fn run(
    model: &Model,
    exec: &mut dyn Executor,
    kv: &mut KvCache,
    tokens: &[u32],
    bos: Option<u32>,
    s: PplSettings,
    kl: Option<&mut KlRun>,
    on_chunk: &mut OnChunk<'_>,
) -> Result<PplResult> {
    s.check()?;
    let n_ctx = s.n_ctx;
    if tokens.len() < 2 * n_ctx {
        return Err(HarnessError::Usage(format!(
            "the text has {} tokens; perplexity needs at least 2 * ctx = {}",
            tokens.len(),
            2 * n_ctx
        )));
    }
    let mut n_chunk = tokens.len() / n_ctx;
    if let Some(m) = s.max_chunks {
        n_chunk = n_chunk.min(m);
    }
    let n_vocab = model.hp.n_vocab;
    let first = n_ctx / 2;
    let n_seq = (s.n_batch / n_ctx).max(1);
    let n_batch = s.n_batch.min(n_ctx);
    let num_batches = n_ctx.div_ceil(n_batch);
    let mut score = Scorer {
        tokens,
        n_ctx,
        n_vocab,
        n_chunk,
        hasher: Sha256::new(),
        nll: 0.0,
        nll2: 0.0,
        count: 0,
        chunks: Vec::with_capacity(n_chunk),
        kl,
    };
    let make_batch = |i: usize, seqs: usize, j: usize| {
        let mut batch = Batch::default();
        for seq in 0..seqs {
            let start = (i + seq) * n_ctx + j * n_batch;
            for k in 0..n_batch {
                let pos = j * n_batch + k;
                let mut tok = tokens[start + k];
                if pos == 0 {
                    if let Some(b) = bos {
                        tok = b;
                    }
                }
                batch.push(tok, pos as i32, seq as u32, pos >= first);
            }
        }
        batch
    };
    // With one batch per group of chunks, the groups are independent passes: keep up to
    // `max_in_flight` of them queued so that a pipeline over several devices overlaps
    // them (llama.cpp overlaps micro-batches the same way). Results are scored in order,
    // so the numbers do not depend on the depth.
    let depth = if num_batches == 1 {
        exec.max_in_flight().max(1)
    } else {
        1
    };
    let mut pending: std::collections::VecDeque<(u64, usize, usize, Batch)> =
        std::collections::VecDeque::new();
    let mut i = 0;
    while i < n_chunk {
        let seqs = n_seq.min(n_chunk - i);
        kv.clear();
        if num_batches == 1 {
            let batch = make_batch(i, seqs, 0);
            let ticket = exec.submit(model, kv, &batch)?;
            pending.push_back((ticket, i, seqs, batch));
            while pending.len() >= depth {
                let (t, i0, seqs0, b) = pending.pop_front().expect("non-empty");
                let logits = exec.collect(t)?;
                score.pass(i0, seqs0, &b, &logits, on_chunk)?;
            }
        } else {
            // Logits of each sequence, concatenated in batch order as perplexity.cpp does.
            let mut seq_logits: Vec<Vec<f32>> = vec![Vec::new(); seqs];
            for j in 0..num_batches {
                let mut batch = make_batch(i, seqs, j);
                if batch.n_outputs() == 0 {
                    // Nothing scored in this batch; it only fills the cache.
                    batch.output[0] = true;
                    exec.forward(model, kv, &batch)?;
                    continue;
                }
                let logits = exec.forward(model, kv, &batch)?;
                split_by_sequence(&batch, &logits, n_vocab, &mut seq_logits);
            }
            score.group(i, &seq_logits, on_chunk)?;
        }
        i += seqs;
    }
    while let Some((t, i0, seqs0, b)) = pending.pop_front() {
        let logits = exec.collect(t)?;
        score.pass(i0, seqs0, &b, &logits, on_chunk)?;
    }
    let Scorer {
        hasher,
        nll,
        nll2,
        count,
        chunks,
        ..
    } = score;
    let mean = nll / count as f64;
    let ppl = mean.exp();
    let var = nll2 / count as f64 - mean * mean;
    let ppl_stderr = if var > 0.0 && count > 1 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    Ok(PplResult {
        ppl,
        ppl_stderr,
        nll_sum: nll,
        n_scored: count,
        chunks,
        logits_sha256: hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nll_of_uniform_logits_is_log_vocab() {
        let l = vec![0.5f32; 1000];
        assert!((token_nll(&l, 3) - (1000f64).ln()).abs() < 1e-9);
    }

    #[test]
    fn nll_prefers_the_largest_logit() {
        let l = [0.0f32, 5.0, 1.0];
        assert!(token_nll(&l, 1) < token_nll(&l, 2));
        assert!(token_nll(&l, 1) > 0.0);
    }
}
