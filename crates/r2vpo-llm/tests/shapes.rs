//! The model shapes in `configs/shapes/` (random-weight runs, `bench step
//! --shape`, and the memory arithmetic of larger models) read as the models
//! they name: each parses and validates, and the Qwen3 ones have the
//! parameter counts their model cards publish (total, and without the
//! embeddings), to the card's rounding.

use std::path::PathBuf;

use r2vpo_llm::model::expected_params;
use r2vpo_llm::model::ModelConfig;

fn shapes() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../configs/shapes")
}

#[test]
fn every_shape_parses_and_the_qwen3_ones_have_their_published_sizes() {
    let mut seen = 0;
    for entry in std::fs::read_dir(shapes()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            ModelConfig::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            seen += 1;
        }
    }
    assert!(seen >= 6, "{seen} shapes");
    // (file, total parameters, without embeddings, the card's decimals
    // for that), in billions, as the Qwen3 model cards round them.
    for (file, total, non_embedding, decimals) in
        [("qwen3-1.7b.json", 1.7, 1.4, 1), ("qwen3-4b.json", 4.0, 3.6, 1), ("qwen3-8b.json", 8.2, 6.95, 2)]
    {
        let cfg = ModelConfig::from_file(&shapes().join(file)).unwrap();
        let params: Vec<(String, usize)> =
            expected_params(&cfg).into_iter().map(|(n, s)| (n, s.iter().product())).collect();
        let all = params.iter().map(|p| p.1).sum::<usize>() as f64 / 1e9;
        let embed = params
            .iter()
            .filter(|(n, _)| n == "model.embed_tokens.weight" || n == "lm_head.weight")
            .map(|p| p.1)
            .sum::<usize>() as f64
            / 1e9;
        let near = |x: f64, card: f64, d: i32| (x - card).abs() <= 0.5 * 10f64.powi(-d);
        assert!(near(all, total, 1), "{file}: {all:.3} B parameters, the card says {total}");
        assert!(
            near(all - embed, non_embedding, decimals),
            "{file}: {:.3} B without embeddings, the card says {non_embedding}",
            all - embed
        );
    }
}
