//! Changing the ring keys of an open transport while it runs (a rotation):
//! `Transport.key_control()` gives a `KeyControl`, usable from any thread,
//! also while another waits in a receive, and after `split()`.

use std::path::PathBuf;

use leap::transport::KeyControl as Rust;
use leap::transport::ring_key::KeySet;
use pyo3::prelude::*;

use crate::errors;

/// Changes the ring keys of the transport it came from
/// (`Transport.key_control()`), from any thread.
#[pyclass(module = "leap", frozen)]
#[derive(Debug)]
pub struct KeyControl {
    control: Rust,
    /// The keys the transport was opened with: their `encrypt` and tagging
    /// stay.
    running: KeySet,
}

impl KeyControl {
    /// The control of a transport opened with `running`.
    pub fn new(control: Rust, running: KeySet) -> Self {
        Self { control, running }
    }
}

#[pymethods]
impl KeyControl {
    /// Seals and opens with the key of `key_file` from now on, and while
    /// `previous_key_file` is given also takes its key (one step of a
    /// rotation: on every node the new key with the old as previous, node
    /// by node; then the new key alone). The files are checked as when
    /// opening (`ConfigError` naming the file and the fix); on any error
    /// the keys in use stay. Returns a short name of the keys now in use.
    #[pyo3(signature = (key_file, previous_key_file = None))]
    fn set(&self, py: Python<'_>, key_file: PathBuf, previous_key_file: Option<PathBuf>) -> PyResult<String> {
        let keys = self
            .running
            .reread(&key_file, previous_key_file.as_deref())
            .map_err(|(which, e)| errors::bad_value(which, e.to_string()))?;
        let name = keys.describe();
        py.detach(|| self.control.set_keys(keys)).map_err(|e| errors::bad_value("key_file", e.to_string()))?;
        Ok(name)
    }

    fn __repr__(&self) -> String {
        format!("<leap.KeyControl {}>", self.running.describe())
    }
}
