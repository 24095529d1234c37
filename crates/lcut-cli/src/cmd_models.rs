//! `lcut models`: the models in the Hugging Face hub cache and Ollama's
//! store, named as `--model` takes them, with format, size, architecture
//! and depth (read from `config.json` or the GGUF header, never the weights).

use anyhow::Result;
use lcut_model::StoreRoots;
use lcut_model::store::{ListedModel, Listing, list_models};

/// Arguments of `lcut models`.
#[derive(Debug, clap::Args)]
pub struct ModelsArgs {
    /// Print the listing as JSON (places, notes, models) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Run `lcut models`.
pub fn run(args: &ModelsArgs) -> Result<()> {
    let listing = list_models(&StoreRoots::from_env());
    if args.json {
        println!("{}", serde_json::to_string_pretty(&listing)?);
        return Ok(());
    }
    for place in &listing.places {
        eprintln!("looked in {place}");
    }
    for note in &listing.notes {
        eprintln!("note: {note}");
    }
    print!("{}", table(&listing));
    Ok(())
}

/// The loadable models as an aligned table, then the damaged entries with
/// their problems.
pub fn table(listing: &Listing) -> String {
    let (good, bad): (Vec<&ListedModel>, Vec<&ListedModel>) =
        listing.models.iter().partition(|m| m.problem.is_none());
    let mut rows = vec![[
        "NAME".to_string(),
        "STORE".into(),
        "FORMAT".into(),
        "SIZE".into(),
        "ARCH".into(),
        "LAYERS".into(),
    ]];
    for m in &good {
        let arch = match (&m.architecture, m.supported) {
            (Some(a), true) => a.clone(),
            (Some(a), false) => format!("{a} (not supported)"),
            (None, _) => "?".into(),
        };
        rows.push([
            m.name.clone(),
            m.store.to_string(),
            m.format.map_or_else(|| "?".into(), |f| f.to_string()),
            human_size(m.size_bytes),
            arch,
            m.layers.map_or_else(|| "?".into(), |l| l.to_string()),
        ]);
    }
    let mut out = String::new();
    if good.is_empty() {
        out.push_str("no models found\n");
    } else {
        let widths: Vec<usize> = (0..6)
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        for row in &rows {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .enumerate()
                // sizes and layer counts right-aligned
                .map(|(c, (cell, w))| match c {
                    3 | 5 => format!("{cell:>w$}"),
                    _ => format!("{cell:<w$}"),
                })
                .collect();
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
        }
    }
    if !bad.is_empty() {
        out.push_str("\ncannot be loaded:\n");
        for m in bad {
            let problem = m.problem.as_deref().unwrap_or_default();
            out.push_str(&format!("  {} ({}): {problem}\n", m.name, m.store));
        }
    }
    out
}

/// Bytes in KiB, MiB or GiB with one decimal.
fn human_size(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::human_size;

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(human_size(512), "512 B");
        assert_eq!(human_size(98 * 1024 * 1024 + 512 * 1024), "98.5 MiB");
        assert_eq!(human_size(3 << 30), "3.0 GiB");
    }
}
