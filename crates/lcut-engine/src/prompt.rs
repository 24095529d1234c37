//! A prompt ready to run: its token ids, where its decode phase starts and
//! how long its system part is.

use lcut_policy::{Policy, TokenPhases};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};

/// Token ids of a prompt with the phase boundaries the policies need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedPrompt {
    /// All prompt tokens, BoS first when the model uses one.
    pub ids: Vec<u32>,
    /// First decode-phase token: the first token of the chat template's
    /// generation prompt, or the last prompt token for a raw prompt.
    pub decode_start: usize,
    /// Tokens of the rendered system part (BoS included), when there is one.
    pub system_len: Option<usize>,
    /// Whether a chat template produced the ids.
    pub chat_template_used: bool,
}

impl PreparedPrompt {
    /// A prompt given as ids; `decode_start` defaults to the last token.
    pub fn from_ids(ids: Vec<u32>, decode_start: Option<usize>) -> Result<Self> {
        if ids.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let decode_start = decode_start.unwrap_or(ids.len() - 1);
        TokenPhases::new(ids.len(), decode_start, 0)?;
        Ok(Self {
            ids,
            decode_start,
            system_len: None,
            chat_template_used: false,
        })
    }

    /// Number of prompt tokens.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True for a prompt without tokens (never built by this crate).
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The token phases of this prompt under `policy`'s anchors.
    pub fn phases(&self, policy: &Policy) -> Result<TokenPhases> {
        let anchors = policy.anchor_len(self.system_len, self.decode_start)?;
        Ok(TokenPhases::new(
            self.ids.len(),
            self.decode_start,
            anchors,
        )?)
    }
}

/// Length of the common prefix of two token sequences.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcut_policy::PolicySpec;

    #[test]
    fn raw_ids_decode_from_the_last_token() {
        let p = PreparedPrompt::from_ids(vec![1, 5, 9], None).unwrap();
        assert_eq!(p.decode_start, 2);
        let pol: PolicySpec = "speed:2+bos".parse().unwrap();
        let ph = p.phases(&pol.resolve(4).unwrap()).unwrap();
        assert_eq!((ph.anchor_len(), ph.prefill_len()), (1, 1));
    }

    #[test]
    fn bad_prompts_are_errors() {
        assert!(matches!(
            PreparedPrompt::from_ids(vec![], None),
            Err(EngineError::EmptyPrompt)
        ));
        let err = PreparedPrompt::from_ids(vec![1, 2], Some(2)).unwrap_err();
        assert!(err.to_string().contains("decode start 2"), "{err}");
        let p = PreparedPrompt::from_ids(vec![1, 2, 3], Some(0)).unwrap();
        let pol: PolicySpec = "speed:2+bos".parse().unwrap();
        let err = p.phases(&pol.resolve(4).unwrap()).unwrap_err();
        assert!(err.to_string().contains("anchor"), "{err}");
        let sys: PolicySpec = "speed:2+system".parse().unwrap();
        assert!(p.phases(&sys.resolve(4).unwrap()).is_err());
    }

    #[test]
    fn common_prefix_counts() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix(&[1], &[1, 2]), 1);
    }
}
