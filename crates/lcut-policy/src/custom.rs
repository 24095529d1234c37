//! Policy families defined outside this crate: a research rule, or a test's
//! own rule. A family is written `NAME:C[+anchors]` like SPEED, resolves its
//! cutoff like SPEED, and answers every visibility question through its own
//! [`Visibility`]; once registered it runs wherever a policy runs (generate,
//! forward, sweeps), because nothing else asks a policy's kind.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::RwLock;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::capabilities::Capabilities;
use crate::error::PolicyError;
use crate::phases::TokenPhases;
use crate::visibility::Visibility;

/// A family of one-cut policies defined outside lcut-policy.
pub trait PolicyFamily: fmt::Debug + Send + Sync + 'static {
    /// The name written before `:` (lower case, e.g. `everyother`).
    fn name(&self) -> &'static str;

    /// The visibility of one sequence at cutoff `l_cut` of `num_layers`.
    fn visibility(
        &self,
        l_cut: usize,
        num_layers: usize,
        phases: TokenPhases,
    ) -> Box<dyn Visibility>;

    /// What the family's policies can do; by default a static rule that is
    /// neither trained nor built from a reused full prefill.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            is_static: true,
            needs_staged_prefill: false,
            trainable: false,
            reuses_full_prefill: false,
        }
    }
}

/// A registered family, as a policy carries it (`Copy`; equal by name).
#[derive(Clone, Copy)]
pub struct FamilyRef(&'static dyn PolicyFamily);

impl FamilyRef {
    /// The family's name.
    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    /// See [`PolicyFamily::visibility`].
    pub fn visibility(
        &self,
        l_cut: usize,
        num_layers: usize,
        phases: TokenPhases,
    ) -> Box<dyn Visibility> {
        self.0.visibility(l_cut, num_layers, phases)
    }

    /// See [`PolicyFamily::capabilities`].
    pub fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
}

impl fmt::Debug for FamilyRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FamilyRef({})", self.name())
    }
}

impl PartialEq for FamilyRef {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for FamilyRef {}

impl Hash for FamilyRef {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name().hash(state);
    }
}

impl Serialize for FamilyRef {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for FamilyRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        find_family(&name).ok_or_else(|| {
            serde::de::Error::custom(format!("policy family {name:?} is not registered"))
        })
    }
}

/// The names of the families lcut itself defines.
const BUILT_IN: [&str; 14] = [
    "full",
    "speed",
    "selfonly",
    "slim",
    "swiftkv",
    "pop",
    "knockout",
    "band",
    "streamingllm",
    "snapkv",
    "pyramidkv",
    "knorm",
    "tova",
    "expected",
];

static REGISTRY: RwLock<Vec<FamilyRef>> = RwLock::new(Vec::new());

/// Make `family` known to policy parsing (`NAME:C[+anchors]`). Registering
/// the same family again is a no-op; another family under a taken name, or
/// a name that is not a lower-case word, is refused.
pub fn register_family(family: &'static dyn PolicyFamily) -> Result<(), PolicyError> {
    let name = family.name();
    let word = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !word || BUILT_IN.contains(&name) {
        return Err(PolicyError::FamilyName {
            name: name.to_string(),
        });
    }
    let mut registry = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    match registry.iter().find(|f| f.name() == name) {
        Some(f) if std::ptr::addr_eq(f.0, family) => Ok(()),
        Some(_) => Err(PolicyError::FamilyName {
            name: name.to_string(),
        }),
        None => {
            registry.push(FamilyRef(family));
            Ok(())
        }
    }
}

/// The registered family called `name`.
pub(crate) fn find_family(name: &str) -> Option<FamilyRef> {
    let registry = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
    registry.iter().copied().find(|f| f.name() == name)
}

/// Every family name a policy list may start a policy with.
pub(crate) fn family_names() -> Vec<&'static str> {
    let registry = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
    BUILT_IN
        .iter()
        .copied()
        .chain(registry.iter().map(|f| f.name()))
        .collect()
}
