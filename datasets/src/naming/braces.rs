//! Brace expansion as WebDataset users write it: `shard-{00000..01023}.tar` (a numeric range,
//! zero-padded as written), `{train,val}/x.tar` (a list), several groups in one name and groups
//! inside groups. A group without a comma or a range (`{x}`) is kept as written, as the shell
//! keeps it. The expansion is capped so a pattern cannot ask for billions of names.

use crate::error::{Error, Result};

/// The most names one source string may expand to.
pub(crate) const MAX_EXPANDED: usize = 1_000_000;

/// Whether `name` holds a brace, so [`expand`] reads it (an unbalanced one is an error there).
pub(crate) fn has_braces(name: &str) -> bool {
    name.contains(['{', '}'])
}

/// Every name `pattern` expands to, in the order the groups list them (a range from its first
/// bound to its last). Fails on an unbalanced brace, a malformed range, or an expansion past
/// [`MAX_EXPANDED`] names.
pub(crate) fn expand(pattern: &str) -> Result<Vec<String>> {
    let parts = parse(pattern)?;
    let mut names = vec![String::new()];
    for part in &parts {
        names = append(names, part, pattern)?;
    }
    Ok(names)
}

/// A piece of a pattern: literal text, or a group of alternatives (each a sequence of parts).
#[derive(Debug)]
enum Part {
    Text(String),
    Alternatives(Vec<Vec<Part>>),
}

fn bad(pattern: &str, problem: impl Into<String>) -> Error {
    Error::BadSourcePattern {
        pattern: pattern.to_string(),
        problem: problem.into(),
    }
}

fn parse(pattern: &str) -> Result<Vec<Part>> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut at = 0;
    let parts = parse_sequence(&chars, &mut at, pattern, 0)?;
    if at < chars.len() {
        // Only a closing brace stops the top-level sequence early.
        return Err(bad(
            pattern,
            format!("'}}' at character {} closes no '{{'", at + 1),
        ));
    }
    Ok(parts)
}

/// Groups may nest this deep; deeper is refused (it is never meant, and it bounds recursion).
const MAX_DEPTH: usize = 16;

/// Parses until the end, or (inside a group, `depth > 0`) an unmatched `,` or `}`.
fn parse_sequence(
    chars: &[char],
    at: &mut usize,
    pattern: &str,
    depth: usize,
) -> Result<Vec<Part>> {
    let mut parts = Vec::new();
    let mut text = String::new();
    while *at < chars.len() {
        match chars[*at] {
            '{' => {
                if !text.is_empty() {
                    parts.push(Part::Text(std::mem::take(&mut text)));
                }
                parts.push(parse_group(chars, at, pattern, depth + 1)?);
            }
            ',' | '}' if depth > 0 => break,
            '}' => break,
            other => {
                text.push(other);
                *at += 1;
            }
        }
    }
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    Ok(parts)
}

/// Parses the group opening at `chars[*at]` (a `{`), leaving `at` past its `}`.
fn parse_group(chars: &[char], at: &mut usize, pattern: &str, depth: usize) -> Result<Part> {
    if depth > MAX_DEPTH {
        return Err(bad(pattern, format!("braces nest deeper than {MAX_DEPTH}")));
    }
    let open = *at;
    *at += 1;
    let mut alternatives = Vec::new();
    loop {
        let alternative = parse_sequence(chars, at, pattern, depth)?;
        alternatives.push(alternative);
        match chars.get(*at) {
            Some(',') => *at += 1,
            Some('}') => {
                *at += 1;
                break;
            }
            _ => {
                return Err(bad(
                    pattern,
                    format!("'{{' at character {} is never closed", open + 1),
                ))
            }
        }
    }
    if alternatives.len() > 1 {
        return Ok(Part::Alternatives(alternatives));
    }
    // One alternative: a range when it is plain text of the form A..B[..STEP], else literal.
    let inner: String = chars[open + 1..*at - 1].iter().collect();
    if let Some(range) = range(&inner, pattern)? {
        return Ok(Part::Alternatives(
            range
                .into_iter()
                .map(|name| vec![Part::Text(name)])
                .collect(),
        ));
    }
    let mut literal = vec![Part::Text("{".into())];
    literal.extend(alternatives.into_iter().flatten());
    literal.push(Part::Text("}".into()));
    Ok(Part::Alternatives(vec![literal]))
}

/// The names of a numeric range `A..B` or `A..B..STEP`, zero-padded to the width of the wider
/// bound when either is written with a leading zero; `None` when `inner` is not a range.
fn range(inner: &str, pattern: &str) -> Result<Option<Vec<String>>> {
    let pieces: Vec<&str> = inner.split("..").collect();
    if pieces.len() < 2 || pieces.len() > 3 {
        return Ok(None);
    }
    let numeric = |piece: &str| !piece.is_empty() && piece.bytes().all(|b| b.is_ascii_digit());
    if !pieces.iter().all(|piece| numeric(piece)) {
        if inner.contains('{') || inner.contains(',') {
            return Ok(None);
        }
        return Err(bad(
            pattern,
            format!("{{{inner}}} is not a range of whole numbers (write {{00000..01023}})"),
        ));
    }
    let number = |piece: &str| {
        piece
            .parse::<u64>()
            .map_err(|_| bad(pattern, format!("{piece} in {{{inner}}} is too large")))
    };
    let first = number(pieces[0])?;
    let last = number(pieces[1])?;
    let step = match pieces.get(2) {
        Some(step) => number(step)?,
        None => 1,
    };
    if step == 0 {
        return Err(bad(pattern, format!("{{{inner}}} has a step of 0")));
    }
    let padded = |piece: &str| piece.len() > 1 && piece.starts_with('0');
    let width = if padded(pieces[0]) || padded(pieces[1]) {
        pieces[0].len().max(pieces[1].len())
    } else {
        0
    };
    let count = first.abs_diff(last) / step + 1;
    if count > MAX_EXPANDED as u64 {
        return Err(bad(
            pattern,
            format!("{{{inner}}} names {count} files, more than {MAX_EXPANDED}"),
        ));
    }
    let names = (0..count)
        .map(|k| {
            let value = if first <= last {
                first + k * step
            } else {
                first - k * step
            };
            format!("{value:0width$}")
        })
        .collect();
    Ok(Some(names))
}

/// Every name of `names` followed by every expansion of `part`.
fn append(names: Vec<String>, part: &Part, pattern: &str) -> Result<Vec<String>> {
    match part {
        Part::Text(text) => Ok(names.into_iter().map(|name| name + text).collect()),
        Part::Alternatives(alternatives) => {
            let mut tails = Vec::new();
            for alternative in alternatives {
                let mut expanded = vec![String::new()];
                for inner in alternative {
                    expanded = append(expanded, inner, pattern)?;
                }
                tails.extend(expanded);
            }
            let total = names.len().saturating_mul(tails.len());
            if total > MAX_EXPANDED {
                return Err(bad(
                    pattern,
                    format!("it names more than {MAX_EXPANDED} files"),
                ));
            }
            let mut out = Vec::with_capacity(total);
            for name in &names {
                for tail in &tails {
                    out.push(format!("{name}{tail}"));
                }
            }
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(pattern: &str) -> Vec<String> {
        expand(pattern).unwrap()
    }

    #[test]
    fn ranges_keep_the_padding_as_written() {
        assert_eq!(
            names("shard-{00000..00003}.tar"),
            [
                "shard-00000.tar",
                "shard-00001.tar",
                "shard-00002.tar",
                "shard-00003.tar"
            ]
        );
        assert_eq!(names("x{8..11}"), ["x8", "x9", "x10", "x11"]);
        assert_eq!(names("x{3..1}"), ["x3", "x2", "x1"]);
        assert_eq!(names("x{0..6..3}"), ["x0", "x3", "x6"]);
        assert_eq!(names("x{098..100}"), ["x098", "x099", "x100"]);
    }

    #[test]
    fn lists_groups_and_nesting_multiply_in_order() {
        assert_eq!(names("{a,b}/{1..2}"), ["a/1", "a/2", "b/1", "b/2"]);
        assert_eq!(names("{a,b{1,2}}.tar"), ["a.tar", "b1.tar", "b2.tar"]);
        assert_eq!(names("{,x}y"), ["y", "xy"]);
        assert_eq!(names("plain.tar"), ["plain.tar"]);
    }

    #[test]
    fn a_group_of_one_is_kept_as_written() {
        assert_eq!(names("a{b}c"), ["a{b}c"]);
        assert_eq!(names("{}"), ["{}"]);
    }

    #[test]
    fn malformed_patterns_say_what_is_wrong() {
        for (pattern, problem) in [
            ("shard-{0..", "never closed"),
            ("shard-0}.tar", "closes no"),
            ("{a..b}", "not a range"),
            ("{0..9..0}", "step of 0"),
            ("{0..99999999999999999999}", "too large"),
            ("{0..2000000}", "more than"),
            ("{0..999}{0..999}{0..9}", "more than"),
        ] {
            let message = expand(pattern).unwrap_err().to_string();
            assert!(message.contains(problem), "{pattern}: {message}");
            assert!(message.contains(pattern), "{pattern}: {message}");
        }
        let deep = format!("{}x{}", "{a,".repeat(40), "}".repeat(40));
        assert!(expand(&deep)
            .unwrap_err()
            .to_string()
            .contains("nest deeper"));
    }
}
