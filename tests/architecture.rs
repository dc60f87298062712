//! The shape of `src/`, checked: no file over 600 lines, and no import circle among its files.
//!
//! An import is any path into the crate a file names (`use crate::…`, `use super::…`, or a path
//! written in its code), resolved to the file that defines the module it reaches. A child that
//! uses its parent's type and a parent that re-exports the child's are a circle too: the
//! engine's types live in leaf files, and the files that act on them import those.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The longest a file of `src/` may be.
const MAX_LINES: usize = 600;

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("readable source directory") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The module path of a source file: `src/lib.rs` is `crate`, `src/a/mod.rs` and `src/a.rs`
/// are `crate::a`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = vec!["crate".into()];
    for component in relative.components() {
        let name = component.as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        if name != "mod" && name != "lib" {
            parts.push(name);
        }
    }
    parts
}

/// The code of `text` without comments (line comments and doc comments) and string literals,
/// roughly: enough that paths named in prose are not counted. Inside an inline module
/// (`mod tests { use super::*; }`), `super::` names the file's own module: it is written
/// `self::` here.
fn code_of(text: &str) -> String {
    let mut code = String::new();
    let mut depth = 0usize;
    // The brace depths at which inline modules opened.
    let mut inline: Vec<usize> = Vec::new();
    for line in text.lines() {
        let line = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        let mut kept = String::new();
        let mut in_string = false;
        let mut previous = ' ';
        for c in line.chars() {
            if c == '"' && previous != '\\' {
                in_string = !in_string;
            } else if !in_string {
                kept.push(c);
            }
            previous = c;
        }
        let trimmed = kept.trim_start();
        let opens_module =
            (trimmed.starts_with("mod ") || trimmed.starts_with("pub mod ")) && trimmed.trim_end().ends_with('{');
        if opens_module {
            inline.push(depth);
        }
        let kept = if inline.is_empty() || opens_module { kept } else { kept.replace("super::", "self::") };
        for c in kept.chars() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if inline.last() == Some(&depth) {
                        inline.pop();
                    }
                }
                _ => {}
            }
        }
        code.push_str(&kept);
        code.push('\n');
    }
    code
}

/// Expands the `use` trees and the inline paths of `code` into full paths (`crate::a::b`,
/// `super::c`, `self::d`, `child::e` for a child module in `children`), one per leaf.
fn paths_of(code: &str, children: &[String]) -> Vec<String> {
    let mut paths = Vec::new();
    // `use` statements, with their braces.
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before_ok = at == 0 || !rest[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_');
        let tail = &rest[at + 4..];
        let end = tail.find(';').unwrap_or(tail.len());
        if before_ok {
            expand("", tail[..end].trim(), &mut paths);
        }
        rest = &tail[end.min(tail.len())..];
    }
    // Inline paths: `crate::x::y`, `super::x`, `child::x`.
    let starts = ["crate::".to_string(), "super::".to_string()];
    let children = children.iter().map(|c| format!("{c}::"));
    for start in starts.into_iter().chain(children) {
        let start = start.as_str();
        let mut from = 0;
        while let Some(at) = code[from..].find(start) {
            let at = from + at;
            let before_ok = at == 0 || !code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_');
            let end = code[at..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .map_or(code.len(), |e| at + e);
            if before_ok {
                paths.push(code[at..end].trim_end_matches(':').to_string());
            }
            from = end.max(at + 1);
        }
    }
    paths
}

/// Expands one `use` tree (`a::{b, c::{d, self}}`) under `prefix`.
fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    if tree.is_empty() {
        return;
    }
    match tree.find('{') {
        Some(open) => {
            let head = tree[..open].trim().trim_end_matches("::");
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let base = join(prefix, head);
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&base, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            expand(&base, &inner[start..], out);
        }
        None => {
            let leaf = tree.split(" as ").next().unwrap_or(tree).trim();
            if leaf == "self" {
                out.push(prefix.to_string());
            } else {
                out.push(join(prefix, leaf));
            }
        }
    }
}

fn join(prefix: &str, tail: &str) -> String {
    match (prefix.is_empty(), tail.is_empty()) {
        (true, _) => tail.to_string(),
        (_, true) => prefix.to_string(),
        _ => format!("{prefix}::{tail}"),
    }
}

/// The file a path from module `from` reaches: the longest prefix that is a module of `src/`.
fn resolve(path: &str, from: &[String], modules: &BTreeMap<Vec<String>, PathBuf>) -> Option<PathBuf> {
    let mut parts: Vec<String> = Vec::new();
    for (i, part) in path.split("::").filter(|p| !p.is_empty()).enumerate() {
        match (i, part) {
            (0, "crate") => parts.push("crate".into()),
            (0, "self") => parts.extend(from.iter().cloned()),
            (0, "super") => parts.extend(from[..from.len().saturating_sub(1)].iter().cloned()),
            // A child module, named relative to this one; anything else is another crate.
            (0, name) => {
                let child: Vec<String> = from.iter().cloned().chain([name.to_string()]).collect();
                if !modules.contains_key(&child) {
                    return None;
                }
                parts = child;
            }
            (_, "super") => {
                parts.pop();
            }
            (_, name) => parts.push(name.to_string()),
        }
    }
    (1..=parts.len()).rev().find_map(|n| modules.get(&parts[..n]).cloned())
}

#[test]
fn no_file_in_src_is_over_the_limit_and_no_import_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let too_long: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let lines = fs::read_to_string(file).expect("readable").lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", file.display()))
        })
        .collect();
    assert!(too_long.is_empty(), "files over {MAX_LINES} lines: {too_long:?}");

    let modules: BTreeMap<Vec<String>, PathBuf> = files.iter().map(|f| (module_of(&src, f), f.clone())).collect();
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for file in &files {
        let from = module_of(&src, file);
        let code = code_of(&fs::read_to_string(file).expect("readable"));
        let targets = edges.entry(file.clone()).or_default();
        let children = modules.keys().filter(|m| m.len() == from.len() + 1 && m.starts_with(&from));
        let children: Vec<String> = children.map(|m| m[from.len()].clone()).collect();
        for path in paths_of(&code, &children) {
            if let Some(target) = resolve(&path, &from, &modules).filter(|t| t != file) {
                targets.insert(target);
            }
        }
    }
    // A circle is a strongly connected component of more than one file.
    let circles = strongly_connected(&edges);
    let shown: Vec<Vec<String>> = circles
        .iter()
        .map(|c| c.iter().map(|f| f.strip_prefix(&src).unwrap_or(f).display().to_string()).collect())
        .collect();
    assert!(shown.is_empty(), "import circles among the files of src/: {shown:#?}");
}

/// Tarjan's algorithm: the components of more than one node.
fn strongly_connected(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct State<'a> {
        edges: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: BTreeSet<&'a PathBuf>,
        next: usize,
        found: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(node: &'a PathBuf, s: &mut State<'a>) {
        s.index.insert(node, s.next);
        s.low.insert(node, s.next);
        s.next += 1;
        s.stack.push(node);
        s.on_stack.insert(node);
        for next in s.edges.get(node).into_iter().flatten() {
            if !s.edges.contains_key(next) {
                continue;
            }
            if !s.index.contains_key(next) {
                visit(next, s);
                let low = s.low[node].min(s.low[next]);
                s.low.insert(node, low);
            } else if s.on_stack.contains(next) {
                let low = s.low[node].min(s.index[next]);
                s.low.insert(node, low);
            }
        }
        if s.low[node] == s.index[node] {
            let mut component = Vec::new();
            while let Some(top) = s.stack.pop() {
                s.on_stack.remove(top);
                component.push(top.clone());
                if top == node {
                    break;
                }
            }
            if component.len() > 1 {
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for node in edges.keys() {
        if !state.index.contains_key(node) {
            visit(node, &mut state);
        }
    }
    state.found
}

#[test]
fn the_checker_finds_a_circle_and_expands_use_trees() {
    let mut paths = Vec::new();
    expand("", "crate::a::{b, c::{d, self}, e as f}", &mut paths);
    assert_eq!(paths, ["crate::a::b", "crate::a::c::d", "crate::a::c", "crate::a::e"]);
    let a = PathBuf::from("a.rs");
    let b = PathBuf::from("b.rs");
    let c = PathBuf::from("c.rs");
    let mut edges = BTreeMap::new();
    edges.insert(a.clone(), BTreeSet::from([b.clone()]));
    edges.insert(b.clone(), BTreeSet::from([c.clone()]));
    edges.insert(c.clone(), BTreeSet::from([a.clone()]));
    assert_eq!(strongly_connected(&edges).len(), 1);
    edges.insert(c, BTreeSet::new());
    assert!(strongly_connected(&edges).is_empty());
}
