//! `r2vpo llm plot RUN…`: the paper's LLM figures from run folders
//! ([`r2vpo_llm::plot`]).

use std::path::PathBuf;

use anyhow::Result;

pub use r2vpo_llm::plot::plot_runs;

/// `r2vpo llm plot` arguments.
#[derive(clap::Args, Debug)]
pub struct PlotArgs {
    /// Run folders written by `r2vpo llm train`.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Output folder (default: `plots` inside the first run, or `runs/llm/plots`
    /// for several runs).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Iteration whose ratio histograms are drawn (default: the last one
    /// recorded in each run).
    #[arg(long)]
    pub hist_iter: Option<usize>,
}

/// `r2vpo llm plot`.
pub fn plot(a: &PlotArgs) -> Result<()> {
    let out = a.out.clone().unwrap_or_else(|| {
        if a.runs.len() == 1 {
            a.runs[0].join("plots")
        } else {
            PathBuf::from("runs/llm/plots")
        }
    });
    for p in plot_runs(&a.runs, &out, a.hist_iter)? {
        println!("written: {}", p.display());
    }
    Ok(())
}
