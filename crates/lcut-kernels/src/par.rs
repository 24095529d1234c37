//! Splitting a product's output rows across rayon's threads: one parallel
//! region per call, one contiguous part per thread.

use std::ops::Range;

use rayon::prelude::*;

/// The parts of `items` output rows: one per thread, each a multiple of
/// `align` rows (but the last), none empty. One part when `parallel` is
/// false or a single thread is available.
pub fn parts(items: usize, align: usize, parallel: bool) -> Vec<Range<usize>> {
    let threads = if parallel {
        rayon::current_num_threads().max(1)
    } else {
        1
    };
    let align = align.max(1);
    let per = items.div_ceil(threads).div_ceil(align) * align;
    let per = per.max(align);
    (0..items)
        .step_by(per.max(1))
        .map(|s| s..(s + per).min(items))
        .collect()
}

/// Run `f(rows, out_part)` over the parts of `items` rows, where each row
/// owns `width` consecutive elements of `out`, in one parallel region (on
/// the calling thread alone when there is one part).
pub fn for_each_part<T: Send>(
    out: &mut [T],
    width: usize,
    items: usize,
    align: usize,
    parallel: bool,
    f: impl Fn(Range<usize>, &mut [T]) + Sync,
) {
    let parts = parts(items, align, parallel);
    if parts.len() <= 1 {
        f(0..items, out);
        return;
    }
    let per = parts[0].len();
    out.par_chunks_mut(per * width)
        .zip(parts)
        .for_each(|(o, range)| f(range, o));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_every_row_once_in_aligned_pieces() {
        for items in [1, 7, 64, 100, 1537] {
            for align in [1, 4, 16] {
                let p = parts(items, align, true);
                assert_eq!(p.first().map(|r| r.start), Some(0));
                assert_eq!(p.last().map(|r| r.end), Some(items));
                for w in p.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                    assert_eq!(w[0].len() % align, 0);
                }
                assert!(p.iter().all(|r| !r.is_empty()));
            }
        }
        assert_eq!(parts(100, 4, false), vec![0..100]);
    }

    #[test]
    fn every_output_row_is_written_by_its_part() {
        let mut out = vec![0usize; 3 * 101];
        for_each_part(&mut out, 3, 101, 8, true, |rows, o| {
            for (i, r) in rows.enumerate() {
                o[3 * i..3 * i + 3].fill(r + 1);
            }
        });
        for (r, chunk) in out.chunks(3).enumerate() {
            assert!(chunk.iter().all(|&v| v == r + 1));
        }
    }
}
