//! ARCHITECTURE.md and the crate READMEs stay true: every path ARCHITECTURE.md names in
//! backquotes exists in the tree, and every source module of every crate (and of the Python
//! package) is mapped: named by its file name or path in its crate's README.md or in
//! ARCHITECTURE.md (`mod.rs`, `lib.rs`, `main.rs` and `__init__.py` are their folder's); and
//! no crate's top-level modules import each other in a circle (the Python package's test
//! `test_package_layout.py` checks its own); and every dependency arrow between crates that
//! README.md and ARCHITECTURE.md draw is one the manifests declare (`cargo metadata`); and no
//! library file grows past 600 lines before its tests (the few over it when this check came in
//! may shrink, not grow); and the coordinator's core (`coordinator/src/scheduler/`) names no
//! file, socket, database or runtime.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::{BTreeMap, BTreeSet};
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

/// The crates' folders and where their modules live.
const MODULE_ROOTS: [(&str, &str); 13] = [
    ("alloc", "alloc/src"),
    ("proto", "proto/src"),
    ("datasets", "datasets/src"),
    ("pipeline", "pipeline/src"),
    ("rpc", "rpc/src"),
    ("worker-daemon", "worker-daemon/src"),
    ("dashboard", "dashboard/src"),
    ("loader", "loader/src"),
    ("gpu", "gpu/src"),
    ("coordinator", "coordinator/src"),
    ("cli", "cli/src"),
    ("python-client", "python-client/src"),
    ("python-client", "python-client/python/stoker"),
];

/// The module files below `dir` (`.rs`, `.py`), paths relative to the repository `root`.
fn module_files(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            module_files(root, &path, out);
        } else if path
            .extension()
            .is_some_and(|extension| extension == "rs" || extension == "py")
        {
            let relative = path.strip_prefix(root).unwrap();
            out.push(relative.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// Whether a line of `text` maps the module at `path` (a repository path whose part below the
/// crate folder is `within`): the line names its path (whole, or from the crate folder), or names
/// its file (or a longer tail of its path) in backquotes together with one of its folders in
/// backquotes, as a README's row for a folder lists the files in it.
fn maps(text: &str, path: &str, within: &str) -> bool {
    let parts: Vec<&str> = within.split('/').collect();
    let tails: Vec<String> = (1..parts.len())
        .map(|from| format!("`{}`", parts[from..].join("/")))
        .collect();
    let folders: Vec<String> = (1..parts.len())
        .map(|to| format!("{}/", parts[..to].join("/")))
        .collect();
    let crate_dir = path.strip_suffix(within).unwrap_or_default();
    text.lines().any(|line| {
        line.contains(&format!("`{path}`"))
            || line.contains(&format!("`{within}`"))
            || (tails.iter().any(|tail| line.contains(tail.as_str()))
                && folders.iter().any(|folder| {
                    line.contains(&format!("`{folder}`"))
                        || line.contains(&format!("`{crate_dir}{folder}`"))
                }))
    })
}

/// The modules of `files` (repository paths, under `crate_dir`) that neither `readme` nor
/// `architecture` maps (see [`maps`]).
fn unmapped<'a>(
    crate_dir: &str,
    files: &'a [String],
    readme: &str,
    architecture: &str,
) -> Vec<&'a String> {
    files
        .iter()
        .filter(|path| {
            let name = path.rsplit('/').next().unwrap_or_default();
            if ["mod.rs", "lib.rs", "main.rs", "__init__.py"].contains(&name) {
                return false;
            }
            let within = path.strip_prefix(&format!("{crate_dir}/")).unwrap_or(path);
            !(maps(readme, path, within) || maps(architecture, path, within))
        })
        .collect()
}

#[test]
fn every_module_is_mapped_in_its_readme_or_architecture_md() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let architecture = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let mut missing = Vec::new();
    let mut seen = 0;
    for (crate_dir, modules) in MODULE_ROOTS {
        let readme = std::fs::read_to_string(root.join(crate_dir).join("README.md"))
            .unwrap_or_else(|e| panic!("{crate_dir}/README.md: {e}"));
        let mut files = Vec::new();
        module_files(root, &root.join(modules), &mut files);
        seen += files.len();
        missing.extend(
            unmapped(crate_dir, &files, &readme, &architecture)
                .into_iter()
                .cloned(),
        );
    }
    assert!(seen > 100, "found only {seen} modules");
    assert!(
        missing.is_empty(),
        "modules no README or ARCHITECTURE.md maps: {missing:?}"
    );
}

#[test]
fn an_unnamed_module_is_reported() {
    let files = vec![
        "loader/src/client/remote.rs".to_string(),
        "loader/src/client/mod.rs".to_string(),
        "loader/src/client/new_thing.rs".to_string(),
        "loader/src/cli/inspect/hf.rs".to_string(),
    ];
    let readme = "| `src/client/` | `remote.rs` |\n| `src/cli/` | `inspect/hf.rs` |";
    assert_eq!(
        unmapped("loader", &files, readme, ""),
        vec![&"loader/src/client/new_thing.rs".to_string()]
    );
    // A file name on a line of another folder does not map it.
    let elsewhere = "| `src/cli/` | `remote.rs`, `inspect/hf.rs` |";
    assert_eq!(
        unmapped("loader", &files[..1], elsewhere, ""),
        vec![&files[0]]
    );
    // ARCHITECTURE.md's full paths do.
    let architecture = "`loader/src/client/remote.rs`";
    assert!(unmapped("loader", &files[..1], "", architecture).is_empty());
}

/// Each top-level module of a crate (the first part of its path under `src/`) and the other
/// top-level modules its code names as `crate::NAME`, or as `super::NAME` from a top-level
/// module's own file (and `super::super::NAME` one level down, and so on: whatever path leads
/// out of the module); comments and `#[cfg(test)]` parts left out: a test module may reach
/// anywhere.
fn crate_imports(files: &[(String, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let top = |within: &str| {
        let first = within.split('/').next().unwrap_or_default();
        first.strip_suffix(".rs").unwrap_or(first).to_string()
    };
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (within, _) in files {
        let module = top(within);
        if module != "lib" && module != "main" {
            graph.entry(module).or_default();
        }
    }
    for (within, text) in files {
        let module = top(within);
        let Some(edges) = graph.get(&module).cloned() else {
            continue;
        };
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let mut edges = edges;
        let depth = module_depth(within);
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for name in named_top_modules(line, depth) {
                if name != module && graph.contains_key(&name) {
                    edges.insert(name);
                }
            }
        }
        graph.insert(module, edges);
    }
    graph
}

/// How deep below the crate root the module of the file at `within` (its path under `src/`)
/// is: 1 for `name.rs` and `name/mod.rs`, 2 for `name/sub.rs`; 0 for `lib.rs`.
fn module_depth(within: &str) -> usize {
    let parts: Vec<&str> = within.split('/').collect();
    match parts.last() {
        Some(&"mod.rs") => parts.len() - 1,
        Some(&"lib.rs") | Some(&"main.rs") if parts.len() == 1 => 0,
        _ => parts.len(),
    }
}

/// The top-level modules `line` names from a module `depth` below the root: `crate::NAME`, and
/// `super::`s that climb to the root followed by `NAME`.
fn named_top_modules(line: &str, depth: usize) -> Vec<String> {
    let ident = |rest: &str| -> String {
        rest.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    for (at, _) in line.match_indices("crate::") {
        names.push(ident(&line[at + "crate::".len()..]));
    }
    let mut at = 0;
    while let Some(found) = line[at..].find("super::") {
        let start = at + found;
        // A chain is counted from its first `super::` only.
        let chained = line[..start].ends_with("::");
        let mut rest = &line[start..];
        let mut climbs = 0;
        while let Some(next) = rest.strip_prefix("super::") {
            climbs += 1;
            rest = next;
        }
        if !chained && depth > 0 && climbs == depth {
            names.push(ident(rest));
        }
        at = line.len() - rest.len();
    }
    names.retain(|name| !name.is_empty());
    names
}

/// One circle of `graph` (its modules, the first repeated at the end), if it has one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        graph: &BTreeMap<String, BTreeSet<String>>,
        module: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|m| m == module) {
            let mut found = path[at..].to_vec();
            found.push(module.to_string());
            return Some(found);
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.to_string());
        for next in graph.get(module).into_iter().flatten() {
            if let Some(found) = visit(graph, next, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(module.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|module| visit(graph, module, &mut Vec::new(), &mut done))
}

#[test]
fn no_crate_has_modules_that_import_each_other_in_a_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut circles = Vec::new();
    let mut crates = 0;
    for (_, modules) in MODULE_ROOTS
        .iter()
        .filter(|(_, modules)| modules.ends_with("/src"))
    {
        let mut paths = Vec::new();
        module_files(root, &root.join(modules), &mut paths);
        let files: Vec<(String, String)> = paths
            .iter()
            .filter(|path| path.ends_with(".rs"))
            .map(|path| {
                let within = path.strip_prefix(&format!("{modules}/")).unwrap();
                let text = std::fs::read_to_string(root.join(path)).unwrap();
                (within.to_string(), text)
            })
            .collect();
        crates += 1;
        if let Some(found) = circle(&crate_imports(&files)) {
            circles.push(format!("{modules}: {}", found.join(" -> ")));
        }
    }
    assert!(crates >= 9, "checked only {crates} crates");
    assert!(circles.is_empty(), "import circles: {circles:?}");
}

#[test]
fn super_paths_that_leave_the_module_are_imports() {
    assert_eq!(module_depth("feed.rs"), 1);
    assert_eq!(module_depth("service/mod.rs"), 1);
    assert_eq!(module_depth("service/calls.rs"), 2);
    assert_eq!(module_depth("lib.rs"), 0);
    // From a top-level module's file, `super::` is the crate root.
    assert_eq!(
        named_top_modules("use super::service::{A, B};", 1),
        ["service"]
    );
    // One level down, `super::` stays inside the module; `super::super::` leaves it.
    assert!(named_top_modules("use super::{lock, Entry};", 2).is_empty());
    assert_eq!(named_top_modules("use super::super::feed::f;", 2), ["feed"]);
    assert_eq!(
        named_top_modules("let x = crate::status::f(super::registry::g());", 1),
        ["status", "registry"]
    );
}

#[test]
fn an_import_circle_is_found() {
    let file = |within: &str, text: &str| (within.to_string(), text.to_string());
    let files = vec![
        file("lib.rs", "pub mod a; pub mod b; pub mod c;"),
        file("a.rs", "use crate::b::Thing;"),
        file("b/mod.rs", "mod inner;"),
        file(
            "b/inner.rs",
            "// crate::a in a comment\nfn f() { crate::c::g() }",
        ),
        file(
            "c.rs",
            "use crate::a;\n#[cfg(test)]\nmod tests { use crate::b; }",
        ),
    ];
    let graph = crate_imports(&files);
    assert_eq!(graph["b"], BTreeSet::from(["c".to_string()]));
    assert_eq!(
        circle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let without: Vec<_> = files.into_iter().filter(|(w, _)| w != "c.rs").collect();
    assert_eq!(circle(&crate_imports(&without)), None);
}

/// The dependency arrows a text draws (`a <- b <- c`, names in backticks or not): each
/// `(dependency, dependent)` pair, for names that are crate folders of the workspace.
fn drawn_arrows(text: &str, folders: &BTreeSet<String>) -> Vec<(String, String)> {
    let flat = text.replace('`', "").replace('\n', " ");
    let mut arrows = Vec::new();
    for (at, _) in flat.match_indices("<-") {
        let before = flat[..at].trim_end();
        let after = flat[at + 2..].trim_start();
        let name_end = |s: &str| {
            s.find(|c: char| !(c.is_ascii_lowercase() || c == '-'))
                .unwrap_or(s.len())
        };
        let left_start = before
            .rfind(|c: char| !(c.is_ascii_lowercase() || c == '-'))
            .map_or(0, |i| i + 1);
        let left = &before[left_start..];
        let right = &after[..name_end(after)];
        if folders.contains(left) && folders.contains(right) {
            arrows.push((left.to_string(), right.to_string()));
        }
    }
    arrows
}

/// Each workspace crate's folder and the folders of the workspace crates it depends on
/// (normal dependencies), as `cargo metadata` reads the manifests.
fn crate_dependencies(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let output = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(root)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let packages = metadata["packages"].as_array().unwrap();
    let folder_of = |manifest: &str| {
        Path::new(manifest)
            .parent()
            .and_then(|dir| dir.file_name())
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap()
    };
    let folders: BTreeMap<String, String> = packages
        .iter()
        .map(|package| {
            (
                package["name"].as_str().unwrap().to_string(),
                folder_of(package["manifest_path"].as_str().unwrap()),
            )
        })
        .collect();
    packages
        .iter()
        .map(|package| {
            let depends: BTreeSet<String> = package["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|dependency| dependency["kind"].is_null())
                .filter_map(|dependency| folders.get(dependency["name"].as_str().unwrap()))
                .cloned()
                .collect();
            (
                folder_of(package["manifest_path"].as_str().unwrap()),
                depends,
            )
        })
        .collect()
}

/// Every arrow README.md and ARCHITECTURE.md draw between crates is a dependency the manifests
/// declare, and both draw the same arrows.
#[test]
fn the_crate_arrows_the_docs_draw_are_the_manifests_dependencies() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let dependencies = crate_dependencies(root);
    let folders: BTreeSet<String> = dependencies.keys().cloned().collect();
    let mut drawn = Vec::new();
    for doc in ["README.md", "ARCHITECTURE.md"] {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        let arrows = drawn_arrows(&text, &folders);
        assert!(arrows.len() >= 5, "{doc} draws {arrows:?}");
        for (dependency, dependent) in &arrows {
            assert!(
                dependencies[dependent].contains(dependency),
                "{doc} draws {dependency} <- {dependent}, but {dependent}'s manifest does not \
                 depend on {dependency} (it depends on {:?})",
                dependencies[dependent]
            );
        }
        let arrows: BTreeSet<(String, String)> = arrows.into_iter().collect();
        drawn.push(arrows);
    }
    assert_eq!(
        drawn[0], drawn[1],
        "README.md and ARCHITECTURE.md draw other arrows"
    );
}

#[test]
fn arrows_are_read_in_and_out_of_backticks() {
    let folders: BTreeSet<String> = ["proto", "worker", "rpc", "python-client"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let arrows = drawn_arrows(
        "one way: `proto <- worker <- rpc`, and `rpc` <-\n`python-client`; x <- y",
        &folders,
    );
    let pairs: Vec<(&str, &str)> = arrows
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("proto", "worker"),
            ("worker", "rpc"),
            ("rpc", "python-client")
        ]
    );
}

/// The most lines a library file may hold before its tests.
const FILE_LINES: usize = 600;

/// Lines of a module before its inline test module (`#[cfg(test)]` then `mod NAME {`), or all
/// of them; a Python module's are all its lines.
fn lines_before_tests(text: &str) -> usize {
    let lines: Vec<&str> = text.split('\n').collect();
    lines
        .windows(2)
        .position(|pair| {
            pair[0] == "#[cfg(test)]"
                && pair[1].starts_with("mod ")
                && pair[1].trim_end().ends_with('{')
        })
        .unwrap_or(lines.len())
}

#[test]
fn no_library_file_grows_past_600_lines_before_its_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut over = Vec::new();
    let mut seen = 0;
    for (_, modules) in MODULE_ROOTS {
        let mut files = Vec::new();
        module_files(root, &root.join(modules), &mut files);
        for file in files {
            // A module that is tests whole (`tests.rs`, `service_tests.rs`) is not a library's.
            if file.ends_with("/tests.rs") || file.ends_with("_tests.rs") {
                continue;
            }
            seen += 1;
            let lines = lines_before_tests(&std::fs::read_to_string(root.join(&file)).unwrap());
            if lines > FILE_LINES {
                over.push(format!("{file}: {lines} lines before its tests"));
            }
        }
    }
    assert!(seen > 100, "found only {seen} modules");
    assert!(over.is_empty(), "files past {FILE_LINES} lines: {over:#?}");
}

#[test]
fn lines_before_tests_stop_at_the_inline_test_module() {
    assert_eq!(
        lines_before_tests("a\nb\n#[cfg(test)]\nmod tests {\n}\n"),
        2
    );
    // A test-only item or an external test file is not where the tests begin.
    assert_eq!(lines_before_tests("#[cfg(test)]\nmod tests;\nfn f() {}"), 3);
    assert_eq!(lines_before_tests("#[cfg(test)]\nfn helper() {}\n"), 3);
}

/// What a file doing I/O names: files, sockets, the journal's database, an async runtime.
const IO_NAMES: [&str; 7] = [
    "std::fs",
    "std::net",
    "File::",
    "redb::Database",
    "Journal::",
    "tokio::",
    "tonic::",
];

/// The lines of `text` before its tests that name one of [`IO_NAMES`].
fn io_lines(text: &str) -> Vec<String> {
    text.split('\n')
        .take(lines_before_tests(text))
        .filter(|line| IO_NAMES.iter().any(|name| line.contains(name)))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_coordinator_core_does_no_io() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    module_files(root, &root.join("coordinator/src/scheduler"), &mut files);
    assert!(files.len() >= 8, "{files:?}");
    let mut io = Vec::new();
    for file in files.iter().filter(|file| !file.ends_with("/tests.rs")) {
        for line in io_lines(&std::fs::read_to_string(root.join(file)).unwrap()) {
            io.push(format!("{file}: {}", line.trim()));
        }
    }
    assert!(
        io.is_empty(),
        "the core writes intents and leaves the I/O to its holder: {io:#?}"
    );
    // The check sees what it looks for.
    assert_eq!(
        io_lines("use redb::Database;\nfn f() {}\n#[cfg(test)]\nmod tests {\nuse std::fs;\n}"),
        ["use redb::Database;"]
    );
}
