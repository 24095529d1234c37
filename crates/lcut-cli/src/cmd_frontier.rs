//! `lcut frontier`: accuracy against K/V held, one line per family, from
//! `lcut eval --suite ... --json` results (one policy each) or a leaderboard
//! run (`lcut eval --ratios`, whose x can also be the compression ratio);
//! writes `OUT/frontier.html` (figure and table) and `OUT/frontier.svg`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use lcut_report::{
    Frontier, FrontierAxis, frontier_chart, frontier_title, render_frontier_html, standalone_svg,
};

use crate::common::write_atomic;

/// What the x axis measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum XAxis {
    /// K/V held, a share of the full model's, measured.
    KvHeld,
    /// The compression ratio (share of the prompt's K/V removed): a
    /// leaderboard run only.
    Ratio,
}

/// Arguments of `lcut frontier`.
#[derive(Debug, Args)]
pub struct FrontierArgs {
    /// `lcut eval --suite ... --json` results of one suite (the full
    /// model's gives the reference line), or one leaderboard run's folder
    /// or leaderboard.json.
    #[arg(required = true)]
    pub results: Vec<PathBuf>,
    /// The folder frontier.html and frontier.svg are written to.
    #[arg(long)]
    pub out: PathBuf,
    /// The x axis.
    #[arg(long, value_enum, default_value = "kv-held")]
    pub x: XAxis,
    /// With a leaderboard run: the task (an item kind), or all.
    #[arg(long, default_value = "all")]
    pub task: String,
}

/// The frontier of the arguments' results, every file read and checked
/// before anything is written.
pub fn read_frontier(args: &FrontierArgs) -> Result<Frontier> {
    let axis = match args.x {
        XAxis::KvHeld => FrontierAxis::KvHeld,
        XAxis::Ratio => FrontierAxis::CompressionRatio,
    };
    Ok(Frontier::read(&args.results, axis, &args.task)?)
}

/// Run `lcut frontier`.
pub fn run(args: &FrontierArgs) -> Result<()> {
    let frontier = read_frontier(args)?;
    if frontier.points.is_empty() {
        bail!("the results hold no policy but the full model: nothing to draw");
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let title = frontier_title(&frontier);
    let svg = standalone_svg(&frontier_chart(&frontier, &title).to_svg());
    let html = render_frontier_html(&frontier);
    for (name, text) in [("frontier.svg", svg), ("frontier.html", html)] {
        let path = args.out.join(name);
        write_atomic(&path, text.as_bytes())?;
        println!("wrote {}", path.display());
    }
    for family in frontier.families() {
        let points: Vec<String> = frontier
            .series(family)
            .iter()
            .map(|p| format!("{:.3} at {:.3}", p.accuracy, p.x))
            .collect();
        println!("{family}: {}", points.join(", "));
    }
    Ok(())
}
