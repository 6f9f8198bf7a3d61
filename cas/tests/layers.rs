//! The layers of `cas`, checked: every module imports only from its own
//! layer or below (the table at the top of `cas/src/lib.rs`, which
//! docs/design.md carries too), no import cycle runs between modules
//! beyond a parent and its children, no type gets inherent methods away
//! from its top-level module, no file (tests aside) passes 600 lines, and
//! the workspace's crates depend only downwards.
//!
//! It reads the source as text (std only): comments, strings and char
//! literals are blanked, `use` trees expanded, and every path that starts
//! at `crate::`, `self::`, `super::` or a child module is resolved to the
//! longest module it names. Test modules (`#[cfg(test)] mod ..`, files
//! named `tests.rs`) are not part of the library's graph and are skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const CAS: &str = env!("CARGO_MANIFEST_DIR");

/// Upward imports let through: (file under `cas/src`, module it names).
/// Only ever shrinks: an entry that no longer occurs fails too.
const ALLOWED: &[(&str, &str)] = &[];

/// Files allowed past 600 lines of non-test code: not (yet) split.
const LONG: &[&str] = &["storage/mem.rs"];

/// Most lines of non-test code in one file.
const MAX_LINES: usize = 600;

// ---------------------------------------------------------------- table

/// The layer table: rows from the lowest layer up, each with its module
/// paths (relative to the crate root).
struct Table {
    rows: Vec<(String, Vec<Vec<String>>)>,
}

/// The lines of the fenced `text` block after `# Layers` in `doc`
/// (lines with their `//! ` prefix, if any, removed).
fn layer_block(doc: &str, prefix: &str) -> Vec<String> {
    let mut lines =
        doc.lines().map(|l| l.strip_prefix(prefix).unwrap_or(l.trim_start_matches(prefix.trim())));
    lines
        .by_ref()
        .find(|l| l.starts_with('#') && l.trim_start_matches('#').trim().starts_with("Layers"))
        .expect("a `# Layers` heading");
    lines.by_ref().find(|l| l.trim() == "```text").expect("a ```text block under `# Layers`");
    lines.take_while(|l| l.trim() != "```").map(str::to_string).collect()
}

impl Table {
    fn read(lib_rs: &str) -> Table {
        let block = layer_block(lib_rs, "//! ");
        let mut rows = Vec::new();
        for line in block.iter().skip(1) {
            let mut words = line.split_whitespace();
            let Some(layer) = words.next() else { continue };
            let modules = words.map(|m| m.split("::").map(str::to_string).collect()).collect();
            rows.push((layer.to_string(), modules));
        }
        rows.reverse();
        assert!(!rows.is_empty(), "the layer table in lib.rs is empty");
        Table { rows }
    }

    /// The rank (0 = lowest) and name of the layer of `module`: the row
    /// of the longest entry that is a prefix of it.
    fn layer(&self, module: &[String]) -> Option<(usize, &str)> {
        let mut best: Option<(usize, usize)> = None;
        for (rank, (_, entries)) in self.rows.iter().enumerate() {
            for e in entries {
                if module.starts_with(e) && best.is_none_or(|(len, _)| e.len() > len) {
                    best = Some((e.len(), rank));
                }
            }
        }
        best.map(|(_, rank)| (rank, self.rows[rank].0.as_str()))
    }

    fn entries(&self) -> Vec<String> {
        self.rows.iter().flat_map(|(_, e)| e.iter().map(|m| m.join("::"))).collect()
    }
}

// ---------------------------------------------------------------- lexing

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// `src` with comments, strings and char literals replaced by spaces;
/// newlines kept, so line numbers hold.
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            let end = b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if b[i..].starts_with(b"/*") {
            let (mut depth, mut j) = (1, i + 2);
            while j < b.len() && depth > 0 {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if b[i] == b'"' {
            // Raw string: `r#*"` before it, the `r` not ending an identifier
            // (`br` allowed).
            let hashes = b[..i].iter().rev().take_while(|&&c| c == b'#').count();
            let r = i.checked_sub(hashes + 1);
            let raw = r.is_some_and(|r| {
                b[r] == b'r'
                    && (r == 0
                        || !is_ident(b[r - 1])
                        || (b[r - 1] == b'b' && (r == 1 || !is_ident(b[r - 2]))))
            });
            let mut j = i + 1;
            if raw {
                let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
                while j < b.len() && !b[j..].starts_with(&close) {
                    j += 1;
                }
                j = (j + close.len()).min(b.len());
            } else {
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                j = (j + 1).min(b.len());
            }
            blank(&mut out, i, j);
            i = j;
        } else if b[i] == b'\'' {
            // A char literal, or a lifetime / label (left alone).
            let end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..].iter().position(|&c| c == b'\'').map(|p| i + 2 + p + 1)
            } else {
                let ch = src[i + 1..].chars().next().map_or(0, char::len_utf8);
                (b.get(i + 1 + ch) == Some(&b'\'')).then_some(i + 2 + ch)
            };
            match end {
                Some(end) => {
                    blank(&mut out, i, end);
                    i = end;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).expect("blanking keeps UTF-8 (multibyte runs are in comments or strings)")
}

/// Expands a `use` tree (`a::{b, c::{d as e}, self}`) into paths.
fn expand_use(tree: &str) -> Vec<Vec<String>> {
    fn rec(prefix: &[String], t: &str, out: &mut Vec<Vec<String>>) {
        let t = t.trim();
        if t.is_empty() {
            return;
        }
        if let Some(open) = t.find('{') {
            let close = t.rfind('}').expect("balanced braces in a use tree");
            let mut head = prefix.to_vec();
            head.extend(segments(&t[..open]));
            let (mut depth, mut start) = (0, open + 1);
            for (k, c) in t[open + 1..close].char_indices() {
                let k = k + open + 1;
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        rec(&head, &t[start..k], out);
                        start = k + 1;
                    }
                    _ => {}
                }
            }
            rec(&head, &t[start..close], out);
        } else {
            let t = t.split(" as ").next().unwrap_or(t);
            let mut p = prefix.to_vec();
            p.extend(segments(t));
            while p.last().is_some_and(|s| s == "self" || s == "*") {
                p.pop();
            }
            if !p.is_empty() {
                out.push(p);
            }
        }
    }
    fn segments(s: &str) -> Vec<String> {
        s.split("::").map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
    }
    let flat: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = Vec::new();
    rec(&[], &flat, &mut out);
    out
}

// ---------------------------------------------------------------- sources

struct File {
    /// Path under `cas/src`, with `/`.
    rel: String,
    module: Vec<String>,
    raw: String,
    stripped: String,
}

fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel.trim_end_matches(".rs").split('/').map(str::to_string).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

fn read_tree(dir: &Path, base: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> =
        fs::read_dir(dir).expect("readable source dir").map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            read_tree(&p, base, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p.strip_prefix(base).unwrap().to_path_buf());
        }
    }
}

fn sources() -> Vec<File> {
    let src = Path::new(CAS).join("src");
    let mut paths = Vec::new();
    read_tree(&src, &src, &mut paths);
    paths
        .into_iter()
        .map(|p| {
            let raw = fs::read_to_string(src.join(&p)).unwrap();
            let rel = p.to_string_lossy().replace('\\', "/");
            File { module: module_of(&rel), stripped: strip(&raw), raw, rel }
        })
        .collect()
}

/// One module path named by a file.
#[derive(Clone, Debug)]
struct Ref {
    file: String,
    line: usize,
    from: Vec<String>,
    written: String,
    to: Vec<String>,
}

/// A parsed file: what it names, which lines are test code, and the
/// child modules it declares.
struct Scan {
    refs: Vec<(usize, Vec<String>, String, Vec<String>)>,
    test_lines: BTreeSet<usize>,
    /// Files of `#[cfg(test)] mod x;` declared here (module paths).
    test_children: Vec<Vec<String>>,
    /// (name, is_test) of `mod x;` / `mod x {` declared here.
    children: Vec<(Vec<String>, bool)>,
}

/// The `mod NAME` a line declares, and whether it opens a block.
fn mod_decl(line: &str) -> Option<(String, bool)> {
    let mut t = line.trim_start();
    if let Some(rest) = t.strip_prefix("pub") {
        t = rest.trim_start();
        if t.starts_with('(') {
            t = t[t.find(')')? + 1..].trim_start();
        }
    }
    let rest = t.strip_prefix("mod ")?.trim_start();
    let name: String = rest.chars().take_while(|&c| c.is_ascii_alphanumeric() || c == '_').collect();
    let after = rest[name.len()..].trim_start();
    match after.chars().next() {
        Some(';') => Some((name, false)),
        Some('{') => Some((name, true)),
        _ => None,
    }
}

fn scan(f: &File) -> Scan {
    let lines: Vec<&str> = f.stripped.split('\n').collect();
    let raw_lines: Vec<&str> = f.raw.split('\n').collect();
    let whole_test = f.rel.ends_with("tests.rs");
    // Pass 1: module of each line, test lines, declared children.
    let mut line_mod: Vec<(Vec<String>, bool)> = Vec::with_capacity(lines.len());
    let mut stack: Vec<(String, i64, bool)> = Vec::new();
    let mut depth: i64 = 0;
    let mut pending_test = false;
    let mut test_children = Vec::new();
    let mut children = Vec::new();
    for (n, text) in lines.iter().enumerate() {
        let raw = raw_lines.get(n).copied().unwrap_or("");
        if raw.contains("#[cfg(test)]") {
            pending_test = true;
        }
        let mut cur = f.module.clone();
        cur.extend(stack.iter().map(|s| s.0.clone()));
        let in_test = whole_test || stack.iter().any(|s| s.2);
        let decl = mod_decl(text);
        let this_test = in_test || (pending_test && decl.is_some());
        if let Some((name, block)) = &decl {
            let mut child = cur.clone();
            child.push(name.clone());
            children.push((child.clone(), this_test));
            if !block && this_test {
                test_children.push(child);
            }
        }
        line_mod.push((cur, this_test));
        if let Some((name, true)) = &decl {
            stack.push((name.clone(), depth, this_test));
            pending_test = false;
        } else if !text.trim().is_empty() && !text.trim_start().starts_with('#') {
            pending_test = false;
        }
        for c in text.chars() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if stack.last().is_some_and(|s| s.1 == depth) {
                        stack.pop();
                    }
                }
                _ => {}
            }
        }
    }
    let test_lines: BTreeSet<usize> =
        line_mod.iter().enumerate().filter(|(_, (_, t))| *t).map(|(n, _)| n + 1).collect();
    let local_children: BTreeMap<Vec<String>, BTreeSet<String>> =
        children.iter().fold(BTreeMap::new(), |mut m, (c, _)| {
            m.entry(c[..c.len() - 1].to_vec()).or_default().insert(c[c.len() - 1].clone());
            m
        });

    // Pass 2: paths in `use` items and elsewhere.
    let s = &f.stripped;
    let bytes = s.as_bytes();
    let line_at = |pos: usize| s[..pos].matches('\n').count();
    let mut refs = Vec::new();
    let mut use_spans = Vec::new();
    let mut i = 0;
    while let Some(p) = s[i..].find("use") {
        let at = i + p;
        i = at + 3;
        let word = (at == 0 || !is_ident(bytes[at - 1]))
            && bytes.get(at + 3).is_some_and(|c| c.is_ascii_whitespace());
        if !word {
            continue;
        }
        let Some(end) = s[at..].find(';').map(|e| at + e) else { continue };
        use_spans.push((at, end));
        let ln = line_at(at);
        for path in expand_use(&s[at + 3..end]) {
            refs.push((ln + 1, line_mod[ln].0.clone(), path.join("::"), path));
        }
        i = end;
    }
    let mut k = 0;
    while k < bytes.len() {
        if !is_ident(bytes[k]) || (k > 0 && (is_ident(bytes[k - 1]) || bytes[k - 1] == b':')) {
            k += 1;
            continue;
        }
        let start = k;
        let mut end = k;
        let mut segs = Vec::new();
        loop {
            let seg_start = end;
            while end < bytes.len() && is_ident(bytes[end]) {
                end += 1;
            }
            segs.push(s[seg_start..end].to_string());
            if bytes[end..].starts_with(b"::") && bytes.get(end + 2).is_some_and(|&c| is_ident(c)) {
                end += 2;
            } else {
                break;
            }
        }
        k = end.max(start + 1);
        if segs.len() < 2 || use_spans.iter().any(|&(a, b)| start >= a && start < b) {
            continue;
        }
        let ln = line_at(start);
        let cur = &line_mod[ln].0;
        let first = segs[0].as_str();
        let child = local_children.get(cur).is_some_and(|c| c.contains(first));
        if matches!(first, "crate" | "self" | "super") || child {
            refs.push((ln + 1, cur.clone(), segs.join("::"), segs));
        }
    }
    let refs = refs.into_iter().filter(|(ln, ..)| !test_lines.contains(ln)).collect();
    Scan { refs, test_lines, test_children, children }
}

/// Everything the crate's non-test code names, resolved to modules.
struct Crate {
    files: Vec<File>,
    refs: Vec<Ref>,
    /// Lines of test code per file.
    test_lines: BTreeMap<String, BTreeSet<usize>>,
    modules: BTreeSet<Vec<String>>,
}

fn load() -> Crate {
    let files = sources();
    let mut scans: Vec<Scan> = files.iter().map(scan).collect();
    let test_files: BTreeSet<Vec<String>> = scans.iter().flat_map(|s| s.test_children.clone()).collect();
    let mut modules: BTreeSet<Vec<String>> = files.iter().map(|f| f.module.clone()).collect();
    let mut children: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
    for s in &scans {
        for (c, _) in &s.children {
            modules.insert(c.clone());
            children.entry(c[..c.len() - 1].to_vec()).or_default().insert(c[c.len() - 1].clone());
        }
    }
    // Names the crate root re-exports: `crate::Error` is `crate::error::Error`.
    let lib = files.iter().find(|f| f.rel == "lib.rs").expect("lib.rs");
    let mut reexports = BTreeMap::new();
    for line in lib.stripped.split(';') {
        if let Some(tree) = line.trim().strip_prefix("pub use ") {
            for p in expand_use(tree) {
                reexports.insert(p.last().unwrap().clone(), p[0].clone());
            }
        }
    }
    let resolve = |from: &[String], segs: &[String]| -> Option<Vec<String>> {
        let mut abs = match segs[0].as_str() {
            "crate" => segs[1..].to_vec(),
            "self" => [from, &segs[1..]].concat(),
            "super" => {
                let mut base = from.to_vec();
                let mut rest = segs;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
                [&base[..], rest].concat()
            }
            first if children.get(from).is_some_and(|c| c.contains(first)) => [from, segs].concat(),
            _ => return None,
        };
        if let Some(m) = abs.first().and_then(|n| reexports.get(n)) {
            abs.insert(0, m.clone());
        }
        let n = (0..=abs.len()).rev().find(|&n| modules.contains(&abs[..n]))?;
        Some(abs[..n].to_vec())
    };
    let mut refs = Vec::new();
    let mut test_lines = BTreeMap::new();
    for (f, s) in files.iter().zip(scans.iter_mut()) {
        let is_test_file = test_files.contains(&f.module);
        let mut tl = std::mem::take(&mut s.test_lines);
        if is_test_file {
            tl = (1..=f.raw.lines().count()).collect();
        }
        if !is_test_file {
            for (line, from, written, segs) in s.refs.drain(..) {
                if let Some(to) = resolve(&from, &segs) {
                    refs.push(Ref { file: f.rel.clone(), line, from, written, to });
                }
            }
        }
        test_lines.insert(f.rel.clone(), tl);
    }
    Crate { files, refs, test_lines, modules }
}

fn table() -> Table {
    Table::read(&fs::read_to_string(Path::new(CAS).join("src/lib.rs")).unwrap())
}

// ---------------------------------------------------------------- tests

#[test]
fn every_module_is_in_one_layer() {
    let (table, krate) = (table(), load());
    let mut missing = Vec::new();
    for m in &krate.modules {
        if m.len() == 1 && table.layer(m).is_none() {
            missing.push(m.join("::"));
        }
    }
    assert!(missing.is_empty(), "modules in no row of the layer table (cas/src/lib.rs): {missing:?}");
    let entries = table.entries();
    let mut seen = BTreeSet::new();
    for e in &entries {
        assert!(seen.insert(e), "{e} is in the layer table twice");
        let path: Vec<String> = e.split("::").map(str::to_string).collect();
        assert!(krate.modules.contains(&path), "the layer table names {e}, which is no module");
    }
}

#[test]
fn modules_import_only_their_layer_or_below() {
    let (table, krate) = (table(), load());
    let mut bad = Vec::new();
    let mut used = BTreeSet::new();
    for r in &krate.refs {
        if r.from.is_empty() {
            continue; // the crate root: only `mod` and `pub use`
        }
        let (Some((from, from_layer)), Some((to, to_layer))) = (table.layer(&r.from), table.layer(&r.to))
        else {
            continue;
        };
        if to <= from {
            continue;
        }
        let target = r.to.join("::");
        if let Some(a) = ALLOWED
            .iter()
            .find(|(f, t)| *f == r.file && (target == *t || target.starts_with(&format!("{t}::"))))
        {
            used.insert(*a);
            continue;
        }
        bad.push(format!(
            "cas/src/{}:{}: {} ({from_layer}) imports {} ({to_layer})",
            r.file,
            r.line,
            r.from.join("::"),
            r.written
        ));
    }
    let stale: Vec<_> = ALLOWED.iter().filter(|a| !used.contains(a)).collect();
    assert!(bad.is_empty(), "upward imports (see the layer table in cas/src/lib.rs):\n{}", bad.join("\n"));
    assert!(stale.is_empty(), "allowed upward imports that no longer occur (remove them): {stale:?}");
}

/// Tarjan's strongly connected components of `graph`, those of more than
/// one node.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, (usize, usize)>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, (n, n));
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            if !t.index.contains_key(w.as_str()) {
                visit(t, w);
                let lw = t.index[w.as_str()].1;
                t.index.get_mut(v).unwrap().1 = t.index[v].1.min(lw);
            } else if t.on.contains(w.as_str()) {
                let iw = t.index[w.as_str()].0;
                t.index.get_mut(v).unwrap().1 = t.index[v].1.min(iw);
            }
        }
        if t.index[v].0 == t.index[v].1 {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t =
        T { g: graph, index: BTreeMap::new(), stack: Vec::new(), on: BTreeSet::new(), out: Vec::new() };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

fn describe_cycles(comps: &[Vec<String>], edges: &BTreeMap<(String, String), String>) -> String {
    let mut out = String::new();
    for comp in comps {
        out.push_str(&format!("cycle: {}\n", comp.join(" ")));
        for ((a, b), at) in edges {
            if comp.contains(a) && comp.contains(b) {
                out.push_str(&format!("  {a} -> {b}  ({at})\n"));
            }
        }
    }
    out
}

#[test]
fn no_import_cycles_beyond_parent_and_child() {
    let krate = load();
    // Between top-level modules: none at all.
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut top_edges = BTreeMap::new();
    // Between all modules, a child naming its ancestor aside.
    let mut all: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut all_edges = BTreeMap::new();
    for r in &krate.refs {
        let (Some(a), Some(b)) = (r.from.first(), r.to.first()) else { continue };
        let at = format!("cas/src/{}:{} {}", r.file, r.line, r.written);
        if a != b {
            top.entry(a.clone()).or_default().insert(b.clone());
            top_edges.entry((a.clone(), b.clone())).or_insert(at.clone());
        }
        if r.from != r.to && !r.from.starts_with(&r.to) {
            let (a, b) = (r.from.join("::"), r.to.join("::"));
            all.entry(a.clone()).or_default().insert(b.clone());
            all_edges.entry((a, b)).or_insert(at);
        }
    }
    let (c1, c2) = (cycles(&top), cycles(&all));
    assert!(
        c1.is_empty() && c2.is_empty(),
        "import cycles:\n{}{}",
        describe_cycles(&c1, &top_edges),
        describe_cycles(&c2, &all_edges)
    );
}

#[test]
fn inherent_impls_stay_with_their_type() {
    let krate = load();
    // Types by the top-level module that defines them.
    let mut defined: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let decl_name = |line: &str, kw: &str| -> Option<String> {
        let t = line.trim_start();
        let t = t.strip_prefix("pub").map_or(t, |r| {
            let r = r.trim_start();
            if r.starts_with('(') {
                r[r.find(')').map_or(0, |p| p + 1)..].trim_start()
            } else {
                r
            }
        });
        let rest = t.strip_prefix(kw)?;
        Some(rest.chars().take_while(|&c| c.is_ascii_alphanumeric() || c == '_').collect())
    };
    for f in &krate.files {
        let Some(top) = f.module.first() else { continue };
        for line in f.stripped.lines() {
            for kw in ["struct ", "enum ", "trait "] {
                if let Some(name) = decl_name(line, kw).filter(|n| !n.is_empty()) {
                    defined.entry(name).or_default().insert(top.clone());
                }
            }
        }
    }
    let mut bad = Vec::new();
    for f in &krate.files {
        let Some(top) = f.module.first() else { continue };
        let tests = &krate.test_lines[&f.rel];
        for (n, line) in f.stripped.lines().enumerate() {
            let t = line.trim_start();
            let Some(rest) = t.strip_prefix("impl") else { continue };
            if tests.contains(&(n + 1)) || !(rest.starts_with(' ') || rest.starts_with('<')) {
                continue;
            }
            let head = line.split('{').next().unwrap_or(line);
            if head.contains(" for ") || head.contains(" where ") {
                continue;
            }
            // `impl<..> Name<..>`: the name after the generics.
            let mut r = rest;
            if r.starts_with('<') {
                let mut depth = 0;
                let end = r
                    .char_indices()
                    .find(|&(_, c)| {
                        depth += match c {
                            '<' => 1,
                            '>' => -1,
                            _ => 0,
                        };
                        depth == 0
                    })
                    .map_or(r.len(), |(k, _)| k + 1);
                r = &r[end..];
            }
            let name: String =
                r.trim_start().chars().take_while(|&c| c.is_ascii_alphanumeric() || c == '_').collect();
            let Some(homes) = defined.get(&name) else { continue };
            if !homes.contains(top) {
                bad.push(format!("cas/src/{}:{}: impl {name} away from {homes:?}", f.rel, n + 1));
            }
        }
    }
    assert!(bad.is_empty(), "inherent impls outside their type's module:\n{}", bad.join("\n"));
}

#[test]
fn no_file_passes_600_lines_of_non_test_code() {
    let krate = load();
    let mut bad = Vec::new();
    for f in &krate.files {
        let tests = &krate.test_lines[&f.rel];
        let n = f.raw.lines().enumerate().filter(|(k, _)| !tests.contains(&(k + 1))).count();
        let long = LONG.contains(&f.rel.as_str());
        if n > MAX_LINES && !long {
            bad.push(format!("cas/src/{}: {n} lines", f.rel));
        }
        if n <= MAX_LINES && long {
            bad.push(format!("cas/src/{}: {n} lines, remove it from LONG", f.rel));
        }
    }
    assert!(bad.is_empty(), "files over {MAX_LINES} lines of non-test code:\n{}", bad.join("\n"));
}

#[test]
fn design_md_draws_the_same_layers() {
    let lib = fs::read_to_string(Path::new(CAS).join("src/lib.rs")).unwrap();
    let design = fs::read_to_string(Path::new(CAS).join("../docs/design.md")).unwrap();
    assert_eq!(
        layer_block(&design, ""),
        layer_block(&lib, "//! "),
        "docs/design.md (\"# Layers\" under \"Layout of the code\") and cas/src/lib.rs differ"
    );
}

// ---------------------------------------------------------------- crates

/// Workspace crates by folder, lowest first: a crate depends only on
/// crates of a lower rank; nothing depends on the two tops.
const CRATES: &[(&str, u8)] = &[
    ("trace", 0),
    ("sched", 1),
    ("cas", 1),
    ("remote", 2),
    ("serve", 2),
    ("fuzz", 3),
    ("ublk", 9),
    ("ci", 9),
];

/// The `path = "../X"` dependencies of a Cargo.toml, in any dependency
/// section.
fn path_deps(toml: &str) -> Vec<String> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in toml.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            section = t.trim_matches(|c| c == '[' || c == ']').to_string();
            continue;
        }
        let deps = section.ends_with("dependencies") || section.contains("dependencies.");
        if !deps {
            continue;
        }
        if let Some(p) = t.find("path") {
            let rest = t[p + 4..].trim_start();
            if let Some(v) = rest.strip_prefix('=') {
                let v = v.trim_start().trim_start_matches('"');
                let v = &v[..v.find('"').unwrap_or(v.len())];
                if let Some(name) = v.strip_prefix("../") {
                    out.push(name.to_string());
                }
            }
        }
    }
    out
}

#[test]
fn crates_depend_only_downwards() {
    let root = Path::new(CAS).join("..");
    let workspace = fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members = workspace.split("members").nth(1).and_then(|s| s.split('[').nth(1)?.split(']').next());
    let members = members.expect("a `members = [..]` list in the workspace's Cargo.toml");
    let mut dirs: Vec<String> = members
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect();
    dirs.push("fuzz".into());
    let rank = |d: &str| CRATES.iter().find(|c| c.0 == d).map(|c| c.1);
    let mut bad = Vec::new();
    for dir in &dirs {
        let Some(r) = rank(dir) else {
            bad.push(format!("{dir}: not in CRATES (cas/tests/layers.rs)"));
            continue;
        };
        let toml = fs::read_to_string(root.join(dir).join("Cargo.toml")).unwrap();
        for dep in path_deps(&toml) {
            match rank(&dep) {
                _ if dir == "trace" => bad.push(format!("trace depends on {dep}: trace is the lowest crate")),
                _ if dep == "ublk" || dep == "ci" => bad.push(format!("{dir} depends on {dep}")),
                Some(d) if d < r => {}
                _ => bad.push(format!("{dir} (rank {r}) depends on {dep} ({:?})", rank(&dep))),
            }
        }
    }
    assert!(bad.is_empty(), "crate dependencies not pointing down:\n{}", bad.join("\n"));
}

#[test]
fn the_checker_reads_paths_as_rust_does() {
    let s = strip("let a = \"crate::x\"; // super::y\nlet c = 'b'; fn f<'a>() {} r#\"self::z\"#;");
    assert!(!s.contains("crate::x") && !s.contains("super::y") && !s.contains("self::z"));
    assert!(s.contains("<'a>") && s.lines().count() == 2);
    let paths = expand_use("super::{a::{b, c as d}, self, e::*}");
    let joined: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(joined, ["super::a::b", "super::a::c", "super", "super::e"]);
    assert_eq!(path_deps("[dependencies]\ncas = { path = \"../cas\" }\n[package]\npath = \"../x\""), ["cas"]);
}
