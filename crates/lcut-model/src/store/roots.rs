//! Where the Hugging Face hub cache and Ollama's store are: from the same
//! environment variables those tools read, or given outright (tests).

use std::ffi::OsString;
use std::path::PathBuf;

/// One store's root folder and how it was found, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreRoot {
    /// The folder.
    pub path: PathBuf,
    /// How it was found, in words: `from $HF_HUB_CACHE`, `from
    /// $HF_HOME/hub`, the default, or given.
    pub origin: String,
}

/// The two stores lcut looks in. `None`: the place cannot even be named
/// (no variable set and no home folder).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoreRoots {
    /// The Hugging Face hub cache (`models--ORG--NAME/` folders).
    pub hub: Option<StoreRoot>,
    /// Ollama's model store (`manifests/`, `blobs/`).
    pub ollama: Option<StoreRoot>,
}

/// The variables that name the hub cache, in the order huggingface_hub reads them.
pub const HUB_VARS: &str = "HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME, XDG_CACHE_HOME";

impl StoreRoots {
    /// The stores at the places the environment names (as the `hf` and
    /// `ollama` tools find them).
    pub fn from_env() -> Self {
        Self::from_vars(|name| std::env::var_os(name))
    }

    /// The stores at the places `var` names, `var` standing for the
    /// environment (so that tests need not change the process's own).
    /// Hub cache: `$HF_HUB_CACHE`, else `$HUGGINGFACE_HUB_CACHE`, else
    /// `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
    /// `~/.cache/huggingface/hub`. Ollama: `$OLLAMA_MODELS`, else
    /// `~/.ollama/models`. Empty variables count as unset; a leading `~/`
    /// is the home folder.
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> Self {
        let get = |name: &str| var(name).filter(|v| !v.is_empty());
        let home = get("HOME")
            .or_else(|| get("USERPROFILE"))
            .map(PathBuf::from);
        let expand = |v: OsString| -> PathBuf {
            let p = PathBuf::from(&v);
            match (p.strip_prefix("~"), &home) {
                (Ok(rest), Some(h)) => h.join(rest),
                _ => p,
            }
        };
        let root = |path: PathBuf, origin: &str| StoreRoot {
            path,
            origin: origin.to_string(),
        };
        let hub = if let Some(v) = get("HF_HUB_CACHE") {
            Some(root(expand(v), "from $HF_HUB_CACHE"))
        } else if let Some(v) = get("HUGGINGFACE_HUB_CACHE") {
            Some(root(expand(v), "from $HUGGINGFACE_HUB_CACHE"))
        } else if let Some(v) = get("HF_HOME") {
            Some(root(expand(v).join("hub"), "from $HF_HOME/hub"))
        } else if let Some(v) = get("XDG_CACHE_HOME") {
            Some(root(
                expand(v).join("huggingface").join("hub"),
                "from $XDG_CACHE_HOME/huggingface/hub",
            ))
        } else {
            home.as_ref().map(|h| {
                root(
                    h.join(".cache").join("huggingface").join("hub"),
                    &format!("the default ~/.cache/huggingface/hub; none of {HUB_VARS} is set"),
                )
            })
        };
        let ollama = match get("OLLAMA_MODELS") {
            Some(v) => Some(root(expand(v), "from $OLLAMA_MODELS")),
            None => home.as_ref().map(|h| {
                root(
                    h.join(".ollama").join("models"),
                    "the default ~/.ollama/models; OLLAMA_MODELS is not set",
                )
            }),
        };
        Self { hub, ollama }
    }

    /// Stores at the given folders (tests, or a caller that knows them).
    pub fn at(hub: impl Into<PathBuf>, ollama: impl Into<PathBuf>) -> Self {
        let given = |path: PathBuf| StoreRoot {
            path,
            origin: "given".into(),
        };
        Self {
            hub: Some(given(hub.into())),
            ollama: Some(given(ollama.into())),
        }
    }
}
