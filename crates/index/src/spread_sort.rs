//! Sorting an answer's order keys (`u128`, the estimate's ordered bits in
//! the high half) in near-linear time: each key is dealt into one of n
//! buckets by its high half, scaled over the keys' range, and each bucket
//! is sorted on its own (an insertion sort, a comparison sort past
//! [`SMALL`] keys).
//!
//! Why not `sort_unstable`: at 64 matched replicas the default answer's
//! comparison sort was 5-6 % of a LookupRoute's server CPU (issue 36,
//! session 44), ~380 branchy comparisons for keys that the estimates
//! already spread evenly (they are linear in the matched tokens). Sorting
//! the buckets one by one makes the result exact whatever the buckets did:
//! the bucket of a key is non-decreasing in the key (a conversion, a
//! multiply by a positive constant and a truncation, each monotone), so
//! the buckets in order are the keys in order. A crowded bucket (many
//! matches with one estimate, or a range one outlier stretches) costs
//! only its own sort: session 44's single insertion sort over the whole
//! slice ran out of its move budget on those and re-sorted everything
//! (issue 36, session 45).

/// Up to this many keys a sorting network sorts them (below, `NET16`);
/// past it a bucket is sorted by comparisons.
const SMALL: usize = 16;

/// Batcher's odd-even merge network of 16 keys (63 compare-exchanges):
/// the default answer at 16 replicas sorts ~15 keys, where the comparison
/// sort's insertion pass was 4-5 % of the lookup, nearly all of it
/// mispredicted branches (issue 36, sessions 45 and 46); a network has
/// none.
#[rustfmt::skip]
const NET16: [(u8, u8); 63] = [
    (0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13), (14, 15), (0, 2), (1, 3),
    (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15), (1, 2), (5, 6), (9, 10), (13, 14),
    (0, 4), (1, 5), (2, 6), (3, 7), (8, 12), (9, 13), (10, 14), (11, 15), (2, 4), (3, 5),
    (10, 12), (11, 13), (1, 2), (3, 4), (5, 6), (9, 10), (11, 12), (13, 14), (0, 8), (1, 9),
    (2, 10), (3, 11), (4, 12), (5, 13), (6, 14), (7, 15), (4, 8), (5, 9), (6, 10), (7, 11),
    (2, 4), (3, 5), (6, 8), (7, 9), (10, 12), (11, 13), (1, 2), (3, 4), (5, 6), (7, 8),
    (9, 10), (11, 12), (13, 14),
];

/// Its first stages on the first half: a network of 8 keys (19).
#[rustfmt::skip]
const NET8: [(u8, u8); 19] = [
    (0, 1), (2, 3), (4, 5), (6, 7), (0, 2), (1, 3), (4, 6), (5, 7), (1, 2), (5, 6), (0, 4),
    (1, 5), (2, 6), (3, 7), (2, 4), (3, 5), (1, 2), (3, 4), (5, 6),
];

/// Sorts up to 16 keys with a network, padding with `u128::MAX` (which
/// sorts last, and equal keys are interchangeable).
fn network_sort(keys: &mut [u128]) {
    let n = keys.len();
    let mut a = [u128::MAX; 16];
    a[..n].copy_from_slice(keys);
    let pairs: &[(u8, u8)] = if n <= 8 { &NET8 } else { &NET16 };
    for &(i, j) in pairs {
        let (i, j) = (i as usize, j as usize);
        let (x, y) = (a[i], a[j]);
        let swap = y < x;
        a[i] = std::hint::select_unpredictable(swap, y, x);
        a[j] = std::hint::select_unpredictable(swap, x, y);
    }
    keys.copy_from_slice(&a[..n]);
}

/// Sorts `keys` ascending; `tmp` and `counts` are reusable buffers.
pub(crate) fn sort(keys: &mut [u128], tmp: &mut Vec<u128>, counts: &mut Vec<u32>) {
    let n = keys.len();
    if n <= 1 {
        return;
    }
    if n <= SMALL {
        network_sort(keys);
        return;
    }
    let hi = |k: u128| (k >> 64) as u64;
    let (mut lo_k, mut hi_k) = (u64::MAX, 0u64);
    for &k in keys.iter() {
        lo_k = lo_k.min(hi(k));
        hi_k = hi_k.max(hi(k));
    }
    if lo_k == hi_k {
        sort_crowded(keys);
        return;
    }
    let last = n - 1;
    let scale = last as f64 / (hi_k - lo_k) as f64;
    let bucket = |k: u128| (((hi(k) - lo_k) as f64 * scale) as usize).min(last);
    counts.clear();
    counts.resize(n + 1, 0);
    for &k in keys.iter() {
        counts[bucket(k) + 1] += 1;
    }
    for b in 1..=n {
        counts[b] += counts[b - 1];
    }
    tmp.clear();
    tmp.resize(n, 0);
    for &k in keys.iter() {
        let b = bucket(k);
        tmp[counts[b] as usize] = k;
        counts[b] += 1;
    }
    keys.copy_from_slice(tmp);
    // Each bucket sorted on its own (`counts[b]` is now bucket b's end): a
    // crowded one (the delivered replicas' tentative extensions give many
    // matches one estimate) costs its own sort, not the whole slice's.
    let mut start = 0;
    for &end in &counts[..n] {
        let end = end as usize;
        let bucket = &mut keys[start..end];
        if bucket.len() > SMALL {
            sort_crowded(bucket);
        } else if bucket.len() > 1 {
            insertion_sort(bucket);
        }
        start = end;
    }
}

/// Sorts a crowded bucket: many matches with one estimate, whose keys then
/// differ by replica id only and arrive in the walk's replica order,
/// already sorted (a check of one predictable pass, where the comparison
/// sort was 11 % of the default path at 256 replicas, issue 36 session 46).
fn sort_crowded(keys: &mut [u128]) {
    if !keys.is_sorted() {
        keys.sort_unstable();
    }
}

/// Sorts a few keys in place.
fn insertion_sort(keys: &mut [u128]) {
    for i in 1..keys.len() {
        let k = keys[i];
        let mut j = i;
        while j > 0 && keys[j - 1] > k {
            keys[j] = keys[j - 1];
            j -= 1;
        }
        keys[j] = k;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    fn check(mut keys: Vec<u128>) -> Result<(), TestCaseError> {
        let mut want = keys.clone();
        want.sort_unstable();
        super::sort(&mut keys, &mut Vec::new(), &mut Vec::new());
        prop_assert_eq!(keys, want);
        Ok(())
    }

    proptest! {
        #[test]
        fn sorts_as_the_comparison_sort(
            highs in prop::collection::vec(
                prop_oneof![
                    any::<u64>(),
                    0u64..64,
                    (0.0f64..1e9).prop_map(f64::to_bits),
                ],
                0..200,
            ),
            lows in prop::collection::vec(any::<u64>(), 200),
            repeat in 0usize..8,
        ) {
            let mut keys: Vec<u128> = highs
                .iter()
                .zip(&lows)
                .map(|(&h, &l)| u128::from(h) << 64 | u128::from(l))
                .collect();
            // Equal high halves (equal estimates) and equal keys.
            if repeat > 0 && !keys.is_empty() {
                let k = keys[0];
                keys.extend(std::iter::repeat_n(k, repeat));
                keys.extend(std::iter::repeat_n(k & !u128::from(u64::MAX), repeat));
            }
            check(keys)?;
        }
    }

    #[test]
    fn the_networks_sort_every_zero_one_input() {
        // The 0-1 principle: a network that sorts every 0/1 sequence sorts
        // every sequence.
        for n in 0..=16usize {
            for bits in 0u32..(1 << n) {
                let keys: Vec<u128> = (0..n).map(|i| u128::from((bits >> i) & 1)).collect();
                check(keys).unwrap();
            }
        }
    }

    #[test]
    fn an_outlier_leaves_the_rest_in_one_crowded_bucket() {
        let mut keys: Vec<u128> = (0..500u128).rev().map(|i| i << 64).collect();
        keys.push(u128::MAX);
        check(keys).unwrap();
    }
}
