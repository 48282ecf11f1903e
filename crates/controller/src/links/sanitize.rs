//! Text that comes from a remote cluster (error bodies, names) before it reaches logs
//! and Events: bounded, one line, no control characters, no token-like material.

/// Longest remote text kept, in characters (a longer one ends in `…`).
pub const REMOTE_TEXT_MAX_CHARS: usize = 256;

/// How much input is looked at: a few times the output, so whitespace runs collapse
/// and a huge body costs no more than a small one.
const SCAN_CHARS: usize = 16 * REMOTE_TEXT_MAX_CHARS;

/// Runs of these characters this long, mixing upper and lower case and digits, look
/// like tokens, keys or base64 and are replaced (DNS names are lower case: kept).
const TOKEN_RUN: usize = 24;

/// What replaces token-like material.
pub const REDACTED: &str = "<redacted>";

/// Bounds and cleans text from a remote: control and invisible formatting characters
/// become spaces (no forged log lines, no terminal escapes), whitespace runs collapse,
/// token-like runs and whatever follows `Bearer`/`token` become [`REDACTED`], and the
/// result has at most [`REMOTE_TEXT_MAX_CHARS`] characters.
pub fn sanitize_remote_text(text: &str) -> String {
    let mut flat = String::new();
    let mut cut = false;
    for (seen, c) in text.chars().enumerate() {
        if seen == SCAN_CHARS {
            cut = true;
            break;
        }
        let c = if c.is_control() || is_invisible(c) || c.is_whitespace() {
            ' '
        } else {
            c
        };
        if !(c == ' ' && (flat.is_empty() || flat.ends_with(' '))) {
            flat.push(c);
        }
    }
    let mut runs = split_runs(flat.trim_end());
    if cut && runs.last().is_some_and(|(token, _)| *token) {
        // A run cut by the scan limit may be the start of a token.
        runs.pop();
    }
    let mut out = String::new();
    // After `Bearer `, `token=` or `token: ` comes a credential, whatever its shape.
    let (mut redact_next, mut after_token_word) = (false, false);
    for (is_token_chars, run) in runs {
        if !is_token_chars {
            redact_next |= after_token_word && (run.contains('=') || run.contains(':'));
            after_token_word = false;
            out.push_str(run);
            continue;
        }
        if redact_next || looks_like_token(run) {
            out.push_str(REDACTED);
        } else {
            out.push_str(run);
        }
        redact_next = run.eq_ignore_ascii_case("bearer");
        after_token_word = run.eq_ignore_ascii_case("token");
    }
    truncate(out, cut)
}

fn truncate(text: String, cut: bool) -> String {
    if !cut && text.chars().count() <= REMOTE_TEXT_MAX_CHARS {
        return text;
    }
    let mut out: String = text.chars().take(REMOTE_TEXT_MAX_CHARS - 1).collect();
    out.push('…');
    out
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '_' | '-')
}

/// Splits into alternating runs of token characters (true) and others (false).
fn split_runs(text: &str) -> Vec<(bool, &str)> {
    let mut runs = Vec::new();
    let mut start = 0;
    let mut kind = None;
    for (i, c) in text.char_indices() {
        let k = is_token_char(c);
        if kind.is_some_and(|prev| prev != k) {
            runs.push((kind.unwrap_or(false), &text[start..i]));
            start = i;
        }
        kind = Some(k);
    }
    if let Some(k) = kind {
        runs.push((k, &text[start..]));
    }
    runs
}

fn looks_like_token(run: &str) -> bool {
    run.len() >= TOKEN_RUN
        && run.chars().any(|c| c.is_ascii_uppercase())
        && run.chars().any(|c| c.is_ascii_lowercase())
        && run.chars().any(|c| c.is_ascii_digit())
}

/// Zero-width and bidirectional formatting characters: they can make a log line read
/// differently from what it holds.
fn is_invisible(c: char) -> bool {
    matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_text_is_one_bounded_line_without_controls_or_tokens() {
        let jwt = "eyJhbGciOiJSUzI1NiIsImtpZCI6IkFCQyJ9.eyJpc3MiOiJrdWJlcm5ldGVzL3NlcnZpY2VhY2NvdW50In0.Sg9f3kQ7ZxPq1LmN0vB8wYtR2uE5aD6c";
        let cases: Vec<(String, &str)> = vec![
            ("plain words stay".into(), "plain words stay"),
            (
                "services is forbidden: User \"system:serviceaccount:ns-1:reader\" cannot list"
                    .into(),
                "services is forbidden: User \"system:serviceaccount:ns-1:reader\" cannot list",
            ),
            (
                "line one\nfake: log line\r\n\x1b[31mred\t!".into(),
                "line one fake: log line [31mred !",
            ),
            ("bidi \u{202E}txet\u{200B} here".into(), "bidi txet here"),
            (
                format!("token {jwt} end"),
                "token <redacted>.<redacted>.<redacted> end",
            ),
            ("the token has expired".into(), "the token has expired"),
            (
                "Authorization: Bearer abc".into(),
                "Authorization: Bearer <redacted>",
            ),
            ("token=short1".into(), "token=<redacted>"),
            (
                "key Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MEFCQ0RFRg== here".into(),
                "key <redacted>== here",
            ),
            (
                "a-long-but-lowercase-dns-name-0123456789.example is kept".into(),
                "a-long-but-lowercase-dns-name-0123456789.example is kept",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(sanitize_remote_text(&input), want, "{input:?}");
        }
    }

    #[test]
    fn huge_remote_text_is_cut_to_the_bound_and_a_cut_token_never_leaks() {
        for input in [
            "x".repeat(10 << 20),
            format!("{}{}", " \n".repeat(10 << 20), "tail"),
            format!("{}{}Ab1", " ".repeat(SCAN_CHARS - 10), "Q".repeat(40)),
        ] {
            let start = std::time::Instant::now();
            let out = sanitize_remote_text(&input);
            assert!(
                out.chars().count() <= REMOTE_TEXT_MAX_CHARS,
                "{}",
                out.len()
            );
            assert!(!out.contains('Q'), "no start of a cut token: {out}");
            assert!(start.elapsed() < std::time::Duration::from_millis(500));
        }
        let out = sanitize_remote_text(&"y".repeat(1000));
        assert_eq!(out.chars().count(), REMOTE_TEXT_MAX_CHARS);
        assert!(out.ends_with('…'));
    }
}
