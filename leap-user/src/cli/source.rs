//! Where each effective setting came from (a flag, the node file, the
//! default), known from clap's value source, never guessed by comparing a
//! value with its default.

use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, FromArgMatches, ValueEnum};

/// The arguments given on the command line, by clap id (the field name
/// unless the `#[arg]` says otherwise). Flatten it into a derived `Args`
/// struct as its first field and parsing fills it in (the derived parser
/// takes each later field's value out of the matches); it adds no argument
/// of its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Given(BTreeSet<String>);

impl Given {
    /// Whether the argument `id` was given on the command line, even at its
    /// default value.
    pub fn contains(&self, id: &str) -> bool {
        self.0.contains(id)
    }
}

impl FromArgMatches for Given {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let given = m.ids().filter(|id| m.value_source(id.as_str()) == Some(ValueSource::CommandLine));
        Ok(Self(given.map(|id| id.as_str().to_owned()).collect()))
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl Args for Given {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        cmd
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        cmd
    }
}

/// Where an effective setting came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Given on the command line (even at its default value).
    Flag,
    /// Set in the node file.
    File,
    /// Neither: the built-in default.
    Default,
    /// The environment (`RUST_LOG`, for the log level only).
    Env,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Flag => "flag",
            Self::File => "file",
            Self::Default => "default",
            Self::Env => "env",
        })
    }
}

/// One effective setting, as `leap node --check` prints it:
/// `NAME VALUE (SOURCE)`, NAME being the flag's long name without `--` and
/// VALUE spelled as that flag takes it (`none` for nothing, lists
/// comma-separated).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    /// The flag's long name, e.g. `timeout-ms`.
    pub name: &'static str,
    /// The value, as the flag would take it.
    pub value: String,
    /// Where it came from.
    pub source: Source,
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} ({})", self.name, self.value, self.source)
    }
}

/// A value spelled as its flag takes it.
pub trait Spelled {
    /// The spelling.
    fn spelled(&self) -> String;
}

macro_rules! spelled_by_display {
    ($($t:ty),*) => {$(
        impl Spelled for $t {
            fn spelled(&self) -> String {
                self.to_string()
            }
        }
    )*};
}

spelled_by_display!(bool, u16, u64, usize, String, SocketAddr, crate::transport::open::TransportKind);

macro_rules! spelled_by_value_enum {
    ($($t:ty),*) => {$(
        impl Spelled for $t {
            fn spelled(&self) -> String {
                self.to_possible_value().map_or_else(String::new, |v| v.get_name().to_owned())
            }
        }
    )*};
}

spelled_by_value_enum!(
    crate::transport::config::AttachMode,
    super::ReliabilityArg,
    super::FramingArg,
    super::TransportArg,
    super::node::Role,
    super::node::NeighbourArg
);

impl Spelled for PathBuf {
    fn spelled(&self) -> String {
        self.display().to_string()
    }
}

impl<T: Spelled> Spelled for Option<T> {
    fn spelled(&self) -> String {
        self.as_ref().map_or_else(|| "none".to_owned(), Spelled::spelled)
    }
}

impl<T: Spelled> Spelled for Vec<T> {
    fn spelled(&self) -> String {
        if self.is_empty() {
            return "none".to_owned();
        }
        self.iter().map(Spelled::spelled).collect::<Vec<_>>().join(",")
    }
}

impl Spelled for super::Queues {
    fn spelled(&self) -> String {
        match &self.0 {
            None => "all".to_owned(),
            Some(q) => q.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
        }
    }
}
