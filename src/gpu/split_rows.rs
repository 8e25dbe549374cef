//! The arithmetic of the row split (`-sm row`): a matrix's rows divided over the GPUs in
//! given proportions, each device's range starting at a multiple of a granularity, and the
//! byte pieces of a host transfer that fall into each device's range. No device calls here.

/// Proportions (one per GPU) scaled to sum to 1. Negative or non-finite weights count as 0.
/// All zero (or none given): `fallback` (each device's free memory) is used instead, and if
/// that is all zero too, every device gets the same share.
pub fn normalise(weights: &[f32], fallback: &[f32]) -> Vec<f32> {
    let clean = |w: &[f32]| -> Vec<f64> {
        w.iter()
            .map(|&x| {
                if x.is_finite() && x > 0.0 {
                    x as f64
                } else {
                    0.0
                }
            })
            .collect()
    };
    let n = fallback.len().max(weights.len());
    let mut w = clean(weights);
    w.resize(n, 0.0);
    if w.iter().sum::<f64>() <= 0.0 {
        w = clean(fallback);
        w.resize(n, 0.0);
    }
    let sum: f64 = w.iter().sum();
    if sum <= 0.0 {
        return vec![1.0 / n.max(1) as f32; n];
    }
    w.iter().map(|&x| (x / sum) as f32).collect()
}

/// Device `i` gets rows `[lo_i, hi_i)`: the ranges follow one another from 0 to `rows`, the
/// boundary after device `i` is `rows` times the proportions up to `i`, rounded down to a
/// multiple of `granularity` (the last device takes what is left; a device whose share and
/// every later share are 0 ends at `rows`, so no rows go to a device given nothing). Ranges may
/// be empty.
pub fn row_ranges(rows: usize, fractions: &[f32], granularity: usize) -> Vec<(usize, usize)> {
    let g = granularity.max(1);
    let n = fractions.len();
    let mut out = Vec::with_capacity(n);
    let mut lo = 0usize;
    let mut cum = 0f64;
    for i in 0..n {
        cum += fractions[i].max(0.0) as f64;
        let rest_empty = fractions[i + 1..].iter().all(|&f| f <= 0.0);
        let hi = if i + 1 == n || rest_empty {
            rows
        } else {
            let b = ((rows as f64) * cum).floor() as usize;
            (b - b % g).clamp(lo, rows)
        };
        out.push((lo, hi));
        lo = hi;
    }
    out
}

/// One piece of a transfer of `len` bytes at byte `offset` of the whole tensor: device `part`
/// (an index into the ranges), at byte `at` of its slice, bytes `[from, from+n)` of the
/// transfer's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub part: usize,
    pub at: usize,
    pub from: usize,
    pub n: usize,
}

/// The pieces of a transfer of `[offset, offset+len)` of a tensor laid out as rows of
/// `row_bytes`, split by `ranges`: each device's slice holds its rows contiguously.
pub fn pieces(
    ranges: &[(usize, usize)],
    row_bytes: usize,
    offset: usize,
    len: usize,
) -> Vec<Piece> {
    let end = offset.saturating_add(len);
    ranges
        .iter()
        .enumerate()
        .filter_map(|(part, &(r0, r1))| {
            let (b0, b1) = (r0 * row_bytes, r1 * row_bytes);
            let (s, e) = (offset.max(b0), end.min(b1));
            (s < e).then_some(Piece {
                part,
                at: s - b0,
                from: s - offset,
                n: e - s,
            })
        })
        .collect()
}

/// As `pieces`, for a tensor of `blocks` matrices one after another (a MUL_MAT_ID's experts),
/// each split by `ranges`: a device's slice holds its rows of block 0, then of block 1, and so
/// on, so `at` counts from the slice's start.
pub fn block_pieces(
    ranges: &[(usize, usize)],
    row_bytes: usize,
    blocks: usize,
    offset: usize,
    len: usize,
) -> Vec<Piece> {
    let rows = ranges.last().map_or(0, |r| r.1);
    let block = rows * row_bytes;
    if block == 0 || len == 0 {
        return Vec::new();
    }
    let end = offset.saturating_add(len).min(block * blocks);
    let mut out = Vec::new();
    let mut s = offset;
    while s < end {
        let b = s / block;
        let e = end.min((b + 1) * block);
        for mut p in pieces(ranges, row_bytes, s - b * block, e - s) {
            let (r0, r1) = ranges[p.part];
            p.at += b * (r1 - r0) * row_bytes;
            p.from += s - offset;
            out.push(p);
        }
        s = e;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covers(r: &[(usize, usize)], rows: usize) {
        assert_eq!(r.first().map(|x| x.0), Some(0));
        assert_eq!(r.last().map(|x| x.1), Some(rows));
        for w in r.windows(2) {
            assert_eq!(w[0].1, w[1].0, "{r:?}");
        }
        for x in r {
            assert!(x.0 <= x.1, "{r:?}");
        }
    }

    #[test]
    fn normalise_scales_and_falls_back() {
        assert_eq!(normalise(&[1.0, 3.0], &[5.0, 5.0]), vec![0.25, 0.75]);
        assert_eq!(normalise(&[0.0, 0.0], &[1.0, 3.0]), vec![0.25, 0.75]);
        assert_eq!(normalise(&[], &[2.0, 2.0]), vec![0.5, 0.5]);
        assert_eq!(normalise(&[0.0, 0.0], &[0.0, 0.0]), vec![0.5, 0.5]);
        assert_eq!(
            normalise(&[-1.0, f32::NAN, 2.0], &[1.0; 3]),
            vec![0.0, 0.0, 1.0]
        );
        assert_eq!(normalise(&[7.0], &[1.0]), vec![1.0]);
    }

    #[test]
    fn one_device_takes_every_row() {
        assert_eq!(row_ranges(4097, &[1.0], 32), vec![(0, 4097)]);
        assert_eq!(row_ranges(0, &[1.0], 32), vec![(0, 0)]);
    }

    #[test]
    fn halves_round_down_to_the_granularity() {
        assert_eq!(
            row_ranges(4096, &[0.5, 0.5], 32),
            vec![(0, 2048), (2048, 4096)]
        );
        // 1000 * 0.5 = 500 -> 480; the last device takes the rest.
        let r = row_ranges(1000, &[0.5, 0.5], 32);
        assert_eq!(r, vec![(0, 480), (480, 1000)]);
        covers(&r, 1000);
        // Odd rows without rounding.
        assert_eq!(row_ranges(7, &[0.5, 0.5], 1), vec![(0, 3), (3, 7)]);
    }

    #[test]
    fn a_device_given_nothing_gets_no_rows() {
        assert_eq!(
            row_ranges(1000, &[1.0, 0.0], 32),
            vec![(0, 1000), (1000, 1000)]
        );
        assert_eq!(row_ranges(1000, &[0.0, 1.0], 32), vec![(0, 0), (0, 1000)]);
        let r = row_ranges(999, &[0.5, 0.0, 0.5], 32);
        assert_eq!(r[1].0, r[1].1);
        covers(&r, 999);
        // The middle device keeps nothing even when rounding would leave it rows.
        let r = row_ranges(100, &[0.3, 0.7, 0.0], 32);
        assert_eq!(r, vec![(0, 0), (0, 100), (100, 100)]);
    }

    #[test]
    fn fewer_rows_than_devices() {
        let r = row_ranges(3, &[0.25; 4], 1);
        covers(&r, 3);
        assert_eq!(r.iter().map(|x| x.1 - x.0).sum::<usize>(), 3);
        // Below the granularity everything lands on the last device.
        assert_eq!(row_ranges(5, &[0.5, 0.5], 32), vec![(0, 0), (0, 5)]);
    }

    #[test]
    fn uneven_shares_cover_every_row() {
        for rows in [1, 31, 32, 33, 4095, 11008, 32000] {
            for f in [[0.1, 0.9], [0.9, 0.1], [0.33, 0.67]] {
                for g in [1, 32, 64] {
                    covers(&row_ranges(rows, &f, g), rows);
                }
            }
        }
        let r = row_ranges(11008, &[0.3, 0.7], 64);
        assert_eq!(r[0].1 % 64, 0);
        assert!((r[0].1 as f64 - 3302.4).abs() < 64.0);
    }

    #[test]
    fn pieces_cut_a_transfer_at_the_boundaries() {
        let ranges = [(0, 2), (2, 2), (2, 5)];
        // Whole tensor of 5 rows x 10 bytes.
        assert_eq!(
            pieces(&ranges, 10, 0, 50),
            vec![
                Piece {
                    part: 0,
                    at: 0,
                    from: 0,
                    n: 20
                },
                Piece {
                    part: 2,
                    at: 0,
                    from: 20,
                    n: 30
                }
            ]
        );
        // A part in the middle of a row, across the boundary.
        assert_eq!(
            pieces(&ranges, 10, 15, 10),
            vec![
                Piece {
                    part: 0,
                    at: 15,
                    from: 0,
                    n: 5
                },
                Piece {
                    part: 2,
                    at: 0,
                    from: 5,
                    n: 5
                }
            ]
        );
        assert!(pieces(&ranges, 10, 50, 0).is_empty());
        assert_eq!(
            pieces(&ranges, 10, 45, 100),
            vec![Piece {
                part: 2,
                at: 25,
                from: 0,
                n: 5
            }]
        );
    }

    #[test]
    fn one_block_pieces_are_the_plain_pieces() {
        let ranges = [(0, 2), (2, 2), (2, 5)];
        for (off, len) in [(0, 50), (15, 10), (45, 100), (50, 0), (3, 1)] {
            assert_eq!(
                block_pieces(&ranges, 10, 1, off, len),
                pieces(&ranges, 10, off, len.min(50usize.saturating_sub(off)))
            );
        }
    }

    #[test]
    fn block_pieces_follow_each_block() {
        // 2 blocks of 5 rows x 10 bytes; device 0 holds rows 0..2 of each, device 1 rows 2..5.
        let ranges = [(0, 2), (2, 5)];
        let p = |part, at, from, n| Piece { part, at, from, n };
        assert_eq!(
            block_pieces(&ranges, 10, 2, 0, 100),
            vec![
                p(0, 0, 0, 20),
                p(1, 0, 20, 30),
                p(0, 20, 50, 20),
                p(1, 30, 70, 30)
            ]
        );
        // From the middle of block 0's last row into block 1's second row.
        assert_eq!(
            block_pieces(&ranges, 10, 2, 45, 20),
            vec![p(1, 25, 0, 5), p(0, 20, 5, 15)]
        );
        // Every byte lands once, at a distinct place of its device's slice.
        let mut seen = [vec![false; 40], vec![false; 60]];
        for q in block_pieces(&ranges, 10, 2, 7, 88) {
            for b in 0..q.n {
                assert!(!seen[q.part][q.at + b]);
                seen[q.part][q.at + b] = true;
            }
        }
        let n: usize = seen.iter().flatten().filter(|&&x| x).count();
        assert_eq!(n, 88);
    }
}
