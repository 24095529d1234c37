//! What a model name can mean: a hub repository (`ORG/NAME[@REV][:FILE]`)
//! or an Ollama model (`[[HOST/]NAMESPACE/]NAME[:TAG]`). A name may read
//! as both; the resolver tries them in turn.

/// Ollama's default registry host in its manifest folders.
pub const OLLAMA_HOST: &str = "registry.ollama.ai";
/// Ollama's namespace of official models.
pub const OLLAMA_NAMESPACE: &str = "library";
/// The tag a name without one means.
pub const OLLAMA_TAG: &str = "latest";

/// A Hugging Face hub repository, a revision and maybe a GGUF file in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubRef {
    /// The owner, absent for the hub's old top-level names (`gpt2`).
    pub org: Option<String>,
    /// The repository name.
    pub name: String,
    /// A branch, a commit or a commit's prefix (`main` when `None`).
    pub revision: Option<String>,
    /// A GGUF file of the snapshot, or its quantization tag (`Q4_K_M`).
    pub file: Option<String>,
}

impl HubRef {
    /// Read `reference` as `[ORG/]NAME[@REV][:FILE]`; `None` if it cannot be one.
    pub fn parse(reference: &str) -> Option<Self> {
        let (head, file) = match reference.split_once(':') {
            Some((h, f)) => (h, Some(f)),
            None => (reference, None),
        };
        let (repo, revision) = match head.split_once('@') {
            Some((r, v)) => (r, Some(v)),
            None => (head, None),
        };
        let mut parts = repo.split('/');
        let (org, name) = match (parts.next(), parts.next(), parts.next()) {
            (Some(org), Some(name), None) => (Some(org), name),
            (Some(name), None, None) => (None, name),
            _ => return None,
        };
        // a bare NAME:TAG reads as an Ollama model, never as a hub file
        if org.is_none() && file.is_some() {
            return None;
        }
        let repo_ok = org.is_none_or(is_repo_part) && is_repo_part(name);
        let rev_ok = revision.is_none_or(|r| is_relative(r, is_rev_char));
        let file_ok = file.is_none_or(|f| is_relative(f, is_file_char));
        (repo_ok && rev_ok && file_ok).then(|| Self {
            org: org.map(str::to_string),
            name: name.to_string(),
            revision: revision.map(str::to_string),
            file: file.map(str::to_string),
        })
    }

    /// `ORG/NAME`, as the hub writes it.
    pub fn repo(&self) -> String {
        match &self.org {
            Some(org) => format!("{org}/{}", self.name),
            None => self.name.clone(),
        }
    }

    /// The repository's folder in the cache: `models--ORG--NAME`.
    pub fn folder_name(&self) -> String {
        format!("models--{}", self.repo().replace('/', "--"))
    }
}

/// An Ollama model: where its manifest lies under `manifests/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OllamaRef {
    /// The registry (`registry.ollama.ai` unless named).
    pub host: String,
    /// The namespace (`library` unless named).
    pub namespace: String,
    /// The model.
    pub name: String,
    /// The tag (`latest` unless named).
    pub tag: String,
}

impl OllamaRef {
    /// Read `reference` as `[[HOST/]NAMESPACE/]NAME[:TAG]`; `None` if it cannot be one.
    pub fn parse(reference: &str) -> Option<Self> {
        let (path, tag) = match reference.rsplit_once(':') {
            // a colon before the last slash is a host's port, not a tag
            Some((p, t)) if !t.contains('/') => (p, t),
            _ => (reference, OLLAMA_TAG),
        };
        let parts: Vec<&str> = path.split('/').collect();
        let (host, namespace, name) = match parts.as_slice() {
            [name] => (OLLAMA_HOST, OLLAMA_NAMESPACE, *name),
            [ns, name] => (OLLAMA_HOST, *ns, *name),
            [host, ns, name] => (*host, *ns, *name),
            _ => return None,
        };
        let host_ok = is_part(host, |c| is_name_char(c) || c == ':');
        let ok = host_ok && is_part(namespace, is_name_char) && is_part(name, is_name_char);
        (ok && is_part(tag, is_name_char)).then(|| Self {
            host: host.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            tag: tag.to_string(),
        })
    }

    /// The manifest's path under the store's `manifests/` folder.
    pub fn manifest_path(&self) -> std::path::PathBuf {
        [&self.host, &self.namespace, &self.name, &self.tag]
            .iter()
            .collect()
    }

    /// The name as `ollama list` writes it: `NAME:TAG`, with the namespace
    /// and host when they are not the defaults.
    pub fn display_name(&self) -> String {
        let mut s = String::new();
        if self.host != OLLAMA_HOST {
            s.push_str(&self.host);
            s.push('/');
        }
        if self.host != OLLAMA_HOST || self.namespace != OLLAMA_NAMESPACE {
            s.push_str(&self.namespace);
            s.push('/');
        }
        s.push_str(&self.name);
        s.push(':');
        s.push_str(&self.tag);
        s
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

fn is_rev_char(c: char) -> bool {
    is_name_char(c) || c == '/'
}

fn is_file_char(c: char) -> bool {
    is_name_char(c) || matches!(c, '/' | '+' | '=' | ',')
}

/// One path component of the allowed characters, never `.` or `..`.
fn is_part(s: &str, ok: impl Fn(char) -> bool) -> bool {
    !s.is_empty() && s != "." && s != ".." && s.chars().all(ok)
}

/// A hub owner or repository name: no `--`, which would make the cache
/// folder's name ambiguous.
fn is_repo_part(s: &str) -> bool {
    is_part(s, is_name_char) && !s.contains("--")
}

/// A relative path of parts (`refs/pr/1`, `Q4_K_M/model.gguf`), none of
/// them empty, `.` or `..`.
fn is_relative(s: &str, ok: impl Fn(char) -> bool + Copy) -> bool {
    s.split('/').all(|p| is_part(p, ok))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_names_parse() {
        let r = HubRef::parse("Qwen/Qwen2.5-1.5B@main:q4.gguf").unwrap();
        assert_eq!(r.repo(), "Qwen/Qwen2.5-1.5B");
        assert_eq!(r.folder_name(), "models--Qwen--Qwen2.5-1.5B");
        assert_eq!(r.revision.as_deref(), Some("main"));
        assert_eq!(r.file.as_deref(), Some("q4.gguf"));
        assert!(HubRef::parse("gpt2").is_some());
        assert!(HubRef::parse("llama3:8b").is_none());
        assert!(HubRef::parse("../x").is_none());
        assert!(HubRef::parse("a/b/c").is_none());
        assert!(HubRef::parse("a/b@../x").is_none());
        assert!(HubRef::parse("a/b:../x.gguf").is_none());
        assert!(HubRef::parse("a--b/c").is_none());
        assert!(HubRef::parse("/abs/path").is_none());
    }

    #[test]
    fn ollama_names_parse() {
        let r = OllamaRef::parse("llama3.2").unwrap();
        assert_eq!(r.display_name(), "llama3.2:latest");
        assert_eq!(
            r.manifest_path(),
            std::path::Path::new("registry.ollama.ai/library/llama3.2/latest")
        );
        let r = OllamaRef::parse("me/m:q4").unwrap();
        assert_eq!(r.display_name(), "me/m:q4");
        let r = OllamaRef::parse("hf.co/org/m:Q4_K_M").unwrap();
        assert_eq!(r.host, "hf.co");
        assert_eq!(r.display_name(), "hf.co/org/m:Q4_K_M");
        assert!(OllamaRef::parse("a/b/c/d").is_none());
        assert!(OllamaRef::parse("../m").is_none());
        assert!(OllamaRef::parse("m:").is_none());
        assert!(OllamaRef::parse("m@x").is_none());
    }
}
