//! ARCHITECTURE.md stays true: every path it names in backquotes exists in the tree.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;

/// The backquoted spans of `text` that look like paths in the repository.
fn named_paths(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .flat_map(|span| span.split(", "))
        .map(str::trim)
        .filter(|span| {
            let top = span.split('/').next().unwrap_or_default();
            span.contains('/')
                && !span.contains(' ')
                && [
                    "proto",
                    "datasets",
                    "worker",
                    "loader",
                    "python-client",
                    "benches",
                ]
                .contains(&top)
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn every_path_architecture_md_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let paths = named_paths(&text);
    assert!(paths.len() > 30, "found only {paths:?}");
    let missing: Vec<&String> = paths
        .iter()
        .filter(|path| !root.join(path).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that are gone: {missing:?}"
    );
}

#[test]
fn path_extraction_sees_gone_paths() {
    let named = named_paths("a `loader/src/nothing_here.rs` and `ErrorKind` and `x y/z`");
    assert_eq!(named, vec!["loader/src/nothing_here.rs".to_string()]);
}
