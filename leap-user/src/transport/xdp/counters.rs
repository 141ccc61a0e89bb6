//! The XDP program's decision counters, summed over CPUs.

use std::fmt;

use aya::maps::{MapData, PerCpuArray};
use leap_common::xdp::{COUNTERS, Counter};
use serde::ser::{Serialize, SerializeMap, Serializer};

use super::XdpError;

/// One value per [`Counter`], summed over every CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpCounters {
    values: [u64; COUNTERS as usize],
}

impl XdpCounters {
    /// Reads and sums the per-CPU array `LEAP_COUNTERS`.
    ///
    /// # Errors
    ///
    /// [`XdpError::Map`] when the map cannot be read.
    pub fn read<T: std::borrow::Borrow<MapData>>(map: &PerCpuArray<T, u64>) -> Result<Self, XdpError> {
        let mut out = Self::default();
        for c in Counter::ALL {
            let per_cpu = map.get(&(c as u32), 0).map_err(XdpError::map(leap_common::xdp::MAP_COUNTERS))?;
            out.values[c as usize] = per_cpu.iter().copied().fold(0u64, u64::wrapping_add);
        }
        Ok(out)
    }

    /// One counter.
    pub fn get(&self, c: Counter) -> u64 {
        self.values[c as usize]
    }

    /// Chunks handed to user space (AF_XDP + ring buffer).
    pub fn delivered(&self) -> u64 {
        self.get(Counter::ToXsk) + self.get(Counter::ToRingBuf)
    }

    /// Every packet the program saw.
    pub fn total(&self) -> u64 {
        self.values.iter().sum()
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Self) -> Self {
        let mut out = *self;
        for (v, e) in out.values.iter_mut().zip(earlier.values) {
            *v = v.saturating_sub(e);
        }
        out
    }

    /// Adds another program's counters (ring-wide sums).
    pub fn add(&mut self, other: &Self) {
        for (v, o) in self.values.iter_mut().zip(other.values) {
            *v += o;
        }
    }

    /// Every counter by name, in the program's order.
    pub fn values(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Counter::ALL.into_iter().map(|c| (c.name(), self.get(c)))
    }

    /// Counters from their values by name (`None`: 0).
    pub fn from_values(get: impl Fn(&str) -> Option<u64>) -> Self {
        let mut out = Self::default();
        for c in Counter::ALL {
            out.values[c as usize] = get(c.name()).unwrap_or(0);
        }
        out
    }
}

/// Reads single counters of a loaded program (see
/// [`XdpProgram::counter_reader`](super::XdpProgram::counter_reader)).
pub struct CounterReader(pub(super) PerCpuArray<MapData, u64>);

impl CounterReader {
    /// One counter summed over CPUs (`None`: the map could not be read).
    pub fn get(&self, c: Counter) -> Option<u64> {
        let per_cpu = self.0.get(&(c as u32), 0).ok()?;
        Some(per_cpu.iter().copied().fold(0u64, u64::wrapping_add))
    }
}

impl fmt::Debug for CounterReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CounterReader").finish_non_exhaustive()
    }
}

impl Serialize for XdpCounters {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(COUNTERS as usize))?;
        for (name, v) in self.values() {
            m.serialize_entry(name, &v)?;
        }
        m.end()
    }
}

impl fmt::Display for XdpCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in Counter::ALL {
            writeln!(f, "{:<16}{:>14}", c.name(), self.get(c))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_names_every_counter() {
        let mut c = XdpCounters::default();
        c.values[Counter::ToXsk as usize] = 7;
        c.values[Counter::Malformed as usize] = 1;
        let j = serde_json::to_value(c).unwrap();
        assert_eq!(j["to_xsk"], 7);
        assert_eq!(j["malformed"], 1);
        assert_eq!(j.as_object().map(|o| o.len()), Some(COUNTERS as usize));
        assert_eq!(c.delivered(), 7);
        assert_eq!(c.total(), 8);
        let back = XdpCounters::from_values(|k| j[k].as_u64());
        assert_eq!(back, c);
    }

    #[test]
    fn since_subtracts_without_wrapping() {
        let mut a = XdpCounters::default();
        let mut b = XdpCounters::default();
        a.values[0] = 5;
        b.values[0] = 7;
        assert_eq!(b.since(&a).get(Counter::Passed), 2);
        assert_eq!(a.since(&b).get(Counter::Passed), 0);
    }
}
