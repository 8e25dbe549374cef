//! Kernel groups: the kernels are compiled in pieces, each its own program and cache file, on
//! first use of one of its kernels (kernels.rs), so a model compiles only what its graphs
//! launch and the pieces compile on several threads at once.
//!
//! A family is a set of kernel files compiled together (files that share device code). A
//! family's kernels of no tag form one group; tagged kernels (`#if RF_ALL || RF_T_<tag>`
//! around them, or stamped out per weight type by quants.h's RF_EACH_*_TYPE lists) form one
//! group per tag: a weight type (`mul_mat q4_1`), or a KV type and head size (`flash_attn
//! f16_d64`). A group is compiled with -DRF_GROUP=1 (untagged) or -DRF_GROUP=2 -DRF_T_<tag>=1
//! (prelude.h). Which kernel is in which group is read from the sources themselves (`scan`).

use once_cell::sync::Lazy;
use std::collections::HashMap;

pub const PRELUDE: &str = include_str!("../../kernels/prelude.h");
/// Shared device code (weight loaders, the per-type lists) that every group includes.
pub const HEADERS: &[(&str, &str)] = &[("quants.h", include_str!("../../kernels/quants.h"))];

/// Every kernel file.
pub const SOURCES: &[(&str, &str)] = &[
    ("mul_mat.hip", include_str!("../../kernels/mul_mat.hip")),
    ("mmvq.hip", include_str!("../../kernels/mmvq.hip")),
    (
        "elementwise.hip",
        include_str!("../../kernels/elementwise.hip"),
    ),
    ("cpy.hip", include_str!("../../kernels/cpy.hip")),
    ("rows.hip", include_str!("../../kernels/rows.hip")),
    (
        "get_set_rows.hip",
        include_str!("../../kernels/get_set_rows.hip"),
    ),
    ("rope.hip", include_str!("../../kernels/rope.hip")),
    (
        "activation.hip",
        include_str!("../../kernels/activation.hip"),
    ),
    (
        "flash_attn.hip",
        include_str!("../../kernels/flash_attn.hip"),
    ),
    (
        "flash_attn_split.hip",
        include_str!("../../kernels/flash_attn_split.hip"),
    ),
    (
        "flash_attn_vec.hip",
        include_str!("../../kernels/flash_attn_vec.hip"),
    ),
    (
        "mul_mat_id.hip",
        include_str!("../../kernels/mul_mat_id.hip"),
    ),
    ("norm.hip", include_str!("../../kernels/norm.hip")),
    ("reduce.hip", include_str!("../../kernels/reduce.hip")),
    ("layout.hip", include_str!("../../kernels/layout.hip")),
    ("quantize.hip", include_str!("../../kernels/quantize.hip")),
    ("dequant.hip", include_str!("../../kernels/dequant.hip")),
    (
        "flash_attn_tiled.hip",
        include_str!("../../kernels/flash_attn_tiled.hip"),
    ),
    (
        "flash_attn_mma.hip",
        include_str!("../../kernels/flash_attn_mma.hip"),
    ),
    ("hadamard.hip", include_str!("../../kernels/hadamard.hip")),
    ("fused.hip", include_str!("../../kernels/fused.hip")),
];

/// Families, their files in program order (a file after those whose device code it uses).
/// Largest first: the order groups of a graph are compiled in when they are not asked for.
pub const FAMILIES: &[(&str, &[&str])] = &[
    (
        "flash_attn",
        &[
            "flash_attn.hip",
            "flash_attn_split.hip",
            "flash_attn_vec.hip",
            "flash_attn_tiled.hip",
            "flash_attn_mma.hip",
        ],
    ),
    (
        "mmvq",
        &[
            "mmvq.hip",
            "activation.hip",
            "rope.hip",
            "quantize.hip",
            "hadamard.hip",
            "fused.hip",
        ],
    ),
    (
        "mul_mat",
        &[
            "mul_mat.hip",
            "dequant.hip",
            "get_set_rows.hip",
            "mul_mat_id.hip",
        ],
    ),
    ("cpy", &["cpy.hip"]),
    ("layout", &["layout.hip"]),
    ("elementwise", &["elementwise.hip"]),
    ("rows", &["rows.hip"]),
    ("norm", &["norm.hip"]),
    ("reduce", &["reduce.hip"]),
];

/// One group: a family's untagged kernels (tag None) or one tag's.
#[derive(Clone, Debug)]
pub struct Group {
    pub family: &'static str,
    pub tag: Option<String>,
    pub files: &'static [&'static str],
    /// Its kernels, in source order.
    pub kernels: Vec<String>,
}

impl Group {
    /// "mul_mat q4_1", "elementwise".
    pub fn label(&self) -> String {
        match &self.tag {
            Some(t) => format!("{} {t}", self.family),
            None => self.family.to_string(),
        }
    }

    /// The -D options that select the group's kernels (prelude.h).
    pub fn options(&self) -> Vec<String> {
        match &self.tag {
            Some(t) => vec!["-DRF_GROUP=2".into(), format!("-DRF_T_{t}=1")],
            None => vec!["-DRF_GROUP=1".into()],
        }
    }

    /// One translation unit: the prelude, the shared headers, then each file of the family
    /// with its local `#include "..."` lines removed (the run-time compilers get no include
    /// path) and a `#line` so errors name the file.
    pub fn source(&self) -> String {
        let mut s = String::with_capacity(64 * 1024);
        s.push_str("#line 1 \"prelude.h\"\n");
        s.push_str(PRELUDE);
        let files = self.files.iter().map(|f| (*f, source_of(f)));
        for (name, text) in HEADERS.iter().copied().chain(files) {
            s.push_str(&format!("\n#line 1 \"{name}\"\n"));
            for line in text.lines() {
                if line.trim_start().starts_with("#include \"") {
                    s.push('\n'); // keep line numbers
                } else {
                    s.push_str(line);
                    s.push('\n');
                }
            }
        }
        s
    }
}

fn source_of(file: &str) -> &'static str {
    SOURCES
        .iter()
        .find(|(n, _)| *n == file)
        .map(|(_, t)| *t)
        .unwrap_or("")
}

/// A kernel found in a source file: its name, its tag, and whether it sits under a group gate
/// at all (an ungated kernel of a tagged family would be compiled into every group).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub name: String,
    pub tag: Option<String>,
    pub gated: bool,
}

/// A macro that stamps out kernels: its parameters and the kernel name templates in its body
/// (`mul_mat_vec_##NAME`).
struct KernelMacro {
    params: Vec<String>,
    names: Vec<String>,
}

/// The identifier (with `##`) after each `void ` that is followed by `(`.
fn kernel_names_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("void ") {
        let after = &rest[at + 5..];
        let end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '#'))
            .unwrap_or(after.len());
        if after[end..].starts_with('(') && end > 0 {
            out.push(after[..end].to_string());
        }
        rest = &after[end..];
    }
    out
}

/// `NAME(a, b)` -> ("NAME", ["a", "b"]) for a line that is one call (no nesting).
fn call(line: &str) -> Option<(&str, Vec<String>)> {
    let open = line.find('(')?;
    let name = &line[..open];
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    let inner = line[open + 1..].strip_suffix(')')?;
    Some((
        name,
        inner.split(',').map(|a| a.trim().to_string()).collect(),
    ))
}

/// A name template with its parameters replaced by `args`.
fn expand(template: &str, params: &[String], args: &[String]) -> String {
    template
        .split("##")
        .map(|piece| match params.iter().position(|p| p == piece) {
            Some(i) => args.get(i).map(String::as_str).unwrap_or(""),
            None => piece,
        })
        .collect()
}

/// The per-type lists of quants.h: `RF_EACH_WEIGHT_TYPE` -> [f32, f16, ...].
fn type_lists() -> HashMap<String, Vec<String>> {
    let mut out = HashMap::new();
    for (_, text) in HEADERS {
        for line in text.lines() {
            let Some(def) = line.strip_prefix("#define RF_EACH_") else {
                continue;
            };
            let Some((name, body)) = def.split_once("(X)") else {
                continue;
            };
            let types = body
                .split_whitespace()
                .filter_map(|t| t.strip_prefix("RF_X_")?.strip_suffix("(X)"))
                .map(str::to_string)
                .collect();
            out.insert(format!("RF_EACH_{name}"), types);
        }
    }
    out
}

/// Every kernel of one family's files, with the tag that gates it.
pub fn scan(files: &[&str]) -> Vec<Found> {
    #[derive(Clone)]
    enum Cond {
        Untyped,
        Tag(String),
        Other,
    }
    let lists = type_lists();
    let mut macros: HashMap<String, KernelMacro> = HashMap::new();
    let mut found = Vec::new();
    for file in files {
        let mut stack: Vec<Cond> = Vec::new();
        let mut lines = source_of(file).lines();
        while let Some(line) = lines.next() {
            let t = line.trim();
            let tag = stack.iter().rev().find_map(|c| match c {
                Cond::Tag(t) => Some(t.clone()),
                _ => None,
            });
            let gated = stack
                .iter()
                .any(|c| matches!(c, Cond::Tag(_) | Cond::Untyped));
            if let Some(cond) = t.strip_prefix("#if ") {
                stack.push(if cond == "RF_UNTYPED" {
                    Cond::Untyped
                } else if let Some(tag) = cond.strip_prefix("RF_ALL || RF_T_") {
                    Cond::Tag(tag.to_string())
                } else {
                    Cond::Other
                });
            } else if t.starts_with("#ifdef") || t.starts_with("#ifndef") {
                stack.push(Cond::Other);
            } else if t.starts_with("#el") {
                if let Some(top) = stack.last_mut() {
                    *top = Cond::Other;
                }
            } else if t.starts_with("#endif") {
                stack.pop();
            } else if let Some(def) = t.strip_prefix("#define ") {
                // The whole definition, continuation lines included.
                let mut text = def.to_string();
                let mut last = line;
                while last.trim_end().ends_with('\\') {
                    match lines.next() {
                        Some(l) => {
                            text.push_str(l);
                            last = l;
                        }
                        None => break,
                    }
                }
                let names = kernel_names_in(&text);
                let head = text.split(')').next().unwrap_or("");
                if let (false, Some((name, params))) = (names.is_empty(), head.split_once('(')) {
                    let params = params.split(',').map(|p| p.trim().to_string()).collect();
                    macros.insert(name.to_string(), KernelMacro { params, names });
                }
            } else if t.starts_with("RF_KERNEL") {
                for name in kernel_names_in(t) {
                    found.push(Found {
                        name,
                        tag: tag.clone(),
                        gated,
                    });
                }
            } else if let Some((name, args)) = call(t) {
                if let (Some(types), Some(m)) = (lists.get(name), args.first()) {
                    // RF_EACH_WEIGHT_TYPE(MACRO): MACRO(suffix, w_suffix) under the type's tag.
                    if let Some(m) = macros.get(m) {
                        for ty in types {
                            let args = [ty.clone(), format!("w_{ty}")];
                            for n in &m.names {
                                found.push(Found {
                                    name: expand(n, &m.params, &args),
                                    tag: Some(ty.clone()),
                                    gated: true,
                                });
                            }
                        }
                    }
                } else if let Some(m) = macros.get(name) {
                    for n in &m.names {
                        found.push(Found {
                            name: expand(n, &m.params, &args),
                            tag: tag.clone(),
                            gated,
                        });
                    }
                }
            }
        }
    }
    found
}

/// The groups and which group each kernel is in.
pub struct Table {
    pub groups: Vec<Group>,
    pub by_name: HashMap<String, usize>,
}

/// Built once from the sources.
pub static TABLE: Lazy<Table> = Lazy::new(|| {
    let mut groups: Vec<Group> = Vec::new();
    let mut by_name = HashMap::new();
    for (family, files) in FAMILIES {
        let first = groups.len();
        for k in scan(files) {
            let at = match groups[first..].iter().position(|g| g.tag == k.tag) {
                Some(i) => first + i,
                None => {
                    groups.push(Group {
                        family,
                        tag: k.tag.clone(),
                        files,
                        kernels: Vec::new(),
                    });
                    groups.len() - 1
                }
            };
            by_name.insert(k.name.clone(), at);
            groups[at].kernels.push(k.name);
        }
    }
    Table { groups, by_name }
});

/// The group holding kernel `name`.
pub fn group_of(name: &str) -> Option<usize> {
    TABLE.by_name.get(name).copied()
}

pub fn groups() -> &'static [Group] {
    &TABLE.groups
}

/// The group of `family` with `tag`.
pub fn find(family: &str, tag: Option<&str>) -> Option<usize> {
    groups()
        .iter()
        .position(|g| g.family == family && g.tag.as_deref() == tag)
}

/// Groups that a host launching group `g` (a prompt's) is about to need for generating: the
/// integer-dot matrix-vector kernels of the weight type (and the fused kernels beside them), the
/// generation attention of the KV type and head size. Built with the prompt's groups, they are
/// ready when the first generated token's graph comes instead of compiling then.
pub fn companions(g: usize) -> Vec<usize> {
    let group = &groups()[g];
    let tag = group.tag.as_deref();
    let found: Vec<Option<usize>> = match (group.family, tag) {
        ("mul_mat", Some(t)) => vec![find("mmvq", Some(t)), find("mmvq", None)],
        ("flash_attn", Some(t)) => vec![t
            .strip_prefix("pp_")
            .and_then(|t| find("flash_attn", Some(t)))],
        _ => Vec::new(),
    };
    found.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::kernels::kernel_names;
    use std::collections::HashSet;

    /// Every kernel the host launches is in exactly one group, and every kernel the sources
    /// define is one the host knows (a typo in either would fail only at run time, on a GPU).
    #[test]
    fn every_kernel_is_in_exactly_one_group() {
        let mut seen: HashMap<String, String> = HashMap::new();
        for (family, files) in FAMILIES {
            let found = scan(files);
            assert!(!found.is_empty(), "family {family} has no kernels");
            let tagged = found.iter().any(|k| k.tag.is_some());
            for k in found {
                // In a family with tags, a kernel outside every gate would be compiled into
                // each of its groups.
                assert!(
                    !tagged || k.gated,
                    "{family}: kernel {} is not under #if RF_UNTYPED or a tag",
                    k.name
                );
                let label = format!("{family} {:?}", k.tag);
                if let Some(other) = seen.insert(k.name.clone(), label.clone()) {
                    panic!("kernel {} in two groups: {other} and {label}", k.name);
                }
            }
        }
        let names: HashSet<String> = kernel_names().into_iter().collect();
        let defined: HashSet<String> = seen.keys().cloned().collect();
        let missing: Vec<_> = names.difference(&defined).collect();
        let unknown: Vec<_> = defined.difference(&names).collect();
        assert!(missing.is_empty(), "kernels in no group: {missing:?}");
        assert!(
            unknown.is_empty(),
            "kernels not in kernel_names(): {unknown:?}"
        );
        for name in &names {
            let g = &groups()[group_of(name).unwrap()];
            assert!(g.kernels.contains(name));
        }
    }

    /// The split the table expects: per-type groups for the type-heavy families, and the
    /// kernels a SmolLM2-style Q4_1 model generates with in a few groups.
    #[test]
    fn groups_split_by_type_and_head_size() {
        let label = |n: &str| groups()[group_of(n).unwrap()].label();
        assert_eq!(label("mul_mat_vec_q4_1"), "mul_mat q4_1");
        assert_eq!(label("dequant_f16_q4_1"), "mul_mat q4_1");
        assert_eq!(label("get_rows_q8_0"), "mul_mat q8_0");
        assert_eq!(label("src1_to_f16"), "mul_mat");
        assert_eq!(label("mul_mat_vec_q1_q4_1"), "mmvq q4_1");
        assert_eq!(label("mul_mat_vec_q_glu_q8_q4_1"), "mmvq q4_1");
        assert_eq!(label("mul_mat_vec_q1x_q4_0_r2_u8"), "mmvq q4_0");
        assert_eq!(label("fused_rms_norm"), "mmvq");
        assert_eq!(label("unary_f32"), "mmvq");
        assert_eq!(label("flash_attn_vec_f16_d64_r4"), "flash_attn f16_d64");
        assert_eq!(label("flash_attn_split_f16_f16_d64"), "flash_attn f16_d64");
        assert_eq!(label("flash_attn_mma_f16_d64_w4"), "flash_attn pp_f16_d64");
        assert_eq!(
            label("flash_attn_tiled_f16_f16_d64_q32"),
            "flash_attn pp_f16_d64"
        );
        assert_eq!(label("flash_attn_split_combine"), "flash_attn");
        assert_eq!(label("binary_f32"), "elementwise");
        let next: Vec<String> = companions(group_of("mul_mat_tiled_q4_1").unwrap())
            .into_iter()
            .map(|g| groups()[g].label())
            .collect();
        assert_eq!(next, ["mmvq q4_1", "mmvq"]);
        let fa = companions(group_of("flash_attn_mma_f16_d64_w4").unwrap());
        assert_eq!(groups()[fa[0]].label(), "flash_attn f16_d64");
        assert!(
            companions(group_of("mul_mat_tiled_bf16").unwrap()).len() == 1,
            "no mmvq bf16"
        );
        assert!(groups().len() >= 30, "{} groups", groups().len());
        for g in groups() {
            let src = g.source();
            assert!(!src.contains("#include \""), "{}", g.label());
            assert!(src.starts_with("#line 1 \"prelude.h\""));
        }
    }

    /// Not a check: writes each group's program and options as the library compiles them to
    /// the directory named by ROCMFORGE_KERNEL_GROUPS_OUT (`<label>.hip` and `<label>.opts`,
    /// spaces as '-'), for scripts/check-hip-kernels.sh and check-nvrtc-kernels.py (run with
    /// --ignored).
    #[test]
    #[ignore]
    fn write_group_sources() {
        let dir = std::env::var_os("ROCMFORGE_KERNEL_GROUPS_OUT")
            .expect("ROCMFORGE_KERNEL_GROUPS_OUT names the output directory");
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        for g in groups() {
            let base = g.label().replace(' ', "-");
            std::fs::write(dir.join(format!("{base}.hip")), g.source()).unwrap();
            std::fs::write(dir.join(format!("{base}.opts")), g.options().join(" ")).unwrap();
        }
    }
}
