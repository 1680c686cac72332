//! What one warp memory request costs: the 32-byte sectors and 128-byte lines a global
//! request touches (coalescing), and the shared-memory wavefronts of a request (bank
//! conflicts).

/// Bytes of a sector, the unit of L1/L2/DRAM transfers.
pub const SECTOR_BYTES: u64 = 32;
/// Bytes of a cache line (four sectors).
pub const LINE_BYTES: u64 = 128;
/// Shared-memory banks.
pub const BANKS: u64 = 32;
/// Bytes of a bank word.
pub const BANK_WORD_BYTES: u64 = 4;

/// The distinct sectors of a global request (sorted, each once) written into `out`,
/// and the number of distinct lines among them. `addrs` holds the address of each
/// active lane; each lane accesses `width` bytes from its address.
pub fn sectors_and_lines(addrs: &[u64], width: u64, out: &mut Vec<u64>) -> u64 {
    out.clear();
    for &a in addrs {
        let first = a / SECTOR_BYTES;
        let last = (a + width.max(1) - 1) / SECTOR_BYTES;
        for s in first..=last {
            out.push(s);
        }
    }
    out.sort_unstable();
    out.dedup();
    let per_line = LINE_BYTES / SECTOR_BYTES;
    let mut lines = 0;
    let mut prev = None;
    for &s in out.iter() {
        let l = s / per_line;
        if prev != Some(l) {
            lines += 1;
            prev = Some(l);
        }
    }
    lines
}

/// Lanes served together in one phase for an access of `width` bytes per lane: 32 up
/// to 4 bytes, 16 for 8, 8 for 16, 4 for 32.
pub fn lanes_per_phase(width: u64) -> u32 {
    match width {
        0..=4 => 32,
        5..=8 => 16,
        9..=16 => 8,
        _ => 4,
    }
}

/// The wavefronts of one shared-memory request: for each phase (see
/// [`lanes_per_phase`]), the most distinct 4-byte words that fall in one bank (lanes
/// reading the same word share it: broadcast); summed over the phases with an active
/// lane. `lanes` holds `(lane, byte offset)` of each active lane.
pub fn shared_wavefronts(lanes: &[(u32, u64)], width: u64) -> u64 {
    let per_phase = lanes_per_phase(width);
    let phases = 32 / per_phase;
    let mut total = 0;
    let mut words: Vec<u64> = Vec::with_capacity(64);
    for phase in 0..phases {
        words.clear();
        for &(lane, at) in lanes {
            if lane / per_phase != phase {
                continue;
            }
            let first = at / BANK_WORD_BYTES;
            let last = (at + width.max(1) - 1) / BANK_WORD_BYTES;
            words.extend(first..=last);
        }
        if words.is_empty() {
            continue;
        }
        // Sort by (bank, word): distinct words of one bank are then adjacent.
        words.sort_unstable_by_key(|&w| (w % BANKS, w));
        words.dedup();
        let mut worst = 0;
        let mut run = 0;
        let mut bank = u64::MAX;
        for &w in &words {
            if w % BANKS == bank {
                run += 1;
            } else {
                bank = w % BANKS;
                run = 1;
            }
            worst = worst.max(run);
        }
        total += worst;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn lanes(f: impl Fn(u64) -> u64) -> Vec<(u32, u64)> {
        (0..32).map(|l| (l as u32, f(l))).collect()
    }

    #[rstest]
    #[case::conflict_free(4, 1, 1)]
    #[case::broadcast(4, 0, 1)]
    #[case::two_way(4, 2, 2)]
    #[case::thirty_two_way(4, 32, 32)]
    #[case::f64_conflict_free(8, 2, 2)]
    #[case::f128_conflict_free(16, 4, 4)]
    fn wavefronts_by_stride(#[case] width: u64, #[case] stride_words: u64, #[case] want: u64) {
        let l = lanes(|lane| lane * stride_words * 4);
        assert_eq!(shared_wavefronts(&l, width), want);
    }

    #[test]
    fn eight_byte_phases_count_separately() {
        // Lanes 0..16 all hit word 0/1 (broadcast): 1 wavefront; lanes 16..32 at a
        // stride of 32 words: 16 distinct words in bank 0 and 16 in bank 1.
        let l = lanes(|lane| if lane < 16 { 0 } else { (lane - 16) * 128 });
        assert_eq!(shared_wavefronts(&l, 8), 1 + 16);
    }

    #[test]
    fn inactive_lanes_do_not_count() {
        assert_eq!(shared_wavefronts(&[], 4), 0);
        assert_eq!(shared_wavefronts(&[(3, 64)], 4), 1);
    }

    #[rstest]
    #[case::coalesced_f32(4, 4, 4, 1)]
    #[case::coalesced_f32x4(16, 16, 16, 4)]
    #[case::stride_32_words(4, 128, 32, 32)]
    #[case::stride_8_words(4, 32, 32, 8)]
    #[case::same_address(4, 0, 1, 1)]
    fn sectors_by_stride(
        #[case] width: u64,
        #[case] stride: u64,
        #[case] sectors: usize,
        #[case] lines: u64,
    ) {
        let addrs: Vec<u64> = (0..32).map(|l| 0x1000 + l * stride).collect();
        let mut out = Vec::new();
        assert_eq!(sectors_and_lines(&addrs, width, &mut out), lines);
        assert_eq!(out.len(), sectors);
    }

    #[test]
    fn misaligned_access_spans_two_sectors() {
        let mut out = Vec::new();
        assert_eq!(sectors_and_lines(&[30], 4, &mut out), 1);
        assert_eq!(out, vec![0, 1]);
    }
}
