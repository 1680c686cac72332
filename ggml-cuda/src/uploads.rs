//! Small host uploads batched: the `set_tensor_async` calls made before a compute (token
//! ids, positions, masks) are gathered in a pinned area and leave together as one
//! host-to-device copy, scattered to their tensors by one kernel (`upload_scatter`), or
//! by the copy alone when the batch is a single piece. The batch is flushed before the
//! next operation on the stream, so stream order is as if each upload had been enqueued
//! where it was made (only waits on events may be overtaken, which can only delay it).
//!
//! The pinned areas form a ring; an area is reused once the stream has passed its copy,
//! which the backend learns from its own synchronisations and event waits.

/// Largest upload that is batched; larger ones go through the staging chunks.
pub(crate) const PIECE_MAX: usize = 64 << 10;
/// Pieces per batch.
pub(crate) const MAX_PIECES: usize = 64;
/// Room kept at the end of an area for the descriptor table: `{dst, offset, len}` per
/// piece, written after the pieces when the batch is flushed.
pub(crate) const TABLE: usize = MAX_PIECES * 24;
/// Bytes of one pinned area (and of the device staging buffer).
pub(crate) const AREA: usize = 256 << 10;
/// Pinned areas in the ring.
pub(crate) const AREAS: usize = 4;
/// Bytes of a piece one scatter block copies.
pub(crate) const SCATTER_CHUNK: usize = 16384;

/// One pending upload: `len` bytes at `off` in the area, for device address `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub dst: u64,
    pub off: usize,
    pub len: usize,
}

/// A pinned area and the stream position of its last copy.
pub(crate) struct Area {
    pub ptr: *mut u8,
    /// The backend's stream sequence number of the copy that reads it (0: none).
    pub seq: u64,
}

/// The scatter launch of a flushed batch: `n` pieces in the device buffer `buf`,
/// described at `desc`, the longest needing `chunks` blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Scatter {
    pub buf: u64,
    pub desc: u64,
    pub n: u32,
    pub chunks: u32,
}

impl Scatter {
    /// The words a CUDA graph key holds for a scatter folded into the graph (the
    /// descriptors are data in `buf`, read when the graph runs).
    pub(crate) fn key_words(&self) -> [u64; 4] {
        [self.buf, self.desc, self.n as u64, self.chunks as u64]
    }
}

/// The batch being gathered and the ring of areas.
#[derive(Default)]
pub(crate) struct Uploads {
    pub areas: Vec<Area>,
    /// The area the batch is gathered in (meaningful while `pieces` is not empty).
    pub current: usize,
    /// Bytes of piece data in the current area (from its start).
    pub used: usize,
    pub pieces: Vec<Piece>,
    /// Device staging buffer of [`AREA`] bytes (0 until first needed).
    pub dev: u64,
}

/// Offset of the next piece: 16-byte aligned, so that aligned tensors copy in words.
fn align16(x: usize) -> usize {
    (x + 15) & !15
}

impl Uploads {
    /// Whether a piece of `len` bytes for `dst` joins the batch without a flush first:
    /// there is room, and it overlaps no pending piece (whose order it must keep).
    pub(crate) fn fits(&self, dst: u64, len: usize) -> bool {
        let end = dst + len as u64;
        self.pieces.len() < MAX_PIECES
            && align16(self.used) + len + TABLE <= AREA
            && self
                .pieces
                .iter()
                .all(|p| end <= p.dst || p.dst + p.len as u64 <= dst)
    }

    /// Adds `data` for `dst` to the batch (the caller checked [`Uploads::fits`] and, for
    /// the batch's first piece, chose a free area).
    pub(crate) fn add(&mut self, dst: u64, data: &[u8]) {
        let off = align16(self.used);
        let area = &self.areas[self.current];
        // SAFETY: `off + data.len() <= AREA` (checked by `fits`), the area is AREA bytes
        // of pinned memory, and no queued copy reads it (chosen free by the caller).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), area.ptr.add(off), data.len()) };
        self.pieces.push(Piece {
            dst,
            off,
            len: data.len(),
        });
        self.used = off + data.len();
    }

    /// Offset of the descriptor table in the area (after the pieces).
    fn table_at(&self) -> usize {
        align16(self.used)
    }

    /// An area the stream has finished reading (`completed` is the backend's last
    /// sequence number known complete), starting after the last one used.
    pub(crate) fn free_area(&self, completed: u64) -> Option<usize> {
        let n = self.areas.len();
        (1..=n)
            .map(|k| (self.current + k) % n)
            .find(|&i| self.areas[i].seq <= completed)
    }

    /// Writes the descriptor table into the current area after the pieces; the bytes to
    /// copy.
    pub(crate) fn write_table(&mut self) -> usize {
        let area = self.areas[self.current].ptr;
        let at = self.table_at();
        for (i, p) in self.pieces.iter().enumerate() {
            let d = [p.dst, p.off as u64, p.len as u64];
            for (j, w) in d.iter().enumerate() {
                // SAFETY: `fits` kept TABLE = 24 * MAX_PIECES bytes free after the
                // pieces; the area is not read by a queued copy (see `add`).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        w.to_le_bytes().as_ptr(),
                        area.add(at + 24 * i + 8 * j),
                        8,
                    )
                };
            }
        }
        at + 24 * self.pieces.len()
    }

    /// The scatter of the pending pieces from the device buffer.
    pub(crate) fn scatter(&self) -> Scatter {
        let longest = self.pieces.iter().map(|p| p.len).max().unwrap_or(0);
        Scatter {
            buf: self.dev,
            desc: self.dev + self.table_at() as u64,
            n: self.pieces.len() as u32,
            chunks: longest.div_ceil(SCATTER_CHUNK).max(1) as u32,
        }
    }

    /// Empties the batch after its copy was enqueued at sequence number `seq`.
    pub(crate) fn sent(&mut self, seq: u64) {
        self.areas[self.current].seq = seq;
        self.pieces.clear();
        self.used = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_pack_aligned_and_keep_their_order() {
        let mut mem = vec![0u8; AREA * 2];
        let mut u = Uploads {
            areas: vec![
                Area {
                    ptr: mem.as_mut_ptr(),
                    seq: 0,
                },
                Area {
                    // SAFETY: within `mem`.
                    ptr: unsafe { mem.as_mut_ptr().add(AREA) },
                    seq: 5,
                },
            ],
            ..Default::default()
        };
        assert!(u.fits(0x1000, 4));
        u.add(0x1000, &[1, 2, 3, 4]);
        assert!(u.fits(0x2000, 3));
        u.add(0x2000, &[9, 9, 9]);
        assert_eq!(
            u.pieces,
            [
                Piece {
                    dst: 0x1000,
                    off: 0,
                    len: 4
                },
                Piece {
                    dst: 0x2000,
                    off: 16,
                    len: 3
                }
            ]
        );
        // Overlapping a pending piece needs a flush first; so does a full area.
        assert!(!u.fits(0x1002, 4));
        assert!(u.fits(0x1004, 4));
        assert!(!u.fits(0x9000, AREA));
        // The table goes after the pieces: 32 + 2 * 24 bytes to copy.
        let bytes = u.write_table();
        assert_eq!(bytes, 32 + 48);
        assert_eq!(&mem[32 + 24..32 + 32], &0x2000u64.to_le_bytes());
        assert_eq!(&mem[32 + 32..32 + 40], &16u64.to_le_bytes());
        assert_eq!(&mem[..4], &[1, 2, 3, 4]);
        let s = u.scatter();
        assert_eq!((s.desc - s.buf, s.n, s.chunks), (32, 2, 1));
        u.sent(7);
        assert!(u.pieces.is_empty());
        // Area 1's copy (5) is complete at 6, area 0's (7) is not.
        assert_eq!(u.free_area(6), Some(1));
        assert_eq!(u.free_area(4), None);
    }
}
