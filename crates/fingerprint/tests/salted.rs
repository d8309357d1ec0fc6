//! Properties of the salted fingerprint: no salt is the golden scheme, a
//! salt reaches every block through the chain, and a salted chain is still
//! positional (a prompt's chain starts with its prefixes' chains).
#![allow(clippy::unwrap_used)]

use inferencecache_fingerprint::{chain, chain_salted};
use proptest::prelude::*;

proptest! {
    #[test]
    fn no_salt_is_the_plain_scheme(tokens in prop::collection::vec(any::<u32>(), 0..200), bs in 1usize..40) {
        prop_assert_eq!(chain_salted(&tokens, bs, ""), chain(&tokens, bs));
    }

    #[test]
    fn a_salt_reaches_every_block(
        tokens in prop::collection::vec(any::<u32>(), 1..200),
        bs in 1usize..40,
        salt in "[a-z0-9]{1,12}",
        other in "[a-z0-9]{1,12}",
    ) {
        let plain = chain(&tokens, bs);
        let salted = chain_salted(&tokens, bs, &salt);
        prop_assert_eq!(salted.len(), plain.len());
        prop_assert_eq!(&salted.block_token_counts, &plain.block_token_counts);
        for (s, p) in salted.block_hashes.iter().zip(&plain.block_hashes) {
            prop_assert_ne!(s, p);
        }
        if other != salt {
            let o = chain_salted(&tokens, bs, &other);
            for (s, x) in salted.block_hashes.iter().zip(&o.block_hashes) {
                prop_assert_ne!(s, x);
            }
        }
    }

    #[test]
    fn a_salted_chain_is_positional(
        tokens in prop::collection::vec(any::<u32>(), 1..200),
        bs in 1usize..40,
        cut in 0usize..200,
        salt in "[a-z0-9]{1,12}",
    ) {
        let cut = cut.min(tokens.len());
        let whole = chain_salted(&tokens, bs, &salt);
        let head = chain_salted(&tokens[..cut], bs, &salt);
        prop_assert_eq!(&whole.block_hashes[..head.len()], &head.block_hashes[..]);
    }
}
