//! What Python's `json` writes and reads back but strict JSON refuses, made strict: a line
//! `json.dumps` wrote with a `NaN`, `Infinity` or `-Infinity` value (its default for floats
//! that are not finite), a lone UTF-16 surrogate escape (`"\ud800"`, from a `str` that held
//! one), or a byte-order mark before the object (files saved as `utf-8-sig`). A document must
//! not become a bad sample, replaced by its neighbour, for a score field its text never uses.
//!
//! Only lines the strict parse refused are rewritten: the non-finite numbers become `null`
//! (what they are worth to a reader of text and integer labels), a lone surrogate the
//! replacement character U+FFFD (what decoding such text with `errors="replace"` gives), and
//! the mark is dropped. Anything else stays invalid and is explained by the strict parse.

/// The UTF-8 byte-order mark.
pub(super) const BOM: &[u8] = b"\xEF\xBB\xBF";

/// `line` without a leading byte-order mark.
pub(super) fn without_bom(line: &[u8]) -> &[u8] {
    line.strip_prefix(BOM).unwrap_or(line)
}

/// `line` with Python's extensions made strict JSON, or `None` when it holds none of them
/// (then rewriting cannot help). Strings are walked escape by escape, so text that spells
/// `NaN` is left alone.
pub(super) fn rewritten(line: &[u8]) -> Option<Vec<u8>> {
    let whole = line.len();
    let line = without_bom(line);
    let mut out = Vec::with_capacity(line.len() + 8);
    let mut changed = line.len() != whole;
    let mut at = 0;
    while at < line.len() {
        let byte = line[at];
        if byte == b'"' {
            let end = string_end(line, at, &mut out, &mut changed);
            at = end;
            continue;
        }
        let rest = &line[at..];
        let literal = [&b"-Infinity"[..], b"Infinity", b"NaN"]
            .into_iter()
            .find(|literal| rest.starts_with(literal));
        match literal {
            Some(literal) => {
                out.extend_from_slice(b"null");
                at += literal.len();
                changed = true;
            }
            None => {
                out.push(byte);
                at += 1;
            }
        }
    }
    changed.then_some(out)
}

/// Copies the string starting at `line[start]` (its opening quote) into `out`, lone surrogate
/// escapes replaced; returns the index after its closing quote (or the line's end).
fn string_end(line: &[u8], start: usize, out: &mut Vec<u8>, changed: &mut bool) -> usize {
    out.push(b'"');
    let mut at = start + 1;
    while at < line.len() {
        match line[at] {
            b'"' => {
                out.push(b'"');
                return at + 1;
            }
            b'\\' if line.get(at + 1) == Some(&b'u') => {
                let Some(unit) = escaped_unit(line, at) else {
                    // Not four hex digits: left for the strict parse to refuse.
                    out.extend_from_slice(&line[at..at + 2]);
                    at += 2;
                    continue;
                };
                let paired = (0xD800..0xDC00).contains(&unit)
                    && escaped_unit(line, at + 6)
                        .is_some_and(|low| (0xDC00..0xE000).contains(&low));
                if paired {
                    out.extend_from_slice(&line[at..at + 12]);
                    at += 12;
                } else if (0xD800..0xE000).contains(&unit) {
                    out.extend_from_slice(b"\\ufffd");
                    *changed = true;
                    at += 6;
                } else {
                    out.extend_from_slice(&line[at..at + 6]);
                    at += 6;
                }
            }
            b'\\' => {
                let end = (at + 2).min(line.len());
                out.extend_from_slice(&line[at..end]);
                at = end;
            }
            byte => {
                out.push(byte);
                at += 1;
            }
        }
    }
    at
}

/// The UTF-16 unit of the `\uXXXX` escape at `line[at]`, if one is there.
fn escaped_unit(line: &[u8], at: usize) -> Option<u32> {
    let escape = line.get(at..at + 6)?;
    if &escape[..2] != b"\\u" {
        return None;
    }
    let digits = std::str::from_utf8(&escape[2..]).ok()?;
    u32::from_str_radix(digits, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(line: &str) -> serde_json::Value {
        let fixed = rewritten(line.as_bytes()).expect("rewritten");
        serde_json::from_slice(&fixed).expect("strict JSON after the rewrite")
    }

    #[test]
    fn pythons_extensions_become_strict_json() {
        // json.dumps({"text": "a", "score": float("nan"), "hi": [float("inf"), -float("inf")]})
        let value = parsed(r#"{"text": "a", "score": NaN, "hi": [Infinity, -Infinity]}"#);
        assert_eq!(value["text"], "a");
        assert!(value["score"].is_null());
        assert_eq!(value["hi"], serde_json::json!([null, null]));
        // json.dumps({"text": "x\ud800y"}): a lone surrogate; a pair is kept as it is.
        let value = parsed(r#"{"text": "x\ud800y\udc00", "pair": "\ud83d\ude00", "t": NaN}"#);
        assert_eq!(value["text"], "x\u{FFFD}y\u{FFFD}");
        assert_eq!(value["pair"], "\u{1F600}");
        // Text that spells the literals is text; an escaped quote does not end a string.
        let value = parsed(r#"{"text": "NaN \"Infinity\" \\", "n": NaN}"#);
        assert_eq!(value["text"], r#"NaN "Infinity" \"#);
        // A byte-order mark before the object.
        let value = parsed("\u{FEFF}{\"text\": \"b\"}");
        assert_eq!(value["text"], "b");
    }

    #[test]
    fn lines_without_them_are_not_rewritten() {
        assert!(rewritten(br#"{"text": "NaN", "n": 1.5}"#).is_none());
        assert!(rewritten(br#"{"text": "a", "#).is_none());
        assert!(rewritten(br#"{"text": "\u12"}"#).is_none());
        assert!(rewritten(b"\"\\").is_none());
    }
}
