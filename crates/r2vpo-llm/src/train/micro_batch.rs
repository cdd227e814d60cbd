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
    /// (`crate::backend::batch::pack_prefixed`).
    Prefixed,
    /// Each distinct prompt once, then every response, end to end
    /// (`crate::backend::batch::pack_sequences`).
    Packed,
}

/// A sample as micro-batching sees it: which prompt (equal for samples
/// that share one), and its prompt and response lengths in tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Item {
    /// The prompt's identity (the problem's index).
    pub prompt_key: usize,
    /// Prompt tokens.
    pub prompt: usize,
    /// Response tokens.
    pub response: usize,
}

impl Layout {
    /// Tokens the layers compute for a micro-batch of these samples.
    pub fn cost<'a>(self, items: impl Iterator<Item = &'a Item> + Clone) -> usize {
        let distinct = |items: &mut dyn Iterator<Item = &'a Item>| {
            let mut seen: Vec<usize> = Vec::new();
            let mut sum = 0;
            let mut widest = 0;
            for it in items {
                if !seen.contains(&it.prompt_key) {
                    seen.push(it.prompt_key);
                    sum += it.prompt;
                    widest = widest.max(it.prompt);
                }
            }
            (seen.len(), sum, widest)
        };
        match self {
            Layout::Packed => distinct(&mut items.clone()).1 + items.map(|it| it.response).sum::<usize>(),
            Layout::Padded => {
                let (n, max) = items.fold((0, 0), |(n, m), it| (n + 1, m.max(it.prompt + it.response)));
                n * max
            }
            Layout::Prefixed => {
                let (u, _, p) = distinct(&mut items.clone());
                let (n, r) = items.fold((0, 0), |(n, m), it| (n + 1, m.max(it.response)));
                u * p + n * (r + 1)
            }
        }
    }
}

/// The micro-batches of a step over `items`, as index lists into `items`.
///
/// With `budget` = 0, consecutive runs of `rows` samples in the given
/// order (the caller's order: by problem, so that samples sharing a prompt
/// share micro-batches). With a budget, each micro-batch takes samples
/// while its [`Layout::cost`] stays within the budget (a sample above the
/// budget alone): padded rows take them longest first, so that rows of
/// like length share a micro-batch and little is padding; the other
/// layouts in the given order, which keeps a prompt's samples together.
/// Then, for `world` > 1 ranks, the micro-batches are ordered for dealing
/// (micro-batch `k` goes to rank `k % world`, ZeRO-2's rounds being
/// `world` consecutive ones): largest first, in a snake over the ranks
/// (0..world, then back), so each round holds micro-batches of like size
/// and each rank's total tokens come out close to every other's.
pub fn plan(items: &[Item], layout: Layout, rows: usize, budget: usize, world: usize) -> Vec<Vec<usize>> {
    let cost = |p: &[usize]| layout.cost(p.iter().map(|&j| &items[j]));
    let mut parts: Vec<Vec<usize>> = if budget == 0 {
        (0..items.len()).collect::<Vec<_>>().chunks(rows.max(1)).map(<[usize]>::to_vec).collect()
    } else {
        let mut order: Vec<usize> = (0..items.len()).collect();
        if layout == Layout::Padded {
            // Stable: equal lengths keep the caller's order.
            order.sort_by_key(|&i| std::cmp::Reverse(items[i].prompt + items[i].response));
        }
        let mut parts: Vec<Vec<usize>> = Vec::new();
        for i in order {
            let fits = parts.last().is_some_and(|p| {
                let mut with = p.clone();
                with.push(i);
                cost(&with) <= budget
            });
            match parts.last_mut() {
                Some(p) if fits => p.push(i),
                _ => parts.push(vec![i]),
            }
        }
        parts
    };
    if world > 1 {
        parts = deal(parts, cost, world);
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

    /// Samples of `lens` (prompt, response), each its own prompt.
    fn items(lens: &[(usize, usize)]) -> Vec<Item> {
        lens.iter().enumerate().map(|(k, &(p, r))| Item { prompt_key: k, prompt: p, response: r }).collect()
    }

    fn costs(parts: &[Vec<usize>], items: &[Item], layout: Layout) -> Vec<usize> {
        parts.iter().map(|p| layout.cost(p.iter().map(|&j| &items[j]))).collect()
    }

    /// Without a budget: the caller's order in runs of `rows`.
    #[test]
    fn rows_without_a_budget() {
        let it = items(&[(1, 5), (1, 1), (1, 9), (1, 2), (1, 7)]);
        let parts = plan(&it, Layout::Padded, 2, 0, 1);
        assert_eq!(parts, vec![vec![0, 1], vec![2, 3], vec![4]]);
    }

    /// What each layout computes: a shared prompt counts once packed and
    /// shared, once a row padded.
    #[test]
    fn costs_count_shared_prompts_once() {
        let it = [
            Item { prompt_key: 3, prompt: 10, response: 5 },
            Item { prompt_key: 3, prompt: 10, response: 20 },
            Item { prompt_key: 4, prompt: 6, response: 1 },
        ];
        assert_eq!(Layout::Packed.cost(it.iter()), 10 + 6 + 5 + 20 + 1);
        assert_eq!(Layout::Padded.cost(it.iter()), 3 * 30);
        assert_eq!(Layout::Prefixed.cost(it.iter()), 2 * 10 + 3 * 21);
    }

    /// A budget fills each micro-batch up to it, by the layout's cost; a
    /// sample longer than the budget goes alone; every sample is in
    /// exactly one micro-batch.
    #[test]
    fn a_budget_fills_micro_batches_and_keeps_long_samples() {
        let it = items(&[(10, 290), (10, 10), (10, 4990), (10, 50), (10, 790), (10, 10), (10, 690), (10, 90)]);
        for layout in [Layout::Packed, Layout::Padded] {
            let parts = plan(&it, layout, 8, 1024, 1);
            let mut seen: Vec<usize> = parts.iter().flatten().copied().collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..it.len()).collect::<Vec<_>>());
            let c = costs(&parts, &it, layout);
            let long = parts.iter().position(|p| p.contains(&2)).unwrap();
            assert_eq!(parts[long], vec![2], "{layout:?}: the 5000-token sample alone");
            assert!(c.iter().enumerate().all(|(k, &x)| k == long || x <= 1024), "{layout:?} {c:?}");
        }
        // Padded rows longest first: 5000 | 800+700 no (2 × 800 > 1024)…
        assert_eq!(plan(&it, Layout::Padded, 8, 1024, 1).len(), 5);
        // Packed in order: 300+20 | 5000 | 60+800+20 | 700+100.
        assert_eq!(plan(&it, Layout::Packed, 8, 1024, 1), vec![vec![0, 1], vec![2], vec![3, 4, 5], vec![6, 7]]);
    }

    /// Dealt over ranks, each round holds like micro-batches and the
    /// ranks' totals are closer than dealing in order would leave them.
    #[test]
    fn ranks_get_balanced_tokens() {
        let it = items(&(0..32).map(|i| (20, 30 + (i * 977 % 31) * 120)).collect::<Vec<_>>());
        let world = 4;
        let parts = plan(&it, Layout::Padded, 8, 2048, world);
        let c = costs(&parts, &it, Layout::Padded);
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
        assert!(spread(&balanced) < spread(&totals(&sorted)), "{balanced:?} vs {:?}", totals(&sorted));
        assert!(spread(&balanced) * 10 <= balanced.iter().sum::<usize>() / world, "{balanced:?}");
        // Each full round: its micro-batches within 2× of each other.
        for round in c.chunks_exact(world) {
            let (lo, hi) = (round.iter().min().unwrap(), round.iter().max().unwrap());
            assert!(hi <= &(2 * lo), "{c:?}");
        }
    }
}
