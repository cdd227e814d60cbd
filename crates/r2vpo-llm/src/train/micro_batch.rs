//! How a step's samples are cut into micro-batches: a fixed count of rows
//! (`micro_batch_size`), or a token budget (`max_tokens_per_micro_batch`,
//! verl's dynamic batch size) that fills each micro-batch with samples
//! until the tokens its layout computes would pass the budget; and, in a
//! data-parallel job, which rank takes which micro-batch, balanced by
//! tokens. Only the order of a sum changes: the loss is normalised by the
//! whole step's counts whatever the cut (`r2vpo::aggregate::GlobalBatch`).

/// How a micro-batch's tokens are laid out, which decides what it costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Rows left-padded to the longest: `rows × longest` tokens.
    Padded,
    /// Each distinct prompt once, responses padded to the longest
    /// (`crate::backend::batch::pack_prefixed`); costed as padded rows,
    /// an upper bound.
    Prefixed,
    /// Samples end to end (`crate::backend::batch::pack_sequences`): the
    /// sum of their tokens.
    Packed,
}

impl Layout {
    /// Tokens a micro-batch of samples with these lengths computes.
    pub fn cost(self, lens: impl Iterator<Item = usize>) -> usize {
        match self {
            Layout::Packed => lens.sum(),
            Layout::Padded | Layout::Prefixed => {
                let (n, max) = lens.fold((0, 0), |(n, m), l| (n + 1, m.max(l)));
                n * max
            }
        }
    }
}

/// The micro-batches of a step over samples of token lengths `lens`
/// (prompt + response), as index lists into `lens`.
///
/// With `budget` = 0, consecutive runs of `rows` samples in the given
/// order (the caller's order: by problem where prompts are shared). With a
/// budget, the samples longest first, each micro-batch filled while its
/// [`Layout::cost`] stays within the budget (a sample longer than the
/// budget alone): lengths sorted this way also leave padded rows little
/// padding. Then, for `world` > 1 ranks, the micro-batches are ordered
/// for dealing (micro-batch `k` goes to rank `k % world`, ZeRO-2's rounds
/// being `world` consecutive ones): largest first, in a snake over the
/// ranks (0..world, then back), so each round holds micro-batches of like
/// size and each rank's total tokens come out close to every other's.
pub fn plan(lens: &[usize], layout: Layout, rows: usize, budget: usize, world: usize) -> Vec<Vec<usize>> {
    let mut parts: Vec<Vec<usize>> = if budget == 0 {
        (0..lens.len()).collect::<Vec<_>>().chunks(rows.max(1)).map(<[usize]>::to_vec).collect()
    } else {
        let mut order: Vec<usize> = (0..lens.len()).collect();
        // Stable: equal lengths keep the caller's order.
        order.sort_by_key(|&i| std::cmp::Reverse(lens[i]));
        let mut parts: Vec<Vec<usize>> = Vec::new();
        for i in order {
            let fits = parts
                .last()
                .is_some_and(|p| layout.cost(p.iter().map(|&j| lens[j]).chain(std::iter::once(lens[i]))) <= budget);
            match parts.last_mut() {
                Some(p) if fits => p.push(i),
                _ => parts.push(vec![i]),
            }
        }
        parts
    };
    if world > 1 {
        parts = deal(parts, |p| layout.cost(p.iter().map(|&j| lens[j])), world);
    }
    parts
}

/// `parts` reordered so that dealing them round-robin over `world` ranks
/// gives each round `world` micro-batches of like cost and each rank a
/// like total (largest first; even rounds to ranks 0..world, odd rounds
/// the other way).
fn deal(mut parts: Vec<Vec<usize>>, cost: impl Fn(&[usize]) -> usize, world: usize) -> Vec<Vec<usize>> {
    parts.sort_by_key(|p| std::cmp::Reverse(cost(p)));
    let rounds = parts.len().div_ceil(world);
    let mut slots: Vec<Option<Vec<usize>>> = vec![None; rounds * world];
    for (i, p) in parts.into_iter().enumerate() {
        let (round, j) = (i / world, i % world);
        let rank = if round % 2 == 0 { j } else { world - 1 - j };
        slots[round * world + rank] = Some(p);
    }
    // A short last round keeps its micro-batches in dealing order; the
    // ranks without one sit that round out (as with a row count).
    let (full, last) = slots.split_at(rounds.saturating_sub(1) * world);
    let mut out: Vec<Vec<usize>> = full.iter().map(|s| s.clone().expect("full rounds")).collect();
    let mut tail: Vec<Vec<usize>> = last.iter().flatten().cloned().collect();
    tail.sort_by_key(|p| std::cmp::Reverse(cost(p)));
    out.extend(tail);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(parts: &[Vec<usize>], lens: &[usize], layout: Layout) -> Vec<usize> {
        parts.iter().map(|p| layout.cost(p.iter().map(|&j| lens[j]))).collect()
    }

    /// Without a budget: the caller's order in runs of `rows`.
    #[test]
    fn rows_without_a_budget() {
        let parts = plan(&[5, 1, 9, 2, 7], Layout::Padded, 2, 0, 1);
        assert_eq!(parts, vec![vec![0, 1], vec![2, 3], vec![4]]);
    }

    /// A budget fills each micro-batch up to it, by the layout's cost; a
    /// sample longer than the budget goes alone; every sample is in
    /// exactly one micro-batch.
    #[test]
    fn a_budget_fills_micro_batches_and_keeps_long_samples() {
        let lens = [300, 20, 5000, 60, 800, 20, 700, 100];
        for layout in [Layout::Packed, Layout::Padded] {
            let parts = plan(&lens, layout, 8, 1024, 1);
            let mut seen: Vec<usize> = parts.iter().flatten().copied().collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..lens.len()).collect::<Vec<_>>());
            let c = costs(&parts, &lens, layout);
            assert_eq!(parts[0], vec![2], "the 5000-token sample alone");
            assert!(c[1..].iter().all(|&x| x <= 1024), "{layout:?} {c:?}");
        }
        // Packed sums lengths, so it fits more in: 800+100+60+20+20 = 1000.
        let packed = plan(&lens, Layout::Packed, 8, 1024, 1);
        assert_eq!(packed.len(), 4, "{packed:?}");
        let padded = plan(&lens, Layout::Padded, 8, 1024, 1);
        assert_eq!(padded.len(), 6, "{padded:?}");
    }

    /// Dealt over ranks, each round holds like micro-batches and the
    /// ranks' totals are closer than dealing in order would leave them.
    #[test]
    fn ranks_get_balanced_tokens() {
        let lens: Vec<usize> = (0..32).map(|i| 50 + (i * 977 % 31) * 120).collect();
        let world = 4;
        let parts = plan(&lens, Layout::Packed, 8, 2048, world);
        let c = costs(&parts, &lens, Layout::Packed);
        let totals = |c: &[usize]| {
            let mut t = vec![0usize; world];
            for (k, x) in c.iter().enumerate() {
                t[k % world] += x;
            }
            t
        };
        let spread = |t: &[usize]| t.iter().max().unwrap() - t.iter().min().unwrap();
        let balanced = totals(&c);
        let mut sorted = c.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        assert!(spread(&balanced) <= spread(&totals(&sorted)), "{balanced:?} vs {:?}", totals(&sorted));
        assert!(spread(&balanced) * 10 <= balanced.iter().sum::<usize>() / world, "{balanced:?}");
        for round in c.chunks(world) {
            assert!(round.windows(2).all(|w| w[0] * 3 >= w[1] && w[1] * 3 >= w[0]) || round.len() < world, "{c:?}");
        }
    }
}
