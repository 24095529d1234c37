//! `lcut-viewer`: inspect heatmaps, pick a cutoff, run SPEED live, export.

use std::path::PathBuf;

use anyhow::{Context as _, anyhow};
use clap::Parser;
use lcut_viewer::app::{StartOptions, ViewerApp, check_model, parse_tab};

/// The lcut desktop viewer.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Model to open at start: a model folder, a GGUF file, a Hugging Face cache name
    /// ORG/NAME[@REV][:FILE] or an Ollama name NAME[:TAG] (default: the bundled model, if present).
    #[arg(long, value_name = "DIR|FILE.gguf")]
    model: Option<PathBuf>,
    /// Do not open any model at start.
    #[arg(long, conflicts_with = "model")]
    no_model: bool,
    /// A report.json (or a run folder holding one) to open at start.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Open the large synthetic report (32 layers × 32 heads × 128 steps × 128K positions).
    #[arg(long)]
    demo_large: bool,
    /// A JSONL prompt file ({"id", "prompt", "system"?} per line) instead of the bundled set.
    #[arg(long, value_name = "FILE")]
    prompts: Option<PathBuf>,
    /// Run diagnostics on the model as soon as it is loaded; print a line when done.
    #[arg(long)]
    run: bool,
    /// The live view's prompt.
    #[arg(long, value_name = "TEXT")]
    live_prompt: Option<String>,
    /// The live view's most new tokens.
    #[arg(long, value_name = "N")]
    live_max_new_tokens: Option<usize>,
    /// The live view's third policy, run beside full and SPEED (default: a SlimInfer policy,
    /// slim:1/3@50%,2/3@25%+block:16+unit:4; an empty string for none).
    #[arg(long, value_name = "POLICY")]
    live_policy: Option<String>,
    /// Generate in the live view as soon as the model is loaded (after --run); print a line when done.
    #[arg(long)]
    generate: bool,
    /// The live view's SPEED L_cut, used by --generate and kept on its control (default: the
    /// recommendation of --run, else 3/4 of the depth).
    #[arg(long, value_name = "N")]
    l_cut: Option<usize>,
    /// Once a report is open, fill the Heads view's picks (and the chosen cut) from the plan
    /// for this K/V budget, a share in (0, 1]; print a line when done.
    #[arg(long, value_name = "B")]
    kv_budget: Option<f64>,
    /// With --kv-budget: run the picks beside the full model once they are filled (in the Live
    /// view, with SPEED+BoS at equal K/V); print a line when done.
    #[arg(long, requires = "kv_budget")]
    run_heads: bool,
    /// The view to show first: heatmaps, curves, recommendation, sweep, routing (a
    /// mixture-of-experts model's report), heads, live or frontier.
    #[arg(long, value_name = "NAME")]
    screenshot_view: Option<String>,
    /// Time N idle frames, then N frames drag-panning the prompt-position heatmap; print both, quit.
    #[arg(long, value_name = "N")]
    bench_pan: Option<usize>,
    /// `lcut eval --suite ... --json` results (or a leaderboard run's leaderboard.json) to draw
    /// in the Frontier view: accuracy against K/V held, one line per family.
    #[arg(long, value_name = "FILE", num_args = 1..)]
    eval: Vec<PathBuf>,
    /// Window size, WIDTHxHEIGHT.
    #[arg(long, default_value = "1280x800")]
    size: String,
}

fn parse_size(s: &str) -> anyhow::Result<[f32; 2]> {
    let (w, h) = s
        .split_once('x')
        .ok_or_else(|| anyhow!("--size {s:?}: expected WIDTHxHEIGHT, e.g. 1280x800"))?;
    let num = |v: &str| {
        v.trim()
            .parse::<f32>()
            .with_context(|| format!("--size {s:?}: {v:?} is not a number"))
    };
    Ok([num(w)?, num(h)?])
}

fn main() -> anyhow::Result<()> {
    // the worker thread runs the engine: the same process settings as the
    // `lcut` binary, made before any other thread starts
    lcut_engine::heap::keep_freed_buffers();
    // SAFETY: no other thread exists yet.
    #[allow(unsafe_code)]
    unsafe {
        lcut_engine::threads::pin_thread_count()
    };
    let args = Args::parse();
    let tab = match &args.screenshot_view {
        Some(name) => Some(parse_tab(name).ok_or_else(|| {
            anyhow!(
                "--screenshot-view {name:?}: expected heatmaps, curves, recommendation, sweep, routing, heads, live or frontier"
            )
        })?),
        None => None,
    };
    if let Some(b) = args.kv_budget
        && !(b > 0.0 && b <= 1.0)
    {
        return Err(anyhow!(
            "--kv-budget {b}: outside (0, 1]; it is the share of the full model's K/V to keep"
        ));
    }
    if let Some(m) = &args.model {
        check_model(m, &lcut_model::StoreRoots::from_env()).map_err(|e| anyhow!("--model: {e}"))?;
    }
    let opts = StartOptions {
        model: args.model,
        no_model: args.no_model,
        report: args.report,
        demo_large: args.demo_large,
        tab,
        prompts: args.prompts,
        run: args.run,
        live_prompt: args.live_prompt,
        live_max_new_tokens: args.live_max_new_tokens,
        live_policy: args.live_policy,
        generate: args.generate,
        l_cut: args.l_cut,
        kv_budget: args.kv_budget,
        run_heads: args.run_heads,
        bench_pan_frames: args.bench_pan,
        eval: args.eval,
    };
    let mut native = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_inner_size(parse_size(&args.size)?)
            .with_title("lcut viewer"),
        ..Default::default()
    };
    // The pan benchmark measures frames, not the display's refresh rate.
    native.glow_options.vsync = args.bench_pan.is_none();
    eframe::run_native(
        "lcut viewer",
        native,
        Box::new(move |cc| Ok(Box::new(ViewerApp::new(&cc.egui_ctx, &opts)?))),
    )
    .map_err(|e| anyhow!("the window failed: {e}"))
}
