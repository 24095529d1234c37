//! The prompt shape a K/V budget is read at. A budget is a share of the
//! full model's K/V, and what a cut or a kept head holds of it depends on
//! the prompt: anchors and decode-phase tokens are held at every layer, so
//! on short prompts they weigh more and SPEED holds a larger share than on
//! long ones. The shape is the mean of the prompts the user will serve (a
//! task suite or a prompt set), or of the diagnose run's own prompts.

use std::path::{Path, PathBuf};

use lcut_diag::PromptShape;
use lcut_trace::Report;
use serde::Serialize;

use crate::diagnose::{PromptSpec, read_prompt_set};
use crate::error::{EngineError, Result};
use crate::prompt::PreparedPrompt;
use crate::session::Session;
use crate::suite::{SuiteItem, read_suite};

/// A prompt shape and where it was read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetShape {
    /// Where the shape comes from, in words (a file and its prompt count,
    /// or the run's own prompts).
    pub read_at: String,
    /// Mean anchors (1: BoS).
    pub anchors: f64,
    /// Mean prefill tokens.
    pub prefill: f64,
    /// Mean decode-phase tokens (the generation prompt and the new tokens).
    pub decode: f64,
}

impl BudgetShape {
    /// The mean shape of a diagnose report's prompts.
    pub fn of_report(report: &Report) -> Self {
        Self::new(
            format!("the run's {} prompts", report.traces.len()),
            PromptShape::of_report(report),
        )
    }

    /// `shape`, read at `read_at`.
    pub fn new(read_at: String, shape: PromptShape) -> Self {
        Self {
            read_at,
            anchors: shape.anchors,
            prefill: shape.prefill,
            decode: shape.decode,
        }
    }

    /// The token counts.
    pub fn shape(&self) -> PromptShape {
        PromptShape {
            anchors: self.anchors,
            prefill: self.prefill,
            decode: self.decode,
        }
    }
}

/// The prompts a budget is to be read at, as read from their file.
#[derive(Debug, Clone)]
pub struct ServedPrompts {
    path: PathBuf,
    prompts: Served,
}

#[derive(Debug, Clone)]
enum Served {
    Suite(Vec<SuiteItem>),
    Set(Vec<PromptSpec>),
}

/// Read the prompts to be served from `path`: a task suite (`lcut eval
/// --suite`'s JSON Lines, each item with its own budget of new tokens where
/// it names one) or a prompt set (`{"id", "prompt", "system"?}` lines). A
/// file that is neither is refused with both readings' errors.
pub fn read_served_prompts(path: &Path) -> Result<ServedPrompts> {
    let prompts = match read_suite(path) {
        Ok(items) if !items.is_empty() => Served::Suite(items),
        Ok(_) => return Err(empty(path)),
        Err(suite_err) => match read_prompt_set(path) {
            Ok(set) if !set.is_empty() => Served::Set(set),
            Ok(_) => return Err(empty(path)),
            Err(set_err) => {
                return Err(EngineError::HeadCheck(format!(
                    "{} is neither a task suite ({suite_err}) nor a prompt set ({set_err})",
                    path.display()
                )));
            }
        },
    };
    Ok(ServedPrompts {
        path: path.to_path_buf(),
        prompts,
    })
}

fn empty(path: &Path) -> EngineError {
    EngineError::HeadCheck(format!("{} holds no prompts", path.display()))
}

impl ServedPrompts {
    /// Whether the file is a task suite (else a prompt set).
    pub fn is_suite(&self) -> bool {
        matches!(self.prompts, Served::Suite(_))
    }

    /// The mean shape of the prompts tokenized for `session`'s model: each
    /// with `new_tokens` new tokens when given, else a suite item's own
    /// budget or `default_new` (`use_template` as the run applies the
    /// chat template to a prompt set).
    pub fn shape(
        &self,
        session: &Session,
        new_tokens: Option<usize>,
        default_new: usize,
        use_template: bool,
    ) -> Result<BudgetShape> {
        let counted: Vec<(PreparedPrompt, usize)> = match &self.prompts {
            Served::Suite(items) => items
                .iter()
                .map(|item| Ok((item.prepare(session)?, item.budget(new_tokens, default_new))))
                .collect::<Result<_>>()?,
            Served::Set(set) => set
                .iter()
                .map(|p| {
                    let prompt =
                        session.prepare_text(&p.user, p.system.as_deref(), use_template)?;
                    Ok((prompt, new_tokens.unwrap_or(default_new)))
                })
                .collect::<Result<_>>()?,
        };
        let shape = PromptShape::mean_of(counted.iter().map(|(p, new)| {
            (
                p.decode_start.saturating_sub(1),
                p.ids.len() - p.decode_start + new,
            )
        }))
        .ok_or_else(|| empty(&self.path))?;
        let news: Vec<usize> = counted.iter().map(|(_, n)| *n).collect();
        let mean_new = news.iter().sum::<usize>() as f64 / news.len() as f64;
        Ok(BudgetShape::new(
            format!(
                "the {} prompts of {} with {mean_new:.1} new tokens each on average",
                counted.len(),
                self.path.display()
            ),
            shape,
        ))
    }
}
