//! `cargo xtask public-api [--bless]`: the `leap` library's public items, one
//! sorted line each, compared with the snapshot `leap-user/public-api.txt`,
//! so that a change of the surface an embedder sees shows in review.
//!
//! `cargo public-api` does this from rustdoc's JSON, which needs a nightly
//! toolchain whose JSON format matches the tool's version; CI starts on a
//! bare machine and installs everything it uses, so the xtask reads the
//! sources with `syn` instead (no toolchain, seconds): from `src/lib.rs`
//! it follows every `pub mod` and `pub use` (items re-exported from private
//! modules are listed where they are re-exported) and prints each public
//! item with its signature:
//!
//! ```text
//! pub fn leap::transport::open::open(kind: TransportKind, ep: &Endpoint, opts: &Options) -> Result<Box<dyn Transport>>
//! pub leap::transport::Stats::bytes_sent: u64
//! impl Transport for leap::transport::udp::UdpTransport
//! ```
//!
//! Every feature's items are listed, each `#[cfg(..)]` written on the line
//! of the item that carries it; `#[cfg(test)]` items are left out. A macro
//! call whose body is items (`counters! { pub struct Stats { .. } }`) is
//! listed as those items, each marked `#[in_macro(counters)]` (the macro
//! may add more, unlisted); any other call as itself, without its docs.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};
use quote::ToTokens;
use syn::{Attribute, Fields, ImplItem, Item, TraitItem, UseTree, Visibility};

use crate::util;

/// The snapshot, from the workspace root.
pub const SNAPSHOT: &str = "leap-user/public-api.txt";

/// The library's root file, from the workspace root.
const LIB_RS: &str = "leap-user/src/lib.rs";

/// The crate's name in the listed paths.
const CRATE: &str = "leap";

/// Arguments of `cargo xtask public-api`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Write the current surface to the snapshot instead of comparing.
    #[arg(long)]
    bless: bool,
}

/// Runs `cargo xtask public-api`.
///
/// # Errors
///
/// When a source cannot be read or parsed, or (without `--bless`) the
/// surface differs from the snapshot.
pub fn run(args: Args) -> Result<()> {
    let root = util::root();
    let lines = surface(&root.join(LIB_RS))?;
    let text = lines.iter().map(|l| format!("{l}\n")).collect::<String>();
    let snapshot = root.join(SNAPSHOT);
    if !args.bless {
        return check(&lines);
    }
    std::fs::write(&snapshot, text).with_context(|| format!("writing {}", snapshot.display()))?;
    eprintln!("public-api: wrote {} items to {SNAPSHOT}", lines.len());
    Ok(())
}

/// What CI runs: the surface compared with the snapshot.
///
/// # Errors
///
/// As [`run`] without `--bless`.
pub fn verify() -> Result<()> {
    run(Args { bless: false })
}

/// Compares `lines` with the checked-in snapshot.
///
/// # Errors
///
/// When they differ: the error lists the lines gone (`-`) and new (`+`)
/// and says how to accept them.
pub fn check(lines: &[String]) -> Result<()> {
    let snapshot = util::root().join(SNAPSHOT);
    let old = std::fs::read_to_string(&snapshot)
        .with_context(|| format!("reading {} (`cargo xtask public-api --bless` writes it)", snapshot.display()))?;
    let old: Vec<String> = old.lines().map(str::to_string).collect();
    let diff = diff(&old, lines);
    if diff.is_empty() {
        eprintln!("public-api: the library's {} public items match {SNAPSHOT}", lines.len());
        return Ok(());
    }
    bail!(
        "the library's public API differs from {SNAPSHOT} (- gone, + new):\n{}\n\
         If the change is intended, run `cargo xtask public-api --bless` and commit {SNAPSHOT} with it.",
        diff.join("\n")
    )
}

/// Lines of `old` missing from `new` (`- `) and of `new` missing from `old`
/// (`+ `), in the order of the sorted lines.
fn diff(old: &[String], new: &[String]) -> Vec<String> {
    let mut marks: BTreeMap<&str, i32> = BTreeMap::new();
    for l in old {
        *marks.entry(l).or_default() -= 1;
    }
    for l in new {
        *marks.entry(l).or_default() += 1;
    }
    marks.into_iter().filter(|&(_, n)| n != 0).map(|(l, n)| format!("{} {l}", if n < 0 { '-' } else { '+' })).collect()
}

/// One module of the crate, public or not.
struct Module {
    /// `leap::transport::udp`.
    path: String,
    items: Vec<Item>,
    /// Child modules by name (index into [`Crate::modules`]).
    children: BTreeMap<String, usize>,
    parent: Option<usize>,
    /// Whether it is reachable through `pub mod` from the root.
    public: bool,
}

/// Every module of the crate and the impl blocks by the name of their type.
struct Crate {
    modules: Vec<Module>,
    /// `(module, impl)` by the last segment of the impl's self type.
    impls: BTreeMap<String, Vec<(usize, syn::ItemImpl)>>,
}

/// The public surface of the crate whose root file is `lib_rs`, sorted.
///
/// # Errors
///
/// When a module's file is missing or does not parse.
pub fn surface(lib_rs: &Path) -> Result<Vec<String>> {
    let mut krate = Crate { modules: Vec::new(), impls: BTreeMap::new() };
    let dir = lib_rs.parent().context("lib.rs has a directory")?.to_path_buf();
    let file = parse(lib_rs)?;
    load(&mut krate, CRATE.to_string(), file.items, &dir, None, true)?;
    let mut out = Vec::new();
    for m in 0..krate.modules.len() {
        if krate.modules[m].public {
            let path = krate.modules[m].path.clone();
            emit_module(&krate, m, &path, &mut out)?;
        }
    }
    let mut out: Vec<String> =
        out.into_iter().map(|(_, l)| l).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    // Sorted by path first, so that a type's impls, fields and methods
    // follow it.
    let is_impl = |l: &str| l.starts_with("impl") || l.starts_with("unsafe impl") || l.contains("] impl");
    out.sort_by(|a, b| sort_key(a).cmp(sort_key(b)).then(is_impl(a).cmp(&is_impl(b))).then(a.cmp(b)));
    Ok(out)
}

/// The path in a line (`leap::x::Y` of `pub struct leap::x::Y<T>`), for sorting.
fn sort_key(line: &str) -> &str {
    let start = line.find("leap::").unwrap_or(0);
    let rest = &line[start..];
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
    &rest[..end]
}

fn parse(file: &Path) -> Result<syn::File> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    syn::parse_file(&text).with_context(|| format!("parsing {}", file.display()))
}

/// Adds the module `path` with `items` (its children's files under `dir`).
fn load(
    krate: &mut Crate,
    path: String,
    items: Vec<Item>,
    dir: &Path,
    parent: Option<usize>,
    public: bool,
) -> Result<usize> {
    let me = krate.modules.len();
    krate.modules.push(Module { path: path.clone(), items: Vec::new(), children: BTreeMap::new(), parent, public });
    let mut kept = Vec::new();
    for item in items {
        if is_test(attrs_of(&item)) {
            continue;
        }
        match item {
            Item::Mod(m) => {
                let name = m.ident.to_string();
                let child_dir = dir.join(&name);
                let child_items = match m.content {
                    Some((_, items)) => items,
                    None => {
                        let file = [dir.join(format!("{name}.rs")), child_dir.join("mod.rs")]
                            .into_iter()
                            .find(|f| f.is_file())
                            .with_context(|| {
                                format!(
                                    "module {path}::{name}: neither {name}.rs nor {name}/mod.rs in {}",
                                    dir.display()
                                )
                            })?;
                        parse(&file)?.items
                    }
                };
                let child_public = public && is_pub(&m.vis);
                let child = load(krate, format!("{path}::{name}"), child_items, &child_dir, Some(me), child_public)?;
                krate.modules[me].children.insert(name, child);
                kept.push(Item::Mod(syn::ItemMod { content: None, semi: Some(Default::default()), ..m }));
            }
            Item::Impl(i) => {
                if let Some(name) = self_type_name(&i.self_ty) {
                    krate.impls.entry(name).or_default().push((me, i));
                }
            }
            Item::Macro(mac) if !mac.mac.path.is_ident("macro_rules") => {
                // A call whose body is items (`counters! { pub struct .. }`):
                // those items, marked with the macro, which may add more.
                match syn::parse2::<syn::File>(mac.mac.tokens.clone()) {
                    Ok(body) if !body.items.is_empty() => {
                        let name = &mac.mac.path;
                        let mark: Attribute = syn::parse_quote!(#[in_macro(#name)]);
                        for mut item in body.items {
                            if let Some(attrs) = attrs_mut(&mut item) {
                                attrs.push(mark.clone());
                            }
                            kept.push(item);
                        }
                    }
                    _ => kept.push(Item::Macro(mac)),
                }
            }
            other => kept.push(other),
        }
    }
    krate.modules[me].items = kept;
    Ok(me)
}

/// The last segment of an impl's type (`Foo` of `impl<T> x::Foo<T>`).
fn self_type_name(ty: &syn::Type) -> Option<String> {
    match ty {
        syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        _ => None,
    }
}

fn attrs_of(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

fn attrs_mut(item: &mut Item) -> Option<&mut Vec<Attribute>> {
    match item {
        Item::Const(i) => Some(&mut i.attrs),
        Item::Enum(i) => Some(&mut i.attrs),
        Item::Fn(i) => Some(&mut i.attrs),
        Item::Static(i) => Some(&mut i.attrs),
        Item::Struct(i) => Some(&mut i.attrs),
        Item::Trait(i) => Some(&mut i.attrs),
        Item::Type(i) => Some(&mut i.attrs),
        Item::Union(i) => Some(&mut i.attrs),
        _ => None,
    }
}

fn is_pub(vis: &Visibility) -> bool {
    matches!(vis, Visibility::Public(_))
}

/// Whether `attrs` hold `#[cfg(test)]`.
fn is_test(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| a.path().is_ident("cfg") && tokens(&a.meta) == "cfg(test)")
}

/// `#[cfg(..)] #[non_exhaustive] ` of `attrs`: what an item's line carries
/// besides its signature.
fn prefix(attrs: &[Attribute]) -> String {
    attrs
        .iter()
        .filter(|a| ["cfg", "non_exhaustive", "in_macro"].iter().any(|n| a.path().is_ident(n)))
        .map(|a| format!("#[{}] ", tokens(&a.meta)))
        .collect()
}

/// Lines, each with the path it is sorted by.
type Out = Vec<(String, String)>;

/// The public items of module `m`, listed under `path`.
fn emit_module(krate: &Crate, m: usize, path: &str, out: &mut Out) -> Result<()> {
    for item in &krate.modules[m].items {
        match item {
            Item::Mod(x) if is_pub(&x.vis) => {
                out.push((path.into(), format!("{}pub mod {path}::{}", prefix(&x.attrs), x.ident)));
            }
            Item::Use(u) if is_pub(&u.vis) => {
                let mut leaves = Vec::new();
                use_leaves(&u.tree, Vec::new(), &mut leaves);
                for (segments, name) in leaves {
                    reexport(krate, m, path, &segments, &name, &prefix(&u.attrs), out)?;
                }
            }
            _ => emit_item(krate, m, item, path, "", out),
        }
    }
    Ok(())
}

/// `(path segments, name it is known by)` of each leaf of a `use` tree;
/// a glob has the name `*`.
fn use_leaves(tree: &UseTree, mut at: Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
    match tree {
        UseTree::Path(p) => {
            at.push(p.ident.to_string());
            use_leaves(&p.tree, at, out);
        }
        UseTree::Name(n) => {
            let name = n.ident.to_string();
            at.push(name.clone());
            out.push((at, name));
        }
        UseTree::Rename(r) => {
            at.push(r.ident.to_string());
            out.push((at, r.rename.to_string()));
        }
        UseTree::Glob(_) => {
            at.push("*".into());
            out.push((at, "*".into()));
        }
        UseTree::Group(g) => {
            for t in &g.items {
                use_leaves(t, at.clone(), out);
            }
        }
    }
}

/// A `pub use` in module `m` (listed as `path`) of `segments`, known as `name`.
fn reexport(
    krate: &Crate,
    m: usize,
    path: &str,
    segments: &[String],
    name: &str,
    cfg: &str,
    out: &mut Out,
) -> Result<()> {
    let Some((target, last)) = resolve_module(krate, m, &segments[..segments.len() - 1]) else {
        // Another crate's item: its path is the surface.
        out.push((format!("{path}::{name}"), format!("{cfg}pub use {path}::{name} = {}", segments.join("::"))));
        return Ok(());
    };
    debug_assert!(last.is_empty());
    let what = &segments[segments.len() - 1];
    if what == "*" {
        return emit_module(krate, target, path, out);
    }
    if let Some(&child) = krate.modules[target].children.get(what) {
        out.push((format!("{path}::{name}"), format!("{cfg}pub mod {path}::{name}")));
        return emit_module(krate, child, &format!("{path}::{name}"), out);
    }
    let module = &krate.modules[target];
    // Reachable where it is defined: one line naming it.
    if module.public
        && let Some(item) = find_item(module, what).filter(|i| is_pub_item(i))
    {
        let _ = item;
        out.push((format!("{path}::{name}"), format!("{cfg}pub use {path}::{name} = {}::{what}", module.path)));
        return Ok(());
    }
    match find_item(module, what) {
        Some(item) => {
            emit_item(krate, target, item, path, name, out);
            Ok(())
        }
        None => {
            // A re-export of a re-export.
            for item in &module.items {
                if let Item::Use(u) = item {
                    let mut leaves = Vec::new();
                    use_leaves(&u.tree, Vec::new(), &mut leaves);
                    if let Some((segs, _)) = leaves.into_iter().find(|(_, n)| n == what) {
                        return reexport(krate, target, path, &segs, name, cfg, out);
                    }
                }
            }
            bail!(
                "`pub use` in {}: {} names nothing found in {}",
                krate.modules[m].path,
                segments.join("::"),
                module.path
            )
        }
    }
}

/// The module that `segments` (a `use` path without its last segment) names
/// from module `m`, or `None` for another crate's.
fn resolve_module(krate: &Crate, m: usize, segments: &[String]) -> Option<(usize, String)> {
    let mut at = m;
    for (i, s) in segments.iter().enumerate() {
        at = match s.as_str() {
            "crate" if i == 0 => 0,
            "self" => at,
            "super" => krate.modules[at].parent?,
            name => *krate.modules[at].children.get(name)?,
        };
    }
    Some((at, String::new()))
}

/// The item named `name` in `module`.
fn find_item<'a>(module: &'a Module, name: &str) -> Option<&'a Item> {
    module.items.iter().find(|i| item_name(i).as_deref() == Some(name))
}

fn item_name(item: &Item) -> Option<String> {
    let ident = match item {
        Item::Const(i) => &i.ident,
        Item::Enum(i) => &i.ident,
        Item::Fn(i) => &i.sig.ident,
        Item::Static(i) => &i.ident,
        Item::Struct(i) => &i.ident,
        Item::Trait(i) => &i.ident,
        Item::Type(i) => &i.ident,
        Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

fn is_pub_item(item: &Item) -> bool {
    match item {
        Item::Const(i) => is_pub(&i.vis),
        Item::Enum(i) => is_pub(&i.vis),
        Item::Fn(i) => is_pub(&i.vis),
        Item::Static(i) => is_pub(&i.vis),
        Item::Struct(i) => is_pub(&i.vis),
        Item::Trait(i) => is_pub(&i.vis),
        Item::Type(i) => is_pub(&i.vis),
        Item::Union(i) => is_pub(&i.vis),
        _ => false,
    }
}

/// One item of module `m`, listed in `path` as `name` (its own name when
/// empty); re-exported items are listed whatever their visibility says
/// (a `pub use` of a `pub(crate)` item does not compile).
fn emit_item(krate: &Crate, m: usize, item: &Item, path: &str, name: &str, out: &mut Out) {
    let reexported = !name.is_empty();
    if !reexported && !is_pub_item(item) && !matches!(item, Item::Macro(_)) {
        return;
    }
    let own = item_name(item).unwrap_or_default();
    let name = if reexported { name } else { &own };
    let full = format!("{path}::{name}");
    let cfg = prefix(attrs_of(item));
    let line = match item {
        Item::Const(c) => format!("{cfg}pub const {full}: {}", tokens(&c.ty)),
        Item::Static(s) => format!(
            "{cfg}pub static {}{full}: {}",
            if matches!(s.mutability, syn::StaticMutability::Mut(_)) { "mut " } else { "" },
            tokens(&s.ty)
        ),
        Item::Fn(f) => format!("{cfg}pub {}", signature(&f.sig, &full)),
        Item::Type(t) => format!("{cfg}pub type {full}{} = {}", generics(&t.generics), tokens(&t.ty)),
        Item::Struct(s) => {
            fields(&s.fields, &full, out);
            derives(&s.attrs, &full, out);
            let g = generics(&s.generics);
            format!("{cfg}pub struct {full}{g}{}", where_clause(&s.generics))
        }
        Item::Union(u) => {
            fields(&Fields::Named(u.fields.clone()), &full, out);
            format!("{cfg}pub union {full}{}", generics(&u.generics))
        }
        Item::Enum(e) => {
            derives(&e.attrs, &full, out);
            for v in &e.variants {
                let mut fields = v.fields.clone();
                fields.iter_mut().for_each(|f| f.attrs.clear());
                let disc = v.discriminant.as_ref().map(|(_, d)| format!(" = {}", tokens(d))).unwrap_or_default();
                let fields = tokens(&fields);
                let sep = if fields.starts_with('{') { " " } else { "" };
                out.push((full.clone(), format!("{}{full}::{}{sep}{fields}{disc}", prefix(&v.attrs), v.ident)));
            }
            format!("{cfg}pub enum {full}{}{}", generics(&e.generics), where_clause(&e.generics))
        }
        Item::Trait(t) => {
            for ti in &t.items {
                match ti {
                    TraitItem::Fn(f) => out.push((
                        full.clone(),
                        format!("{}{}", prefix(&f.attrs), signature(&f.sig, &format!("{full}::{}", f.sig.ident))),
                    )),
                    TraitItem::Type(ty) => {
                        let b = if ty.bounds.is_empty() { String::new() } else { format!(": {}", tokens(&ty.bounds)) };
                        out.push((full.clone(), format!("type {full}::{}{b}", ty.ident)));
                    }
                    TraitItem::Const(c) => {
                        out.push((full.clone(), format!("const {full}::{}: {}", c.ident, tokens(&c.ty))))
                    }
                    _ => {}
                }
            }
            let unsafety = if t.unsafety.is_some() { "unsafe " } else { "" };
            let sup = if t.supertraits.is_empty() { String::new() } else { format!(": {}", tokens(&t.supertraits)) };
            format!("{cfg}pub {unsafety}trait {full}{}{sup}", generics(&t.generics))
        }
        Item::Macro(mac) => {
            // Items a macro generates: the call, without its docs. A
            // `macro_rules!` is the crate's own unless exported.
            let exported = attrs_of(item).iter().any(|a| a.path().is_ident("macro_export"));
            if (!krate.modules[m].public && !reexported) || (mac.mac.path.is_ident("macro_rules") && !exported) {
                return;
            }
            format!("{cfg}{path}::{}!({})", tokens(&mac.mac.path), tokens(&strip_docs(mac.mac.tokens.clone())))
        }
        _ => return,
    };
    out.push((full.clone(), line));
    if matches!(item, Item::Struct(_) | Item::Enum(_) | Item::Union(_)) {
        emit_impls(krate, m, &own, &full, out);
    }
}

/// `pub` fields of a struct or union, `name: Type` (tuple fields by index).
fn fields(fields: &Fields, full: &str, out: &mut Out) {
    for (i, f) in fields.iter().enumerate() {
        if !is_pub(&f.vis) {
            continue;
        }
        let name = f.ident.as_ref().map_or_else(|| i.to_string(), ToString::to_string);
        out.push((full.into(), format!("{}pub {full}::{name}: {}", prefix(&f.attrs), tokens(&f.ty))));
    }
}

/// `impl Trait for Type` of each derived trait.
fn derives(attrs: &[Attribute], full: &str, out: &mut Out) {
    for a in attrs.iter().filter(|a| a.path().is_ident("derive")) {
        let Ok(list) = a.parse_args_with(syn::punctuated::Punctuated::<syn::Path, syn::Token![,]>::parse_terminated)
        else {
            continue;
        };
        for p in list {
            out.push((full.into(), format!("impl {} for {full}", tokens(&p))));
        }
    }
}

/// The impl blocks of type `name` defined in module `m`: `pub` methods,
/// constants and types of inherent impls, the trait of trait impls.
fn emit_impls(krate: &Crate, m: usize, name: &str, full: &str, out: &mut Out) {
    let Some(impls) = krate.impls.get(name) else { return };
    // Impls in the type's module; else, when no other module defines a type
    // of that name, the type's wherever they are.
    let defined_elsewhere = krate.modules.iter().enumerate().any(|(i, md)| {
        i != m && find_item(md, name).is_some_and(|it| matches!(it, Item::Struct(_) | Item::Enum(_) | Item::Union(_)))
    });
    for (im, i) in impls {
        if *im != m && defined_elsewhere {
            continue;
        }
        let cfg = prefix(&i.attrs);
        let g = generics(&i.generics);
        if let Some((neg, tr, _)) = &i.trait_ {
            if private_trait(krate, tr) {
                continue;
            }
            let unsafety = if i.unsafety.is_some() { "unsafe " } else { "" };
            let neg = if neg.is_some() { "!" } else { "" };
            out.push((
                full.into(),
                format!("{cfg}{unsafety}impl{g} {neg}{} for {full}{}", tokens(tr), type_args(&i.self_ty)),
            ));
            continue;
        }
        for ii in &i.items {
            match ii {
                ImplItem::Fn(f) if is_pub(&f.vis) => {
                    out.push((
                        full.into(),
                        format!(
                            "{cfg}{}pub {}",
                            prefix(&f.attrs),
                            signature(&f.sig, &format!("{full}::{}", f.sig.ident))
                        ),
                    ));
                }
                ImplItem::Const(c) if is_pub(&c.vis) => {
                    out.push((full.into(), format!("{cfg}pub const {full}::{}: {}", c.ident, tokens(&c.ty))));
                }
                ImplItem::Type(t) if is_pub(&t.vis) => {
                    out.push((full.into(), format!("{cfg}pub type {full}::{} = {}", t.ident, tokens(&t.ty))));
                }
                _ => {}
            }
        }
    }
}

/// Whether `tr` names a trait of the crate that is not `pub` (its impls are
/// no one else's business), and no `pub` trait of that name exists.
fn private_trait(krate: &Crate, tr: &syn::Path) -> bool {
    let Some(name) = tr.segments.last().map(|s| s.ident.to_string()) else { return false };
    let traits = || {
        krate.modules.iter().flat_map(|m| &m.items).filter_map(|i| match i {
            Item::Trait(t) if t.ident == name => Some(is_pub(&t.vis)),
            _ => None,
        })
    };
    traits().next().is_some() && !traits().any(|public| public)
}

/// The generic arguments of an impl's type (`<'a, T>` of `Foo<'a, T>`).
fn type_args(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(p) => p.path.segments.last().map(|s| tokens(&s.arguments)).unwrap_or_default(),
        _ => String::new(),
    }
}

/// `unsafe fn path<T>(args) -> R where ..`.
fn signature(sig: &syn::Signature, full: &str) -> String {
    let mut s = String::new();
    if sig.constness.is_some() {
        s.push_str("const ");
    }
    if sig.asyncness.is_some() {
        s.push_str("async ");
    }
    if sig.unsafety.is_some() {
        s.push_str("unsafe ");
    }
    if let Some(abi) = &sig.abi {
        s.push_str(&tokens(abi));
        s.push(' ');
    }
    let mut inputs = sig.inputs.clone();
    // rustfmt's trailing comma of a signature over several lines.
    inputs.pop_punct();
    for i in inputs.iter_mut() {
        match i {
            syn::FnArg::Receiver(r) => r.attrs.clear(),
            syn::FnArg::Typed(t) => {
                t.attrs.clear();
                // `mut x: T` binds mutably inside; the caller sees `x: T`.
                if let syn::Pat::Ident(p) = &mut *t.pat {
                    p.mutability = None;
                }
            }
        }
    }
    s.push_str(&format!("fn {full}{}({})", generics(&sig.generics), tokens(&inputs)));
    if let syn::ReturnType::Type(_, ty) = &sig.output {
        s.push_str(&format!(" -> {}", tokens(ty)));
    }
    s.push_str(&where_clause(&sig.generics));
    s
}

fn generics(g: &syn::Generics) -> String {
    if g.params.is_empty() { String::new() } else { format!("<{}>", tokens(&g.params)) }
}

fn where_clause(g: &syn::Generics) -> String {
    g.where_clause.as_ref().map(|w| format!(" {}", tokens(w))).unwrap_or_default()
}

/// `tokens` without `#[doc = ..]` attributes (doc comments), at any depth.
fn strip_docs(tokens: TokenStream) -> TokenStream {
    let mut out = Vec::new();
    let mut it = tokens.into_iter().peekable();
    while let Some(t) = it.next() {
        if let TokenTree::Punct(p) = &t
            && p.as_char() == '#'
            && let Some(TokenTree::Group(g)) = it.peek()
            && g.delimiter() == Delimiter::Bracket
            && g.stream().into_iter().next().is_some_and(|f| f.to_string() == "doc")
        {
            it.next();
            continue;
        }
        out.push(match t {
            TokenTree::Group(g) => TokenTree::Group(proc_macro2::Group::new(g.delimiter(), strip_docs(g.stream()))),
            other => other,
        });
    }
    out.into_iter().collect()
}

/// Rust code as one line, spaced the way rustfmt spaces it (`&mut [u8]`,
/// `Result<Self, E>`, `a: u8`, `FnMut(&[u8]) -> usize`).
fn tokens<T: ToTokens>(t: &T) -> String {
    print(t.to_token_stream())
}

/// [`tokens`] of a token stream.
fn print(ts: TokenStream) -> String {
    // Atoms: identifiers, literals, runs of joint punctuation (`::`, `->`,
    // `'a`), groups printed whole.
    let mut atoms: Vec<String> = Vec::new();
    let mut joint = false;
    for t in ts {
        let (text, next_joint) = match t {
            TokenTree::Ident(i) => (i.to_string(), false),
            TokenTree::Literal(l) => (l.to_string(), false),
            TokenTree::Punct(p) => (p.as_char().to_string(), p.spacing() == Spacing::Joint || p.as_char() == '\''),
            TokenTree::Group(g) => {
                let inner = print(g.stream());
                let text = match g.delimiter() {
                    Delimiter::Parenthesis => format!("({inner})"),
                    Delimiter::Bracket => format!("[{inner}]"),
                    Delimiter::Brace if inner.is_empty() => "{}".into(),
                    Delimiter::Brace => format!("{{ {inner} }}"),
                    Delimiter::None => inner,
                };
                (text, false)
            }
        };
        match atoms.last_mut() {
            Some(last) if joint => last.push_str(&text),
            _ => atoms.push(text),
        }
        joint = next_joint;
    }
    let mut out = String::new();
    for (i, a) in atoms.iter().enumerate() {
        if i > 0 && space_between(&atoms[i - 1], a) {
            out.push(' ');
        }
        out.push_str(a);
    }
    out
}

/// Whether rustfmt puts a space between two atoms of [`print`].
fn space_between(prev: &str, next: &str) -> bool {
    let word = |s: &str| s.chars().last().is_some_and(|c| c.is_alphanumeric() || c == '_');
    if matches!(next, "," | ";" | ":" | "?" | "." | "::" | ">" | "!") || next.starts_with("::") {
        return false;
    }
    if matches!(prev, "&" | "::" | "#" | "<" | "!" | "*") || prev.ends_with("::") {
        // `*const T`, `*mut T` keep theirs.
        return prev == "*" && !(next == "const" || next == "mut");
    }
    if next == "<" || next.starts_with('(') || next.starts_with('[') {
        // Generics and `Fn(..)` sugar follow a name; anything else is spaced
        // (`-> (u8, u16)`, `dyn (A)`).
        return !(word(prev) || prev == ">")
            || prev.starts_with('\'')
            || matches!(prev, "dyn" | "impl" | "mut" | "const" | "in");
    }
    true
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A crate in a temporary directory, from `(file, source)` pairs.
    fn krate(files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-public-api-{}-{}", std::process::id(), files[0].1.len()));
        let _ = std::fs::remove_dir_all(&dir);
        for (f, src) in files {
            let p = dir.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, src).unwrap();
        }
        dir.join("lib.rs")
    }

    #[test]
    fn public_items_are_listed_through_pub_mod_and_pub_use() {
        let lib = krate(&[
            (
                "lib.rs",
                "pub mod a;\nmod hidden;\npub use hidden::Open;\n#[cfg(feature = \"x\")]\npub mod b { pub const N: usize = 1; }\n",
            ),
            (
                "a.rs",
                "pub fn open(path: &str, n: Option<u16>) -> Result<Vec<u8>, String> { Ok(Vec::new()) }\n\
                 pub(crate) fn inner() {}\nfn private() {}\n#[cfg(test)]\nmod tests { pub fn t() {} }\n\
                 #[derive(Debug, Clone)]\n#[non_exhaustive]\npub struct Config { pub port: u16, secret: u8 }\n\
                 impl Config { pub fn new() -> Self { Config { port: 0, secret: 0 } } fn helper(&self) {} }\n\
                 pub trait Transport { fn send(&mut self, frame: &[u8]) -> std::io::Result<()>; }\n\
                 impl Transport for Config { fn send(&mut self, _: &[u8]) -> std::io::Result<()> { Ok(()) } }\n\
                 pub(crate) trait Sealed {}\nimpl Sealed for Config {}\n",
            ),
            ("hidden.rs", "pub enum Open { Yes, No(u8) }\n"),
        ]);
        let got = surface(&lib).unwrap();
        let want = [
            "pub mod leap::a",
            "impl Clone for leap::a::Config",
            "impl Debug for leap::a::Config",
            "impl Transport for leap::a::Config",
            "#[non_exhaustive] pub struct leap::a::Config",
            "pub fn leap::a::Config::new() -> Self",
            "pub leap::a::Config::port: u16",
            "fn leap::a::Transport::send(&mut self, frame: &[u8]) -> std::io::Result<()>",
            "pub trait leap::a::Transport",
            "pub fn leap::a::open(path: &str, n: Option<u16>) -> Result<Vec<u8>, String>",
            "#[cfg(feature = \"x\")] pub mod leap::b",
            "pub const leap::b::N: usize",
        ];
        let lib = krate(&[
            ("lib.rs", "pub mod c;\n"),
            ("c.rs", "counters! {\n/// Doc.\npub struct Stats { pub sent: u64 }\n}\n"),
        ]);
        let macro_items = surface(&lib).unwrap();
        assert!(macro_items.iter().any(|g| g == "#[in_macro(counters)] pub struct leap::c::Stats"), "{macro_items:#?}");
        assert!(macro_items.iter().any(|g| g == "pub leap::c::Stats::sent: u64"), "{macro_items:#?}");
        // `hidden` is private: its enum is listed where it is re-exported.
        for w in want {
            assert!(got.iter().any(|g| g == w), "missing {w:?} in\n{}", got.join("\n"));
        }
        assert!(got.iter().any(|g| g == "pub enum leap::Open"), "{got:#?}");
        assert!(got.iter().any(|g| g == "leap::Open::No(u8)"), "{got:#?}");
        for absent in ["inner", "private", "helper", "secret", "tests", "hidden::Open::", "Sealed"] {
            assert!(!got.iter().any(|g| g.contains(absent)), "{absent} listed:\n{}", got.join("\n"));
        }
    }

    #[test]
    fn changed_surface_is_reported_as_lines_gone_and_new() {
        let old = ["pub fn leap::a(x: u8)".to_string(), "pub mod leap::m".to_string()];
        let new = ["pub fn leap::a(x: u16)".to_string(), "pub mod leap::m".to_string()];
        assert_eq!(diff(&old, &new), ["+ pub fn leap::a(x: u16)", "- pub fn leap::a(x: u8)"]);
        assert!(diff(&old, &old).is_empty());
    }

    #[test]
    fn tokens_are_spaced_as_rustfmt_spaces_them() {
        let ty: syn::Type = syn::parse_str("&'a mut Result<Vec<[u8; 4]>, std::io::Error>").unwrap();
        assert_eq!(tokens(&ty), "&'a mut Result<Vec<[u8; 4]>, std::io::Error>");
        let ty: syn::Type = syn::parse_str("Box<dyn FnMut(&'a [u8]) -> (usize, *const u8) + Send>").unwrap();
        assert_eq!(tokens(&ty), "Box<dyn FnMut(&'a [u8]) -> (usize, *const u8) + Send>");
        let sig: syn::Signature =
            syn::parse_str("unsafe fn f<'a, T: Copy>(\n    x: &'a T,\n    y: u8,\n) -> Option<T>").unwrap();
        assert_eq!(signature(&sig, "leap::f"), "unsafe fn leap::f<'a, T: Copy>(x: &'a T, y: u8) -> Option<T>");
    }
}
