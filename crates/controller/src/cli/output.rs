//! Printing manifests as YAML or JSON, ready for `kubectl apply -f -`.

use anyhow::Context;
use std::io::Write;

/// How manifests are printed.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// YAML documents separated by `---` lines.
    Yaml,
    /// One JSON object, or a `v1` `List` holding several.
    Json,
}

/// Renders `docs` in `format`: YAML documents separated by `---` lines, or JSON (the
/// object itself when there is one, a `v1` `List` of them otherwise). Ends with a newline.
pub(crate) fn render_documents(
    docs: &[serde_json::Value],
    format: OutputFormat,
) -> anyhow::Result<String> {
    match format {
        OutputFormat::Yaml => {
            let mut out = String::new();
            for (i, doc) in docs.iter().enumerate() {
                if i > 0 {
                    out.push_str("---\n");
                }
                let yaml = serde_saphyr::to_string(doc).context("rendering YAML")?;
                out.push_str(&yaml);
                if !yaml.ends_with('\n') {
                    out.push('\n');
                }
            }
            Ok(out)
        }
        OutputFormat::Json => {
            let mut out = match docs {
                [one] => serde_json::to_string_pretty(one),
                many => serde_json::to_string_pretty(&serde_json::json!({
                    "apiVersion": "v1",
                    "kind": "List",
                    "items": many,
                })),
            }
            .context("rendering JSON")?;
            out.push('\n');
            Ok(out)
        }
    }
}

/// Prints `docs` to stdout as [`render_documents`] renders them.
pub(crate) fn print_documents(
    docs: &[serde_json::Value],
    format: OutputFormat,
) -> anyhow::Result<()> {
    let text = render_documents(docs, format)?;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("writing to stdout")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn docs() -> Vec<serde_json::Value> {
        vec![
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "b", "namespace": "a"}}),
        ]
    }

    #[test]
    fn yaml_separates_documents_and_round_trips() {
        let text = render_documents(&docs(), OutputFormat::Yaml).unwrap();
        assert_eq!(text.lines().filter(|l| *l == "---").count(), 1, "{text}");
        assert!(!text.starts_with("---"), "{text}");
        assert!(text.ends_with('\n'));
        let back: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
        assert_eq!(back, docs());
    }

    #[test]
    fn yaml_of_one_document_has_no_separator() {
        let text = render_documents(&docs()[..1], OutputFormat::Yaml).unwrap();
        assert!(!text.contains("---"), "{text}");
        let back: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(back, docs()[0]);
    }

    #[test]
    fn json_of_one_document_is_the_object() {
        let text = render_documents(&docs()[..1], OutputFormat::Json).unwrap();
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, docs()[0]);
    }

    #[test]
    fn json_of_several_documents_is_a_list() {
        let text = render_documents(&docs(), OutputFormat::Json).unwrap();
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["apiVersion"], "v1");
        assert_eq!(back["kind"], "List");
        assert_eq!(back["items"], json!(docs()));
    }

    #[test]
    fn strings_that_look_like_other_types_stay_strings() {
        let doc = json!({"data": {"a": "true", "b": "123", "c": "null", "d": "---", "e": "x: y"}});
        let text = render_documents(std::slice::from_ref(&doc), OutputFormat::Yaml).unwrap();
        let back: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(back, doc, "{text}");
    }
}
