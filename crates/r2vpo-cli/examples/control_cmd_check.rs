//! Temporary harness: compiles and tests `control_cmd.rs` until main.rs wires it.
#![allow(dead_code)]
#[path = "../src/config.rs"]
mod config;
#[path = "../src/control_cmd.rs"]
mod control_cmd;
fn main() -> anyhow::Result<()> {
    std::env::set_var("RAYON_NUM_THREADS", "2");
    let _ = rayon::ThreadPoolBuilder::new().num_threads(2).build_global();
    let sets: Vec<String> = std::env::args().skip(1).collect();
    control_cmd::bench(&control_cmd::BenchArgs {
        tasks: vec!["cheetah-run".into(), "walker-walk".into()],
        envs: 64,
        seconds: 1.5,
        updates: 3,
        config: None,
        sets,
        out: "/tmp/control_bench.json".into(),
    })
}
