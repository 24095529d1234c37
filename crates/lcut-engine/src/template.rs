//! Chat templates rendered with minijinja, and the decode-phase start they
//! imply: the first token of the generation prompt.

use minijinja::{Environment, Error, ErrorKind, context};
use serde::Serialize;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    /// "system", "user" or "assistant".
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message with the given role.
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// Most template instructions one rendering may execute: a chat template
/// spends tens per message, so this allows conversations of thousands of
/// messages and stops a runaway loop within a fraction of a second.
pub const TEMPLATE_FUEL: u64 = 2_000_000;
/// Deepest nesting of macro calls and includes a template may reach.
pub const TEMPLATE_RECURSION: usize = 64;

/// A compiled Hugging Face chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

fn raise_exception(msg: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

impl ChatTemplate {
    /// Compile `source` with the model's special tokens.
    pub fn new(
        source: &str,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Self, String> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        // a template comes with the model (a GGUF carries its own): bound the
        // work one rendering may do, so an endless loop is an error, not a hang
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_recursion_limit(TEMPLATE_RECURSION);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| e.to_string())?;
        Ok(Self {
            env,
            bos_token: bos_token.unwrap_or_default().to_string(),
            eos_token: eos_token.unwrap_or_default().to_string(),
        })
    }

    /// Render `messages`, with the generation prompt when asked.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        let tmpl = self.env.get_template("chat").map_err(|e| e.to_string())?;
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        })
        .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA3: &str = "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";

    #[test]
    fn renders_generation_prompt_as_suffix() {
        let t = ChatTemplate::new(LLAMA3, Some("<|begin_of_text|>"), None).unwrap();
        let msgs = [Message::new("user", " hi ")];
        let without = t.render(&msgs, false).unwrap();
        let with = t.render(&msgs, true).unwrap();
        assert!(with.starts_with(&without));
        assert_eq!(
            &with[without.len()..],
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        assert!(without.starts_with("<|begin_of_text|>"));
    }

    #[test]
    fn runaway_templates_stop_with_a_named_error() {
        let msgs = [Message::new("user", "hi")];
        let loops =
            "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}";
        let start = std::time::Instant::now();
        let err = ChatTemplate::new(loops, None, None)
            .unwrap()
            .render(&msgs, true)
            .unwrap_err();
        assert!(err.contains("fuel"), "{err}");
        assert!(start.elapsed().as_secs() < 10, "took {:?}", start.elapsed());
        let recursive = "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}";
        let err = ChatTemplate::new(recursive, None, None)
            .unwrap()
            .render(&msgs, true)
            .unwrap_err();
        assert!(err.contains("recursion"), "{err}");
    }

    #[test]
    fn long_conversations_fit_in_the_fuel() {
        let t = ChatTemplate::new(LLAMA3, Some("<s>"), None).unwrap();
        let msgs: Vec<Message> = (0..2000)
            .map(|i| {
                Message::new(
                    if i % 2 == 0 { "user" } else { "assistant" },
                    "some words here",
                )
            })
            .collect();
        assert!(t.render(&msgs, true).unwrap().ends_with("\n\n"));
    }

    #[test]
    fn python_methods_and_raise_work() {
        let t = ChatTemplate::new("{{ messages[0].content.strip() }}{% if messages|length > 1 %}{{ raise_exception('one only') }}{% endif %}", None, None).unwrap();
        assert_eq!(
            t.render(&[Message::new("user", " x ")], false).unwrap(),
            "x"
        );
        let err = t
            .render(
                &[Message::new("user", "a"), Message::new("user", "b")],
                false,
            )
            .unwrap_err();
        assert!(err.contains("one only"), "{err}");
    }
}
